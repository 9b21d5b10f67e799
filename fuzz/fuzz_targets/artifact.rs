//! The artifact loader: any `artifact.json` text is refused with an error or
//! gives an artifact whose memory plan the runtime can make.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(artifact) = dcir_artifact::Artifact::from_json(text) {
        let _ = dcir_runtime::plan_memory(&artifact);
    }
});

//! The tuning cache reader: any file text is a cache or a note saying it
//! will be rebuilt, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = dcir_tune::Cache::from_text(std::path::Path::new("fuzz.json"), &text);
});

//! The ONNX importer: any bytes either give an import error or a module that
//! verifies and prints.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let options = dcir_onnx::ImportOptions::default();
    if let Ok(imported) = dcir_onnx::import_bytes(data, &options) {
        dcir_ir::verify_module(&imported.module).expect("an imported module verifies");
        let _ = dcir_ir::print_module(&imported.module);
    }
});

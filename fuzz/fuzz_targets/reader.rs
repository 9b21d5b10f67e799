//! The `.dcir` reader, verifier and printer: any bytes either give
//! diagnostics or a module whose printed text reads back to the same text.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(module) = dcir_reader::read_bytes(data) else {
        return;
    };
    if dcir_ir::verify_module(&module).is_err() {
        return;
    }
    let text = dcir_ir::print_module(&module);
    let again = dcir_reader::parse_module(&text).expect("printed IR reads back");
    assert_eq!(dcir_ir::print_module(&again), text, "the round trip is stable");
});

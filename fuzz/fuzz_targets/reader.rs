//! The `.dcir` reader, verifier and printer: any bytes either give
//! diagnostics, which render with no control character of the input, or a
//! module whose printed text reads back to the same text.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let module = match dcir_reader::read_bytes(data) {
        Ok(module) => module,
        Err(diags) => {
            let source = String::from_utf8_lossy(data);
            let plain = dcir_reader::render("input.dcir", &source, &diags);
            assert!(
                !plain.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r')),
                "a diagnostic shows a control character: {plain:?}"
            );
            dcir_reader::render_styled("input.dcir", &source, &diags, dcir_reader::Style::Ansi);
            return;
        }
    };
    if dcir_ir::verify_module(&module).is_err() {
        return;
    }
    let text = dcir_ir::print_module(&module);
    let again = dcir_reader::parse_module(&text).expect("printed IR reads back");
    assert_eq!(dcir_ir::print_module(&again), text, "the round trip is stable");
});

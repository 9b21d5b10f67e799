//! Reads `.dcir` text into a [`dcir_ir::Module`].

//! The dcir drivers.

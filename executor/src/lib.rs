//! memra executor.
pub mod cpu;
pub mod text;

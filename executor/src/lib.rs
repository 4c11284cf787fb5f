//! memra executor.
pub mod text;

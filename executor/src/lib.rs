//! memra executor.

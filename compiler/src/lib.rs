//! memra compiler.

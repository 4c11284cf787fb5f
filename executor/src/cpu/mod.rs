//! The CPU reference backend: simple, f32 activations, multithreaded, and the numerical
//! reference every other backend is checked against.

pub mod kernels;

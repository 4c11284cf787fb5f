//! The CPU reference backend: simple, f32 activations, multithreaded, and the numerical
//! reference every other backend is checked against.
//!
//! `engine` drives a plan's ranks (serially or one thread each); `rank` runs one rank's
//! program over `compute`, its own state; `program` flattens programs and binds event waits;
//! `wire` is the only state ranks share; `reduce` is the all-reduce's combine tree.

mod compute;
pub mod engine;
pub mod kernels;
mod program;
mod rank;
pub mod reduce;
mod wire;

pub use crate::engine::{Arm, EngineOptions, StepInput, StepOutput};
pub use engine::Engine;
pub use reduce::ReduceOrder;

//! The CPU reference backend: simple, f32 activations, multithreaded, and the numerical
//! reference every other backend is checked against.
//!
//! `engine` drives a plan's ranks (serially or one thread each); `rank` walks one rank's
//! program (`crate::program`) over `compute`, its own state (weights by layer kind in
//! `layer`, segment bodies in `segments`, mHC's streams in `mhc`); `wire` is the only state
//! ranks share.

mod compute;
pub mod engine;
pub mod kernels;
pub(crate) mod layer;
mod mhc;
mod rank;
mod segments;
mod wire;

pub use crate::engine::{Arm, EngineOptions, StepInput, StepOutput};
pub use crate::reduce::ReduceOrder;
pub use engine::Engine;

//! The CUDA backend: `engine` runs a plan's ranks (`rank`) on their devices, joined by
//! boundary copies, events and the tensor-parallel `collective` kernels. Below it, the device
//! layer: a small safe layer over cudarc (driver API + NVRTC).
//! `CudaDevice` owns a context and the memra kernels (kernels/*.cu, embedded in the binary and
//! compiled by NVRTC for the device's architecture at first open); `weights` holds the device
//! weights and the pieces every launch helper is made of, which every layer kind (`moe`, `mla`,
//! `dsa`, `kda`, `mhc`) imports; `ops` has one typed launch helper per kernel family, `graph`
//! the capture guard, `selftest` the on-device checks (the only place that imports the CPU
//! backend, its reference) and bandwidth measurements. The driver is loaded at run time, so
//! the crate builds and tests on machines without CUDA; opening a device there fails with one
//! clear error.

mod batched;
mod buckets;
mod collective;
pub mod compile;
mod decode;
pub mod device;
mod dsa;
pub mod engine;
mod enqueue;
pub mod graph;
mod kda;
mod lockstep;
mod matvec;
mod matvec_mma;
mod mhc;
mod mla;
mod moe;
mod nccl;
pub mod ops;
mod p2p;
mod prefill;
mod rank;
mod rows;
pub mod selftest;
mod setup;
pub mod span;
pub(crate) mod synth;
pub mod weights;

pub use device::{check_driver, device_count, CudaDevice, DeviceBuffer};
pub use engine::Engine;
pub use graph::{capture, CaptureError, CaptureStep, Graph};
pub use matvec::{Norm, MAX_CHUNKS};
pub use ops::{DeviceKv, RopeStyle, MAX_HEAD_DIM};
pub use span::Span;
pub use weights::DeviceWeight;

pub use cudarc::driver::{CudaEvent, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

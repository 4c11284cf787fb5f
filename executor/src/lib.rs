//! memra executor: loads an execution plan and its model, runs the plan's ranks on a backend
//! (the CPU reference or CUDA, both behind `engine::Decoder`), and offers the host-side pieces
//! `memra-run` is built from: sampling, decoding sessions, batches of sequences decoded
//! together, the bit-identity gate and perplexity.
//! `dist` lets one process per device run a plan together.
pub mod batch;
pub mod batch_gate;
pub mod cli;
pub mod cpu;
pub mod cuda;
pub mod dist;
pub mod engine;
pub mod gate;
pub mod geometry;
pub(crate) mod layer_weights;
pub mod perplexity;
pub mod plan_load;
pub mod program;
pub mod reduce;
pub mod rope;
pub mod sample;
pub mod serve;
pub mod session;
pub mod speculate;
pub mod synthetic;
pub mod text;
pub mod weights;

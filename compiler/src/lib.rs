//! memra's compiler: a placement plan (TOML a person writes) plus model metadata (GGUF header
//! or config.json) become a verified, partitioned, deterministic execution plan.
//!
//! `plan` is the contract with the executor; `passes` runs the pipeline in order.

pub mod diag;
pub mod graph;
pub mod model;
pub mod passes;
pub mod placement;
pub mod plan;
pub mod review;
pub mod textdiff;

//! GGUF container support for memra: a memory-mapped reader that parses the header, metadata
//! and tensor infos without touching weights and hands out validated byte ranges; a v3
//! writer; bit-exact dequantization (and quantization) of the types memra runs; the
//! synthetic llama model generator behind `memra-synth`; the progress reports of the
//! project's long work; and how every memra tool writes its files and quotes a file's bytes
//! (`output`: the lowest crate, so every writer shares one way).

mod dequant;
pub mod f16;
mod ggml_type;
pub mod layout;
mod metadata;
pub mod output;
pub mod progress;
mod quant;
mod reader;
pub mod rng;
pub mod synth;
mod tensor;
mod value;
mod writer;

pub use dequant::dequantize;
pub use ggml_type::{supported_names, GgmlType, SUPPORTED};
pub use quant::quantize;
pub use reader::{GgufFile, DEFAULT_ALIGNMENT};
pub use tensor::TensorInfo;
pub use value::Value;
pub use writer::{GgufWriter, TensorStream};

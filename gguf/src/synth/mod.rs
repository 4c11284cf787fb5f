//! Synthetic models with seeded random weights, for tests and benchmarks without downloads:
//! `llama` (dense GQA), `qwen3moe` (GQA + MoE), `deepseek2` (MLA + MoE with shared
//! experts), `kimi-linear` (KDA linear attention and MLA + MoE) and `glm5-next` (KDA and
//! sparse MLA in mHC residual streams + MoE), each with the tensor names, shapes, storage types and metadata keys llama.cpp's
//! converter writes, so llama.cpp loads every file and serves as the oracle for it. Weights
//! are uniform with a standard deviation of 1/sqrt(fan-in) (residual projections further
//! divided by sqrt(2 * layers)) so activations stay in range through every layer; norms are
//! near 1. The bytes depend only on the shape, dtype and seed.

mod deepseek2;
mod emit;
mod ffn;
mod glm5_next;
mod kimi_linear;
mod llama;
mod plan;
mod qwen3moe;

use std::path::Path;

use anyhow::{anyhow, bail, Result};

use crate::GgmlType;
use emit::{write_spec, Spec};

pub use deepseek2::{Deepseek2Shape, Gating, Mla, Routing, Yarn, DEEPSEEK2_SHAPES};
pub use ffn::DeepseekMoe;
pub use glm5_next::{Glm5NextShape, GLM5_NEXT_SHAPES, HC_MULT};
pub use kimi_linear::{KimiLinearShape, KIMI_LINEAR_SHAPES};
pub use llama::{shape, write_model, Shape, SHAPES};
pub use qwen3moe::{Qwen3MoeShape, QWEN3MOE_SHAPES};

/// A synthetic model shape of any architecture.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Model {
    /// `llama`: dense GQA.
    Llama(Shape),
    /// `qwen3moe`: GQA with q/k norms and a MoE FFN in every layer.
    Qwen3Moe(Qwen3MoeShape),
    /// `deepseek2`: MLA, leading dense layers, MoE with shared experts.
    Deepseek2(Deepseek2Shape),
    /// `kimi-linear`: KDA layers between MLA layers, a leading dense layer, MoE.
    KimiLinear(KimiLinearShape),
    /// `glm5-next`: KDA layers between sparse (DSA) MLA layers, mHC streams, MoE.
    Glm5Next(Glm5NextShape),
}

impl Model {
    /// The shape's command-line name.
    pub fn name(&self) -> &'static str {
        match self {
            Model::Llama(s) => s.name,
            Model::Qwen3Moe(s) => s.name,
            Model::Deepseek2(s) => s.name,
            Model::KimiLinear(s) => s.name,
            Model::Glm5Next(s) => s.name,
        }
    }

    /// The GGUF `general.architecture`.
    pub fn architecture(&self) -> &'static str {
        match self {
            Model::Llama(_) => "llama",
            Model::Qwen3Moe(_) => "qwen3moe",
            Model::Deepseek2(_) => "deepseek2",
            Model::KimiLinear(_) => "kimi-linear",
            Model::Glm5Next(_) => "glm5-next",
        }
    }

    /// Number of transformer blocks.
    pub fn layers(&self) -> u32 {
        match self {
            Model::Llama(s) => s.layers,
            Model::Qwen3Moe(s) => s.layers,
            Model::Deepseek2(s) => s.layers,
            Model::KimiLinear(s) => s.layers,
            Model::Glm5Next(s) => s.layers,
        }
    }

    /// The same shape cut to its first `layers` blocks (a depth cut for real widths that do
    /// not fit the disk or the device whole).
    pub fn with_layers(self, layers: u32) -> Result<Model> {
        let full = self.layers();
        if layers == 0 || layers > full {
            bail!(
                "layers: {layers} is out of range for shape `{}`; allowed: 1 to {full}",
                self.name()
            );
        }
        Ok(match self {
            Model::Llama(s) => Model::Llama(Shape { layers, ..s }),
            Model::Qwen3Moe(s) => Model::Qwen3Moe(Qwen3MoeShape { layers, ..s }),
            Model::Deepseek2(s) => Model::Deepseek2(s.with_layers(layers)?),
            Model::KimiLinear(s) => Model::KimiLinear(s.with_layers(layers)),
            Model::Glm5Next(s) => Model::Glm5Next(s.with_layers(layers)),
        })
    }

    fn spec(&self, dtype: GgmlType) -> Spec {
        match self {
            Model::Llama(s) => llama::spec(s, dtype),
            Model::Qwen3Moe(s) => qwen3moe::spec(s, dtype),
            Model::Deepseek2(s) => deepseek2::spec(s, dtype),
            Model::KimiLinear(s) => kimi_linear::spec(s, dtype),
            Model::Glm5Next(s) => glm5_next::spec(s, dtype),
        }
    }

    /// Writes this model with matrices in `dtype` to `path`; progress goes to stderr when
    /// `progress` is set.
    pub fn write(&self, dtype: GgmlType, seed: u64, path: &Path, progress: bool) -> Result<()> {
        dtype.check_supported()?;
        write_spec(&self.spec(dtype), dtype, seed, path, progress)
    }
}

/// Every shape of every architecture, llama shapes first.
pub fn models() -> Vec<Model> {
    let llama = SHAPES.iter().map(|&s| Model::Llama(s));
    let qwen = QWEN3MOE_SHAPES.iter().map(|&s| Model::Qwen3Moe(s));
    let deepseek = DEEPSEEK2_SHAPES.iter().map(|&s| Model::Deepseek2(s));
    let kimi = KIMI_LINEAR_SHAPES.iter().map(|&s| Model::KimiLinear(s));
    let glm5 = GLM5_NEXT_SHAPES.iter().map(|&s| Model::Glm5Next(s));
    llama
        .chain(qwen)
        .chain(deepseek)
        .chain(kimi)
        .chain(glm5)
        .collect()
}

/// The shape called `name`, of any architecture; the error lists the known names.
pub fn model(name: &str) -> Result<Model> {
    let all = models();
    all.iter()
        .find(|m| m.name() == name)
        .copied()
        .ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(Model::name).collect();
            anyhow!("unknown shape `{name}`; known shapes: {}", names.join(", "))
        })
}

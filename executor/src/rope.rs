//! The rotary-embedding layout of an architecture, shared by both backends' rope kernels.

/// Which elements of a head form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// llama: adjacent elements `(2i, 2i + 1)`.
    Normal,
    /// GPT-NeoX, qwen2, qwen3: elements `(i, i + head_dim / 2)`.
    Neox,
}

impl RopeStyle {
    /// The layout of a plan's `model.architecture`.
    pub fn of_architecture(architecture: &str) -> RopeStyle {
        if architecture == "llama" {
            RopeStyle::Normal
        } else {
            RopeStyle::Neox
        }
    }
}

//! The rotary-embedding facts of an architecture, shared by both backends' rope kernels: which
//! elements of a head form a rotated pair, and YaRN's frequency interpolation and magnitude
//! scale, computed in f32 step by step as llama.cpp does (`llama_context`'s yarn attention
//! factor, ggml's `rope_yarn` and `ggml_rope_yarn_corr_dims`, deepseek2's attention scale), so
//! the angles and factors match ggml's to the bit wherever libm agrees.

use memra_compiler::plan::YarnSummary;

/// Which elements of a head form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// llama, deepseek2: adjacent elements `(2i, 2i + 1)`.
    Normal,
    /// GPT-NeoX, qwen2, qwen3, qwen3moe: elements `(i, i + head_dim / 2)`.
    Neox,
}

impl RopeStyle {
    /// The layout of a plan's `model.architecture`.
    pub fn of_architecture(architecture: &str) -> RopeStyle {
        match architecture {
            "llama" | "deepseek2" => RopeStyle::Normal,
            _ => RopeStyle::Neox,
        }
    }
}

/// YaRN as ggml's rope applies it: angles interpolated by `freq_scale` outside the corrected
/// dims, and cos/sin scaled by `mscale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// `1 / factor`.
    pub freq_scale: f32,
    /// First and last rotated pair index of the extrapolation ramp.
    pub corr_dims: [f32; 2],
    /// The magnitude factor on cos and sin: llama.cpp's yarn attention factor times
    /// `1 + 0.1 ln(1 / freq_scale)`.
    pub mscale: f32,
}

/// ggml's `beta_fast` and `beta_slow` defaults (no GGUF of these architectures sets them).
const BETA_FAST: f32 = 32.0;
const BETA_SLOW: f32 = 1.0;

/// `0.1 m ln(s) + 1` for a scale above 1, else 1 (llama.cpp's `get_mscale`).
fn get_mscale(scale: f32, m: f32) -> f32 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

/// `(freq_scale, mscale)`: rope's frequency scale and the magnitude factor ggml's rope ends up
/// applying (llama.cpp's yarn attention factor, which cancels `1 + 0.1 ln(factor)`, times that
/// same term again inside `rope_yarn`).
fn factors(s: &YarnSummary, deepseek2: bool) -> (f32, f32) {
    let freq_scale = 1.0 / s.factor as f32;
    let factor = 1.0 / freq_scale;
    let all_dims = s.mscale_all_dim as f32;
    let mut attn = if all_dims != 0.0 {
        let m = if deepseek2 && all_dims != 1.0 {
            all_dims
        } else {
            1.0
        };
        get_mscale(factor, m) / get_mscale(factor, all_dims)
    } else {
        get_mscale(factor, 1.0)
    };
    attn *= 1.0 / (1.0 + 0.1 * factor.ln());
    (freq_scale, attn * (1.0 + 0.1 * (1.0 / freq_scale).ln()))
}

impl Yarn {
    /// YaRN for a rope of `n_dims` rotated dims and base `theta`; `deepseek2` selects
    /// llama.cpp's special case that takes `mscale` from `mscale_all_dim` when it is not 1.
    pub fn of(s: &YarnSummary, n_dims: usize, theta: f32, deepseek2: bool) -> Yarn {
        let (freq_scale, mscale) = factors(s, deepseek2);
        let corr = |beta: f32| {
            let n = n_dims as f32;
            n * (s.original_context as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * theta.ln())
        };
        Yarn {
            freq_scale,
            corr_dims: [
                corr(BETA_FAST).floor().max(0.0),
                corr(BETA_SLOW).ceil().min(n_dims as f32 - 1.0),
            ],
            mscale,
        }
    }

    /// `(cos, sin)` of pair `i` (elements `2i`, `2i + 1` in ggml's numbering) whose
    /// unscaled angle is `theta_extrap`.
    pub fn cos_sin(&self, theta_extrap: f32, i: usize) -> (f32, f32) {
        let [low, high] = self.corr_dims;
        let y = (i as f32 - low) / (high - low).max(0.001);
        let ramp_mix = 1.0 - y.clamp(0.0, 1.0);
        let interp = self.freq_scale * theta_extrap;
        let theta = interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        (theta.cos() * self.mscale, theta.sin() * self.mscale)
    }
}

/// deepseek2's attention scale: `mscale^2 / sqrt(head_k)`, where `mscale` is rope's magnitude
/// factor times `1 + 0.1 mscale_all_dim ln(factor)` (`1 / sqrt(head_k)` without YaRN).
pub fn mla_kq_scale(yarn: Option<&YarnSummary>, head_k: usize) -> f32 {
    let mscale = match yarn {
        Some(s) => {
            let (freq_scale, org) = factors(s, true);
            org * (1.0 + 0.1 * s.mscale_all_dim as f32 * (1.0 / freq_scale).ln())
        }
        None => 1.0,
    };
    mscale * mscale / (head_k as f32).sqrt()
}

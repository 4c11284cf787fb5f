//! The kernel sources (kernels/*.cu, embedded at build time) and their NVRTC compilation. Each
//! file is compiled once per GPU architecture (`--gpu-architecture=sm_XY` from the device's
//! compute capability; on sm_90 the arch-specific sm_90a, whose warpgroup instructions
//! kernels/gemm.cu uses there) and the PTX is cached for the process, so several devices of
//! one kind compile once. A compile error names the file and target and carries the NVRTC log
//! as text.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, bail, Result};
use cudarc::nvrtc::{self, CompileError, CompileOptions, Ptx};

/// The shared headers, each spliced into a file in place of its `#include "NAME"` line; every
/// file includes common.cuh (first), some also route.cuh (after it).
const HEADERS: [(&str, &str); 2] = [
    ("common.cuh", include_str!("../../../kernels/common.cuh")),
    ("route.cuh", include_str!("../../../kernels/route.cuh")),
];

/// One kernels/*.cu file and the `extern "C"` entry points it defines.
pub struct KernelFile {
    /// File name under kernels/, used in error messages.
    pub name: &'static str,
    source: &'static str,
    /// Entry points loaded from the compiled module.
    pub entries: &'static [&'static str],
}

macro_rules! kernel_file {
    ($name:literal, [$($entry:literal),* $(,)?]) => {
        KernelFile {
            name: $name,
            source: include_str!(concat!("../../../kernels/", $name)),
            entries: &[$($entry),*],
        }
    };
}

/// Every kernel file of the CUDA backend.
pub const FILES: &[KernelFile] = &[
    kernel_file!(
        "matvec.cu",
        [
            "matvec_f32",
            "matvec_f16",
            "matvec_bf16",
            "matvec_q8_0",
            "matvec_q4_0",
            "matvec_q4_1",
            "matvec_q4_k",
            "matvec_q6_k",
            "matvec_l8_q8_0",
            "matvec_l8_q4_0",
            "matvec_l8_q4_1",
            "matvec_l4_q8_0",
            "matvec_l4_q4_0",
            "matvec_l4_q4_1",
            "matvec_rows8_f32",
            "matvec_rows8_f16",
            "matvec_rows8_bf16",
            "matvec_rows8_q8_0",
            "matvec_rows8_q4_0",
            "matvec_rows8_q4_1",
            "matvec_rows8_q4_k",
            "matvec_rows8_q6_k",
            "matvec_thin_f32",
            "moe_router_f32",
            "quantize_rows_q8",
        ]
    ),
    kernel_file!(
        "matvec_mma.cu",
        [
            "matvec_mma_q4_0",
            "matvec_mma_k2_q4_0",
            "matvec_mma16_q4_0",
            "matvec_mma8_q4_0",
            "matvec_mma_q4_1",
            "matvec_mma_k2_q4_1",
            "matvec_mma16_q4_1",
            "matvec_mma8_q4_1",
            "matvec_mma_single_q4_0",
            "matvec_mma_k2_single_q4_0",
            "matvec_mma16_single_q4_0",
            "matvec_mma8_single_q4_0",
            "matvec_mma_single_q4_1",
            "matvec_mma_k2_single_q4_1",
            "matvec_mma16_single_q4_1",
            "matvec_mma8_single_q4_1",
        ]
    ),
    kernel_file!("synth.cu", ["synth_blocks"]),
    kernel_file!("norm.cu", ["rms_norm_f32", "rms_norm_pair_f32"]),
    kernel_file!(
        "gemm.cu",
        [
            "gemm128_f32",
            "gemm128_f16",
            "gemm128_bf16",
            "gemm128_q8_0",
            "gemm128_q4_0",
            "gemm128_q4_1",
            "gemm128_q4_k",
            "gemm128_q6_k",
            "gemm64_f32",
            "gemm64_f16",
            "gemm64_bf16",
            "gemm64_q8_0",
            "gemm64_q4_0",
            "gemm64_q4_1",
            "gemm64_q4_k",
            "gemm64_q6_k",
            "gemm_tma128_f16",
            "gemm_tma256_f16",
            "gemm_tma128_tree_f16",
            "gemm_wg128_q8_0",
            "gemm_wg128_q4_0",
            "gemm_wg128_q4_1",
            "to_f16_f32",
            "swiglu_rows_f32",
            "add_rows_f32",
            "row_positions_u32",
        ]
    ),
    kernel_file!(
        "attention.cu",
        [
            "attention_f16_32",
            "attention_f16_64",
            "attention_f16_128",
            "attention_f16_256",
            "attention_split_f16_32",
            "attention_split_f16_64",
            "attention_split_f16_128",
            "attention_split_f16_256",
            "kv_store_rows_f16"
        ]
    ),
    kernel_file!(
        "flash.cu",
        ["flash_attention_hd64", "flash_attention_hd128"]
    ),
    kernel_file!("elementwise.cu", ["add_f32"]),
    kernel_file!(
        "embed.cu",
        [
            "embed_f32",
            "embed_f16",
            "embed_bf16",
            "embed_q8_0",
            "embed_q4_0",
            "embed_q4_1",
            "embed_q4_k",
            "embed_q6_k",
        ]
    ),
    kernel_file!("sample.cu", ["argmax_f32", "sample_f32"]),
    kernel_file!("reduce.cu", ["tree_sum_f32"]),
    kernel_file!("check.cu", ["rcp_rn_mismatches"]),
    kernel_file!(
        "moe.cu",
        [
            "moe_route_f32",
            "moe_combine_f32",
            "moe_gather_f16",
            "moe_scatter_f32",
            "moe_order_i32",
            "moe_unheld_f32"
        ]
    ),
    kernel_file!(
        "mla.cu",
        [
            "mla_rope_f32",
            "mla_attention_f16",
            "mla_merge_f16",
            "mla_store_rows_f16",
            "mla_heads_f16",
            "mla_heads_gather_f32",
            "mla_heads_f32"
        ]
    ),
    kernel_file!("kda.cu", ["kda_conv_f32", "kda_delta_f32", "kda_track_u32"]),
    kernel_file!(
        "dsa.cu",
        [
            "dsa_write_f32",
            "dsa_pool_f32",
            "dsa_score_f32",
            "dsa_select_f32"
        ]
    ),
    kernel_file!(
        "mhc.cu",
        ["hc_pre_f32", "hc_post_f32", "hc_mean_f32", "hc_embed_f32"]
    ),
    kernel_file!(
        "collective.cu",
        [
            "all_reduce_f32",
            "all_reduce_rows_f32",
            "gather_f32",
            "combine_f32"
        ]
    ),
];

/// Fails with a clear message when the NVRTC library cannot be loaded.
pub fn check_nvrtc() -> Result<()> {
    // SAFETY: only probes whether the shared library can be opened
    if unsafe { nvrtc::sys::is_culib_present() } {
        return Ok(());
    }
    bail!(
        "cuda backend: no nvrtc library found (libnvrtc.so): searched {}; install the cuda runtime compiler or put it on LD_LIBRARY_PATH",
        candidates("nvrtc")
    )
}

/// The source NVRTC sees for `file`: the headers spliced in place of their include lines
/// (common.cuh's required), with `#line` markers so that compile errors point at the right
/// file and line.
fn full_source(file: &KernelFile) -> Result<String> {
    let mut out = String::with_capacity(file.source.len() + HEADERS[0].1.len());
    let mut common = false;
    for (i, line) in file.source.lines().enumerate() {
        let header = HEADERS
            .iter()
            .find(|(name, _)| line.trim() == format!("#include \"{name}\""));
        match header {
            Some((name, text)) => {
                common |= *name == HEADERS[0].0;
                out.push_str(&format!(
                    "#line 1 \"{name}\"\n{text}\n#line {} \"{}\"\n",
                    i + 2,
                    file.name
                ));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    if !common {
        bail!(
            "kernels/{}: missing the line #include \"{}\"",
            file.name,
            HEADERS[0].0
        );
    }
    Ok(out)
}

/// The library names cudarc tries for `lib`, without repeats, for error messages.
pub(crate) fn candidates(lib: &str) -> String {
    let mut names = cudarc::get_lib_name_candidates(lib);
    let mut seen = std::collections::BTreeSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names.join(", ")
}

/// The NVRTC target of a device architecture: Hopper's arch-specific one (sm_90a, which has
/// the warpgroup products kernels/gemm.cu uses there), else the architecture itself.
fn target(arch: &str) -> &str {
    if arch == "sm_90" {
        "sm_90a"
    } else {
        arch
    }
}

/// Compiles one file for `arch` (e.g. "sm_90").
pub fn compile(file: &KernelFile, arch: &str) -> Result<Ptx> {
    check_nvrtc()?;
    let target = target(arch);
    let opts = CompileOptions {
        name: Some(file.name.to_string()),
        options: vec![
            format!("--gpu-architecture={target}"),
            "--std=c++17".to_string(),
        ],
        ..Default::default()
    };
    nvrtc::compile_ptx_with_opts(full_source(file)?, opts).map_err(|e| match e {
        CompileError::CompileError { nvrtc, log, .. } => anyhow!(
            "cuda backend: nvrtc could not compile kernels/{} for {target} ({nvrtc:?}; sm_90a needs nvrtc 12.0 or later):\n{}",
            file.name,
            log.to_string_lossy().trim_end()
        ),
        other => anyhow!(
            "cuda backend: nvrtc failed on kernels/{} for {target}: {other:?}",
            file.name
        ),
    })
}

/// The PTX of every file for `arch`, compiled on first use and shared afterwards.
pub fn compiled(arch: &str) -> Result<Arc<Vec<Ptx>>> {
    static CACHE: OnceLock<Mutex<BTreeMap<String, Arc<Vec<Ptx>>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(hit) = map.get(arch) {
        return Ok(hit.clone());
    }
    // NVRTC programs are independent, so the files compile in parallel
    let ptx = std::thread::scope(|s| {
        let jobs: Vec<_> = FILES
            .iter()
            .map(|f| s.spawn(move || compile(f, arch)))
            .collect();
        jobs.into_iter()
            .map(|j| {
                j.join()
                    .expect("invariant: an nvrtc compile thread panicked")
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let ptx = Arc::new(ptx);
    map.insert(arch.to_string(), ptx.clone());
    Ok(ptx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_is_defined_in_its_file() {
        for file in FILES {
            let src = full_source(file).unwrap();
            assert!(
                src.contains("#line 1 \"common.cuh\""),
                "{}: header not spliced",
                file.name
            );
            assert!(
                !src.lines().any(|l| l.trim_start().starts_with("#include")),
                "{}: includes a header NVRTC would not find",
                file.name
            );
            for entry in file.entries {
                // entry points are written `name(` directly or through a macro `NAME(name,`
                let direct = src.contains(&format!(" {entry}("));
                let via_macro = src.contains(&format!("({entry}, "));
                assert!(
                    direct || via_macro,
                    "kernels/{}: no entry point {entry}",
                    file.name
                );
            }
        }
    }

    /// Every entry point a file writes directly (`extern "C" __global__ ... name(`) or through
    /// a one-line macro of that declaration (`ENTRY name(`) is listed, so that no launch of it
    /// panics at run time for want of a listing. (Entry points a multi-line macro makes are
    /// named in its calls, which the converse test checks.)
    #[test]
    fn every_defined_entry_point_is_listed() {
        const DECL: &str = "extern \"C\" __global__";
        // the name of `[void] [__launch_bounds__(..)] name(`
        fn name_of(head: &str) -> &str {
            let mut head = head.trim_start().trim_start_matches("void").trim_start();
            if let Some(bounds) = head.strip_prefix("__launch_bounds__") {
                head = &bounds[bounds.find(')').unwrap() + 1..];
            }
            head.trim_start().split('(').next().unwrap().trim()
        }
        for file in FILES {
            let src = full_source(file).unwrap();
            let mut entry_macros = Vec::new();
            let mut names = Vec::new();
            let mut lines = src.lines().peekable();
            let mut in_macro = false;
            while let Some(line) = lines.next() {
                let t = line.trim();
                // a multi-line macro's lines: each but the last ends with a backslash
                let was_in_macro = std::mem::replace(&mut in_macro, t.ends_with('\\'));
                if was_in_macro || in_macro {
                    continue;
                }
                if let Some(def) = t.strip_prefix("#define ") {
                    if let Some((name, body)) = def.split_once(' ') {
                        if body.trim_start().starts_with(DECL) {
                            entry_macros.push(name.to_string());
                        }
                    }
                    continue;
                }
                if let Some(at) = t.find(DECL) {
                    // the declaration may go on over the next line
                    let mut head = t[at + DECL.len()..].to_string();
                    if !head.contains('(') || head.trim_end().ends_with(')') {
                        head.push(' ');
                        head.push_str(lines.peek().map_or("", |l| l.trim()));
                    }
                    names.push(name_of(&head).to_string());
                } else if let Some(m) = entry_macros
                    .iter()
                    .find(|m| t.starts_with(&format!("{m} ")))
                {
                    names.push(name_of(&t[m.len()..]).to_string());
                }
            }
            for name in names {
                assert!(
                    file.entries.contains(&name.as_str()),
                    "kernels/{}: entry point {name} is not listed in FILES",
                    file.name
                );
            }
        }
    }

    /// Hopper's arch-specific instructions appear only where `__CUDA_ARCH_FEAT_SM90_ALL`
    /// guards them: other architectures' PTX (and sm_90 compiled without the `a` target)
    /// would not load with them.
    #[test]
    fn arch_specific_instructions_are_guarded() {
        const GUARD: &str = "#ifdef __CUDA_ARCH_FEAT_SM90_ALL";
        for file in FILES {
            let src = full_source(file).unwrap();
            // per open conditional: whether its current branch is the guarded one
            let mut open: Vec<bool> = Vec::new();
            for (i, line) in src.lines().enumerate() {
                let t = line.trim_start();
                if t.starts_with("#if") {
                    open.push(t.starts_with(GUARD));
                } else if t.starts_with("#else") || t.starts_with("#elif") {
                    if let Some(top) = open.last_mut() {
                        *top = false;
                    }
                } else if t.starts_with("#endif") {
                    open.pop();
                }
                let hopper_only = ["wgmma.", "fence.proxy.async", "setmaxnreg"]
                    .iter()
                    .any(|i| line.contains(i));
                assert!(
                    !hopper_only || open.contains(&true),
                    "kernels/{} line {}: an sm_90a instruction outside `{GUARD}`",
                    file.name,
                    i + 1
                );
            }
        }
    }

    #[test]
    fn a_missing_driver_is_one_clear_error() {
        // SAFETY: only probes whether the shared library can be opened
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            return; // a machine with a driver: nothing to check here (CI machines have none)
        }
        let e = crate::cuda::CudaDevice::open(0)
            .err()
            .expect("opening a device without a driver fails");
        let msg = format!("{e:#}");
        assert!(
            msg.starts_with("cuda backend: no cuda driver found (libcuda.so): searched libcuda.so"),
            "{msg}"
        );
    }
}

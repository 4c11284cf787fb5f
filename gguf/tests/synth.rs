//! The synthetic model generator: every dtype produces a file the reader accepts, with
//! llama.cpp names, metadata and tokenizer, weights of the planned scale, and bytes that depend
//! only on the seed.

use std::path::PathBuf;

use memra_gguf::{synth, GgmlType, GgufFile, SUPPORTED};

fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("memra-synth-{}-{tag}.gguf", std::process::id()))
}

fn rms(v: &[f32]) -> f64 {
    (v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() / v.len() as f64).sqrt()
}

#[test]
fn every_dtype_writes_a_valid_tiny_llama() {
    let shape = synth::shape("tiny").unwrap();
    for &dtype in SUPPORTED {
        let p = temp_path(dtype.name());
        synth::write_model(&shape, dtype, 1, &p, false).unwrap();
        let f = GgufFile::open(&p).unwrap();
        assert_eq!(f.architecture().unwrap(), "llama");
        assert_eq!(f.get_u32("llama.block_count").unwrap(), 2);
        assert_eq!(f.get_u32("llama.embedding_length").unwrap(), 256);
        assert_eq!(f.get_u32("llama.attention.head_count_kv").unwrap(), 2);
        assert_eq!(f.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 256);
        assert_eq!(f.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 255);
        // token_embd + 2 * 9 per layer + output_norm + output
        assert_eq!(f.tensors.len(), 21);
        let q = f.tensor("blk.1.attn_q.weight").unwrap();
        assert_eq!((q.dims.as_slice(), q.dtype), ([256, 256].as_slice(), dtype));
        let k = f.tensor("blk.0.attn_k.weight").unwrap();
        assert_eq!(k.dims, [256, 128]);
        assert_eq!(f.tensor("blk.0.ffn_down.weight").unwrap().dims, [768, 256]);
        let embd = f.tensor("token_embd.weight").unwrap();
        let want = if dtype.block_size() > 1 {
            GgmlType::Q8_0
        } else {
            dtype
        };
        assert_eq!(embd.dtype, want);
        assert_eq!(f.tensor("output_norm.weight").unwrap().dtype, GgmlType::F32);
        for t in &f.tensors {
            let v = f.dequantize_tensor(t).unwrap();
            assert!(v.iter().all(|x| x.is_finite()), "{dtype}: {}", t.name);
            let r = rms(&v);
            let want = if t.name.ends_with("norm.weight") {
                1.0
            } else if t.name.contains("attn_output") || t.name.contains("ffn_down") {
                1.0 / (t.row_len() as f64).sqrt() / 2.0
            } else {
                1.0 / (t.row_len() as f64).sqrt()
            };
            assert!(
                (r / want - 1.0).abs() < 0.15,
                "{dtype}: {}: rms {r}, planned {want}",
                t.name
            );
        }
        let _ = std::fs::remove_file(&p);
    }
}

#[test]
fn output_depends_only_on_the_seed() {
    let shape = synth::shape("tiny-tp").unwrap();
    let paths = [temp_path("s1a"), temp_path("s1b"), temp_path("s2")];
    for (p, seed) in paths.iter().zip([1, 1, 2]) {
        synth::write_model(&shape, GgmlType::Q4_K, seed, p, false).unwrap();
    }
    let bytes: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert_eq!(bytes[0], bytes[1]);
    assert_ne!(bytes[0], bytes[2]);
    assert_eq!(bytes[0].len(), bytes[2].len());
    let f = GgufFile::open(&paths[0]).unwrap();
    assert_eq!(f.get_u32("llama.attention.head_count").unwrap(), 32);
    assert_eq!(f.get_u32("llama.vocab_size").unwrap(), 512);
    assert_eq!(f.tensor("output.weight").unwrap().dims, [256, 512]);
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn unknown_shape_lists_known_ones() {
    let e = synth::shape("huge").unwrap_err().to_string();
    assert_eq!(
        e,
        "unknown shape `huge`; known shapes: tiny, tiny-tp, smol135m, llama1b, llama8b, llama8b-tp2-rank"
    );
    let s = synth::shape("llama8b").unwrap();
    assert_eq!(
        (s.dim, s.ffn, s.layers, s.vocab, s.tied),
        (4096, 14336, 32, 128256, false)
    );
}

#[test]
fn the_binary_reports_errors_like_the_other_tools() {
    // anyhow's `Error: ...` debug form (with a backtrace under RUST_BACKTRACE=1) is not how
    // memra-compile and memra-run report
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memra-synth"))
        .args(["--shape", "huge", "-o"])
        .arg(temp_path("huge"))
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.starts_with("error: unknown shape `huge`; known shapes: ")
            && !stderr.contains("backtrace"),
        "{stderr}"
    );
}

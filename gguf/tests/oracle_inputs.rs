//! The llama.cpp oracle recordings under testdata/oracle: each names the memra-synth command
//! that wrote the GGUF llama.cpp decoded (or, with `synth.generator` "gguf-py", the project's
//! gguf-py script, which executor/tests/oracle.rs runs and checks the same way), and these
//! tests check that memra-synth still writes exactly that file (same FNV-1a of every byte)
//! and that each recording is whole:
//! one step per decode call, a full logit row per step, greedy tokens that are the argmax of
//! the previous step, and top-k expert lists of the model's width.

use std::path::{Path, PathBuf};

use memra_gguf::{synth, GgmlType};
use serde_json::Value;

fn recordings() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/oracle");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
}

fn load(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

#[test]
fn every_arch_and_dtype_is_recorded() {
    let names: Vec<String> = recordings()
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    for shape in ["tiny-qwen3moe", "tiny-deepseek2", "tiny-deepseek2-lite"] {
        for dtype in ["f32", "f16", "q8_0"] {
            assert!(
                names.contains(&format!("{shape}-{dtype}")),
                "{shape}-{dtype}"
            );
        }
    }
    // one model written by gguf-py, as llama.cpp's converter writes files
    for name in ["tiny-glm5-next-shared-f32", "tiny-glm5-next-shared-q8_0"] {
        assert!(names.iter().any(|n| n == name), "{name}");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/oracle");
        let r = load(&dir.join(format!("{name}.json")));
        assert_eq!(r["synth"]["generator"], "gguf-py", "{name}");
    }
}

#[test]
fn synth_still_writes_the_files_llama_cpp_decoded() {
    for p in recordings() {
        let r = load(&p);
        let s = &r["synth"];
        if s["generator"] == "gguf-py" {
            continue;
        }
        let model = synth::model(s["shape"].as_str().unwrap()).unwrap();
        let dtype = GgmlType::from_name(s["dtype"].as_str().unwrap()).unwrap();
        let out = std::env::temp_dir().join(format!(
            "memra-oracle-{}-{}.gguf",
            std::process::id(),
            p.file_stem().unwrap().to_string_lossy()
        ));
        model
            .write(dtype, s["seed"].as_u64().unwrap(), &out, false)
            .unwrap();
        let got = format!("{:016x}", fnv1a64(&std::fs::read(&out).unwrap()));
        let _ = std::fs::remove_file(&out);
        assert_eq!(got, s["fnv1a64"].as_str().unwrap(), "{}", p.display());
    }
}

#[test]
fn recordings_are_whole_greedy_runs() {
    for p in recordings() {
        let r = load(&p);
        let (prompt, generated) = (ids(&r["prompt"]), ids(&r["generated"]));
        let steps = r["steps"].as_array().unwrap();
        let n_vocab = r["n_vocab"].as_u64().unwrap() as usize;
        let n_used = r["n_expert_used"].as_u64().unwrap() as usize;
        assert!(generated.len() >= 40, "{}", p.display());
        assert_eq!(steps.len(), prompt.len() + generated.len() - 1);
        let fed: Vec<i64> = prompt.iter().chain(&generated).copied().collect();
        for (i, st) in steps.iter().enumerate() {
            assert_eq!(
                st["token"].as_i64().unwrap(),
                fed[i],
                "{} step {i}",
                p.display()
            );
            let logits: Vec<f64> = st["logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            assert_eq!(logits.len(), n_vocab);
            let best = (0..n_vocab).fold(0, |b, j| if logits[j] > logits[b] { j } else { b });
            assert_eq!(st["argmax"].as_i64().unwrap(), best as i64);
            if i + 1 >= prompt.len() {
                assert_eq!(generated[i + 1 - prompt.len()], best as i64);
            }
            for (_, e) in st["experts"].as_object().unwrap() {
                assert_eq!(ids(e).len(), n_used, "{} step {i}", p.display());
            }
        }
    }
}

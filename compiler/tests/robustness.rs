//! The compiler is deterministic (same input, or the same tables in another order: same bytes)
//! and never panics, whatever bytes it is given.

use memra_compiler::passes::compile;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

fn plans_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../plans")
}

/// Write `text` next to the shipped plans (so relative model paths resolve) under a unique name.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str, text: &[u8]) -> Scratch {
        let path = plans_dir().join(format!(".test-{tag}-{}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The placement's sections in reverse order, and the keys inside each section reversed.
fn reorder(text: &str) -> String {
    let mut sections: Vec<(String, Vec<String>)> = vec![(String::new(), Vec::new())];
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            sections.push((line.to_string(), Vec::new()));
        } else if !trimmed.is_empty() && !trimmed.starts_with('#') {
            sections.last_mut().unwrap().1.push(line.to_string());
        }
    }
    // Keep each `[[array]]` entry with the section it extends; reverse whole groups.
    let mut groups: Vec<Vec<(String, Vec<String>)>> = Vec::new();
    for (header, mut keys) in sections {
        keys.reverse();
        let top = header
            .trim_matches(|c| c == '[' || c == ']')
            .split('.')
            .next()
            .unwrap_or("")
            .to_string();
        match groups.last_mut() {
            Some(g)
                if !top.is_empty()
                    && g[0]
                        .0
                        .trim_matches(|c| c == '[' || c == ']')
                        .split('.')
                        .next()
                        == Some(top.as_str()) =>
            {
                g.push((header, keys))
            }
            _ => groups.push(vec![(header, keys)]),
        }
    }
    groups.reverse();
    let mut out = String::new();
    for group in groups {
        for (header, keys) in group {
            out += &format!("{header}\n{}\n\n", keys.join("\n"));
        }
    }
    out
}

#[test]
fn reordered_tables_compile_to_the_same_bytes() {
    for name in [
        "llama3-8b-pp2-tp2.toml",
        "deepseek-v3-pp8.toml",
        "qwen3-30b-a3b-tp4.toml",
    ] {
        let original = compile(&plans_dir().join(name)).unwrap_or_else(|e| panic!("{e}"));
        let text = std::fs::read_to_string(plans_dir().join(name)).unwrap();
        let reordered = reorder(&text);
        assert_ne!(reordered, text);
        let scratch = Scratch::new("reorder", reordered.as_bytes());
        let again = compile(&scratch.0).unwrap_or_else(|e| panic!("{e}\n{reordered}"));
        assert_eq!(original.plan.to_toml(), again.plan.to_toml(), "{name}");
        // And twice in a row.
        assert_eq!(
            original.plan.to_toml(),
            compile(&plans_dir().join(name)).unwrap().plan.to_toml()
        );
    }
}

#[test]
fn forced_eager_layers_split_runs_with_the_reason() {
    let text = std::fs::read_to_string(plans_dir().join("llama3-8b-pp4.toml")).unwrap()
        + "\n[[capture.eager]]\nlayers = [3, 4]\nreason = \"nan hunt\"\n";
    let scratch = Scratch::new("eager", text.as_bytes());
    let plan = compile(&scratch.0).unwrap_or_else(|e| panic!("{e}")).plan;
    let steps: Vec<String> = plan.ranks[0]
        .program
        .iter()
        .filter_map(|s| match s {
            memra_compiler::plan::Step::Run { ops, .. } => Some(format!("run {}", ops.len())),
            memra_compiler::plan::Step::Island { reason, ops, .. } => {
                Some(format!("island {reason} {}", ops[0]))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        steps,
        [
            "run 2",
            "island forced: nan hunt layers 3..5: attn_pre attn_core attn_out ffn",
            "run 2"
        ]
    );
}

/// A small deterministic generator for mutations (no dependency needed).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn no_input_makes_the_compiler_panic() {
    let base = std::fs::read(plans_dir().join("llama3-8b-pp2-tp2.toml")).unwrap();
    let mut inputs: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"\0\0\0\xff\xfe".to_vec(),
        b"[model\n".to_vec(),
        b"[model]\nconfig = 5\n[pipeline]\ndevices = 7\n".to_vec(),
        b"[model]\nconfig = \"models/llama-3-8b.json\"\n[[devices]]\nids = [0]\nmemory_gib = 1e308\n[pipeline]\ndevices = [[0]]\ncuts = [99999999999999]\n".to_vec(),
        b"[model]\nconfig = \"models/llama-3-8b.json\"\n[[devices]]\nids = [9223372036854775807]\nmemory_gib = nan\n[runtime]\nmax_context = -9223372036854775808\n[pipeline]\ndevices = [[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]]\n".to_vec(),
        b"[model]\nconfig = \"models/llama-3-8b.json\"\n[[devices]]\nids = [0]\nmemory_gib = inf\n[pipeline]\ndevices = [[[[[[0]]]]]]\n".to_vec(),
        format!("{}\n", "[".repeat(5000)).into_bytes(),
    ];
    let mut rng = Lcg(7);
    for _ in 0..300 {
        let mut m = base.clone();
        for _ in 0..1 + rng.next() % 4 {
            let at = (rng.next() as usize) % m.len();
            match rng.next() % 3 {
                0 => m[at] = b"0123456789[]=,\"-.x \n"[(rng.next() % 20) as usize],
                1 => {
                    m.remove(at);
                }
                _ => m.insert(at, b"9"[0]),
            }
        }
        inputs.push(m);
    }
    for (i, input) in inputs.iter().enumerate() {
        let scratch = Scratch::new(&format!("fuzz{i}"), input);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            compile(&scratch.0).map(|c| c.plan.to_toml())
        }));
        assert!(
            outcome.is_ok(),
            "input {i} panicked:\n{}",
            String::from_utf8_lossy(input)
        );
    }
}

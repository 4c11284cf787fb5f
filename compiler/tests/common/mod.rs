//! Helpers shared by the model-reader tests of the synthetic architectures: a scratch folder
//! per test binary, a config.json written and read, and the facts two readings of a model
//! must agree on.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;

use memra_compiler::model::{read_config, Dtype, ModelMeta};

/// `name` in this process's scratch folder `memra-{tag}-{pid}` (created).
pub fn scratch(tag: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memra-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `text` written as the config.json `path`, read for placement dtype `dtype`.
pub fn read_config_text(path: PathBuf, text: &str, dtype: Dtype) -> anyhow::Result<ModelMeta> {
    std::fs::write(&path, text).unwrap();
    read_config(&path, dtype)
}

/// Fails unless reading a model failed with an error whose text (with its causes) ends with
/// `want`.
pub fn assert_refused(read: anyhow::Result<ModelMeta>, want: &str) {
    let err = format!("{:#}", read.unwrap_err());
    assert!(err.ends_with(want), "{err}");
}

/// The two readings of one model (its config.json and its GGUF) agree on the layer schema's
/// facts (KDA, MLA, MoE, DSA, mHC), the dimensions and every tensor's shape.
pub fn assert_same_facts(from_config: &ModelMeta, from_gguf: &ModelMeta) {
    assert_eq!(from_config.kda, from_gguf.kda);
    assert_eq!(from_config.mla, from_gguf.mla);
    assert_eq!(from_config.moe, from_gguf.moe);
    assert_eq!(from_config.dsa, from_gguf.dsa);
    assert_eq!(from_config.mhc, from_gguf.mhc);
    let dims = |m: &ModelMeta| (m.layers, m.heads, m.kv_heads, m.head_dim);
    assert_eq!(dims(from_config), dims(from_gguf));
    assert_eq!(tensor_shapes(from_config), tensor_shapes(from_gguf));
}

/// Every tensor's name and shape, in the reader's order.
fn tensor_shapes(m: &ModelMeta) -> Vec<(String, Vec<u64>)> {
    m.tensors
        .iter()
        .map(|t| (t.name.clone(), t.shape.clone()))
        .collect()
}

//! Reads the tokenizer and chat-template keys of a GGUF file into plain data.
//!
//! Only this file knows GGUF key names; the tokenizer and the chat template take plain data,
//! so they can be tested without a model file. Absent optional keys stay `None`; present keys
//! of the wrong type are errors naming the key.

use anyhow::{anyhow, Context, Result};
use memra_gguf::GgufFile;

use super::chat::ChatTemplate;
use super::tokenizer::{Tokenizer, TokenizerSpec};

/// Metadata keys whose token id, when present, ends generation besides the eos token.
const END_ID_KEYS: &[&str] = &[
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.fim_pad_token_id",
    "tokenizer.ggml.fim_rep_token_id",
    "tokenizer.ggml.fim_sep_token_id",
];

/// `Some(getter(key))` when `key` is present, `None` when absent.
fn optional<'f, T>(
    file: &'f GgufFile,
    key: &str,
    getter: impl FnOnce(&'f GgufFile, &str) -> Result<T>,
) -> Result<Option<T>> {
    if file.metadata.contains_key(key) {
        getter(file, key).map(Some)
    } else {
        Ok(None)
    }
}

/// Collects the `tokenizer.ggml.*` keys of `file` into a [`TokenizerSpec`].
pub fn tokenizer_spec(file: &GgufFile) -> Result<TokenizerSpec> {
    let strings = |key: &str| -> Result<Vec<String>> {
        Ok(file
            .get_str_array(key)?
            .into_iter()
            .map(str::to_owned)
            .collect())
    };
    let token_types =
        optional(file, "tokenizer.ggml.token_type", GgufFile::get_i32_array)?.unwrap_or_default();
    let mut end_ids = Vec::new();
    for key in END_ID_KEYS {
        end_ids.extend(optional(file, key, GgufFile::get_u32)?);
    }
    Ok(TokenizerSpec {
        model: file.get_str("tokenizer.ggml.model")?.to_owned(),
        pre: optional(file, "tokenizer.ggml.pre", GgufFile::get_str)?.map(str::to_owned),
        tokens: strings("tokenizer.ggml.tokens")?,
        token_types,
        merges: optional(file, "tokenizer.ggml.merges", |_, k| strings(k))?.unwrap_or_default(),
        bos: optional(file, "tokenizer.ggml.bos_token_id", GgufFile::get_u32)?,
        eos: optional(file, "tokenizer.ggml.eos_token_id", GgufFile::get_u32)?,
        end_ids,
        add_bos: optional(file, "tokenizer.ggml.add_bos_token", GgufFile::get_bool)?,
        add_eos: optional(file, "tokenizer.ggml.add_eos_token", GgufFile::get_bool)?,
    })
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        let spec = tokenizer_spec(file)?;
        Tokenizer::from_spec(&spec)
            .with_context(|| format!("building the tokenizer of {}", file.path().display()))
    }
}

impl ChatTemplate {
    /// The chat template stored in `tokenizer.chat_template`, with the model's BOS/EOS texts;
    /// a file without one is an error (memra never guesses a template).
    pub fn from_gguf(file: &GgufFile, tokenizer: &Tokenizer) -> Result<ChatTemplate> {
        let key = "tokenizer.chat_template";
        let source = optional(file, key, GgufFile::get_str)?.ok_or_else(|| {
            anyhow!(
                "{} has no chat template (`{key}`); ChatML is used only when asked for explicitly",
                file.path().display()
            )
        })?;
        let text = |id: Option<u32>| id.map(|id| tokenizer.decode(&[id])).transpose();
        ChatTemplate::new(
            source,
            text(tokenizer.bos())?.unwrap_or_default(),
            text(tokenizer.eos())?.unwrap_or_default(),
        )
        .with_context(|| format!("`{key}` in {}", file.path().display()))
    }
}

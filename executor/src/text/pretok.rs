//! Pre-tokenizers: the regex splits that byte-level BPE vocabularies expect before merging.
//!
//! A GGUF names its pre-tokenizer in `tokenizer.ggml.pre`. llama.cpp (the reference for token
//! ids) maps each name to an ordered list of regexes and applies them in turn: every regex
//! splits each current piece into its matches and the text between them, and both are kept.
//! That is exactly a `Split` pre-tokenizer with `Isolated` behaviour, so each regex becomes one
//! such split, followed by a byte-level mapping with no regex of its own.

use anyhow::{bail, Context, Result};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

/// GPT-2's split: contractions, letter runs, digit runs, other runs, trailing whitespace.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's split: case-insensitive contractions, digit groups of at most three, newline runs.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's split: as Llama 3's, but every digit stands alone.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer families memra supports, named as llama.cpp names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// llama.cpp's fallback: punctuation runs, then GPT-2, then digit runs in threes.
    Default,
    /// GPT-2's regex alone.
    Gpt2,
    /// Llama 3 (`llama3`, `llama-v3`, `llama-bpe`); whole words in the vocabulary skip merging.
    Llama3,
    /// Qwen 2 (`qwen2`, `deepseek-r1-qwen`).
    Qwen2,
    /// SmolLM and StarCoder (`smollm`, `starcoder`): single digits, then GPT-2.
    Smollm,
}

/// Every accepted `tokenizer.ggml.pre` value and the family it selects, in the order shown in
/// error messages.
const NAMES: &[(&str, PreTokenizerKind)] = &[
    ("default", PreTokenizerKind::Default),
    ("gpt-2", PreTokenizerKind::Gpt2),
    ("llama3", PreTokenizerKind::Llama3),
    ("llama-v3", PreTokenizerKind::Llama3),
    ("llama-bpe", PreTokenizerKind::Llama3),
    ("qwen2", PreTokenizerKind::Qwen2),
    ("deepseek-r1-qwen", PreTokenizerKind::Qwen2),
    ("smollm", PreTokenizerKind::Smollm),
    ("starcoder", PreTokenizerKind::Smollm),
];

impl PreTokenizerKind {
    /// Resolves a `tokenizer.ggml.pre` value; an unknown name is an error listing the known ones.
    pub fn from_name(name: &str) -> Result<Self> {
        match NAMES.iter().find(|(n, _)| *n == name) {
            Some(&(_, kind)) => Ok(kind),
            None => {
                let known: Vec<&str> = NAMES.iter().map(|(n, _)| *n).collect();
                bail!(
                    "tokenizer.ggml.pre: unsupported pre-tokenizer `{name}`; supported: {}",
                    known.join(", ")
                )
            }
        }
    }

    /// The regexes llama.cpp applies for this family, in order.
    fn regexes(self) -> &'static [&'static str] {
        match self {
            Self::Default => &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
            Self::Gpt2 => &[GPT2],
            Self::Llama3 => &[LLAMA3],
            Self::Qwen2 => &[QWEN2],
            Self::Smollm => &[r"\p{N}", GPT2],
        }
    }

    /// Whether a pre-tokenized word that is itself a vocabulary entry bypasses the merges.
    pub fn ignore_merges(self) -> bool {
        self == Self::Llama3
    }

    /// Whether the model adds a BOS token when its GGUF does not say (llama.cpp's default).
    pub fn default_add_bos(self) -> bool {
        self == Self::Llama3
    }

    /// Builds the `tokenizers` pre-tokenizer: one isolating split per regex, then byte mapping.
    pub fn build(self) -> Result<Sequence> {
        let mut steps = Vec::new();
        for regex in self.regexes() {
            let split = Split::new(
                SplitPattern::Regex((*regex).to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("compiling pre-tokenizer regex `{regex}`"))?;
            steps.push(PreTokenizerWrapper::Split(split));
        }
        steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
            false, false, false,
        )));
        Ok(Sequence::new(steps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    /// The pieces a pre-tokenizer cuts `text` into, in the byte-level alphabet.
    fn pieces(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        let mut s = PreTokenizedString::from(text);
        kind.build().unwrap().pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(p, _, _)| p.to_owned())
            .collect()
    }

    #[test]
    fn every_family_compiles() {
        for (_, kind) in NAMES {
            kind.build().unwrap();
        }
    }

    #[test]
    fn smollm_isolates_digits() {
        assert_eq!(
            pieces(PreTokenizerKind::Smollm, "x 123"),
            ["x", "Ġ", "1", "2", "3"]
        );
    }

    #[test]
    fn llama3_groups_digits_in_threes() {
        assert_eq!(
            pieces(PreTokenizerKind::Llama3, "x 12345"),
            ["x", "Ġ", "123", "45"]
        );
    }

    #[test]
    fn gpt2_keeps_last_space_with_the_word() {
        assert_eq!(pieces(PreTokenizerKind::Gpt2, "a   b"), ["a", "ĠĠ", "Ġb"]);
    }

    #[test]
    fn unknown_name_lists_supported() {
        let err = PreTokenizerKind::from_name("mystery")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("tokenizer.ggml.pre: unsupported pre-tokenizer `mystery`"));
        assert!(err.contains("smollm"), "{err}");
    }
}

//! The tokenizer: text to token ids and back, built from a model's vocabulary description.
//!
//! The vocabulary arrives as plain data ([`TokenizerSpec`], filled from GGUF metadata by
//! `text::gguf`) and is turned into a Hugging Face `tokenizers` byte-level BPE with the
//! pre-tokenizer llama.cpp uses for the same vocabulary, so that the ids match llama.cpp's.
//! Control, unknown and user-defined tokens become added tokens: `<|im_start|>` written in a
//! prompt is one token, never its characters.

use std::collections::{BTreeSet, HashMap};

use anyhow::{anyhow, bail, Context, Result};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::{
    AddedToken, DecodeStream, DecoderWrapper, ModelWrapper, NormalizerWrapper,
    PostProcessorWrapper, PreTokenizerWrapper,
};

use super::pretok::PreTokenizerKind;

/// Token texts that end generation, as llama.cpp recognises them by name.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    // fill-in-the-middle pad, repository and file-separator tokens end generation too
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

/// The kind of a vocabulary entry, as `tokenizer.ggml.token_type` numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// 0: not specified; treated as normal text.
    Undefined,
    /// 1: ordinary text.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (`<|im_start|>`); parsed from text as one token.
    Control,
    /// 4: a user-defined token; parsed from text as one token.
    UserDefined,
    /// 5: reserved and never produced.
    Unused,
    /// 6: a raw byte (`<0x0A>`), used by SentencePiece vocabularies.
    Byte,
}

impl TokenType {
    /// Decodes a `tokenizer.ggml.token_type` entry; values outside 0..=6 are an error.
    pub fn from_code(code: i32) -> Result<Self> {
        Ok(match code {
            0 => Self::Undefined,
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => bail!("unknown token type {code}; known types are 0..=6"),
        })
    }
}

/// Everything needed to build a [`Tokenizer`], as plain data (the GGUF `tokenizer.ggml.*` keys).
#[derive(Debug, Clone, Default)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`; only `gpt2` (byte-level BPE) is supported.
    pub model: String,
    /// `tokenizer.ggml.pre`; `None` selects llama.cpp's `default`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the vocabulary, indexed by token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: one code per token; empty means all normal.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: BPE merges as `"left right"`, highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// Other ids the metadata declares as ending generation (eot, eom, fim pad/repo/sep).
    pub end_ids: Vec<u32>,
    /// `tokenizer.ggml.add_bos_token`; `None` uses the pre-tokenizer's default.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`; `None` means false.
    pub add_eos: Option<bool>,
}

/// A byte-level BPE tokenizer whose ids match llama.cpp's for the same GGUF.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    vocab_size: u32,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    eog: BTreeSet<u32>,
}

impl Tokenizer {
    /// Builds the tokenizer from its description; every inconsistency is an error.
    pub fn from_spec(spec: &TokenizerSpec) -> Result<Tokenizer> {
        if spec.model != "gpt2" {
            bail!(
                "tokenizer.ggml.model: unsupported tokenizer model `{}`; supported: gpt2 (byte-level BPE)",
                spec.model
            );
        }
        let pre = PreTokenizerKind::from_name(spec.pre.as_deref().unwrap_or("default"))?;
        let n = spec.tokens.len();
        let vocab_size = u32::try_from(n)
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| anyhow!("tokenizer.ggml.tokens: vocabulary has {n} tokens"))?;
        if !spec.token_types.is_empty() && spec.token_types.len() != n {
            bail!(
                "tokenizer.ggml.token_type: has {} entries but tokenizer.ggml.tokens has {n}",
                spec.token_types.len()
            );
        }
        let check_id = |key: &str, id: Option<u32>| match id {
            Some(id) if id >= vocab_size => Err(anyhow!(
                "{key}: token id {id} is out of range; vocabulary size is {vocab_size}"
            )),
            _ => Ok(id),
        };
        let bos = check_id("tokenizer.ggml.bos_token_id", spec.bos)?;
        let eos = check_id("tokenizer.ggml.eos_token_id", spec.eos)?;
        for &id in &spec.end_ids {
            check_id("end-of-generation token", Some(id))?;
        }
        let add_bos = spec.add_bos.unwrap_or(pre.default_add_bos());
        let add_eos = spec.add_eos.unwrap_or(false);
        if add_bos && bos.is_none() {
            bail!(
                "tokenizer.ggml.add_bos_token: is set but tokenizer.ggml.bos_token_id is missing"
            );
        }
        if add_eos && eos.is_none() {
            bail!(
                "tokenizer.ggml.add_eos_token: is set but tokenizer.ggml.eos_token_id is missing"
            );
        }

        let mut index: HashMap<&str, u32> = HashMap::with_capacity(n);
        for (id, text) in (0..vocab_size).zip(&spec.tokens) {
            if text.is_empty() {
                bail!("tokenizer.ggml.tokens: token {id} is empty");
            }
            if let Some(first) = index.insert(text, id) {
                bail!("tokenizer.ggml.tokens: `{text}` appears twice, as token {first} and {id}");
            }
        }
        let merges = spec
            .merges
            .iter()
            .enumerate()
            .map(|(i, m)| split_merge(m).with_context(|| format!("tokenizer.ggml.merges[{i}]")))
            .collect::<Result<Vec<_>>>()?;
        let vocab: Vocab = index.iter().map(|(t, &id)| ((*t).to_owned(), id)).collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(pre.ignore_merges())
            .build()
            .map_err(|e| anyhow!("tokenizer.ggml.merges: {e}"))?;

        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre.build()?));
        inner.with_decoder(Some(ByteLevelDecoder::default()));

        let mut eog: BTreeSet<u32> = spec.end_ids.iter().copied().chain(eos).collect();
        let mut added = Vec::new();
        for (id, text) in (0..vocab_size).zip(&spec.tokens) {
            let ty = match spec.token_types.get(id as usize) {
                Some(&code) => TokenType::from_code(code)
                    .with_context(|| format!("tokenizer.ggml.token_type[{id}]"))?,
                None => TokenType::Normal,
            };
            let ends = EOG_TEXTS.contains(&text.as_str());
            if ends {
                eog.insert(id);
            }
            // llama.cpp promotes end-of-generation tokens to control tokens whatever their type
            let special = match ty {
                TokenType::Control | TokenType::Unknown => true,
                TokenType::UserDefined => false,
                _ if ends => true,
                _ => continue,
            };
            added.push(AddedToken::from(text.clone(), special).normalized(false));
        }
        inner
            .add_tokens(added)
            .map_err(|e| anyhow!("registering special tokens: {e}"))?;

        Ok(Tokenizer {
            inner,
            vocab_size,
            bos,
            eos,
            add_bos,
            add_eos,
            eog,
        })
    }

    /// Encodes text; special-token texts become their ids, and with `add_special` the BOS/EOS
    /// tokens are added where the model's metadata asks for them.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| anyhow!("encoding text: {e}"))?;
        let mut ids = Vec::with_capacity(encoding.len() + 2);
        if add_special && self.add_bos {
            ids.extend(self.bos);
        }
        ids.extend_from_slice(encoding.get_ids());
        if add_special && self.add_eos {
            ids.extend(self.eos);
        }
        Ok(ids)
    }

    /// Decodes ids to text, special tokens included; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        for &id in ids {
            self.check(id)?;
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| anyhow!("decoding tokens: {e}"))
    }

    /// A decoder for generated tokens that yields text only once it is whole UTF-8.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            tokenizer: self,
            inner: self.inner.decode_stream(false),
        }
    }

    /// The beginning-of-sequence token, if the model has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token, if the model has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether generating `id` ends the turn (eos, eot, `<|im_end|>`, ... as llama.cpp decides).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// The end-of-generation tokens, ascending.
    pub fn eog_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }

    /// The tokenizer in Hugging Face's `tokenizer.json` form.
    pub fn to_json(&self) -> Result<String> {
        self.inner
            .to_string(false)
            .map_err(|e| anyhow!("writing the tokenizer as JSON: {e}"))
    }

    /// Number of tokens in the vocabulary; every valid id is below it.
    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// The vocabulary text of `id` (byte-level alphabet, e.g. `Ġthe`).
    pub fn token_text(&self, id: u32) -> Result<String> {
        self.check(id)?;
        self.inner
            .id_to_token(id)
            .ok_or_else(|| anyhow!("token id {id} has no text"))
    }

    fn check(&self, id: u32) -> Result<()> {
        if id >= self.vocab_size {
            bail!(
                "token id {id} is out of range; vocabulary size is {}",
                self.vocab_size
            );
        }
        Ok(())
    }
}

/// Splits a merge rule at its first space after the first character, as llama.cpp does.
fn split_merge(rule: &str) -> Result<(String, String)> {
    let first_len = rule.chars().next().map_or(0, char::len_utf8);
    match rule[first_len..].find(' ') {
        Some(at) => {
            let at = first_len + at;
            Ok((rule[..at].to_owned(), rule[at + 1..].to_owned()))
        }
        None => bail!("merge `{rule}` is not two tokens separated by a space"),
    }
}

/// Incremental decoding of generated tokens: a multi-byte character split across tokens is
/// held back until its last byte arrives.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    inner: DecodeStream<
        'a,
        ModelWrapper,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >,
}

impl StreamDecoder<'_> {
    /// Adds one token; returns the text it completes, or `None` while a character is partial.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.tokenizer.check(id)?;
        self.inner
            .step(id)
            .map_err(|e| anyhow!("decoding token {id}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy byte-level vocabulary: the 256 byte symbols, a few merges, two control tokens.
    fn toy() -> TokenizerSpec {
        let mut tokens = vec!["<|endoftext|>".to_owned(), "<|im_start|>".to_owned()];
        let mut types = vec![3, 3];
        let bytes = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet();
        let mut bytes: Vec<String> = bytes.into_iter().map(String::from).collect();
        bytes.sort();
        for b in bytes {
            tokens.push(b);
            types.push(1);
        }
        let merges = vec!["h i".to_owned(), "Ġ t".to_owned(), "Ġt here".to_owned()];
        tokens.extend(["hi", "Ġt", "here", "Ġthere"].map(String::from));
        types.extend([1, 1, 1, 1]);
        TokenizerSpec {
            model: "gpt2".into(),
            pre: Some("smollm".into()),
            tokens,
            token_types: types,
            merges,
            bos: Some(1),
            eos: Some(0),
            add_bos: Some(true),
            ..TokenizerSpec::default()
        }
    }

    fn id(tok: &Tokenizer, text: &str) -> u32 {
        tok.inner.token_to_id(text).unwrap()
    }

    #[test]
    fn control_tokens_parse_whole_and_bos_is_added() {
        let tok = Tokenizer::from_spec(&toy()).unwrap();
        let ids = tok.encode("<|im_start|>hi", true).unwrap();
        assert_eq!(ids, [1, 1, id(&tok, "hi")]);
        assert_eq!(tok.encode("hi", false).unwrap(), [id(&tok, "hi")]);
    }

    #[test]
    fn decode_round_trips_and_stream_holds_partial_chars() {
        let tok = Tokenizer::from_spec(&toy()).unwrap();
        let text = "hi é<|im_start|>";
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text);

        // "é" is two bytes, hence two byte-level tokens; the first alone yields nothing
        let e = tok.encode("é", false).unwrap();
        assert_eq!(e.len(), 2);
        let mut stream = tok.stream_decoder();
        assert_eq!(stream.push(e[0]).unwrap(), None);
        assert_eq!(stream.push(e[1]).unwrap().as_deref(), Some("é"));
    }

    #[test]
    fn eog_comes_from_eos_and_known_names() {
        let tok = Tokenizer::from_spec(&toy()).unwrap();
        assert!(tok.is_eog(0));
        assert!(!tok.is_eog(1));
    }

    #[test]
    fn rejects_unsupported_model_and_bad_ids() {
        let mut spec = toy();
        spec.model = "llama".into();
        let err = Tokenizer::from_spec(&spec).err().unwrap().to_string();
        assert_eq!(
            err,
            "tokenizer.ggml.model: unsupported tokenizer model `llama`; supported: gpt2 (byte-level BPE)"
        );
        let mut spec = toy();
        spec.eos = Some(1_000_000);
        let err = Tokenizer::from_spec(&spec).err().unwrap().to_string();
        assert!(err.contains("token id 1000000 is out of range"), "{err}");
        let tok = Tokenizer::from_spec(&toy()).unwrap();
        assert!(tok.decode(&[tok.vocab_size()]).is_err());
    }

    #[test]
    fn merge_rules_split_at_the_first_inner_space() {
        assert_eq!(split_merge("Ġ t").unwrap(), ("Ġ".into(), "t".into()));
        assert!(split_merge("nospace").is_err());
    }
}

//! Structured output: `response_format` (`json_object`, or `json_schema` with its schema)
//! and a `tool_choice` that asks for tool calls (`tools`) constrain a sequence's tokens with
//! llguidance, the grammar engine llama.cpp and vLLM use:
//! its Earley parser over the schema's grammar, and a trie of the vocabulary's bytes that
//! gives, each step, the set of tokens that keep the text a prefix of a valid answer. The
//! sampler sees the other tokens' logits as -inf; the mask is exact, so the constrained pick
//! stays a pure function of the logits, the seed and the draw number.

use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{token_bytes_from_tokenizer_json, Matcher, ParserFactory};
use serde_json::Value;

use crate::text::Tokenizer;

/// Makes a matcher per constrained sequence; built once per server from the tokenizer.
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    /// The vocabulary's bytes, from the tokenizer's own JSON form, in a token trie.
    pub fn new(tokenizer: &Tokenizer) -> Result<Grammars> {
        let json: Value = serde_json::from_str(&tokenizer.to_json()?)
            .context("reading the tokenizer's JSON form")?;
        let mut words = token_bytes_from_tokenizer_json(&json)?;
        let vocab = tokenizer.vocab_size();
        words.resize(vocab as usize, Vec::new());
        let eos = tokenizer
            .eos()
            .or_else(|| tokenizer.eog_ids().next())
            .ok_or_else(|| anyhow!("the model has no end-of-sequence token to end an answer"))?;
        let trie = TokTrie::from(&TokRxInfo::new(vocab, eos), &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)?;
        // llguidance's own log lines stay out of the server's log
        factory.set_stderr_log_level(0);
        Ok(Grammars { factory })
    }

    /// A matcher of the answers valid under `grammar` (a JSON schema's, a Lark grammar).
    pub fn matcher(&self, grammar: TopLevelGrammar) -> Result<Matcher> {
        let parser = self.factory.create_parser(grammar)?;
        Ok(Matcher::new(Ok(parser)))
    }
}

/// One sequence's constraint: its matcher and the masked copy of a step's logits.
pub struct Constraint {
    matcher: Matcher,
    masked: Vec<f32>,
}

impl Constraint {
    /// The constraint of `matcher`.
    pub fn new(matcher: Matcher) -> Constraint {
        Constraint {
            matcher,
            masked: Vec::new(),
        }
    }

    /// `logits` with every token the grammar does not allow next at -inf.
    pub fn mask(&mut self, logits: &[f32]) -> Result<&[f32]> {
        let allowed = self
            .matcher
            .compute_mask()
            .map_err(|e| anyhow!("the grammar of the answer: {e}"))?;
        self.masked.clear();
        self.masked
            .extend(logits.iter().enumerate().map(|(id, &l)| {
                if allowed.is_allowed(id as u32) {
                    l
                } else {
                    f32::NEG_INFINITY
                }
            }));
        Ok(&self.masked)
    }

    /// Advances the grammar past `token`; true when the answer is complete (nothing may
    /// follow).
    pub fn consume(&mut self, token: u32) -> Result<bool> {
        self.matcher
            .consume_token(token)
            .map_err(|e| anyhow!("the grammar of the answer: {e}"))?;
        Ok(self.matcher.is_stopped())
    }
}

//! The text layer of memra-run: tokenizer, streaming detokenizer and chat templates.
//!
//! Everything here is built from a model's GGUF metadata and checked against llama.cpp's
//! token ids, which are the reference: the same prompt must reach the model as the same ids.

mod chat;
mod gguf;
mod pretok;
mod tokenizer;

pub use chat::{ChatTemplate, Message};
pub use gguf::tokenizer_spec;
pub use pretok::PreTokenizerKind;
pub use tokenizer::{StreamDecoder, TokenType, Tokenizer, TokenizerSpec};

//! The JSON of answers and stream chunks, in OpenAI's shapes: a completion's or a chat's
//! choices (one per `n`), their logprobs and tool calls, the usage.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::api::Endpoint;
use super::logprobs::TokenLogprob;
use super::messages::ToolCall;
use crate::text::Tokenizer;

/// Token counts of a whole request: the prompt once, the completions of every choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt: usize,
    /// Tokens generated, all choices together.
    pub completion: usize,
}

/// The fields every response and chunk of one request shares.
pub struct Shape {
    /// Which endpoint answers.
    pub endpoint: Endpoint,
    /// The response id.
    pub id: String,
    /// Unix seconds when the request was taken.
    pub created: u64,
    /// The model id.
    pub model: String,
    /// A stream's usage comes in a chunk of its own, after the finish reasons'.
    pub usage_chunk: bool,
    /// Whether the request asked for logprobs (each choice then carries them).
    pub logprobs: bool,
    /// Spells the logprobs' tokens.
    pub tokenizer: Arc<Tokenizer>,
}

/// One piece of a choice: its index, text, the logprobs of its tokens, its tool calls and,
/// last, its finish reason.
pub struct Piece<'a> {
    /// The choice's index.
    pub index: usize,
    /// Text (a chunk's new text, or a whole answer's).
    pub text: &'a str,
    /// The logprobs of the piece's tokens.
    pub logprobs: &'a [TokenLogprob],
    /// The tool calls (a whole chat answer's, or a chunk's).
    pub calls: &'a [ToolCall],
    /// `finish_reason`, in the last piece.
    pub finish: Option<&'static str>,
}

impl<'a> Piece<'a> {
    /// A piece of `text` and its tokens' `logprobs`.
    pub fn text(index: usize, text: &'a str, logprobs: &'a [TokenLogprob]) -> Piece<'a> {
        Piece {
            index,
            text,
            logprobs,
            calls: &[],
            finish: None,
        }
    }
}

/// Tool calls as OpenAI writes them; in a chunk each carries its `index`.
fn calls_json(calls: &[ToolCall], chunk: bool) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let mut call = json!({"id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}});
            if chunk {
                call["index"] = json!(k);
            }
            call
        })
        .collect()
}

impl Shape {
    /// Whether the answer is a chat's.
    pub fn is_chat(&self) -> bool {
        self.endpoint == Endpoint::Chat
    }

    /// One choice of a whole answer (`whole`) or of a chunk.
    pub fn choice(&self, piece: &Piece, whole: bool) -> Value {
        let (index, text, finish) = (piece.index, piece.text, piece.finish);
        let logprobs = self.logprobs_json(piece.logprobs);
        match (self.endpoint, whole) {
            (Endpoint::Completions, _) => json!({"index": index, "text": text,
                "logprobs": logprobs, "finish_reason": finish}),
            (Endpoint::Chat, true) => {
                let mut message = json!({"role": "assistant", "content": text});
                if !piece.calls.is_empty() {
                    if text.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = calls_json(piece.calls, false);
                }
                json!({"index": index, "finish_reason": finish, "message": message,
                    "logprobs": logprobs})
            }
            (Endpoint::Chat, false) if finish.is_some() => {
                json!({"index": index, "delta": {}, "logprobs": logprobs, "finish_reason": finish})
            }
            (Endpoint::Chat, false) if !piece.calls.is_empty() => json!({"index": index,
                "delta": {"tool_calls": calls_json(piece.calls, true)}, "logprobs": logprobs,
                "finish_reason": null}),
            (Endpoint::Chat, false) => json!({"index": index, "delta": {"content": text},
                "logprobs": logprobs, "finish_reason": null}),
        }
    }

    /// The first chunk of a streamed chat choice: the assistant's role.
    pub fn role(&self, index: usize) -> Value {
        json!({"index": index, "delta": {"role": "assistant", "content": ""},
            "logprobs": null, "finish_reason": null})
    }

    fn object(&self, whole: bool) -> &'static str {
        match (self.endpoint, whole) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, true) => "chat.completion",
            (Endpoint::Chat, false) => "chat.completion.chunk",
        }
    }

    /// A response or chunk of `choices`, with `usage` if given.
    pub fn body(&self, choices: Vec<Value>, whole: bool, usage: Option<Usage>) -> Value {
        let mut body = json!({
            "id": self.id,
            "object": self.object(whole),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            body["usage"] = json!({
                "prompt_tokens": u.prompt,
                "completion_tokens": u.completion,
                "total_tokens": u.prompt + u.completion,
            });
        }
        body
    }

    /// A choice's `logprobs`: null when not asked for; on completions OpenAI's legacy lists
    /// (`tokens`, `token_logprobs`, `top_logprobs` as token-to-logprob maps), on chat the
    /// `content` list of `{token, logprob, bytes, top_logprobs}`.
    fn logprobs_json(&self, logprobs: &[TokenLogprob]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let spell = |id: u32| self.tokenizer.decode(&[id]).unwrap_or_default();
        match self.endpoint {
            Endpoint::Completions => {
                let tokens: Vec<String> = logprobs.iter().map(|t| spell(t.token)).collect();
                let values: Vec<f32> = logprobs.iter().map(|t| t.logprob).collect();
                let top: Vec<Map<String, Value>> = logprobs
                    .iter()
                    .map(|t| {
                        t.top
                            .iter()
                            .map(|&(id, lp)| (spell(id), json!(lp)))
                            .collect()
                    })
                    .collect();
                json!({"tokens": tokens, "token_logprobs": values, "top_logprobs": top})
            }
            Endpoint::Chat => {
                let entry = |id: u32, lp: f32| {
                    let text = spell(id);
                    json!({"token": text, "logprob": lp, "bytes": text.as_bytes()})
                };
                let content: Vec<Value> = logprobs
                    .iter()
                    .map(|t| {
                        let mut e = entry(t.token, t.logprob);
                        e["top_logprobs"] = t.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
                        e
                    })
                    .collect();
                json!({ "content": content })
            }
        }
    }
}

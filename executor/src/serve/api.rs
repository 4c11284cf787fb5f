//! The OpenAI request bodies this server accepts, read field by field from JSON so that every
//! refusal names its field: `/v1/completions` (a prompt) and `/v1/chat/completions` (messages),
//! with the sampling extensions vLLM and llama-server take (`top_k`, `min_p`,
//! `repetition_penalty`), and on chat `tools` (`tools`). Fields that change what comes back
//! but that this server does not implement (`echo`, `best_of`, `suffix`, `logit_bias`, and
//! the other servers' extensions in `UNIMPLEMENTED`) are refused unless they hold the value
//! that leaving them out means; fields that change nothing here (`user`, ...) are ignored.

use serde_json::{Map, Value};

use super::error::ApiError;
use super::logprobs::MAX_TOP_LOGPROBS;
use super::messages::{messages, ChatMessage};
use super::refused::refuse_unimplemented;
use super::tools::{tool_set, ToolSet};
use crate::sample::PenaltyConfig;

/// Most stop strings a request may give (a server limit; OpenAI allows 4).
pub const MAX_STOPS: usize = 16;

/// Most choices (`n`) one request may ask for (a server limit).
pub const MAX_CHOICES: usize = 16;

/// What a request asks to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A completion's prompt text.
    Prompt(String),
    /// A completion's prompt as token ids.
    Tokens(Vec<u32>),
    /// A chat's conversation, rendered with the model's template.
    Chat(Vec<ChatMessage>),
}

/// A validated request, before tokenization.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The prompt or the conversation.
    pub input: Input,
    /// Softmax temperature in [0, 2]; 0 is greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    pub top_p: f32,
    /// Most likely tokens kept; 0 keeps all.
    pub top_k: usize,
    /// Min-p in [0, 1]; 0 keeps all.
    pub min_p: f32,
    /// Presence, frequency and repetition penalties.
    pub penalties: PenaltyConfig,
    /// `Some(top)`: report each token's logprob and the `top` best tokens'.
    pub logprobs: Option<usize>,
    /// Choices to generate.
    pub n: usize,
    /// `response_format`'s JSON schema the answer must follow (`json_object`: any object).
    pub format: Option<Value>,
    /// A chat's tools, unless it has none or `tool_choice` is `"none"`.
    pub tools: Option<ToolSet>,
    /// Most tokens to generate; `None`: up to the context.
    pub max_tokens: Option<usize>,
    /// The field `max_tokens` came from: `max_tokens`, or on chat OpenAI's newer
    /// `max_completion_tokens` (which wins when both are given).
    pub max_tokens_field: &'static str,
    /// Strings that end the text (not included).
    pub stop: Vec<String>,
    /// Seed of the sampler; `None`: one per request.
    pub seed: Option<u64>,
    /// Server-sent events instead of one body.
    pub stream: bool,
    /// `stream_options.include_usage`: a stream ends with a chunk of no choices that carries
    /// the usage (else the usage rides in the chunk with the finish reason).
    pub include_usage: bool,
}

/// Which endpoint a body was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    Chat,
}

/// Reads a request body for `endpoint`; `model` is the id this server serves.
pub fn parse(body: &[u8], endpoint: Endpoint, model: &str) -> Result<Request, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::malformed(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(fields) = value else {
        return Err(ApiError::malformed(format!(
            "the body must be a JSON object, got {}",
            kind(&value)
        )));
    };
    let f = Fields(&fields);
    refuse_unimplemented(&f)?;
    if let Some(asked) = f.string("model")? {
        if asked != model {
            return Err(ApiError::unknown_model(&asked, model));
        }
    }
    let n = match f.integer("n")? {
        None => 1,
        Some(n) if (1..=MAX_CHOICES as i128).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                "n",
                format!("n: must be in [1, {MAX_CHOICES}] (a server limit), got {n}"),
            ))
        }
    };
    let (input, tools) = match endpoint {
        Endpoint::Completions => {
            if f.get("tools")
                .is_some_and(|t| !t.as_array().is_some_and(Vec::is_empty))
            {
                return Err(ApiError::invalid(
                    "tools",
                    "tools: only /v1/chat/completions takes tools",
                ));
            }
            (prompt(f.get("prompt"))?, None)
        }
        Endpoint::Chat => (Input::Chat(messages(f.0.get("messages"))?), tool_set(&f)?),
    };
    let temperature = f.number("temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature: must be in [0, 2], got {temperature}"),
        ));
    }
    let top_p = f.number("top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("top_p: must be in (0, 1], got {top_p}"),
        ));
    }
    let top_k = match f.integer("top_k")? {
        // vLLM's -1 and 0 both keep every token
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k: must be at least 1, or 0 or -1 for all tokens, got {k}"),
            ))
        }
    };
    let min_p = f.ranged("min_p", 0.0, 0.0..=1.0, "[0, 1]")?;
    let penalties = PenaltyConfig {
        presence: f.ranged("presence_penalty", 0.0, -2.0..=2.0, "[-2, 2]")? as f32,
        frequency: f.ranged("frequency_penalty", 0.0, -2.0..=2.0, "[-2, 2]")? as f32,
        repetition: f.ranged("repetition_penalty", 1.0, 0.01..=2.0, "[0.01, 2]")? as f32,
    };
    let logprobs = logprobs(&f, endpoint)?;
    let format = response_format(f.get("response_format"))?;
    if tools.is_some() {
        let clash = if logprobs.is_some() {
            Some("logprobs")
        } else {
            format.as_ref().map(|_| "response_format")
        };
        if let Some(field) = clash {
            return Err(ApiError::invalid(
                field,
                format!("{field}: not supported together with tools; leave it out, or send tool_choice \"none\""),
            ));
        }
    }
    let max_tokens_field = match endpoint {
        Endpoint::Chat if f.get("max_completion_tokens").is_some() => "max_completion_tokens",
        _ => "max_tokens",
    };
    let max_tokens = match f.integer(max_tokens_field)? {
        None => None,
        Some(m) if m >= 1 => Some(usize::try_from(m).unwrap_or(usize::MAX)),
        Some(m) => {
            return Err(ApiError::invalid(
                max_tokens_field,
                format!("{max_tokens_field}: must be at least 1, got {m}"),
            ))
        }
    };
    let seed = f.integer("seed")?.map(|s| s as u64);
    Ok(Request {
        input,
        temperature: temperature as f32,
        top_p: top_p as f32,
        top_k,
        min_p: min_p as f32,
        penalties,
        logprobs,
        n,
        format,
        tools,
        max_tokens,
        max_tokens_field,
        stop: stops(f.0.get("stop"))?,
        seed,
        stream: f.boolean("stream")?.unwrap_or(false),
        include_usage: include_usage(f.get("stream_options"))?,
    })
}

/// The JSON type of a value, as a refusal names it.
pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Typed access to the body's optional fields; `null` counts as absent.
pub(super) struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    pub(super) fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    pub(super) fn wrong(name: &str, want: &str, got: &Value) -> ApiError {
        ApiError::invalid(name, format!("{name}: expected {want}, got {}", kind(got)))
    }

    fn string(&self, name: &str) -> Result<Option<String>, ApiError> {
        self.get(name)
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| Self::wrong(name, "a string", v))
            })
            .transpose()
    }

    fn number(&self, name: &str) -> Result<Option<f64>, ApiError> {
        self.get(name)
            .map(|v| v.as_f64().ok_or_else(|| Self::wrong(name, "a number", v)))
            .transpose()
    }

    /// Any JSON integer, `u64::MAX` included, as its value.
    fn integer(&self, name: &str) -> Result<Option<i128>, ApiError> {
        self.get(name)
            .map(|v| {
                v.as_i64()
                    .map(i128::from)
                    .or_else(|| v.as_u64().map(i128::from))
                    .ok_or_else(|| Self::wrong(name, "an integer", v))
            })
            .transpose()
    }

    /// A number in `range` (`allowed` in words), `default` when absent.
    fn ranged(
        &self,
        name: &str,
        default: f64,
        range: std::ops::RangeInclusive<f64>,
        allowed: &str,
    ) -> Result<f64, ApiError> {
        match self.number(name)? {
            None => Ok(default),
            Some(x) if range.contains(&x) => Ok(x),
            Some(x) => Err(ApiError::invalid(
                name,
                format!("{name}: must be in {allowed}, got {x}"),
            )),
        }
    }

    fn boolean(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.get(name)
            .map(|v| v.as_bool().ok_or_else(|| Self::wrong(name, "a boolean", v)))
            .transpose()
    }
}

/// A completion's `prompt`: a string, an array of token ids, or an array holding one of
/// these (several prompts in one request are refused: one request each).
fn prompt(value: Option<&Value>) -> Result<Input, ApiError> {
    let want = "a string or an array of token ids";
    let Some(value) = value else {
        return Err(ApiError::invalid(
            "prompt",
            format!("prompt: {want} is required"),
        ));
    };
    match value {
        Value::String(s) => Ok(Input::Prompt(s.clone())),
        Value::Array(items) if items.iter().all(Value::is_number) && !items.is_empty() => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| {
                        ApiError::invalid(
                            &format!("prompt[{i}]"),
                            format!("prompt[{i}]: a token id must be an integer >= 0, got {v}"),
                        )
                    })
            })
            .collect::<Result<_, _>>()
            .map(Input::Tokens),
        Value::Array(items) if items.len() == 1 && !items[0].is_number() => prompt(items.first()),
        Value::Array(items) if items.is_empty() => Err(ApiError::invalid(
            "prompt",
            "prompt: the array is empty; allowed: a string or an array of token ids",
        )),
        Value::Array(items) => Err(ApiError::invalid(
            "prompt",
            format!(
                "prompt: one prompt per request is supported, got {} (send one request each)",
                items.len()
            ),
        )),
        other => Err(Fields::wrong("prompt", want, other)),
    }
}

/// `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}` or
/// `{"type": "json_schema", "json_schema": {"schema": {...}}}`; the schema to follow.
fn response_format(value: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let Value::Object(format) = value else {
        return Err(Fields::wrong("response_format", "an object", value));
    };
    let allowed = "allowed: \"text\", \"json_object\", \"json_schema\"";
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(serde_json::json!({"type": "object"}))),
        Some("json_schema") => match format.get("json_schema").and_then(|j| j.get("schema")) {
            Some(schema @ Value::Object(_)) => Ok(Some(schema.clone())),
            Some(other) => Err(Fields::wrong(
                "response_format.json_schema.schema",
                "an object (a JSON schema)",
                other,
            )),
            None => Err(ApiError::invalid(
                "response_format.json_schema.schema",
                "response_format.json_schema.schema: a JSON schema object is required",
            )),
        },
        Some(other) => Err(ApiError::invalid(
            "response_format.type",
            format!("response_format.type: {allowed}, got \"{other}\""),
        )),
        None => Err(ApiError::invalid(
            "response_format.type",
            format!("response_format.type: a string is required; {allowed}"),
        )),
    }
}

/// `logprobs` and `top_logprobs`: on completions `logprobs` is the number of top tokens
/// (0..=20); on chat `logprobs` is a boolean and `top_logprobs` (0..=20) needs it true.
fn logprobs(f: &Fields, endpoint: Endpoint) -> Result<Option<usize>, ApiError> {
    let max = MAX_TOP_LOGPROBS as i128;
    let top = |name: &str, n: i128| {
        if (0..=max).contains(&n) {
            Ok(n as usize)
        } else {
            Err(ApiError::invalid(
                name,
                format!("{name}: must be in [0, {max}], got {n}"),
            ))
        }
    };
    match endpoint {
        Endpoint::Completions => {
            if f.integer("top_logprobs")?.is_some_and(|n| n != 0) {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    "top_logprobs: not a field of /v1/completions; logprobs: N asks for the N best tokens there",
                ));
            }
            match f.get("logprobs") {
                None | Some(Value::Bool(false)) => Ok(None),
                Some(_) => {
                    let n = f.integer("logprobs")?.unwrap_or(0);
                    top("logprobs", n).map(Some)
                }
            }
        }
        Endpoint::Chat => {
            let on = f.boolean("logprobs")?.unwrap_or(false);
            match f.integer("top_logprobs")? {
                Some(n) if n != 0 && !on => Err(ApiError::invalid(
                    "top_logprobs",
                    "top_logprobs: needs \"logprobs\": true",
                )),
                Some(n) => top("top_logprobs", n).map(|n| on.then_some(n)),
                None => Ok(on.then_some(0)),
            }
        }
    }
}

/// `stream_options`: an object whose `include_usage`, if given, is a boolean.
fn include_usage(value: Option<&Value>) -> Result<bool, ApiError> {
    let Some(value) = value else {
        return Ok(false);
    };
    let Value::Object(options) = value else {
        return Err(Fields::wrong("stream_options", "an object", value));
    };
    Fields(options)
        .boolean("include_usage")
        .map_err(|_| {
            ApiError::invalid(
                "stream_options.include_usage",
                "stream_options.include_usage: expected a boolean",
            )
        })
        .map(|b| b.unwrap_or(false))
}

/// `stop`: a string or an array of at most `MAX_STOPS` strings.
fn stops(value: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let want = "a string or an array of strings";
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) if items.len() > MAX_STOPS => Err(ApiError::invalid(
            "stop",
            format!(
                "stop: at most {MAX_STOPS} stop strings are allowed (a server limit), got {}",
                items.len()
            ),
        )),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| Fields::wrong("stop", want, v))
            })
            .collect(),
        Some(v) => Err(Fields::wrong("stop", want, v)),
    }
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;

//! The OpenAI request bodies this server accepts, read field by field from JSON so that every
//! refusal names its field: `/v1/completions` (a prompt) and `/v1/chat/completions` (messages).
//! Fields that change what comes back but that this server does not implement (`echo`,
//! `logprobs`, `best_of`, `suffix`, `logit_bias`, the penalties, `tools`, `response_format`)
//! are refused unless they hold the value that leaving them out means; fields that change
//! nothing here (`user`, `stream_options`, `tool_choice`, ...) are ignored.

use serde_json::{Map, Value};

use super::error::ApiError;
use crate::text::Message;

/// Most stop strings a request may give (as OpenAI allows).
const MAX_STOPS: usize = 4;

/// What a request asks to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A completion's prompt text.
    Prompt(String),
    /// A chat's conversation, rendered with the model's template.
    Chat(Vec<Message>),
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
    if let Some(n) = f.integer("n")? {
        if n != 1 {
            return Err(ApiError::invalid(
                "n",
                format!("n: only 1 choice per request is supported, got {n}"),
            ));
        }
    }
    let input = match endpoint {
        Endpoint::Completions if matches!(f.get("prompt"), Some(Value::Array(_))) => {
            return Err(ApiError::invalid(
                "prompt",
                "prompt: one string is supported, not an array (of strings or token ids)",
            ))
        }
        Endpoint::Completions => Input::Prompt(
            f.string("prompt")?
                .ok_or_else(|| ApiError::invalid("prompt", "prompt: a string is required"))?,
        ),
        Endpoint::Chat => Input::Chat(messages(f.0.get("messages"))?),
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
        max_tokens,
        max_tokens_field,
        stop: stops(f.0.get("stop"))?,
        seed,
        stream: f.boolean("stream")?.unwrap_or(false),
        include_usage: include_usage(f.get("stream_options"))?,
    })
}

/// A field of OpenAI's API this server does not implement: the values it takes (those that
/// mean what leaving it out means), and them in words.
struct Unimplemented {
    name: &'static str,
    neutral: fn(&Value) -> bool,
    allowed: &'static str,
}

/// Every field that would change the answer and that this server does not implement.
const UNIMPLEMENTED: &[Unimplemented] = &[
    Unimplemented {
        name: "echo",
        neutral: |v| v == &Value::Bool(false),
        allowed: "false",
    },
    Unimplemented {
        name: "suffix",
        neutral: |v| v.as_str() == Some(""),
        allowed: "\"\"",
    },
    Unimplemented {
        name: "best_of",
        neutral: |v| v.as_u64() == Some(1),
        allowed: "1",
    },
    // an integer on completions, a boolean on chat
    Unimplemented {
        name: "logprobs",
        neutral: |v| v == &Value::Bool(false),
        allowed: "false",
    },
    Unimplemented {
        name: "top_logprobs",
        neutral: |v| v.as_u64() == Some(0),
        allowed: "0",
    },
    Unimplemented {
        name: "logit_bias",
        neutral: |v| v.as_object().is_some_and(Map::is_empty),
        allowed: "{}",
    },
    Unimplemented {
        name: "presence_penalty",
        neutral: |v| v.as_f64() == Some(0.0),
        allowed: "0",
    },
    Unimplemented {
        name: "frequency_penalty",
        neutral: |v| v.as_f64() == Some(0.0),
        allowed: "0",
    },
    Unimplemented {
        name: "tools",
        neutral: |v| v.as_array().is_some_and(Vec::is_empty),
        allowed: "[]",
    },
    Unimplemented {
        name: "functions",
        neutral: |v| v.as_array().is_some_and(Vec::is_empty),
        allowed: "[]",
    },
    Unimplemented {
        name: "response_format",
        neutral: |v| v.get("type").and_then(Value::as_str) == Some("text"),
        allowed: "{\"type\": \"text\"}",
    },
];

/// Refuses the first unimplemented field given a value that would change the answer.
fn refuse_unimplemented(f: &Fields) -> Result<(), ApiError> {
    for u in UNIMPLEMENTED {
        match f.get(u.name) {
            Some(v) if !(u.neutral)(v) => {
                let got = match v {
                    Value::Array(_) | Value::Object(_) => kind(v).to_string(),
                    scalar => scalar.to_string(),
                };
                return Err(ApiError::invalid(
                    u.name,
                    format!(
                        "{}: not supported by this server; allowed: {} (or leave it out), got {got}",
                        u.name, u.allowed
                    ),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The JSON type of a value, as a refusal names it.
fn kind(v: &Value) -> &'static str {
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
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn wrong(name: &str, want: &str, got: &Value) -> ApiError {
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

    fn boolean(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.get(name)
            .map(|v| v.as_bool().ok_or_else(|| Self::wrong(name, "a boolean", v)))
            .transpose()
    }
}

/// `messages`: a non-empty array of `{role, content}` with string fields.
fn messages(value: Option<&Value>) -> Result<Vec<Message>, ApiError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Err(ApiError::invalid(
            "messages",
            "messages: an array of {role, content} objects is required",
        ));
    };
    let Value::Array(items) = value else {
        return Err(Fields::wrong("messages", "an array", value));
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages: at least one message is required",
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let Value::Object(m) = item else {
                return Err(Fields::wrong(&format!("messages[{i}]"), "an object", item));
            };
            let field = |name: &str| {
                let path = format!("messages[{i}].{name}");
                match m.get(name) {
                    Some(Value::String(s)) => Ok(s.clone()),
                    Some(v) => Err(Fields::wrong(&path, "a string", v)),
                    None => Err(ApiError::invalid(
                        &path,
                        format!("{path}: a string is required"),
                    )),
                }
            };
            let content = match m.get("content") {
                Some(Value::Array(parts)) => text_parts(i, parts)?,
                _ => field("content")?,
            };
            Ok(Message::new(field("role")?, content))
        })
        .collect()
}

/// A message's `content` given as OpenAI's parts: its `{"type": "text", "text"}` parts, one
/// per line; other parts (images, audio) are refused.
fn text_parts(i: usize, parts: &[Value]) -> Result<String, ApiError> {
    let texts = parts
        .iter()
        .enumerate()
        .map(|(j, part)| {
            let path = format!("messages[{i}].content[{j}]");
            let Value::Object(part) = part else {
                return Err(Fields::wrong(&path, "an object", part));
            };
            match (part.get("type"), part.get("text")) {
                (Some(Value::String(t)), Some(Value::String(text))) if t == "text" => {
                    Ok(text.as_str())
                }
                (Some(Value::String(t)), _) if t == "text" => Err(ApiError::invalid(
                    &format!("{path}.text"),
                    format!("{path}.text: a string is required"),
                )),
                (t, _) => Err(ApiError::invalid(
                    &format!("{path}.type"),
                    format!(
                        "{path}.type: only \"text\" parts are supported, got {}",
                        t.map_or("none".into(), Value::to_string)
                    ),
                )),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(texts.join("\n"))
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
                "stop: at most {MAX_STOPS} stop strings are allowed, got {}",
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
mod tests {
    use super::*;

    fn refusal(body: &str, endpoint: Endpoint) -> ApiError {
        parse(body.as_bytes(), endpoint, "m").unwrap_err()
    }

    #[test]
    fn a_full_completion_request_is_read() {
        let body = r#"{"model": "m", "prompt": "Hi", "temperature": 0, "top_p": 0.5,
            "max_tokens": 3, "stop": ["a", "b"], "seed": 9, "n": 1, "stream": true, "user": "x"}"#;
        let r = parse(body.as_bytes(), Endpoint::Completions, "m").unwrap();
        assert_eq!(r.input, Input::Prompt("Hi".into()));
        assert_eq!((r.temperature, r.top_p, r.max_tokens), (0.0, 0.5, Some(3)));
        assert_eq!(
            (r.stop, r.seed, r.stream),
            (vec!["a".into(), "b".into()], Some(9), true)
        );
    }

    #[test]
    fn unimplemented_fields_at_their_neutral_values_are_taken() {
        let body = r#"{"prompt": "x", "echo": false, "suffix": "", "best_of": 1, "logprobs": null,
            "logit_bias": {}, "presence_penalty": 0, "frequency_penalty": 0.0, "tools": [],
            "response_format": {"type": "text"}, "tool_choice": "none", "stream_options": {}}"#;
        let r = parse(body.as_bytes(), Endpoint::Completions, "m").unwrap();
        assert_eq!(r.input, Input::Prompt("x".into()));
        let body = r#"{"messages": [{"role": "user", "content": "x"}], "logprobs": false,
            "top_logprobs": 0}"#;
        assert!(parse(body.as_bytes(), Endpoint::Chat, "m").is_ok());
    }

    #[test]
    fn text_parts_are_a_message_content() {
        let body = r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
            {"type": "text", "text": "b"}]}]}"#;
        let r = parse(body.as_bytes(), Endpoint::Chat, "m").unwrap();
        assert_eq!(r.input, Input::Chat(vec![Message::new("user", "a\nb")]));
    }

    #[test]
    fn chat_takes_max_completion_tokens_before_max_tokens() {
        let body = r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 9,
            "max_completion_tokens": 3}"#;
        let r = parse(body.as_bytes(), Endpoint::Chat, "m").unwrap();
        assert_eq!(
            (r.max_tokens, r.max_tokens_field),
            (Some(3), "max_completion_tokens")
        );
        let r = parse(
            br#"{"prompt": "x", "max_completion_tokens": 3}"#,
            Endpoint::Completions,
            "m",
        );
        assert_eq!(r.unwrap().max_tokens, None);
    }

    #[test]
    fn integers_past_i64_keep_their_value() {
        let huge = u64::MAX;
        let e = refusal(
            &format!(r#"{{"prompt": "x", "n": {huge}}}"#),
            Endpoint::Completions,
        );
        assert!(e.message.ends_with(&format!("got {huge}")), "{}", e.message);
        let body = format!(r#"{{"prompt": "x", "max_tokens": {huge}, "seed": {huge}}}"#);
        let r = parse(body.as_bytes(), Endpoint::Completions, "m").unwrap();
        assert_eq!((r.max_tokens, r.seed), (Some(usize::MAX), Some(huge)));
        let r = parse(
            br#"{"prompt": "x", "seed": -1}"#,
            Endpoint::Completions,
            "m",
        )
        .unwrap();
        assert_eq!(r.seed, Some(u64::MAX));
    }

    #[test]
    fn every_refusal_names_its_field() {
        let cases = [
            (r#"{"prompt": 5}"#, Endpoint::Completions, Some("prompt")),
            (
                r#"{"prompt": "x", "max_tokens": 0}"#,
                Endpoint::Completions,
                Some("max_tokens"),
            ),
            (
                r#"{"prompt": "x", "max_tokens": "3"}"#,
                Endpoint::Completions,
                Some("max_tokens"),
            ),
            (
                r#"{"prompt": "x", "temperature": 3}"#,
                Endpoint::Completions,
                Some("temperature"),
            ),
            (
                r#"{"prompt": "x", "top_p": 0}"#,
                Endpoint::Completions,
                Some("top_p"),
            ),
            (
                r#"{"prompt": "x", "n": 2}"#,
                Endpoint::Completions,
                Some("n"),
            ),
            (
                r#"{"prompt": "x", "stop": [1]}"#,
                Endpoint::Completions,
                Some("stop"),
            ),
            (
                r#"{"prompt": "x", "stream": "yes"}"#,
                Endpoint::Completions,
                Some("stream"),
            ),
            (
                r#"{"prompt": "x", "model": "other"}"#,
                Endpoint::Completions,
                Some("model"),
            ),
            (r#"{"messages": []}"#, Endpoint::Chat, Some("messages")),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}"#,
                Endpoint::Chat,
                Some("max_completion_tokens"),
            ),
            (
                r#"{"messages": [{"role": "user"}]}"#,
                Endpoint::Chat,
                Some("messages[0].content"),
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
                Endpoint::Chat,
                Some("messages[0].content[0].type"),
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}"#,
                Endpoint::Chat,
                Some("messages[0].content[0].text"),
            ),
            (
                r#"{"prompt": ["x"]}"#,
                Endpoint::Completions,
                Some("prompt"),
            ),
            (
                r#"{"prompt": [1, 2]}"#,
                Endpoint::Completions,
                Some("prompt"),
            ),
            (
                r#"{"prompt": "x", "echo": true}"#,
                Endpoint::Completions,
                Some("echo"),
            ),
            (
                r#"{"prompt": "x", "logprobs": 2}"#,
                Endpoint::Completions,
                Some("logprobs"),
            ),
            (
                r#"{"prompt": "x", "best_of": 3}"#,
                Endpoint::Completions,
                Some("best_of"),
            ),
            (
                r#"{"prompt": "x", "suffix": "y"}"#,
                Endpoint::Completions,
                Some("suffix"),
            ),
            (
                r#"{"prompt": "x", "logit_bias": {"50256": -100}}"#,
                Endpoint::Completions,
                Some("logit_bias"),
            ),
            (
                r#"{"prompt": "x", "presence_penalty": 0.5}"#,
                Endpoint::Completions,
                Some("presence_penalty"),
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "frequency_penalty": -1}"#,
                Endpoint::Chat,
                Some("frequency_penalty"),
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "logprobs": true}"#,
                Endpoint::Chat,
                Some("logprobs"),
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}"#,
                Endpoint::Chat,
                Some("top_logprobs"),
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}"#,
                Endpoint::Chat,
                Some("tools"),
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}"#,
                Endpoint::Chat,
                Some("response_format"),
            ),
            (
                r#"{"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}}"#,
                Endpoint::Completions,
                Some("stream_options.include_usage"),
            ),
            (
                r#"{"prompt": "x", "stream_options": []}"#,
                Endpoint::Completions,
                Some("stream_options"),
            ),
            (r#"{"prompt": "x""#, Endpoint::Completions, None),
            (r#"[1]"#, Endpoint::Completions, None),
        ];
        for (body, endpoint, param) in cases {
            let e = refusal(body, endpoint);
            assert_eq!(e.param.as_deref(), param, "{body}: {}", e.message);
            assert!(e.status.is_client_error(), "{body}");
            if let Some(p) = param {
                assert!(e.message.starts_with(p), "{body}: {}", e.message);
            }
        }
    }
}

//! A chat's `messages`, read field by field so that every refusal names its path: each
//! message's role and text, an assistant's `tool_calls` and a tool result's `tool_call_id`
//! (a message's `name` changes nothing here and is not read).

use serde_json::{Map, Value};

use super::api::Fields;
use super::error::ApiError;

/// One turn of a chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool` (templates may accept others).
    pub role: String,
    /// The text; `None` for an assistant turn of tool calls only.
    pub content: Option<String>,
    /// The tool calls of an assistant turn.
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` turn answers.
    pub tool_call_id: Option<String>,
}

#[cfg(test)]
impl ChatMessage {
    /// A turn of `role` saying `content`.
    pub fn text(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.to_owned(),
            content: Some(content.to_owned()),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A call of a function, in a reply or in an assistant turn of the conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id, which the tool's result names.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments: a JSON object, as text.
    pub arguments: String,
}

/// `messages`: a non-empty array of `{role, content}` objects; an assistant's may carry
/// `tool_calls` instead of `content`, a `tool` one needs `tool_call_id`.
pub fn messages(value: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
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
        .map(|(i, item)| match item {
            Value::Object(m) => message(i, m),
            _ => Err(Fields::wrong(&format!("messages[{i}]"), "an object", item)),
        })
        .collect()
}

/// A string field of `m` at `path`: `None` when absent or null.
fn string(m: &Map<String, Value>, path: &str, name: &str) -> Result<Option<String>, ApiError> {
    match m.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(Fields::wrong(&format!("{path}.{name}"), "a string", v)),
    }
}

fn message(i: usize, m: &Map<String, Value>) -> Result<ChatMessage, ApiError> {
    let path = format!("messages[{i}]");
    let required = |field: &str, what: &str| {
        let at = format!("{path}.{field}");
        ApiError::invalid(&at, format!("{at}: {what} is required"))
    };
    let role = string(m, &path, "role")?.ok_or_else(|| required("role", "a string"))?;
    let content = match m.get("content") {
        Some(Value::Array(parts)) => Some(text_parts(i, parts)?),
        _ => string(m, &path, "content")?,
    };
    let tool_calls = match m.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) if role != "assistant" => {
            return Err(ApiError::invalid(
                &format!("{path}.tool_calls"),
                format!(
                    "{path}.tool_calls: only an assistant message carries tool calls, got role \"{role}\" with {}",
                    super::api::kind(v)
                ),
            ))
        }
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(j, call)| tool_call(&format!("{path}.tool_calls[{j}]"), call))
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(Fields::wrong(&format!("{path}.tool_calls"), "an array", v)),
    };
    if content.is_none() && tool_calls.is_empty() {
        return Err(required(
            "content",
            "a string (or, in an assistant message, tool_calls)",
        ));
    }
    let tool_call_id = string(m, &path, "tool_call_id")?;
    if role == "tool" && tool_call_id.is_none() {
        return Err(required(
            "tool_call_id",
            "in a tool message, the id of the call it answers",
        ));
    }
    Ok(ChatMessage {
        role,
        content,
        tool_calls,
        tool_call_id,
    })
}

/// `{"id", "type": "function", "function": {"name", "arguments"}}`, `arguments` a JSON
/// object as text.
fn tool_call(path: &str, call: &Value) -> Result<ToolCall, ApiError> {
    let Value::Object(call) = call else {
        return Err(Fields::wrong(path, "an object", call));
    };
    let need = |at: String, what: &str| ApiError::invalid(&at, format!("{at}: {what}"));
    if let Some(kind) = call.get("type").filter(|t| t.as_str() != Some("function")) {
        return Err(need(
            format!("{path}.type"),
            &format!("allowed: \"function\", got {kind}"),
        ));
    }
    let id = string(call, path, "id")?
        .ok_or_else(|| need(format!("{path}.id"), "a string is required"))?;
    let function = match call.get("function") {
        Some(Value::Object(f)) => f,
        Some(v) => return Err(Fields::wrong(&format!("{path}.function"), "an object", v)),
        None => return Err(need(format!("{path}.function"), "an object is required")),
    };
    let at = format!("{path}.function");
    let name = string(function, &at, "name")?
        .ok_or_else(|| need(format!("{at}.name"), "a string is required"))?;
    let arguments = string(function, &at, "arguments")?.ok_or_else(|| {
        need(
            format!("{at}.arguments"),
            "a string is required (a JSON object)",
        )
    })?;
    if !serde_json::from_str::<Value>(&arguments).is_ok_and(|a| a.is_object()) {
        return Err(need(
            format!("{at}.arguments"),
            "must be a JSON object written as a string",
        ));
    }
    Ok(ToolCall {
        id,
        name,
        arguments,
    })
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

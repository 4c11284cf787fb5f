//! Chat tools: a request's `tools`, `tool_choice` and `parallel_tool_calls`, the prompt that
//! shows the tools to the model, and the grammar that holds a reply to a tool call.
//!
//! A chat template that renders tools itself (probed once: a tool's name shows in its text)
//! gets them as Hugging Face's `apply_chat_template(tools=...)` passes them; its replies
//! must use `<tool_call>{"name", "arguments"}</tool_call>` tags (Hermes', Qwen's), the one
//! native form this server parses, else a request with tools is refused. A template without
//! tools gets the server's own convention (`Form::Json`): a system prompt lists the
//! functions and asks for a reply of only `{"tool_calls": [{"name", "arguments"}]}`, and
//! the conversation's tool calls and results are written in that form. `"required"` or a
//! named function constrains the reply with llguidance to the form, each call's arguments to
//! its function's `parameters` schema; `"auto"` leaves the reply free and `tool_calls`
//! parses it; `"none"` shows no tools.

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Map, Value};

use super::api::{kind, Fields};
use super::error::ApiError;
use super::messages::ChatMessage;
use crate::text::ChatTemplate;

/// How a reply's tool calls are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// The server's convention: the reply is only `{"tool_calls": [{"name", "arguments"}]}`.
    Json,
    /// Hermes' and Qwen's: each call `<tool_call>\n{"name", "arguments"}\n</tool_call>`.
    Tagged,
}

/// How the model's chat template takes tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolStyle {
    /// It renders none: the server's convention shows them.
    Convention,
    /// It renders them and asks for `<tool_call>` tags.
    Tagged,
    /// It renders them and asks for another form, which this server does not parse.
    Foreign,
}

impl ToolStyle {
    /// Probes `template` with one tool: does its name show, and do `<tool_call>` tags?
    pub fn of(template: &ChatTemplate) -> ToolStyle {
        let probe = "memra_probe_function";
        let tools = json!([{"type": "function", "function": {"name": probe,
            "description": "a probe", "parameters": {"type": "object", "properties": {}}}}]);
        let messages = [json!({"role": "user", "content": "hello"})];
        match template.render_json(&messages, Some(&tools), true) {
            Ok(text) if text.contains(probe) && text.contains("<tool_call>") => ToolStyle::Tagged,
            Ok(text) if text.contains(probe) => ToolStyle::Foreign,
            _ => ToolStyle::Convention,
        }
    }

    /// The form of a reply's calls.
    pub fn form(self) -> Form {
        match self {
            ToolStyle::Tagged => Form::Tagged,
            ToolStyle::Convention | ToolStyle::Foreign => Form::Json,
        }
    }
}

/// What `tool_choice` asks of the reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// The model calls functions or answers in text.
    Auto,
    /// The reply is one or more calls.
    Required,
    /// The reply is one call of this function.
    Function(String),
}

/// One function of `tools`.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    /// Its name.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// Its arguments' JSON schema.
    pub parameters: Value,
}

/// A chat request's tools, when it has some and `tool_choice` is not `"none"`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSet {
    /// The functions, in the request's order.
    pub functions: Vec<Function>,
    /// `tools` as the request gave them, for a template that renders them.
    pub tools: Value,
    /// What `tool_choice` asks.
    pub choice: Choice,
    /// `parallel_tool_calls`: more than one call may come.
    pub parallel: bool,
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`; `None` without tools or with
/// `tool_choice` `"none"`.
pub fn tool_set(f: &Fields) -> Result<Option<ToolSet>, ApiError> {
    let functions = match f.get("tools") {
        None => Vec::new(),
        Some(Value::Array(tools)) => tools
            .iter()
            .enumerate()
            .map(|(i, tool)| function(i, tool))
            .collect::<Result<Vec<_>, _>>()?,
        Some(v) => return Err(Fields::wrong("tools", "an array", v)),
    };
    for (i, later) in functions.iter().enumerate() {
        if functions[..i].iter().any(|g| g.name == later.name) {
            let at = format!("tools[{i}].function.name");
            return Err(ApiError::invalid(
                &at,
                format!(
                    "{at}: `{}` names another function too; names must be unique",
                    later.name
                ),
            ));
        }
    }
    let allowed = "allowed: \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}";
    let choice = match f.get("tool_choice") {
        None => (!functions.is_empty()).then_some(Choice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "none" => None,
            "auto" => Some(Choice::Auto),
            "required" => Some(Choice::Required),
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice: {allowed}, got \"{other}\""),
                ))
            }
        },
        Some(Value::Object(o)) => match o.get("function").and_then(|g| g.get("name")) {
            Some(Value::String(name))
                if o.get("type").and_then(Value::as_str) == Some("function") =>
            {
                Some(Choice::Function(name.clone()))
            }
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice: {allowed}"),
                ))
            }
        },
        Some(v) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice: {allowed}, got {}", kind(v)),
            ))
        }
    };
    let parallel = match f.get("parallel_tool_calls") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(Fields::wrong("parallel_tool_calls", "a boolean", v)),
    };
    let Some(choice) = choice else {
        return Ok(None);
    };
    if functions.is_empty() {
        return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice: needs tools; give at least one function in tools",
        ));
    }
    if let Choice::Function(name) = &choice {
        if !functions.iter().any(|g| &g.name == name) {
            let names: Vec<&str> = functions.iter().map(|g| g.name.as_str()).collect();
            return Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "tool_choice: `{name}` is not in tools; allowed: {}",
                    names.join(", ")
                ),
            ));
        }
    }
    if choice == Choice::Auto {
        // nothing holds a free reply to them
        if !parallel {
            return Err(ApiError::invalid(
                "parallel_tool_calls",
                "parallel_tool_calls: false needs tool_choice \"required\" or a named function (which hold the reply to one call); with \"auto\" leave it out",
            ));
        }
        if let Some(i) = f.get("tools").and_then(Value::as_array).and_then(|tools| {
            tools
                .iter()
                .position(|t| t["function"]["strict"].as_bool() == Some(true))
        }) {
            let at = format!("tools[{i}].function.strict");
            return Err(ApiError::invalid(
                &at,
                format!("{at}: true needs tool_choice \"required\" or a named function (which hold the arguments to the schema); with \"auto\" the reply is free"),
            ));
        }
    }
    Ok(Some(ToolSet {
        functions,
        tools: f.get("tools").cloned().unwrap_or(Value::Null),
        choice,
        parallel,
    }))
}

/// `tools[i]`: `{"type": "function", "function": {"name", "description", "parameters",
/// "strict"}}`.
fn function(i: usize, tool: &Value) -> Result<Function, ApiError> {
    let path = format!("tools[{i}]");
    let Value::Object(tool) = tool else {
        return Err(Fields::wrong(&path, "an object", tool));
    };
    if tool.get("type").and_then(Value::as_str) != Some("function") {
        let at = format!("{path}.type");
        return Err(ApiError::invalid(
            &at,
            format!("{at}: allowed: \"function\""),
        ));
    }
    let at = format!("{path}.function");
    let Some(Value::Object(f)) = tool.get("function") else {
        return Err(ApiError::invalid(
            &at,
            format!("{at}: an object {{\"name\", \"description\", \"parameters\"}} is required"),
        ));
    };
    let field = |name: &str| f.get(name).filter(|v| !v.is_null());
    let name = match field("name") {
        Some(Value::String(n))
            if (1..=64).contains(&n.len())
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
        {
            n.clone()
        }
        other => {
            let at = format!("{at}.name");
            return Err(ApiError::invalid(
                &at,
                format!(
                    "{at}: allowed: 1 to 64 letters, digits, _ or -, got {}",
                    other.map_or("nothing".into(), Value::to_string)
                ),
            ));
        }
    };
    let description = match field("description") {
        None => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(v) => return Err(Fields::wrong(&format!("{at}.description"), "a string", v)),
    };
    let parameters = match field("parameters") {
        None => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(v) => {
            return Err(Fields::wrong(
                &format!("{at}.parameters"),
                "an object (a JSON schema)",
                v,
            ))
        }
    };
    if let Some(v) = field("strict").filter(|v| !v.is_boolean()) {
        return Err(Fields::wrong(&format!("{at}.strict"), "a boolean", v));
    }
    Ok(Function {
        name,
        description,
        parameters,
    })
}

impl ToolSet {
    /// The grammar of the reply `tool_choice` asks for, in `form`; `None` for `"auto"`.
    pub fn grammar(&self, form: Form) -> Option<TopLevelGrammar> {
        let (functions, one): (Vec<&Function>, bool) = match &self.choice {
            Choice::Auto => return None,
            Choice::Required => (self.functions.iter().collect(), !self.parallel),
            Choice::Function(name) => (
                self.functions.iter().filter(|f| &f.name == name).collect(),
                true,
            ),
        };
        let calls: Vec<Value> = functions
            .iter()
            .map(|f| {
                json!({"type": "object", "properties": {"name": {"const": f.name},
                    "arguments": closed(&f.parameters)}, "required": ["name", "arguments"],
                    "additionalProperties": false})
            })
            .collect();
        // one space after `,` and `:`, no other: no room for a small model to ramble in
        let compact = json!({"whitespace_flexible": false, "item_separator": ", ",
            "key_separator": ": "});
        let call = json!({"anyOf": calls, "x-guidance": compact});
        Some(match form {
            Form::Json => {
                let mut list = json!({"type": "array", "items": call, "minItems": 1});
                if one {
                    list["maxItems"] = json!(1);
                }
                TopLevelGrammar::from_json_schema(json!({"type": "object",
                    "properties": {"tool_calls": list}, "required": ["tool_calls"],
                    "additionalProperties": false, "x-guidance": compact}))
            }
            Form::Tagged => {
                let start = if one {
                    "start: call"
                } else {
                    "start: call (\"\\n\" call)*"
                };
                TopLevelGrammar::from_lark(format!(
                    "{start}\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\"\nbody: %json {call}\n"
                ))
            }
        })
    }
}

/// `schema` with each object schema that names its properties and says nothing of others
/// closed to them (`additionalProperties: false`), through properties, items, `anyOf`,
/// `oneOf` and definitions (not `allOf`, whose parts add up), as llama.cpp's grammars of
/// JSON schemas do: a call's arguments hold the parameters the function names.
fn closed(schema: &Value) -> Value {
    let Value::Object(map) = schema else {
        return schema.clone();
    };
    let each = |v: &Value, f: &dyn Fn(&Value) -> Value| match v {
        Value::Object(m) => Value::Object(m.iter().map(|(k, s)| (k.clone(), f(s))).collect()),
        Value::Array(a) => Value::Array(a.iter().map(f).collect()),
        other => other.clone(),
    };
    let mut out: Map<String, Value> = map
        .iter()
        .map(|(k, v)| {
            let v = match k.as_str() {
                "properties" | "$defs" | "definitions" | "anyOf" | "oneOf" | "prefixItems" => {
                    each(v, &closed)
                }
                "items" => closed(v),
                _ => v.clone(),
            };
            (k.clone(), v)
        })
        .collect();
    if out.contains_key("properties") && !out.contains_key("additionalProperties") {
        out.insert("additionalProperties".into(), json!(false));
    }
    Value::Object(out)
}

/// The prompt of a chat: `messages` rendered with `template`, which shows `tools` (when
/// given) in `style`.
pub fn render(
    template: &ChatTemplate,
    style: ToolStyle,
    messages: &[ChatMessage],
    tools: Option<&ToolSet>,
) -> anyhow::Result<String> {
    match style {
        ToolStyle::Tagged | ToolStyle::Foreign => {
            let values: Vec<Value> = messages.iter().map(openai).collect();
            template.render_json(&values, tools.map(|t| &t.tools), true)
        }
        ToolStyle::Convention => {
            let mut values: Vec<Value> =
                messages.iter().map(|m| conventional(m, messages)).collect();
            if let Some(tools) = tools {
                let prompt = convention(tools);
                match values.first_mut() {
                    Some(first) if first["role"] == "system" => {
                        let text = first["content"].as_str().unwrap_or_default();
                        first["content"] = json!(format!("{text}\n\n{prompt}"));
                    }
                    _ => values.insert(0, json!({"role": "system", "content": prompt})),
                }
            }
            template.render_json(&values, None, true)
        }
    }
}

/// A message as OpenAI writes it, each call's arguments an object (as templates read them).
fn openai(m: &ChatMessage) -> Value {
    let mut v = Map::new();
    v.insert("role".into(), json!(m.role));
    v.insert("content".into(), json!(m.content));
    if !m.tool_calls.is_empty() {
        v.insert("tool_calls".into(), calls_json(m, true));
    }
    if let Some(id) = &m.tool_call_id {
        v.insert("tool_call_id".into(), json!(id));
    }
    Value::Object(v)
}

/// `m`'s calls, each `arguments` an object (parsed when the request was read): OpenAI's
/// `{"id", "type", "function": {"name", "arguments"}}`, or the convention's
/// `{"name", "arguments"}`.
fn calls_json(m: &ChatMessage, openai: bool) -> Value {
    m.tool_calls
        .iter()
        .map(|c| {
            let arguments: Value = serde_json::from_str(&c.arguments).unwrap_or(Value::Null);
            if openai {
                json!({"id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": arguments}})
            } else {
                json!({"name": c.name, "arguments": arguments})
            }
        })
        .collect()
}

/// A message in the server's convention: an assistant's calls as the JSON it asks for, a
/// tool's result as a user turn naming the call.
fn conventional(m: &ChatMessage, all: &[ChatMessage]) -> Value {
    let text = m.content.as_deref().unwrap_or_default();
    if !m.tool_calls.is_empty() {
        let calls = json!({"tool_calls": calls_json(m, false)}).to_string();
        let content = if text.is_empty() {
            calls
        } else {
            format!("{text}\n{calls}")
        };
        return json!({"role": m.role, "content": content});
    }
    match &m.tool_call_id {
        Some(id) if m.role == "tool" => {
            let name = all
                .iter()
                .flat_map(|o| &o.tool_calls)
                .find(|c| &c.id == id)
                .map_or("function", |c| c.name.as_str());
            json!({"role": "user",
                "content": format!("The function {name} returned (call {id}):\n{text}")})
        }
        _ => json!({"role": m.role, "content": text}),
    }
}

/// The system prompt of the server's convention.
fn convention(tools: &ToolSet) -> String {
    let mut prompt = String::from(
        "You can call functions. Each one is given as a JSON object with its name, what it does and its parameters (a JSON schema):\n",
    );
    for f in &tools.functions {
        let line =
            json!({"name": f.name, "description": f.description, "parameters": f.parameters});
        prompt.push_str(&line.to_string());
        prompt.push('\n');
    }
    let form =
        "{\"tool_calls\": [{\"name\": \"<function name>\", \"arguments\": {<its arguments>}}]}";
    let ask = match &tools.choice {
        Choice::Auto => format!("To call functions, reply with only a JSON object of this form and nothing else:\n{form}\nTo answer without calling a function, reply in plain text."),
        Choice::Required => format!("Reply by calling functions, with only a JSON object of this form and nothing else:\n{form}"),
        Choice::Function(name) => format!("Reply by calling the function {name}, with only a JSON object of this form and nothing else:\n{form}"),
    };
    prompt.push_str(&ask);
    prompt
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;

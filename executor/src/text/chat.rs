//! Chat templates: turns a conversation into the prompt text the model was trained on.
//!
//! Models ship a Jinja template (`tokenizer.chat_template`) written for Hugging Face's
//! `apply_chat_template`. We render it with minijinja configured the way Hugging Face
//! configures Jinja (`trim_blocks`, `lstrip_blocks`, Python string methods, `tojson`,
//! `raise_exception`) and pass the variables such templates read: `messages`, `tools`,
//! `add_generation_prompt`, `bos_token`, `eos_token`.

use anyhow::{anyhow, Context, Result};
use minijinja::syntax::SyntaxConfig;
use minijinja::{context, Environment, Error, ErrorKind, Value};

/// The template name inside the environment.
const NAME: &str = "chat";

/// ChatML, the format of SmolLM2, Qwen and others; used only when a caller asks for it.
const CHATML: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant` (templates may accept others).
    pub role: String,
    /// The text of the turn.
    pub content: String,
}

impl Message {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template together with the special-token texts it may reference.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles a Jinja chat template; `bos_token`/`eos_token` are the texts of those tokens.
    pub fn new(
        source: &str,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| anyhow!("configuring the template syntax: {e}"))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| anyhow!("compiling the chat template: {e}"))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// The ChatML template, for models without their own when the user asks for ChatML.
    pub fn chatml() -> ChatTemplate {
        ChatTemplate::new(CHATML, "", "<|im_end|>")
            .expect("invariant: the ChatML template compiles")
    }

    /// Renders a conversation; with `add_generation_prompt` the text ends where the
    /// assistant's reply begins.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| context! { role => m.role.as_str(), content => m.content.as_str() })
            .collect();
        self.render_values(messages, Value::UNDEFINED, add_generation_prompt)
    }

    /// Renders a conversation given as OpenAI's message objects (`tool_calls`,
    /// `tool_call_id` and the like included) with `tools` (OpenAI's tool objects, or none),
    /// as Hugging Face's `apply_chat_template(messages, tools=...)` does.
    pub fn render_json(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let messages = messages.iter().map(jinja).collect();
        let tools = tools.map_or(Value::UNDEFINED, jinja);
        self.render_values(messages, tools, add_generation_prompt)
    }

    fn render_values(
        &self,
        messages: Vec<Value>,
        tools: Value,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self
            .env
            .get_template(NAME)
            .context("invariant: the chat template was added at construction")?;
        template
            .render(context! {
                messages,
                tools,
                add_generation_prompt,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
            })
            .map_err(|e| anyhow!("rendering the chat template: {e}"))
    }
}

/// A JSON value as the template's value (an object's keys in their order).
fn jinja(value: &serde_json::Value) -> Value {
    use serde_json::Value as Json;
    match value {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => n
            .as_i64()
            .map(Value::from)
            .or_else(|| n.as_u64().map(Value::from))
            .unwrap_or_else(|| Value::from(n.as_f64().unwrap_or(f64::NAN))),
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(items.iter().map(jinja).collect::<Vec<_>>()),
        Json::Object(map) => Value::from_pairs(map.iter().map(|(k, v)| (k.as_str(), jinja(v)))),
    }
}

/// `raise_exception(msg)`, which Hugging Face templates call to reject a conversation.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_single_and_multi_turn() {
        let t = ChatTemplate::chatml();
        let one = [Message::new("user", "Hi")];
        assert_eq!(
            t.render(&one, true).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let three = [
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello!"),
            Message::new("user", "Bye"),
        ];
        assert_eq!(
            t.render(&three, false).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        );
    }

    #[test]
    fn hugging_face_conventions() {
        // lstrip/trim blocks, python methods, bos_token and raise_exception as in HF templates
        let src = "{{ bos_token }}\n  {% for m in messages %}\n{% if m.role not in ['user'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}\n{{ m.content.strip() | upper }}{{ eos_token }}\n  {% endfor %}\n";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let text = t.render(&[Message::new("user", "  hi  ")], false).unwrap();
        assert_eq!(text, "<s>\nHI</s>\n");
        let err = t
            .render(&[Message::new("tool", "x")], false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("bad role tool"), "{err}");
    }

    #[test]
    fn syntax_error_is_reported() {
        let err = ChatTemplate::new("{% for %}", "", "")
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("compiling the chat template: "), "{err}");
    }
}

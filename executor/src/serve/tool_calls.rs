//! A reply's tool calls, taken out of its text: while it streams, the text that may open a
//! call is held back (a `{` opening a reply in the server's convention, a `<tool_call>` tag
//! anywhere); at its end the held text is parsed into calls of the request's functions, or,
//! when it holds none, sent as text after all.

use serde_json::Value;

use super::messages::ToolCall;
use super::tools::Form;

/// The tags around a call: `<tool_call>` and `</tool_call>`.
const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// One choice's text as it comes, split into what may be sent and what may be a call.
pub struct Holdback {
    form: Form,
    /// The names calls may have.
    names: Vec<String>,
    text: String,
    /// Bytes of `text` sent (released) so far.
    sent: usize,
    /// Where a call's opening was found: everything from it is held to the end.
    opened: Option<usize>,
}

impl Holdback {
    /// A reply whose calls are written in `form` and name one of `names`.
    pub fn new(form: Form, names: Vec<String>) -> Holdback {
        Holdback {
            form,
            names,
            text: String::new(),
            sent: 0,
            opened: None,
        }
    }

    /// Takes the reply's next piece; returns the text that cannot be part of a call.
    pub fn push(&mut self, piece: &str) -> String {
        self.text.push_str(piece);
        if self.opened.is_some() {
            return String::new();
        }
        let until = match self.form {
            Form::Json => {
                let start = self.text.len() - self.text.trim_start().len();
                match self.text[start..].chars().next() {
                    // only blanks so far: the reply may yet open with `{`
                    None => 0,
                    Some('{') if self.sent == 0 => {
                        self.opened = Some(0);
                        0
                    }
                    Some(_) => self.text.len(),
                }
            }
            Form::Tagged => match self.text[self.sent..].find(OPEN) {
                Some(at) => {
                    self.opened = Some(self.sent + at);
                    self.sent + at
                }
                // a tail that may be the tag's start waits for the next piece
                None => self.text.len() - partial_tag(&self.text[self.sent..]),
            },
        };
        let out = self.text[self.sent..until].to_owned();
        self.sent = until;
        out
    }

    /// The reply's end: the calls (call `k`'s id `id(k)`), and the text not sent yet (all
    /// the held text when it holds no call).
    pub fn finish(self, id: impl Fn(usize) -> String) -> (Vec<ToolCall>, String) {
        let held = &self.text[self.sent..];
        let calls = self.opened.and_then(|_| match self.form {
            Form::Json => json_calls(held),
            Form::Tagged => tagged_calls(held),
        });
        match calls {
            Some((mut calls, rest)) if calls.iter().all(|c| self.names.contains(&c.name)) => {
                for (k, call) in calls.iter_mut().enumerate() {
                    call.id = id(k);
                }
                (calls, rest)
            }
            _ => (Vec::new(), held.to_owned()),
        }
    }
}

/// The length of the longest end of `text` that begins `<tool_call>`.
fn partial_tag(text: &str) -> usize {
    (1..OPEN.len())
        .rev()
        .find(|&n| text.ends_with(&OPEN[..n]))
        .unwrap_or(0)
}

/// `{"name", "arguments"}` as a call (its id left to `finish`), `arguments` an object.
fn call(value: &Value) -> Option<ToolCall> {
    let name = value.get("name")?.as_str()?;
    let arguments = value.get("arguments").filter(|a| a.is_object())?;
    Some(ToolCall {
        id: String::new(),
        name: name.to_owned(),
        arguments: arguments.to_string(),
    })
}

/// The server's convention: the whole reply `{"tool_calls": [...]}`, nothing else.
fn json_calls(held: &str) -> Option<(Vec<ToolCall>, String)> {
    let value: Value = serde_json::from_str(held.trim()).ok()?;
    let calls = value.get("tool_calls")?.as_array()?;
    let calls: Option<Vec<ToolCall>> = calls.iter().map(call).collect();
    calls.filter(|c| !c.is_empty()).map(|c| (c, String::new()))
}

/// `<tool_call>{...}</tool_call>` blocks; the text between and after them is the rest.
fn tagged_calls(mut held: &str) -> Option<(Vec<ToolCall>, String)> {
    let mut calls = Vec::new();
    let mut rest = String::new();
    while let Some(at) = held.find(OPEN) {
        rest.push_str(&held[..at]);
        let body = &held[at + OPEN.len()..];
        let end = body.find(CLOSE)?;
        calls.push(call(&serde_json::from_str(body[..end].trim()).ok()?)?);
        held = &body[end + CLOSE.len()..];
    }
    rest.push_str(held);
    let rest = rest.trim().to_owned();
    (!calls.is_empty()).then_some((calls, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["get_weather".into()]
    }

    /// The text sent while `pieces` come, then the calls and the rest at the end.
    fn run(form: Form, pieces: &[&str]) -> (String, Vec<ToolCall>, String) {
        let mut h = Holdback::new(form, names());
        let sent: String = pieces.iter().map(|p| h.push(p)).collect();
        let (calls, rest) = h.finish(|k| format!("c{k}"));
        (sent, calls, rest)
    }

    fn weather(k: usize, city: &str) -> ToolCall {
        ToolCall {
            id: format!("c{k}"),
            name: "get_weather".into(),
            arguments: format!("{{\"city\":\"{city}\"}}"),
        }
    }

    #[test]
    fn a_json_reply_of_calls_is_held_and_parsed() {
        let pieces = [
            " ",
            "{\"tool_calls\": [{\"name\": \"get_weather\", ",
            "\"arguments\": {\"city\": \"Paris\"}}]}",
        ];
        assert_eq!(
            run(Form::Json, &pieces),
            (String::new(), vec![weather(0, "Paris")], String::new())
        );
    }

    #[test]
    fn a_text_reply_streams_and_a_json_answer_that_calls_nothing_comes_at_the_end() {
        assert_eq!(
            run(Form::Json, &["Paris ", "is {big}"]),
            ("Paris is {big}".into(), Vec::new(), String::new())
        );
        let answer = "{\"city\": \"Paris\"}";
        assert_eq!(
            run(Form::Json, &[answer]),
            (String::new(), Vec::new(), answer.into())
        );
        // a call of a function the request does not have is text
        let other = "{\"tool_calls\": [{\"name\": \"launch\", \"arguments\": {}}]}";
        assert_eq!(
            run(Form::Json, &[other]),
            (String::new(), Vec::new(), other.into())
        );
    }

    #[test]
    fn tagged_calls_are_held_from_their_tag_split_across_pieces() {
        let call = |city: &str| {
            format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\"}}}}\n</tool_call>")
        };
        let both = format!("{}\n{}", call("Paris"), call("Rome"));
        let (head, tail) = both.split_at("<tool".len());
        assert_eq!(
            run(Form::Tagged, &["Let me look. ", head, tail]),
            (
                "Let me look. ".into(),
                vec![weather(0, "Paris"), weather(1, "Rome")],
                String::new()
            )
        );
        // a tag that never closes is text after all
        let open = "<tool_call>\n{\"name\": \"get_weather\"";
        assert_eq!(
            run(Form::Tagged, &["a ", open]),
            ("a ".into(), Vec::new(), open.into())
        );
        // `<` that opens no tag goes out
        assert_eq!(
            run(Form::Tagged, &["1 <", " 2"]),
            ("1 < 2".into(), Vec::new(), String::new())
        );
    }
}

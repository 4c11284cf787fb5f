//! The fields of OpenAI's API and of other servers' extensions that this server does not
//! implement: each is refused, naming it, unless it holds the value that leaving it out means.

use serde_json::{Map, Value};

use super::api::{kind, Fields};
use super::error::ApiError;

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
    Unimplemented {
        name: "logit_bias",
        neutral: |v| v.as_object().is_some_and(Map::is_empty),
        allowed: "{}",
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
    // vLLM's and llama-server's extensions
    Unimplemented {
        name: "min_tokens",
        neutral: |v| v.as_u64() == Some(0),
        allowed: "0",
    },
    Unimplemented {
        name: "ignore_eos",
        neutral: |v| v == &Value::Bool(false),
        allowed: "false",
    },
    Unimplemented {
        name: "typical_p",
        neutral: |v| v.as_f64() == Some(1.0),
        allowed: "1",
    },
    Unimplemented {
        name: "mirostat",
        neutral: |v| v.as_u64() == Some(0),
        allowed: "0",
    },
    Unimplemented {
        name: "use_beam_search",
        neutral: |v| v == &Value::Bool(false),
        allowed: "false",
    },
    Unimplemented {
        name: "prompt_logprobs",
        neutral: |v| v.as_u64() == Some(0),
        allowed: "0",
    },
    Unimplemented {
        name: "grammar",
        neutral: |v| v.as_str() == Some(""),
        allowed: "\"\"",
    },
    Unimplemented {
        name: "json_schema",
        neutral: |v| v.as_object().is_some_and(Map::is_empty),
        allowed: "{}",
    },
    Unimplemented {
        name: "guided_json",
        neutral: |_| false,
        allowed: "nothing",
    },
    Unimplemented {
        name: "guided_regex",
        neutral: |_| false,
        allowed: "nothing",
    },
    Unimplemented {
        name: "guided_choice",
        neutral: |_| false,
        allowed: "nothing",
    },
    Unimplemented {
        name: "guided_grammar",
        neutral: |_| false,
        allowed: "nothing",
    },
];

/// Refuses the first unimplemented field given a value that would change the answer.
pub(super) fn refuse_unimplemented(f: &Fields) -> Result<(), ApiError> {
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

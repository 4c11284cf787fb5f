//! The fields of OpenAI's API and of other servers' extensions that this server does not
//! implement: each is refused, naming it, unless it holds the value that leaving it out means.

use serde_json::Value;

use super::api::{kind, Fields};
use super::error::ApiError;

/// Every field that would change the answer and that this server does not implement, with the
/// value (in JSON) that means what leaving it out means, or none where every value would.
const UNIMPLEMENTED: &[(&str, Option<&str>)] = &[
    ("echo", Some("false")),
    ("suffix", Some("\"\"")),
    ("best_of", Some("1")),
    ("logit_bias", Some("{}")),
    ("functions", Some("[]")),
    // vLLM's and llama-server's extensions
    ("min_tokens", Some("0")),
    ("ignore_eos", Some("false")),
    ("typical_p", Some("1")),
    ("mirostat", Some("0")),
    ("use_beam_search", Some("false")),
    ("prompt_logprobs", Some("0")),
    ("grammar", Some("\"\"")),
    ("json_schema", Some("{}")),
    ("guided_json", None),
    ("guided_regex", None),
    ("guided_choice", None),
    ("guided_grammar", None),
];

/// Refuses the first unimplemented field given a value that would change the answer.
pub(super) fn refuse_unimplemented(f: &Fields) -> Result<(), ApiError> {
    for &(name, neutral) in UNIMPLEMENTED {
        match f.get(name) {
            Some(v) if !neutral.is_some_and(|n| is_neutral(v, n)) => {
                let got = match v {
                    Value::Array(_) | Value::Object(_) => kind(v).to_string(),
                    scalar => scalar.to_string(),
                };
                return Err(ApiError::invalid(
                    name,
                    format!(
                        "{name}: not supported by this server; allowed: {} (or leave it out), got {got}",
                        neutral.unwrap_or("nothing")
                    ),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether `v` is the neutral value written `neutral` (numbers compared as numbers: 1 and 1.0
/// are one value).
fn is_neutral(v: &Value, neutral: &str) -> bool {
    let n: Value = serde_json::from_str(neutral).expect("invariant: the table's values are JSON");
    match (v.as_f64(), n.as_f64()) {
        (Some(a), Some(b)) => a == b,
        _ => v == &n,
    }
}

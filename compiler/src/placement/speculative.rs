//! Validation of `[speculative]`: the draft source, and the drafted tokens per verify step,
//! which must fit one step of the plan's `runtime.prefill_chunk` rows with the token before
//! them. Placements and plans are checked with the same rules (`speculative_errors`).

use super::validate::int_in;
use super::RawSpeculative;
use crate::diag::Collector;
use crate::plan::{Draft, Speculative};
use toml::Spanned;

/// Most drafted tokens per verify step: past it a verify step costs more than the tokens it
/// may win (acceptance falls off long before).
pub(crate) const MAX_DRAFT_TOKENS: i64 = 16;
/// Drafted tokens per verify step when the placement names none.
const DEFAULT_DRAFT_TOKENS: u32 = 3;

/// The validated section; `None` after an error (recorded in `c`).
pub(super) fn validate(
    raw: &Spanned<RawSpeculative>,
    prefill_chunk: u32,
    c: &mut Collector,
) -> Option<Speculative> {
    let sp = raw.get_ref();
    let draft = match &sp.draft {
        None => {
            c.error(
                raw.span(),
                "speculative.draft",
                "missing the draft source; allowed: draft = \"lookup\" or \"nextn\"",
            );
            None
        }
        Some(d) => {
            let found = Draft::ALL.into_iter().find(|x| x.name() == d.get_ref());
            if found.is_none() {
                let allowed: Vec<&str> = Draft::ALL.iter().map(|x| x.name()).collect();
                let message = format!(
                    "unknown draft `{}`; allowed: {}",
                    d.get_ref(),
                    allowed.join(", ")
                );
                c.error(d.span(), "speculative.draft", message);
            }
            found
        }
    };
    let tokens = match &sp.tokens {
        None => Some(DEFAULT_DRAFT_TOKENS),
        Some(t) => int_in(c, t, "speculative.tokens", 1, MAX_DRAFT_TOKENS),
    };
    let speculative = Speculative {
        draft: draft?,
        tokens: tokens?,
    };
    let errors = speculative_errors(speculative, prefill_chunk);
    for (field, message) in &errors {
        let span = match *field {
            "speculative.draft" => sp.draft.as_ref().map(|d| d.span()),
            "speculative.tokens" => sp.tokens.as_ref().map(|t| t.span()),
            _ => None,
        };
        c.error(span.unwrap_or(raw.span()), field, message);
    }
    errors.is_empty().then_some(speculative)
}

/// Why `sp` cannot run with prefill steps of `prefill_chunk` rows (empty when it
/// can), each with the field it concerns: the NextN draft is not built, and a verify step of
/// `tokens + 1` rows must fit a step.
pub(crate) fn speculative_errors(
    sp: Speculative,
    prefill_chunk: u32,
) -> Vec<(&'static str, String)> {
    let mut errors = Vec::new();
    if sp.draft == Draft::Nextn {
        errors.push(("speculative.draft", "draft `nextn` is not built yet: the compiler does not place the model's NextN (MTP) block (its layers, KV cache and memory) and no engine runs it; allowed: lookup".to_string()));
    }
    let k = sp.tokens;
    if !(1..=MAX_DRAFT_TOKENS).contains(&i64::from(k)) {
        errors.push((
            "speculative.tokens",
            format!("{k} is out of range; allowed: 1..={MAX_DRAFT_TOKENS}"),
        ));
    } else if k >= prefill_chunk {
        errors.push(("speculative.tokens", format!(
            "a verify step of {k} drafts takes {} rows, more than the {prefill_chunk} of runtime.prefill_chunk; allowed: 1..={}, or a larger runtime.prefill_chunk",
            k + 1,
            prefill_chunk.saturating_sub(1)
        )));
    }
    errors
}

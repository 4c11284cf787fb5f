//! `memra-run generate` and `memra-run chat`: tokenize, decode through a session, and stream
//! the text of each generated token to stdout as soon as it is whole UTF-8.
//!
//! With one process per device every process runs the same session (the tokens come from
//! the readback process, so end-of-generation stops them all at the same step); only the
//! readback process prints, and in an interactive chat it reads stdin and hands each line
//! to the others.

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};

use super::{start, Loaded, RunArgs, Sampling};
use crate::dist::ProcessMap;
use crate::session::Flow;
use crate::text::{ChatTemplate, Message, Tokenizer};

/// Streams generated tokens as text (when `prints`); stops at the end-of-generation token.
fn stream(tokenizer: &Tokenizer, prints: bool) -> impl FnMut(u32) -> Result<Flow> + '_ {
    let mut decoder = tokenizer.stream_decoder();
    move |token| {
        if tokenizer.is_eog(token) {
            return Ok(Flow::Stop);
        }
        if !prints {
            return Ok(Flow::Continue);
        }
        if let Some(text) = decoder.push(token)? {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .context("writing to stdout")?;
            out.flush().context("writing to stdout")?;
        }
        Ok(Flow::Continue)
    }
}

/// Says on stderr when the context, not `n` or an end-of-generation token, ended `generated`
/// (the continuation of `decoded` tokens in the caches before it).
fn notice_context_end(loaded: &Loaded, decoded: usize, generated: &[u32], n: usize) {
    let max = loaded.session.max_context();
    let ended_by_context = generated.len() < n
        && decoded + generated.len() > max
        && !generated
            .last()
            .is_some_and(|&t| loaded.tokenizer.is_eog(t));
    if ended_by_context && loaded.prints {
        eprintln!(
            "notice: stopped after {} tokens: the plan's runtime.max_context of {max} positions is full",
            generated.len()
        );
    }
}

/// Says on stderr what speculative decoding did so far, in a session that speculates.
fn notice_speculation(loaded: &Loaded) {
    let (Some(t), Some(sp)) = (loaded.session.tally(), loaded.plan.plan.speculative) else {
        return;
    };
    if loaded.prints {
        eprintln!(
            "speculative: {} verify steps of up to {} {} drafts: {} drafted, {} accepted, acceptance length {:.2}",
            t.steps,
            sp.tokens,
            sp.draft.name(),
            t.drafted,
            t.accepted,
            t.acceptance_length()
        );
    }
}

/// `generate`: the continuation of `prompt`.
pub fn generate(
    plan: &Path,
    prompt: &str,
    n: usize,
    sampling: Sampling,
    run: &RunArgs,
) -> Result<ExitCode> {
    let mut loaded = start(plan, run, sampling)?;
    let ids = loaded.tokenizer.encode(prompt, true)?;
    let started = Instant::now();
    let mut first: Option<Instant> = None;
    let mut on_token = stream(&loaded.tokenizer, loaded.prints);
    let generated = loaded.session.continue_with(&ids, n, |out, generates| {
        if !generates {
            return Ok(Flow::Continue);
        }
        first.get_or_insert_with(Instant::now);
        on_token(out.token)
    })?;
    if !loaded.prints {
        return Ok(ExitCode::SUCCESS);
    }
    println!();
    notice_context_end(&loaded, ids.len(), &generated, n);
    notice_speculation(&loaded);
    let end = Instant::now();
    let prompt_s = first.map_or(0.0, |f| (f - started).as_secs_f64());
    let gen_s = first.map_or(0.0, |f| (end - f).as_secs_f64());
    eprintln!(
        "prompt: {} tokens in {:.2} s; generated {} tokens, {:.1} tok/s after the first",
        ids.len(),
        prompt_s,
        generated.len(),
        (generated.len().saturating_sub(1)) as f64 / gen_s.max(1e-9)
    );
    Ok(ExitCode::SUCCESS)
}

/// `chat`: one turn for `prompt`, or turns from stdin until an empty line or end of input.
pub fn chat(
    plan: &Path,
    prompt: Option<&str>,
    system: Option<&str>,
    n: usize,
    sampling: Sampling,
    run: &RunArgs,
) -> Result<ExitCode> {
    let mut loaded = start(plan, run, sampling)?;
    let template = ChatTemplate::from_gguf(loaded.plan.gguf()?, &loaded.tokenizer)?;
    let mut messages: Vec<Message> = system
        .map(|s| Message::new("system", s))
        .into_iter()
        .collect();
    let mut lines = std::io::stdin().lock().lines();
    let mut read_line = || -> Result<Option<String>> {
        if loaded.prints {
            eprint!("> ");
        }
        let line = if loaded.prints {
            lines.next().transpose().context("reading stdin")?
        } else {
            None
        };
        let Some(world) = run.world else {
            return Ok(line);
        };
        // One byte says whether a line follows, so that an empty line and the end differ.
        let root = ProcessMap::of(&loaded.plan.plan).reader().unwrap_or(0);
        let mine = loaded.prints.then(|| match &line {
            Some(l) => [&[1u8][..], l.as_bytes()].concat(),
            None => vec![0],
        });
        let shared = world.share(root, mine)?;
        Ok(match shared.split_first() {
            Some((1, text)) => Some(String::from_utf8_lossy(text).into_owned()),
            _ => None,
        })
    };
    loop {
        let user = match prompt {
            Some(p) => p.to_string(),
            None => match read_line()? {
                Some(line) => line,
                None => break,
            },
        };
        if user.trim().is_empty() {
            break;
        }
        messages.push(Message::new("user", user));
        let text = template.render(&messages, true)?;
        let ids = loaded.tokenizer.encode(&text, false)?;
        let mut on_token = stream(&loaded.tokenizer, loaded.prints);
        let decoded_before = ids.len();
        let reply = loaded.session.continue_with(&ids, n, |out, generates| {
            if generates {
                on_token(out.token)
            } else {
                Ok(Flow::Continue)
            }
        })?;
        if loaded.prints {
            println!();
        }
        notice_context_end(&loaded, decoded_before, &reply, n);
        notice_speculation(&loaded);
        let words: Vec<u32> = reply
            .into_iter()
            .filter(|&t| !loaded.tokenizer.is_eog(t))
            .collect();
        messages.push(Message::new("assistant", loaded.tokenizer.decode(&words)?));
        if prompt.is_some() {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}

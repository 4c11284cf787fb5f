//! `memra-run serve`: an OpenAI-compatible HTTP server over one engine.
//!
//! Threads: tokio's workers run the HTTP side (`routes`: parse and validate with `api`,
//! `messages`, `tools` and `refused`, tokenize; `answer` answers or streams in `response`'s
//! shapes, taking tool calls out of the text with `tool_calls`); one engine thread
//! (`scheduler`) owns the engine's batch and decodes up to `runtime.max_sequences` jobs
//! together (continuous batching), checking each job's cancellation flag between steps;
//! `sequence` is one job's sampler, penalties, `response_format` grammar (`grammar`),
//! `logprobs` and text while it decodes.
//! `metrics` is shared by both; `tally` logs and counts each request; `shutdown` takes
//! SIGINT and SIGTERM and drains both sides. Before any route, `conn` caps the open
//! connections and times them out, and `access` checks the Host, the Origin and the API key.

mod access;
mod answer;
mod api;
mod conn;
mod error;
mod grammar;
mod logprobs;
mod messages;
mod metrics;
mod refused;
mod response;
mod routes;
mod scheduler;
mod sequence;
mod shutdown;
mod stop;
mod tally;
mod tool_calls;
mod tools;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

use crate::batch::{window, Batch};
use crate::engine::{open, EngineOptions};
use crate::plan_load::LoadedPlan;
use crate::text::{ChatTemplate, Tokenizer};
use access::{guard, Access};
use conn::{track, BodyRules, Conn, Guarded};
use grammar::Grammars;
use metrics::Metrics;
use routes::{router, App};
use scheduler::{Drafting, Scheduler};
use shutdown::{run_down, watch_signals, Drain};
use tools::ToolStyle;

/// Where the server listens, and how many requests may wait for the engine.
pub struct ServerOptions {
    /// Host name or address.
    pub host: String,
    /// TCP port; 0 picks a free one (the address is printed).
    pub port: u16,
    /// Most requests waiting for a sequence slot; past it a request gets a 503.
    pub max_queue: usize,
    /// How long decoding requests may go on after SIGINT or SIGTERM before they are cut.
    pub shutdown_grace: Duration,
    /// The key every `/v1/` request must bear (`Authorization: Bearer KEY`), if any.
    pub api_key: Option<String>,
    /// Web origins whose pages may call the server (CORS); `*` allows all.
    pub allowed_origins: Vec<String>,
    /// A connection without progress this long, while no request of it is in flight, is
    /// closed; a request's body must come whole within it.
    pub timeout: Duration,
    /// Most connections open at once; past it a new one gets a 503.
    pub max_connections: usize,
}

/// Requests tokenized at once; the others wait, holding only their bodies (2 MiB at most).
const TOKENIZING_AT_ONCE: usize = 2;

/// How long after the grace period the process waits for connections to close (a client
/// that reads nothing more) before it exits anyway.
const SHUTDOWN_LINGER: Duration = Duration::from_secs(5);

/// Opens `plan` on the engine thread and serves it until SIGINT or SIGTERM (`shutdown`).
/// The engine samples nothing itself (`options.sampler` is ignored): each request's sampler
/// runs on the host over the step's logits.
pub fn serve(plan: LoadedPlan, options: EngineOptions, server: &ServerOptions) -> Result<()> {
    let drain = Arc::new(Drain::default());
    watch_signals(drain.clone())?;
    let runtime = &plan.plan.runtime;
    let (max_context, max_sequences) =
        (runtime.max_context as usize, runtime.max_sequences as usize);
    let gguf = plan.gguf()?;
    let tokenizer = Arc::new(Tokenizer::from_gguf(gguf)?);
    let template = ChatTemplate::from_gguf(gguf, &tokenizer).map_err(|e| format!("{e:#}"));
    let model = gguf
        .path()
        .file_stem()
        .map_or_else(|| "model".to_owned(), |s| s.to_string_lossy().into_owned());
    let metrics = Arc::new(Metrics::new(max_sequences));
    let drafting = plan.plan.speculative.map(|sp| Drafting {
        tokens: sp.tokens as usize,
        max_context,
    });
    let scheduler = Scheduler::start(
        move || {
            let window = window(&plan.plan, options.arm);
            Ok(Batch::new(open(&plan, options)?, max_sequences, window))
        },
        tokenizer.clone(),
        metrics.clone(),
        drain.clone(),
        server.max_queue,
        drafting,
    )?;
    // U+FFFD for a token of part of a character: never less than its bytes
    let max_token_bytes = (0..tokenizer.vocab_size())
        .filter_map(|id| tokenizer.decode(&[id]).ok())
        .map(|t| t.len())
        .max()
        .unwrap_or(1);
    let grammars = Grammars::new(&tokenizer).map_err(|e| format!("{e:#}"));
    let tool_style = template
        .as_ref()
        .map_or(ToolStyle::Convention, ToolStyle::of);
    let app = Arc::new(App {
        scheduler,
        tokenizer,
        template,
        metrics,
        model,
        max_context,
        max_sequences,
        next_id: AtomicU64::new(0),
        instance: instance(),
        max_token_bytes,
        grammars,
        tool_style,
        tokenizing: Arc::new(tokio::sync::Semaphore::new(TOKENIZING_AT_ONCE)),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_io()
        .enable_time()
        .build()
        .context("starting the HTTP runtime")?;
    runtime.block_on(async {
        let at = format!("{}:{}", server.host, server.port);
        let listener = tokio::net::TcpListener::bind(&at)
            .await
            .with_context(|| format!("cannot listen on {at}"))?;
        let local = listener.local_addr().context("reading the bound address")?;
        if !local.ip().is_loopback() && server.api_key.is_none() {
            eprintln!("warning: listening on {local}, beyond this machine, without --api-key: anyone who can reach it can use the server");
        }
        let access = Arc::new(Access {
            api_key: server.api_key.clone(),
            allowed_origins: server.allowed_origins.clone(),
            bound: local,
            metrics: app.metrics.clone(),
        });
        eprintln!(
            "serving {} on http://{local}: {}",
            app.model,
            capacity(max_sequences, server.max_queue)
        );
        tokio::spawn(run_down(
            drain.clone(),
            app.metrics.clone(),
            server.shutdown_grace,
            SHUTDOWN_LINGER,
        ));
        let stopped = drain.clone();
        let rules = Arc::new(BodyRules {
            timeout: server.timeout,
            metrics: app.metrics.clone(),
        });
        let listener = Guarded::new(
            listener,
            server.max_connections,
            server.timeout,
            app.metrics.clone(),
        );
        let routes = router(app)
            .layer(axum::middleware::from_fn_with_state(rules, track))
            .layer(axum::middleware::from_fn_with_state(access, guard));
        axum::serve(listener, routes.into_make_service_with_connect_info::<Conn>())
            .with_graceful_shutdown(async move { stopped.stopped().await })
            .await
            .map_err(|e| anyhow!("the HTTP server stopped: {e}"))
    })?;
    let count = |n: &std::sync::atomic::AtomicUsize| n.load(Ordering::Relaxed);
    eprintln!(
        "stopped: {} sequences ended after the signal ({} of them cut at the end of the grace period), {} queued ones refused",
        count(&drain.finished),
        count(&drain.cut_short),
        count(&drain.refused)
    );
    Ok(())
}

/// This process's part of its response ids: its start in Unix milliseconds and its process id,
/// in hex, so ids do not repeat across restarts.
fn instance() -> String {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{:x}{:x}", started.as_millis(), std::process::id())
}

/// The start line's account of how many requests decode at once and how many may wait.
fn capacity(max_sequences: usize, max_queue: usize) -> String {
    let waiting = format!("up to {max_queue} more wait in the queue (--max-queue)");
    if max_sequences > 1 {
        format!("up to {max_sequences} requests decode at once (runtime.max_sequences {max_sequences}); {waiting}")
    } else {
        format!("one request at a time (runtime.max_sequences 1: a plan of several sequences batches them); {waiting}")
    }
}

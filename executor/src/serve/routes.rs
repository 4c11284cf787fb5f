//! The HTTP endpoints: OpenAI completions and chat completions (one JSON body, or server-sent
//! events ending with `data: [DONE]`), the model list, health and Prometheus metrics. A
//! request is validated and tokenized here, then queued to the engine thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};
use tokio::sync::mpsc::unbounded_channel;

use super::answer::{stream, whole, CancelOnDrop, Choices};
use super::api::{parse, Endpoint, Input, Request};
use super::error::ApiError;
use super::grammar::{Constraint, Grammars};
use super::metrics::Metrics;
use super::response::Shape;
use super::scheduler::{Job, Sampling, Scheduler};
use super::tally::Tally;
use super::tool_calls::Holdback;
use super::tools::{render, ToolStyle};
use crate::sample::SamplerConfig;
use crate::text::{ChatTemplate, Tokenizer};

/// Tokens a completion generates when `max_tokens` is absent (OpenAI's default).
const COMPLETION_DEFAULT_TOKENS: usize = 16;

/// The largest request body read (axum's default, stated here for the 413's message); a
/// body this large holds far more tokens than any context.
pub const BODY_LIMIT: usize = 2 << 20;

/// What every handler shares.
pub struct App {
    /// The engine thread's queue.
    pub scheduler: Scheduler,
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The model's chat template, or why it has none.
    pub template: Result<ChatTemplate, String>,
    /// The counters of `/metrics`.
    pub metrics: Arc<Metrics>,
    /// The model id clients name.
    pub model: String,
    /// The plan's `runtime.max_context`.
    pub max_context: usize,
    /// The plan's `runtime.max_sequences`.
    pub max_sequences: usize,
    /// Numbers the response ids.
    pub next_id: AtomicU64,
    /// Makes the response ids of this process its own: its start time and process id.
    pub instance: String,
    /// The most bytes one token's text has: a text of more than `max_context` times as many
    /// bytes cannot fit the context, and is refused before it is tokenized.
    pub max_token_bytes: usize,
    /// Makes the `response_format` and tool call constraints, or why it cannot.
    pub grammars: Result<Grammars, String>,
    /// How the chat template takes tools.
    pub tool_style: ToolStyle,
    /// Bounds the requests being tokenized at once (and so their memory).
    pub tokenizing: Arc<tokio::sync::Semaphore>,
}

/// The router over every endpoint.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(app)
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }
}

async fn health(State(app): State<Arc<App>>, method: Method) -> Response {
    let mut tally = Tally::new(&app.metrics, method.as_str(), "/health", "/health");
    tally.status = 200;
    Json(json!({"status": "ok"})).into_response()
}

async fn metrics(State(app): State<Arc<App>>, method: Method) -> Response {
    let mut tally = Tally::new(&app.metrics, method.as_str(), "/metrics", "/metrics");
    tally.status = 200;
    let text = app.metrics.render();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

impl App {
    /// The model's entry in `/v1/models`.
    fn card(&self) -> Value {
        json!({
            "id": self.model,
            "object": "model",
            "created": 0,
            "owned_by": "memra",
            "max_context": self.max_context,
            "max_sequences": self.max_sequences,
        })
    }
}

async fn models(State(app): State<Arc<App>>, method: Method) -> Response {
    let mut tally = Tally::new(&app.metrics, method.as_str(), "/v1/models", "/v1/models");
    tally.status = 200;
    Json(json!({"object": "list", "data": [app.card()]})).into_response()
}

/// `GET /v1/models/{id}`: the model, or a 404 naming the one served.
async fn model(
    State(app): State<Arc<App>>,
    method: Method,
    uri: Uri,
    Path(id): Path<String>,
) -> Response {
    let mut tally = Tally::new(&app.metrics, method.as_str(), uri.path(), "/v1/models");
    if id != app.model {
        let e = ApiError::unknown_model(&id, &app.model);
        tally.status = e.status.as_u16();
        return e.into_response();
    }
    tally.status = 200;
    Json(app.card()).into_response()
}

async fn no_route(State(app): State<Arc<App>>, method: Method, uri: Uri) -> Response {
    let mut tally = Tally::new(&app.metrics, method.as_str(), uri.path(), "other");
    tally.status = 404;
    ApiError::no_route(uri.path()).into_response()
}

async fn wrong_method(State(app): State<Arc<App>>, method: Method, uri: Uri) -> Response {
    let mut tally = Tally::new(&app.metrics, method.as_str(), uri.path(), "other");
    tally.status = 405;
    ApiError::wrong_method(method.as_str(), uri.path()).into_response()
}

async fn completions(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(app, Endpoint::Completions, body).await
}

async fn chat(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(app, Endpoint::Chat, body).await
}

/// A request ready for the engine.
struct Prepared {
    request: Request,
    tokens: Vec<u32>,
    max_tokens: usize,
    /// One `response_format` constraint per choice, or none.
    constraints: Vec<Constraint>,
}

impl App {
    /// Refuses a text of more bytes than `max_context - 1` tokens can hold, before its
    /// tokens are counted (tokenizing a text of megabytes takes seconds and gigabytes).
    fn fits(&self, field: &str, text: &str) -> Result<(), ApiError> {
        let (c, l) = (self.max_context, self.max_token_bytes.max(1));
        // the text may gain a byte (a leading space) in tokenizing
        let least = text.len().saturating_sub(1).div_ceil(l);
        if least < c {
            return Ok(());
        }
        let mut e = ApiError::invalid(
            field,
            format!("{field}: {} bytes are at least {least} tokens (a token holds at most {l} bytes), past the context of {c} tokens (runtime.max_context)", text.len()),
        );
        e.code = "context_length_exceeded";
        Err(e)
    }

    /// Validates and tokenizes a body; every refusal names its field.
    fn prepare(&self, endpoint: Endpoint, body: &[u8]) -> Result<Prepared, ApiError> {
        let request = parse(body, endpoint, &self.model)?;
        let (field, tokens) = match &request.input {
            Input::Prompt(text) => {
                self.fits("prompt", text)?;
                ("prompt", self.tokenizer.encode(text, true))
            }
            Input::Tokens(ids) => {
                let vocab = self.tokenizer.vocab_size();
                if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id >= vocab) {
                    return Err(ApiError::invalid(
                        &format!("prompt[{i}]"),
                        format!(
                            "prompt[{i}]: token id {id} is not in the vocabulary of {vocab} tokens"
                        ),
                    ));
                }
                ("prompt", Ok(ids.clone()))
            }
            Input::Chat(messages) => {
                let template = self
                    .template
                    .as_ref()
                    .map_err(|why| ApiError::invalid("messages", format!("messages: {why}")))?;
                if request.tools.is_some() && self.tool_style == ToolStyle::Foreign {
                    return Err(ApiError::invalid("tools", "tools: the model's chat template asks for tool calls in a form this server does not parse (it parses <tool_call> tags, and its own JSON convention for templates without tools); leave tools out"));
                }
                let text = render(template, self.tool_style, messages, request.tools.as_ref())
                    .map_err(|e| ApiError::invalid("messages", format!("messages: {e:#}")))?;
                self.fits("messages", &text)?;
                ("messages", self.tokenizer.encode(&text, false))
            }
        };
        let tokens = tokens.map_err(|e| ApiError::invalid(field, format!("{field}: {e:#}")))?;
        let (p, c) = (tokens.len(), self.max_context);
        if p == 0 {
            return Err(ApiError::invalid(
                field,
                format!("{field}: no tokens to continue"),
            ));
        }
        if p >= c {
            let mut e = ApiError::invalid(
                field,
                format!("{field}: {p} tokens leave no room in the context of {c} tokens (runtime.max_context); at most {} fit", c - 1),
            );
            e.code = "context_length_exceeded";
            return Err(e);
        }
        let max_tokens = match (request.max_tokens, endpoint) {
            (Some(m), _) if p + m > c => {
                let field = request.max_tokens_field;
                return Err(ApiError::invalid(
                    field,
                    format!("{field}: {m} after a prompt of {p} tokens exceeds the context of {c} tokens; at most {} fit", c - p),
                ));
            }
            (Some(m), _) => m,
            (None, Endpoint::Completions) => COMPLETION_DEFAULT_TOKENS.min(c - p),
            (None, Endpoint::Chat) => c - p,
        };
        let grammar = match (&request.format, &request.tools) {
            (Some(schema), _) => Some((
                TopLevelGrammar::from_json_schema(schema.clone()),
                "response_format",
                "the schema",
            )),
            (None, Some(tools)) => tools
                .grammar(self.tool_style.form())
                .map(|g| (g, "tools", "the functions' parameters")),
            (None, None) => None,
        };
        let constraints = match grammar {
            None => Vec::new(),
            Some((grammar, field, what)) => {
                let grammars = self
                    .grammars
                    .as_ref()
                    .map_err(|why| ApiError::invalid(field, format!("{field}: {why}")))?;
                (0..request.n)
                    .map(|_| grammars.matcher(grammar.clone()).map(Constraint::new))
                    .collect::<anyhow::Result<Vec<_>>>()
                    .map_err(|e| {
                        ApiError::invalid(
                            field,
                            format!("{field}: {what} cannot be followed: {e:#}"),
                        )
                    })?
            }
        };
        Ok(Prepared {
            request,
            tokens,
            max_tokens,
            constraints,
        })
    }
}

/// A response id no other server process gives: the process's start and id, and a counter.
fn response_id(app: &App, endpoint: Endpoint, n: u64) -> String {
    let prefix = match endpoint {
        Endpoint::Completions => "cmpl",
        Endpoint::Chat => "chatcmpl",
    };
    format!("{prefix}-{}-{n}", app.instance)
}

async fn answer(
    app: Arc<App>,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let mut tally = Tally::new(&app.metrics, "POST", endpoint.path(), endpoint.path());
    // Tokenizing a long body takes seconds: off the two HTTP workers, so that other
    // requests' answers and streams go on meanwhile.
    let prepared = match body {
        Ok(body) => {
            let app = app.clone();
            // The semaphore is never closed.
            let permit = app.tokenizing.clone().acquire_owned().await;
            tokio::task::spawn_blocking(move || {
                let _permit = permit;
                app.prepare(endpoint, &body)
            })
            .await
            .unwrap_or_else(|e| Err(ApiError::engine(format!("reading the request: {e}"))))
        }
        Err(rejection) => Err(ApiError::unreadable(&rejection, BODY_LIMIT)),
    };
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => {
            tally.status = e.status.as_u16();
            return e.into_response();
        }
    };
    tally.prompt = prepared.tokens.len();
    let n = app.next_id.fetch_add(1, Ordering::Relaxed);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let request = &prepared.request;
    // choice i draws from seed + i
    let seed = request
        .seed
        .unwrap_or_else(|| u64::from(now.subsec_nanos()) ^ n.rotate_left(32));
    let (events, rx) = unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let guard = CancelOnDrop(cancel.clone());
    let mut constraints = prepared.constraints.into_iter();
    for index in 0..request.n {
        let job = Job {
            tokens: prepared.tokens.clone(),
            max_tokens: prepared.max_tokens,
            sampling: Sampling {
                config: SamplerConfig {
                    temperature: request.temperature,
                    top_k: request.top_k,
                    top_p: request.top_p,
                    seed: seed.wrapping_add(index as u64),
                },
                min_p: request.min_p,
                penalties: request.penalties,
                logprobs: request.logprobs,
            },
            stop: request.stop.clone(),
            constraint: constraints.next(),
            cancel: cancel.clone(),
            index,
            events: events.clone(),
        };
        // a refused choice cancels the ones queued before it (the guard, dropped here)
        if let Err(e) = app.scheduler.submit(job) {
            tally.status = e.status.as_u16();
            return e.into_response();
        }
    }
    drop(events);
    let shape = Shape {
        endpoint,
        id: response_id(&app, endpoint, n),
        created: now.as_secs(),
        model: app.model.clone(),
        usage_chunk: request.include_usage,
        logprobs: request.logprobs.is_some(),
        tokenizer: app.tokenizer.clone(),
    };
    let holdback = request.tools.as_ref().map(|tools| {
        let names: Vec<String> = tools.functions.iter().map(|f| f.name.clone()).collect();
        let form = app.tool_style.form();
        move || Holdback::new(form, names.clone())
    });
    let choices = Choices::new(
        request.n,
        prepared.tokens.len(),
        holdback.as_ref().map(|h| h as &dyn Fn() -> Holdback),
    );
    if request.stream {
        stream(shape, rx, choices, guard, tally)
    } else {
        whole(shape, rx, choices, guard, tally).await
    }
}

//! The HTTP endpoints: OpenAI completions and chat completions (one JSON body, or server-sent
//! events ending with `data: [DONE]`), the model list, health and Prometheus metrics. A
//! request is validated and tokenized here, then queued to the engine thread.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::api::{parse, Endpoint, Input, Request};
use super::error::ApiError;
use super::grammar::{Constraint, Grammars};
use super::logprobs::TokenLogprob;
use super::metrics::Metrics;
use super::response::{Piece, Shape, Usage};
use super::scheduler::{Event, Job, Sampling, Scheduler};
use super::tally::Tally;
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
    /// Makes the `response_format` constraints, or why it cannot.
    pub grammars: Result<Grammars, String>,
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
                let text = template
                    .render(messages, true)
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
        let constraints = match &request.format {
            None => Vec::new(),
            Some(schema) => {
                let grammars = self.grammars.as_ref().map_err(|why| {
                    ApiError::invalid("response_format", format!("response_format: {why}"))
                })?;
                (0..request.n)
                    .map(|_| grammars.matcher(schema.clone()).map(Constraint::new))
                    .collect::<anyhow::Result<Vec<_>>>()
                    .map_err(|e| {
                        ApiError::invalid(
                            "response_format",
                            format!("response_format: the schema cannot be followed: {e:#}"),
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

/// Sets the request's cancellation flag when dropped: with the response future or stream,
/// so a client that goes away stops its sequences at the engine's next step.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
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
    let choices = Choices::new(request.n, prepared.tokens.len());
    if request.stream {
        stream(shape, rx, choices, guard, tally)
    } else {
        whole(shape, rx, choices, guard, tally).await
    }
}

/// The choices of one request as their events come: text, logprobs, how each ended.
struct Choices {
    text: Vec<String>,
    logprobs: Vec<Vec<TokenLogprob>>,
    /// Tokens generated by each choice so far.
    generated: Vec<usize>,
    finish: Vec<Option<&'static str>>,
    prompt: usize,
}

impl Choices {
    fn new(n: usize, prompt: usize) -> Choices {
        Choices {
            text: vec![String::new(); n],
            logprobs: vec![Vec::new(); n],
            generated: vec![0; n],
            finish: vec![None; n],
            prompt,
        }
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt: self.prompt,
            completion: self.generated.iter().sum(),
        }
    }

    fn all_done(&self) -> bool {
        self.finish.iter().all(Option::is_some)
    }
}

/// Waits for every choice's whole text and answers with one body.
async fn whole(
    shape: Shape,
    mut rx: UnboundedReceiver<(usize, Event)>,
    mut choices: Choices,
    _guard: CancelOnDrop,
    mut tally: Tally,
) -> Response {
    while let Some((i, event)) = rx.recv().await {
        match event {
            Event::Text {
                text,
                completion,
                logprobs,
            } => {
                tally.text_came();
                choices.text[i].push_str(&text);
                choices.logprobs[i].extend(logprobs);
                choices.generated[i] = completion;
            }
            Event::Done(f) => {
                choices.generated[i] = f.completion_tokens;
                choices.finish[i] = Some(f.reason.name());
            }
            Event::Failed(message) => return engine_failure(&mut tally, message).into_response(),
            Event::Refused(e) => {
                tally.status = e.status.as_u16();
                return e.into_response();
            }
        }
        tally.generated = choices.usage().completion;
        if choices.all_done() {
            tally.status = 200;
            let all = (0..choices.text.len())
                .map(|index| {
                    let piece = Piece {
                        index,
                        text: &choices.text[index],
                        logprobs: &choices.logprobs[index],
                        finish: choices.finish[index],
                    };
                    shape.choice(&piece, true)
                })
                .collect();
            return Json(shape.body(all, true, Some(choices.usage()))).into_response();
        }
    }
    engine_failure(&mut tally, "the engine dropped the request".into()).into_response()
}

fn engine_failure(tally: &mut Tally, message: String) -> ApiError {
    let e = ApiError::engine(format!("the engine failed on this request: {message}"));
    tally.status = e.status.as_u16();
    e
}

/// The state of one server-sent event stream.
struct Streaming {
    shape: Shape,
    rx: UnboundedReceiver<(usize, Event)>,
    choices: Choices,
    _guard: CancelOnDrop,
    tally: Tally,
    /// Data lines ready to send.
    pending: VecDeque<String>,
    /// Whether the last line is queued.
    ended: bool,
}

impl Streaming {
    /// Queues what `event` adds to the stream.
    fn take(&mut self, event: Option<(usize, Event)>) {
        let shape = &self.shape;
        let chunk = |piece: &Piece, usage: Option<Usage>| {
            shape
                .body(vec![shape.choice(piece, false)], false, usage)
                .to_string()
        };
        match event {
            Some((
                index,
                Event::Text {
                    text,
                    completion,
                    logprobs,
                },
            )) => {
                self.tally.text_came();
                self.choices.generated[index] = completion;
                let piece = Piece {
                    index,
                    text: &text,
                    logprobs: &logprobs,
                    finish: None,
                };
                self.pending.push_back(chunk(&piece, None));
            }
            Some((index, Event::Done(f))) => {
                let choices = &mut self.choices;
                choices.generated[index] = f.completion_tokens;
                choices.finish[index] = Some(f.reason.name());
                let piece = Piece {
                    index,
                    text: "",
                    logprobs: &[],
                    finish: Some(f.reason.name()),
                };
                let last = choices.all_done();
                if !last || shape.usage_chunk {
                    self.pending.push_back(chunk(&piece, None));
                }
                if last {
                    self.tally.status = 200;
                    if shape.usage_chunk {
                        let usage = shape.body(Vec::new(), false, Some(choices.usage()));
                        self.pending.push_back(usage.to_string());
                    } else {
                        self.pending.push_back(chunk(&piece, Some(choices.usage())));
                    }
                    self.pending.push_back("[DONE]".into());
                    self.ended = true;
                }
            }
            Some((_, Event::Failed(message))) => {
                let e = engine_failure(&mut self.tally, message);
                self.pending.push_back(e.body().to_string());
                self.ended = true;
            }
            Some((_, Event::Refused(e))) => {
                self.tally.status = e.status.as_u16();
                self.pending.push_back(e.body().to_string());
                self.ended = true;
            }
            None => {
                let e = engine_failure(&mut self.tally, "the engine dropped the request".into());
                self.pending.push_back(e.body().to_string());
                self.ended = true;
            }
        }
        self.tally.generated = self.choices.usage().completion;
    }
}

/// Answers with server-sent events: one chunk per piece of a choice's text, a chunk with
/// each choice's finish reason, the usage in the last one (with
/// `stream_options.include_usage`, in a chunk of no choices after them), then `data: [DONE]`.
fn stream(
    shape: Shape,
    rx: UnboundedReceiver<(usize, Event)>,
    choices: Choices,
    guard: CancelOnDrop,
    tally: Tally,
) -> Response {
    let mut pending = VecDeque::new();
    if shape.endpoint == Endpoint::Chat {
        for index in 0..choices.text.len() {
            let role = shape.body(vec![shape.role(index)], false, None);
            pending.push_back(role.to_string());
        }
    }
    let state = Streaming {
        shape,
        rx,
        choices,
        _guard: guard,
        tally,
        pending,
        ended: false,
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(data) = s.pending.pop_front() {
                return Some((Ok::<_, Infallible>(SseEvent::default().data(data)), s));
            }
            if s.ended {
                return None;
            }
            let event = s.rx.recv().await;
            s.take(event);
        }
    });
    (StatusCode::OK, Sse::new(events)).into_response()
}

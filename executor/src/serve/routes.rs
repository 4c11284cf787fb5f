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
use super::metrics::Metrics;
use super::scheduler::{Event, Finish, Job, Scheduler};
use super::tally::Tally;
use crate::sample::SamplerConfig;
use crate::text::{ChatTemplate, Tokenizer};

/// Tokens a completion generates when `max_tokens` is absent (OpenAI's default).
const COMPLETION_DEFAULT_TOKENS: usize = 16;

/// The largest request body read (axum's default, stated here for the 413's message); a
/// body this large holds far more tokens than any context.
const BODY_LIMIT: usize = 2 << 20;

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
}

impl App {
    /// Validates and tokenizes a body; every refusal names its field.
    fn prepare(&self, endpoint: Endpoint, body: &[u8]) -> Result<Prepared, ApiError> {
        let request = parse(body, endpoint, &self.model)?;
        let (field, tokens) = match &request.input {
            Input::Prompt(text) => ("prompt", self.tokenizer.encode(text, true)),
            Input::Chat(messages) => {
                let template = self
                    .template
                    .as_ref()
                    .map_err(|why| ApiError::invalid("messages", format!("messages: {why}")))?;
                let text = template
                    .render(messages, true)
                    .map_err(|e| ApiError::invalid("messages", format!("messages: {e:#}")))?;
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
        Ok(Prepared {
            request,
            tokens,
            max_tokens,
        })
    }
}

/// Sets the job's cancellation flag when dropped: with the response future or stream, so a
/// client that goes away stops its sequence at the engine's next step.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The fields every response and chunk of one request shares.
struct Shape {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
    /// A stream's usage comes in a chunk of its own, after the finish reason's.
    usage_chunk: bool,
}

impl Shape {
    /// One choice in a response or chunk.
    fn choice(&self, text: &str, finish: Option<&str>, whole: bool) -> Value {
        match (self.endpoint, whole) {
            (Endpoint::Completions, _) => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
            (Endpoint::Chat, true) => json!({"index": 0, "finish_reason": finish,
                "message": {"role": "assistant", "content": text}}),
            (Endpoint::Chat, false) if finish.is_some() => {
                json!({"index": 0, "delta": {}, "finish_reason": finish})
            }
            (Endpoint::Chat, false) => {
                json!({"index": 0, "delta": {"content": text}, "finish_reason": null})
            }
        }
    }

    fn object(&self, whole: bool) -> &'static str {
        match (self.endpoint, whole) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, true) => "chat.completion",
            (Endpoint::Chat, false) => "chat.completion.chunk",
        }
    }

    fn body(&self, choice: Value, whole: bool, finish: Option<&Finish>) -> Value {
        let mut body = json!({
            "id": self.id,
            "object": self.object(whole),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if let Some(f) = finish {
            body["usage"] = json!({
                "prompt_tokens": f.prompt_tokens,
                "completion_tokens": f.completion_tokens,
                "total_tokens": f.prompt_tokens + f.completion_tokens,
            });
        }
        body
    }
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
            tokio::task::spawn_blocking(move || app.prepare(endpoint, &body))
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
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let request = &prepared.request;
    let seed = request.seed.unwrap_or_else(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        u64::from(nanos) ^ n.rotate_left(32)
    });
    let (events, rx) = unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let job = Job {
        tokens: prepared.tokens,
        max_tokens: prepared.max_tokens,
        sampler: SamplerConfig {
            temperature: request.temperature,
            top_k: 0,
            top_p: request.top_p,
            seed,
        },
        stop: request.stop.clone(),
        cancel: cancel.clone(),
        events,
    };
    if let Err(e) = app.scheduler.submit(job) {
        tally.status = e.status.as_u16();
        return e.into_response();
    }
    let shape = Shape {
        endpoint,
        id: match endpoint {
            Endpoint::Completions => format!("cmpl-{n}"),
            Endpoint::Chat => format!("chatcmpl-{n}"),
        },
        created,
        model: app.model.clone(),
        usage_chunk: request.include_usage,
    };
    let guard = CancelOnDrop(cancel);
    if request.stream {
        stream(shape, rx, guard, tally)
    } else {
        whole(shape, rx, guard, tally).await
    }
}

/// Waits for the whole text and answers with one body.
async fn whole(
    shape: Shape,
    mut rx: UnboundedReceiver<Event>,
    _guard: CancelOnDrop,
    mut tally: Tally,
) -> Response {
    let mut text = String::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Text {
                text: t,
                completion,
            } => {
                text.push_str(&t);
                tally.generated = completion;
            }
            Event::Done(f) => {
                tally.status = 200;
                tally.generated = f.completion_tokens;
                let choice = shape.choice(&text, Some(f.reason.name()), true);
                return Json(shape.body(choice, true, Some(&f))).into_response();
            }
            Event::Failed(message) => return engine_failure(&mut tally, message).into_response(),
            Event::Refused(e) => {
                tally.status = e.status.as_u16();
                return e.into_response();
            }
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
    rx: UnboundedReceiver<Event>,
    _guard: CancelOnDrop,
    tally: Tally,
    /// Data lines ready to send.
    pending: VecDeque<String>,
    /// Whether the last line is queued.
    ended: bool,
}

impl Streaming {
    /// Queues what `event` adds to the stream.
    fn take(&mut self, event: Option<Event>) {
        let shape = &self.shape;
        match event {
            Some(Event::Text {
                text: t,
                completion,
            }) => {
                self.tally.generated = completion;
                let chunk = shape.body(shape.choice(&t, None, false), false, None);
                self.pending.push_back(chunk.to_string());
            }
            Some(Event::Done(f)) => {
                self.tally.status = 200;
                self.tally.generated = f.completion_tokens;
                let last = shape.choice("", Some(f.reason.name()), false);
                if shape.usage_chunk {
                    self.pending
                        .push_back(shape.body(last, false, None).to_string());
                    let mut usage = shape.body(Value::Null, false, Some(&f));
                    usage["choices"] = json!([]);
                    self.pending.push_back(usage.to_string());
                } else {
                    self.pending
                        .push_back(shape.body(last, false, Some(&f)).to_string());
                }
                self.pending.push_back("[DONE]".into());
                self.ended = true;
            }
            Some(Event::Failed(message)) => {
                let e = engine_failure(&mut self.tally, message);
                self.pending.push_back(e.body().to_string());
                self.ended = true;
            }
            Some(Event::Refused(e)) => {
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
    }
}

/// Answers with server-sent events: one chunk per piece of text, a last chunk with the
/// finish reason and usage (with `stream_options.include_usage`, the usage in a chunk of no
/// choices after it), then `data: [DONE]`.
fn stream(
    shape: Shape,
    rx: UnboundedReceiver<Event>,
    guard: CancelOnDrop,
    tally: Tally,
) -> Response {
    let mut pending = VecDeque::new();
    if shape.endpoint == Endpoint::Chat {
        let role = json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null});
        pending.push_back(shape.body(role, false, None).to_string());
    }
    let state = Streaming {
        shape,
        rx,
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

//! Connections: a cap on how many are open, and a timeout on each. Past `--max-connections`
//! a new connection gets a 503 and is closed, so idle connections cannot starve the others
//! of file descriptors. A connection none of whose requests is in flight is closed
//! `--timeout` seconds after it opened or after its last answer was written, bytes read or
//! not: the next request's header must come whole within that time (a client trickling a
//! header a byte at a time is cut off when it is up, not kept by each byte). A write that
//! does not progress for the timeout (a client that stops reading) closes it too, and the
//! body of a request must come whole within the timeout (`read_body`).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, HttpBody};
use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::{IncomingStream, Listener};
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

use super::access::endpoint_label;
use super::error::ApiError;
use super::metrics::Metrics;
use super::routes::BODY_LIMIT;
use super::tally::Tally;

/// What a connection's requests and its IO share.
pub struct ConnState {
    /// Requests of the connection whose answers are not finished.
    in_flight: AtomicUsize,
    /// When the connection opened, or its last answer was finished or written; reads do
    /// not move it, so a header's bytes count against one deadline.
    last: Mutex<Instant>,
}

impl ConnState {
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn idle_since(&self) -> Option<Instant> {
        (self.in_flight.load(Ordering::Relaxed) == 0)
            .then(|| *self.last.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Marks a request in flight until the returned guard is dropped (with its answer).
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }
}

/// A request in flight on its connection; dropped when its answer is finished or dropped.
pub struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The connection a request came on, for the middleware (axum's connect info).
#[derive(Clone)]
pub struct Conn(pub Arc<ConnState>);

impl Connected<IncomingStream<'_, Guarded>> for Conn {
    fn connect_info(stream: IncomingStream<'_, Guarded>) -> Self {
        Conn(stream.io().state.clone())
    }
}

/// The listener: takes a connection only while fewer than the cap are open.
pub struct Guarded {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    max: usize,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Guarded {
    /// `listener` with at most `max` open connections, each with `timeout`.
    pub fn new(
        listener: TcpListener,
        max: usize,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Guarded {
        Guarded {
            listener,
            slots: Arc::new(Semaphore::new(max)),
            max,
            timeout,
            metrics,
        }
    }
}

impl Listener for Guarded {
    type Io = Timed;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Timed, SocketAddr) {
        loop {
            let (stream, addr) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                // out of file descriptors, or a connection reset before it was taken
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            match self.slots.clone().try_acquire_owned() {
                Ok(permit) => return (Timed::new(stream, permit, self.timeout), addr),
                Err(_) => {
                    self.metrics.count_request("other", 503);
                    eprintln!(
                        "connection from {addr} refused: {} connections are open (--max-connections)",
                        self.max
                    );
                    tokio::spawn(refuse(stream, self.max));
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// Answers a connection past the cap with a 503 and closes it (within a second): the answer
/// written, the sending side shut, then what the client sent read and dropped until it
/// closes, so that the close does not reset the answer away.
async fn refuse(stream: TcpStream, max: usize) {
    let body = ApiError::too_many_connections(max).body().to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let close = async {
        let mut rest = answer.as_bytes();
        while !rest.is_empty() {
            stream.writable().await?;
            match stream.try_write(rest) {
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        // SAFETY: the descriptor is the stream's own and open while it lives.
        unsafe { libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(&stream), libc::SHUT_WR) };
        let mut sink = [0u8; 4096];
        loop {
            stream.readable().await?;
            match stream.try_read(&mut sink) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    };
    // a client that reads nothing, or never closes, is dropped the same
    let _ = tokio::time::timeout(Duration::from_secs(1), close).await;
}

/// A connection's stream with its timeout and its place under the cap.
pub struct Timed {
    io: TcpStream,
    state: Arc<ConnState>,
    timeout: Duration,
    idle: Pin<Box<Sleep>>,
    stalled: Pin<Box<Sleep>>,
    stalled_since: Option<Instant>,
    _slot: OwnedSemaphorePermit,
}

impl Timed {
    fn new(io: TcpStream, slot: OwnedSemaphorePermit, timeout: Duration) -> Timed {
        let far = tokio::time::Instant::now() + timeout;
        Timed {
            io,
            state: Arc::new(ConnState {
                in_flight: AtomicUsize::new(0),
                last: Mutex::new(Instant::now()),
            }),
            timeout,
            idle: Box::pin(tokio::time::sleep_until(far)),
            stalled: Box::pin(tokio::time::sleep_until(far)),
            stalled_since: None,
            _slot: slot,
        }
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_owned())
}

/// Polls `sleep` re-armed for `since + timeout`: ready once that moment has passed.
fn expired(
    sleep: &mut Pin<Box<Sleep>>,
    since: Instant,
    timeout: Duration,
    cx: &mut Context,
) -> bool {
    sleep
        .as_mut()
        .reset(tokio::time::Instant::from_std(since + timeout));
    sleep.as_mut().poll(cx).is_ready()
}

impl AsyncRead for Timed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(result) => Poll::Ready(result),
            Poll::Pending => match this.state.idle_since() {
                Some(since) if expired(&mut this.idle, since, this.timeout, cx) => {
                    Poll::Ready(Err(timed_out("no request came whole within --timeout")))
                }
                _ => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Timed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(result) => {
                this.stalled_since = None;
                this.state.touch();
                Poll::Ready(result)
            }
            Poll::Pending => {
                let since = *this.stalled_since.get_or_insert_with(Instant::now);
                if expired(&mut this.stalled, since, this.timeout, cx) {
                    Poll::Ready(Err(timed_out("the client read nothing for --timeout")))
                } else {
                    Poll::Pending
                }
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// What `track` needs: the timeout of a request's body and the counters.
pub struct BodyRules {
    /// The whole body must come within it.
    pub timeout: Duration,
    /// Counts and logs the refused requests.
    pub metrics: Arc<Metrics>,
}

/// The body whole, or a 413 past `BODY_LIMIT` (as soon as it is passed), or a 400 when the
/// connection fails while it comes.
async fn read_body(body: Body) -> Result<Vec<u8>, ApiError> {
    let mut frames = body.into_data_stream();
    let mut bytes = Vec::new();
    while let Some(frame) = frames.next().await {
        let frame =
            frame.map_err(|e| ApiError::malformed(format!("the body could not be read: {e}")))?;
        if bytes.len() + frame.len() > BODY_LIMIT {
            return Err(ApiError::too_large(BODY_LIMIT));
        }
        bytes.extend_from_slice(&frame);
    }
    Ok(bytes)
}

/// The middleware: reads the request's body whole within the timeout (a 408 past it, a 413
/// past `BODY_LIMIT`), then keeps the request in flight on its connection until its answer
/// is finished or dropped, so the connection's idle timeout waits meanwhile.
pub async fn track(
    State(rules): State<Arc<BodyRules>>,
    ConnectInfo(conn): ConnectInfo<Conn>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let refuse = |e: ApiError| {
        let path = parts.uri.path();
        let mut tally = Tally::new(
            &rules.metrics,
            parts.method.as_str(),
            path,
            endpoint_label(path),
        );
        tally.status = e.status.as_u16();
        e.into_response()
    };
    // in flight from here: the body's own timeout watches it, not the idle one
    let in_flight = conn.0.begin();
    let bytes = match tokio::time::timeout(rules.timeout, read_body(body)).await {
        Err(_) => return refuse(ApiError::body_timeout(rules.timeout)),
        Ok(Err(e)) => return refuse(e),
        Ok(Ok(bytes)) => bytes,
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    if response.body().size_hint().exact().is_some() {
        // a whole answer: only its writing is left, which the write timeout watches
        return response;
    }
    let (parts, body) = response.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _held = &in_flight;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

//! Who may use the server, checked before any route: the `Host` header (a server bound to a
//! loopback address answers only requests naming a loopback host, so a web page cannot reach
//! it through a DNS name rebound to 127.0.0.1), the `Origin` header (a browser's request
//! from a page whose origin is not in `--allowed-origins` is refused; allowed ones get CORS
//! headers and their preflight `OPTIONS`), and the API key (`--api-key`: every `/v1/` route
//! needs `Authorization: Bearer KEY`, compared in constant time; `/health` and `/metrics`
//! stay open).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::metrics::Metrics;
use super::tally::Tally;

/// The access rules of one server.
pub struct Access {
    /// The key every `/v1/` request must bear, if any.
    pub api_key: Option<String>,
    /// Origins whose pages may call the server; `*` allows every origin.
    pub allowed_origins: Vec<String>,
    /// The address the server is bound to: when loopback, `Host` must name a loopback host.
    pub bound: SocketAddr,
    /// Counts and logs the refused requests.
    pub metrics: Arc<Metrics>,
}

impl Access {
    fn origin_allowed(&self, origin: &str) -> bool {
        self.allowed_origins.iter().any(|o| o == "*" || o == origin)
    }

    /// Whether `host` (a `Host` header: a name or address, maybe with a port) may reach a
    /// server bound to `self.bound`.
    fn host_allowed(&self, host: &str) -> bool {
        if !self.bound.ip().is_loopback() {
            return true;
        }
        // strip the port: after the last ':' unless inside an IPv6 literal (bracketed or not)
        let name = match host.rsplit_once(':') {
            _ if host.parse::<std::net::IpAddr>().is_ok() => host,
            Some((name, port)) if !port.contains(']') => name,
            _ => host,
        };
        let name = name.trim_start_matches('[').trim_end_matches(']');
        name.eq_ignore_ascii_case("localhost")
            || name
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    fn key_matches(&self, headers: &HeaderMap) -> bool {
        let Some(key) = &self.api_key else {
            return true;
        };
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        same_in_constant_time(presented.as_bytes(), key.as_bytes())
    }
}

/// Whether `presented` equals `key`, in a time that depends on `presented`'s length only:
/// every byte is compared (against the key repeated), and the length difference joins the
/// result without an early return.
fn same_in_constant_time(presented: &[u8], key: &[u8]) -> bool {
    let mut diff = u8::from(presented.len() != key.len());
    for (i, &byte) in presented.iter().enumerate() {
        let k = key.get(i % key.len().max(1)).copied().unwrap_or(0);
        diff |= std::hint::black_box(byte ^ k);
    }
    std::hint::black_box(diff) == 0
}

/// The label of `path` in `memra_requests_total`.
pub fn endpoint_label(path: &str) -> &'static str {
    match path {
        "/health" => "/health",
        "/metrics" => "/metrics",
        "/v1/completions" => "/v1/completions",
        "/v1/chat/completions" => "/v1/chat/completions",
        p if p == "/v1/models" || p.starts_with("/v1/models/") => "/v1/models",
        _ => "other",
    }
}

/// The middleware: refuses a request the rules do not allow (logged and counted), answers
/// an allowed origin's preflight, and adds the CORS headers to an allowed origin's answer.
pub async fn guard(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let headers = request.headers();
    let refuse = |e: ApiError| {
        let mut tally = Tally::new(
            &access.metrics,
            method.as_str(),
            &path,
            endpoint_label(&path),
        );
        tally.status = e.status.as_u16();
        e.into_response()
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if let Some(host) = host.filter(|h| !access.host_allowed(h)) {
        return refuse(ApiError::forbidden(
            "host_not_allowed",
            format!("Host `{host}` does not name this server's loopback address; use localhost or 127.0.0.1"),
        ));
    }
    let origin = headers
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_owned);
    if let Some(origin) = &origin {
        if !access.origin_allowed(origin) {
            return refuse(ApiError::forbidden(
                "origin_not_allowed",
                format!("Origin `{origin}` is not allowed; the server's --allowed-origins lists the web origins that may call it"),
            ));
        }
        if method == Method::OPTIONS {
            let mut tally = Tally::new(&access.metrics, "OPTIONS", &path, endpoint_label(&path));
            tally.status = 204;
            return cors(StatusCode::NO_CONTENT.into_response(), origin, true);
        }
    }
    if path.starts_with("/v1/") && !access.key_matches(headers) {
        let mut response = refuse(ApiError::unauthorized());
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return match &origin {
            Some(origin) => cors(response, origin, false),
            None => response,
        };
    }
    let response = next.run(request).await;
    match &origin {
        Some(origin) => cors(response, origin, false),
        None => response,
    }
}

/// `response` with the CORS headers for `origin` (and a preflight's answers).
fn cors(mut response: Response, origin: &str, preflight: bool) -> Response {
    let h = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(origin) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
    }
    h.insert(header::VARY, HeaderValue::from_static("Origin"));
    if preflight {
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("Authorization, Content-Type"),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(bound: &str, key: Option<&str>) -> Access {
        Access {
            api_key: key.map(str::to_owned),
            allowed_origins: vec!["http://app.example".into()],
            bound: bound.parse().unwrap(),
            metrics: Arc::new(Metrics::new(1)),
        }
    }

    #[test]
    fn a_loopback_server_answers_loopback_hosts_only() {
        let a = access("127.0.0.1:8080", None);
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "::1",
        ] {
            assert!(a.host_allowed(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "10.0.0.1",
            "localhost.evil:80",
        ] {
            assert!(!a.host_allowed(host), "{host}");
        }
        assert!(access("0.0.0.0:8080", None).host_allowed("evil.example"));
    }

    #[test]
    fn the_key_must_match_whole() {
        let a = access("127.0.0.1:1", Some("sk-secret"));
        let headers = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            h
        };
        assert!(a.key_matches(&headers("Bearer sk-secret")));
        for wrong in [
            "Bearer sk-secre",
            "Bearer sk-secretx",
            "sk-secret",
            "Bearer ",
            "Basic sk-secret",
        ] {
            assert!(!a.key_matches(&headers(wrong)), "{wrong}");
        }
        assert!(!a.key_matches(&HeaderMap::new()));
        assert!(access("127.0.0.1:1", None).key_matches(&HeaderMap::new()));
        assert!(same_in_constant_time(b"", b""));
        assert!(!same_in_constant_time(b"a", b""));
    }
}

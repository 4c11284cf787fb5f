//! The OpenAI error body every failed request gets:
//! `{"error": {"message", "type", "param", "code"}}`, with the HTTP status beside it.

use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A request's failure: what the client is told and with which status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Lowercase sentence naming the field and what is allowed.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A short machine-readable code.
    pub code: &'static str,
}

impl ApiError {
    /// A 400 for field `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.to_owned()),
            code: "invalid_value",
        }
    }

    /// A 400 for a body that is not a JSON object.
    pub fn malformed(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
            code: "invalid_json",
        }
    }

    /// A 404 for a model this server does not serve.
    pub fn unknown_model(asked: &str, served: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("model: `{asked}` is not served here; this server serves `{served}`"),
            param: Some("model".to_owned()),
            code: "model_not_found",
        }
    }

    /// A 404 for a path without an endpoint.
    pub fn no_route(path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("no endpoint at {path}; see GET /v1/models, POST /v1/completions, POST /v1/chat/completions"),
            param: None,
            code: "not_found",
        }
    }

    /// A 405 for a path whose endpoint takes another method (the `Allow` header names it).
    pub fn wrong_method(method: &str, path: &str) -> ApiError {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: format!("{method} is not allowed on {path}; see the Allow header"),
            param: None,
            code: "method_not_allowed",
        }
    }

    /// A body that could not be read: a 413 past `limit` bytes, or axum's reason.
    pub fn unreadable(rejection: &BytesRejection, limit: usize) -> ApiError {
        let status = rejection.status();
        ApiError {
            status,
            message: if status == StatusCode::PAYLOAD_TOO_LARGE {
                format!("the body is larger than the server's limit of {limit} bytes")
            } else {
                format!("the body could not be read: {}", rejection.body_text())
            },
            param: None,
            code: "invalid_body",
        }
    }

    /// A 503 for a request that found `waiting` requests queued, the server's limit.
    pub fn busy(waiting: usize) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!("the server is busy: {waiting} requests are waiting for a sequence slot (its --max-queue); retry later"),
            param: None,
            code: "server_busy",
        }
    }

    /// A 401 for a `/v1/` request without the server's API key.
    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "a valid API key is required: send the header `Authorization: Bearer KEY` with the server's --api-key".into(),
            param: None,
            code: "invalid_api_key",
        }
    }

    /// A 403 for a request from a host or origin the server does not answer.
    pub fn forbidden(code: &'static str, message: String) -> ApiError {
        ApiError {
            status: StatusCode::FORBIDDEN,
            message,
            param: None,
            code,
        }
    }

    /// A 413 for a body past `limit` bytes.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the body is larger than the server's limit of {limit} bytes"),
            param: None,
            code: "invalid_body",
        }
    }

    /// A 408 for a body that did not come whole within `timeout`.
    pub fn body_timeout(timeout: std::time::Duration) -> ApiError {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!(
                "the body did not come whole within {} s (the server's --timeout); is Content-Length right?",
                timeout.as_secs_f64()
            ),
            param: None,
            code: "body_timeout",
        }
    }

    /// A 503 for a connection past the cap of `max` open ones.
    pub fn too_many_connections(max: usize) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!(
                "the server has {max} connections open, its limit (--max-connections); retry later"
            ),
            param: None,
            code: "too_many_connections",
        }
    }

    /// A 503 for a request that came after the shutdown started.
    pub fn shutting_down() -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the server is shutting down and takes no new requests".into(),
            param: None,
            code: "shutting_down",
        }
    }

    /// A 500 for a request the engine failed on.
    pub fn engine(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            param: None,
            code: "engine_error",
        }
    }

    /// The error object (`{"error": ...}`), as a body or a stream's last event.
    pub fn body(&self) -> serde_json::Value {
        let kind = if self.status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        json!({"error": {
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}

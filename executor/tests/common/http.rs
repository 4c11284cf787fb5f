//! A running `memra-run serve` and the HTTP requests the server tests send it, over plain
//! TCP (no client library between the test and the bytes).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::ServeProcess;

/// A running server and the requests the tests send it.
pub struct Server(pub ServeProcess);

impl Server {
    /// Starts `memra-run serve` on a free port (one kernel thread: tests share CI's two
    /// cores) and waits until /health answers.
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// As `start`, with more `serve` options.
    pub fn start_with(options: &[&str]) -> Server {
        Server::serving("smollm2-batch8", options)
    }

    /// As `start_with`, under the plan `plans/NAME.plan.toml`.
    pub fn serving(name: &str, options: &[&str]) -> Server {
        let server = Server(ServeProcess::serving(name, 1, options));
        let (status, body) = server.get("/health");
        assert_eq!((status, body["status"].as_str()), (200, Some("ok")));
        server
    }

    pub fn connect(&self, method: &str, path: &str, body: &str) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", self.0.port)).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        s
    }

    /// Status and body text of one request.
    pub fn raw(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut response = Vec::new();
        self.connect(method, path, body)
            .read_to_end(&mut response)
            .unwrap();
        let response = String::from_utf8(response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        (
            status,
            if chunked {
                dechunk(body)
            } else {
                body.to_owned()
            },
        )
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        let (status, body) = self.raw("GET", path, "");
        (status, serde_json::from_str(&body).unwrap())
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.raw("POST", path, &body.to_string());
        let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        (status, value)
    }

    /// The text of a greedy completion of `prompt`, `n` tokens long.
    pub fn complete(&self, prompt: &str, n: usize) -> String {
        let (status, body) = self.post(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": n, "temperature": 0}),
        );
        assert_eq!(status, 200, "{body}");
        body["choices"][0]["text"].as_str().unwrap().to_owned()
    }

    /// The data lines of a streamed request, `[DONE]` included.
    pub fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let (status, text) = self.raw("POST", path, &body.to_string());
        assert_eq!(status, 200, "{text}");
        text.split("\n\n")
            .filter_map(|event| event.strip_prefix("data: "))
            .map(str::to_owned)
            .collect()
    }

    /// The chunks of a streamed request, parsed, once it is sure the stream ended with
    /// `[DONE]`.
    pub fn chunks(&self, path: &str, body: &Value) -> Vec<Value> {
        let lines = self.stream(path, body);
        assert_eq!(
            lines.last().map(String::as_str),
            Some("[DONE]"),
            "{lines:?}"
        );
        lines[..lines.len() - 1]
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    /// The value of an unlabelled or labelled sample in /metrics.
    pub fn metric(&self, sample: &str) -> f64 {
        let (status, text) = self.raw("GET", "/metrics", "");
        assert_eq!(status, 200);
        text.lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
            .map_or(0.0, |v| v.parse().unwrap())
    }
}

impl Server {
    /// Waits (up to 5 s) until `n` log lines start with `prefix`; fails with the log if
    /// another number do.
    pub fn assert_logged(&self, prefix: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let log = self.0.log.lock().unwrap().clone();
            let count = log.iter().filter(|l| l.starts_with(prefix)).count();
            if count == n {
                return;
            }
            assert!(
                count < n && Instant::now() < deadline,
                "{count} lines `{prefix}`, want {n}:\n{}",
                log.join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The body of a chunked transfer encoding.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
}

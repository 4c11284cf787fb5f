//! Who may use `memra-run serve` and what it refuses before any work, on the CPU backend with
//! the real SmolLM2: the API key, the Host check of a loopback server, the cross-origin
//! policy, the warning of a server open beyond the machine without a key, and prompts too
//! long for the context refused before they are tokenized (no memory spike).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

use common::http::Server;
use common::root;

/// Status, lowercase head and body of one request with `headers` (lines ending in \r\n).
fn send(
    server: &Server,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", server.0.port)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_owned())
}

const BODY: &str = r#"{"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}"#;
const LOCAL: &str = "Host: localhost\r\n";

#[test]
fn with_an_api_key_every_v1_route_needs_it() {
    let server = Server::start_with(&["--api-key", "sk-test"]);
    let bearer = |key: &str| format!("{LOCAL}Authorization: Bearer {key}\r\n");
    for headers in [LOCAL.to_owned(), bearer("sk-tes"), bearer("sk-testx")] {
        let (status, head, body) = send(&server, "POST", "/v1/completions", &headers, BODY);
        assert_eq!(status, 401, "{headers}: {body}");
        assert!(head.contains("www-authenticate: bearer"), "{head}");
        assert!(body.contains("\"code\":\"invalid_api_key\""), "{body}");
    }
    let (status, _, _) = send(&server, "GET", "/v1/models", LOCAL, "");
    assert_eq!(status, 401);
    let (status, _, body) = send(&server, "POST", "/v1/completions", &bearer("sk-test"), BODY);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(" Paris."), "{body}");
    // health and metrics stay open
    assert_eq!(send(&server, "GET", "/health", LOCAL, "").0, 200);
    let unauthorized = "memra_requests_total{endpoint=\"/v1/completions\",status=\"401\"}";
    assert_eq!(server.metric(unauthorized), 3.0);
    server.assert_logged("POST /v1/completions 401 ", 3);
}

#[test]
fn a_loopback_server_refuses_other_hosts_and_foreign_origins() {
    let server = Server::start();
    // a page of evil.example resolved to 127.0.0.1 (DNS rebinding)
    let (status, _, body) = send(
        &server,
        "POST",
        "/v1/completions",
        "Host: evil.example:8080\r\n",
        BODY,
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("host_not_allowed"), "{body}");
    // a cross-origin text/plain POST, which a browser sends without a preflight
    let page = format!("{LOCAL}Origin: http://evil.example\r\nContent-Type: text/plain\r\n");
    let generated = server.metric("memra_generated_tokens_total");
    let (status, _, body) = send(&server, "POST", "/v1/completions", &page, BODY);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("origin_not_allowed"), "{body}");
    assert_eq!(server.metric("memra_generated_tokens_total"), generated);
    let (status, _, _) = send(
        &server,
        "POST",
        "/v1/completions",
        "Host: 127.0.0.1\r\n",
        BODY,
    );
    assert_eq!(status, 200);
}

#[test]
fn an_allowed_origin_gets_its_preflight_and_cors_headers() {
    let server = Server::start_with(&[
        "--allowed-origins",
        "http://app.example,http://other.example",
    ]);
    let page = format!("{LOCAL}Origin: http://app.example\r\n");
    let preflight = format!("{page}Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\n");
    let (status, head, _) = send(&server, "OPTIONS", "/v1/chat/completions", &preflight, "");
    assert_eq!(status, 204, "{head}");
    assert!(
        head.contains("access-control-allow-origin: http://app.example"),
        "{head}"
    );
    assert!(
        head.contains("access-control-allow-headers: authorization, content-type"),
        "{head}"
    );
    let (status, head, body) = send(&server, "POST", "/v1/completions", &page, BODY);
    assert_eq!(status, 200, "{body}");
    assert!(
        head.contains("access-control-allow-origin: http://app.example"),
        "{head}"
    );
    let other = format!("{LOCAL}Origin: http://third.example\r\n");
    assert_eq!(
        send(&server, "POST", "/v1/completions", &other, BODY).0,
        403
    );
}

#[test]
fn prompts_past_the_context_are_refused_before_tokenizing_without_a_memory_spike() {
    let server = Server::start();
    // 16 prompts of 1.9 MB at once: each would take hundreds of MB to tokenize
    let long = format!(r#"{{"prompt": "{}"}}"#, "1".repeat(1_900_000));
    let answers: Vec<(u16, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|_| s.spawn(|| server.raw("POST", "/v1/completions", &long)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (status, body) in &answers {
        assert_eq!(*status, 400, "{body}");
        assert!(body.contains("context_length_exceeded"), "{body}");
        assert!(body.contains("1900000 bytes are at least"), "{body}");
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.0.pid())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(
        peak_kib < 1 << 20,
        "the server's peak RSS was {peak_kib} KiB"
    );
}

#[test]
fn a_server_open_beyond_the_machine_without_a_key_warns() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_memra-run"))
        .current_dir(root())
        .args([
            "serve",
            "plans/smollm2-batch8.plan.toml",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "-t",
            "1",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.map_while(Result::ok) {
        let serving = line.starts_with("serving ");
        seen.push(line);
        if serving {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.iter()
            .any(|l| l.starts_with("warning: listening on 0.0.0.0:")
                && l.contains("without --api-key")),
        "{seen:?}"
    );
}

//! `memra-run serve` from start to stop, on the CPU backend with the real SmolLM2: the
//! documented serve command batches and its start line says how many requests decode at
//! once; SIGTERM during a stream ends it with its last chunk and the process exits 0; a
//! second signal exits at once.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{root, ServeProcess};

/// Opens a streamed completion of up to 1000 tokens and reads until the first text came.
fn streaming(server: &ServeProcess) -> (TcpStream, String) {
    let body =
        r#"{"prompt": "1, 2, 3, 4, 5,", "max_tokens": 1000, "temperature": 0, "stream": true}"#;
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut seen = String::new();
    while !seen.contains("\"text\":\"") {
        let mut chunk = [0u8; 512];
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "the stream ended before any text: {seen}");
        seen.push_str(&String::from_utf8_lossy(&chunk[..n]));
    }
    (s, seen)
}

#[test]
fn the_documented_serve_command_batches_and_its_start_line_says_how_many() {
    for doc in ["README.md", "docs/serving.md"] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        let plans: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split("memra-run serve ").nth(1))
            .filter_map(|rest| rest.split_whitespace().next())
            .collect();
        assert!(!plans.is_empty(), "{doc} shows no serve command");
        for plan in plans {
            let loaded = memra_executor::plan_load::load(&root().join(plan), None).unwrap();
            let slots = loaded.plan.runtime.max_sequences;
            assert!(slots > 1, "{doc} serves {plan}, a plan of {slots} sequence");
        }
    }
    let server = ServeProcess::start_with(1, &["--max-queue", "32"]);
    assert!(
        server.start_line.ends_with(
            ": up to 8 requests decode at once (runtime.max_sequences 8); up to 32 more wait in the queue (--max-queue)"
        ),
        "{}",
        server.start_line
    );
}

#[test]
fn sigterm_during_a_stream_ends_it_with_its_last_chunk_and_exits_0() {
    let mut server = ServeProcess::start_with(1, &["--shutdown-grace", "0.5"]);
    let (mut stream, mut seen) = streaming(&server);
    server.signal(libc::SIGTERM);
    stream.read_to_string(&mut seen).unwrap();
    let data: Vec<&str> = seen
        .split("\n\n")
        .filter_map(|e| e.rsplit_once("data: ").map(|(_, data)| data))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{seen}");
    let last: serde_json::Value = serde_json::from_str(data[data.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
    let generated = last["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..1000).contains(&generated), "{last}");
    let status = server.exit_within(Duration::from_secs(10));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{status:?}");
    // no new connection is taken
    assert!(TcpStream::connect(("127.0.0.1", server.port)).is_err());
    // the log says what happened, the cut request among the rest
    std::thread::sleep(Duration::from_millis(100));
    let log = server.log.lock().unwrap().join("\n");
    assert!(
        log.contains("shutting down: taking no new requests"),
        "{log}"
    );
    assert!(log.contains("POST /v1/completions 200 "), "{log}");
    assert!(
        log.contains("stopped: 1 sequences ended after the signal (1 of them cut at the end of the grace period), 0 queued ones refused"),
        "{log}"
    );
}

#[test]
fn a_second_signal_exits_at_once() {
    let mut server = ServeProcess::start_with(1, &["--shutdown-grace", "60"]);
    let (_stream, _) = streaming(&server);
    server.signal(libc::SIGINT);
    // the first signal alone lets the stream go on
    assert_eq!(server.exit_within(Duration::from_millis(500)), None);
    server.signal(libc::SIGINT);
    let status = server.exit_within(Duration::from_secs(5));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(128 + libc::SIGINT),
        "{status:?}"
    );
}

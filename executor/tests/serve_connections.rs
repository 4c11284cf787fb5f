//! `memra-run serve`'s connections on the CPU backend with the real SmolLM2: an idle one is
//! closed after `--timeout`, and so is one trickling its header a byte at a time, a body shorter than its Content-Length gets a 408, an answer
//! that takes longer than the timeout still comes, and past `--max-connections` a new
//! connection gets a 503 while the others are served.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::http::Server;

fn open(server: &Server) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", server.0.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Everything the server sends until it closes.
fn rest(mut s: TcpStream) -> String {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn an_idle_connection_and_a_short_body_time_out() {
    let server = Server::start_with(&["--timeout", "1"]);
    let started = Instant::now();
    let idle = open(&server);
    assert_eq!(rest(idle), "");
    let waited = started.elapsed();
    assert!(
        (Duration::from_millis(900)..Duration::from_secs(5)).contains(&waited),
        "an idle connection closed after {waited:?}"
    );
    // a header trickled a byte every 200 ms: cut off when the timeout is up in total
    let mut trickle = open(&server);
    trickle
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let started = Instant::now();
    let header = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut closed = None;
    // 50 bytes, one per read that times out: 10 s at most
    for byte in header.iter().cycle().take(50) {
        if trickle.write_all(&[*byte]).is_err() {
            closed = Some(started.elapsed());
            break;
        }
        let mut got = [0u8; 64];
        match trickle.read(&mut got) {
            Ok(0) => {
                closed = Some(started.elapsed());
                break;
            }
            Ok(n) => panic!("answered: {}", String::from_utf8_lossy(&got[..n])),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => {
                closed = Some(started.elapsed());
                break;
            }
        }
    }
    let waited = closed.expect("a header trickled for 10 s was still being read");
    assert!(
        (Duration::from_millis(900)..Duration::from_secs(3)).contains(&waited),
        "a trickled header was cut off after {waited:?}"
    );
    // Content-Length 100, 10 bytes sent: a 408 once the timeout has passed
    let mut short = open(&server);
    write!(
        short,
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{{\"prompt\":"
    )
    .unwrap();
    let answer = rest(short);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(answer.contains("\"code\":\"body_timeout\""), "{answer}");
    server.assert_logged("POST /v1/completions 408 ", 1);
}

#[test]
fn an_answer_slower_than_the_timeout_still_comes_on_a_kept_alive_connection() {
    let server = Server::start_with(&["--timeout", "1"]);
    let body = r#"{"prompt": "1, 2, 3, 4, 5,", "max_tokens": 400, "temperature": 0}"#;
    let mut s = open(&server);
    let started = Instant::now();
    for _ in 0..2 {
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        // read one whole answer: its head, then its content-length of body
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\r\n\r\n") {
            assert_eq!(
                s.read(&mut byte).unwrap(),
                1,
                "{}",
                String::from_utf8_lossy(&got)
            );
            got.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200 "), "{head}");
        // the body: by its content-length, or chunk by chunk
        let mut answer = Vec::new();
        match head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
        {
            Some(length) => {
                answer.resize(length.trim().parse().unwrap(), 0);
                s.read_exact(&mut answer).unwrap();
            }
            None => loop {
                let mut line = Vec::new();
                while !line.ends_with(b"\r\n") {
                    assert_eq!(s.read(&mut byte).unwrap(), 1);
                    line.push(byte[0]);
                }
                let size =
                    usize::from_str_radix(String::from_utf8_lossy(&line).trim(), 16).unwrap();
                let mut chunk = vec![0u8; size + 2];
                s.read_exact(&mut chunk).unwrap();
                if size == 0 {
                    break;
                }
                answer.extend_from_slice(&chunk[..size]);
            },
        }
        let answer = String::from_utf8_lossy(&answer).into_owned();
        assert!(answer.contains("\"completion_tokens\":400"), "{answer}");
    }
    let took = started.elapsed();
    assert!(
        took > Duration::from_secs(1),
        "two answers took only {took:?}: the test proves nothing"
    );
}

#[test]
fn past_the_connection_cap_a_new_connection_gets_a_503() {
    let server = Server::start_with(&["--max-connections", "3"]);
    // three connections kept alive, each sure of its place by an answer on it (a place frees
    // a moment after its connection closes, as the start's health probe's does)
    let held: Vec<TcpStream> = (0..3)
        .map(|_| loop {
            let mut s = open(&server);
            write!(s, "GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
            let mut answer = [0u8; 12];
            s.read_exact(&mut answer).unwrap();
            if &answer == b"HTTP/1.1 200" {
                break s;
            }
            std::thread::sleep(Duration::from_millis(50));
        })
        .collect();
    let mut extra = open(&server);
    write!(extra, "GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let answer = rest(extra);
    let log = server.0.log.lock().unwrap().join("\n");
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}\n{log}");
    assert!(answer.contains("too_many_connections"), "{answer}");
    drop(held);
    // the closed ones free their places
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, _) = server.raw("GET", "/health", "");
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the cap never freed: {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.complete("The capital of France is", 2), " Paris.");
}

//! `memra-run serve` driven over HTTP on the CPU backend with the real SmolLM2: greedy text
//! equals `memra-run generate`, chat, streamed chunks equal the whole body, concurrent
//! requests decode together (the plan's 8 sequence slots) and each equals its one-at-a-time
//! text, a dropped stream frees the engine, every bad request gets its 4xx naming the field
//! and is counted in /metrics (wrong methods and bodies past the limit too), and long prompts
//! being tokenized hold up no other request. A plan with `[speculative]` serves plain
//! decoding's text, alone and together, with prompt-lookup drafts accepted and rejected.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::http::Server;
use common::root;
use serde_json::{json, Value};

const PLAN: &str = "plans/smollm2.plan.toml";

/// `memra-run generate`'s greedy text of `n` tokens after `prompt`.
fn generate(prompt: &str, n: usize) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_memra-run"))
        .current_dir(root())
        .args(["generate", PLAN, "-p", prompt, "-n", &n.to_string()])
        .args(["--temp", "0", "-t", "1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.strip_suffix('\n').unwrap().to_owned()
}

#[test]
fn a_greedy_completion_equals_generate() {
    let server = Server::start();
    let prompt = "The capital of France is";
    let (status, body) = server.post(
        "/v1/completions",
        &json!({"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": prompt, "max_tokens": 6,
                "temperature": 0, "n": 1, "seed": 3}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], generate(prompt, 6));
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["object"], "text_completion");
    let usage = &body["usage"];
    assert_eq!(
        (
            usage["completion_tokens"].as_u64(),
            usage["total_tokens"].as_u64()
        ),
        (Some(6), Some(6 + usage["prompt_tokens"].as_u64().unwrap()))
    );
    let (_, models) = server.get("/v1/models");
    assert_eq!(models["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(models["data"][0]["max_context"], 2048);
    let (status, model) = server.get("/v1/models/SmolLM2-135M-Instruct.Q4_1");
    assert_eq!((status, &model), (200, &models["data"][0]));
    let (status, other) = server.get("/v1/models/gpt-4");
    assert_eq!(
        (status, other["error"]["param"].as_str()),
        (404, Some("model"))
    );
}

#[test]
fn streamed_chunks_concatenate_to_the_whole_text() {
    let server = Server::start();
    let chat = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
                      "max_tokens": 6, "temperature": 0});
    let (status, whole) = server.post("/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{whole}");
    let reply = whole["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!reply.is_empty());
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");

    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let chunks = server.chunks("/v1/chat/completions", &streamed);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, reply);
    let last = chunks.last().unwrap();
    assert_eq!(
        last["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );
    assert_eq!(last["usage"], whole["usage"]);
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    // content as OpenAI's text parts is the same message
    let mut parts = chat.clone();
    parts["messages"][0]["content"] =
        json!([{"type": "text", "text": "What is the capital of France?"}]);
    let (status, same) = server.post("/v1/chat/completions", &parts);
    assert_eq!(status, 200, "{same}");
    assert_eq!(same["choices"], whole["choices"]);
    // OpenAI's newer name for a chat's max_tokens bounds it too
    let mut newer = chat.clone();
    newer["max_tokens"] = json!(null);
    newer["max_completion_tokens"] = json!(2);
    let (status, short) = server.post("/v1/chat/completions", &newer);
    assert_eq!(status, 200, "{short}");
    assert_eq!(short["usage"]["completion_tokens"], 2, "{short}");

    let prompt =
        json!({"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "stream": true});
    let lines = server.stream("/v1/completions", &prompt);
    let text: String = lines[..lines.len() - 1]
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(text, server.complete("Once upon a time", 5));
}

#[test]
fn a_stop_string_ends_the_text_before_it() {
    let server = Server::start();
    let full = server.complete("The capital of France is", 6);
    let (at, _) = full.char_indices().nth(3).unwrap();
    let stop = &full[at..at + 2];
    let (status, body) = server.post(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "stop": [stop]}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], full[..full.find(stop).unwrap()]);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
}

#[test]
fn concurrent_requests_decode_together_and_each_equals_its_text_alone() {
    let server = Server::start();
    let prompts = [
        "The capital of France is",
        "One, two, three,",
        "def add(a, b):",
        "The sky is",
        "Once upon a time",
        "My favourite colour is",
        "import numpy as",
        "Water boils at",
    ];
    let steps = || server.metric("memra_steps_total");
    let before = steps();
    let alone: Vec<String> = prompts.iter().map(|p| server.complete(p, 8)).collect();
    let steps_alone = steps() - before;
    let before = steps();
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(|| server.complete(p, 8)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let steps_together = steps() - before;
    assert_eq!(together, alone);
    // one at a time: a prompt step and a step per generated token each; together they share
    assert!(
        steps_together <= steps_alone / 2.0,
        "8 concurrent requests took {steps_together} steps, alone {steps_alone}"
    );
    assert_eq!(server.metric("memra_kv_slots_total"), 8.0);
}

#[test]
fn a_speculative_plan_serves_plain_decodings_text_with_drafts_accepted_and_rejected() {
    let server = Server::serving("smollm2-batch8-lookup", &[]);
    // text the model copies (lookup drafts its phrases) and text it does not
    let prompts = [
        "Repeat this line: the quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown fox",
        "One, two, three, four, five, six, seven, eight, nine, ten, one, two, three,",
        "The capital of France is",
    ];
    let plain: Vec<String> = prompts.iter().map(|p| generate(p, 24)).collect();
    let alone: Vec<String> = prompts.iter().map(|p| server.complete(p, 24)).collect();
    assert_eq!(alone, plain);
    // one request at a time, plain decoding takes a step per token (the prompt's step gives
    // the first); accepted drafts take none of their own
    let (steps, generated) = (
        server.metric("memra_steps_total"),
        server.metric("memra_generated_tokens_total"),
    );
    assert!(steps < generated, "{steps} steps for {generated} tokens");
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(|| server.complete(p, 24)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, plain);
    let (drafted, accepted) = (
        server.metric("memra_draft_tokens_total"),
        server.metric("memra_draft_tokens_accepted_total"),
    );
    assert!(
        accepted > 0.0 && accepted < drafted,
        "{accepted} of {drafted} drafts accepted: the test wants some of each"
    );
}

#[test]
fn a_dropped_stream_frees_the_engine_for_the_next_request() {
    let server = Server::start();
    let before = server.complete("The sky is", 4);
    let generated = server.metric("memra_generated_tokens_total");
    // counting goes on: SmolLM2 does not end it early (a story prompt ends at once at temperature 0)
    let long =
        json!({"prompt": "1, 2, 3, 4, 5,", "max_tokens": 1000, "temperature": 0, "stream": true});
    let mut stream = server.connect("POST", "/v1/completions", &long.to_string());
    // read until a piece of text came, so the request has generated before it is dropped
    let mut seen = String::new();
    let has_text = |s: &str| s.split("\"text\":\"").skip(1).any(|t| !t.starts_with('"'));
    while !has_text(&seen) {
        let mut chunk = [0u8; 512];
        let n = stream.read(&mut chunk).unwrap();
        assert!(n > 0, "the stream ended before any text: {seen}");
        seen.push_str(&String::from_utf8_lossy(&chunk[..n]));
    }
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    drop(stream);
    assert_eq!(server.complete("The sky is", 4), before);
    let spent = server.metric("memra_generated_tokens_total") - generated;
    assert!(
        spent < 200.0,
        "the dropped stream went on for {spent} tokens"
    );
    let gone = "memra_requests_total{endpoint=\"/v1/completions\",status=\"499\"}";
    assert_eq!(server.metric(gone), 1.0);
    assert_eq!(server.metric("memra_kv_slots_used"), 0.0);
    // its log line counts the tokens it generated before the client went away
    let log = server.0.log.lock().unwrap().clone();
    let line = log
        .iter()
        .find(|l| l.starts_with("POST /v1/completions 499 "))
        .unwrap_or_else(|| panic!("no 499 line:\n{}", log.join("\n")));
    let generated: usize = line
        .split_once("generated=")
        .and_then(|(_, rest)| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no generated count in `{line}`"));
    assert!(generated >= 1, "{line}");
}

#[test]
fn long_prompts_being_tokenized_hold_up_no_other_request() {
    let server = Server::start();
    // Digits are a token each: seconds of tokenizing, each, to refuse them. The server has
    // two HTTP workers; two of these must not leave it deaf meanwhile.
    let long = json!({"prompt": "1".repeat(1_500_000)}).to_string();
    let sent: Vec<TcpStream> = (0..2)
        .map(|_| server.connect("POST", "/v1/completions", &long))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let asked = Instant::now();
    let (status, _) = server.get("/health");
    let waited = asked.elapsed();
    assert_eq!(status, 200);
    assert!(
        waited < Duration::from_secs(1),
        "/health waited {waited:?} behind two long prompts"
    );
    for mut stream in sent {
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(response.contains("context_length_exceeded"), "{response}");
    }
}

#[test]
fn bad_requests_get_4xx_naming_the_field_and_are_counted() {
    let server = Server::start();
    let long_body = json!({"prompt": "word ".repeat(3000)}).to_string();
    let cases: Vec<(&str, &str, u16, Option<&str>)> = vec![
        ("/v1/completions", r#"{"prompt": "x""#, 400, None),
        ("/v1/completions", r#"{"prompt": 7}"#, 400, Some("prompt")),
        (
            "/v1/completions",
            r#"{"prompt": "x", "temperature": "hot"}"#,
            400,
            Some("temperature"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "model": "gpt-4"}"#,
            404,
            Some("model"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "n": 17}"#,
            400,
            Some("n"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "max_tokens": 0}"#,
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "max_tokens": 5000}"#,
            400,
            Some("max_tokens"),
        ),
        ("/v1/completions", long_body.as_str(), 400, Some("prompt")),
        (
            "/v1/completions",
            r#"{"prompt": "x", "stop": {"a": 1}}"#,
            400,
            Some("stop"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": ["x", "y"]}"#,
            400,
            Some("prompt"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": []}"#,
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": 1}]}"#,
            400,
            Some("messages[0].content"),
        ),
    ];
    for (path, body, status, param) in &cases {
        let (got, text) = server.raw("POST", path, body);
        let error: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let error = &error["error"];
        assert_eq!(got, *status, "{body}: {error}");
        assert_eq!(error["param"].as_str(), *param, "{body}: {error}");
        let message = error["message"].as_str().unwrap();
        if let Some(param) = param {
            assert!(message.starts_with(param), "{body}: {message}");
        }
        assert!(
            error["type"].is_string() && error["code"].is_string(),
            "{error}"
        );
    }
    let (status, body) = server.get("/v1/nothing");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    // a route's other methods: a 405 with the Allow header and a JSON body
    let mut response = String::new();
    server
        .connect("GET", "/v1/completions", "")
        .read_to_string(&mut response)
        .unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 405 "), "{response}");
    assert!(head.lines().any(|l| l == "allow: POST"), "{response}");
    let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
    // a body past the limit (2 MiB; one byte more, all of it read): a 413 with a JSON body
    let padding = (2 << 20) + 1 - r#"{"prompt": ""}"#.len();
    let huge = format!(r#"{{"prompt": "{}"}}"#, "a".repeat(padding));
    let (status, text) = server.raw("POST", "/v1/completions", &huge);
    let body: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (413, Some("invalid_body"))
    );
    let count = |path: &str, status: u16| {
        server.metric(&format!(
            "memra_requests_total{{endpoint=\"{path}\",status=\"{status}\"}}"
        ))
    };
    assert_eq!(count("/v1/completions", 400), 9.0);
    assert_eq!(count("/v1/completions", 404), 1.0);
    assert_eq!(count("/v1/completions", 413), 1.0);
    assert_eq!(count("/v1/chat/completions", 400), 2.0);
    assert_eq!(count("other", 405), 1.0);
    server.assert_logged("POST /v1/completions 400 prompt=0 generated=0 ", 9);
    server.assert_logged("GET /v1/nothing 404 ", 1);
    server.assert_logged("GET /v1/completions 405 ", 1);
    // a HEAD is logged as one
    assert_eq!(server.raw("HEAD", "/health", ""), (200, String::new()));
    server.assert_logged("HEAD /health 200 ", 1);
    server.assert_logged("POST /v1/completions 413 ", 1);
    // The server still answers after all of them.
    assert_eq!(server.complete("The capital of France is", 2), " Paris.");
    server.assert_logged("POST /v1/completions 200 prompt=5 generated=2 ttft=", 1);
    // its line gives the time to the first text and the decode rate after it
    let log = server.0.log.lock().unwrap().clone();
    let line = log
        .iter()
        .find(|l| l.starts_with("POST /v1/completions 200 "))
        .unwrap();
    let ttft: f64 = line
        .split_once("ttft=")
        .and_then(|(_, rest)| rest.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(ttft > 0.0 && line.contains(" tok/s "), "{line}");
}

#[test]
fn non_finite_logits_end_the_request_with_an_error() {
    use std::io::{Seek, SeekFrom};
    // SmolLM2 with a NaN scale in the first block of token 0's output row (the tied
    // embedding; q8_0, whose blocks open with their f16 scale): token 0's logit is NaN at
    // every step
    let source = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let at = {
        let file = memra_gguf::GgufFile::open(&source).unwrap();
        let output = file
            .tensor("output.weight")
            .or_else(|| file.tensor("token_embd.weight"))
            .unwrap();
        assert_eq!(output.dtype, memra_gguf::GgmlType::Q8_0);
        file.header_bytes().len() as u64 + output.offset
    };
    let broken = std::env::temp_dir().join(format!("memra-nan-{}.gguf", std::process::id()));
    std::fs::copy(&source, &broken).unwrap();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&broken)
        .unwrap();
    file.seek(SeekFrom::Start(at)).unwrap();
    file.write_all(&0x7e00u16.to_le_bytes()).unwrap();
    drop(file);
    let server = Server::start_with(&["--model", broken.to_str().unwrap()]);
    std::fs::remove_file(&broken).unwrap();
    for sampling in [
        json!({"temperature": 0}),
        json!({"temperature": 0.8, "seed": 1}),
    ] {
        let mut body = json!({"prompt": "The capital of France is", "max_tokens": 4});
        body.as_object_mut()
            .unwrap()
            .extend(sampling.as_object().unwrap().clone());
        let (status, answer) = server.post("/v1/completions", &body);
        assert_eq!(status, 500, "{answer}");
        assert_eq!(answer["error"]["code"], "engine_error", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("logits are not finite"), "{message}");
        // streamed: the error is the stream's last event
        body["stream"] = json!(true);
        let lines = server.stream("/v1/completions", &body);
        let last: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "engine_error", "{lines:?}");
    }
}

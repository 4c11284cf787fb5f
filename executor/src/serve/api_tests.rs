//! The request parser's tests: what is read, and every refusal naming its field.

use super::*;

fn refusal(body: &str, endpoint: Endpoint) -> ApiError {
    parse(body.as_bytes(), endpoint, "m").unwrap_err()
}

#[test]
fn a_full_completion_request_is_read() {
    let body = r#"{"model": "m", "prompt": "Hi", "temperature": 0, "top_p": 0.5,
        "max_tokens": 3, "stop": ["a", "b"], "seed": 9, "n": 1, "stream": true, "user": "x"}"#;
    let r = parse(body.as_bytes(), Endpoint::Completions, "m").unwrap();
    assert_eq!(r.input, Input::Prompt("Hi".into()));
    assert_eq!((r.temperature, r.top_p, r.max_tokens), (0.0, 0.5, Some(3)));
    assert_eq!(
        (r.stop, r.seed, r.stream),
        (vec!["a".into(), "b".into()], Some(9), true)
    );
}

#[test]
fn unimplemented_fields_at_their_neutral_values_are_taken() {
    let body = r#"{"prompt": "x", "echo": false, "suffix": "", "best_of": 1, "logprobs": null,
        "logit_bias": {}, "presence_penalty": 0, "frequency_penalty": 0.0, "tools": [],
        "response_format": {"type": "text"}, "tool_choice": "none", "stream_options": {}}"#;
    let r = parse(body.as_bytes(), Endpoint::Completions, "m").unwrap();
    assert_eq!(r.input, Input::Prompt("x".into()));
    let body = r#"{"messages": [{"role": "user", "content": "x"}], "logprobs": false,
        "top_logprobs": 0}"#;
    assert!(parse(body.as_bytes(), Endpoint::Chat, "m").is_ok());
}

#[test]
fn sampling_extensions_logprobs_choices_and_token_prompts_are_read() {
    let body = r#"{"prompt": [[5, 6]], "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "repetition_penalty": 1.1, "logprobs": 3, "n": 4,
        "stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16"]}"#;
    let r = parse(body.as_bytes(), Endpoint::Completions, "m").unwrap();
    assert_eq!(r.input, Input::Tokens(vec![5, 6]));
    assert_eq!((r.top_k, r.min_p, r.logprobs, r.n), (40, 0.05, Some(3), 4));
    let p = PenaltyConfig {
        presence: 0.5,
        frequency: -0.5,
        repetition: 1.1,
    };
    assert_eq!((r.penalties, r.stop.len()), (p, 16));
    let r = parse(
        br#"{"prompt": ["x"], "top_k": -1}"#,
        Endpoint::Completions,
        "m",
    )
    .unwrap();
    assert_eq!(
        (r.input, r.top_k, r.logprobs),
        (Input::Prompt("x".into()), 0, None)
    );
    let chat = |extra: &str| {
        let body = format!(r#"{{"messages": [{{"role": "user", "content": "x"}}]{extra}}}"#);
        parse(body.as_bytes(), Endpoint::Chat, "m")
            .unwrap()
            .logprobs
    };
    assert_eq!(chat(r#", "logprobs": true"#), Some(0));
    assert_eq!(chat(r#", "logprobs": true, "top_logprobs": 5"#), Some(5));
    assert_eq!(chat(r#", "logprobs": false, "top_logprobs": 0"#), None);
    let format = |f: &str| {
        let body = format!(r#"{{"prompt": "x", "response_format": {f}}}"#);
        parse(body.as_bytes(), Endpoint::Completions, "m")
            .unwrap()
            .format
    };
    assert_eq!(format(r#"{"type": "text"}"#), None);
    assert_eq!(
        format(r#"{"type": "json_object"}"#),
        Some(serde_json::json!({"type": "object"}))
    );
    let schema =
        r#"{"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "integer"}}}"#;
    assert_eq!(format(schema), Some(serde_json::json!({"type": "integer"})));
}

#[test]
fn text_parts_are_a_message_content() {
    let body = r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
        {"type": "text", "text": "b"}]}]}"#;
    let r = parse(body.as_bytes(), Endpoint::Chat, "m").unwrap();
    assert_eq!(
        r.input,
        Input::Chat(vec![ChatMessage::text("user", "a\nb")])
    );
}

#[test]
fn chat_takes_max_completion_tokens_before_max_tokens() {
    let body = r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 9,
        "max_completion_tokens": 3}"#;
    let r = parse(body.as_bytes(), Endpoint::Chat, "m").unwrap();
    assert_eq!(
        (r.max_tokens, r.max_tokens_field),
        (Some(3), "max_completion_tokens")
    );
    let r = parse(
        br#"{"prompt": "x", "max_completion_tokens": 3}"#,
        Endpoint::Completions,
        "m",
    );
    assert_eq!(r.unwrap().max_tokens, None);
}

#[test]
fn integers_past_i64_keep_their_value() {
    let huge = u64::MAX;
    let e = refusal(
        &format!(r#"{{"prompt": "x", "n": {huge}}}"#),
        Endpoint::Completions,
    );
    assert!(e.message.ends_with(&format!("got {huge}")), "{}", e.message);
    let body = format!(r#"{{"prompt": "x", "max_tokens": {huge}, "seed": {huge}}}"#);
    let r = parse(body.as_bytes(), Endpoint::Completions, "m").unwrap();
    assert_eq!((r.max_tokens, r.seed), (Some(usize::MAX), Some(huge)));
    let r = parse(
        br#"{"prompt": "x", "seed": -1}"#,
        Endpoint::Completions,
        "m",
    )
    .unwrap();
    assert_eq!(r.seed, Some(u64::MAX));
}

#[test]
fn every_refusal_names_its_field() {
    let cases = [
        (r#"{"prompt": 5}"#, Some("prompt")),
        (r#"{"prompt": "x", "max_tokens": 0}"#, Some("max_tokens")),
        (r#"{"prompt": "x", "max_tokens": "3"}"#, Some("max_tokens")),
        (r#"{"prompt": "x", "temperature": 3}"#, Some("temperature")),
        (r#"{"prompt": "x", "top_p": 0}"#, Some("top_p")),
        (r#"{"prompt": "x", "n": 17}"#, Some("n")),
        (r#"{"prompt": "x", "stop": [1]}"#, Some("stop")),
        (r#"{"prompt": "x", "stream": "yes"}"#, Some("stream")),
        (r#"{"prompt": "x", "model": "other"}"#, Some("model")),
        (r#"{"messages": []}"#, Some("messages")),
        (
            r#"{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}"#,
            Some("max_completion_tokens"),
        ),
        (
            r#"{"messages": [{"role": "user"}]}"#,
            Some("messages[0].content"),
        ),
        (
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
            Some("messages[0].content[0].type"),
        ),
        (
            r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}"#,
            Some("messages[0].content[0].text"),
        ),
        (r#"{"prompt": ["x", "y"]}"#, Some("prompt")),
        (r#"{"prompt": [1, -2]}"#, Some("prompt[1]")),
        (r#"{"prompt": []}"#, Some("prompt")),
        (r#"{"prompt": "x", "top_k": -2}"#, Some("top_k")),
        (r#"{"prompt": "x", "min_p": 1.5}"#, Some("min_p")),
        (
            r#"{"prompt": "x", "repetition_penalty": 0}"#,
            Some("repetition_penalty"),
        ),
        (
            r#"{"prompt": "x", "top_logprobs": 2}"#,
            Some("top_logprobs"),
        ),
        (r#"{"prompt": "x", "ignore_eos": true}"#, Some("ignore_eos")),
        (r#"{"prompt": "x", "guided_json": {}}"#, Some("guided_json")),
        (
            r#"{"prompt": "x", "stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]}"#,
            Some("stop"),
        ),
        (r#"{"prompt": "x", "echo": true}"#, Some("echo")),
        (r#"{"prompt": "x", "logprobs": 21}"#, Some("logprobs")),
        (r#"{"prompt": "x", "best_of": 3}"#, Some("best_of")),
        (r#"{"prompt": "x", "suffix": "y"}"#, Some("suffix")),
        (
            r#"{"prompt": "x", "logit_bias": {"50256": -100}}"#,
            Some("logit_bias"),
        ),
        (
            r#"{"prompt": "x", "presence_penalty": 2.5}"#,
            Some("presence_penalty"),
        ),
        (
            r#"{"messages": [{"role": "user", "content": "x"}], "frequency_penalty": -3}"#,
            Some("frequency_penalty"),
        ),
        (
            r#"{"messages": [{"role": "user", "content": "x"}], "logprobs": 1}"#,
            Some("logprobs"),
        ),
        (
            r#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}"#,
            Some("top_logprobs"),
        ),
        (
            r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}"#,
            Some("tools[0].function"),
        ),
        (
            r#"{"prompt": "x", "tools": [{"type": "function"}]}"#,
            Some("tools"),
        ),
        (
            r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}"#,
            Some("response_format.type"),
        ),
        (
            r#"{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}"#,
            Some("response_format.json_schema.schema"),
        ),
        (
            r#"{"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}}"#,
            Some("stream_options.include_usage"),
        ),
        (
            r#"{"prompt": "x", "stream_options": []}"#,
            Some("stream_options"),
        ),
        (r#"{"prompt": "x""#, None),
        (r#"[1]"#, None),
    ];
    for (body, param) in cases {
        // a body with messages goes to chat completions, any other to completions
        let endpoint = if body.contains(r#""messages""#) {
            Endpoint::Chat
        } else {
            Endpoint::Completions
        };
        let e = refusal(body, endpoint);
        assert_eq!(e.param.as_deref(), param, "{body}: {}", e.message);
        assert!(e.status.is_client_error(), "{body}");
        if let Some(p) = param {
            assert!(e.message.starts_with(p), "{body}: {}", e.message);
        }
    }
}

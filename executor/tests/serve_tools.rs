//! `memra-run serve`'s chat tools over HTTP on the CPU backend with the real SmolLM2, whose
//! chat template renders no tools (the server's JSON convention shows them): `tool_choice`
//! `"required"` and a named function give calls of the functions with arguments that follow
//! their schemas, whole or streamed as `tool_calls` deltas; `"auto"` streams what it
//! answers whole; a conversation carrying a call and its result is answered.

mod common;

use common::http::Server;
use serde_json::{json, Value};

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": false}}})
}

fn clock() -> Value {
    json!({"type": "function", "function": {"name": "get_time",
        "description": "The time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
            "required": ["zone"], "additionalProperties": false}}})
}

fn ask(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [weather(), clock()], "max_tokens": 80, "temperature": 0});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// Fails unless `call` is a call of `get_weather` whose arguments follow its schema.
fn assert_weather_call(call: &Value) {
    assert_eq!(call["type"], "function", "{call}");
    assert!(call["id"].as_str().unwrap().starts_with("call-"), "{call}");
    assert_eq!(call["function"]["name"], "get_weather", "{call}");
    let text = call["function"]["arguments"].as_str().unwrap();
    let arguments: serde_json::Map<String, Value> = serde_json::from_str(text).unwrap();
    let (city, unit) = (&arguments["city"], &arguments["unit"]);
    assert_eq!(arguments.len(), 2, "{text}");
    assert!(city.as_str().unwrap().chars().count() <= 20, "{text}");
    assert!(unit == "celsius" || unit == "fahrenheit", "{text}");
}

#[test]
fn a_required_or_named_tool_choice_gives_calls_that_follow_the_schemas() {
    let server = Server::start();
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for extra in [
        json!({"tool_choice": "required"}),
        json!({"tool_choice": named, "temperature": 1.0, "seed": 5, "n": 2}),
    ] {
        let (status, answer) = server.post("/v1/chat/completions", &ask(extra.clone()));
        assert_eq!(status, 200, "{answer}");
        for choice in answer["choices"].as_array().unwrap() {
            assert_eq!(choice["finish_reason"], "tool_calls", "{extra}: {choice}");
            let message = &choice["message"];
            assert_eq!(message["content"], Value::Null, "{message}");
            let calls = message["tool_calls"].as_array().unwrap();
            assert!(!calls.is_empty(), "{message}");
            if extra["tool_choice"] == named {
                assert_eq!(calls.len(), 1, "{message}");
                assert_weather_call(&calls[0]);
            }
            for call in calls {
                let name = call["function"]["name"].as_str().unwrap();
                assert!(["get_weather", "get_time"].contains(&name), "{call}");
            }
        }
    }
    // streamed: the calls come in a tool_calls delta, then the finish reason
    let body = ask(json!({"tool_choice": named, "stream": true}));
    let chunks = server.chunks("/v1/chat/completions", &body);
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    assert!(
        deltas
            .iter()
            .all(|d| d["content"].as_str().unwrap_or("").is_empty()),
        "{chunks:?}"
    );
    let calls: Vec<&Value> = deltas
        .iter()
        .filter_map(|d| d["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(calls.len(), 1, "{chunks:?}");
    assert_eq!(calls[0]["index"], 0, "{chunks:?}");
    assert_weather_call(calls[0]);
    let finish = &chunks.last().unwrap()["choices"][0]["finish_reason"];
    assert_eq!(finish, "tool_calls", "{chunks:?}");
    // the same call as the whole answer
    let (_, whole) = server.post("/v1/chat/completions", &ask(json!({"tool_choice": named})));
    let call = &whole["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(&calls[0]["function"], call, "{whole}");
}

#[test]
fn auto_streams_what_it_answers_whole_and_a_tool_result_is_answered() {
    let server = Server::start();
    let (status, whole) = server.post("/v1/chat/completions", &ask(json!({})));
    assert_eq!(status, 200, "{whole}");
    let message = &whole["choices"][0]["message"];
    let chunks = server.chunks("/v1/chat/completions", &ask(json!({"stream": true})));
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let calls: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .map(|c| c["function"].clone())
        .collect();
    let whole_calls: Vec<Value> = message["tool_calls"].as_array().map_or(Vec::new(), |c| {
        c.iter().map(|c| c["function"].clone()).collect()
    });
    assert_eq!(calls, whole_calls, "{chunks:?}\n{whole}");
    assert_eq!(
        content,
        message["content"].as_str().unwrap_or(""),
        "{whole}"
    );
    let finish = &chunks.last().unwrap()["choices"][0]["finish_reason"];
    assert_eq!(finish, &whole["choices"][0]["finish_reason"], "{chunks:?}");
    // a conversation that carries a call and its result, answered in text
    let body = json!({"messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call-1",
                "type": "function", "function": {"name": "get_weather",
                "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": "call-1", "content": "21 degrees, sunny"}],
        "tools": [weather()], "tool_choice": "none", "max_tokens": 30, "temperature": 0});
    let (status, answer) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{answer}");
    let choice = &answer["choices"][0];
    assert!(choice["message"]["tool_calls"].is_null(), "{answer}");
    assert!(
        !choice["message"]["content"].as_str().unwrap().is_empty(),
        "{answer}"
    );
    // tools belong to chat
    let (status, error) = server.post(
        "/v1/completions",
        &json!({"prompt": "x", "tools": [weather()]}),
    );
    assert_eq!(
        (status, error["error"]["param"].as_str()),
        (400, Some("tools")),
        "{error}"
    );
}

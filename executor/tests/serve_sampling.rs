//! `memra-run serve`'s sampling fields over HTTP on the CPU backend with the real SmolLM2:
//! top-k, min-p and the penalties (each request's text repeats, and equals its text alone
//! when it decodes beside others), logprobs on both endpoints, `n` choices, prompts as token
//! ids, more than 4 stop strings, `response_format` holding the answer to a JSON schema.

mod common;

use common::http::Server;
use common::smollm2;
use memra_executor::text::Tokenizer;
use serde_json::{json, Value};

const PROMPT: &str = "1, 2, 3, 4, 5,";
/// Each penalty changes the greedy text of this prompt within 16 tokens.
const FRANCE: &str = "The capital of France is";

fn completion(server: &Server, body: Value) -> Value {
    let (status, body) = server.post("/v1/completions", &body);
    assert_eq!(status, 200, "{body}");
    body
}

fn text(body: &Value, i: usize) -> String {
    body["choices"][i]["text"].as_str().unwrap().to_owned()
}

#[test]
fn truncations_and_penalties_shape_the_text_and_each_text_repeats_in_company() {
    let server = Server::start();
    let ask = |extra: Value| {
        let mut body = json!({"prompt": FRANCE, "max_tokens": 16, "temperature": 0});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        text(&completion(&server, body), 0)
    };
    let greedy = ask(json!({}));
    // top-k 1 and min-p 1 keep the best token alone, whatever the temperature
    assert_eq!(
        ask(json!({"temperature": 1.5, "top_k": 1, "seed": 1})),
        greedy
    );
    assert_eq!(
        ask(json!({"temperature": 1.5, "min_p": 1.0, "seed": 1})),
        greedy
    );
    // the neutral penalties change nothing; real ones change the counting
    let neutral = json!({"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1});
    assert_eq!(ask(neutral), greedy);
    for penalty in [
        json!({"presence_penalty": 2}),
        json!({"frequency_penalty": 2}),
        json!({"repetition_penalty": 2}),
    ] {
        assert_ne!(ask(penalty.clone()), greedy, "{penalty}");
    }
    // sampled with every field at once: the same text alone twice and beside 3 others
    let mixed = |seed: u64| {
        json!({"prompt": PROMPT, "max_tokens": 12, "temperature": 0.9, "top_k": 40,
               "top_p": 0.95, "min_p": 0.02, "presence_penalty": 0.4, "frequency_penalty": 0.3,
               "repetition_penalty": 1.2, "seed": seed})
    };
    let alone: Vec<String> = (0..4)
        .map(|seed| text(&completion(&server, mixed(seed)), 0))
        .collect();
    assert_eq!(text(&completion(&server, mixed(0)), 0), alone[0]);
    let server = &server;
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|seed| s.spawn(move || text(&completion(server, mixed(seed)), 0)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
}

#[test]
fn logprobs_come_with_each_token_on_both_endpoints() {
    let server = Server::start();
    let body = completion(
        &server,
        json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0,
               "logprobs": 3}),
    );
    let lp = &body["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), 4, "{lp}");
    assert_eq!(tokens.concat(), text(&body, 0));
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 3, "{lp}");
        // greedy: the token is the best one, and its logprob the largest
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let own = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(own <= 0.0 && own == best, "{lp}");
        assert_eq!(top[tokens[i]].as_f64(), Some(own), "{lp}");
    }
    // chat, streamed: every content chunk carries its tokens' entries
    let chat = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
                      "max_tokens": 5, "temperature": 0, "logprobs": true, "top_logprobs": 2,
                      "stream": true});
    let lines = server.stream("/v1/chat/completions", &chat);
    let mut entries = Vec::new();
    let mut content = String::new();
    for line in &lines[..lines.len() - 1] {
        let chunk: Value = serde_json::from_str(line).unwrap();
        let choice = &chunk["choices"][0];
        if let Some(t) = choice["delta"]["content"].as_str() {
            content.push_str(t);
        }
        if let Some(list) = choice["logprobs"]["content"].as_array() {
            entries.extend(list.iter().cloned());
        }
    }
    assert_eq!(entries.len(), 5, "{lines:?}");
    let spelled: String = entries
        .iter()
        .map(|e| e["token"].as_str().unwrap())
        .collect();
    assert_eq!(spelled, content);
    for e in &entries {
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2, "{e}");
        assert_eq!(e["top_logprobs"][0]["logprob"], e["logprob"], "{e}");
        let bytes: Vec<u8> = e["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(bytes, e["token"].as_str().unwrap().as_bytes());
    }
}

#[test]
fn n_choices_each_draw_from_their_own_seed() {
    let server = Server::start();
    let ask = |n: usize, seed: u64| {
        completion(
            &server,
            json!({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0,
                   "seed": seed, "n": n}),
        )
    };
    let three = ask(3, 5);
    let choices = three["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let mut completion_tokens = 0;
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        let alone = ask(1, 5 + i as u64);
        assert_eq!(choice["text"], alone["choices"][0]["text"], "choice {i}");
        completion_tokens += alone["usage"]["completion_tokens"].as_u64().unwrap();
    }
    assert_eq!(three["usage"]["completion_tokens"], completion_tokens);
    assert_eq!(
        three["usage"]["prompt_tokens"],
        ask(1, 5)["usage"]["prompt_tokens"]
    );
    // streamed: each choice's chunks join to its text, and one [DONE] ends them all
    let lines = server.stream(
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0, "seed": 5,
                "n": 3, "stream": true}),
    );
    assert_eq!(lines.last().map(String::as_str), Some("[DONE]"));
    let mut texts = vec![String::new(); 3];
    let mut finished = 0;
    for line in &lines[..lines.len() - 1] {
        let chunk: Value = serde_json::from_str(line).unwrap();
        let choice = &chunk["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        texts[i].push_str(choice["text"].as_str().unwrap());
        finished += usize::from(!choice["finish_reason"].is_null());
    }
    assert_eq!(finished, 3);
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(t, &text(&three, i));
    }
}

#[test]
fn a_prompt_of_token_ids_equals_its_text_and_sixteen_stops_are_taken() {
    let server = Server::start();
    let plan = smollm2("smollm2-batch8");
    let tokenizer = Tokenizer::from_gguf(plan.gguf().unwrap()).unwrap();
    let prompt = "The capital of France is";
    let ids = tokenizer.encode(prompt, true).unwrap();
    let by_text = completion(
        &server,
        json!({"prompt": prompt, "max_tokens": 6, "temperature": 0}),
    );
    for tokens in [json!(ids), json!([ids])] {
        let by_ids = completion(
            &server,
            json!({"prompt": tokens, "max_tokens": 6, "temperature": 0}),
        );
        assert_eq!(by_ids["choices"], by_text["choices"]);
    }
    let vocab = tokenizer.vocab_size();
    let (status, body) = server.post(
        "/v1/completions",
        &json!({"prompt": [1, vocab], "max_tokens": 2}),
    );
    assert_eq!(
        (status, body["error"]["param"].as_str()),
        (400, Some("prompt[1]"))
    );
    // 16 stop strings, the last of them in the text
    let full = text(&by_text, 0);
    let mut stops: Vec<String> = (0..15).map(|i| format!("never{i}")).collect();
    stops.push(full[2..4].to_owned());
    let stopped = completion(
        &server,
        json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "stop": stops}),
    );
    assert_eq!(text(&stopped, 0), full[..2]);
}

#[test]
fn response_format_constrains_the_answer_to_its_schema() {
    let server = Server::start();
    let schema = json!({"type": "object", "properties": {
        "capital": {"type": "string", "maxLength": 16},
        "country": {"type": "string", "maxLength": 16}},
        "required": ["capital", "country"], "additionalProperties": false});
    let format = json!({"type": "json_schema", "json_schema": {"name": "city", "schema": schema}});
    for sampling in [
        json!({"temperature": 0}),
        json!({"temperature": 1.0, "seed": 3, "n": 2}),
    ] {
        let mut body = json!({"messages": [{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
                              "max_tokens": 60, "response_format": format});
        body.as_object_mut()
            .unwrap()
            .extend(sampling.as_object().unwrap().clone());
        let (status, answer) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{answer}");
        for choice in answer["choices"].as_array().unwrap() {
            let content = choice["message"]["content"].as_str().unwrap();
            assert_eq!(choice["finish_reason"], "stop", "{content}");
            let value: Value =
                serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content}"));
            assert!(
                value["capital"]
                    .as_str()
                    .is_some_and(|c| c.chars().count() <= 16),
                "{value}"
            );
            assert!(
                value["country"]
                    .as_str()
                    .is_some_and(|c| c.chars().count() <= 16),
                "{value}"
            );
            assert_eq!(value.as_object().unwrap().len(), 2, "{value}");
        }
    }
    // any JSON object, streamed, on a completion
    let lines = server.stream(
        "/v1/completions",
        &json!({"prompt": "A JSON object describing Paris:", "max_tokens": 80, "temperature": 0,
                "response_format": {"type": "json_object"}, "stream": true}),
    );
    let mut text = String::new();
    let mut finish = Value::Null;
    for line in &lines[..lines.len() - 1] {
        let chunk: Value = serde_json::from_str(line).unwrap();
        text.push_str(chunk["choices"][0]["text"].as_str().unwrap());
        if !chunk["choices"][0]["finish_reason"].is_null() {
            finish = chunk["choices"][0]["finish_reason"].clone();
        }
    }
    assert!(text.trim_start().starts_with('{'), "{text}");
    if finish == "stop" {
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(value.is_object(), "{text}");
    }
    // a schema llguidance cannot follow is refused naming the field
    let (status, error) = server.post(
        "/v1/completions",
        &json!({"prompt": "x", "response_format": {"type": "json_schema",
                "json_schema": {"schema": {"type": "no-such-type"}}}}),
    );
    assert_eq!(
        (status, error["error"]["param"].as_str()),
        (400, Some("response_format")),
        "{error}"
    );
}

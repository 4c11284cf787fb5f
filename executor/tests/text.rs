//! The text layer against real data: SmolLM2-135M-Instruct's GGUF and llama.cpp's token ids for
//! it (`testdata/tokenize.json`, produced by `llama-tokenize`). The ids must match exactly,
//! decoding must give the text back, and streamed decoding must agree with whole decoding.

use std::path::PathBuf;

use memra_executor::text::{ChatTemplate, Message, Tokenizer};
use memra_gguf::GgufFile;
use serde_json::Value;

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The real model file; missing is a failure that says how to get it, never a skip.
fn model() -> GgufFile {
    let path = root().join("models").join(MODEL);
    assert!(
        path.exists(),
        "{} is missing; run scripts/fetch-model.sh to download it",
        path.display()
    );
    GgufFile::open(&path).expect("opening the SmolLM2 GGUF")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|id| u32::try_from(id.as_u64().expect("an id")).expect("an id that fits u32"))
        .collect()
}

/// Text rebuilt by feeding `ids` one at a time through the streaming decoder.
fn streamed(tok: &Tokenizer, ids: &[u32]) -> String {
    let mut stream = tok.stream_decoder();
    let mut out = String::new();
    for &id in ids {
        if let Some(piece) = stream.push(id).expect("stream decoding") {
            out.push_str(&piece);
        }
    }
    out
}

#[test]
fn encode_matches_llama_cpp_and_decode_round_trips() {
    let tok = Tokenizer::from_gguf(&model()).expect("building the tokenizer");
    let path = root().join("testdata/tokenize.json");
    let data: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("reading tokenize.json"))
            .expect("parsing tokenize.json");
    let cases = data["cases"].as_array().expect("`cases` is an array");
    assert!(!cases.is_empty());
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().expect("case name");
        let text = case["text"].as_str().expect("case text");
        let want = ids(&case["ids"]);
        let want_no_bos = ids(&case["ids_no_bos"]);
        let got = tok.encode(text, true).expect("encoding");
        let got_no_special = tok.encode(text, false).expect("encoding");
        if got != want {
            failures.push(format!(
                "{name}: encode {text:?}\n  got  {got:?}\n  want {want:?}"
            ));
        }
        if got_no_special != want_no_bos {
            failures.push(format!(
                "{name}: encode without BOS {text:?}\n  got  {got_no_special:?}\n  want {want_no_bos:?}"
            ));
        }
        if let Some(tokens) = case["tokens"].as_array() {
            let got: Vec<String> = want.iter().map(|&id| tok.token_text(id).unwrap()).collect();
            let want: Vec<&str> = tokens.iter().map(|t| t.as_str().unwrap()).collect();
            if got != want {
                failures.push(format!(
                    "{name}: token texts\n  got  {got:?}\n  want {want:?}"
                ));
            }
        }
        let decoded = tok.decode(&want_no_bos).expect("decoding");
        if decoded != text {
            failures.push(format!("{name}: decode gave {decoded:?}, want {text:?}"));
        }
        let stream = streamed(&tok, &want_no_bos);
        if stream != text {
            failures.push(format!(
                "{name}: streamed decode gave {stream:?}, want {text:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from llama.cpp:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn special_tokens_and_end_of_generation() {
    let tok = Tokenizer::from_gguf(&model()).expect("building the tokenizer");
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    // llama.cpp's EOG set for this vocabulary: <|endoftext|>, <|im_end|>, <reponame>
    assert_eq!(tok.eog_ids().collect::<Vec<_>>(), [0, 2, 4]);
    assert!(!tok.is_eog(1));
    // add_bos_token is false in this GGUF, so add_special adds nothing
    assert_eq!(
        tok.encode("Hi", true).unwrap(),
        tok.encode("Hi", false).unwrap()
    );
}

#[test]
fn smollm2_chat_template_renders_and_tokenizes() {
    let file = model();
    let tok = Tokenizer::from_gguf(&file).expect("building the tokenizer");
    let chat = ChatTemplate::from_gguf(&file, &tok).expect("loading the chat template");

    let single = chat.render(&[Message::new("user", "Hi")], true).unwrap();
    assert_eq!(
        single,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );

    let multi = [
        Message::new("system", "Be brief."),
        Message::new("user", "What is 2+2?"),
        Message::new("assistant", "4"),
        Message::new("user", "And 3+3?"),
    ];
    let text = chat.render(&multi, true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode(&text, true).unwrap();
    assert_eq!(ids[0], 1, "<|im_start|> is one token");
    assert_eq!(ids.iter().filter(|&&id| id == 1).count(), 5);
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 4);
    assert_eq!(tok.decode(&ids).unwrap(), text);
}

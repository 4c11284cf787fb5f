//! The tools' tests: what a request's tools read as and every refusal naming its field, how
//! a template is probed, the convention's prompt, and the grammars of a call.

use std::sync::Arc;

use llguidance::toktrie::{ApproximateTokEnv, TokEnv};
use llguidance::{Matcher, ParserFactory};

use super::*;
use crate::serve::api::{parse, Endpoint};
use crate::serve::messages::ToolCall;

const WEATHER: &str = r#"{"type": "function", "function": {"name": "get_weather",
    "description": "The weather in a city", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}, "required": ["city"]}}}"#;

fn chat(extra: &str) -> String {
    format!(r#"{{"messages": [{{"role": "user", "content": "x"}}]{extra}}}"#)
}

fn tools_of(extra: &str) -> Option<ToolSet> {
    parse(chat(extra).as_bytes(), Endpoint::Chat, "m")
        .unwrap_or_else(|e| panic!("{extra}: {}", e.message))
        .tools
}

#[test]
fn tools_and_tool_choice_are_read() {
    let set = tools_of(&format!(r#", "tools": [{WEATHER}]"#)).unwrap();
    assert_eq!(set.choice, Choice::Auto);
    assert_eq!(set.functions[0].name, "get_weather");
    assert!(set.parallel);
    let named = format!(
        r#", "tools": [{WEATHER}], "parallel_tool_calls": false,
        "tool_choice": {{"type": "function", "function": {{"name": "get_weather"}}}}"#
    );
    assert_eq!(
        tools_of(&named).unwrap().choice,
        Choice::Function("get_weather".into())
    );
    assert_eq!(
        tools_of(&format!(r#", "tools": [{WEATHER}], "tool_choice": "none""#)),
        None
    );
    assert_eq!(tools_of(r#", "tools": [], "tool_choice": "none""#), None);
    // without parameters a function takes an empty object
    let bare = r#", "tools": [{"type": "function", "function": {"name": "now"}}], "tool_choice": "required""#;
    assert_eq!(
        tools_of(bare).unwrap().functions[0].parameters,
        json!({"type": "object", "properties": {}})
    );
}

#[test]
fn bad_tools_are_refused_naming_the_field() {
    let cases = [
        (r#", "tools": {}"#.to_owned(), "tools"),
        (r#", "tools": [3]"#.to_owned(), "tools[0]"),
        (
            r#", "tools": [{"type": "code"}]"#.to_owned(),
            "tools[0].type",
        ),
        (
            r#", "tools": [{"type": "function", "function": {"name": "a b"}}]"#.to_owned(),
            "tools[0].function.name",
        ),
        (
            r#", "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]"#
                .to_owned(),
            "tools[0].function.parameters",
        ),
        (
            format!(r#", "tools": [{WEATHER}, {WEATHER}]"#),
            "tools[1].function.name",
        ),
        (
            format!(r#", "tools": [{WEATHER}], "tool_choice": "any""#),
            "tool_choice",
        ),
        (
            format!(
                r#", "tools": [{WEATHER}], "tool_choice": {{"type": "function", "function": {{"name": "f"}}}}"#
            ),
            "tool_choice",
        ),
        (r#", "tool_choice": "required""#.to_owned(), "tool_choice"),
        (
            format!(r#", "tools": [{WEATHER}], "parallel_tool_calls": false"#),
            "parallel_tool_calls",
        ),
        (
            r#", "tools": [{"type": "function", "function": {"name": "f", "strict": true}}]"#
                .to_owned(),
            "tools[0].function.strict",
        ),
        (
            format!(r#", "tools": [{WEATHER}], "logprobs": true"#),
            "logprobs",
        ),
        (
            format!(r#", "tools": [{WEATHER}], "response_format": {{"type": "json_object"}}"#),
            "response_format",
        ),
    ];
    for (extra, field) in cases {
        let e = parse(chat(&extra).as_bytes(), Endpoint::Chat, "m").unwrap_err();
        assert_eq!(e.param.as_deref(), Some(field), "{extra}: {}", e.message);
        assert!(e.message.starts_with(field), "{extra}: {}", e.message);
    }
}

#[test]
fn assistant_tool_calls_and_tool_results_are_read_and_bad_ones_refused() {
    let body = r#"{"messages": [{"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}"#;
    let r = parse(body.as_bytes(), Endpoint::Chat, "m").unwrap();
    let crate::serve::api::Input::Chat(messages) = r.input else {
        panic!("not a chat")
    };
    assert_eq!(
        messages[1].tool_calls,
        vec![ToolCall {
            id: "c1".into(),
            name: "get_weather".into(),
            arguments: "{\"city\": \"Paris\"}".into()
        }]
    );
    assert_eq!(messages[2].tool_call_id.as_deref(), Some("c1"));
    for (message, field) in [
        (
            r#"{"role": "tool", "content": "x"}"#,
            "messages[0].tool_call_id",
        ),
        (r#"{"role": "assistant"}"#, "messages[0].content"),
        (
            r#"{"role": "user", "content": "x", "tool_calls": []}"#,
            "messages[0].tool_calls",
        ),
        (
            r#"{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "[1]"}}]}"#,
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            r#"{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}"#,
            "messages[0].tool_calls[0].id",
        ),
    ] {
        let body = format!(r#"{{"messages": [{message}]}}"#);
        let e = parse(body.as_bytes(), Endpoint::Chat, "m").unwrap_err();
        assert_eq!(e.param.as_deref(), Some(field), "{message}: {}", e.message);
        assert!(e.message.starts_with(field), "{message}: {}", e.message);
    }
}

/// A template of Hermes' form: the tools in a system turn, calls in `<tool_call>` tags.
const TAGGED: &str = "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t.function | tojson }}{% endfor %}</tools>\nAnswer with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

#[test]
fn a_template_is_probed_for_how_it_takes_tools() {
    assert_eq!(
        ToolStyle::of(&ChatTemplate::chatml()),
        ToolStyle::Convention
    );
    let tagged = ChatTemplate::new(TAGGED, "", "<|im_end|>").unwrap();
    assert_eq!(ToolStyle::of(&tagged), ToolStyle::Tagged);
    let foreign = ChatTemplate::new(
        "{% for t in tools %}{{ t.function.name }}{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}",
        "",
        "",
    )
    .unwrap();
    assert_eq!(ToolStyle::of(&foreign), ToolStyle::Foreign);
}

/// The conversation of a call and its result.
fn called() -> Vec<ChatMessage> {
    let mut call = ChatMessage::text("assistant", "");
    call.content = None;
    call.tool_calls = vec![ToolCall {
        id: "c1".into(),
        name: "get_weather".into(),
        arguments: r#"{"city":"Paris"}"#.into(),
    }];
    let mut result = ChatMessage::text("tool", "sunny");
    result.tool_call_id = Some("c1".into());
    vec![ChatMessage::text("user", "Weather in Paris?"), call, result]
}

#[test]
fn a_template_without_tools_gets_the_convention_and_one_with_them_renders_them() {
    let set = tools_of(&format!(
        r#", "tools": [{WEATHER}], "tool_choice": "required""#
    ))
    .unwrap();
    let text = render(
        &ChatTemplate::chatml(),
        ToolStyle::Convention,
        &called(),
        Some(&set),
    )
    .unwrap();
    let want = r#"<|im_start|>system
You can call functions. Each one is given as a JSON object with its name, what it does and its parameters (a JSON schema):
{"name":"get_weather","description":"The weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}
Reply by calling functions, with only a JSON object of this form and nothing else:
{"tool_calls": [{"name": "<function name>", "arguments": {<its arguments>}}]}<|im_end|>
<|im_start|>user
Weather in Paris?<|im_end|>
<|im_start|>assistant
{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}<|im_end|>
<|im_start|>user
The function get_weather returned (call c1):
sunny<|im_end|>
<|im_start|>assistant
"#;
    assert_eq!(text, want);
    let tagged = ChatTemplate::new(TAGGED, "", "<|im_end|>").unwrap();
    let text = render(&tagged, ToolStyle::Tagged, &called(), Some(&set)).unwrap();
    assert!(
        text.starts_with("<|im_start|>system\n<tools>{\"description\": \"The weather in a city\", \"name\": \"get_weather\""),
        "{text}"
    );
    assert!(
        text.contains("<tool_call>{\"arguments\": {\"city\": \"Paris\"}, \"name\": \"get_weather\"}</tool_call>"),
        "{text}"
    );
}

/// Whether `grammar` takes `text` whole, over a vocabulary of one token per byte.
fn takes(grammar: TopLevelGrammar, text: &str) -> bool {
    let env: TokEnv = Arc::new(ApproximateTokEnv::single_byte());
    let factory = ParserFactory::new_simple(&env).unwrap();
    let mut matcher = Matcher::new(factory.create_parser(grammar));
    let tokens: Vec<u32> = text.bytes().map(u32::from).collect();
    matcher.validate_tokens(&tokens).unwrap() == tokens.len()
        && matcher.consume_tokens(&tokens).is_ok()
        && matcher.is_accepting().unwrap()
}

#[test]
fn the_grammar_of_a_call_holds_its_name_and_arguments() {
    let required = tools_of(&format!(
        r#", "tools": [{WEATHER}], "tool_choice": "required""#
    ))
    .unwrap();
    let json = |text: &str| takes(required.grammar(Form::Json).unwrap(), text);
    assert!(json(
        r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome"}}]}"#
    ));
    assert!(json(
        r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]}"#
    ));
    assert!(!json(
        r#"{"tool_calls": [{"name": "get_time", "arguments": {}}]}"#
    ));
    assert!(!json(
        r#"{"tool_calls": [{"name": "get_weather", "arguments": {"town": "Rome"}}]}"#
    ));
    // a parameter the schema does not name, though it leaves additionalProperties out
    assert!(!json(
        r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome", "country": "Italy"}}]}"#
    ));
    // one space after `,` and `:`, no other
    assert!(!json(
        "{\"tool_calls\": [{\"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Rome\"}}]}"
    ));
    assert!(!json(r#"{"tool_calls": []}"#));
    let tagged = |text: &str| takes(required.grammar(Form::Tagged).unwrap(), text);
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
    assert!(tagged(call));
    assert!(tagged(&format!("{call}\n{call}")));
    assert!(!tagged("Sure! <tool_call>"));
    // a named function, or parallel_tool_calls false: one call
    let one = tools_of(&format!(
        r#", "tools": [{WEATHER}], "tool_choice": {{"type": "function", "function": {{"name": "get_weather"}}}}"#
    ))
    .unwrap();
    assert!(!takes(
        one.grammar(Form::Tagged).unwrap(),
        &format!("{call}\n{call}")
    ));
    assert!(takes(one.grammar(Form::Tagged).unwrap(), call));
    let auto = tools_of(&format!(r#", "tools": [{WEATHER}]"#)).unwrap();
    assert!(auto.grammar(Form::Json).is_none());
}

"""Real clients against a running `memra-run serve` with SmolLM2 (scripts/client-tests.sh
installs `openai` and runs this): the `openai` package's completions, chat, streaming (the
chunks join to the non-streamed text), 8 concurrent requests whose greedy texts equal their
one-at-a-time runs, a stream closed mid-way (the server counts a 499, stops generating and
answers the next request the same), the penalties, top-k and min-p, logprobs, n choices, a
JSON schema, and
every bad request raising the client's error class with the field named; then curl: a
completion, a stream with `curl -N`, 4xx bodies.

With the server's --api-key as a second argument, the clients send it, and a wrong key must
raise the client's AuthenticationError.

Usage: python3 scripts/client_tests.py http://127.0.0.1:PORT [API_KEY]  (exit 1 when a check fails)
"""

import json
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai

URL = sys.argv[1].rstrip("/")
KEY = sys.argv[2] if len(sys.argv) > 2 else None
client = openai.OpenAI(base_url=URL + "/v1", api_key=KEY or "none", max_retries=0, timeout=120)
BEARER = ["-H", f"Authorization: Bearer {KEY}"] if KEY else []
MODEL = "SmolLM2-135M-Instruct.Q4_1"
FRANCE = "The capital of France is"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
CHECKS = []


def check(f):
    CHECKS.append(f)
    return f


def complete(prompt, n, **kw):
    """Greedy completion text of `n` tokens."""
    return client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=n, temperature=0, **kw
    ).choices[0].text


def metric(sample):
    """The value of `sample` (name with labels) in /metrics, 0 when absent."""
    with urllib.request.urlopen(URL + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            name, _, value = line.rpartition(" ")
            if name == sample:
                return float(value)
    return 0.0


@check
def models_list_names_the_gguf():
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL], ids
    assert client.models.retrieve(MODEL).id == MODEL
    try:
        client.models.retrieve("gpt-4")
    except openai.NotFoundError as e:
        assert e.param == "model", e
    else:
        raise AssertionError("gpt-4: no NotFoundError")


@check
def a_completion_continues_the_prompt():
    r = client.completions.create(model=MODEL, prompt=FRANCE, max_tokens=2, temperature=0, seed=3)
    assert r.object == "text_completion", r
    assert r.choices[0].text == " Paris.", r
    assert r.choices[0].finish_reason == "length", r
    u = r.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (5, 2, 7), u


@check
def a_chat_completion_answers_as_assistant():
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0)
    m = r.choices[0].message
    assert r.object == "chat.completion", r
    assert m.role == "assistant" and m.content, r
    assert r.choices[0].finish_reason in ("length", "stop"), r
    assert r.usage.completion_tokens <= 6, r.usage


@check
def streamed_chat_chunks_join_to_the_whole_text():
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=6, temperature=0, stream=True
        )
    )
    assert len(chunks) >= 2, chunks
    assert all(c.object == "chat.completion.chunk" for c in chunks), chunks
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content, (text, whole)
    last = chunks[-1]
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason, last
    assert last.usage == whole.usage, (last.usage, whole.usage)


@check
def streamed_completion_chunks_join_to_the_whole_text():
    whole = complete("Once upon a time", 5)
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0, stream=True
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole, (text, whole)
    assert chunks[-1].choices[0].finish_reason == "length", chunks[-1]


@check
def include_usage_ends_a_stream_with_a_usage_chunk_of_no_choices():
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *rest, usage = chunks
    assert usage.choices == [] and usage.usage.completion_tokens == 5, usage
    assert rest[-1].choices[0].finish_reason == "length" and rest[-1].usage is None, rest[-1]
    assert all(c.usage is None for c in rest), rest


@check
def eight_concurrent_requests_equal_their_runs_alone():
    prompts = [
        FRANCE,
        "One, two, three,",
        "def add(a, b):",
        "The sky is",
        "My favourite food is",
        "Water boils at",
        "The quick brown fox",
        "In 1492,",
    ]
    alone = [complete(p, 4) for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: complete(p, 4), prompts))
    assert together == alone, (together, alone)


@check
def a_closed_stream_stops_and_the_next_request_answers():
    before = complete("The sky is", 4)
    gone = 'memra_requests_total{endpoint="/v1/completions",status="499"}'
    gone0 = metric(gone)
    generated = metric("memra_generated_tokens_total")
    # Counting goes on: the model does not end it early.
    stream = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4, 5,", max_tokens=1000, temperature=0, stream=True
    )
    first = next(iter(stream))
    assert first.choices[0].finish_reason is None, first
    stream.close()
    assert complete("The sky is", 4) == before
    spent = metric("memra_generated_tokens_total") - generated
    assert spent < 200, f"the closed stream went on for {spent} tokens"
    # The server logs the 499 once its decode step sees the connection gone.
    deadline = time.time() + 10
    while metric(gone) != gone0 + 1 and time.time() < deadline:
        time.sleep(0.05)
    assert metric(gone) == gone0 + 1, (gone0, metric(gone))
    assert metric("memra_kv_slots_used") == 0


@check
def penalties_and_truncations_shape_the_text():
    greedy = complete(FRANCE, 16)
    penalized = client.completions.create(
        model=MODEL, prompt=FRANCE, max_tokens=16, temperature=0, presence_penalty=2.0
    ).choices[0].text
    assert penalized != greedy, (penalized, greedy)
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        r = client.completions.create(
            model=MODEL, prompt=FRANCE, max_tokens=16, temperature=1.5, seed=1, extra_body=extra
        )
        assert r.choices[0].text == greedy, (extra, r)
    r = client.completions.create(
        model=MODEL, prompt=FRANCE, max_tokens=16, temperature=0,
        extra_body={"repetition_penalty": 2.0},
    )
    assert r.choices[0].text != greedy, r


@check
def logprobs_on_both_endpoints():
    r = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content, r
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content), content
    r = client.completions.create(model=MODEL, prompt=FRANCE, max_tokens=2, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == " Paris.", lp
    assert all(len(top) == 2 for top in lp.top_logprobs), lp


@check
def n_choices_come_with_their_indexes():
    r = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=1.0, seed=3, n=3
    )
    assert [c.index for c in r.choices] == [0, 1, 2], r
    one = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=1.0, seed=4
    )
    assert r.choices[1].text == one.choices[0].text, (r, one)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=4, temperature=1.0, seed=3, n=2, stream=True
        )
    )
    ends = [c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(ends) == [0, 1], chunks


@check
def a_json_schema_holds_the_answer():
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string", "maxLength": 16}},
        "required": ["capital"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    )
    assert r.choices[0].finish_reason == "stop", r
    answer = json.loads(r.choices[0].message.content)
    assert list(answer) == ["capital"] and isinstance(answer["capital"], str), answer


@check
def a_wrong_api_key_raises_the_authentication_error():
    if KEY is None:
        return
    wrong = openai.OpenAI(base_url=URL + "/v1", api_key=KEY + "x", max_retries=0, timeout=30)
    try:
        wrong.completions.create(model=MODEL, prompt=FRANCE, max_tokens=2)
    except openai.AuthenticationError as e:
        assert e.code == "invalid_api_key", e
    else:
        raise AssertionError("a wrong key was served")


@check
def a_prompt_past_the_context_is_refused_before_tokenizing():
    start = time.time()
    try:
        client.completions.create(model=MODEL, prompt="1" * 1_900_000, max_tokens=2)
    except openai.BadRequestError as e:
        assert e.code == "context_length_exceeded" and e.param == "prompt", e
    else:
        raise AssertionError("a 1.9 MB prompt was taken")
    # tokenizing it would take seconds
    assert time.time() - start < 1.5, time.time() - start


@check
def a_foreign_web_origin_is_refused():
    request = urllib.request.Request(
        URL + "/v1/completions",
        data=json.dumps({"prompt": FRANCE, "max_tokens": 2}).encode(),
        headers={"Origin": "http://evil.example", "Content-Type": "text/plain"},
    )
    try:
        urllib.request.urlopen(request, timeout=30)
    except urllib.error.HTTPError as e:
        assert e.code == 403, e
        assert json.loads(e.read())["error"]["code"] == "origin_not_allowed"
    else:
        raise AssertionError("a foreign origin was served")


# (error class, create arguments, the field the error names)
BAD = [
    (openai.NotFoundError, dict(prompt="x", model="gpt-4"), "model"),
    (openai.BadRequestError, dict(prompt=7), "prompt"),
    (openai.BadRequestError, dict(prompt="x", temperature="hot"), "temperature"),
    (openai.BadRequestError, dict(prompt="x", n=17), "n"),
    (openai.BadRequestError, dict(prompt="x", max_tokens=0), "max_tokens"),
    (openai.BadRequestError, dict(prompt="x", max_tokens=5000), "max_tokens"),
    (openai.BadRequestError, dict(prompt="word " * 3000), "prompt"),
    (openai.BadRequestError, dict(prompt="x", stop={"a": 1}), "stop"),
    (openai.BadRequestError, dict(messages=[]), "messages"),
    (openai.BadRequestError, dict(messages=[{"role": "user", "content": 1}]), "messages[0].content"),
    (openai.BadRequestError, dict(prompt="x", echo=True), "echo"),
    (openai.BadRequestError, dict(prompt="x", logprobs=21), "logprobs"),
    (openai.BadRequestError, dict(messages=[{"role": "user", "content": "x"}], presence_penalty=3.0), "presence_penalty"),
    (openai.BadRequestError, dict(prompt="x", extra_body={"min_p": 2}), "min_p"),
    (openai.BadRequestError, dict(prompt="x", extra_body={"ignore_eos": True}), "ignore_eos"),
    (openai.BadRequestError, dict(prompt="x", stop=[str(i) for i in range(17)]), "stop"),
]


@check
def bad_requests_raise_the_client_error_naming_the_field():
    for error, args, field in BAD:
        args = {"model": MODEL, "max_tokens": 2, **args}
        create = client.chat.completions.create if "messages" in args else client.completions.create
        try:
            create(**args)
        except error as e:
            assert e.param == field, (args, e)
            assert e.body["message"].startswith(field), (args, e)
            assert field in str(e), (args, e)
            assert e.type and e.code, (args, e)
        else:
            raise AssertionError(f"{args}: no {error.__name__}")
    assert complete(FRANCE, 2) == " Paris."


def curl(*args):
    """curl's stdout for `args` (fails on a transport error, not on an HTTP status)."""
    r = subprocess.run(["curl", "-sS", *BEARER, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


@check
def curl_completes():
    body = json.dumps({"prompt": FRANCE, "max_tokens": 2, "temperature": 0})
    r = json.loads(curl(URL + "/v1/completions", "-H", "Content-Type: application/json", "-d", body))
    assert r["choices"][0]["text"] == " Paris.", r
    assert json.loads(curl(URL + "/health")) == {"status": "ok"}


@check
def curl_streams_with_n():
    # The README's command, shorter: no Content-Type header.
    body = json.dumps({"messages": CHAT, "max_tokens": 6, "temperature": 0, "stream": True})
    out = curl("-N", URL + "/v1/chat/completions", "-d", body)
    data = [e[len("data: "):] for e in out.split("\n\n") if e.startswith("data: ")]
    assert data and data[-1] == "[DONE]", out
    text = "".join(json.loads(d)["choices"][0]["delta"].get("content") or "" for d in data[:-1])
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0)
    assert text == whole.choices[0].message.content, (text, whole)


@check
def curl_gets_4xx_error_bodies():
    cases = [
        ("/v1/completions", '{"prompt": "x"', 400, None),
        ("/v1/completions", '{"prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
        ("/v1/completions", '{"prompt": "x", "model": "gpt-4"}', 404, "model"),
        ("/v1/nothing", "{}", 404, None),
    ]
    for path, body, status, param in cases:
        out = curl("-w", "\n%{http_code}", URL + path, "-d", body)
        text, _, code = out.rpartition("\n")
        error = json.loads(text)["error"]
        assert int(code) == status, (path, body, code, error)
        assert error["param"] == param, (path, body, error)
        assert error["message"] and error["type"] and error["code"], error
        if param:
            assert error["message"].startswith(param), error


def main():
    failed = 0
    for f in CHECKS:
        start = time.time()
        try:
            f()
            print(f"ok    {f.__name__} ({time.time() - start:.1f} s)", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL  {f.__name__}\n{traceback.format_exc()}", flush=True)
    print(f"{len(CHECKS) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

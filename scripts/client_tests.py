"""Real clients against a running `memra-run serve` with SmolLM2 (scripts/client-tests.sh
installs `openai` and runs this): the `openai` package's completions, chat, streaming (the
chunks join to the non-streamed text), 8 concurrent requests whose greedy texts equal their
one-at-a-time runs, a stream closed mid-way (the server counts a 499, stops generating and
answers the next request the same), the penalties, top-k and min-p, logprobs, n choices, a
JSON schema, tools (required, named, streamed, auto), the connection cap and the timeouts
(a trickled header, a short body) while the client is served, the allowed and a foreign web
origin, and every bad request raising the client's error class with the field named; then
curl: a completion, a stream with `curl -N`, 4xx bodies.

With the server's --api-key as a second argument, the clients send it, and a wrong key must
raise the client's AuthenticationError. With the server's process id as a third, 16
concurrent prompts past the context must not grow its memory, and, last, SIGTERM during a
stream must end it with its last chunk (the caller checks the exit status).

The server must run as `scripts/client-tests.sh` says (its --timeout, --max-connections
and --allowed-origins are the constants below).

Usage: python3 scripts/client_tests.py http://127.0.0.1:PORT [API_KEY [SERVER_PID]]  (exit 1 when a check fails)
"""

import json
import os
import signal
import socket
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
PID = int(sys.argv[3]) if len(sys.argv) > 3 else None
# the server's --timeout, --max-connections and --allowed-origins (scripts/client-tests.sh)
TIMEOUT = 4
MAX_CONNECTIONS = 24
ORIGIN = "http://app.example"
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


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            # no additionalProperties, as most clients send it: the server closes it
            "required": ["city", "unit"],
        },
    },
}
WEATHER_CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]


def weather_arguments(call):
    """The arguments of a get_weather call, checked against its schema."""
    assert call.type == "function" and call.id and call.function.name == "get_weather", call
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit"), args
    assert isinstance(args["city"], str) and len(args["city"]) <= 20, args
    return args


@check
def tools_give_calls_whole_and_streamed():
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        r = client.chat.completions.create(
            model=MODEL, messages=WEATHER_CHAT, tools=[WEATHER], tool_choice=choice,
            max_tokens=80, temperature=0,
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.content is None, r
        args = weather_arguments(c.message.tool_calls[0])
    # streamed: the openai package gathers the tool_calls deltas
    calls = {}
    finish = None
    for chunk in client.chat.completions.create(
        model=MODEL, messages=WEATHER_CHAT, tools=[WEATHER], tool_choice=named,
        max_tokens=80, temperature=0, stream=True,
    ):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert not delta.content, chunk
        for call in delta.tool_calls or []:
            calls[call.index] = call
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0], (finish, calls)
    assert weather_arguments(calls[0]) == args, calls
    # the call's result goes back; the answer is text
    conversation = WEATHER_CHAT + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": calls[0].id, "type": "function",
             "function": {"name": "get_weather", "arguments": calls[0].function.arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "21 degrees and sunny"},
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=conversation, tools=[WEATHER], tool_choice="none",
        max_tokens=20, temperature=0,
    )
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls, r
    # auto: a text answer or calls of the function, never both missing
    r = client.chat.completions.create(
        model=MODEL, messages=WEATHER_CHAT, tools=[WEATHER], max_tokens=40, temperature=0,
    )
    m = r.choices[0].message
    if m.tool_calls:
        assert r.choices[0].finish_reason == "tool_calls", r
        weather_arguments(m.tool_calls[0])
    else:
        assert m.content, r


def held_connection():
    """A connection the server took: a /health answered on it, kept alive."""
    s = socket.create_connection(URL.removeprefix("http://").split(":"), timeout=10)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    return s, s.recv(4096).decode()


@check
def past_the_connection_cap_a_client_gets_503_until_one_closes():
    held = []
    try:
        # the openai package's pool holds some of the places
        while len(held) <= MAX_CONNECTIONS:
            s, answer = held_connection()
            held.append(s)
            if answer.startswith("HTTP/1.1 503"):
                assert "too_many_connections" in answer, answer
                break
        else:
            raise AssertionError(f"{len(held)} connections taken past the cap of {MAX_CONNECTIONS}")
        fresh = openai.OpenAI(base_url=URL + "/v1", api_key=KEY or "none", max_retries=0, timeout=30)
        try:
            fresh.completions.create(model=MODEL, prompt=FRANCE, max_tokens=2)
        except openai.InternalServerError as e:
            assert e.status_code == 503 and e.code == "too_many_connections", e
        else:
            raise AssertionError("a connection past the cap was served")
    finally:
        for s in held:
            s.close()
    deadline = time.time() + 5
    while True:
        fresh = openai.OpenAI(base_url=URL + "/v1", api_key=KEY or "none", max_retries=0, timeout=30)
        try:
            assert fresh.completions.create(
                model=MODEL, prompt=FRANCE, max_tokens=2, temperature=0
            ).choices[0].text == " Paris."
            return
        except openai.InternalServerError:
            assert time.time() < deadline, "the closed connections never freed their places"
            time.sleep(0.1)


@check
def a_trickled_header_and_a_short_body_time_out_while_the_client_is_served():
    host, port = URL.removeprefix("http://").split(":")
    trickle = socket.create_connection((host, port), timeout=0.25)
    short = socket.create_connection((host, port), timeout=3 * TIMEOUT)
    bearer = f"Authorization: Bearer {KEY}\r\n" if KEY else ""
    short.sendall(
        f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n{bearer}Content-Length: 100\r\n\r\n{{".encode()
    )
    start = time.time()
    header = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 1000
    cut = None
    served = False
    for byte in header:
        try:
            trickle.sendall(bytes([byte]))
            if trickle.recv(64) == b"":
                cut = time.time() - start
                break
        except socket.timeout:
            # the client is served meanwhile
            if not served and time.time() - start > 1:
                assert complete(FRANCE, 2) == " Paris."
                served = True
        except OSError:
            cut = time.time() - start
            break
        if time.time() - start > 3 * TIMEOUT:
            break
    trickle.close()
    assert served and cut is not None and TIMEOUT - 0.5 < cut < TIMEOUT + 2, (served, cut)
    answer = short.recv(4096).decode()
    short.close()
    assert answer.startswith("HTTP/1.1 408") and "body_timeout" in answer, answer


def rss_kib():
    """The server's resident memory in KiB."""
    with open(f"/proc/{PID}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@check
def prompts_past_the_context_are_refused_before_tokenizing_without_memory():
    """16 at once, each 1.9 MB (tokenized, they took the server to 4.65 GB)."""
    before = rss_kib() if PID else None

    def ask(_):
        try:
            client.completions.create(model=MODEL, prompt="1" * 1_900_000, max_tokens=2)
        except openai.BadRequestError as e:
            return e.code, e.param
        return "served", None

    start = time.time()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(16)))
    assert answers == [("context_length_exceeded", "prompt")] * 16, answers
    assert time.time() - start < 10, time.time() - start
    if PID:
        grown = rss_kib() - before
        # the bodies alone are 30 MB; tokenizing them took gigabytes
        assert grown < 200_000, f"the server grew by {grown} KiB"


@check
def an_allowed_web_origin_is_answered_with_cors_headers():
    preflight = urllib.request.Request(
        URL + "/v1/chat/completions", method="OPTIONS",
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"},
    )
    with urllib.request.urlopen(preflight, timeout=30) as r:
        assert r.status == 204, r.status
        assert r.headers["Access-Control-Allow-Origin"] == ORIGIN, r.headers
    browser = openai.OpenAI(
        base_url=URL + "/v1", api_key=KEY or "none", max_retries=0, timeout=30,
        default_headers={"Origin": ORIGIN},
    )
    raw = browser.completions.with_raw_response.create(model=MODEL, prompt=FRANCE, max_tokens=2, temperature=0)
    assert raw.headers["access-control-allow-origin"] == ORIGIN, raw.headers
    assert raw.parse().choices[0].text == " Paris."


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


def sigterm_during_a_stream_ends_it_with_its_last_chunk():
    """Last: the server stops. Its exit status is the caller's to check."""
    stream = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4, 5,", max_tokens=1000, temperature=0, stream=True
    )
    chunks = iter(stream)
    first = next(chunks)
    assert first.choices[0].finish_reason is None, first
    os.kill(PID, signal.SIGTERM)
    # the package's iteration ends at data: [DONE], without an error
    rest = list(chunks)
    last = rest[-1]
    assert last.choices[0].finish_reason == "length", last
    assert 1 <= last.usage.completion_tokens < 1000, last.usage


def main():
    if PID:
        CHECKS.append(sigterm_during_a_stream_ends_it_with_its_last_chunk)
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

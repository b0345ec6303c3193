"""The Ollama API with the real `ollama` Python client (and curl for one NDJSON stream) against a
real daemon serving the real, signed SmolLM2-135M-Instruct and all-MiniLM-L6-v2: chat, chat
streamed, generate (templated and raw), embed, the legacy embeddings route, tags, show, ps,
tools, format (a JSON schema and "json"), options, logprobs, the load/unload forms, the refusals,
and the request bodies Home Assistant and Open WebUI send (recorded from their source in
tests/data/clients/ollama), each answered with what that tool reads.

A 135M model cannot pick tools sensibly: what these tests check is that output constrained by
edged (format, the tool-call grammar) arrives well-formed and in Ollama's shape."""
import datetime
import hashlib
import json
import pathlib
import re
import shutil
import subprocess
import time

import pytest

from conftest import testdata
from daemon_support import Server, make_daemon, signing_key

pytest.importorskip("llguidance")
httpx = pytest.importorskip("httpx")
ollama = pytest.importorskip("ollama")

SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM = "all-MiniLM-L6-v2.Q8_0.gguf"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
DURATIONS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
             "eval_count", "eval_duration")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from edged.trust.sign import sign_file
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("api-ollama")
    models = tmp / "models"
    models.mkdir()
    for src, name in ((SMOL, "smol"), (SMOL, "smol2"), (MINILM, "minilm")):
        dst = models / f"{name}.gguf"
        shutil.copyfile(testdata("models", src), dst)
        sign_file(str(dst), key)
    s = Server(tmp, str(models), trusted, default_model="smol",
               extra={"n_parallel": 2, "ctx_size": 1024, "max_queue": 16, "threads": 2,
                      "max_loaded_models": 3})
    yield s
    assert s.stop() == 0, s.logtext()


@pytest.fixture(scope="module")
def client(srv):
    return ollama.Client(host="http://edged", transport=httpx.HTTPTransport(uds=srv.socket), timeout=300)


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(transport=httpx.HTTPTransport(uds=srv.socket), base_url="http://edged",
                      timeout=300) as c:
        yield c


GREEDY = {"temperature": 0, "num_predict": 24}


def test_chat_whole_and_streamed_agree(client):
    r = client.chat(model="smol", messages=ASK, options=GREEDY)
    assert r.done and r.done_reason in ("stop", "length")
    assert r.message.role == "assistant" and r.message.content
    assert r.model == "smol" and r.created_at.endswith("Z")
    assert all(isinstance(r[k], int) for k in DURATIONS), r
    assert r.eval_count <= 24 and r.prompt_eval_count > 5
    assert r.total_duration >= r.eval_duration > 0
    parts = list(client.chat(model="smol:latest", messages=ASK, options=GREEDY, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == r.message.content
    assert parts[-1].eval_count == r.eval_count and parts[-1].done_reason == r.done_reason


def test_generate_templated_raw_and_options(client):
    r = client.generate(model="smol", prompt="Name a colour.", system="Answer in one word.",
                        options={**GREEDY, "num_thread": 8, "mirostat": 1})
    assert r.done and r.response and r.eval_count <= 24
    raw = client.generate(model="smol", prompt="The capital of France is", raw=True,
                          options={"temperature": 0, "num_predict": 8, "stop": ["."]})
    assert raw.done and "." not in raw.response and raw.eval_count <= 8
    # num_predict bounds the reply; seed makes a sampled reply reproducible
    a, b = (client.generate(model="smol", prompt="Tell me a story.", options={"seed": 7, "num_predict": 12,
                                                                                "temperature": 1.0})
            for _ in range(2))
    assert a.response == b.response and a.eval_count == 12 and a.done_reason == "length"


def test_num_ctx_bounds_prompt_and_reply(client):
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="smol", prompt="word " * 100, options={"num_ctx": 32})
    assert e.value.status_code == 400 and "num_ctx" in e.value.error
    r = client.generate(model="smol", prompt="Hi", raw=True, options={"num_ctx": 8, "temperature": 0})
    assert r.prompt_eval_count + r.eval_count <= 8 and r.done_reason == "length"


def test_format_json_schema_and_json(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"]}
    r = client.chat(model="smol", messages=[{"role": "user", "content": "Describe Paris as JSON."}],
                    format=schema, options={"temperature": 0, "num_predict": 60})
    v = json.loads(r.message.content)
    assert {"city", "population"} <= set(v) and isinstance(v["population"], int)
    g = client.generate(model="smol", prompt="A JSON object about cats:", format="json",
                        options={"temperature": 0, "num_predict": 60})
    assert isinstance(json.loads(g.response), dict)


# The generic tool-call format (text/tools.py) as a JSON schema: Ollama's API has no
# tool_choice, and a 135M model does not choose a call on its own, so `format` makes it write
# one; what is checked is the path from tools offered to a call parsed and sent in Ollama's shape.
CALL_FORMAT = {"type": "object", "required": ["tool_calls"], "additionalProperties": False, "properties": {
    "tool_calls": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
        "type": "object", "required": ["name", "arguments"], "additionalProperties": False, "properties": {
            "name": {"const": "get_weather"},
            "arguments": {"type": "object", "required": ["city"], "additionalProperties": False,
                          "properties": {"city": {"type": "string", "maxLength": 20}}}}}}}}


def test_tools_give_ollama_shaped_calls(client):
    def get_weather(city: str) -> str:
        """Current weather in a city.

        Args:
          city: the city's name
        """
        return "sunny"

    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    opts = {"temperature": 0, "num_predict": 60}
    r = client.chat(model="smol", messages=ask, tools=[get_weather], format=CALL_FORMAT, options=opts)
    assert r.done_reason == "stop" and r.message.content == ""
    [call] = r.message.tool_calls
    assert call.function.name == "get_weather" and set(call.function.arguments) == {"city"}
    parts = list(client.chat(model="smol", messages=ask, tools=[get_weather], format=CALL_FORMAT,
                             options=opts, stream=True))
    assert [c for p in parts for c in p.message.tool_calls or []] == [call]
    assert "".join(p.message.content for p in parts) == "" and parts[-1].done
    # the call sent back in Ollama's shape (arguments an object) with its result
    r = client.chat(model="smol", messages=ask + [
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"}],
        tools=[get_weather], options=GREEDY)
    assert r.done and r.message.content


def test_embed_and_legacy_embeddings(client):
    r = client.embed(model="minilm", input=["The cat sat.", "A dog ran."])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 384
    assert abs(sum(x * x for x in r.embeddings[0]) - 1) < 1e-3
    assert r.prompt_eval_count > 4 and r.model == "minilm"
    short = client.embed(model="minilm:latest", input="The cat sat.", dimensions=64)
    assert len(short.embeddings[0]) == 64
    legacy = client.embeddings(model="minilm", prompt="The cat sat.")
    assert legacy.embedding == pytest.approx(r.embeddings[0], abs=1e-5)


def test_tags_show_ps_version(client, http):
    names = {m.model: m for m in client.list().models}
    assert {"smol:latest", "minilm:latest"} <= set(names)
    assert names["smol:latest"].size > 1e7 and names["smol:latest"].details.format == "gguf"
    s = client.show("smol")
    assert s.details.family == "llama" and s.details.quantization_level == "Q4_1"
    assert s.details.parameter_size.endswith("M")
    assert s.modelinfo["general.architecture"] == "llama" and s.modelinfo["llama.context_length"] > 0
    assert s.modelinfo["tokenizer.ggml.tokens"] == []
    assert "completion" in s.capabilities and "embedding" not in s.capabilities
    assert "im_start" in s.template and "num_ctx" in s.parameters
    assert "embedding" in client.show("minilm").capabilities
    ps = {m.model: m for m in client.ps().models}
    assert "smol:latest" in ps and ps["smol:latest"].context_length == 1024
    assert ps["smol:latest"].expires_at.year > 2200            # the default model stays loaded
    assert http.get("/api/version").json()["version"]
    root = http.get("/")
    assert root.status_code == 200 and root.text == "Ollama is running"
    assert http.head("/").status_code == 200


def test_load_and_unload_forms(client, http):
    r = http.post("/api/generate", json={"model": "minilm", "prompt": ""}).json()
    assert r["done"] and r["done_reason"] == "load"
    r = http.post("/api/chat", json={"model": "smol", "messages": []}).json()
    assert r["done_reason"] == "load" and r["message"] == {"role": "assistant", "content": ""}
    r = http.post("/api/generate", json={"model": "minilm", "keep_alive": 0}).json()
    assert r["done_reason"] == "unload"
    assert "minilm:latest" not in {m.model for m in client.ps().models}


def test_keep_alive_sets_the_models_unload_timer(client):
    import datetime
    # Home Assistant's default, -1 (entity.py KEEP_ALIVE_FOREVER): never unloaded
    client.generate(model="smol2", prompt="Hi", options={"num_predict": 1}, keep_alive=-1)
    [m] = [m for m in client.ps().models if m.model == "smol2:latest"]
    assert m.expires_at.year > 2200
    client.generate(model="smol2", prompt="Hi", options={"num_predict": 1}, keep_alive="1h")
    [m] = [m for m in client.ps().models if m.model == "smol2:latest"]
    left = m.expires_at - datetime.datetime.now(datetime.timezone.utc)
    assert datetime.timedelta(minutes=59) < left <= datetime.timedelta(hours=1)
    client.generate(model="smol2", prompt="Hi", options={"num_predict": 1}, keep_alive=0)
    deadline = time.monotonic() + 60    # the unload is a task started when the request lets go
    while "smol2:latest" in {m.model for m in client.ps().models}:
        assert time.monotonic() < deadline, "smol2 still loaded after a request with keep_alive 0"
        time.sleep(0.05)
    # a short keep_alive: the idle sweep (every 10 s at most) unloads it, not a request
    client.generate(model="smol2", prompt="Hi", options={"num_predict": 1}, keep_alive="1s")
    deadline = time.monotonic() + 60
    while "smol2:latest" in {m.model for m in client.ps().models}:
        assert time.monotonic() < deadline, "smol2 still loaded a minute after keep_alive 1s"
        time.sleep(0.2)


@pytest.mark.parametrize("body, field", [
    ({"model": "smol", "prompt": "x", "options": {"temperature": 9}}, "options.temperature"),
    ({"model": "smol", "prompt": "x", "images": ["aGk="]}, "images"),
    ({"model": "smol", "prompt": "x", "context": [1, 2]}, "context"),
    ({"model": "smol", "prompt": "x", "keep_alive": "5 minutes"}, "keep_alive"),
    ({"model": "smol", "prompt": "x", "bogus": 1}, "bogus"),
    ({"model": "smol", "prompt": "x", "format": {"type": "objekt"}}, "format"),
])
def test_bad_requests_name_the_field(http, body, field):
    r = http.post("/api/generate", json=body)
    assert r.status_code == 400 and field in r.json()["error"], r.text
    assert http.get("/api/version").status_code == 200          # still serving


def test_model_management_refused(client, http):
    for call in (lambda: client.pull("llama3"), lambda: client.create("x", from_="smol"),
                 lambda: client.push("smol")):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 403 and "signed" in e.value.error
    assert http.request("DELETE", "/api/delete", json={"model": "smol"}).status_code == 403
    assert http.post("/api/copy", json={"source": "smol", "destination": "x"}).status_code == 403
    assert http.post("/api/chat", json={"model": "nope", "messages": ASK}).status_code == 404


# --- bodies -> GenerateRequest, no daemon ------------------------------------------------

def test_options_map_to_sampling_and_output():
    from edged.service.ollama import parse_chat, parse_generate
    r, ka, empty = parse_chat({"model": "m", "messages": ASK, "stream": False, "keep_alive": "1h30m", "options": {
        "temperature": 0.2, "top_k": 5, "top_p": 0.5, "min_p": 0.1, "seed": 3, "stop": ["x"],
        "repeat_penalty": 1.3, "repeat_last_n": 16, "presence_penalty": 0.5, "frequency_penalty": 0.25,
        "num_predict": 7.0, "num_ctx": 512, "num_thread": 4, "num_gpu": 1}})
    s = r.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.seed, s.repeat_penalty, s.penalty_last_n,
            s.presence_penalty, s.frequency_penalty) == (0.2, 5, 0.5, 0.1, 3, 1.3, 16, 0.5, 0.25)
    assert (r.output.stop, r.output.max_tokens, r.output.context, r.output.stream) == (("x",), 7, 512, False)
    assert ka == 5400 and not empty
    # Ollama's defaults where options are left out; -1 means "none" / "random" / "the whole context"
    r, ka, _ = parse_generate({"model": "m", "prompt": "hi", "options": {"num_predict": -1, "seed": -1,
                                                                         "repeat_last_n": -1}})
    assert (r.sampling.temperature, r.sampling.top_k, r.sampling.top_p, r.sampling.repeat_penalty) == \
        (0.8, 40, 0.9, 1.1)
    assert r.sampling.seed is None and r.output.max_tokens is None and r.sampling.penalty_last_n == 1 << 16
    assert r.output.stream and ka is None and r.messages == ({"role": "user", "content": "hi"},)
    raw, _, empty = parse_generate({"model": "m", "prompt": "", "raw": True})
    assert raw.prompts == ("",) and not raw.chat and empty


def test_think_format_and_messages():
    from edged.service.ollama import parse_chat
    r, _, _ = parse_chat({"model": "m", "messages": ASK, "think": False, "format": "json"})
    assert r.template_kwargs == {"enable_thinking": False} and not r.output.reasoning
    assert r.constraint.source == {"type": "object"} and r.constraint.what == "format"
    r, _, _ = parse_chat({"model": "m", "think": "high", "messages": [
        {"role": "assistant", "content": "", "thinking": "hmm",
         "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "content": "2", "tool_name": "f"}]})
    assert r.template_kwargs == {"enable_thinking": True, "reasoning_effort": "high"} and r.output.reasoning
    assert r.messages[0]["tool_calls"] == [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]
    assert r.messages[0]["reasoning_content"] == "hmm" and r.messages[1]["name"] == "f"


def test_keep_alive_durations():
    from edged.errors import RequestError
    from edged.service.ollama_schema import keep_alive
    assert [keep_alive(v) for v in (None, 0, -1, 30, "5m", "1h30m", "-1s", "250ms", "10")] == \
        [None, 0, -1, 30, 300, 5400, -1, 0.25, 10]
    for bad in ("5 minutes", "m", "1d", True):
        with pytest.raises(RequestError, match="keep_alive"):
            keep_alive(bad)


def test_curl_ndjson_stream(srv):
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("no curl")
    body = json.dumps({"model": "smol", "prompt": "Hello", "options": GREEDY})
    out = subprocess.run([curl, "-sS", "-i", "--unix-socket", srv.socket, "http://x/api/generate",
                          "-d", body], capture_output=True, text=True, timeout=120, check=True).stdout
    head, _, text = out.partition("\n\n")      # text mode: CRLF read as LF
    assert "application/x-ndjson" in head.lower()
    lines = [json.loads(x) for x in text.strip().split("\n")]
    assert lines[-1]["done"] is True and all(x["done"] is False for x in lines[:-1])
    assert all(set(x) >= {"model", "created_at", "response", "done"} for x in lines)
    assert set(DURATIONS) <= set(lines[-1])


# --- logprobs, truncate, digests, error shapes ------------------------------------------

def test_logprobs_whole_and_streamed(client, http):
    ask = dict(model="smol", messages=ASK, options=GREEDY, logprobs=True, top_logprobs=3)
    r = client.chat(**ask)
    assert r.logprobs and len(r.logprobs) <= r.eval_count
    assert "".join(e.token for e in r.logprobs) == r.message.content
    for e in r.logprobs:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob >= e.logprob - 1e-6      # greedy: the most likely one
    parts = list(client.chat(**ask, stream=True))
    assert [e.token for p in parts for e in p.logprobs or []] == [e.token for e in r.logprobs]
    g = http.post("/api/generate", json={"model": "smol", "prompt": "Hi", "stream": False, "logprobs": True,
                                         "options": {"num_predict": 4, "temperature": 0}}).json()
    assert len(g["logprobs"]) == g["eval_count"] and all(set(e) == {"token", "logprob", "bytes"}
                                                          for e in g["logprobs"])
    plain = client.generate(model="smol", prompt="Hi", options={"num_predict": 2})
    assert plain.logprobs is None
    r = http.post("/api/chat", json={"model": "smol", "messages": ASK, "logprobs": True, "top_logprobs": 21})
    assert r.status_code == 400 and "top_logprobs" in r.json()["error"]


def test_embed_truncate(http):
    words = " ".join(f"word{i}" for i in range(400))      # well past all-MiniLM's 512 tokens
    r = http.post("/api/embed", json={"model": "minilm", "input": [words, words + " and a different end"]})
    assert r.status_code == 200, r.text
    a, b = r.json()["embeddings"]
    assert a == pytest.approx(b, abs=1e-6)             # what differs was past the limit: cut
    assert r.json()["prompt_eval_count"] == 2 * 512
    r = http.post("/api/embed", json={"model": "minilm", "input": [words], "truncate": False})
    assert r.status_code == 400 and "input 0" in r.json()["error"] and "512" in r.json()["error"]


def test_digest_and_sizes_in_tags_and_ps(srv, client):
    tags = {m.model: m for m in client.list().models}
    path = pathlib.Path(srv.tmp) / "models" / "smol.gguf"
    assert tags["smol:latest"].digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert tags["smol:latest"].size == path.stat().st_size
    ps = {m.model: m for m in client.ps().models}
    assert ps["smol:latest"].digest == tags["smol:latest"].digest and ps["smol:latest"].size > 1e7


def test_unknown_routes_and_methods_answer_in_ollama_shape(http):
    for method, path, status in (("GET", "/api/nope", 404), ("GET", "/api/chat", 405),
                                 ("PUT", "/", 405)):
        r = http.request(method, path)
        assert r.status_code == status and isinstance(r.json()["error"], str), r.text
    r = http.get("/v1/nope")
    assert r.status_code == 404 and isinstance(r.json()["error"], dict)       # OpenAI's stays OpenAI's


def test_refused_peer_gets_ollama_shape(tmp_path):
    import asyncio
    from edged.service.wire import ApiRequest, Peer
    d = make_daemon(tmp_path, allow_uids=[1000])
    for path, shape in (("/api/tags", str), ("/v1/models", dict)):
        reply = asyncio.run(d.api.handle(ApiRequest("GET", path, b"", Peer(10, 1001, 1001))))
        assert reply.status == 403 and isinstance(reply.body["error"], shape)
        assert "uid 1001" in (reply.body["error"] if shape is str else reply.body["error"]["message"])


# --- recorded bodies of Home Assistant and Open WebUI --------------------------------------

RECORDED = pathlib.Path(__file__).resolve().parents[1] / "data" / "clients" / "ollama"


def send(http, name):
    rec = json.loads((RECORDED / name).read_text())
    assert rec["source"]
    return http.request(rec["method"], rec["path"], json=rec["body"])


def ndjson(r):
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(x) for x in r.text.splitlines() if x.strip()]


def ha_stream(r):
    """What Home Assistant's _transform_stream reads of each chunk, parsed as its ollama client
    parses it (ChatResponse): message content, thinking, tool_calls[].function name and
    arguments (a dict: it calls .items() on them)."""
    chunks = [ollama.ChatResponse(**x) for x in ndjson(r)]
    assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True]
    for c in chunks:
        assert c.message.role == "assistant" and isinstance(c.message.content, str)
        for call in c.message.tool_calls or ():
            assert isinstance(call.function.name, str) and isinstance(call.function.arguments, dict)
    return chunks


def test_home_assistant_chat_with_tools(http):
    chunks = ha_stream(send(http, "ha_chat_tools.json"))
    last = chunks[-1]
    assert last.done_reason in ("stop", "length") and last.prompt_eval_count > 50
    assert "".join(c.message.content for c in chunks) or any(c.message.tool_calls for c in chunks)
    chunks = ha_stream(send(http, "ha_chat_tool_result.json"))
    assert chunks[-1].done


def test_home_assistant_structured_task(http):
    chunks = ha_stream(send(http, "ha_ai_task_structured.json"))
    assert isinstance(json.loads("".join(c.message.content for c in chunks))["name"], str)


def test_home_assistant_list_and_ps(client):
    """config_flow.py: {model_info["model"] for model_info in client.list()["models"]};
    coordinator.py: client.list() and client.ps() parsed as ListResponse / ProcessResponse."""
    assert "smol:latest" in {m["model"] for m in client.list().get("models", [])}
    assert all(m.model and m.expires_at for m in client.ps().models)


def owui_usage(last):
    """utils/response.py convert_ollama_usage_to_openai: the counts and durations, integers."""
    keys = ("prompt_eval_count", "eval_count", "eval_duration", "prompt_eval_duration",
            "total_duration", "load_duration")
    assert all(isinstance(last[k], int) for k in keys), last
    assert last["eval_duration"] > 0 and last["prompt_eval_duration"] > 0


def test_open_webui_chat_stream_and_ignored_options(srv, http):
    lines = ndjson(send(http, "owui_chat_stream.json"))
    # convert_streaming_response_ollama_to_openai: model, message (content, thinking, tool_calls),
    # done, done_reason
    assert all(x["model"] == "smol" and isinstance(x["message"].get("content"), str) for x in lines)
    assert lines[-1]["done"] and lines[-1]["done_reason"] in ("stop", "length")
    assert "".join(x["message"]["content"] for x in lines) and lines[-1]["eval_count"] <= 48
    owui_usage(lines[-1])
    assert re.search(r"ignored options num_thread, use_mlock", srv.logtext())


def test_open_webui_tool_round_trip_and_format(http):
    r = send(http, "owui_chat_tools_roundtrip.json")
    assert r.status_code == 200, r.text
    x = r.json()
    # convert_response_ollama_to_openai: message.content, thinking, tool_calls; done_reason
    assert isinstance(x["message"]["content"], str) and x["done_reason"] in ("stop", "length")
    owui_usage(x)
    r = send(http, "owui_chat_format.json")
    v = json.loads(r.json()["message"]["content"])
    assert set(v) == {"city", "population"} and isinstance(v["population"], int)


def test_open_webui_images_to_a_model_without_mmproj(http):
    r = send(http, "owui_chat_image.json")
    assert r.status_code == 400
    err = r.json()["error"]         # send_request raises HTTPException(detail=res["error"])
    assert "messages[0].images[0]" in err and "takes no images: no mmproj is paired" in err


def test_open_webui_generate_and_unload(client, http):
    lines = ndjson(send(http, "owui_generate.json"))
    assert all(isinstance(x["response"], str) for x in lines) and lines[-1]["done"]
    assert http.post("/api/generate", json={"model": "smol2", "prompt": ""}).json()["done_reason"] == "load"
    assert "smol2:latest" in {m.model for m in client.ps().models}
    r = send(http, "owui_unload.json")
    assert r.status_code == 200 and r.json()["done_reason"] == "unload"
    deadline = time.monotonic() + 60
    while "smol2:latest" in {m.model for m in client.ps().models}:
        assert time.monotonic() < deadline, "smol2 still loaded after Open WebUI's unload"
        time.sleep(0.05)


def test_open_webui_embed_embeddings_show(http):
    r = send(http, "owui_embed.json")           # retrieval/utils.py reads data["embeddings"]
    assert r.status_code == 200 and [len(v) for v in r.json()["embeddings"]] == [384, 384]
    r = send(http, "owui_embeddings.json")      # utils/response.py reads response["embedding"]
    assert r.status_code == 200 and len(r.json()["embedding"]) == 384
    r = send(http, "owui_show.json")            # returned as it is to its frontend
    assert r.status_code == 200 and {"details", "model_info", "capabilities", "template"} <= set(r.json())


def test_open_webui_tags_ps_version(http):
    """get_all_models: models[].model and name; expires_at from /api/ps through
    datetime.fromisoformat; get_ollama_versions: re.sub(r"^v|-.*", "", version) as integers."""
    tags = http.get("/api/tags").json()
    assert all(m["model"] and m["name"] for m in tags["models"])
    for m in http.get("/api/ps").json()["models"]:
        assert datetime.datetime.fromisoformat(m["expires_at"]).timestamp() > time.time()
    version = http.get("/api/version").json()["version"]
    assert all(isinstance(int(p), int) for p in re.sub(r"^v|-.*", "", version).split("."))

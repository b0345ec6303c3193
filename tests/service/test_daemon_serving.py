"""A real daemon serving real (small, signed) models: curl, aiohttp, httpx and the openai client
over the Unix socket; streaming; concurrency; queue overflow; disconnects; hot-swap; refusals."""
import json
import os
import shutil
import subprocess
import time

import pytest

from daemon_support import ONCE, Server, alpha_beta_models, gather, needs_curl, open_stream, sse_events


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return alpha_beta_models(tmp_path_factory, "serving")


@pytest.fixture(scope="module")
def srv(models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("daemon")
    s = Server(tmp, *models, default_model="alpha", extra={"max_queue": 32, "n_parallel": 2,
                                                           "pin_default_model": True, "max_loaded_models": 2})
    yield s
    assert s.stop() == 0, s.logtext()


def curl(srv, path, body=None, extra=()):
    cmd = ["curl", "-sS", "-N", "--unix-socket", srv.socket, "-w", "\n%{http_code}"] + list(extra)
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    r = subprocess.run(cmd + [f"http://edged{path}"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out, code = r.stdout.rsplit("\n", 1)
    return int(code), out


@needs_curl
def test_completion_greedy_matches_llama_cpp_text(srv):
    code, out = curl(srv, "/v1/completions", {"model": "alpha", "prompt": ONCE, "max_tokens": 12,
                                              "temperature": 0})
    assert code == 200, out
    r = json.loads(out)
    assert r["object"] == "text_completion" and r["model"] == "alpha"
    # stories260K's greedy continuation, as llama.cpp produces it (../shared/testdata/README.md)
    assert r["choices"][0]["text"].startswith(", there was a little girl named Lily")
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 12 and r["usage"]["prompt_tokens"] == 5


@needs_curl
def test_chat_non_streaming_and_streaming_with_usage(srv):
    body = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 8, "temperature": 0}
    code, out = curl(srv, "/v1/chat/completions", body)
    assert code == 200, out
    r = json.loads(out)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    msg = r["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"]
    assert r["choices"][0]["finish_reason"] in ("stop", "length")
    u = r["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and 0 < u["completion_tokens"] <= 8

    code, out = curl(srv, "/v1/chat/completions", {**body, "stream": True,
                                                   "stream_options": {"include_usage": True}})
    assert code == 200
    ev = sse_events(out)
    assert all(e["object"] == "chat.completion.chunk" for e in ev)
    assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in ev if e["choices"])
    assert text == msg["content"]                 # greedy: the same reply streamed
    final = [e for e in ev if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(final) == 1 and final[0]["choices"][0]["finish_reason"] == r["choices"][0]["finish_reason"]
    assert ev[-1]["choices"] == [] and ev[-1]["usage"]["completion_tokens"] == u["completion_tokens"]
    assert all(e["usage"] is None for e in ev[:-1])


@needs_curl
def test_info_routes_tokenize_and_errors_over_curl(srv):
    code, out = curl(srv, "/health")
    assert code == 200 and json.loads(out)["models"] == ["alpha"]
    code, out = curl(srv, "/v1/models")
    data = {m["id"]: m for m in json.loads(out)["data"]}
    assert data["alpha"]["loaded"] and data["alpha"]["signed"] and data["alpha"]["pinned"]
    assert not data["beta"]["loaded"] and data["beta"]["signed"]
    code, out = curl(srv, "/tokenize", {"content": ONCE})
    toks = json.loads(out)["tokens"]
    assert code == 200 and toks == [403, 407, 261, 378]     # stories260K ids without BOS
    code, out = curl(srv, "/detokenize", {"tokens": toks})
    assert json.loads(out)["content"].strip() == ONCE
    code, out = curl(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 9})
    assert code == 400 and json.loads(out)["error"]["message"].startswith("'n' must be between 1 and 8")
    code, out = curl(srv, "/v1/completions", {"model": "nope", "prompt": "x"})
    assert code == 404
    code, out = curl(srv, "/v1/completions", {"prompt": "x " * 400})
    assert code == 400 and "exceeds the limit" in json.loads(out)["error"]["message"]
    code, out = curl(srv, "/metrics")
    assert 'edged_model_loaded{model="alpha"} 1' in out and "edged_generated_tokens_total" in out


def test_openai_client_through_httpx_unix_transport(srv):
    httpx = pytest.importorskip("httpx")
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url="http://edged/v1", api_key="unused",
                           http_client=httpx.Client(transport=httpx.HTTPTransport(uds=srv.socket)))
    assert "alpha" in [m.id for m in client.models.list().data]
    r = client.chat.completions.create(model="alpha", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=6, temperature=0)
    assert r.choices[0].message.content and r.usage.completion_tokens <= 6
    stream = client.chat.completions.create(model="alpha", messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=6, temperature=0, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason
    c = client.completions.create(model="alpha", prompt=ONCE, max_tokens=5, temperature=0)
    assert c.choices[0].text.startswith(", there was")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="alpha", messages=[{"role": "user", "content": "Hi"}], n=9)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="ghost", messages=[{"role": "user", "content": "Hi"}])


def test_prompt_cache_follow_up_turn_evaluates_only_new_tokens(srv):
    httpx = pytest.importorskip("httpx")
    with httpx.Client(transport=httpx.HTTPTransport(uds=srv.socket), base_url="http://edged", timeout=120) as c:
        msgs = [{"role": "user", "content": "Once upon a time there was a cat."}]
        r1 = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 6, "temperature": 0}).json()
        msgs += [r1["choices"][0]["message"], {"role": "user", "content": "And then?"}]
        r2 = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 6, "temperature": 0}).json()
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= r1["usage"]["prompt_tokens"], (r1["usage"], r2["usage"])
    assert cached < r2["usage"]["prompt_tokens"]


def test_twenty_concurrent_clients_over_aiohttp(srv):
    async def one(session, i):
        body = {"messages": [{"role": "user", "content": f"Story number {i}"}], "max_tokens": 6,
                "temperature": 0.8, "seed": i, "stream": bool(i % 2)}
        async with session.post("http://edged/v1/chat/completions", json=body) as r:
            text = await r.text()
            assert r.status == 200, text
            if body["stream"]:
                ev = sse_events(text)
                assert ev[-1]["choices"][0]["finish_reason"] in ("stop", "length")
            else:
                assert json.loads(text)["choices"][0]["finish_reason"] in ("stop", "length")
            return i

    assert sorted(gather(srv.socket, one, range(20))) == list(range(20))


def test_disconnect_mid_stream_stops_generation(srv):
    c, r = open_stream(srv.socket, {"prompt": ONCE, "max_tokens": 200, "stream": True, "temperature": 0})
    assert r.status == 200
    first = r.readline()
    assert first.startswith(b"data: ")
    c.sock.shutdown(2)
    c.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines = [line for line in srv.logtext().splitlines() if "POST /v1/completions 200" in line
                 and "finish=cancelled" in line]
        if lines:
            break
        time.sleep(0.1)
    assert lines, srv.logtext()[-2000:]
    n = int(lines[-1].split("completion_tokens=")[1].split()[0])
    assert n < 200
    assert srv.request("GET", "/health")[0] == 200
    assert srv.request("GET", "/health")[2]["in_flight"] == 0


def test_failed_swap_tampered_model_leaves_old_serving(srv, models):
    d, _ = models
    bad = os.path.join(d, "gamma.gguf")
    shutil.copy(os.path.join(d, "alpha.gguf"), bad)
    with open(bad, "r+b") as f:                      # flip one byte inside the signed data
        f.seek(4096)
        b = f.read(1)
        f.seek(4096)
        f.write(bytes([b[0] ^ 0xFF]))
    os.chmod(bad, 0o644)
    loads_before = srv.request("GET", "/v1/models")[2]
    st, _, body = srv.request("POST", "/v1/chat/completions",
                              {"model": "gamma", "messages": [{"role": "user", "content": "x"}]})
    assert st == 403 and body["error"]["code"] == "model_not_trusted", body
    # asked again: the same refusal, from memory (the unchanged file is not hashed again)
    st, _, body2 = srv.request("POST", "/v1/completions", {"model": "gamma", "prompt": "x"})
    assert st == 403 and body2["error"]["message"] == body["error"]["message"]
    assert srv.logtext().count("load of model gamma failed") == 1
    st, _, h = srv.request("GET", "/health")
    assert st == 200 and h["models"] == ["alpha"]
    st, _, r = srv.request("POST", "/v1/completions", {"model": "alpha", "prompt": ONCE, "max_tokens": 3,
                                                       "temperature": 0})
    assert st == 200 and r["choices"][0]["text"].startswith(", there")
    after = {m["id"]: m for m in srv.request("GET", "/v1/models")[2]["data"]}
    before = {m["id"]: m for m in loads_before["data"]}
    assert after["alpha"]["load_seconds"] == before["alpha"]["load_seconds"]     # not reloaded
    os.unlink(bad)


def test_sampling_fields_reach_the_engine(srv):
    def complete(**kw):
        st, _, r = srv.request("POST", "/v1/completions", {"prompt": ONCE, "max_tokens": 10, **kw})
        assert st == 200, r
        return r["choices"][0]
    # same seed, same text; another seed, (almost surely) another text
    a, b = complete(temperature=1.0, seed=7), complete(temperature=1.0, seed=7)
    assert a["text"] == b["text"]
    assert any(complete(temperature=1.0, seed=s)["text"] != a["text"] for s in (8, 9, 10))
    # stop string: the greedy text is ", there was a little girl named Lily"; stop at "little"
    c = complete(temperature=0, stop=["little"])
    assert c["text"] == ", there was a " and c["finish_reason"] == "stop"
    # logit_bias forces a token
    st, _, t = srv.request("POST", "/tokenize", {"content": " cat"})
    tok = t["tokens"][-1]
    d = complete(temperature=0, max_tokens=3, logit_bias={str(tok): 100})
    st, _, three = srv.request("POST", "/detokenize", {"tokens": [tok] * 3})
    assert d["text"].strip() == three["content"].strip() and d["text"].strip()


@needs_curl
def test_body_over_limit_is_413_over_the_socket(srv, tmp_path):
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"prompt": "x" * (2 << 20)}))
    code, out = curl(srv, "/v1/completions", extra=["-H", "Content-Type: application/json",
                                                    "--data-binary", f"@{big}"])
    assert code == 413 and json.loads(out)["error"]["code"] == "body_too_large"

"""gpt-oss's harmony through the daemon: the synthetic gpt-oss model (tests/data/goldens) with a
gpt-oss-like vocabulary (byte-level BPE, the o200k pre-tokenizer, the harmony control tokens)
and gpt-oss's real chat template. Its output is
forced by a grammar (the request's Lark `grammar`, or tool_choice "required"), so the reply is
known text: the analysis channel comes back as reasoning_content, the final channel as
content, a call as OpenAI tool_calls, whole and streamed."""
import asyncio
import json
import os

import pytest

from conftest import ROOT, testdata
from daemon_support import add_chat_template, make_daemon
from edged.service.wire import ApiRequest

gguf = pytest.importorskip("gguf")
pytest.importorskip("llguidance")

GPT_OSS = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-gpt-oss.gguf")
SPECIALS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather now",   # the gpt-oss template needs one
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Paris"]}},
                   "required": ["city"], "additionalProperties": False}}}


def byte_tokens():
    """GPT-2's byte-level alphabet: the printable bytes as themselves, the rest shifted."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    shifted = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(shifted)) for b in range(256)]


def harmony_model(dst):
    """The synthetic gpt-oss file with a gpt-oss-like vocabulary: byte-level BPE with the o200k
    pre-tokenizer ("gpt-4o"), harmony's control tokens, <|return|> as EOS and gpt-oss's chat
    template. Returns the ids of the specials."""
    n = len(gguf.GGUFReader(GPT_OSS).fields["tokenizer.ggml.tokens"].contents())
    toks = byte_tokens() + ["ab"] + SPECIALS + ["<|startoftext|>"]
    toks += [f"<|reserved_{i}|>" for i in range(n - len(toks))]
    types = [1] * 257 + [3] * (n - 257)                                   # normal, control
    ids = {t: i for i, t in enumerate(toks)}

    def vocabulary(w):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-4o")
        w.add_token_list(toks)
        w.add_token_types(types)
        w.add_token_merges(["a b"])
        w.add_bos_token_id(ids["<|startoftext|>"])
        w.add_eos_token_id(ids["<|return|>"])
        w.add_add_bos_token(False)

    with open(testdata("templates", "openai-gpt-oss-120b.jinja"), encoding="utf-8") as f:
        add_chat_template(GPT_OSS, dst, f.read(), skip=("tokenizer.",), add=vocabulary)
    return {s: ids[s] for s in SPECIALS}


def test_harmony_reply_and_tool_call_through_the_daemon(tmp_path):
    pytest.importorskip("edged._core")
    d = make_daemon(tmp_path, default_model="oss", ctx_size=1024, max_body_bytes=65536)
    ids = harmony_model(str(tmp_path / "models" / "oss.gguf"))
    t = {s: f"<[{i}]>" for s, i in ids.items()}
    forced = (f'start: {t["<|channel|>"]} "analysis" {t["<|message|>"]} "Let me think." {t["<|end|>"]} '
              f'{t["<|start|>"]} "assistant" {t["<|channel|>"]} "final" {t["<|message|>"]} "Hi there."\n')
    d.start_threads()

    async def ask(**extra):
        body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 80, "temperature": 0,
                **extra}
        return await d.api.handle(ApiRequest("POST", "/v1/chat/completions", json.dumps(body).encode()))

    async def stream(**extra):
        s = await ask(stream=True, **extra)
        chunks = [json.loads(c[6:]) async for c in s.chunks() if c != b"data: [DONE]\n\n"]
        await s.close()
        return [c["choices"][0] for c in chunks if c["choices"]]

    async def main():
        r = await ask(grammar=forced, chat_template_kwargs={"reasoning_effort": "low"})
        assert r.status == 200, r.body
        ch = r.body["choices"][0]
        assert ch["message"]["reasoning_content"] == "Let me think.", ch
        assert ch["message"]["content"] == "Hi there." and ch["finish_reason"] == "stop", ch
        deltas = [c["delta"] for c in await stream(grammar=forced)]
        assert "".join(x.get("reasoning_content", "") for x in deltas) == "Let me think."
        assert "".join(x.get("content") or "" for x in deltas) == "Hi there."
        # OpenAI's reasoning_effort is the template's variable (chat_template_kwargs wins)
        n = {e: (await ask(max_tokens=1, reasoning_effort=e)).body["usage"]["prompt_tokens"]
             for e in ("low", "high")}
        assert n["low"] != n["high"]
        kw = await ask(max_tokens=1, reasoning_effort="low", chat_template_kwargs={"reasoning_effort": "high"})
        assert kw.body["usage"]["prompt_tokens"] == n["high"]
        bad = await ask(reasoning_effort="extreme")
        assert bad.status == 400 and bad.body["error"]["param"] == "reasoning_effort"
        raw = (await ask(grammar=forced, reasoning_format="none")).body["choices"][0]["message"]
        assert raw["content"] == "<|channel|>analysis<|message|>Let me think.<|end|>Hi there."
        assert "reasoning_content" not in raw

        r = await ask(tools=[WEATHER], tool_choice="required")
        assert r.status == 200, r.body
        ch = r.body["choices"][0]
        assert r.status == 200 and ch["finish_reason"] == "tool_calls", r.body
        (call,) = ch["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"])["city"] in ("Oslo", "Paris")
        assert ch["message"]["content"] is None
        got = await stream(tools=[WEATHER], tool_choice="required")
        calls = [tc for c in got for tc in c["delta"].get("tool_calls") or ()]
        assert [(c["index"], c["function"]) for c in calls] == [(0, call["function"])]
        assert got[-1]["finish_reason"] == "tool_calls"
        assert not "".join(c["delta"].get("content") or "" for c in got)
        await d.registry.close_all()

    try:
        asyncio.run(main())
    finally:
        d.decoder.stop()

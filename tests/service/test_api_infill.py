"""/infill and /v1/completions with `suffix` through a real daemon: a code model's FIM tokens on
the stories260K model (its last six tokens renamed to Qwen2.5-Coder's FIM texts, found by text
as llama.cpp finds them), driven with the bodies llama.vim sends (its autoload/llama.vim: the
completion request with response_fields, and the n_predict 0 warm-up of its extra context);
the prompt the daemon evaluates is llama-server's layout (text/infill.py), shown by greedy
completions of the same ids through /v1/completions; streaming; a model without FIM tokens."""
import json
import os

import pytest

from conftest import testdata
from daemon_support import Server, UnixHTTPConnection, model_dir, request, signing_key
from gguf_clone import clone

FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>",
       "<|file_sep|>"]
PREFIX = "Once upon a time, there was a little girl named Lily.\n"
SUFFIX = "\nThe end.\n"
EXTRA = [{"text": "Lily had a dog.\n", "time": [1733, 5000], "filename": "notes.txt"},
         {"text": "The dog was big.\n", "time": [1733, 6000], "filename": "more.txt"}]

# llama.vim's FIM request (autoload/llama.vim, llama#fim), with its fields and values
LLAMA_VIM = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA, "prompt": "She",
             "n_predict": 16, "n_indent": 0, "top_k": 40, "top_p": 0.99, "stream": False,
             "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
             "t_max_predict_ms": 1500,
             "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms",
                                 "timings/prompt_per_token_ms", "timings/prompt_per_second",
                                 "timings/predicted_n", "timings/predicted_ms",
                                 "timings/predicted_per_token_ms", "timings/predicted_per_second",
                                 "truncated", "tokens_cached"]}
# ... and its ring-buffer update (s:ring_update): the extra context alone, nothing predicted
LLAMA_VIM_WARMUP = {"input_prefix": "", "input_suffix": "", "input_extra": EXTRA, "prompt": "",
                    "n_predict": 0, "temperature": 0.0, "stream": False, "samplers": [],
                    "cache_prompt": True, "t_max_prompt_ms": 1, "t_max_predict_ms": 1,
                    "response_fields": [""]}


# llama.vscode's (src/llama-server.ts createRequestPayload; chunks from src/extra-context.ts)
VSCODE_CHUNKS = [{"text": "Lily had a dog.\n", "time": 1733500000000, "filename": "/src/notes.txt"}]
LLAMA_VSCODE = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": VSCODE_CHUNKS,
                "prompt": "", "n_predict": 8, "top_k": 40, "top_p": 0.99, "stream": False,
                "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "n_indent": 4,
                "t_max_prompt_ms": 500, "t_max_predict_ms": 2500}
LLAMA_VSCODE_WARMUP = {"input_prefix": "", "input_suffix": "", "input_extra": VSCODE_CHUNKS,
                       "prompt": "", "n_predict": 0, "samplers": [], "cache_prompt": True,
                       "t_max_prompt_ms": 500, "t_max_predict_ms": 1}


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    import gguf
    src = testdata("models", "stories260K.gguf")
    toks = gguf.GGUFReader(src).fields["tokenizer.ggml.tokens"].contents()
    toks = toks[:-len(FIM)] + FIM
    return clone(src, tmp_path_factory.mktemp("coder") / "coder.gguf", tokens=toks)


@pytest.fixture(scope="module")
def srv(tmp_path_factory, coder):
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("api-infill")
    models = model_dir(tmp, key, {"coder": str(coder), "coder-spm": str(coder),
                                  "stories": testdata("models", "stories260K.gguf")})
    s = Server(tmp, models, trusted, default_model="coder",
               extra={"n_parallel": 2, "ctx_size": 512, "threads": 2, "auto_load": True,
                      "spm_infill": ["coder-spm"]})
    yield s
    assert s.stop() == 0, s.logtext()


@pytest.fixture(scope="module")
def tok(coder):
    from edged.text.tokenizer import Tokenizer
    return Tokenizer.from_gguf(str(coder))


def expected_ids(tok, prefix, suffix, extra=(), prompt="", spm_infill=False):
    from edged.service.prepare import infill_ids
    from edged.text.infill import Infill
    return infill_ids(tok, Infill(prefix, suffix, tuple((e.get("filename"), e["text"]) for e in extra),
                                  prompt), 512, None, spm_infill)


def test_llama_vim_request(srv, tok):
    st, _, r = request(srv.socket, "POST", "/infill", LLAMA_VIM)
    assert st == 200, r
    assert set(r) == set(LLAMA_VIM["response_fields"])      # only these, nested as "a/b" keys
    assert isinstance(r["content"], str) and r["truncated"] is False
    ids = expected_ids(tok, PREFIX, SUFFIX, EXTRA, "She")
    assert r["timings/prompt_n"] <= len(ids) and r["tokens_cached"] >= len(ids)
    assert 0 < r["timings/predicted_n"] <= 16
    # the same ids through /v1/completions, greedy: the same text (the layout is the one used)
    body = dict(LLAMA_VIM, temperature=0.0, response_fields=None)
    st, _, a = request(srv.socket, "POST", "/infill", body)
    st2, _, b = request(srv.socket, "POST", "/v1/completions",
                        {"prompt": ids, "max_tokens": 16, "temperature": 0.0})
    assert st == st2 == 200
    assert a["content"] == b["choices"][0]["text"]
    assert a["tokens_evaluated"] == len(ids) == b["usage"]["prompt_tokens"]
    assert a["stop"] is True and a["stop_type"] in ("eos", "limit") and a["model"] == "coder"


def test_llama_vim_warmup(srv):
    st, _, r = request(srv.socket, "POST", "/infill", LLAMA_VIM_WARMUP)
    assert st == 200 and r == {}          # response_fields [""] names nothing


def test_llama_vscode_request(srv):
    """It reads content, tokens_cached, truncated and timings.* of the whole reply."""
    st, _, r = request(srv.socket, "POST", "/infill", LLAMA_VSCODE)
    assert st == 200, r
    assert isinstance(r["content"], str) and r["truncated"] is False and r["tokens_cached"] > 0
    assert {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
            "predicted_per_second"} <= set(r["timings"])
    assert 0 < r["timings"]["predicted_n"] <= 8
    st, _, r = request(srv.socket, "POST", "/infill", LLAMA_VSCODE_WARMUP)
    assert st == 200 and r["content"] == "" and r["stop"] is True


def test_completions_suffix_is_infill(srv, tok):
    body = {"model": "coder", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 12, "temperature": 0}
    st, _, r = request(srv.socket, "POST", "/v1/completions", body)
    assert st == 200, r
    st, _, i = request(srv.socket, "POST", "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX,
                                                        "n_predict": 12, "temperature": 0})
    assert r["choices"][0]["text"] == i["content"]
    assert r["usage"]["prompt_tokens"] == len(expected_ids(tok, PREFIX, SUFFIX))
    st, _, r = request(srv.socket, "POST", "/v1/completions", dict(body, prompt=[PREFIX, "x"]))
    assert st == 400 and r["error"]["param"] == "suffix"


def test_spm_infill_model_puts_the_suffix_first(srv, tok):
    """config spm_infill (llama-server's --spm-infill): the listed model's FIM prompt is
    suffix-prefix-middle; the same file under another name keeps prefix-suffix-middle."""
    spm, psm = expected_ids(tok, PREFIX, SUFFIX, spm_infill=True), expected_ids(tok, PREFIX, SUFFIX)
    assert spm != psm and sorted(spm) == sorted(psm)
    fim = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12, "temperature": 0}
    for model, ids in (("coder-spm", spm), ("coder", psm)):
        st, _, a = request(srv.socket, "POST", "/infill", dict(fim, model=model))
        st2, _, b = request(srv.socket, "POST", "/v1/completions",
                            {"model": model, "prompt": ids, "max_tokens": 12, "temperature": 0})
        assert st == st2 == 200, (a, b)
        assert a["content"] == b["choices"][0]["text"] and a["tokens_evaluated"] == len(ids)


def test_ollama_generate_with_suffix_is_infill(srv):
    """Ollama's /api/generate with `suffix` (Continue's and Ollama's own code completion) fills
    in the middle as /infill does."""
    body = {"model": "coder", "prompt": PREFIX, "suffix": SUFFIX, "stream": False,
            "options": {"num_predict": 12, "temperature": 0, "repeat_penalty": 1.0}}   # Ollama: 1.1
    st, _, r = request(srv.socket, "POST", "/api/generate", body)
    assert st == 200, r
    st, _, i = request(srv.socket, "POST", "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX,
                                                        "n_predict": 12, "temperature": 0})
    assert r["response"] == i["content"] and r["done"] is True
    assert r["prompt_eval_count"] == i["tokens_evaluated"]


def test_stream(srv):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 10, "temperature": 0}
    st, _, whole = request(srv.socket, "POST", "/infill", body)
    c = UnixHTTPConnection(srv.socket, 120)
    c.request("POST", "/infill", body=json.dumps(dict(body, stream=True)),
              headers={"Content-Type": "application/json"})
    text = c.getresponse().read().decode()
    c.close()
    events = [json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: ")]
    assert "[DONE]" not in text                 # llama-server's non-OpenAI stream
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["tokens_predicted"] == whole["tokens_predicted"]


def test_errors(srv):
    st, _, r = request(srv.socket, "POST", "/infill", {"model": "stories", "input_prefix": "a",
                                                        "input_suffix": "b"})
    assert st == 400 and "prefix token, suffix token, middle token" in r["error"]["message"]
    st, _, r = request(srv.socket, "POST", "/infill", {"input_suffix": "b"})
    assert st == 400 and "input_prefix" in r["error"]["message"]
    st, _, r = request(srv.socket, "POST", "/infill", {"input_prefix": "a", "input_suffix": "b",
                                                        "input_extra": [{"filename": "x"}]})
    assert st == 400 and "input_extra[0].text" in r["error"]["message"]
    st, _, r = request(srv.socket, "POST", "/infill", {"input_prefix": "a", "input_suffix": "b",
                                                        "n_predict": -2})
    assert st == 400 and "n_predict" in r["error"]["message"]
    assert os.path.exists(srv.socket)


def test_t_max_predict_ms_after_a_new_line(srv):
    """llama-server's latency bound for editors: once the reply has a new line, it stops when
    t_max_predict_ms have passed since its first token (a grammar makes every line short)."""
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 200, "temperature": 0,
            "grammar": 'root ::= ("ab\\n")+'}
    st, _, r = request(srv.socket, "POST", "/infill", dict(body, t_max_predict_ms=1))
    assert st == 200, r
    assert r["content"].startswith("ab\n") and r["stop_type"] == "limit"
    assert r["tokens_predicted"] < 200
    st, _, r = request(srv.socket, "POST", "/infill", dict(body, n_predict=12))
    assert st == 200 and r["tokens_predicted"] == 12 and r["stop_type"] == "limit"


def test_predict_limit_waits_for_a_new_line():
    import threading
    import time
    from types import SimpleNamespace
    from edged.service.infill import PredictLimit
    c = SimpleNamespace(job=SimpleNamespace(cancel=threading.Event()))
    lim = PredictLimit(1)
    lim.see(c, "no line yet")
    time.sleep(0.01)                    # at least 10 ms pass, however loaded the machine
    lim.see(c, "still none")
    assert not c.job.cancel.is_set()
    lim.see(c, "a new line\n")
    assert c.job.cancel.is_set() and lim.hit
    off = PredictLimit(None)
    off.see(c, "\n")
    assert off.t0 is None

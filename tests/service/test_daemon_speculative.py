"""Speculative decoding in the daemon (config speculative / draft_model / draft_max): replies
are the same tokens with lookup, with a draft model and with speculation off, for greedy and
seeded requests, four streams at once in continuous batching; a request opts out with
"speculative": false; /metrics and the request log count drafted and accepted tokens."""
import re

import pytest

from conftest import testdata
from daemon_support import Server, gather, model_dir, signing_key

PROMPTS = ['Record: {"id": 7, "name": "pump", "status": "ok", "temp": 41}\nSame record with status "off":\nRecord: {"id": 7,',
           "Copy the list: apples, pears, plums, cherries, figs.\nList: apples,",
           "Once upon a time there was a little robot who",
           "The quick brown fox jumps over the lazy dog. The quick brown"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("speculative")
    smol = testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    d = model_dir(tmp, key, {"plain": smol, "look": smol, "drafted": smol, "helper": smol})
    s = Server(tmp_path_factory.mktemp("daemon"), d, trusted, default_model="plain",
               extra={"n_parallel": 4, "max_queue": 16, "max_loaded_models": 3,
                      "speculative": {"look": "lookup", "drafted": "draft"},
                      "draft_model": {"drafted": "helper"}, "draft_max": 4})
    yield s
    assert s.stop() == 0, s.logtext()


def _texts(srv, model, extra=None):
    bodies = []
    for i, p in enumerate(PROMPTS):
        sampling = {"temperature": 0} if i % 2 == 0 else {"temperature": 0.9, "seed": 40 + i}
        bodies.append({"model": model, "prompt": p, "max_tokens": 24, **sampling, **(extra or {})})

    async def one(session, body):
        async with session.post("http://edged/v1/completions", json=body) as r:
            j = await r.json()
            assert r.status == 200, j
        return j["choices"][0]["text"]

    return gather(srv.socket, one, bodies, timeout=600)


def _metric(srv, name):
    status, _, body = srv.request("GET", "/metrics")
    m = re.search(rf"^{name} ([0-9.e+]+)$", body if isinstance(body, str) else body.decode(), re.M)
    return float(m.group(1))


def test_same_replies_with_lookup_draft_model_and_off(srv):
    plain = _texts(srv, "plain")
    before = _metric(srv, "edged_draft_tokens_total")
    assert _metric(srv, "edged_draft_tokens_total") == before == 0
    assert _texts(srv, "look") == plain
    drafted = _metric(srv, "edged_draft_tokens_total")
    accepted = _metric(srv, "edged_draft_accepted_tokens_total")
    assert drafted > 0 and 0 < accepted <= drafted
    assert _texts(srv, "drafted") == plain          # the same file drafts: accepted under greedy
    assert _metric(srv, "edged_draft_tokens_total") > drafted
    assert re.search(r"drafted=\d+ accepted=\d+", srv.logtext()), srv.logtext()[-2000:]
    n = _metric(srv, "edged_draft_tokens_total")
    assert _texts(srv, "look", {"speculative": False}) == plain     # opted out: nothing drafted
    assert _metric(srv, "edged_draft_tokens_total") == n


def test_opt_out_field_is_typed(srv):
    status, _, body = srv.request("POST", "/v1/completions", {"model": "plain", "prompt": "x", "speculative": "no"})
    assert status == 400 and "speculative" in str(body)


def test_draft_model_refused_at_load_with_the_reason(tmp_path):
    from edged.errors import ConfigError
    from edged.service import config
    from edged.service.loader import Loader
    d = model_dir(tmp_path, None, {"smol": testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf"),
                                   "tiny": testdata("models", "stories260K.gguf")})
    cfg = config.load(None, {"models_dir": d, "require_signature": False, "threads": 1, "ctx_size": 64,
                             "speculative": {"*": "draft"}, "draft_model": {"smol": "tiny"}})
    loader = Loader(cfg, None)
    with pytest.raises(ConfigError, match=r"tiny.gguf: its vocabulary differs from .*smol.gguf.s: 512 tokens against 49152"):
        loader.load("smol", f"{d}/smol.gguf")
    with pytest.raises(ConfigError, match="needs draft_model.tiny"):
        loader.load("tiny", f"{d}/tiny.gguf")
    lm = Loader(config.load(None, {"models_dir": d, "require_signature": False, "threads": 1, "ctx_size": 64,
                                   "speculative": {"smol": "draft"}, "draft_model": {"smol": "smol"}}), None
                ).load("smol", f"{d}/smol.gguf")
    try:    # the draft model's weights and a KV cache per slot are counted in the model's size
        assert lm.size >= 2 * lm.model.memory_plan.weights
    finally:
        lm.close()

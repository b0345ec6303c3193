"""What a non-admin request may make the daemon do (issue 13.2 and 13.4): load only the models
the policy allows (403 model_not_loaded otherwise), swap no more often than swap_interval,
and only numbers the compiled sampler can hold (400, never 500)."""
import asyncio
import json

import numpy as np
import pytest

from daemon_support import ONCE, alpha_beta_models
from edged.service import config
from edged.service.wire import ApiRequest, Peer
from edged.service.daemon import Daemon, load_trust
from edged.text.sampling import INT32_MAX, REQUEST_BOUNDS, Sampler, SamplingParams

USER = Peer(4242, 1000, 1000, ())          # an allowed client, not an admin
OTHER = Peer(4243, 1001, 1001, ())
ROOT_PEER = Peer(1, 0, 0, ())              # admin by default (admin_uids = [0])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return alpha_beta_models(tmp_path_factory, "policy")


def _daemon(models, **overrides):
    models_dir, trusted = models
    cfg = config.load(None, {"models_dir": models_dir, "trusted_keys": trusted, "socket": "/tmp/unused.sock",
                             "default_model": "alpha", "max_loaded_models": 1, "ctx_size": 64, "threads": 1,
                             "allow_uids": [0, 1000, 1001], "warmup": False, **overrides})
    d = Daemon(cfg)
    d.prepare(load_trust(cfg))
    d.start_threads()
    return d


def _ask(d, loop, peer, model, path="/tokenize"):
    body = {"model": model, "content": "hi"} if path == "/tokenize" else \
        {"model": model, "prompt": ONCE, "max_tokens": 2, "temperature": 0}
    return loop.run_until_complete(d.api.handle(ApiRequest("POST", path, json.dumps(body).encode(), peer)))


def _run(models, test, **overrides):
    loop = asyncio.new_event_loop()
    d = _daemon(models, **overrides)
    try:
        loop.run_until_complete(d.registry.ensure_loaded("alpha"))
        test(d, loop)
    finally:
        d.decoder.stop()
        loop.run_until_complete(d.registry.close_all())
        loop.close()


def test_non_admin_cannot_load_another_model_by_default(models):
    def test(d, loop):
        r = _ask(d, loop, USER, "beta", "/v1/completions")
        assert r.status == 403 and r.body["error"]["code"] == "model_not_loaded", r.body
        assert "beta" in r.body["error"]["message"] and "auto_load" in r.body["error"]["message"]
        assert list(d.registry.models) == ["alpha"]           # nothing was swapped
        assert _ask(d, loop, USER, "alpha").status == 200      # the loaded model is served
        assert _ask(d, loop, ROOT_PEER, "beta").status == 200  # an admin may load it
        assert list(d.registry.models) == ["beta"]
        assert _ask(d, loop, USER, "alpha").status == 200      # the default model may come back
    _run(models, test)


def test_allow_list_by_uid_and_gid_and_swap_rate_limit(models):
    def test(d, loop):
        assert _ask(d, loop, OTHER, "beta").status == 403
        assert _ask(d, loop, USER, "beta").status == 200       # uid 1000 is on beta's list
        r = _ask(d, loop, USER, "alpha")                        # swapping back at once: too soon
        assert r.status == 429 and r.body["error"]["code"] == "swap_rate_limited", r.body
        assert 1 <= int(r.headers["Retry-After"]) <= 60
        assert list(d.registry.models) == ["beta"]
        assert _ask(d, loop, USER, "beta").status == 200       # the loaded one still serves
        assert _ask(d, loop, ROOT_PEER, "alpha").status == 200  # admins are not rate-limited
    _run(models, test, auto_load_allow={"beta": ["uid:1000", "gid:4000"]}, swap_interval=60)


def test_auto_load_lets_anyone_swap_at_most_once_per_interval(models):
    def test(d, loop):
        assert _ask(d, loop, OTHER, "beta").status == 200
        assert _ask(d, loop, OTHER, "alpha").status == 429
        d.policy.last_swap -= 61                               # the interval has passed
        assert _ask(d, loop, OTHER, "alpha").status == 200
    _run(models, test, auto_load=True, swap_interval=60)


def test_group_on_the_allow_list(models):
    member = Peer(4244, 1001, 1001, (4000,))
    def test(d, loop):
        assert _ask(d, loop, member, "beta").status == 200
    _run(models, test, auto_load_allow={"beta": ["gid:4000"]})


# --- numbers (issue 13.4) ---------------------------------------------------------------------

@pytest.mark.parametrize("field,value", [("top_k", INT32_MAX + 1), ("top_k", 2**63), ("top_k", -1),
                                         ("temperature", 1e308), ("repeat_penalty", 1e-300),
                                         ("top_p", float("nan")), ("min_p", 2)])
def test_out_of_range_numbers_are_400_naming_the_field(models, field, value):
    def test(d, loop):
        body = {"model": "alpha", "prompt": ONCE, "max_tokens": 2, field: value}
        r = loop.run_until_complete(d.api.handle(ApiRequest("POST", "/v1/completions",
                                                            json.dumps(body).encode(), ROOT_PEER)))
        assert r.status == 400 and field in r.body["error"]["message"], r.body
    _run(models, test)


def test_largest_top_k_the_sampler_holds_is_accepted(models):
    def test(d, loop):
        body = {"model": "alpha", "prompt": ONCE, "max_tokens": 2, "top_k": INT32_MAX, "seed": 1}
        r = loop.run_until_complete(d.api.handle(ApiRequest("POST", "/v1/completions",
                                                            json.dumps(body).encode(), ROOT_PEER)))
        assert r.status == 200, r.body
    _run(models, test)


def test_temperature_that_underflows_float32_is_greedy(models):
    def test(d, loop):
        out = {}
        for t in (0, 5e-324, 1e-40):
            body = {"model": "alpha", "prompt": ONCE, "max_tokens": 8, "temperature": t, "seed": 3}
            r = loop.run_until_complete(d.api.handle(ApiRequest("POST", "/v1/completions",
                                                                json.dumps(body).encode(), ROOT_PEER)))
            assert r.status == 200, r.body
            out[t] = r.body["choices"][0]["text"]
        assert out[5e-324] == out[0] == out[1e-40] and "\0" not in out[5e-324], out
    _run(models, test)


def test_sampler_is_greedy_below_float32_range():
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.normal(size=257).astype(np.float32)
        for t in (5e-324, 1e-45, 1e-39):
            assert Sampler(257, SamplingParams(temperature=t, seed=1)).sample(logits) == int(np.argmax(logits))


def test_request_bounds_fit_the_compiled_sampler():
    """Every integer bound fits a C int and every float bound is finite in float32."""
    for name, b in REQUEST_BOUNDS.items():
        if name == "seed":          # keys the uniforms (keyed_uniform, 64 bits), never reaches the C sampler
            assert b.hi == (1 << 64) - 1
            continue
        if b.integer:
            assert -2**31 <= b.lo <= b.hi <= INT32_MAX, name
        else:
            assert np.isfinite(np.float32(b.lo)) and np.isfinite(np.float32(b.hi)), name
            assert np.float32(b.lo) != 0 or b.lo == 0, name     # no bound that is 0 in float32

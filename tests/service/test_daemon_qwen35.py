"""A qwen35 model (Gated DeltaNet layers beside gated attention) through the daemon: the same
greedy request gives the same text on a cold start, after a prefix-cache hit (a checkpoint of
another request's recurrent state restored, the rest replayed), while other streams decode in
the same steps, and as each of n=2 choices (forked sessions); a chat conversation sent again
with one more turn hits the cache and answers as a cold daemon would; the conversation's
prefix survives a daemon restart (its recurrent state spilled to the prompt cache on disk)."""
import os
import re

import pytest

from conftest import ROOT
from daemon_support import (PASSAGE, Server, add_chat_template, chat16, check_cold_hit_streams_forks,
                            check_conversation_sent_again, family_server, model_dir, signing_key)
from edged import Model

QWEN35 = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-qwen35.gguf")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    pytest.importorskip("edged._core")
    s = family_server(tmp_path_factory, "qwen35", QWEN35, chat=True)
    yield s
    assert s.stop() == 0, s.logtext()


def test_same_text_cold_after_prefix_hit_with_other_streams_and_forked(srv):
    check_cold_hit_streams_forks(srv)


def test_a_conversation_sent_again_hits_the_cache(srv, tmp_path_factory):
    """Turn 2 repeats turn 1 and its answer: the daemon reuses the session (its state restored
    from the checkpoint at the end of turn 1's prompt, the answer replayed) and answers what a
    daemon that never saw turn 1 answers."""
    check_conversation_sent_again(srv, tmp_path_factory, "qwen35", QWEN35)


def test_prefix_survives_a_restart_with_the_same_answer(tmp_path_factory):
    """SIGTERM spills the idle session (K/V rows of the attention layer, the DeltaNet state
    and its checkpoints) to cache_dir; a new daemon restores it for the same conversation,
    evaluates only the last prompt token and answers what the first daemon answered."""
    pytest.importorskip("edged._core")
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("qwen35-restart")
    add_chat_template(QWEN35, str(tmp / "q.gguf"))
    models = model_dir(tmp, key, {"qwen35": str(tmp / "q.gguf")})
    cache = tmp / "cache"
    conv = [{"role": "user", "content": PASSAGE + ", " + PASSAGE}]   # > SPILL_MIN_TOKENS

    def serve():
        return Server(tmp_path_factory.mktemp("daemon"), models, trusted, default_model="qwen35",
                      extra={"cache_dir": str(cache)})
    srv = serve()
    try:
        first, u1 = chat16(srv.socket, conv)
    finally:
        assert srv.stop() == 0, srv.logtext()
    assert [f for f in os.listdir(cache) if f.endswith(".edkv")]
    srv = serve()
    try:
        again, u2 = chat16(srv.socket, conv)
        n = u2["prompt_tokens"]
        assert u2["prompt_tokens_details"]["cached_tokens"] == n - 1, u2
        assert re.search(rf"prompt_tokens={n} cached_tokens={n - 1} prompt_eval=1 ", srv.logtext())
        assert "restored" in srv.logtext()
        # /metrics: one slot's cache is the attention layer's K/V rows and the recurrent state
        from edged.engine.recurrent import state_bytes
        with Model.load(QWEN35, backend="reference") as m:
            want = 256 * 2 * (2 * m.hp.n_head_kv * m.hp.head_dim) + state_bytes(m.hp)
        _, _, text = srv.request("GET", "/metrics")
        got = re.search(r'^edged_model_kv_cache_bytes\{model="qwen35".*\} (\S+)$', text, re.M)
        assert got and float(got.group(1)) == want, (want, got and got.group(0))
    finally:
        assert srv.stop() == 0, srv.logtext()
    assert again == first and len(first) > 5

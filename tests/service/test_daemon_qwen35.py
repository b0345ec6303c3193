"""A qwen35 model (Gated DeltaNet layers beside gated attention) through the daemon: the same
greedy request gives the same text on a cold start, after a prefix-cache hit (a checkpoint of
another request's recurrent state restored, the rest replayed), while other streams decode in
the same steps, and as each of n=2 choices (forked sessions); a chat conversation sent again
with one more turn hits the cache and answers as a cold daemon would."""
import os

import pytest

from conftest import ROOT
from daemon_support import Server, add_chat_template, model_dir, request, signing_key, streamed

QWEN35 = os.path.join(ROOT, "tests", "data", "goldens", "synthetic-qwen35.gguf")
PASSAGE = ("the little bird sat on the old wall and looked at the garden where the children "
           "played every morning before school, and the sun was warm")
ENDINGS = [" and then", " but the cat", " so they ran", " when it rained"]


def _server(tmp_path_factory, name):
    key, trusted = signing_key(tmp_path_factory)
    tmp = tmp_path_factory.mktemp(name)
    chat = str(tmp / "qwen35-chat.gguf")
    add_chat_template(QWEN35, chat)
    d = model_dir(tmp, key, {"qwen35": chat})
    return Server(tmp_path_factory.mktemp("daemon"), d, trusted, default_model="qwen35",
                  extra={"n_parallel": 4, "max_queue": 8, "pin_default_model": True})


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    pytest.importorskip("edged._core")
    s = _server(tmp_path_factory, "qwen35")
    yield s
    assert s.stop() == 0, s.logtext()


def _complete(srv, bodies):
    """(texts of its choices, usage) of each request, all sent at once, each streamed."""
    out = []
    for events, usage in streamed(srv.socket, bodies):
        texts = {}
        for e in events:
            for c in e.get("choices", []):
                texts[c["index"]] = texts.get(c["index"], "") + c["text"]
        out.append(([texts[i] for i in sorted(texts)], usage))
    return out


def test_same_text_cold_after_prefix_hit_with_other_streams_and_forked(srv):
    bodies = [{"prompt": PASSAGE + e, "max_tokens": 24, "temperature": 0} for e in ENDINGS]
    a = bodies[0]
    (cold, u0), = _complete(srv, [a])               # nothing cached yet
    assert u0.get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0, u0
    (other, u1), = _complete(srv, [bodies[1]])      # the passage comes from a's session
    assert u1["prompt_tokens_details"]["cached_tokens"] > 20, u1
    (hit, u2), = _complete(srv, [a])                # a's prefix from b's session, then its own
    assert u2["prompt_tokens_details"]["cached_tokens"] > 20, u2
    assert hit == cold
    together = _complete(srv, bodies)               # four streams in the same steps
    assert together[0][0] == cold and together[1][0] == other
    (two, _), = _complete(srv, [dict(a, n=2)])      # two forks of one prefilled prompt
    assert two == cold * 2
    assert len(cold[0]) > 10


def _chat(sock, messages):
    st, _, r = request(sock, "POST", "/v1/chat/completions",
                       {"messages": messages, "max_tokens": 16, "temperature": 0})
    assert st == 200, r
    return r["choices"][0]["message"]["content"], r["usage"]


def test_a_conversation_sent_again_hits_the_cache(srv, tmp_path_factory):
    """Turn 2 repeats turn 1 and its answer: the daemon reuses the session (its state restored
    from the checkpoint at the end of turn 1's prompt, the answer replayed) and answers what a
    daemon that never saw turn 1 answers."""
    turn1 = [{"role": "user", "content": PASSAGE}]
    answer, u1 = _chat(srv.socket, turn1)
    turn2 = turn1 + [{"role": "assistant", "content": answer},
                     {"role": "user", "content": "and what did the bird do then"}]
    warm, u2 = _chat(srv.socket, turn2)
    assert u2["prompt_tokens_details"]["cached_tokens"] >= u1["prompt_tokens"], (u1, u2)
    fresh = _server(tmp_path_factory, "qwen35-cold")
    try:
        cold, u3 = _chat(fresh.socket, turn2)
    finally:
        assert fresh.stop() == 0, fresh.logtext()
    assert u3.get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0, u3
    assert warm == cold and len(warm) > 5

"""The decode thread owns the loop: each step is one Model.decode holding the next token of
every running stream and a chunk of a prompt still going in. A long prompt arriving while
streams decode is spread over the steps instead of stalling them, and no reply changes."""
import asyncio
import time

import pytest

from conftest import testdata


def test_chunk_size_follows_the_measured_costs():
    from edged.service.scheduler import MIN_CHUNK, PREFILL_CHUNK, PROMPT_SHARE, _Costs
    c = _Costs()
    assert c.chunk() == MIN_CHUNK                    # nothing measured yet: the least
    c.decode_ms, c.token_ms = 20.0, 0.5
    assert c.chunk() == int(PROMPT_SHARE * 40)
    c.token_ms = 1e-3
    assert c.chunk() == PREFILL_CHUNK
    c.token_ms = 100.0
    assert c.chunk() == MIN_CHUNK
    # from measured steps: decode-only steps give the base, mixed steps the cost per prompt token
    c = _Costs()
    c.record(20.0, 3, 0)
    c.record(50.0, 3, 60)                            # 30 ms more for 60 prompt tokens
    assert (c.decode_ms, c.token_ms) == (20.0, 0.5)
    assert c.chunk() == int(PROMPT_SHARE * 40)       # a step then costs ~2.5x a decode step


def test_long_prompt_goes_in_between_the_streams_tokens():
    from edged import Model
    from edged.service.scheduler import MIN_CHUNK, PREFILL_CHUNK, Decoder, Job
    m = Model.load(testdata("models", "stories260K.gguf"), n_threads=2)
    no_eos = {t: -100.0 for t in m.tokenizer.eog_ids}
    shorts = ["Once upon a time", "The little dog", "Lily and Ben went to the park"]
    long_ids = (m.tokenizer.encode("The sun was warm and the birds sang in the tall trees. ") * 40)[:400]
    want = ["".join(o.text for o in m.session(512).generate(p, max_tokens=400, logit_bias=no_eos))
            for p in shorts]
    want_long = "".join(o.text for o in m.session(512).generate(long_ids, max_tokens=3))

    calls = []
    real = m.decode

    def spy(entries):
        calls.append([(e.session, len(e.tokens)) for e in entries])
        return real(entries)

    m.decode = spy
    decoder = Decoder()

    async def run(prompt, sampling, sessions):
        loop = asyncio.get_running_loop()

        def make_gen():
            s = m.session(512)
            sessions.append(s)
            return s.start(prompt, **sampling)

        job = Job(loop, make_gen, lambda: None, time.monotonic() + 300)
        decoder.submit(job)
        text = []
        while True:
            kind, value = await job.events.get()
            if kind == "token":
                text.append(value.text)
            elif kind == "error":
                raise value
            else:
                return "".join(text)

    async def main():
        sessions = []
        streams = [asyncio.create_task(run(p, {"max_tokens": 400, "logit_bias": no_eos}, sessions))
                   for p in shorts]
        while len(calls) < 5:
            await asyncio.sleep(0.001)
        long_session = []
        got_long = await run(long_ids, {"max_tokens": 3}, long_session)
        return await asyncio.gather(*streams), got_long, sessions, long_session[0]

    try:
        got, got_long, sessions, ls = asyncio.run(main())
    finally:
        decoder.stop()
        m.close()
    assert got == want and got_long == want_long
    # the steps that took a piece of the long prompt, up to its last piece
    pieces = [c for c in calls if ls in {s for s, _ in c}]
    absorbing = []
    n = 0
    for c in pieces:
        absorbing.append(c)
        n += dict(c)[ls]
        if n >= len(long_ids):
            break
    assert n == len(long_ids)
    assert len(absorbing) >= len(long_ids) // PREFILL_CHUNK + 1
    for i, c in enumerate(absorbing):
        d = dict(c)
        # every stream advanced by one token in the same call (they all outlast the prompt)
        assert all(d.get(s) == 1 for s in sessions), i
        assert d[ls] <= PREFILL_CHUNK
        if i + 1 < len(absorbing):
            assert d[ls] >= MIN_CHUNK

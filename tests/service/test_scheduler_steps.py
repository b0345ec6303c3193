"""The decode thread owns the loop: each step is one Model.decode holding the next token of
every running stream and a chunk of a prompt still going in. A long prompt arriving while
streams decode is spread over the steps instead of stalling them, and no reply changes."""
import asyncio
import statistics
import time

import pytest

from conftest import testdata
from edged.text.sampling import SamplingParams


class FakeMachine:
    """A cost clock for StepCosts, shaped like the measured costs of SmolLM2-135M on one thread
    (what tools/bench_pass_cost.py prints): a pass costs `base` ms plus `row` per decode row; a
    prompt token `a_rows` ms for its row while the pass has fewer than PANEL_ROWS rows, else
    `a_panels`, plus `panel` once per pass (unpacking the weights); and `b` per key its
    attention reads (the prompt so far); `b_decode` per key a stream's own attention reads
    (decode_keys; default b). Every `every`-th pass that carries prompt tokens beside streams
    takes `slow` times as long (the machine's other load; default never)."""

    def __init__(self, base=18.0, row=0.7, a_rows=4.5, a_panels=2.5, panel=60.0, b=0.004, b_decode=None,
                 slow=1.0, every=0):
        self.base, self.row, self.a_rows, self.a_panels = base, row, a_rows, a_panels
        self.panel, self.b = panel, b
        self.b_decode = b if b_decode is None else b_decode
        self.slow, self.every, self.mixed = slow, every, 0

    def ms(self, n_decode, pieces, decode_keys=0):
        from edged.service.scheduler import PANEL_ROWS, StepCosts
        n = sum(c for _, c in pieces)
        panels = n_decode + n >= PANEL_ROWS
        ms = (self.base + self.row * n_decode + self.b_decode * decode_keys
              + (self.panel if panels and pieces else 0.0)
              + (self.a_panels if panels else self.a_rows) * n
              + self.b * sum(StepCosts.keys(p, c) for p, c in pieces))
        if self.every and n_decode and n:
            self.mixed += 1
            if self.mixed % self.every == 0:
                return ms * self.slow
        return ms


def absorb(costs, machine, n_decode, length, warm=20):
    """Drive the policy over one prompt of `length` tokens while n_decode streams decode (their
    decode-only passes first; each stream's attention reads one key more per pass):
    [(prompt tokens, ms, ms of the streams' pass alone)] per pass until the prompt is in."""
    at = 12                                         # the streams' positions
    for _ in range(warm):
        k = max(n_decode, 3) * (at + 1)
        costs.record(machine.ms(max(n_decode, 3), [], k), max(n_decode, 3), [], k)
        at += 1
    pos, passes, clock = 0, [], 0.0
    while pos < length:
        k = n_decode * (at + 1)
        n, = costs.plan(n_decode, [(pos, length - pos)], k, [(0, clock)])
        pieces = [(pos, n)] if n else []            # 0: a probe pass, the streams alone
        ms = machine.ms(n_decode, pieces, k)
        costs.record(ms, n_decode, pieces, k)
        passes.append((n, ms, machine.ms(n_decode, [], k)))
        clock += ms
        pos += n
        at += 1 if n_decode else 0
    return passes


def test_costs_fit_rows_panels_and_attention_keys():
    from edged.service.scheduler import StepCosts
    c = StepCosts()
    assert c.plan(3, [(0, 2000)]) == [1]            # nothing measured yet: the least
    for ms in (20.0, 21.0, 19.0, 400.0, 20.0):       # one pass delayed by the machine
        c.record(ms, 3, [])
    assert c.decode_ms == 20.0                        # a median: the outlier does not count
    m = FakeMachine(base=20.0, row=0.0)
    for pos, n in ((0, 1), (1, 4), (5, 2), (500, 3), (900, 4), (1500, 1), (1501, 2)):
        c.record(m.ms(3, [(pos, n)]), 3, [(pos, n)])
    for pos, n in ((0, 128), (128, 128), (256, 80), (900, 40), (1500, 128)):
        c.record(m.ms(3, [(pos, n)]), 3, [(pos, n)])
    assert c.fits["rows"] == pytest.approx((0.0, m.a_rows, m.b), abs=1e-9)
    assert c.fits["panels"] == pytest.approx((m.panel, m.a_panels, m.b), rel=1e-6)
    # 2.5x the decode pass leaves 30 ms: the row path (4 tokens at most beside 3 decode rows),
    # fewer late in the prompt (attention); the panels' fixed cost alone is 60 ms
    assert c.plan(3, [(0, 5000)]) == [4]
    assert c.plan(3, [(1900, 5000)]) == [2]
    # a looser budget (120 ms: 100 ms of prompt) pays for the panels and fills them
    c.configure(6.0, 0.0, 128)
    n, = c.plan(3, [(0, 5000)])
    assert n > 4 and c.prompt_ms(3 + n, [(0, n)]) <= 100.0 < c.prompt_ms(4 + n, [(0, n + 1)])


def test_mixed_passes_stay_within_the_budget_and_the_prompt_progresses():
    from edged.service.scheduler import DECODE_LATENCY_BUDGET, DECODE_PROBE, PREFILL_CHUNK, StepCosts
    m = FakeMachine()
    decode = m.ms(3, [])
    c = StepCosts(slowdown=0)                        # the budget alone rules
    alone = absorb(c, m, 0, 1000)                    # the prompt alone first (as the benchmark)
    assert all(n == PREFILL_CHUNK for n, _, _ in alone[:-1])
    passes = absorb(c, m, 3, 1000)
    settled = passes[4:]                             # the row fit needs a few passes with spread
    # within the budget of the streams' own pass, which grows with them ...
    assert all(ms <= DECODE_LATENCY_BUDGET * own * 1.001 for _, ms, own in settled)
    assert passes[-1][2] > 1.15 * decode
    # ... and full: the prompt gets the rest of each pass
    assert statistics.median(ms / own for _, ms, own in settled) >= 0.8 * DECODE_LATENCY_BUDGET
    # the prompt progresses in every pass but the probes: one in DECODE_PROBE + 1 measures the
    # streams alone
    assert [i for i, (n, _, _) in enumerate(passes) if n == 0] == list(
        range(DECODE_PROBE, len(passes), DECODE_PROBE + 1))
    # where rows cost what panels do (no fixed cost), the prompt's time to first token with 3
    # streams decoding stays within 2x its time alone
    even = FakeMachine(a_rows=2.5, panel=0.0)
    c = StepCosts(slowdown=0)
    alone = sum(ms for _, ms, _ in absorb(c, even, 0, 1000))
    mixed = sum(ms for _, ms, _ in absorb(c, even, 3, 1000))
    assert mixed < 2.0 * alone, mixed / alone


def test_chunks_leave_room_for_the_slow_passes():
    """One pass in five beside the streams takes 1.3x its cost (the machine's other load): the
    chunks are sized to the measured spread, so those passes too stay within the budget, and
    the others keep most of it."""
    from edged.service.scheduler import DECODE_LATENCY_BUDGET, SPREAD_MIN, StepCosts
    budget = DECODE_LATENCY_BUDGET
    for slow, spread in ((1.0, False), (1.3, True)):
        m = FakeMachine(slow=slow, every=5)
        c = StepCosts(slowdown=0)
        absorb(c, m, 0, 1000)
        passes = [(n, ms / own) for n, ms, own in absorb(c, m, 3, 2000) if n]
        settled = [r for _, r in passes[SPREAD_MIN + 8:]]
        assert (c.spread > 1.1) == spread, c.spread
        # (the slow passes' own ratio to the prediction varies with the fit: a few % over)
        assert max(settled) <= budget * (1.05 if spread else 1.001)
        assert statistics.median(settled) >= (0.65 if spread else 0.8) * budget
        # the chunk: the most tokens whose predicted pass times the spread is within the limit
        k = 3 * 500
        c.record(m.ms(3, [], k), 3, [], k)          # (a pass without prompt: the next is no probe)
        n, = c.plan(3, [(1000, 500)], k)
        fits = lambda n: c.spread * (c.decode_now(k) + c.prompt_ms(3 + n, [(1000, n)])) <= c.limit_ms(k)
        assert fits(n) and not fits(n + 1), (n, c.spread)

    class MedianSized(StepCosts):
        spread = 1.0        # chunks sized to the median pass: the slow passes overrun the budget

    m = FakeMachine(slow=1.3, every=5)
    c = MedianSized(slowdown=0)
    absorb(c, m, 0, 1000)
    assert max(ms / own for n, ms, own in absorb(c, m, 3, 2000)[SPREAD_MIN + 8:] if n) > 1.1 * budget


def test_decode_pass_follows_the_streams_while_a_prompt_goes_in(monkeypatch):
    """The streams' own attention costs more per key than the prompt's (one row against a
    block; SmolLM2-135M: about 5.7 against 3.5 us): extrapolating their pass with the prompt's
    cost per key over a whole long prompt under-predicts it; the probe passes measure it."""
    from edged.service import scheduler
    for probe, close in ((scheduler.DECODE_PROBE, True), (10 ** 9, False)):
        monkeypatch.setattr(scheduler, "DECODE_PROBE", probe)
        m = FakeMachine(b=0.004, b_decode=0.0065)
        c = scheduler.StepCosts(slowdown=0)
        absorb(c, m, 0, 1000)
        passes = absorb(c, m, 3, 2000)
        k = 3 * (33 + len(passes))              # the streams' keys at the next pass (absorb: 12 + 20 warm)
        assert m.ms(3, [], k) > 1.3 * m.ms(3, [], 3 * 33)
        err = c.decode_now(k) / m.ms(3, [], k) - 1
        assert abs(err) < 0.05 if close else err < -0.1, err


def test_budget_keys_choose_between_streams_and_prompt():
    from edged.service.scheduler import StepCosts
    m = FakeMachine()
    decode = m.ms(3, [])
    ttft = {}
    for budget in (1.5, 2.5, 8.0):
        c = StepCosts(budget=budget, slowdown=0)
        absorb(c, m, 0, 1000)
        passes = absorb(c, m, 3, 1000)
        # within the budget, but for the one token a pass always takes (late in the prompt
        # its attention alone is more than 1.5x leaves)
        assert all(ms <= budget * own * 1.001 or n == 1 for n, ms, own in passes[4:])
        ttft[budget] = sum(ms for _, ms, _ in passes)
    assert ttft[8.0] < ttft[2.5] < ttft[1.5]
    # an absolute limit in ms wins over the factor; configure() changes a running policy
    c = StepCosts(budget=8.0, budget_ms=40.0, slowdown=0)
    assert max(ms for _, ms, _ in absorb(c, m, 3, 600)[4:]) <= 40.0 * 1.001
    c.configure(2.0, 0.0, 64)
    assert c.limit_ms() == 2.0 * c.decode_ms and c.plan(0, [(0, 500)]) == [64]


def test_a_prompt_behind_its_pace_takes_whole_passes():
    """Where small chunks are slow (rows) and panels cost a fixed 3 decode passes, the budget
    alone starves the prompt; prompt_slowdown_max bounds its time to about 2x alone, at the
    price of longer passes for the streams."""
    from edged.service.scheduler import DECODE_LATENCY_BUDGET, PANEL_ROWS, PREFILL_CHUNK, StepCosts
    m = FakeMachine()
    ttft = {}
    for slowdown in (0, 2.0):
        c = StepCosts(slowdown=slowdown)
        alone = sum(ms for _, ms, _ in absorb(c, m, 0, 1000))
        passes = absorb(c, m, 3, 1000)
        ttft[slowdown] = sum(ms for _, ms, _ in passes) / alone
        over = [n for n, ms, own in passes[4:] if ms > DECODE_LATENCY_BUDGET * own * 1.001]
        if slowdown:
            # the catch-up passes: on the panels, whose fixed cost is at most half of
            # their prompt cost, and shorter than whole PREFILL_CHUNK passes late in the prompt
            assert over and all(PANEL_ROWS - 3 <= n < PREFILL_CHUNK for n in over)
        else:
            assert all(n == 1 for n in over)
    assert ttft[0] > 2.1                              # beyond 2x alone under the budget alone
    assert ttft[2.0] <= 2.0 + 0.1                     # within its pace (and one pass)


def test_nobody_decoding_takes_whole_passes_shared_first_come_first_served():
    from edged.service.scheduler import StepCosts
    c = StepCosts(chunk_max=128)
    assert c.plan(0, [(0, 2000)]) == [128]
    assert c.plan(0, [(0, 100), (0, 2000)]) == [100, 28]
    # with streams decoding and the budget spent by the first prompt, the next one waits, but
    # the first always gets a token, however slow its tokens are measured
    absorb(c, FakeMachine(a_rows=50.0), 3, 50)
    assert c.plan(3, [(50, 500), (0, 300)]) == [1, 0]


def test_long_prompt_goes_in_between_the_streams_tokens():
    from edged import Model
    from edged.service.scheduler import MIN_CHUNK, PREFILL_CHUNK, Decoder, Job
    m = Model.load(testdata("models", "stories260K.gguf"), n_threads=2)
    no_eos = {t: -100.0 for t in m.tokenizer.eog_ids}
    shorts = ["Once upon a time", "The little dog", "Lily and Ben went to the park"]
    long_ids = (m.tokenizer.encode("The sun was warm and the birds sang in the tall trees. ") * 40)[:400]
    want = ["".join(o.text for o in m.session(512).generate(p, SamplingParams(logit_bias=no_eos), max_tokens=400))
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
        streams = [asyncio.create_task(run(p, {"params": SamplingParams(logit_bias=no_eos), "max_tokens": 400}, sessions))
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


def test_step_costs_go_with_their_model():
    """The decode thread keeps one StepCosts per model, keyed by the model itself: before, by
    id(model), one more was kept for every load of a model swapped in and out (a soak's swaps),
    and a model loaded at a freed one's address inherited that one's costs."""
    import gc

    from edged.service.scheduler import Decoder

    class Model:
        backend = None

    d = Decoder()
    try:
        for _ in range(5):
            m = Model()
            assert d._costs_for(m) is d._costs_for(m)
            del m
        gc.collect()
        assert len(d._costs) == 0
    finally:
        d.stop()


def test_cost_model_counts_verify_rows(monkeypatch):
    """A stream that speculates brings its last token and its drafts (k + 1 rows) to a pass:
    the decode thread's StepCosts gets every verify row and its attention keys (what the pass
    costs), not one row per stream, or it would size prompt chunks for a cheaper pass."""
    from edged import Model
    from edged.service import scheduler
    from edged.engine.speculative import Drafter
    from edged.service.scheduler import Decoder, Job, StepCosts

    class Guess(Drafter):
        """Drafts `k` tokens every step (mostly wrong: the rows are what counts here)."""
        def __init__(self, k):
            super().__init__(k, adapt=False)

        def drafter(self, session):
            return self

        def draft(self, context, k):
            return [(context[-1] + i + 1) % 200 + 3 for i in range(k)]

    m = Model.load(testdata("models", "stories260K.gguf"), n_threads=1)
    passes, recorded = [], []
    real = m.decode

    def spy(entries):
        passes.append([(e.session.n_past, len(e.tokens)) for e in entries])
        return real(entries)

    class Spy(StepCosts):
        def record(self, ms, n_decode, pieces, decode_keys=0):
            recorded.append((n_decode, list(pieces), decode_keys))
            return super().record(ms, n_decode, pieces, decode_keys)

    m.decode = spy
    monkeypatch.setattr(scheduler, "StepCosts", Spy)
    no_eos = SamplingParams(logit_bias={t: -100.0 for t in m.tokenizer.eog_ids})
    decoder = Decoder()

    async def run(prompt, spec):
        loop = asyncio.get_running_loop()
        job = Job(loop, lambda: m.session(128).start(prompt, no_eos, max_tokens=12, speculative=spec),
                  lambda: None, time.monotonic() + 300)
        decoder.submit(job)
        while (await job.events.get())[0] == "token":
            pass

    async def main():
        await asyncio.gather(run("Once upon a time", Guess(3)), run("The little dog", Guess(5)),
                             run("Lily and Ben", None))

    try:
        asyncio.run(main())
    finally:
        decoder.stop()
        m.close()
    assert len(recorded) == len(passes)
    verify = 0
    for rows, (n_decode, pieces, keys) in zip(passes, recorded):
        decoding = rows[:len(rows) - len(pieces)]       # the prompt pieces come last
        assert n_decode == sum(n for _, n in decoding), (rows, n_decode)
        assert keys == sum(StepCosts.keys(p, n) for p, n in decoding)
        verify = max(verify, n_decode - len(decoding))
    assert verify >= 3 + 5          # two streams' drafts in one pass, counted as decode rows

"""Admission and decoding: a bounded FIFO of requests over `n_parallel` slots, and one decode
thread that owns the loop of steps.

Admission (event loop): a request takes a free slot or waits, first come first served, in a
queue of at most `max_queue` (one more -> QueueFull, answered 429 with Retry-After). Waiting
longer than `queue_timeout` -> 503.

Decoding (one thread): every job is an engine Generation on its own Session (KV cache, sampler
state). Each step the decode thread ends cancelled and timed-out jobs, then gathers, per model,
the next token of every job past its prompt and a chunk of the prompt of jobs still reading
theirs, and evaluates them in ONE Model.decode call: one forward pass whose matrix products read
the weights once for all rows, decode tokens and prompt chunk alike. Every row is computed in
the engine's canonical order (docs/engine.md, "Reproducibility"): a row equals the session's own
single step bit for bit, so a reply does not depend on what it was batched with.
Each job then samples from its logits and posts its token. A job that finishes, is cancelled or
fails leaves at the next step; a new one joins at once. A job whose model speculates
(engine/speculative.py) brings its last token plus its drafts (k + 1 verify rows) and may post
several tokens from one pass; the cost model counts every verify row as a decode row.

Mixed load (llama-server's continuous batching: prompts compete with decode for each pass): a
long prompt must neither stall the streams that are decoding nor starve. While any stream
decodes, a pass that carries a prompt chunk is sized to take at most `decode_latency_budget`
times a pass of decode tokens alone (or `decode_latency_budget_ms`), so each stream's gap between
tokens stays within that factor of its undisturbed gap, and the prompt gets the rest of every
pass. The chunk comes from measured costs (StepCosts): the median decode-only pass (kept
current by a probe pass without prompt tokens every DECODE_PROBE passes), and a least-squares
fit of what prompt tokens add to a pass, per row (matrix products) and per key their attention
reads (a chunk late in a long prompt costs more than one at its start), kept apart for passes
below and from PANEL_ROWS rows (the packed panels' fixed cost per pass); the predicted pass is
scaled by the measured spread of recent passes (SPREAD_Q of measured / predicted), so the slow
passes, which make a stream's worst gaps, keep within the budget too. A
prompt that falls behind `prompt_slowdown_max` times its predicted time alone (when set; 0 by
default: the streams come first) takes a larger, efficient catch-up chunk (one longer gap for
the streams) rather than waiting. With nobody
decoding a prompt takes whole passes of `prompt_chunk_max` tokens (cancellation still gets a
turn between them). EDGED_DEBUG_STEPS=1 logs every pass (composition, predicted and
measured time) at debug level.
"""
import asyncio
import collections
import os
import statistics
import threading
import time
import weakref

import numpy as np

from ..errors import CapacityError, QueueFull, QueueTimeout
from .log import log

PREFILL_CHUNK = 128     # default prompt_chunk_max: prompt tokens of a pass with nobody decoding
MIN_CHUNK = 1           # least prompt tokens of a pass that has any: the prompt always progresses
# From this many rows a pass's matrix products unpack every weight into packed panels
# (ed_gemm.h): a fixed cost per pass that a few prompt rows do not repay. Each model's StepCosts
# takes its kernel path's threshold (Backend.gemm_min_cols: 16 with VNNI, 32 plain AVX2, 8 NEON);
# this is the default of StepCosts alone (the scheduler's tests).
PANEL_ROWS = 8
DECODE_LATENCY_BUDGET = 2.5     # default: a pass with a prompt chunk takes <= 2.5x a decode pass
PROMPT_SLOWDOWN = 0.0   # default: the budget rules (2: a prompt beside streams aims at <= 2x its time alone)
CATCH_UP_OVERHEAD = 0.5   # a catch-up pass: the panels' fixed cost at most this share of its prompt cost
DECODE_WINDOW = 15      # decode-only passes whose median is the decode cost
DECODE_PROBE = 16       # beside a prompt going in, every this many passes one carries none (measures the streams)
SPREAD_WINDOW = 64      # prompt-carrying passes whose measured / predicted time is the spread
SPREAD_MIN = 16         # ... the least of them for a spread (1 before)
SPREAD_Q = 0.9          # ... the quantile of them a pass is sized to: 9 in 10 within the limit
FIT_WINDOW = 24         # prompt-carrying passes per path the cost fit reads
FORGET = 0.85           # weight of an observation per newer one in the fit
DEBUG_STEPS = os.environ.get("EDGED_DEBUG_STEPS") == "1"
BUSY_WAIT = 0.05        # seconds the decode thread sleeps when every job waits for a session


class Slots:
    """n slots handed out in FIFO order; at most max_queue waiters."""

    def __init__(self, n, max_queue):
        self.n, self.max_queue = n, max_queue
        self.busy = 0
        self._waiters = collections.deque()

    @property
    def waiting(self):
        return sum(1 for f in self._waiters if not f.done())

    def resize(self, n, max_queue):
        self.n, self.max_queue = n, max_queue
        self._wake()

    async def acquire(self, timeout, abandoned=lambda: False):
        if self.busy < self.n and not self.waiting:
            self.busy += 1
            return
        if self.waiting >= self.max_queue:
            raise QueueFull(f"server busy: {self.waiting} request(s) queued (max_queue={self.max_queue})")
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise QueueTimeout(f"timed out after {timeout:g}s waiting for a generation slot")
                done, _ = await asyncio.wait([fut], timeout=min(left, 0.25))
                if done:
                    return
                if abandoned():
                    raise asyncio.CancelledError("client went away while queued")
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release()          # handed a slot just as we gave up: pass it on
            else:
                fut.cancel()
            raise

    def release(self):
        self.busy -= 1
        self._wake()

    def _wake(self):
        while self.busy < self.n and self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                self.busy += 1
                fut.set_result(None)


class Busy(CapacityError):
    """What a job's make_gen() raises when what it needs is taken for now (every session of
    its model in use): the job waits, and the decode thread tries again at its next steps."""


class Job:
    """One generation: the decode thread steps what `make_gen()` returns (an engine Generation,
    service/loader.py LoadedModel.steps) and posts events to `events`. An embedding job
    (embedding=True) steps an engine EmbedSteps instead: one unit of compute per pass of the
    generations, so a long input neither freezes the streams nor escapes cancellation and
    request_timeout; its "done" event carries the vectors."""
    embedding = False

    def __init__(self, loop, make_gen, finish, deadline, embedding=False):
        self.embedding = embedding
        self.loop = loop
        self.make_gen = make_gen        # () -> Generation (takes a session: called by the decode thread; Busy: later)
        self.finish = finish            # called in the decode thread when the job ends (session back)
        self.deadline = deadline        # time.monotonic() limit
        self.cancel = threading.Event()
        self.events = asyncio.Queue()
        self.gen = None
        self.session = None             # the engine Session, once make_gen() took one

    def post(self, kind, value=None):
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


PATHS = ("rows", "panels")
# Terms of the cost fit, most first; a fit whose terms come out negative (too little spread in
# the observations yet) falls back to the next. Columns: p0 and a of each path, b (shared).
_TERMS = ((0, 1, 2, 3, 4), (1, 2, 3, 4), (1, 3, 4), (0, 1, 2, 3), (1, 2, 3), (1, 3))


def _fit(obs):
    """Least squares with exponential forgetting of the prompt cost over obs {path: [(n, k, y)]}
    (oldest first, each path forgotten by its own age): y = p0[path] + a[path] * n + b * k.
    The attention term b is shared: the passes alone (wide spread of positions) teach it to
    the row path, whose few rows cannot tell a from b. Returns {path: (p0, a, b) or None}."""
    rows, ys, ws = [], [], []
    for i, path in enumerate(PATHS):
        for age, (n, k, y) in enumerate(reversed(obs[path])):
            x = [0.0] * 5
            x[2 * i], x[2 * i + 1], x[4] = 1.0, n, k
            rows.append(x)
            ys.append(y)
            ws.append(FORGET ** age)
    out = {p: None for p in PATHS}
    if not rows:
        return out
    x, y, w = np.array(rows), np.array(ys), np.sqrt(np.array(ws))
    seen = [bool(obs[p]) for p in PATHS]
    for terms in _TERMS:
        cols = [c for c in terms if c == 4 or seen[c // 2]]
        coef, _, rank, _ = np.linalg.lstsq(x[:, cols] * w[:, None], y * w, rcond=None)
        if rank == len(cols) and (coef >= 0).all():
            c = dict(zip(cols, (float(v) for v in coef)))
            for i, path in enumerate(PATHS):
                if seen[i] and 2 * i + 1 in c:
                    out[path] = (c.get(2 * i, 0.0), c[2 * i + 1], c.get(4, 0.0))
            return out
    return out


class StepCosts:
    """One model's measured pass costs, and the prompt chunks they allow.

    decode_ms: the median of the last DECODE_WINDOW passes of decode tokens alone (a median, so
    a pass the machine's other load delayed does not move it), at decode_keys, the median of
    the keys their attention read. A stream's pass grows as it gets longer (its attention reads
    one more key per token), so the decode pass now (`decode_now`) is decode_ms plus b per key
    the decode rows read beyond decode_keys. While a prompt goes in beside streams every
    DECODE_PROBE-th pass carries none (a probe), so decode_ms follows the streams' growth and
    the machine's load: extrapolated over a whole 2,000-token prompt, b (the prompt's cost per
    key, fitted mostly on prompt rows) under-predicted the streams' own pass by a third.
    Prompt tokens add `p0 + a * n + b * k` ms to a pass: n rows through the matrix products, k
    keys read by their attention (a token at position p reads p + 1: a chunk late in a long
    prompt costs more than one at its start), p0 a fixed cost of the pass. p0 and a are fitted
    (`_fit`) per path, b for both, from the passes that carried prompt tokens (their time minus
    decode_ms; the streams' keys beyond decode_keys count with the prompt's): "rows" when the
    pass has fewer than PANEL_ROWS rows, "panels" from PANEL_ROWS on, where unpacking the
    weights costs p0 per pass (measured: about 3x a decode pass of SmolLM2-135M on one thread).
    The `spread` of measured over predicted time of the recent mixed passes sizes the chunks,
    so that the limit holds for 9 passes in 10 rather than for the median pass.

    budget (factor) / budget_ms (absolute, 0 = use the factor): the longest a pass carrying
    prompt tokens may take while streams decode; chunk_max: prompt tokens of a pass with nobody
    decoding, and the most of any pass; slowdown: how much longer than alone a prompt may take
    beside streams before it takes catch-up chunks (0 = never: the budget always rules).
    """

    def __init__(self, budget=DECODE_LATENCY_BUDGET, budget_ms=0.0, chunk_max=PREFILL_CHUNK,
                 slowdown=PROMPT_SLOWDOWN, panel_rows=PANEL_ROWS):
        self.configure(budget, budget_ms, chunk_max, slowdown)
        self.panel_rows = int(panel_rows)   # the model's kernel path's threshold (Backend.gemm_min_cols)
        self._decode = collections.deque(maxlen=DECODE_WINDOW)
        self._obs = {p: collections.deque(maxlen=FIT_WINDOW) for p in PATHS}
        self.fits = {p: None for p in PATHS}
        self._ratios = collections.deque(maxlen=SPREAD_WINDOW)     # measured / predicted, mixed passes
        self._since_decode = 0          # passes with streams and a prompt since the last without

    def configure(self, budget, budget_ms, chunk_max, slowdown=PROMPT_SLOWDOWN):
        self.budget, self.budget_ms, self.chunk_max = float(budget), float(budget_ms), int(chunk_max)
        self.slowdown = float(slowdown)

    @property
    def decode_ms(self):
        return statistics.median(ms for ms, _ in self._decode) if self._decode else None

    @property
    def decode_keys(self):
        return statistics.median(k for _, k in self._decode) if self._decode else 0

    def decode_now(self, keys):
        """Predicted ms of a pass of decode tokens alone whose attention reads `keys` keys."""
        fit = self.fits["rows"] or self.fits["panels"]
        b = fit[2] if fit else 0.0
        return max(self.decode_ms + b * (keys - self.decode_keys), 0.0)

    @property
    def spread(self):
        """How much longer than predicted a pass carrying prompt tokens beside streams takes, in
        all but 1 - SPREAD_Q of the last SPREAD_WINDOW (the machine's noise and the fit's error;
        at least 1; 1 until SPREAD_MIN were measured). Chunks are sized so that the predicted
        pass times this stays within the limit: the limit holds for 9 passes in 10, not for the
        median pass."""
        if len(self._ratios) < SPREAD_MIN:
            return 1.0
        r = sorted(self._ratios)
        return max(1.0, r[min(len(r) - 1, int(SPREAD_Q * len(r)))])

    @staticmethod
    def keys(pos, n):
        """Keys the attention of n prompt tokens from position pos reads: (pos+1) + ... + (pos+n)."""
        return n * (pos + 1) + n * (n - 1) // 2

    def path(self, rows):
        return "panels" if rows >= self.panel_rows else "rows"

    def record(self, ms, n_decode, pieces, decode_keys=0):
        """A pass of n_decode decode tokens (their attention reading decode_keys keys) and the
        prompt pieces [(pos, n), ...] took ms."""
        if not pieces:
            if n_decode:
                self._decode.append((ms, decode_keys))
                self._since_decode = 0
            return
        base = self.decode_ms
        if base is None:
            return
        n = sum(c for _, c in pieces)
        if n_decode:
            self._since_decode += 1
            want = self.prompt_ms(n_decode + n, pieces)
            if want is not None:
                self._ratios.append(ms / (self.decode_now(decode_keys) + want))
        # what the pass read beyond the measured decode pass: the prompt's keys and the streams'
        keys = sum(self.keys(p, c) for p, c in pieces) + (decode_keys - self.decode_keys if n_decode else 0)
        self._obs[self.path(n_decode + n)].append((n, keys, ms - base))
        self.fits = _fit(self._obs)

    def prompt_ms(self, rows, pieces):
        """Predicted ms that the prompt pieces [(pos, n)] add to a pass of `rows` rows in all,
        or None when that path has not been measured."""
        fit = self.fits[self.path(rows)]
        if fit is None:
            return None
        p0, a, b = fit
        return p0 + a * sum(n for _, n in pieces) + b * sum(self.keys(p, n) for p, n in pieces)

    def limit_ms(self, decode_keys=None):
        """The longest a pass carrying prompt tokens may take while streams decode (their
        attention reading decode_keys keys; None: as measured)."""
        d = self.decode_ms if decode_keys is None else self.decode_now(decode_keys)
        return self.budget_ms if self.budget_ms > 0 else self.budget * d

    def alone_ms(self, start, end):
        """Predicted ms of prompt positions start..end in passes of chunk_max with nobody
        decoding (the prompt's time alone), or None before the panels are measured."""
        fit = self.fits["panels"]
        if fit is None or self.decode_ms is None:
            return None
        p0, a, b = fit
        n = end - start
        passes = -(-n // self.chunk_max)
        return passes * (self.decode_ms + p0) + a * n + b * self.keys(start, n)

    def behind(self, start, pos, end, waited_ms):
        """Whether a prompt of positions start..end, at pos after waited_ms since its first
        chunk beside decoding streams, has fallen behind the pace that ends it within slowdown
        times its time alone: what it has done would take less than waited_ms / slowdown alone."""
        if self.slowdown <= 0 or self.alone_ms(start, end) is None:
            return False
        return self.alone_ms(start, pos) < waited_ms / self.slowdown

    def catch_up(self, n_decode, pos, pending):
        """Prompt tokens of a pass that catches a prompt up: the fewest on the panels whose
        fixed cost is at most CATCH_UP_OVERHEAD of the pass's prompt cost (efficient, yet the
        streams' gap stays a fraction of a whole chunk_max pass late in a long prompt)."""
        most = min(pending, self.chunk_max)
        p0, a, b = self.fits["panels"]
        lo, hi = max(1, self.panel_rows - n_decode), most
        while lo < hi:
            mid = (lo + hi) // 2
            if p0 <= CATCH_UP_OVERHEAD * (p0 + a * mid + b * self.keys(pos, mid)):
                hi = mid
            else:
                lo = mid + 1
        return min(lo, most)

    def plan(self, n_decode, prompts, decode_keys=0, waits=None):
        """Prompt tokens of the next pass for each of prompts [(pos, pending), ...] (first come
        first served), the pass also carrying n_decode decode tokens whose attention reads
        decode_keys keys; waits: per prompt (start position, ms since its first chunk beside
        decoding streams) or None. Nobody decoding: whole passes of chunk_max. Else the most
        tokens whose predicted cost keeps the pass within limit_ms() (on whichever path carries
        more), at least MIN_CHUNK for the first prompt; a path not measured yet is tried with the
        least chunk. A first prompt that has fallen behind its pace (`behind`) takes a
        `catch_up` pass: the streams see one long gap rather than the prompt starving."""
        out, left = [], self.chunk_max
        if n_decode and prompts and self._since_decode >= DECODE_PROBE:
            return [0] * len(prompts)       # a probe: the streams' pass alone, measured now
        if n_decode and prompts and waits and waits[0] is not None:
            pos, pending = prompts[0]
            start, waited = waits[0]
            if self.behind(start, pos, pos + pending, waited):
                return [self.catch_up(n_decode, pos, pending)] + [0] * (len(prompts) - 1)
        if not n_decode:
            for _, pending in prompts:
                out.append(min(pending, left))
                left -= out[-1]
            return out
        extra = None
        if self.decode_ms is not None:
            extra = self.limit_ms(decode_keys) / self.spread - self.decode_now(decode_keys)
        pieces = []
        for pos, pending in prompts:
            best, most = 0, min(pending, left)
            rows = n_decode + sum(n for _, n in pieces)
            if extra is not None and most > 0:
                # each path's range of chunk sizes; the cost grows with n within a path
                for lo, hi in ((1, min(most, self.panel_rows - 1 - rows)), (max(1, self.panel_rows - rows), most)):
                    if lo > hi:
                        continue
                    if self.prompt_ms(rows + lo, pieces + [(pos, lo)]) is None:
                        if self.path(rows + lo) == "rows" and not pieces:
                            best = max(best, 1)             # measure the row path
                        continue
                    while lo <= hi:     # the largest n whose pass (all pieces) is within extra
                        mid = (lo + hi) // 2
                        if self.prompt_ms(rows + mid, pieces + [(pos, mid)]) <= extra:
                            best, lo = max(best, mid), mid + 1
                        else:
                            hi = mid - 1
            if not pieces:
                best = max(best, min(MIN_CHUNK, pending))    # the prompt always progresses
            out.append(best)
            left -= best
            if best:
                pieces.append((pos, best))
        return out


class Decoder:
    """The decode thread. submit() from the event loop; events come back through Job.events."""

    def __init__(self, metrics=None, budget=DECODE_LATENCY_BUDGET, budget_ms=0.0, chunk_max=PREFILL_CHUNK,
                 slowdown=PROMPT_SLOWDOWN):
        self.metrics = metrics
        self._policy = (budget, budget_ms, chunk_max, slowdown)
        self._waits = {}                # job -> (start position, perf_counter of its first mixed pass)
        self._pending = collections.deque()
        self._active = []
        self._costs = weakref.WeakKeyDictionary()    # model -> StepCosts, dropped with the model
        self._last_step = None          # perf_counter of the previous pass's start (debug log)
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="edged-decode", daemon=True)
        self._thread.start()

    def configure(self, budget, budget_ms, chunk_max, slowdown=PROMPT_SLOWDOWN):
        """The mixed-load policy's keys (decode_latency_budget, decode_latency_budget_ms,
        prompt_chunk_max, prompt_slowdown_max); take effect at the next pass (a SIGHUP reload)."""
        self._policy = (budget, budget_ms, chunk_max, slowdown)
        for costs in list(self._costs.values()):
            costs.configure(*self._policy)

    def submit(self, job):
        with self._cv:
            self._pending.append(job)
            self._cv.notify()

    def active(self):
        return len(self._active) + len(self._pending)

    def stop(self):
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=5)

    def _end(self, job, kind, value):
        if job in self._active:
            self._active.remove(job)
        try:
            job.finish()
        except Exception as e:  # noqa: BLE001
            log.error("finishing a job failed: %s", e)
        job.post(kind, value)

    def _run(self):
        while True:
            with self._cv:
                while not self._pending and not self._active and not self._stop:
                    self._cv.wait()
                if self._stop:
                    for job in list(self._active) + list(self._pending):
                        self._end(job, "done", "abort")
                    return
                while self._pending:
                    self._active.append(self._pending.popleft())
            if not self._step():
                with self._cv:          # every job waits for a session another thread gives back
                    if not self._pending and not self._stop:
                        self._cv.wait(BUSY_WAIT)

    def _step(self):
        """One step: leavers out, newcomers in (those that find no free session wait), then one
        Model.decode per model. Returns whether any job ran."""
        now = time.monotonic()
        for job in list(self._active):
            if job.cancel.is_set():
                self._end(job, "done", "cancelled")
            elif now >= job.deadline:
                self._end(job, "done", "length")
            elif job.gen is None:
                try:
                    job.gen = job.make_gen()      # takes a session; finds the cached prefix
                except Busy:
                    pass                          # waits (in order) for a session to come back
                except Exception as e:  # noqa: BLE001 - one bad request must not stop the others
                    self._end(job, "error", e)
        models = {}
        for job in self._active:
            if job.gen is not None and not job.embedding:
                models.setdefault(id(job.gen.session.model), []).append(job)
        for jobs in models.values():
            self._step_model(jobs)
        embedding = [j for j in self._active if j.embedding and j.gen is not None]
        for job in embedding:
            self._step_embedding(job)
        return bool(models) or bool(embedding)

    def _step_embedding(self, job):
        """One unit of an embedding job's compute (an encoder pass or a decoder chunk)."""
        try:
            next(job.gen, None)
        except Exception as e:  # noqa: BLE001 - one bad request must not stop the others
            self._end(job, "error", e)
            return
        if job.gen.result is not None:
            self._end(job, "done", job.gen.result)

    def _costs_for(self, model):
        costs = self._costs.get(model)
        if costs is None:
            costs = self._costs[model] = StepCosts(
                *self._policy, panel_rows=getattr(model.backend, "gemm_min_cols", PANEL_ROWS))
        return costs

    def _step_model(self, jobs):
        """The next token of every job past its prompt and prompt chunks, in one decode call."""
        model = jobs[0].gen.session.model
        costs = self._costs_for(model)
        decoding = [j for j in jobs if not j.gen.prefilling]
        prefilling = [j for j in jobs if j.gen.prefilling]
        # where each prompt goes on: the session's cache (a cached prefix is already in it)
        at = [(j.gen.session.n_past, j.gen.n_pending) for j in prefilling]
        work = [(j, j.gen.entry()) for j in decoding]
        # decode rows: one per stream, plus its drafts when it speculates (verify rows)
        n_rows = sum(len(e.tokens) for _, e in work)
        decode_keys = sum(StepCosts.keys(j.gen.session.n_past, len(e.tokens)) for j, e in work)
        now = time.perf_counter()
        for j in list(self._waits):
            if j not in prefilling:
                del self._waits[j]          # its prompt is in (or it left)
        waits = []
        for j, (pos, _) in zip(prefilling, at):
            if decoding and j not in self._waits:
                self._waits[j] = (pos, now)     # the prompt's pace is counted from here
            w = self._waits.get(j)
            waits.append(None if w is None else (w[0], (now - w[1]) * 1000))
        pieces = []
        for j, (pos, _), n in zip(prefilling, at, costs.plan(n_rows, at, decode_keys, waits)):
            if n:
                e = j.gen.entry(n)
                pieces.append((pos, len(e.tokens)))
                work.append((j, e))
        t0, c0 = time.perf_counter(), time.thread_time() if DEBUG_STEPS else 0.0
        try:
            results = model.decode([e for _, e in work])
        except Exception as e:  # noqa: BLE001 - find the entry at fault: each alone
            log.error("a step of %d entries failed (%s); evaluating them one by one", len(work), e)
            results = []
            for j, entry in work:
                try:
                    results.append(model.decode([entry])[0])
                except Exception as err:  # noqa: BLE001
                    results.append(err)
        else:
            ms = (time.perf_counter() - t0) * 1000
            if DEBUG_STEPS:
                cpu = (time.thread_time() - c0) * 1000
                self._debug(costs, n_rows, pieces, ms, t0, decode_keys, cpu)
            costs.record(ms, n_rows, pieces, decode_keys)
            if len(decoding) > 1 and self.metrics is not None:
                self.metrics.batch_steps += 1
                self.metrics.batch_rows += len(decoding)
        for (job, _), logits in zip(work, results):
            if isinstance(logits, Exception):
                self._end(job, "error", logits)
                continue
            try:
                outs = job.gen.accept_all(logits)   # none while the prompt goes in
            except Exception as e:  # noqa: BLE001
                self._end(job, "error", e)
                continue
            for out in outs:
                job.post("token", out)
                if out.finish_reason:
                    self._end(job, "done", out.finish_reason)

    def _debug(self, costs, n_decode, pieces, ms, t0, decode_keys, cpu):
        """One line per pass (EDGED_DEBUG_STEPS=1): its rows, measured and predicted time, the
        decode thread's CPU time in it (well under the measured time: the thread was kept off its
        CPU, or waited for other threads of the pool), the time since the previous pass began
        (what a stream's gap between tokens is)."""
        period = (t0 - self._last_step) * 1000 if self._last_step else 0.0
        self._last_step = t0
        d, rows = costs.decode_ms, n_decode + sum(n for _, n in pieces)
        now = None if d is None or not n_decode else costs.decode_now(decode_keys)
        want = costs.prompt_ms(rows, pieces) if pieces else None
        log.debug("pass: %d decode (%d keys) + prompt %s (%s): %.1f ms (CPU %.1f), predicted %s, limit %s "
                  "(spread %.2f); since the previous pass %.1f ms; decode now %s; fits %s", n_decode, decode_keys,
                  "+".join(f"{n}@{p}" for p, n in pieces) or "-", costs.path(rows), ms, cpu,
                  "-" if want is None or d is None else f"{(now or 0.0) + want:.1f}",
                  "-" if now is None else f"{costs.limit_ms(decode_keys):.1f}", costs.spread, period,
                  "-" if now is None else f"{now:.1f}",
                  {k: None if f is None else tuple(round(x, 5) for x in f) for k, f in costs.fits.items()})

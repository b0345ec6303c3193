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
fails leaves at the next step; a new one joins at once.

Mixed load: a long prompt must not stall the streams that are decoding. Its chunk rides in the
streams' step, sized so that it adds about PROMPT_SHARE times what a step of decode tokens alone
costs (measured: a running average of decode-only steps, and of the extra time per prompt token
in steps that carry both), at least MIN_CHUNK and at most PREFILL_CHUNK tokens; so a stream's
gap between tokens stays about 1 + PROMPT_SHARE times its undisturbed gap. With nobody decoding
a prompt goes in PREFILL_CHUNK tokens per step (cancellation still gets a turn).
"""
import asyncio
import collections
import threading
import time

from ..errors import QueueFull, QueueTimeout
from .log import log

PREFILL_CHUNK = 128     # most prompt tokens of one step (nobody decoding: every step's chunk)
# Least prompt tokens of a step that has any: from 8 rows a batch takes the packed panels
# (ED_GEMM_MIN_COLS) and the blocked attention (ED_ATTN_BLOCK_MIN, forward.h).
MIN_CHUNK = 8
PROMPT_SHARE = 1.5      # a step's prompt chunk adds about this times a decode-only step


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


class Job:
    """One generation: the decode thread steps what `make_gen()` returns (an engine Generation,
    service/loader.py LoadedModel.steps) and posts events to `events`."""

    def __init__(self, loop, make_gen, finish, deadline):
        self.loop = loop
        self.make_gen = make_gen        # () -> Generation (takes a session: called by the decode thread)
        self.finish = finish            # called in the decode thread when the job ends (session back)
        self.deadline = deadline        # time.monotonic() limit
        self.cancel = threading.Event()
        self.events = asyncio.Queue()
        self.gen = None
        self.session = None             # the engine Session, once make_gen() took one

    def post(self, kind, value=None):
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class _Costs:
    """Running averages of one model's step costs: ms of a step of decode tokens alone, ms a
    prompt token adds to a step."""

    def __init__(self):
        self.decode_ms = None
        self.token_ms = None

    @staticmethod
    def _avg(old, new, w=0.25):
        return new if old is None else old + w * (new - old)

    def record(self, ms, n_decode, n_prompt):
        """A step of n_decode decode tokens and n_prompt prompt tokens took ms."""
        if n_decode and not n_prompt:
            self.decode_ms = self._avg(self.decode_ms, ms)
        elif n_prompt and n_decode and self.decode_ms is not None:
            self.token_ms = self._avg(self.token_ms, max(ms - self.decode_ms, 0.05 * ms) / n_prompt)
        elif n_prompt and not n_decode:  # an upper bound: it includes the read of the weights
            self.token_ms = self._avg(self.token_ms, ms / n_prompt)

    def chunk(self):
        """Prompt tokens for a step that also decodes."""
        if self.decode_ms is None or self.token_ms is None:
            return MIN_CHUNK
        n = int(PROMPT_SHARE * self.decode_ms / max(self.token_ms, 1e-6))
        return max(MIN_CHUNK, min(PREFILL_CHUNK, n))


class Decoder:
    """The decode thread. submit() from the event loop; events come back through Job.events."""

    def __init__(self, metrics=None):
        self.metrics = metrics
        self._pending = collections.deque()
        self._active = []
        self._costs = {}                # id(model) -> _Costs
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="edged-decode", daemon=True)
        self._thread.start()

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
            self._step()

    def _step(self):
        """One step: leavers out, newcomers in, then one Model.decode per model."""
        now = time.monotonic()
        for job in list(self._active):
            if job.cancel.is_set():
                self._end(job, "done", "cancelled")
            elif now >= job.deadline:
                self._end(job, "done", "length")
            elif job.gen is None:
                try:
                    job.gen = job.make_gen()      # takes a session; finds the cached prefix
                except Exception as e:  # noqa: BLE001 - one bad request must not stop the others
                    self._end(job, "error", e)
        models = {}
        for job in self._active:
            models.setdefault(id(job.gen.session.model), []).append(job)
        for jobs in models.values():
            self._step_model(jobs)

    def _step_model(self, jobs):
        """The next token of every job past its prompt and a prompt chunk, in one decode call."""
        model = jobs[0].gen.session.model
        costs = self._costs.setdefault(id(model), _Costs())
        decoding = [j for j in jobs if not j.gen.prefilling]
        budget = costs.chunk() if decoding else PREFILL_CHUNK
        work = [(j, j.gen.entry()) for j in decoding]
        n_prompt = 0
        for j in jobs:
            if j.gen.prefilling and budget > n_prompt:
                e = j.gen.entry(budget - n_prompt)
                n_prompt += len(e.tokens)
                work.append((j, e))
        t0 = time.perf_counter()
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
            costs.record((time.perf_counter() - t0) * 1000, len(decoding), n_prompt)
            if len(decoding) > 1 and self.metrics is not None:
                self.metrics.batch_steps += 1
                self.metrics.batch_rows += len(decoding)
        for (job, _), logits in zip(work, results):
            if isinstance(logits, Exception):
                self._end(job, "error", logits)
                continue
            try:
                out = job.gen.accept(logits)
            except Exception as e:  # noqa: BLE001
                self._end(job, "error", e)
                continue
            if out is None:                  # a chunk of the prompt went in
                continue
            job.post("token", out)
            if out.finish_reason:
                self._end(job, "done", out.finish_reason)

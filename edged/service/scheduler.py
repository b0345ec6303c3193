"""Admission and decoding: a bounded FIFO of requests over `n_parallel` slots, and one decode
thread that advances every active generation by one token per round.

Admission (event loop): a request takes a free slot or waits, first come first served, in a
queue of at most `max_queue` (one more -> QueueFull, answered 429 with Retry-After). Waiting
longer than `queue_timeout` -> 503.

Decoding (one thread): the engine has one compute thread pool per process, so forward passes
are issued from one thread. Each round gives every active job one step of its Session's
generator (the first step is its prompt's prefill), checks cancellation (client gone, time
limit) between tokens, and posts the token to the job's asyncio queue. A long prompt is
evaluated in chunks of PREFILL_CHUNK tokens, one chunk per round.

Continuous batching: with n_parallel > 1, each round first evaluates the next token of every
active generation that is past its prompt in ONE forward pass per model
(Model.decode_ahead: the matrix products read the weights once for all rows, attention runs
per row against the row's own KV cache); each generator then finds its logits ready and only
samples (sampling stays per request). A job that finishes, is cancelled or fails leaves the
batch at the next round; a new one joins once its prompt is in. A batch row equals the
session's own single step exactly, so a reply does not depend on what it was batched with.
"""
import asyncio
import collections
import threading
import time

from ..errors import QueueFull, QueueTimeout
from .loader import ENGINE_LOCK
from .log import log


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
    """One generation: the decode thread drives `make_gen()` and posts events to `events`."""

    def __init__(self, loop, make_gen, finish, deadline):
        self.loop = loop
        self.make_gen = make_gen        # () -> iterator of engine outputs (lazy: prefill on first next)
        self.finish = finish            # called in the decode thread when the job ends (session back)
        self.deadline = deadline        # time.monotonic() limit
        self.cancel = threading.Event()
        self.events = asyncio.Queue()
        self.gen = None
        self.session = None             # the engine Session, once make_gen() took one
        self.next_token = None          # the token the generator evaluates on its next step

    def post(self, kind, value=None):
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Decoder:
    """The decode thread. submit() from the event loop; events come back through Job.events."""

    def __init__(self, metrics=None):
        self.metrics = metrics
        self._pending = collections.deque()
        self._active = []
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

    def _decode_batch(self):
        """The next token of every job past its prompt, one forward pass per model."""
        groups = {}
        now = time.monotonic()
        for job in self._active:
            s = job.session
            if (job.next_token is None or s is None or job.cancel.is_set() or now >= job.deadline
                    or not hasattr(getattr(s, "model", None), "decode_ahead")):
                continue
            groups.setdefault(id(s.model), []).append(job)
        for jobs in groups.values():
            if len(jobs) < 2:
                continue                         # one stream: its generator evaluates as before
            try:
                with ENGINE_LOCK:
                    jobs[0].session.model.decode_ahead([j.session for j in jobs],
                                                       [j.next_token for j in jobs])
                if self.metrics is not None:
                    self.metrics.batch_steps += 1
                    self.metrics.batch_rows += len(jobs)
            except Exception as e:  # noqa: BLE001 - the generators then evaluate one by one
                log.error("batched decode of %d streams failed: %s", len(jobs), e)

    def _end(self, job, kind, value):
        if job.gen is not None:
            try:
                job.gen.close()
            except Exception:  # noqa: BLE001 - closing a broken generator must not kill the loop
                pass
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
            self._decode_batch()
            for job in list(self._active):
                if job.cancel.is_set():
                    self._active.remove(job)
                    self._end(job, "done", "cancelled")
                    continue
                if time.monotonic() >= job.deadline:
                    self._active.remove(job)
                    self._end(job, "done", "length")
                    continue
                try:
                    with ENGINE_LOCK:
                        if job.gen is None:
                            job.gen = iter(job.make_gen())
                        out = next(job.gen)
                except StopIteration:
                    self._active.remove(job)
                    self._end(job, "done", None)
                    continue
                except Exception as e:  # noqa: BLE001 - one bad request must not stop the others
                    self._active.remove(job)
                    self._end(job, "error", e)
                    continue
                if out is None:                  # a chunk of the prompt was evaluated
                    job.next_token = None
                    continue
                job.next_token = out.token if getattr(out, "finish_reason", None) is None else None
                job.post("token", out)
                if getattr(out, "finish_reason", None):
                    self._active.remove(job)
                    self._end(job, "done", out.finish_reason)

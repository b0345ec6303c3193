"""Generation jobs: one admitted request on the decode thread, and its events back.

A Generation owns a generation slot and a model lease until the decode thread has let go of
every choice. It submits one Job per choice to the decode thread (service/scheduler.py), which
batches the steps of every running request into one Model.decode call; the events come back to
the event loop as (choice, text, finish_reason). n > 1 choices of one prompt share its
evaluation (the KV cache is forked). Each wire protocol renders the events in its own shape
(service/openai.py); nothing here knows the protocol.
"""
import asyncio
import threading
import time

from ..errors import NotReady, QueueTimeout
from ..text import harmony, reasoning, tools
from ..text.sampling import Sampler
from .scheduler import Job


class Steps:
    """A choice's engine Generation as the decode thread steps it (service/scheduler.py):
    session, prefilling, n_pending and entry() pass through; accept() also takes the logprob records of
    the token just drawn, so they ride along with it."""
    __slots__ = ("gen", "sampler")

    def __init__(self, gen, sampler):
        self.gen, self.sampler = gen, sampler

    @property
    def session(self):
        return self.gen.session

    @property
    def prefilling(self):
        return self.gen.prefilling

    @property
    def n_pending(self):
        return self.gen.n_pending

    def entry(self, budget=None):
        return self.gen.entry(budget)

    def accept_all(self, logits):
        """The step's outputs (several when drafts were accepted); the logprob records of all
        its tokens ride on the last."""
        outs = self.gen.accept_all(logits)
        if not outs:
            return outs
        records = self.sampler.take_records()
        return [Out(o, records if i == len(outs) - 1 else []) for i, o in enumerate(outs)]


class Out:
    """What a choice's generator posts: the engine's output plus the logprob records of its
    token (taken on the decode thread, right after the draw)."""
    __slots__ = ("text", "token", "finish_reason", "stop", "records")

    def __init__(self, out, records):
        self.text, self.token, self.finish_reason, self.stop = out.text, out.token, out.finish_reason, out.stop
        self.records = records


class Choice:
    """One choice: its sampler, job, text so far and the streaming splitters."""

    def __init__(self, index, prompt, sampler, prep, tok):
        self.index, self.prompt, self.sampler, self.tok = index, prompt, sampler, tok
        self.job = None
        self.pieces = []
        self.n_gen = 0
        self.finish = None
        self.stop = None            # the stop string that ended it
        self.records = []           # (token, logprob, top) of every generated token
        self.unsent = []            # records not yet in a stream chunk
        self.done = False
        self.prep = prep
        self.harmony = harmony.HarmonyStream(prep.think, bool(prep.family)) if prep.harmony else None
        self.think = reasoning.ThinkSplitter(prep.think_inside, prep.think_tags) if prep.think and not self.harmony else None
        self.calls = tools.StreamSplitter(prep.family, prep.tools) if prep.family and not self.harmony else None
        # a splitter of its own that sees each generated token once, to count reasoning tokens
        self.counter = (harmony.HarmonyStream(prep.think, False) if prep.harmony else
                        reasoning.ThinkSplitter(prep.think_inside, prep.think_tags) if prep.think else None)
        self.n_reasoning = 0

    def add(self, out):
        eog = self.tok.eog_ids
        recs = [r for r in (out.records or ()) if r[0] not in eog]
        self.records += recs
        self.unsent += recs
        if out.token is not None:
            self.n_gen += 1
            if self.counter is not None and self._thinking(out.text or ""):
                self.n_reasoning += 1
        self.stop = out.stop or self.stop
        self.pieces.append(out.text or "")

    def _thinking(self, text):
        """Whether a generated token (its text, possibly empty while held back) is part of the
        reasoning: it opens, continues or closes a think block, or is in an analysis message."""
        c = self.counter
        if isinstance(c, harmony.HarmonyStream):
            was = c.state == "body" and c.kind == "analysis"
            r, _ = c.push(text)
            return bool(r) or was or (c.state == "body" and c.kind == "analysis")
        before = c.state
        c.push(text)
        return before == "think" or c.state == "think" or (before == "start" and c.state == "after")

    def stream_delta(self, text):
        """(reasoning delta, content delta) of newly generated text."""
        if self.harmony:
            return self.harmony.push(text)
        r, c = self.think.push(text) if self.think else ("", text)
        if self.calls:
            c = self.calls.push(c)
        return r, c

    def stream_end(self):
        """(reasoning, content, calls) left at the end of a stream."""
        if self.harmony:
            r, c, pairs = self.harmony.finish()
            return r, c, [tools.make_call(name, args) for name, args in pairs]
        r, c = self.think.flush() if self.think else ("", "")
        calls = []
        if self.calls:
            c = self.calls.push(c)
            rest, calls = self.calls.finish()
            c += rest
        return r, c, calls

    def result(self):
        """(reasoning or None, content, calls) of the whole reply."""
        text = "".join(self.pieces)
        if self.harmony:
            r, c, pairs = harmony.parse(text, self.prep.think, bool(self.prep.family))
            return r, c, [tools.make_call(name, args) for name, args in pairs]
        r, c = reasoning.split(text, self.prep.think_inside, self.prep.think_tags) if self.think else (None, text)
        calls = []
        if self.calls:
            c, calls = tools.parse(self.prep.family, c, self.prep.tools)
        return r, c, calls

    def finish_reason(self, calls):
        return "tool_calls" if calls and self.finish == "stop" else self.finish


class Generation:
    """One admitted request: owns a slot and a model lease until the decode thread let go of
    every choice. Choices of one prompt share its evaluation (n > 1: the KV cache is copied).
    Iterate events() for what it generates; close() always."""

    def __init__(self, state, lm, prep, request, max_tokens):
        self.st, self.lm, self.prep, self.request, self.max_tokens = state, lm, prep, request, max_tokens
        self._released = False
        self._jobs_left = 1             # start() holds the slot and lease until its jobs are in
        self._pumps = []
        self._merged = asyncio.Queue()
        self.t_start = time.monotonic()
        self.t_first = None
        self.prefill = {}               # "cached": prompt tokens found in the slot's KV cache
        self.req = None
        tok, nv = lm.tokenizer, lm.model.n_vocab
        self.choices = []
        params = request.seeds()
        n = len(params)
        for pi, ids in enumerate(prep.prompts):
            for j, sp in enumerate(params):
                constraint = prep.constraint.copy() if prep.constraint is not None else None
                sampler = Sampler(nv, sp, constraint=constraint, logprobs=request.output.logprobs,
                                  end_ids=tok.eog_ids)
                self.choices.append(Choice(pi * n + j, pi, sampler, prep, tok))

    # --- jobs --------------------------------------------------------------------------
    def _submit(self, make_gen, finish):
        loop = asyncio.get_running_loop()

        def done():        # decode thread: the job's sessions are free again
            try:
                finish()
            finally:
                loop.call_soon_threadsafe(self._job_ended)

        job = Job(loop, make_gen, done, time.monotonic() + self.st.cfg.request_timeout)
        self._jobs_left += 1
        self.st.decoder.submit(job)
        return job

    def _job_ended(self):
        self._jobs_left -= 1
        if self._jobs_left == 0:        # every job let go of its sessions
            self._release()

    def _steps(self, choice, session, info):
        job = choice.job
        job.session = session           # the decode loop batches it with the other streams
        gen = self.lm.steps(session, self.prep.prompts[choice.prompt], info,
                            max_tokens=self.max_tokens, stop=self.request.output.stop,
                            sampler=choice.sampler, speculative=self.request.speculative,
                            images=self.prep.images)
        return Steps(gen, choice.sampler)

    async def start(self, req):
        self.req = req
        n = self.request.output.n
        try:
            for pi, ids in enumerate(self.prep.prompts):
                group = self.choices[pi * n:(pi + 1) * n]
                info = self.prefill if pi == 0 else {}
                if n == 1:
                    self._start_single(group[0], ids, info)
                else:
                    sessions = await self._fork(ids, n, info)      # fork() filled `info`
                    for j, c in enumerate(group):
                        if j < len(sessions):
                            self._start_on(c, sessions[j], {})
                        else:                       # no session free for it: it waits for one
                            self._start_single(c, ids, {})
        finally:
            for c in self.choices:
                if c.job is not None:
                    self._pumps.append(asyncio.get_running_loop().create_task(self._pump(c)))
            self._job_ended()           # start()'s own hold

    def _start_single(self, choice, ids, info):
        lm, box = self.lm, []

        def make_gen():
            s = lm.take_session(ids)
            box.append(s)
            return self._steps(choice, s, info)

        def finish():
            for s in box:
                lm.give_back(s)

        choice.job = self._submit(make_gen, finish)

    def _start_on(self, choice, session, info):
        lm = self.lm
        choice.job = self._submit(lambda: self._steps(choice, session, info), lambda: lm.give_back(session))

    async def _fork(self, ids, n, info):
        """Evaluate the prompt once (a job of its own), then fork its session up to n - 1 times
        (a worker thread copies the KV cache; as many as the model's sessions allow): up to n
        sessions that each hold the prompt."""
        lm, box, gens, lock = self.lm, [], [], threading.Lock()
        state = {"ended": False, "abandoned": False}

        def make_gen():
            s = lm.take_session(ids)
            box.append(s)
            gens.append(lm.steps(s, ids, info, max_tokens=0, images=self.prep.images))
            return gens[0]

        def finish():           # decode thread: the job let go of box[0]
            with lock:
                state["ended"] = True
                if state["abandoned"]:
                    for s in box:
                        lm.give_back(s)

        job = self._submit(make_gen, finish)
        try:
            while True:
                kind, value = await job.events.get()
                if kind == "error":
                    raise value
                if kind == "done":
                    break
            if not gens or gens[0].finish_reason != "length":   # max_tokens=0: the prompt is in
                raise NotReady(f"prompt evaluation ended early ({value})")
            s0 = box[0]
            forks = await asyncio.get_running_loop().run_in_executor(None, lm.fork_session, s0, n - 1)
        except BaseException:
            job.cancel.set()
            with lock:
                state["abandoned"] = True
                if state["ended"]:
                    for s in box:
                        lm.give_back(s)
            raise
        return [s0] + forks

    async def _pump(self, choice):
        while True:
            kind, value = await choice.job.events.get()
            await self._merged.put((choice, kind, value))
            if kind in ("done", "error"):
                return

    def _release(self):
        if not self._released:
            self._released = True
            self.st.registry.release(self.lm)
            self.st.slots.release()

    async def close(self):
        """Stop generating (if still running) and wait until the decode thread let go."""
        for c in self.choices:
            if c.job is not None and not c.done:
                c.job.cancel.set()
        if self._pumps:
            await asyncio.gather(*self._pumps, return_exceptions=True)
        if self.req is None:            # never started
            self._release()
            return
        info = self.req.info
        n_gen = sum(c.n_gen for c in self.choices)
        finishes = {c.finish or "cancelled" for c in self.choices}
        info.update(completion_tokens=n_gen, finish=",".join(sorted(finishes)))
        gens = [c.job.gen.gen for c in self.choices if c.job is not None and isinstance(c.job.gen, Steps)]
        drafted, accepted = sum(g.n_drafted for g in gens), sum(g.n_accepted for g in gens)
        if drafted:
            info.update(drafted=drafted, accepted=accepted)
            self.st.metrics.drafted(drafted, accepted)
        if "cached" in self.prefill:
            info["cached_tokens"] = self.prefill["cached"]
        if "evaluated" in self.prefill:
            info["prompt_eval"] = self.prefill["evaluated"]
        elapsed = time.monotonic() - self.t_start
        if self.t_first is not None:
            info["ttft_ms"] = (self.t_first - self.t_start) * 1e3
        info["gen_ms"] = elapsed * 1e3
        self.st.metrics.tokens(info.get("prompt_tokens", 0), n_gen, elapsed)
        self.st.metrics.generation(self.lm.name, self.req.path, info.get("queue_ms", 0.0) / 1e3,
                                   None if self.t_first is None else self.t_first - self.t_start,
                                   max(c.n_gen for c in self.choices), elapsed)    # n > 1: in parallel
        if self.st.cfg.log_prompts:
            replies = ["".join(c.pieces) for c in self.choices]
            info["reply"] = replies if len(replies) > 1 else replies[0]

    async def events(self, req):
        """(choice, text, finish_reason) until every choice ended; cancels the jobs if the
        client goes away."""
        left = len(self.choices)
        while left:
            choice, kind, value = await self._merged.get()
            if kind == "token":
                if self.t_first is None:
                    self.t_first = time.monotonic()
                choice.add(value)
                if req.disconnected():
                    for c in self.choices:
                        c.job.cancel.set()
                yield choice, value.text or "", None
            elif kind == "done":
                # engine: "stop"/"length"; decoder: "cancelled" (client gone), "abort" (shutdown
                # drain timed out), None (generator ended without a reason)
                choice.done = True
                left -= 1
                choice.finish = {"stop": "stop", "length": "length", "cancelled": "cancelled",
                                 "abort": "length"}.get(value, "stop")
                yield choice, "", choice.finish
            else:
                choice.done = True
                choice.finish = "error"
                raise value

    async def drain(self, req):
        """Run every choice to its end without streaming (a whole reply): events() consumed."""
        async for _ in self.events(req):
            pass

    def usage(self):
        """Tokens of the request: "prompt", "completion" ("reasoning" of them in think blocks or
        analysis messages), and "cached" (prompt tokens found in
        the slot's KV cache) when the engine reported it."""
        u = {"prompt": sum(len(ids) for ids in self.prep.prompts),
             "completion": sum(c.n_gen for c in self.choices),
             "reasoning": sum(c.n_reasoning for c in self.choices)}
        if "cached" in self.prefill:
            u["cached"] = self.prefill["cached"]
        return u


ENCODER_UNIT_TOKENS = 512   # tokens of one encoder pass between two generation passes


async def embed(state, lm, seqs, pooling, req):
    """The vectors of token-id lists `seqs` on the loaded model `lm`, computed on the decode
    thread one unit at a time beside the generations (service/scheduler.py), within
    request_timeout; stopped when the client goes away. The caller holds a slot and the lease."""
    loop = asyncio.get_running_loop()
    box = []
    # a decoder's chunk is a prompt chunk's size: the streams wait no longer than for a prompt
    unit = ENCODER_UNIT_TOKENS if lm.model.encoder is not None else state.cfg.prompt_chunk_max

    def make_gen():
        box.append(lm.model.embed_steps(seqs, pooling, normalize=pooling != "none", unit_tokens=unit))
        return box[0]

    def finish():           # decode thread: free a decoder's session at once
        for steps in box:
            steps.close()

    timeout = state.cfg.request_timeout
    job = Job(loop, make_gen, finish, time.monotonic() + timeout, embedding=True)
    state.decoder.submit(job)
    kind = None
    try:
        while kind not in ("done", "error"):
            try:
                kind, value = await asyncio.wait_for(job.events.get(), 0.25)
            except asyncio.TimeoutError:
                if req.disconnected():
                    job.cancel.set()
    finally:
        if kind not in ("done", "error"):      # the lease outlives the decode thread's use of it
            job.cancel.set()
            await asyncio.shield(_ended(job))
    if kind == "error":
        raise value
    if isinstance(value, str):      # ended without vectors
        if value == "length":
            raise QueueTimeout(f"embedding took longer than request_timeout={timeout:g}s")
        raise NotReady(f"embedding {value}")
    return value


async def _ended(job):
    while (await job.events.get())[0] not in ("done", "error"):
        pass

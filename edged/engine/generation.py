"""One request's decoding on a Session, as steps someone else drives.

A Generation holds what changes per request besides the KV cache: the prompt tokens still to
evaluate, the sampler (RNG, penalties), the stop matcher and the UTF-8 stream decoder. It never
runs the model itself; its driver does, one step at a time:

    g = session.start(ids, SamplingParams(temperature=0.8, seed=1), max_tokens=32)
    while True:
        entry = g.entry(budget)                 # a prompt chunk, or the last sampled token
        out = g.accept(model.decode([entry])[0])  # None while the prompt is still going in
        if out is not None: ... out.text ...; if out.finish_reason: break

Session.generate() is exactly that loop with no budget; the daemon's scheduler puts the entries
of all its slots into one Model.decode call per step (engine/model.py, service/scheduler.py).

With a drafter (engine/speculative.py) the entry of a decoding step is the last sampled token
plus up to k drafted tokens (logits "all"), and `accept_all` returns every token the step
accepted: each row is sampled as plain decoding samples that position, the drafts are kept up to
the first that differs from the sampled token, and the KV cache forgets the rest (how many it
drafts next follows how many were accepted: the drafter's `k`). `accept` is
the one-output form for generations without a drafter.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .batch import BatchEntry
from ..errors import RequestError
from ..text.sampling import Sampler, SamplingParams, StopMatcher


@dataclass(frozen=True)
class GenerationOutput:
    """One step of a generation: the new text (complete UTF-8 only), the token id, and the
    finish reason ("stop", "length") on the last item, else None; `stop`: the stop string
    that ended it."""
    text: str
    token: int | None
    finish_reason: str | None = None
    stop: str | None = None


class Generation:
    """Prompt tokens to evaluate, then sample -> evaluate the sampled token -> sample ...

    Made by Session.start(), which has already found the prompt prefix the session's KV cache
    holds (n_cached tokens are not evaluated again)."""

    def __init__(self, session, ids, n_cached, params=SamplingParams(), max_tokens=128, stop=(),
                 sampler=None, drafter=None):
        if max_tokens is not None and max_tokens < 0:
            raise RequestError(f"max_tokens={max_tokens}: must be >= 0")
        tok = session.model.tokenizer
        self.session = session
        # a caller's own sampler (structured output, logprobs), else one drawing with `params`
        self.sampler = sampler or Sampler(session.model.hp.n_vocab, params, end_ids=tok.eog_ids)
        self.sampler.accept_many(ids)
        self.max_tokens = max_tokens
        self.n_prompt, self.n_cached = len(ids), n_cached
        self._pending = list(ids[n_cached:])    # prompt tokens not yet in the KV cache
        self._pos = n_cached                    # where _pending[0] goes
        self._inflight = 0                      # prompt tokens of the entry handed out last
        self._decoder = tok.stream_decoder()
        self._stopper = StopMatcher(stop)
        self._eog = tok.eog_ids
        self.last_token = None                  # sampled, to be evaluated by the next step
        self.drafter = drafter                  # engine/speculative.py, or None
        self._context = list(ids) if drafter is not None else None   # prompt + accepted tokens
        self._drafts = ()                       # the drafts of the entry handed out last
        self.n_drafted = self.n_accepted = 0    # draft tokens verified / accepted
        self.finish_reason = None
        self.n_gen = 0
        self._t0 = time.perf_counter()
        self._t_prompt = None
        self._t_sample = 0.0
        self._t_end = None

    @property
    def prefilling(self):
        """True while prompt tokens remain to be evaluated."""
        return bool(self._pending)

    @property
    def n_pending(self):
        return len(self._pending)

    def entry(self, budget=None):
        """What the next step evaluates for this generation: up to `budget` prompt tokens (all
        of them with None), or the token sampled last."""
        if self.finish_reason is not None:
            raise RequestError("generation already finished")
        if self._pending:
            n = len(self._pending) if budget is None else max(1, min(int(budget), len(self._pending)))
            if self.session.images is not None:     # an image decoded non-causally stays whole
                n = self.session.images.cut(self._pending, n)
            self._inflight = n
            return BatchEntry(self.session, self._pending[:n], self._pos,
                              "last" if n == len(self._pending) else None)
        self._drafts = self._draft()
        if self._drafts:
            return BatchEntry(self.session, (self.last_token, *self._drafts), None, "all")
        return BatchEntry(self.session, (self.last_token,), None, "last")

    def _draft(self):
        """The drafter's guesses for the next step, no more than can be used: tokens up to
        max_tokens, positions up to the context's end."""
        if self.drafter is None:
            return ()
        s = self.session
        k = min(self.drafter.k, s.n_ctx - s.n_past - 1)
        # k + 1 rows below the kernel path's packed-panel threshold: from there a pass unpacks
        # every weight into panels, a fixed cost of several decode passes (docs/kernels.md)
        panels = getattr(s.model.backend, "gemm_min_cols", 0)
        if panels > 2:
            k = min(k, panels - 2)
        if self.max_tokens is not None:
            k = min(k, self.max_tokens - self.n_gen - 1)
        return tuple(self.drafter.draft(self._context, k)[:k]) if k > 0 else ()

    def accept(self, logits):
        """The step ran the entry: take its logits. Returns None while the prompt is still
        going in, else the GenerationOutput of the token sampled from them (a generation with
        a drafter: accept_all)."""
        if self.drafter is not None:
            raise RequestError("a generation with a drafter accepts with accept_all()")
        outs = self.accept_all(logits)
        return outs[0] if outs else None

    def accept_all(self, logits):
        """The step ran the entry: take its logits. Returns the GenerationOutputs of the tokens
        it gave: none while the prompt is still going in, else one, or with drafts up to
        k + 1: the row of position i is sampled as plain decoding samples it, and the next row
        is read only while the draft at i equals the token sampled there."""
        if self._pending:
            n, self._inflight = self._inflight, 0
            del self._pending[:n]
            self._pos += n
            if self._pending:
                return []
            self._t_prompt = time.perf_counter()
            return [self._sample(logits[-1], self.session.n_past)]
        drafts, self._drafts = self._drafts, ()
        s, k = self.session, len(drafts)
        base = s.n_past - k                     # the cache as plain decoding has it at row 0
        outs = []
        for i in range(k + 1):
            out = self._sample(logits[i], base + i)
            outs.append(out)
            if out.finish_reason or i == k or out.token != drafts[i]:
                break
        s.truncate(base + i)                    # forget the drafts after the accepted ones
        accepted = i + (i < k and outs[-1].token == drafts[i])   # a draft that ended it counts
        if k:
            self.drafter.verified(k, accepted)  # the next step's draft length
        self.n_drafted += k
        self.n_accepted += accepted
        return outs

    def _sample(self, row, n_past):
        """The token at the next position from `row`; n_past: the tokens in the cache as plain
        decoding has them when it samples this position."""
        stopper, decoder = self._stopper, self._decoder
        if self.max_tokens is not None and self.n_gen >= self.max_tokens:
            return self._end(GenerationOutput(stopper.flush(decoder.flush()), None, "length"))
        ts = time.perf_counter()
        t = self.sampler.sample(row, self.n_gen)     # keyed by (seed, position): text/sampling.py
        self._t_sample += time.perf_counter() - ts
        self.n_gen += 1
        if t in self._eog:
            return self._end(GenerationOutput(stopper.flush(decoder.flush()), t, "stop"))
        self.sampler.accept(t)
        text = decoder.push(t)
        # stop strings count from the min_tokens-th token on (vLLM's rule); before, the text passes
        text, hit = stopper.push(text) if self.n_gen >= self.sampler.params.min_tokens else (text, False)
        if hit:  # the text before the stop string; the sampled token is not evaluated
            return self._end(GenerationOutput(text, t, "stop", stopper.hit))
        if (self.max_tokens is not None and self.n_gen >= self.max_tokens) or n_past >= self.session.n_ctx:
            # the last token asked for, or no room left in the context to evaluate it
            return self._end(GenerationOutput(text + stopper.flush(decoder.flush()), t, "length"))
        self.last_token = t
        if self._context is not None:
            self._context.append(t)
        return GenerationOutput(text, t, None)

    def _end(self, out):
        self.finish_reason = out.finish_reason
        self.last_token = None
        self._t_end = time.perf_counter()
        return out

    def stats(self):
        """Timings so far: n_prompt, n_prompt_eval (tokens evaluated, the rest came from the
        cache), prompt_ms, n_gen, gen_ms (after the prompt), sample_ms."""
        now = self._t_end or time.perf_counter()
        tp = self._t_prompt
        return {"n_prompt": self.n_prompt, "n_prompt_eval": self.n_prompt - self.n_cached,
                "prompt_ms": ((tp or now) - self._t0) * 1000, "n_gen": self.n_gen,
                "gen_ms": (now - tp) * 1000 if tp else 0.0, "sample_ms": self._t_sample * 1000,
                "n_drafted": self.n_drafted, "n_accepted": self.n_accepted}

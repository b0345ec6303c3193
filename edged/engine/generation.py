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
                 sampler=None):
        if max_tokens is not None and max_tokens < 0:
            raise RequestError(f"max_tokens={max_tokens}: must be >= 0")
        tok = session.model.tokenizer
        self.session = session
        # a caller's own sampler (structured output, logprobs), else one drawing with `params`
        self.sampler = sampler or Sampler(session.model.hp.n_vocab, params)
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
            self._inflight = n
            return BatchEntry(self.session, self._pending[:n], self._pos,
                              "last" if n == len(self._pending) else None)
        return BatchEntry(self.session, (self.last_token,), None, "last")

    def accept(self, logits):
        """The step ran the entry: take its logits. Returns None while the prompt is still
        going in, else the GenerationOutput of the token sampled from them."""
        if self._pending:
            n, self._inflight = self._inflight, 0
            del self._pending[:n]
            self._pos += n
            if self._pending:
                return None
            self._t_prompt = time.perf_counter()
        return self._sample(logits[-1])

    def _sample(self, row):
        stopper, decoder = self._stopper, self._decoder
        if self.max_tokens is not None and self.n_gen >= self.max_tokens:
            return self._end(GenerationOutput(stopper.flush(decoder.flush()), None, "length"))
        ts = time.perf_counter()
        t = self.sampler.sample(row)
        self._t_sample += time.perf_counter() - ts
        self.n_gen += 1
        if t in self._eog:
            return self._end(GenerationOutput(stopper.flush(decoder.flush()), t, "stop"))
        self.sampler.accept(t)
        text, hit = stopper.push(decoder.push(t))
        if hit:  # the text before the stop string; the sampled token is not evaluated
            return self._end(GenerationOutput(text, t, "stop", stopper.hit))
        s = self.session
        if (self.max_tokens is not None and self.n_gen >= self.max_tokens) or s.n_past >= s.n_ctx:
            # the last token asked for, or no room left in the context to evaluate it
            return self._end(GenerationOutput(text + stopper.flush(decoder.flush()), t, "length"))
        self.last_token = t
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
                "gen_ms": (now - tp) * 1000 if tp else 0.0, "sample_ms": self._t_sample * 1000}

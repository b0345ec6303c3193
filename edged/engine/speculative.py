"""Speculative decoding that never changes a token: drafts, verified in one pass of the target.

A drafter guesses the next k tokens of a generation cheaply; the Generation (generation.py)
evaluates its last sampled token and the k guesses as one entry of k + 1 rows with
logits="all", samples each row exactly as plain decoding would sample that position (the
keyed sampler: text/sampling.py keyed_uniform(seed, position); penalties and a grammar see the
accepted tokens only), keeps the guesses up to the first one that differs from the sampled token,
plus that sampled token, and forgets the rest of the KV cache. Every row's logits are the bits
of the token evaluated alone (docs/engine.md, "Reproducibility"), so the accepted tokens are the
tokens plain decoding gives, for greedy and seeded requests alike: speculation is only ever
faster (or, with bad guesses, slower), never different.

Two drafters:
- `lookup` (prompt lookup / n-gram): the tokens that followed the latest earlier occurrence of
  the last n tokens of the prompt + text so far (n from ngram_max down to ngram_min). No model;
  it helps where the reply copies its input: extraction, quoting, code and JSON edits, rewriting.
- `draft`: a smaller model with the same vocabulary (check_vocab: refused at load otherwise)
  drafts greedily on its own session (its own KV cache, kept on the target session and reused
  with prefix reuse between steps and requests).

The draft length adapts (`adapt`, the default): a step drafts DRAFT_START tokens at first,
DRAFT_GROW times more after a step whose drafts were all accepted (up to draft_max), and one after
a step with a rejected draft. A verify row is not free (on SmolLM2-135M Q4_1, 1 thread, each row
after the first costs about 0.4 of a one-token pass: BENCHMARKS.md "Speculative decoding"), so a
long draft pays only inside a run of copied text and a short one probes for the next run.
`adapt=False` drafts draft_max tokens every step.

Speculation(...) is the typed knob (frozen; checked once): the CLI, Python API and daemon all
build one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .batch import BatchEntry
from ..errors import ConfigError

MODES = ("off", "lookup", "draft")
DRAFT_MAX = 10          # default draft length (tokens guessed per step)
DRAFT_MAX_LIMIT = 64    # most draft tokens of a step: a verify entry is k + 1 rows of one pass
NGRAM_MIN, NGRAM_MAX = 2, 6   # a 1-gram match guesses too often wrong to pay for its rows
DRAFT_START, DRAFT_GROW = 4, 3  # adaptive draft length: first k, factor after a fully accepted step


@dataclass(frozen=True)
class Speculation:
    """How a generation drafts: mode "lookup" or "draft" ("off": never), at most draft_max
    tokens per step (adapt: fewer after rejections, module docstring; False: always draft_max),
    lookup n-gram sizes ngram_max down to ngram_min, and the draft Model for "draft"."""
    mode: str = "lookup"
    draft_max: int = DRAFT_MAX
    ngram_min: int = NGRAM_MIN
    ngram_max: int = NGRAM_MAX
    draft_model: object = None          # engine.model.Model, same vocabulary as the target
    adapt: bool = True

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"speculative={self.mode!r}: expected one of {', '.join(MODES)}")
        if not (isinstance(self.draft_max, int) and 1 <= self.draft_max <= DRAFT_MAX_LIMIT):
            raise ConfigError(f"draft_max={self.draft_max!r}: must be an integer in [1, {DRAFT_MAX_LIMIT}]")
        if not (isinstance(self.ngram_min, int) and isinstance(self.ngram_max, int)
                and 1 <= self.ngram_min <= self.ngram_max <= 16):
            raise ConfigError(f"ngram sizes {self.ngram_min}..{self.ngram_max}: need 1 <= min <= max <= 16")
        if self.mode == "draft" and self.draft_model is None:
            raise ConfigError("speculative='draft' needs a draft model (draft_model)")

    @property
    def on(self):
        return self.mode != "off"

    def drafter(self, session):
        """A new drafter for one generation on `session` (None when off)."""
        if self.mode == "lookup":
            return LookupDrafter(self.draft_max, self.ngram_min, self.ngram_max, self.adapt)
        if self.mode == "draft":
            check_vocab(session.model, self.draft_model)
            return ModelDrafter(session, self.draft_model, self.draft_max, self.adapt)
        return None


class Drafter:
    """What every drafter has: `k`, how many tokens the next step drafts (at most draft_max),
    and verified(k, accepted), which the generation calls after each step that drafted k > 0: with
    adapt, k grows DRAFT_GROW-fold after a step that accepted all of its k drafts and falls to 1
    after one that rejected a draft. Only how many tokens are guessed depends on it, never
    which tokens are accepted."""

    def __init__(self, draft_max=DRAFT_MAX, adapt=True):
        self.draft_max, self.adapt = draft_max, adapt
        self.k = min(DRAFT_START, draft_max) if adapt else draft_max

    def verified(self, k, accepted):
        if self.adapt:
            self.k = min(self.draft_max, self.k * DRAFT_GROW) if accepted == k else 1

    def close(self):
        pass


class LookupDrafter(Drafter):
    """Prompt lookup: for n from ngram_max to ngram_min, the tokens that followed the latest
    earlier occurrence of the context's last n tokens. The index of n-grams grows with the
    context (which only ever grows: it holds accepted tokens only)."""

    def __init__(self, draft_max=DRAFT_MAX, ngram_min=NGRAM_MIN, ngram_max=NGRAM_MAX, adapt=True):
        super().__init__(draft_max, adapt)
        self.sizes = range(ngram_max, ngram_min - 1, -1)
        self._index = {n: {} for n in self.sizes}   # n-gram -> where its latest continuation starts
        self._done = 0                  # n-grams ending before this position are indexed

    def draft(self, context, k):
        """Up to k guessed tokens following `context` (prompt + accepted tokens, the last one
        sampled and not yet evaluated)."""
        end = len(context) - 1          # the last n-gram has no continuation yet
        for i in range(self._done, end):
            for n in self.sizes:
                if i + 1 >= n:
                    self._index[n][tuple(context[i + 1 - n:i + 1])] = i + 1
        self._done = max(self._done, end)
        for n in self.sizes:
            if len(context) > n:
                start = self._index[n].get(tuple(context[-n:]))
                if start is not None:
                    return list(context[start:start + k])
        return []


class ModelDrafter(Drafter):
    """Greedy drafts of a smaller model of the same vocabulary, on its own session: kept on the
    target session (`session.draft_session`, closed with it) so that its KV cache is reused
    between steps and requests (prefix reuse)."""

    def __init__(self, session, model, draft_max=DRAFT_MAX, adapt=True):
        super().__init__(draft_max, adapt)
        ds = getattr(session, "draft_session", None)
        if ds is None or ds.model is not model or ds._buf is None:
            if ds is not None:
                ds.close()
            ds = session.draft_session = model.session(n_ctx=session.n_ctx, n_batch=session.n_batch)
        self.session = ds
        self._eog = model.tokenizer.eog_ids

    def draft(self, context, k):
        s = self.session
        k = min(k, s.n_ctx - len(context))
        if k <= 0:
            return []
        keep = min(s.common_prefix(context), len(context) - 1)
        logits = s.model.decode([BatchEntry(s, context[keep:], keep, "last")])[0]
        out = []
        while True:
            t = int(np.argmax(logits[-1]))
            out.append(t)
            if len(out) >= k or t in self._eog:
                return out
            logits = s.model.decode([BatchEntry(s, (t,), None, "last")])[0]


def check_vocab(target, draft):
    """ConfigError naming the first difference when `draft` cannot draft for `target`: another
    vocabulary size, another token text at some id, other special tokens."""
    a, b = target.tokenizer, draft.tokenizer
    what = f"draft model {draft.path}: its vocabulary differs from {target.path}'s"
    if a.n_vocab != b.n_vocab:
        raise ConfigError(f"{what}: {b.n_vocab} tokens against {a.n_vocab}")
    if a._text != b._text:
        i = next(i for i, (x, y) in enumerate(zip(a._text, b._text)) if x != y)
        raise ConfigError(f"{what}: token {i} is {b._text[i]!r} against {a._text[i]!r}")
    for name in ("bos_id", "eos_id", "eot_id"):
        if getattr(a, name) != getattr(b, name):
            raise ConfigError(f"{what}: {name} {getattr(b, name)} against {getattr(a, name)}")

"""Token sampling and stop strings.

Sampler applies, in llama.cpp's order: logit bias, repetition/presence/frequency penalties
over the last `penalty_last_n` tokens, then greedy (temperature <= 0) or top-k -> top-p ->
min-p -> temperature -> a draw from a seeded RNG (same seed, same tokens). A structured-output
Constraint (text/grammar.py) masks the tokens its grammar does not allow before all of that.
With `logprobs`, each draw also records the chosen token's log-probability and the most likely
alternatives, from the model's own distribution: the log-softmax of the raw logits, before
bias, penalties, grammar mask, temperature and truncation. The per-token work
runs in compiled code (edged._core.sample_logits, no full sort of the vocabulary: well under a
millisecond on a 152k vocabulary) when the extension is built, else in NumPy
(sample_reference, the slow obvious twin the compiled path is tested against).
"""
from __future__ import annotations

import collections
import dataclasses

import numpy as np

from ..errors import RequestError

try:
    from .._core import sample_logits as _compiled_sample, sample_work_bytes as _work_bytes
except ImportError:  # reference build without the compiled core
    _compiled_sample = _work_bytes = None


INT32_MAX = (1 << 31) - 1        # top_k is a C int in the compiled sampler
FLT_MIN = 1.1754943508222875e-38  # smallest normal float32: 1 / FLT_MIN still fits a float32


@dataclasses.dataclass(frozen=True)
class Bound:
    """The range a request may give a sampling parameter: inside what the compiled sampler
    accepts (a C int, a float32 or a double), so no value reaches it that it cannot hold."""
    lo: float
    hi: float
    default: float
    integer: bool = False


# The one table request parsing (edged/service/api.py) checks numbers against.
REQUEST_BOUNDS = {
    "temperature": Bound(0.0, 2.0, 1.0),
    "top_p": Bound(0.0, 1.0, 1.0),
    "top_k": Bound(0, INT32_MAX, 0, integer=True),
    "min_p": Bound(0.0, 1.0, 0.0),
    "presence_penalty": Bound(-2.0, 2.0, 0.0),
    "frequency_penalty": Bound(-2.0, 2.0, 0.0),
    # it divides logits (as a float32): 0, or a value that is 0 in float32, is +inf
    "repeat_penalty": Bound(0.001, 10.0, 1.0),
}


def greedy_temperature(temperature):
    """A temperature so small that 1/temperature overflows float32 samples exactly as greedy
    (temperature 0) would; the compiled sampler would otherwise scale logits to inf and NaN."""
    return 0.0 if 0.0 <= temperature < FLT_MIN else temperature


def _check(name, v, lo, hi):
    if not (lo <= v <= hi):
        raise RequestError(f"{name}={v}: must be in [{lo}, {hi}]")


class Sampler:
    def __init__(self, n_vocab, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=None,
                 repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                 penalty_last_n=64, logit_bias=None, constraint=None, logprobs=None):
        _check("temperature", float(temperature), 0.0, 100.0)    # before: -1 is not greedy
        temperature = greedy_temperature(float(temperature))
        top_p, min_p = float(top_p), float(min_p)
        _check("top_p", top_p, 0.0, 1.0)
        _check("min_p", min_p, 0.0, 1.0)
        _check("repeat_penalty", float(repeat_penalty), 0.0, 100.0)
        _check("presence_penalty", float(presence_penalty), -100.0, 100.0)
        _check("frequency_penalty", float(frequency_penalty), -100.0, 100.0)
        if not 0 <= int(top_k) <= INT32_MAX:
            raise RequestError(f"top_k={top_k}: must be in [0, {INT32_MAX}]")
        if int(penalty_last_n) < 0:
            raise RequestError(f"penalty_last_n={penalty_last_n}: must be >= 0")
        self.n_vocab = n_vocab
        self.temperature, self.top_k, self.top_p, self.min_p = temperature, int(top_k), top_p, min_p
        self.repeat_penalty = float(repeat_penalty)
        self.presence_penalty = float(presence_penalty)
        self.frequency_penalty = float(frequency_penalty)
        self.penalty_last_n = int(penalty_last_n)
        self.history = collections.deque(maxlen=max(self.penalty_last_n, 1))
        self.bias_ids = np.zeros(0, np.int32)
        self.bias_vals = np.zeros(0, np.float32)
        if logit_bias:
            items = [(int(k), float(v)) for k, v in dict(logit_bias).items()]
            for k, _ in items:
                if not 0 <= k < n_vocab:
                    raise RequestError(f"logit_bias: token id {k} out of range [0, {n_vocab})")
            self.bias_ids = np.array([k for k, _ in items], np.int32)
            self.bias_vals = np.array([v for _, v in items], np.float32)
        if seed is None:
            seed = int.from_bytes(np.random.SeedSequence().entropy.to_bytes(16, "little")[:8],
                                  "little")
        self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        self.rng = np.random.Generator(np.random.PCG64(self.seed))
        self._work = None   # the compiled sampler's scratch, reused for every token
        self.constraint = constraint      # text.grammar.Constraint or None
        self.n_logprobs = logprobs        # None: not recorded; k: the top k alternatives too
        self.records = []                 # (token, logprob, [(id, logprob)] top k) per draw

    def accept(self, token):
        if self.constraint is not None:
            self.constraint.consume(token)
        if self.penalty_last_n:
            self.history.append(int(token))

    def accept_many(self, tokens):
        for t in tokens[-self.penalty_last_n:] if self.penalty_last_n else ():
            self.history.append(int(t))

    def _penalties(self):
        if not self.history or (self.repeat_penalty == 1.0 and self.presence_penalty == 0.0
                                and self.frequency_penalty == 0.0):
            return np.zeros(0, np.int32), np.zeros(0, np.int32)
        ids, counts = np.unique(np.fromiter(self.history, np.int32), return_counts=True)
        return ids.astype(np.int32), counts.astype(np.int32)

    def sample(self, logits):
        """logits: float32 (n_vocab,). Returns the chosen token id."""
        logits = np.ascontiguousarray(logits, dtype=np.float32)
        pen_ids, pen_counts = self._penalties()
        u = float(self.rng.random()) if self.temperature > 0 else 0.0
        mask = self.constraint.mask() if self.constraint is not None else None
        if _compiled_sample is not None:
            if self._work is None or len(self._work) < _work_bytes(len(logits)):
                self._work = np.empty(_work_bytes(len(logits)), np.uint8)
            t = int(_compiled_sample(logits, self.bias_ids, self.bias_vals, pen_ids,
                                     pen_counts, self.repeat_penalty, self.presence_penalty,
                                     self.frequency_penalty, self.temperature, self.top_k,
                                     self.top_p, self.min_p, u, self._work, mask))
        else:
            t = sample_reference(logits, self.bias_ids, self.bias_vals, pen_ids, pen_counts,
                                 self.repeat_penalty, self.presence_penalty,
                                 self.frequency_penalty, self.temperature, self.top_k,
                                 self.top_p, self.min_p, u, mask)
        if self.n_logprobs is not None:
            self.records.append(token_logprobs(logits, t, self.n_logprobs))
        return t

    def take_records(self):
        """The logprob records of the draws since the last call."""
        out, self.records = self.records, []
        return out


def token_logprobs(logits, token, k):
    """(token, its log-probability, [(id, log-probability)] of the k most likely tokens, most
    likely first) under log-softmax(logits); NaN logits count as -inf."""
    x = np.where(np.isnan(logits), -np.inf, logits).astype(np.float64)
    mx = x.max()
    lse = mx + np.log(np.exp(x - mx).sum())
    top = []
    if k > 0:
        idx = np.argpartition(-x, k - 1)[:k] if k < len(x) else np.arange(len(x))
        idx = idx[np.lexsort((idx, -x[idx]))]
        top = [(int(i), float(x[i] - lse)) for i in idx]
    return int(token), float(x[token] - lse), top


def sample_reference(logits, bias_ids, bias_vals, pen_ids, pen_counts, repeat_penalty,
                     presence_penalty, frequency_penalty, temperature, top_k, top_p, min_p, u,
                     mask=None):
    """The NumPy twin of the compiled sampler; u is the uniform draw in [0, 1); mask: the
    allowed-token bitmask (uint32 words, bit i % 32 of word i // 32) or None."""
    x = logits.astype(np.float32, copy=True)
    x[np.isnan(x)] = -np.inf       # a NaN logit (a broken model) is never drawn
    if mask is not None:
        bits = np.unpackbits(np.asarray(mask, np.uint32).view(np.uint8), bitorder="little")
        x[~bits[:len(x)].astype(bool)] = -np.inf
    if len(bias_ids):
        np.add.at(x, bias_ids, bias_vals)
    if len(pen_ids):
        v = x[pen_ids]
        v = np.where(v > 0, v / repeat_penalty, v * repeat_penalty)
        v -= pen_counts * frequency_penalty + (pen_counts > 0) * presence_penalty
        x[pen_ids] = v
    if temperature <= 0:
        return int(np.argmax(x))
    # candidates sorted by logit, descending (ties: lower id first)
    idx = np.argsort(-x, kind="stable")
    if top_k > 0:
        idx = idx[:top_k]
    lg = x[idx].astype(np.float64)
    p = np.exp(lg - lg[0])
    p /= p.sum()
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)
        idx, lg = idx[:keep], lg[:keep]
        p = p[:keep]
    if min_p > 0.0:
        keep = int((p >= min_p * p[0]).sum())
        idx, lg = idx[:keep], lg[:keep]
    p = np.exp((lg - lg[0]) / temperature)
    c = np.cumsum(p)
    j = int(np.searchsorted(c, u * c[-1], side="right"))
    return int(idx[min(j, len(idx) - 1)])


class StopMatcher:
    """Finds stop strings in streamed text, holding back what could be the start of one."""

    def __init__(self, stops):
        if isinstance(stops, str):
            stops = [stops]
        self.stops = [s for s in (stops or ()) if s]
        self.pending = ""

    def push(self, text):
        """Returns (text safe to emit, hit). On a hit the text is everything before the stop."""
        if not self.stops:
            return text, False
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out = self.pending[:min(hits)]
            self.pending = ""
            return out, True
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), hold, -1):
                if self.pending.endswith(s[:n]):
                    hold = n
                    break
        out = self.pending[:len(self.pending) - hold]
        self.pending = self.pending[len(self.pending) - hold:]
        return out, False

    def flush(self, text=""):
        out, hit = self.push(text)
        if not hit:
            out += self.pending
        self.pending = ""
        return out

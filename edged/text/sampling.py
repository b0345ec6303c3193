"""Token sampling and stop strings.

Sampler applies, in llama.cpp's order: logit bias, repetition/presence/frequency penalties
over the last `penalty_last_n` tokens, then greedy (temperature <= 0) or top-k -> top-p ->
min-p -> temperature -> a draw with the uniform `keyed_uniform(seed, position)` (same seed, same
tokens). The uniform of the token at position p (the p-th token the request generates) is a
pure function of (seed, p), never the next value of a stream: a draw that is thrown away (a
rejected speculative draft, a retry) consumes nothing, so speculation and batching cannot change
a sampled token (docs/engine.md, "Reproducibility"). A structured-output
Constraint (text/grammar.py) masks the tokens its grammar does not allow before all of that;
`min_tokens` masks the end tokens at positions below it (vLLM's MinTokensLogitsProcessor),
unless the grammar allows nothing else.
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


MASK64 = (1 << 64) - 1
INT32_MAX = (1 << 31) - 1        # top_k is a C int in the compiled sampler
FLT_MIN = 1.1754943508222875e-38  # smallest normal float32: 1 / FLT_MIN still fits a float32


@dataclasses.dataclass(frozen=True)
class Bound:
    """The range a sampling parameter may take: inside what the compiled sampler accepts (a C
    int, a float32 or a double), so no value reaches it that it cannot hold."""
    lo: float
    hi: float
    integer: bool = False


# The one bounds table of the sampling parameters: SamplingParams checks against it, the wire
# protocols' validators and docs read it.
REQUEST_BOUNDS = {
    "temperature": Bound(0.0, 2.0),
    "top_p": Bound(0.0, 1.0),
    "top_k": Bound(0, INT32_MAX, integer=True),
    "min_p": Bound(0.0, 1.0),
    "presence_penalty": Bound(-2.0, 2.0),
    "frequency_penalty": Bound(-2.0, 2.0),
    # it divides logits (as a float32): 0, or a value that is 0 in float32, is +inf
    "repeat_penalty": Bound(0.001, 10.0),
    "penalty_last_n": Bound(0, 1 << 16, integer=True),
    "seed": Bound(-(1 << 63), (1 << 64) - 1, integer=True),
    "min_tokens": Bound(0, INT32_MAX, integer=True),
    "logit_bias": Bound(-100.0, 100.0),          # each value
}


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How a request draws its tokens: built once (from a request body, the CLI's flags or a
    caller), checked once against REQUEST_BOUNDS, then taken as it is by Generation, Sampler
    and the compiled sampler. temperature 0 (or one so small that 1/temperature overflows a
    float32) is greedy; seed None draws from the OS's entropy. logit_bias: ((token id, bias),
    ...). min_tokens: no end token drawn (Sampler) and no stop string matched (the engine's
    Generation) before that many tokens. A new parameter is a field here, a row in
    REQUEST_BOUNDS and the code that uses it."""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None
    logit_bias: tuple = ()
    min_tokens: int = 0

    def __post_init__(self):
        put = object.__setattr__
        for f in dataclasses.fields(self):
            b = REQUEST_BOUNDS[f.name]
            v = getattr(self, f.name)
            if f.name == "seed" and v is None:
                continue
            if f.name == "logit_bias":
                pairs = tuple(sorted((_number(f"logit_bias[{k}]", k, True), _number(f"logit_bias[{k}]", x))
                                     for k, x in (v.items() if isinstance(v, dict) else v or ())))
                for k, x in pairs:
                    _within(f"logit_bias[{k}]", x, b)
                put(self, "logit_bias", pairs)
                continue
            v = _number(f.name, v, b.integer)
            _within(f.name, v, b)
            put(self, f.name, v)
        if self.temperature < FLT_MIN:
            put(self, "temperature", 0.0)    # 1/temperature would overflow float32: greedy

    @property
    def greedy(self):
        return self.temperature == 0.0

    def with_seed(self, seed):
        return dataclasses.replace(self, seed=seed)


def _number(name, v, integer=False):
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        try:
            v = int(v) if integer else float(v)
        except (TypeError, ValueError):
            raise RequestError(f"{name}={v!r}: must be a{'n integer' if integer else ' number'}",
                               param=name.split("[")[0]) from None
    if integer:
        if isinstance(v, (float, np.floating)) and not float(v).is_integer():
            raise RequestError(f"{name}={v!r}: must be an integer", param=name.split("[")[0])
        return int(v)
    return float(v)


def _within(name, v, b):
    if not (b.lo <= v <= b.hi):       # NaN fails too
        raise RequestError(f"'{name}' must be between {b.lo:g} and {b.hi:g} (got {v!r})",
                           param=name.split("[")[0])


def _mix64(z):
    """SplitMix64's finalizer: a bijection of 64-bit integers that spreads every input bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def keyed_uniform(seed, pos):
    """The uniform in [0, 1) that draws the token at position `pos` of a generation seeded with
    `seed`: a pure function of the two (a counter-based generator, SplitMix64 keyed by the
    seed), 53 random bits as a double."""
    z = _mix64((_mix64(int(seed) & MASK64) + (int(pos) & MASK64) * 0x9E3779B97F4A7C15) & MASK64)
    return (z >> 11) * (1.0 / (1 << 53))


class Sampler:
    """A request's draws: SamplingParams plus the state that changes per token (penalty
    history, seed, grammar constraint, logprob records, draws so far). end_ids: the tokens that
    end a reply, which params.min_tokens holds back."""

    def __init__(self, n_vocab, params=SamplingParams(), constraint=None, logprobs=None, end_ids=()):
        self.n_vocab = n_vocab
        self.params = params
        self.history = collections.deque(maxlen=max(params.penalty_last_n, 1))
        for k, _ in params.logit_bias:
            if not 0 <= k < n_vocab:
                raise RequestError(f"logit_bias: token id {k} out of range [0, {n_vocab})",
                                   param="logit_bias")
        self.bias_ids = np.array([k for k, _ in params.logit_bias], np.int32)
        self.bias_vals = np.array([v for _, v in params.logit_bias], np.float32)
        seed = params.seed
        if seed is None:
            seed = int.from_bytes(np.random.SeedSequence().entropy.to_bytes(16, "little")[:8],
                                  "little")
        self.seed = int(seed) & MASK64
        self.n_drawn = 0                  # draws so far: the position of a sample() without one
        self._work = None   # the compiled sampler's scratch, reused for every token
        self.constraint = constraint      # text.grammar.Constraint or None
        self.n_logprobs = logprobs        # None: not recorded; k: the top k alternatives too
        self.records = []                 # (token, logprob, [(id, logprob)] top k) per draw
        # while fewer than min_tokens were drawn: the end tokens get a -inf bias
        ends = np.array(sorted(t for t in end_ids if 0 <= t < n_vocab), np.int32)
        self._hold = None
        if params.min_tokens and len(ends):
            self._hold = (np.concatenate([self.bias_ids, ends]),
                          np.concatenate([self.bias_vals, np.full(len(ends), -np.inf, np.float32)]), ends)

    def accept(self, token):
        if self.constraint is not None:
            self.constraint.consume(token)
        if self.params.penalty_last_n:
            self.history.append(int(token))

    def accept_many(self, tokens):
        """A prompt's tokens into the penalty window; ids past the vocabulary (an image's rows,
        engine/vision.py) are no text and take no penalty, as in llama.cpp's mtmd."""
        n = self.params.penalty_last_n
        for t in tokens[-n:] if n else ():
            if t < self.n_vocab:
                self.history.append(int(t))

    def _penalties(self):
        p = self.params
        if not self.history or (p.repeat_penalty == 1.0 and p.presence_penalty == 0.0
                                and p.frequency_penalty == 0.0):
            return np.zeros(0, np.int32), np.zeros(0, np.int32)
        ids, counts = np.unique(np.fromiter(self.history, np.int32), return_counts=True)
        return ids.astype(np.int32), counts.astype(np.int32)

    def sample(self, logits, pos=None):
        """logits: float32 (n_vocab,); pos: the position of the token among those the request
        generates (0 for the first), whose keyed uniform draws it (default: the number of
        draws so far). Returns the chosen token id."""
        logits = np.ascontiguousarray(logits, dtype=np.float32)
        pen_ids, pen_counts = self._penalties()
        pos = self.n_drawn if pos is None else pos
        self.n_drawn = pos + 1
        u = 0.0 if self.params.greedy else keyed_uniform(self.seed, pos)
        mask = self.constraint.mask() if self.constraint is not None else None
        bias_ids, bias_vals = self.bias_ids, self.bias_vals
        if self._hold is not None and pos < self.params.min_tokens and \
                not _only_ends(mask, self._hold[2]):
            bias_ids, bias_vals = self._hold[:2]
        if _compiled_sample is not None:
            if self._work is None or len(self._work) < _work_bytes(len(logits)):
                self._work = np.empty(_work_bytes(len(logits)), np.uint8)
            t = int(_compiled_sample(logits, self.params, bias_ids, bias_vals, pen_ids,
                                     pen_counts, u, self._work, mask))
        else:
            t = sample_reference(logits, self.params, bias_ids, bias_vals, pen_ids,
                                 pen_counts, u, mask)
        if self.n_logprobs is not None:
            self.records.append(token_logprobs(logits, t, self.n_logprobs))
        return t

    def take_records(self):
        """The logprob records of the draws since the last call."""
        out, self.records = self.records, []
        return out


def _only_ends(mask, ends):
    """True when the grammar's mask (None: no grammar) allows no token but the end tokens: the
    structure is complete, and min_tokens must not force text past it."""
    if mask is None:
        return False
    rest = np.asarray(mask, np.uint32).copy()
    np.bitwise_and.at(rest, ends >> 5, ~(np.uint32(1) << (ends & 31).astype(np.uint32)))
    return not rest.any()


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


def sample_reference(logits, params, bias_ids, bias_vals, pen_ids, pen_counts, u, mask=None):
    """The NumPy twin of the compiled sampler; params: SamplingParams (its bias as the arrays
    bias_ids / bias_vals); u is the uniform draw in [0, 1); mask: the allowed-token bitmask
    (uint32 words, bit i % 32 of word i // 32) or None."""
    repeat_penalty, presence_penalty = params.repeat_penalty, params.presence_penalty
    frequency_penalty, temperature = params.frequency_penalty, params.temperature
    top_k, top_p, min_p = params.top_k, params.top_p, params.min_p
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
    """Finds stop strings in streamed text, holding back what could be the start of one;
    `hit` is the stop string found (the earliest in the text), None until then."""

    def __init__(self, stops):
        if isinstance(stops, str):
            stops = [stops]
        self.stops = [s for s in (stops or ()) if s]
        self.pending = ""
        self.hit = None

    def push(self, text):
        """Returns (text safe to emit, hit). On a hit the text is everything before the stop."""
        if not self.stops:
            return text, False
        self.pending += text
        hits = [(i, s) for i, s in ((self.pending.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            i, self.hit = min(hits)
            out = self.pending[:i]
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

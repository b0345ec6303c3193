"""Model (immutable, shareable) and Session (KV cache, position, RNG): the engine's Python API.

    m = Model.load(path, n_threads=None, numa="none", mmap=True, mlock=False)
    s = m.session(n_ctx=512)
    logits = s.eval(ids, logits="all")          # float32 (len(ids), n_vocab)
    for out in s.generate("Once upon a time", max_tokens=32): print(out.text, end="")

Load order: (signature check on the open descriptor) -> map -> validate every tensor against
the architecture table -> memory plan against the budget -> backend init. Nothing is
allocated before the plan fits.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from . import arch as _arch
from .backends import backend_class
from ..errors import CapacityError, ConfigError, RequestError
from ..format.gguf import GGUFFile, Key

NUMA_POLICIES = ("none", "isolate", "distribute", "numactl")
DEFAULT_N_BATCH = 512


def available_memory():
    """MemAvailable from /proc/meminfo in bytes (None when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _mib(n):
    return f"{n / 2**20:.1f} MiB"


def default_threads():
    """Physical cores in this process's allowed CPU set (SMT siblings counted once)."""
    from .threads import default_threads as physical
    return physical()


@dataclass(frozen=True)
class MemoryPlan:
    weights: int
    kv_cache: int
    scratch: int
    budget: int | None
    n_ctx: int

    @property
    def total(self):
        return self.weights + self.kv_cache + self.scratch

    def describe(self):
        b = "unlimited" if self.budget is None else _mib(self.budget)
        return (f"memory plan (n_ctx {self.n_ctx}): weights {_mib(self.weights)} + KV cache "
                f"{_mib(self.kv_cache)} + scratch {_mib(self.scratch)} = {_mib(self.total)}"
                f" (budget {b})")

    def check(self, what):
        if self.budget is not None and self.total > self.budget:
            raise CapacityError(
                f"{what} does not fit: needs {self.total} bytes ({self.describe()}); "
                f"over by {_mib(self.total - self.budget)}")


class Model:
    """A loaded, validated model. Immutable after load; create Sessions to run it."""

    def __init__(self):
        raise TypeError("use Model.load(path, ...)")

    @classmethod
    def load(cls, path, n_threads=None, numa="none", mmap=True, mlock=False, trusted_keys=None,
             require_signature=False, max_memory=None, backend=None, verbose=False, log=None,
             n_ctx_plan=None):
        """Load and validate a GGUF model.

        trusted_keys: a signing.TrustStore (or a directory of trusted public keys);
        require_signature: refuse unsigned files; max_memory: byte budget (default: available
        memory); backend: "cpu" or "reference" (default: $EDGED_BACKEND or cpu);
        verbose/log: report each tensor and the memory plan as the load proceeds;
        n_ctx_plan: also check that a session of this many tokens fits the budget.
        """
        self = object.__new__(cls)
        if numa not in NUMA_POLICIES:
            raise ConfigError(f"numa={numa!r}: expected one of {', '.join(NUMA_POLICIES)}")
        if log is None:
            log = (lambda msg: print(f"edged: {msg}", file=sys.stderr)) if verbose else None
        self._log = log
        t0 = time.perf_counter()
        self.path = os.fspath(path)
        self._verified = None
        self.signer = None
        if trusted_keys is not None or require_signature:
            from ..trust import signing
            trust = trusted_keys
            if isinstance(trust, (str, os.PathLike)):
                trust = signing.TrustStore.load(trust)
            vf = signing.open_verified(self.path, trust, require_signature)
            self._verified = vf
            self.signer = vf.signer
            try:
                # map the very descriptor that was hashed, up to the signed length
                self.file = GGUFFile.from_fd(vf.fd, name=self.path, size=vf.signed_length)
            except BaseException:
                vf.close()
                raise
            if log:
                log(f"signature: {'signed by ' + vf.signer if vf.signer else 'unsigned (allowed)'}")
        else:
            self.file = GGUFFile.open(self.path)
        try:
            self._init(n_threads, numa, mmap, mlock, max_memory, backend, n_ctx_plan)
        except BaseException:
            self._close_file()
            raise
        self.load_ms = (time.perf_counter() - t0) * 1000
        if log:
            log(f"loaded {self.path} in {self.load_ms:.0f} ms")
        return self

    def _init(self, n_threads, numa, mmap, mlock, max_memory, backend, n_ctx_plan):
        f, log = self.file, self._log
        md = f.metadata
        from ..text.tokenizer import Tokenizer
        self.tokenizer = Tokenizer.from_gguf_file(f)
        if log:
            log(f"GGUF v{f.version}, {len(f.tensors)} tensors, data at offset {f.data_offset}, "
                f"architecture {md.get(Key.ARCHITECTURE)!r}, vocabulary {self.tokenizer.n_vocab}")

        def log_tensor(t):
            tn = getattr(t.type, "name", t.type)
            log(f"  tensor {t.name:<32} {tn:<5} {str(tuple(int(x) for x in t.shape)):<14} "
                f"{t.nbytes:>10} bytes at offset {t.offset}")

        self.spec = _arch.validate(md, f.tensors, self.tokenizer.n_vocab,
                                   log=log_tensor if log else None)
        self.hp = self.spec.hp
        self.arch = self.spec.arch.name
        self.n_threads = int(n_threads) if n_threads else default_threads()
        if self.n_threads < 1:
            raise ConfigError(f"n_threads={n_threads}: must be >= 1")
        self.numa = numa
        self.budget = int(max_memory) if max_memory else available_memory()
        self.weights_bytes = sum(t.nbytes for t in self.spec.tensors.values())

        cls = backend_class(backend)
        # weights are checked before the backend copies/dequantizes anything
        n_ctx = n_ctx_plan or 0
        plan = self._plan(cls, n_ctx)
        if log:
            log(plan.describe())
        plan.check(f"model {os.path.basename(self.path)}")

        weights = {}
        for name in self.spec.tensors:
            w = f.tensor_bytes(name)
            if not mmap:
                w = np.array(w)  # private copy; the mapping is then only touched once
            weights[name] = w
        self.mmap, self.mlock = mmap, mlock
        if mlock:
            self._mlock()
        self.backend = cls(self.spec, weights, n_threads=self.n_threads, numa=numa)
        self.backend_name = self.backend.name
        self.memory_plan = plan

    def _plan(self, cls, n_ctx):
        b = cls.plan_for(self.spec, n_ctx, min(DEFAULT_N_BATCH, max(n_ctx, 1))) if n_ctx else None
        return MemoryPlan(weights=self.weights_bytes + cls.extra_weight_bytes(self.spec),
                          kv_cache=b.kv_cache if b else 0, scratch=b.scratch if b else 0,
                          budget=self.budget, n_ctx=n_ctx)

    def _mlock(self):
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        MCL_CURRENT, MCL_FUTURE = 1, 2
        if libc.mlockall(MCL_CURRENT | MCL_FUTURE) != 0:
            err = ctypes.get_errno()
            raise CapacityError(f"mlock failed: {os.strerror(err)} (raise RLIMIT_MEMLOCK / "
                                "LimitMEMLOCK= or drop --mlock)")

    # --- public API ------------------------------------------------------------------------
    @property
    def n_vocab(self):
        return self.hp.n_vocab

    @property
    def n_ctx_train(self):
        return self.hp.n_ctx_train

    def session(self, n_ctx=512, n_batch=DEFAULT_N_BATCH):
        return Session(self, n_ctx, n_batch)

    def decode_batch(self, sessions, tokens):
        """One decode step of several sessions in one forward pass: token i is appended to
        sessions[i] and evaluated at that session's own position against its own KV cache
        (the matrix products are shared across rows). Same effect as sessions[i].eval([t])
        for each i; returns float32 (n, n_vocab), row i = sessions[i]'s next-token logits."""
        sessions, tokens = list(sessions), [int(t) for t in tokens]
        if not sessions or len(sessions) != len(tokens):
            raise RequestError(f"decode_batch: {len(sessions)} sessions for {len(tokens)} tokens")
        if len({id(s) for s in sessions}) != len(sessions):
            raise RequestError("decode_batch: a session appears twice")
        nv = self.hp.n_vocab
        for s, t in zip(sessions, tokens):
            if s.model is not self or s._buf is None:
                raise RequestError("decode_batch: a session of another (or a closed) model")
            if not 0 <= t < nv:
                raise RequestError(f"token id {t} out of range [0, {nv})")
            if s.n_past + 1 > s.n_ctx:
                raise RequestError(f"{s.n_past + 1} tokens do not fit the context (n_ctx {s.n_ctx})")
        t0 = time.perf_counter()
        logits = self.backend.decode_rows([s._buf for s in sessions], tokens,
                                          [s.n_past for s in sessions])
        ms = (time.perf_counter() - t0) * 1000 / len(sessions)
        for s, t in zip(sessions, tokens):
            s._ahead = None
            s.tokens.append(t)
            s.t_eval_ms += ms
            s.n_eval += 1
        return logits

    def decode_ahead(self, sessions, tokens):
        """decode_batch for sessions whose own code (a running generate()) is about to call
        eval([token]): each such next call returns the logits computed here instead of
        running the model again. Any other call on the session discards them."""
        logits = self.decode_batch(sessions, tokens)
        for i, (s, t) in enumerate(zip(sessions, tokens)):
            s.tokens.pop()
            s._ahead = (t, s.n_past, logits[i:i + 1])

    def plan(self, n_ctx, n_batch=DEFAULT_N_BATCH):
        """The MemoryPlan a session of n_ctx tokens needs (weights + KV cache + scratch)."""
        return self._plan(type(self.backend), n_ctx)

    def chat_prompt(self, messages, add_generation_prompt=True, template_file=None,
                    template_name=None, **extra):
        """Render `messages` with the model's chat template (or the named variant
        `tokenizer.chat_template.NAME`), or with an operator's template file, which takes
        precedence. A model with neither raises TemplateError; plain completion still works."""
        from ..text.chat import render, template_for
        tmpl = template_for(self.file, name=template_name, template_file=template_file)
        return render(tmpl, messages, add_generation_prompt=add_generation_prompt,
                      bos_token=self.tokenizer.token_piece(self.tokenizer.bos_id).decode(
                          "utf-8", "replace") if self.tokenizer.bos_id is not None else "",
                      eos_token=self.tokenizer.token_piece(self.tokenizer.eos_id).decode(
                          "utf-8", "replace") if self.tokenizer.eos_id is not None else "",
                      **extra)

    def _close_file(self):
        f, self.file = getattr(self, "file", None), None
        if f is not None:
            f.close()
        vf, self._verified = getattr(self, "_verified", None), None
        if vf is not None:
            vf.close()

    def close(self):
        be = getattr(self, "backend", None)
        if be is not None:
            be.close()
            self.backend = None
        self._close_file()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"<Model {os.path.basename(self.path)} {self.arch} n_embd={self.hp.n_embd} "
                f"n_layer={self.hp.n_layer} backend={self.backend_name}>")


@dataclass(frozen=True)
class GenerationOutput:
    """One step of Session.generate: the new text (complete UTF-8 only), the token id, and the
    finish reason ("stop", "length") on the last item, else None."""
    text: str
    token: int | None
    finish_reason: str | None = None


class Session:
    """Mutable state of one conversation: KV cache, the tokens in it, sampler RNG."""

    def __init__(self, model, n_ctx=512, n_batch=DEFAULT_N_BATCH):
        if model.backend is None:
            raise RequestError("model is closed")
        n_ctx = int(n_ctx)
        if n_ctx < 1:
            raise ConfigError(f"n_ctx={n_ctx}: must be >= 1")
        self.model = model
        self.n_ctx = n_ctx
        self.n_batch = max(1, min(int(n_batch), n_ctx))
        be = model.backend
        bp = be.plan(n_ctx, self.n_batch)
        plan = MemoryPlan(model.memory_plan.weights, bp.kv_cache, bp.scratch, model.budget, n_ctx)
        if model._log:
            model._log(plan.describe())
        plan.check(f"a session of n_ctx {n_ctx}")
        self.memory_plan = plan
        self._buf = be.alloc(n_ctx, self.n_batch)
        self.tokens: list[int] = []
        self._ahead = None  # (token, position, logits) from Model.decode_ahead
        self.t_eval_ms = 0.0
        self.n_eval = 0

    @property
    def n_past(self):
        return len(self.tokens)

    def reset(self):
        self._ahead = None
        self.tokens = []

    def truncate(self, n):
        """Forget everything after the first n tokens (the cache beyond is overwritten)."""
        self._ahead = None
        del self.tokens[n:]

    def eval(self, ids, logits="last"):
        """Append ids to the context and run them. logits: "last" -> (1, n_vocab) float32,
        "all" -> (len(ids), n_vocab)."""
        ids = [int(t) for t in ids]
        ahead, self._ahead = self._ahead, None
        if ahead is not None and logits == "last" and len(ids) == 1 and \
                (ids[0], self.n_past) == ahead[:2]:
            self.tokens.append(ids[0])   # evaluated by Model.decode_ahead in a batch
            return ahead[2]
        if not ids:
            raise RequestError("eval: no tokens")
        if logits not in ("last", "all"):
            raise RequestError(f"eval: logits={logits!r}, expected 'last' or 'all'")
        nv = self.model.hp.n_vocab
        bad = [t for t in ids if not 0 <= t < nv]
        if bad:
            raise RequestError(f"token id {bad[0]} out of range [0, {nv})")
        if self.n_past + len(ids) > self.n_ctx:
            raise RequestError(f"{self.n_past + len(ids)} tokens do not fit the context "
                               f"(n_ctx {self.n_ctx}, {self.n_past} already in it)")
        be, buf = self.model.backend, self._buf
        t0 = time.perf_counter()
        rows = []
        want_all = logits == "all"
        step = min(self.n_batch, be.max_logit_rows(buf)) if want_all else self.n_batch
        for i in range(0, len(ids), step):
            chunk = ids[i:i + step]
            last = i + step >= len(ids)
            be.copy_in(buf, chunk, self.n_past)
            be.forward(buf, len(chunk), self.n_past, want_all)
            self.tokens.extend(chunk)
            if want_all:
                rows.append(be.copy_out(buf, len(chunk)))
            elif last:
                rows.append(be.copy_out(buf, 1))
        self.t_eval_ms += (time.perf_counter() - t0) * 1000
        self.n_eval += len(ids)
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def copy_from(self, other, n_tokens=None):
        """Take the first n_tokens (default: all) of another session of the same model: its
        tokens and KV cache, copied (so both go on independently, e.g. n choices of one prompt)."""
        n = other.n_past if n_tokens is None else int(n_tokens)
        if other.model is not self.model or other._buf is None or self._buf is None:
            raise RequestError("copy_from: a session of another (or a closed) model")
        if not 0 <= n <= other.n_past or n > self.n_ctx:
            raise RequestError(f"copy_from: {n} tokens (source has {other.n_past}, n_ctx {self.n_ctx})")
        self.model.backend.copy_cache(other._buf, self._buf, n)
        self._ahead = None
        self.tokens = list(other.tokens[:n])

    def prefill(self, ids):
        """Evaluate ids reusing the longest cached prefix; returns the last position's logits
        (1, n_vocab) and the number of tokens actually evaluated."""
        ids = [int(t) for t in ids]
        if not ids:
            raise RequestError("empty prompt")
        if len(ids) > self.n_ctx:
            raise RequestError(f"prompt of {len(ids)} tokens is longer than the context "
                               f"(n_ctx {self.n_ctx})")
        common = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # always evaluate at least one token for logits
        self.truncate(common)
        return self.eval(ids[common:]), len(ids) - common

    def generate(self, prompt, max_tokens=128, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                 seed=None, stop=(), repeat_penalty=1.0, presence_penalty=0.0,
                 frequency_penalty=0.0, penalty_last_n=64, logit_bias=None, add_special=True,
                 parse_special=False, stats=None, sampler=None):
        """Yield GenerationOutput items; the last one carries finish_reason.

        prompt: text (tokenized with add_special/parse_special) or a list of token ids.
        stop: strings that end generation (they may span tokens; the text before them is
        emitted, the stop string is not). stats: optional dict filled with timings.
        sampler: a text.sampling.Sampler to draw with (structured output, logprobs) instead of
        one made from the sampling arguments.
        """
        from ..text.sampling import Sampler, StopMatcher
        tok = self.model.tokenizer
        ids = tok.encode(prompt, add_special=add_special, parse_special=parse_special) \
            if isinstance(prompt, str) else [int(t) for t in prompt]
        if max_tokens is not None and max_tokens < 0:
            raise RequestError(f"max_tokens={max_tokens}: must be >= 0")
        sampler = sampler or Sampler(self.model.hp.n_vocab, temperature=temperature, top_k=top_k,
                          top_p=top_p, min_p=min_p, seed=seed, repeat_penalty=repeat_penalty,
                          presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                          penalty_last_n=penalty_last_n, logit_bias=logit_bias)
        t0 = time.perf_counter()
        logits, n_evaluated = self.prefill(ids)
        t1 = time.perf_counter()
        if stats is not None:
            stats.update(n_prompt=len(ids), n_prompt_eval=n_evaluated,
                         prompt_ms=(t1 - t0) * 1000, n_gen=0, gen_ms=0.0, sample_ms=0.0)
        sampler.accept_many(ids)
        decoder = tok.stream_decoder()
        stopper = StopMatcher(stop)
        eog = tok.eog_ids
        n_gen = 0
        t_sample = 0.0
        finish = None
        while True:
            if max_tokens is not None and n_gen >= max_tokens:
                finish = "length"
                break
            ts = time.perf_counter()
            t = sampler.sample(logits[-1])
            t_sample += time.perf_counter() - ts
            n_gen += 1
            if t in eog:
                finish = "stop"
                break
            sampler.accept(t)
            text, hit = stopper.push(decoder.push(t))
            if hit:  # text before the stop string; the sampled token is not evaluated
                self._stats(stats, t1, n_gen, t_sample)
                yield GenerationOutput(text, t, "stop")
                return
            if (max_tokens is not None and n_gen >= max_tokens) or self.n_past >= self.n_ctx:
                # the last token asked for, or no room left in the context to evaluate it
                self._stats(stats, t1, n_gen, t_sample)
                yield GenerationOutput(text + stopper.flush(decoder.flush()), t, "length")
                return
            yield GenerationOutput(text, t, None)
            logits = self.eval([t])
        self._stats(stats, t1, n_gen, t_sample)
        yield GenerationOutput(stopper.flush(decoder.flush()), t if finish == "stop" else None,
                               finish)

    def _stats(self, stats, t1, n_gen, t_sample):
        if stats is not None:
            stats.update(n_gen=n_gen, gen_ms=(time.perf_counter() - t1) * 1000,
                         sample_ms=t_sample * 1000)

    def close(self):
        if self._buf is not None:
            self.model.backend.free(self._buf)
            self._buf = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

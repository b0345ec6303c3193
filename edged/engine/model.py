"""Model (immutable, shareable) and Session (KV cache, position, RNG): the engine's Python API.

    m = Model.load(path, n_threads=None, numa="none", mmap=True, mlock=False,
                   cache_type_k="f16", cache_type_v="f16")
    s = m.session(n_ctx=512)
    logits = s.eval(ids, logits="all")          # float32 (len(ids), n_vocab)
    for out in s.generate("Once upon a time", max_tokens=32): print(out.text, end="")
    m.decode([BatchEntry(s1, prompt_chunk, logits=None), BatchEntry(s2, [tok])])  # the step API
    vecs = m.embed(["a sentence", "another"])   # float32 (2, n_embd), pooled, L2-normalised

A BERT-family encoder file (`bert`, `nomic-bert`: engine/encoder.py) loads as a Model that
only embeds; a decoder embeds through its final hidden states (embed()).

Sessions own their KV cache (and, once start() began a Generation, its sampler state); a
Model is shared. Model.decode is the one call that runs the model: Session.eval and
Session.generate are thin loops over it, the daemon's scheduler fills it with the work of
all its slots (docs/engine.md).

Load order: map (the descriptor the trust layer verified, `Model.load(path, verified=...)`, or
the path as is) -> validate every tensor against the architecture table -> memory plan against
the budget -> backend init. Nothing is allocated before the plan fits. The engine never checks
signatures itself: edged/trust sits above it (docs/architecture.md).
"""
from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

from . import arch as _arch
from . import encoder as _encoder
from . import rank as _rank
from .backends import backend_class
from .batch import LOGITS, BatchEntry
from .kvcache import CacheTypes
from .speculative import Speculation
from .generation import Generation, GenerationOutput  # noqa: F401 - GenerationOutput: the public API
from ..errors import CapacityError, ConfigError, RequestError
from ..format.gguf import GGUFFile, Key
from ..system import available_memory, default_threads
from ..text.sampling import SamplingParams
from ..text.tokenizer import Tokenizer

NUMA_POLICIES = ("none", "isolate", "distribute", "numactl")
DEFAULT_N_BATCH = 512
EMBED_BATCH_TOKENS = 8192   # an encoder pass takes inputs up to this many tokens together

# One forward pass at a time per process (Model.decode; Session.fork's copy): every model's
# pool has a worker per core, sessions of one model may live in several threads (the daemon).
_COMPUTE = threading.Lock()


def _mib(n):
    return f"{n / 2**20:.1f} MiB"


@dataclass(frozen=True)
class MemoryPlan:
    weights: int
    kv_cache: int
    scratch: int
    budget: int | None
    n_ctx: int
    paged: int = 0    # mapped expert weights a token does not read: may stay in the page cache
    kv_types: str = "f16/f16"  # the KV cache's K/V storage types (kvcache.CacheTypes)

    @property
    def total(self):
        return self.weights + self.kv_cache + self.scratch

    def describe(self):
        b = "unlimited" if self.budget is None else _mib(self.budget)
        paged = f", of which {_mib(self.paged)} unrouted experts may page" if self.paged else ""
        return (f"memory plan (n_ctx {self.n_ctx}): weights {_mib(self.weights)} + KV cache "
                f"({self.kv_types}) {_mib(self.kv_cache)} + scratch {_mib(self.scratch)} = {_mib(self.total)}"
                f"{paged} (budget {b})")

    def fits(self):
        # a MoE model's mapped experts beyond one token's share degrade through the page cache
        # (slower when the routing moves) instead of refusing the load
        return self.budget is None or self.total - self.paged <= self.budget

    def check(self, what):
        if not self.fits():
            raise CapacityError(
                f"{what} does not fit: needs {self.total} bytes ({self.describe()}); "
                f"over by {_mib(self.total - self.budget)}")


class Model:
    """A loaded, validated model. Immutable after load; create Sessions to run it."""

    def __init__(self):
        raise TypeError("use Model.load(path, ...)")

    @classmethod
    def load(cls, path, n_threads=None, numa="none", mmap=True, mlock=False, verified=None,
             max_memory=None, backend=None, verbose=False, log=None, n_ctx_plan=None,
             cache_type_k=None, cache_type_v=None):
        """Load and validate a GGUF model.

        verified: the model opened by the trust layer (edged.trust.verify.open_verified(path,
        trust, require_signature), which checks the signature): its very descriptor is mapped,
        up to the signed length, and the model owns it from here (closed with the model, or
        when the load fails); None: `path` is opened as is, nothing checked.
        max_memory: byte budget (default: available memory); backend: "cpu" or "reference"
        (default: $EDGED_BACKEND or cpu); verbose/log: report each tensor and the memory plan
        as the load proceeds; n_ctx_plan: also check that a session of this many tokens fits
        the budget; cache_type_k / cache_type_v: the KV cache's storage, "f16" (default),
        "q8_0" or "q4_0" (llama.cpp's -ctk/-ctv; every session of the model uses them;
        kvcache.py).
        """
        self = object.__new__(cls)
        self._verified, self.file, self.signer = verified, None, None  # closed if the load fails
        if log is None:
            log = (lambda msg: print(f"edged: {msg}", file=sys.stderr)) if verbose else None
        self._log = log
        t0 = time.perf_counter()
        try:
            self.path = os.fspath(path)
            self.cache = CacheTypes.parse(cache_type_k, cache_type_v)
            if numa not in NUMA_POLICIES:
                raise ConfigError(f"numa={numa!r}: expected one of {', '.join(NUMA_POLICIES)}")
            if verified is None:
                self.file = GGUFFile.open(self.path)
            else:
                if os.fspath(verified.path) != self.path:
                    raise ConfigError(f"Model.load({self.path!r}, verified=...): the verified "
                                      f"file is {verified.path!r}")
                self.signer = verified.signer
                # map the very descriptor that was hashed, up to the signed length
                self.file = GGUFFile.from_fd(verified.fd, name=self.path, size=verified.signed_length)
                if log:
                    log(f"signature: {'signed by ' + self.signer if self.signer else 'unsigned (allowed)'}")
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
        self.tokenizer = Tokenizer.from_gguf_file(f)
        if log:
            log(f"GGUF v{f.version}, {len(f.tensors)} tensors, data at offset {f.data_offset}, "
                f"architecture {md.get(Key.ARCHITECTURE)!r}, vocabulary {self.tokenizer.n_vocab}")
        self.encoder = None
        if md.get(Key.ARCHITECTURE) in _encoder.ENCODERS:
            return self._init_encoder(n_threads, mmap, max_memory, backend)
        # llama-server: the file's pooling type, none when it has none
        self.pooling = _encoder.pooling_of(md, md.get(Key.ARCHITECTURE, ""))

        def log_tensor(t):
            tn = getattr(t.type, "name", t.type)
            log(f"  tensor {t.name:<32} {tn:<5} {str(tuple(int(x) for x in t.shape)):<14} "
                f"{t.nbytes:>10} bytes at offset {t.offset}")

        self.spec = _arch.validate(md, f.tensors, self.tokenizer.n_vocab,
                                   log=log_tensor if log else None)
        self.hp = self.spec.hp
        self.arch = self.spec.arch.name
        self.rank_head = _rank.load(f, self.arch, self.hp.n_embd, causal=True)
        self.cache.check(self.hp.head_dim)  # before any memory is planned or taken
        self.n_threads = int(n_threads) if n_threads else default_threads()
        if self.n_threads < 1:
            raise ConfigError(f"n_threads={n_threads}: must be >= 1")
        self.numa = numa
        self.budget = int(max_memory) if max_memory else available_memory()
        self.weights_bytes = sum(t.nbytes for t in self.spec.tensors.values())
        self.active_weights_bytes = self.spec.active_weight_bytes()
        # expert rows a token does not read, when they stay mapped from the file (not copied,
        # not locked, not expanded by the backend)
        experts = sum(t.nbytes for n, t in self.spec.tensors.items() if n.endswith("_exps.weight"))
        self._paged = 0
        cls = backend_class(backend)
        n_ctx = n_ctx_plan or 0
        k, X = self.hp.n_expert_used, self.hp.n_expert
        resident = False  # experts held in the backend's own layout (x86: R4), every one resident
        if experts and not cls.extra_weight_bytes(self.spec):
            rep = cls.expert_repack_bytes(self.spec)
            if not mmap:
                resident = rep > 0  # private copies: repacked in place, no memory added
                if log and resident:
                    log(f"experts: {rep} bytes repacked in place")
            elif not mlock:
                def unrouted(mapped):  # mapped expert bytes one token does not read
                    return mapped - mapped * k // X
                self._paged = unrouted(experts)
                if rep:  # repacked only where the whole model then fits with a session of
                    # the planned context (none planned: 4096 tokens, or the trained context if
                    # shorter), so that sessions are not refused for it; else they page
                    resident = self._plan(cls, n_ctx or min(self.hp.n_ctx_train, 4096),
                                          paged=unrouted(experts - rep)).fits()
                    if resident:
                        self._paged = unrouted(experts - rep)
                    if log:
                        log(f"experts: {rep} bytes repacked, every expert resident" if resident else
                            f"experts: stay mapped and page in as routed (repacked, all {rep} bytes "
                            "would not fit the budget)")
        # weights are checked before the backend copies/dequantizes anything
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
        self.backend = cls(self.spec, weights, n_threads=self.n_threads, numa=numa,
                           cache=self.cache, resident_experts=resident)
        self.backend_name = self.backend.name
        self.memory_plan = plan

    def _init_encoder(self, n_threads, mmap, max_memory, backend):
        """An encoder: validated like a decoder, run by engine/encoder.py (no KV cache, no
        sessions: embed() only)."""
        f, log = self.file, self._log
        self.spec = _encoder.validate(f.metadata, f.tensors, self.tokenizer.n_vocab,
                                      log=(lambda t: log(f"  tensor {t.name}")) if log else None)
        self.hp = self.spec.hp
        self.arch = self.spec.arch.name
        self.pooling = self.hp.pooling
        self.rank_head = _rank.load(f, self.arch, self.hp.n_embd, causal=False)
        self.n_threads = int(n_threads) if n_threads else default_threads()
        if self.n_threads < 1:
            raise ConfigError(f"n_threads={n_threads}: must be >= 1")
        self.numa = "none"
        self.budget = int(max_memory) if max_memory else available_memory()
        used = {n for n in self.spec.tensors.values() if n}
        self.weights_bytes = self.active_weights_bytes = sum(
            f.tensors[n].nbytes for n in used)
        self._paged = 0
        plan = MemoryPlan(weights=self.weights_bytes, kv_cache=0, scratch=0,
                          budget=self.budget, n_ctx=0)
        if log:
            log(plan.describe())
        plan.check(f"model {os.path.basename(self.path)}")
        weights = {n: f.tensor_bytes(n) if mmap else np.array(f.tensor_bytes(n)) for n in used}
        self.mmap, self.mlock = mmap, False
        cls = backend_class(backend)   # no backend object: its name picks NumPy or the core
        if cls.name == "reference":
            core = pool = None
        else:
            from .cpu import _require_core
            core = _require_core()
            pool = core.Pool(self.n_threads)
        self.encoder = _encoder.Encoder.build(self.spec, f.tensors, weights, core, pool)
        self.backend = None
        self.backend_name = cls.name
        self.memory_plan = plan

    def _plan(self, cls, n_ctx, paged=None):  # paged: instead of self._paged (a trial)
        b = cls.plan_for(self.spec, n_ctx, min(DEFAULT_N_BATCH, max(n_ctx, 1)),
                         self.cache) if n_ctx else None
        return MemoryPlan(weights=self.weights_bytes + cls.extra_weight_bytes(self.spec),
                          kv_cache=b.kv_cache if b else 0, scratch=b.scratch if b else 0,
                          budget=self.budget, n_ctx=n_ctx, paged=self._paged if paged is None else paged,
                          kv_types=str(self.cache))

    def _mlock(self):
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

    def require_decoder(self):
        """RequestError unless this model can generate (an encoder only embeds)."""
        if self.encoder is not None:
            raise RequestError(f"model {os.path.basename(self.path)} is a {self.arch} encoder: "
                               "it only embeds (Model.embed, /v1/embeddings), it cannot generate")

    @property
    def embed_limit(self):
        """Most tokens one input to embed() may have: an encoder's trained context (its
        position table), a decoder's trained context capped at 8192."""
        return self.hp.n_ctx_train if self.encoder else min(self.hp.n_ctx_train, 8192)

    def tokenize_inputs(self, inputs, add_special=True, limit=None):
        """Texts, token-id lists or (query, document) pairs (rerank_ids) -> token-id lists,
        each checked against embed_limit (and `limit` when given: the daemon's ctx_size)."""
        if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        out = []
        for i, x in enumerate(inputs):
            what = f"document {i} with the query" if isinstance(x, tuple) else f"input {i}"
            ids = self.tokenizer.encode(x, add_special=add_special) if isinstance(x, str) \
                else self.rerank_ids(*x) if isinstance(x, tuple) else [int(t) for t in x]
            if not ids:
                raise RequestError(f"{what} is empty")
            most = self.embed_limit if limit is None else min(limit, self.embed_limit)
            if len(ids) > most:
                raise RequestError(f"{what} has {len(ids)} tokens, more than the limit of "
                                   f"{most} (the model's{'' if limit is None else ' and ctx_size'})")
            bad = [(j, t) for j, t in enumerate(ids) if not 0 <= t < self.n_vocab]
            if bad:     # e.g. tiktoken's cl100k ids, which a client sent for a model of its own
                j, t = bad[0]
                raise RequestError(f"{what}, token {j}: id {t} out of range: the model's "
                                   f"vocabulary is [0, {self.n_vocab})", param="input")
            out.append(ids)
        return out

    def embed(self, inputs, pooling=None, normalize=True, add_special=True, token_types=None):
        """Embeddings of texts (or token-id lists), as llama.cpp's llama_get_embeddings_seq:
        the final hidden states pooled over each input ("mean", "cls": the first token,
        "last"; "none": every token's row) and L2-normalised when `normalize`.

        pooling: default the file's `<arch>.pooling_type` (llama-server's rule; a file without
        one gives every token's row, as llama.cpp's pooling none). Returns float32 (n_inputs, n_embd), or with
        pooling "none" a list of (n_tokens, n_embd) arrays. An encoder runs all inputs in one
        pass (in groups of at most `EMBED_BATCH_TOKENS` tokens); a decoder runs them one by
        one through a session (causal attention, as llama.cpp does for it). token_types: an
        encoder's per-token type ids for each input (a pair's from Tokenizer.encode_pair); by
        default type 0 for every token, as llama.cpp."""
        pooling = pooling or self.pooling
        if pooling == "rank":
            raise RequestError(f"model {os.path.basename(self.path)} is a reranker (pooling "
                               "type rank): rank with Model.rerank, or ask for a pooling")
        steps = self.embed_steps(self.tokenize_inputs(inputs, add_special), pooling, normalize,
                                 token_types=token_types)
        for _ in steps:
            pass
        return steps.result

    def embed_steps(self, seqs, pooling, normalize=True, unit_tokens=EMBED_BATCH_TOKENS,
                    token_types=None):
        """embed() of token-id lists (tokenize_inputs) as steps someone else drives: iterate it,
        each step one unit of compute under the engine's lock (an encoder pass over inputs of
        at most `unit_tokens` tokens together, or at least one whole input; a decoder's chunk of
        at most `unit_tokens` tokens), then `.result`. The daemon's decode thread takes one step
        at a time between its generation passes (service/scheduler.py); close() it to stop
        early."""
        if pooling == "rank" and self.rank_head is None:
            raise RequestError(f"model {os.path.basename(self.path)} has no classification "
                               "head (cls / cls.output tensors): it is not a reranker")
        if pooling not in _encoder.POOLING_NAMES + ("rank",):
            raise RequestError(f"pooling {pooling!r}: expected one of "
                               f"{', '.join(_encoder.POOLING_NAMES)}")
        if token_types is not None and (self.encoder is None or len(token_types) != len(seqs)):
            raise RequestError("token_types: one list per input, for an encoder model only")
        return EmbedSteps(self, seqs, pooling, normalize, unit_tokens, token_types)

    def rerank(self, query, documents):
        """Relevance scores of `documents` (texts) for `query`, as llama-server's /rerank
        gives them: float32 (n_documents,), in the documents' order; each pair laid out by
        rerank_ids and scored by the model's classification head (engine/rank.py: a BERT
        cross-encoder's raw logit, a Qwen3-Reranker's P(yes))."""
        if not documents:
            raise RequestError("rerank: no documents")
        seqs = self.tokenize_inputs([(query, d) for d in documents])
        steps = self.embed_steps(seqs, "rank")
        for _ in steps:
            pass
        return steps.result[:, 0].copy()

    @property
    def rerank_template(self):
        """The file's `tokenizer.chat_template.rerank` (llama-server fills in {query} and
        {document}), or None."""
        t = self.file.metadata.get(Key.CHAT_TEMPLATE_N.format(name="rerank"))
        return t if isinstance(t, str) else None

    def rerank_ids(self, query, document):
        """The token ids of a (query, document) pair as llama-server ranks it
        (format_prompt_rerank, tools/server/server-common.cpp): the rerank template with the
        two texts filled in, its own control tokens parsed (those spelled in the texts stay
        plain text: Tokenizer.defuse), no BOS/EOS added; without a template the pair as
        Tokenizer.encode_pair lays it out ([CLS] query [SEP] document [SEP] for BERT)."""
        tok = self.tokenizer
        tmpl = self.rerank_template
        if tmpl is None:
            return tok.encode_pair(query, document)[0]
        fill = {"{query}": tok.defuse(query), "{document}": tok.defuse(document)}
        text = re.sub(r"\{query\}|\{document\}", lambda m: fill[m.group()], tmpl)
        return tok.encode(text, add_special=False, parse_special=True, marked=True)

    def _hidden_states(self, seqs, unit_tokens, types=None):
        """Yields None after each unit of compute, then the (len(seq), n_embd) float32 final
        hidden states of each token-id list (with its token types, for an encoder), a list."""
        if self.encoder is not None:
            out, group, n = [], [], 0
            for i, ids in enumerate(seqs):
                if group and n + len(ids) > unit_tokens:
                    with _COMPUTE:
                        out += self.encoder.hidden(group, types and types[i - len(group):i])
                    yield None
                    group, n = [], 0
                group.append(ids)
                n += len(ids)
            with _COMPUTE:
                out += self.encoder.hidden(group, types and types[len(seqs) - len(group):])
            yield out
            return
        out = []
        longest = max(len(s) for s in seqs)
        with self.session(n_ctx=longest, n_batch=max(1, min(DEFAULT_N_BATCH, longest, unit_tokens))) as s:
            be = self.backend
            for ids in seqs:
                rows = []
                with _COMPUTE:
                    s.reset()
                for i in range(0, len(ids), s.n_batch):
                    chunk = ids[i:i + s.n_batch]
                    with _COMPUTE:
                        be.copy_in(s._buf, chunk, i)
                        be.forward(s._buf, len(chunk), i, False, all_rows=True)
                        rows.append(be.hidden_rows(s._buf, len(chunk)))
                    yield None
                out.append(np.concatenate(rows))
        yield out

    def decode(self, entries):
        """The step API: evaluate a batch of BatchEntry (session, tokens, pos, logits) in one
        call, as llama.cpp's llama_decode(batch): prompt chunks of some sessions and single
        decode tokens of others, mixed. Returns one item per entry: float32 logits as the
        entry asked ("last" -> (1, n_vocab), "all" -> (len(tokens), n_vocab)) or None.

        Every entry is checked before anything runs (a refused call changes no session). The
        entries of several sessions go through one forward pass, the single tokens of sessions
        that decode and the prompt chunks of others alike (the matrix products read the weights
        once for all rows; attention runs per row against the row's own KV cache). Every row is
        computed in one canonical order (docs/engine.md, "Reproducibility"), so its logits are
        the bits of the same token evaluated alone. A batch that does not fit one pass (more
        rows than the largest session's n_batch, more logit rows than it keeps) runs the
        single tokens together and each other entry as its session's own batches.

        The one lock of the engine: one forward pass at a time per process. Each model's
        thread pool has a worker per core, so two passes at once would only fight over them
        (and a pool runs one task at a time)."""
        runs = [self._check(e) for e in entries]
        if not runs:
            raise RequestError("decode: an empty batch")
        if len({id(r[0]) for r in runs}) != len(runs):
            raise RequestError("decode: a session appears twice in the batch")
        out = [None] * len(runs)
        with _COMPUTE:
            if self.backend is None:
                raise RequestError("model is closed")
            for s, ids, pos, _ in runs:
                if pos < s.n_past:
                    s.truncate(pos)         # forget the cache from pos on
                s._sync_recurrent()
            imaged = {i for i, r in enumerate(runs) if max(r[1]) >= self.hp.n_vocab}
            if len(runs) > 1 and not imaged and self._one_pass(runs):
                return self._decode_rows(runs)
            # image rows run as their session's own batches (a non-causal span needs them)
            singles = [i for i, r in enumerate(runs) if len(r[1]) == 1 and i not in imaged]
            if len(singles) > 1:
                for i, o in zip(singles, self._decode_rows([runs[i] for i in singles])):
                    out[i] = o
            singles = set(singles) if len(singles) > 1 else set()
            for i, (s, ids, _, logits) in enumerate(runs):
                if i not in singles:
                    out[i] = s._run(ids, logits)
        return out

    def _check(self, e):
        """(session, ids, pos, logits) of a BatchEntry, or RequestError naming what is wrong."""
        s, ids = e.session, list(e.tokens)
        if not isinstance(s, Session) or s.model is not self or s._buf is None:
            raise RequestError("decode: a session of another (or a closed) model")
        if not ids:
            raise RequestError("decode: an entry without tokens")
        if e.logits not in LOGITS:
            raise RequestError(f"decode: logits={e.logits!r}, expected 'last', 'all' or None")
        nv = self.hp.n_vocab
        bad = [t for t in ids if not 0 <= t < nv]
        if bad and (bad[0] < 0 or s.images is None or s.images.unknown(ids) is not None):
            raise RequestError(f"token id {bad[0] if bad[0] < 0 or s.images is None else s.images.unknown(ids)} "
                               f"out of range [0, {nv}) and not an image row this session holds")
        if bad and any(b - a > s.n_batch for a, b in s.images.spans(ids)):
            raise RequestError(f"an image of more rows than n_batch ({s.n_batch}) cannot be "
                               "decoded in one batch")
        pos = s.n_past if e.pos is None else int(e.pos)
        if not 0 <= pos <= s.n_past:
            raise RequestError(f"decode: position {pos} outside [0, {s.n_past}] (the tokens in "
                               "the session's cache)")
        if pos + len(ids) > s.n_ctx:
            raise RequestError(f"{pos + len(ids)} tokens do not fit the context "
                               f"(n_ctx {s.n_ctx}, {pos} already in it)")
        return s, ids, pos, e.logits

    @staticmethod
    def _logit_rows(ids, logits):
        return len(ids) if logits == "all" else 1 if logits else 0

    def _one_pass(self, runs):
        """Whether the entries fit one pass: their rows in the scratch of the session with the
        longest context (the backend lends it to the batch), their logit rows in its buffer."""
        lead = max((r[0] for r in runs), key=lambda s: (s.n_ctx, s.n_batch))
        if self.hp.n_recr_layers and any(len(r[1]) > 1 for r in runs):
            return False    # a recurrent model's prompt chunks run as their session's batches
        return (sum(len(r[1]) for r in runs) <= lead.n_batch
                and sum(self._logit_rows(r[1], r[3]) for r in runs)
                <= self.backend.max_logit_rows(lead._buf)
                and all(r[2] + len(r[1]) <= lead.n_ctx for r in runs))

    def _decode_rows(self, runs):
        """The entries' tokens as the rows of one pass (each at its session's position);
        one item per entry: its logits as asked, or None."""
        bufs, tokens, positions, out_rows = [], [], [], []
        for s, ids, pos, logits in runs:
            bufs += [s._buf] * len(ids)
            tokens += ids
            positions += range(pos, pos + len(ids))
            out_rows += range(len(tokens) - self._logit_rows(ids, logits), len(tokens))
        t0 = time.perf_counter()
        logits = self.backend.decode_rows(bufs, tokens, positions, out_rows)
        ms = (time.perf_counter() - t0) * 1000 / len(tokens)
        out, k = [], 0
        for s, ids, _, want in runs:
            s.tokens.extend(ids)
            s._advance_recurrent(len(ids) > 1)
            s.t_eval_ms += ms * len(ids)    # the pass's time, shared by rows
            s.n_eval += len(ids)
            n = self._logit_rows(ids, want)
            out.append(logits[k:k + n] if n else None)
            k += n
        return out

    def decode_batch(self, sessions, tokens):
        """The next token of several sessions in one forward pass: decode() of one-token
        entries. Returns float32 (n, n_vocab), row i = sessions[i]'s next-token logits."""
        sessions, tokens = list(sessions), list(tokens)
        if not sessions or len(sessions) != len(tokens):
            raise RequestError(f"decode_batch: {len(sessions)} sessions for {len(tokens)} tokens")
        rows = self.decode([BatchEntry(s, (t,)) for s, t in zip(sessions, tokens)])
        whole = rows[0].base
        if isinstance(whole, np.ndarray) and whole.shape[0] == len(rows) and all(r.base is whole for r in rows):
            return whole    # one pass's rows in order: no second copy of n x n_vocab floats
        return np.concatenate(rows)

    def plan(self, n_ctx, n_batch=DEFAULT_N_BATCH):
        """The MemoryPlan a session of n_ctx tokens needs (weights + KV cache + scratch)."""
        return self._plan(type(self.backend), n_ctx)

    def chat_prompt(self, messages, add_generation_prompt=True, template_file=None,
                    template_name=None, **extra):
        """Render `messages` with the model's chat template (or the named variant
        `tokenizer.chat_template.NAME`), or with an operator's template file, which takes
        precedence. A model with neither raises TemplateError; plain completion still works."""
        from ..text.chat import render, template_for   # jinja2: only when a chat is rendered
        from ..text import gemma4
        tmpl = template_for(self.file, name=template_name, template_file=template_file)
        prompt = render(tmpl, messages, add_generation_prompt=add_generation_prompt,
                        bos_token=self.tokenizer.token_piece(self.tokenizer.bos_id).decode(
                            "utf-8", "replace") if self.tokenizer.bos_id is not None else "",
                        eos_token=self.tokenizer.token_piece(self.tokenizer.eos_id).decode(
                            "utf-8", "replace") if self.tokenizer.eos_id is not None else "",
                        **extra)
        if add_generation_prompt and gemma4.is_gemma4(tmpl):
            prompt = gemma4.generation_prompt(prompt)
        return prompt

    def encode_chat(self, messages, add_generation_prompt=True, template_file=None,
                    template_name=None, content_specials=False, **extra):
        """Token ids of `messages` rendered by chat_prompt(). Only the template's own markup
        becomes control tokens: text that came from the messages, tools or `extra` variables
        is tokenized as plain text even where it spells one ("<|im_end|><|im_start|>system"
        in a user message forges no turn), through Tokenizer.defuse and encode(marked=True).
        content_specials=True parses control-token text wherever it is (llama-server's way)."""
        from ..text.chat import map_strings
        tok = self.tokenizer
        if not content_specials:
            messages, extra = map_strings([messages, extra], tok.defuse)
        prompt = self.chat_prompt(messages, add_generation_prompt, template_file, template_name,
                                  **extra)
        ids = tok.encode(prompt, add_special=True, parse_special=True, marked=not content_specials)
        if len(ids) >= 2 and tok.bos_id is not None and ids[0] == ids[1] == tok.bos_id:
            del ids[0]      # the template wrote {{ bos_token }} and the tokenizer added one too
        return ids

    def _close_file(self):
        f, self.file = getattr(self, "file", None), None
        if f is not None:
            f.close()
        vf, self._verified = getattr(self, "_verified", None), None
        if vf is not None:
            vf.close()

    def close(self):
        self.encoder = None
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



class EmbedSteps:
    """Model.embed_steps: iterate for the units of compute; `.result` once exhausted (float32
    (n_inputs, n_embd), or with pooling "none" a list of (n_tokens, n_embd) arrays, or with
    pooling "rank" the classification head's (n_inputs, n_cls_out) outputs)."""

    def __init__(self, model, seqs, pooling, normalize, unit_tokens, token_types=None):
        self.result = None
        self._pooling, self._normalize = pooling, normalize
        self._head = model.rank_head
        self._units = model._hidden_states(seqs, unit_tokens, token_types)

    def __iter__(self):
        return self

    def __next__(self):
        if self.result is not None:
            raise StopIteration
        hidden = next(self._units)
        if hidden is None:
            return None
        self._units.close()
        if self._pooling == "rank":
            head = self._head
            self.result = head.scores(np.stack([head.pooled_row(h) for h in hidden]))
            return None
        vecs = [_encoder.pool(h, self._pooling) for h in hidden]
        if self._normalize:
            vecs = [_encoder.normalize(v) for v in vecs]
        self.result = vecs if self._pooling == "none" else np.stack(vecs)
        return None

    def close(self):
        """Stop early: the decoder's session (its KV cache) is freed at once."""
        self._units.close()

class Session:
    """Mutable state of one conversation: KV cache, the tokens in it, sampler RNG."""

    def __init__(self, model, n_ctx=512, n_batch=DEFAULT_N_BATCH):
        model.require_decoder()
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
        plan = MemoryPlan(model.memory_plan.weights, bp.kv_cache, bp.scratch, model.budget, n_ctx,
                          model.memory_plan.paged, str(model.cache))
        if model._log:
            model._log(plan.describe())
        plan.check(f"a session of n_ctx {n_ctx}")
        self.memory_plan = plan
        self._buf = be.alloc(n_ctx, self.n_batch)
        self.tokens: list[int] = []         # the tokens in the KV cache, by position
        self.images = None                  # engine/vision.ImageTable: pseudo ids -> image rows
        self.generation = None              # the Generation start() began (sampler state)
        self.draft_session = None           # a draft model's session (engine/speculative.py)
        self.t_eval_ms = 0.0
        self.n_eval = 0

    @property
    def n_past(self):
        return len(self.tokens)

    def reset(self):
        self.tokens = []

    def truncate(self, n):
        """Forget everything after the first n tokens (the cache beyond is overwritten; a
        recurrent state is rewound before the next evaluation, _sync_recurrent)."""
        del self.tokens[n:]

    def add_image(self, emb):
        """Make an ImageEmbedding's pseudo ids (emb.token_ids(n_vocab)) usable in this
        session's prompts (engine/vision.py)."""
        from .vision import ImageTable
        if emb.embeddings.shape[1:] != (self.model.hp.n_embd,):
            raise RequestError(f"image rows of width {emb.embeddings.shape[1:]} for a model of "
                               f"n_embd {self.model.hp.n_embd}")
        if self.images is None:
            self.images = ImageTable(self.model.hp.n_vocab)
        self.images.add(emb)

    def _sync_recurrent(self):
        """Bring a recurrent state (engine/recurrent.py) back to n_past after a truncate:
        restore the newest checkpoint at or before it and replay the tokens since, through the
        same forward pass (the rows give the bits they gave the first time)."""
        rs = self.model.backend.recurrent(self._buf)
        if rs is None or rs.pos == self.n_past:
            return
        p = rs.rewind(self.n_past)
        replay = self.tokens[p:]
        del self.tokens[p:]
        if replay:
            self._run(replay, None)

    def _advance_recurrent(self, checkpoint):
        """After a pass: the recurrent state is at n_past; the batches of a prompt (checkpoint)
        end in a checkpoint."""
        rs = self.model.backend.recurrent(self._buf)
        if rs is not None:
            rs.pos = self.n_past
            if checkpoint:
                rs.checkpoint()

    def common_prefix(self, ids):
        """How many leading tokens of ids this session's KV cache already holds: the one home
        of prefix reuse (Session.start and the daemon's choice of an idle session use it)."""
        n = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            n += 1
        return n

    def fork(self):
        """A new session of the same model, n_ctx and n_batch holding a copy of this one's KV
        cache and tokens (n_past positions are copied, nothing is evaluated). The two then go
        their own ways: n > 1 choices of one prompt prefill it once, fork, and start() each
        fork on the same ids (the prefix reuse then evaluates only the last prompt token,
        which a scheduler step batches for all forks)."""
        s = Session(self.model, self.n_ctx, self.n_batch)
        with _COMPUTE:
            self.model.backend.copy_kv(s._buf, self._buf, self.n_past)
        s.tokens = list(self.tokens)
        if self.images is not None:         # its KV rows of images keep their pseudo ids
            s.images = self.images.copy()
        return s

    def save(self, path, key=None, n_tokens=None):
        """Write this session's tokens and KV cache (the first n_tokens) to a prompt-cache file,
        atomically, MAC'd with `key` (default: the installation's, statefile.load_key()).
        Returns the file's size (engine/statefile.py)."""
        from . import statefile
        return statefile.save(self, path, key or statefile.load_key(), n_tokens)

    @classmethod
    def load(cls, model, path, key=None, n_batch=DEFAULT_N_BATCH):
        """A new session of `model` holding a prompt-cache file's tokens and KV cache, with the
        file's context size. StateFileError when the file was made for another model, cache
        type, kernel path or build, is damaged or its MAC does not verify."""
        from . import statefile
        key = key or statefile.load_key()
        h, _, _ = statefile.read_header(path)
        statefile.check_model(h, model)     # before the context it names is allocated
        s = cls(model, h["n_ctx"], n_batch)
        try:
            statefile.restore(s, path, key)
        except BaseException:
            s.close()
            raise
        return s

    def eval(self, ids, logits="last"):
        """Append ids to the context and run them: Model.decode of one entry. logits: "last" ->
        (1, n_vocab) float32, "all" -> (len(ids), n_vocab)."""
        ids = [int(t) for t in ids]
        if not ids:
            raise RequestError("eval: no tokens")
        if logits not in ("last", "all"):
            raise RequestError(f"eval: logits={logits!r}, expected 'last' or 'all'")
        return self.model.decode([BatchEntry(self, ids, None, logits)])[0]

    def _run(self, ids, logits):
        """Evaluate ids at n_past as this session's own batches of at most n_batch tokens
        (Model.decode has checked them and holds the lock)."""
        be, buf = self.model.backend, self._buf
        t0 = time.perf_counter()
        rows = []
        want_all = logits == "all"
        step = min(self.n_batch, be.max_logit_rows(buf)) if want_all else self.n_batch
        for chunk, last in self._chunks(ids, step):
            span = self._stage(chunk)
            be.forward(buf, len(chunk), self.n_past, want_all)
            if span:
                be.set_noncausal(buf, 0, -1)
            self.tokens.extend(chunk)
            self._advance_recurrent(len(ids) > 1)
            if want_all:
                rows.append(be.copy_out(buf, len(chunk)))
            elif last and logits:
                rows.append(be.copy_out(buf, 1))
        self.t_eval_ms += (time.perf_counter() - t0) * 1000
        self.n_eval += len(ids)
        if not rows:
            return None
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def _stage(self, chunk):
        """Stage a batch at n_past: token embeddings, image rows where it holds pseudo ids
        (and their span non-causal where the image asks for it)."""
        be, buf = self.model.backend, self._buf
        rows = self.images.rows(chunk) if self.images is not None else None
        if rows is None:
            be.copy_in(buf, chunk, self.n_past)
            return False
        be.copy_in(buf, [t if t < self.model.hp.n_vocab else 0 for t in chunk], self.n_past, rows)
        spans = self.images.spans(chunk)
        if not spans:
            return False
        if len(spans) > 1:      # a second image starts its own batch (ImageTable.cut)
            raise RequestError("two non-causal images in one batch")
        a, b = spans[0]
        be.set_noncausal(buf, self.n_past + a, self.n_past + b - 1)
        return True

    def _chunks(self, ids, step):
        """(chunk, is_last) batches of at most step tokens, never splitting an image decoded
        non-causally. With recurrent layers a batch's last token runs alone, so that
        checkpoints hold the state before and after it (a prompt evaluated again for its last
        token's logits, n > 1 forks, restores the first)."""
        cut, i = [0], 0
        while i < len(ids):
            n = min(step, len(ids) - i)
            if self.images is not None:
                n = self.images.cut(ids[i:], n)
            i += n
            cut.append(i)
        if self.model.backend.recurrent(self._buf) is not None and len(ids) - cut[-2] > 1:
            cut.insert(-1, len(ids) - 1)
        return [(ids[a:b], b == len(ids)) for a, b in zip(cut, cut[1:])]

    def start(self, prompt, params=SamplingParams(), max_tokens=128, stop=(), sampler=None,
              add_special=True, parse_special=False, speculative=None):
        """Begin a generation on this session: a Generation (engine/generation.py) whose steps
        the caller drives through Model.decode. prompt: text (tokenized with add_special /
        parse_special) or token ids. params: the SamplingParams to draw with; sampler: a
        text.sampling.Sampler to draw with instead (structured output, logprobs). stop: strings
        that end generation. The prefix the KV cache already holds is not evaluated again (at
        least the last prompt token is, for its logits). speculative: an
        engine.speculative.Speculation (or "lookup") to draft and verify tokens with; the tokens
        are the same as without it."""
        ids = self.model.tokenizer.encode(prompt, add_special=add_special,
                                          parse_special=parse_special) \
            if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise RequestError("empty prompt")
        if len(ids) > self.n_ctx:
            raise RequestError(f"prompt of {len(ids)} tokens is longer than the context "
                               f"(n_ctx {self.n_ctx})")
        cached = min(self.common_prefix(ids), len(ids) - 1)
        if isinstance(speculative, str):
            speculative = Speculation(speculative)
        drafter = speculative.drafter(self) if speculative is not None else None
        self.generation = Generation(self, ids, cached, params, max_tokens=max_tokens, stop=stop,
                                     sampler=sampler, drafter=drafter)
        return self.generation

    def generate(self, prompt, params=SamplingParams(), max_tokens=128, stop=(), sampler=None,
                 add_special=True, parse_special=False, stats=None, speculative=None):
        """Yield GenerationOutput items; the last one carries finish_reason.

        prompt: text (tokenized with add_special/parse_special) or a list of token ids.
        params: SamplingParams (greedy by default). stop: strings that end generation (they may
        span tokens; the text before them is emitted, the stop string is not). stats: optional
        dict filled with timings. sampler: a text.sampling.Sampler to draw with (structured
        output, logprobs) instead of one made from params. speculative: as start() (the same
        tokens, drafted and verified several per pass; stats gets n_drafted and n_accepted).
        A thin loop over start() and Model.decode, one entry per step."""
        g = self.start(prompt, params, max_tokens=max_tokens, stop=stop, sampler=sampler,
                       add_special=add_special, parse_special=parse_special,
                       speculative=speculative)
        decode = self.model.decode
        while True:
            for out in g.accept_all(decode([g.entry()])[0]):
                if stats is not None:
                    stats.update(g.stats())
                yield out
                if out.finish_reason:
                    return

    def close(self):
        if self.draft_session is not None:
            self.draft_session.close()
            self.draft_session = None
        if self._buf is not None:
            self.model.backend.free(self._buf)
            self._buf = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

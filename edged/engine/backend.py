"""The seam between the engine and the hardware that runs the forward pass.

A backend is initialised once per Model from the validated Spec and the mapped weights; it
allocates and frees per-session buffers (KV cache + scratch), takes a batch of tokens in,
runs one forward step and hands logits back. Model.decode (the step API) drives exactly these
calls and holds the engine's one lock around them, so a backend runs one call at a time and an
accelerator backend (an NPU vendor's) plugs in here without touching the engine.

Backends: "cpu" (compiled, default) and "reference" (NumPy, for tests and debugging),
chosen with EDGED_BACKEND or Model.load(backend=...) (engine/backends.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kvcache import DEFAULT as DEFAULT_CACHE


@dataclass(frozen=True)
class BufferPlan:
    """Bytes one session needs on top of the weights."""
    kv_cache: int
    scratch: int

    @property
    def total(self):
        return self.kv_cache + self.scratch


class Backend:
    """Interface. `weights` maps tensor name -> read-only uint8 view of the mapped file."""

    name = "abstract"

    @property
    def kernel_path(self) -> str:
        """Which arithmetic computes the logits (docs/engine.md, "Reproducibility"): the same
        request gives the same bits on the same kernel path and build, however it is batched."""
        return self.name

    @property
    def kernel_variant(self) -> str:
        """The kernel table within the path (e.g. avx2+vnni); the path's name elsewhere."""
        return self.kernel_path

    def __init__(self, spec, weights, n_threads=1, numa="none", cache=DEFAULT_CACHE,
                 resident_experts=False):  # initialise
        self.spec, self.weights, self.n_threads, self.numa = spec, weights, n_threads, numa
        self.cache = cache  # kvcache.CacheTypes of every session's K and V
        # MoE: every expert may be held resident in the backend's own layout (Model decides)
        self.resident_experts = resident_experts

    @classmethod
    def extra_weight_bytes(cls, spec) -> int:
        """Bytes the backend holds for weights beyond the mapping (repacked/dequantized copies)."""
        return 0

    @classmethod
    def expert_repack_bytes(cls, spec) -> int:
        """Bytes of MoE expert weights this backend would copy into its own layout when allowed
        to hold every expert resident (resident_experts): 0 when it reads them mapped anyway."""
        return 0

    @classmethod
    def plan_for(cls, spec, n_ctx: int, n_batch: int, cache=DEFAULT_CACHE) -> BufferPlan:
        """KV cache (of the kvcache.CacheTypes `cache`) + scratch bytes of one session,
        computable before anything is loaded."""
        raise NotImplementedError

    def plan(self, n_ctx: int, n_batch: int) -> BufferPlan:
        return self.plan_for(self.spec, n_ctx, n_batch, self.cache)

    def alloc(self, n_ctx: int, n_batch: int):
        """Allocate one session's buffers; returns an opaque handle."""
        raise NotImplementedError

    def free(self, buf) -> None:
        raise NotImplementedError

    def max_logit_rows(self, buf) -> int:
        """Most rows one forward step can return logits for (eval splits longer batches)."""
        return 1 << 30

    def copy_in(self, buf, tokens, pos: int, rows=None) -> None:
        """Stage a batch of token ids that will sit at positions pos, pos+1, ... rows: None or
        (indices int64, float32 (k, n_embd)): those batch rows take these input rows instead
        of a token's embedding (an image's, engine/vision.py; no embedding scale)."""
        raise NotImplementedError

    def set_noncausal(self, buf, lo: int, hi: int) -> None:
        """The rows at positions lo..hi of the next forward() attend to every key up to hi
        (an image decoded non-causally); hi < lo: every row causal again."""
        raise NotImplementedError

    def forward(self, buf, n_tokens: int, pos: int, all_logits: bool, all_rows: bool = False) -> None:
        """Run the model over the staged batch, writing K/V at [pos, pos+n_tokens). Only the
        rows whose logits are wanted need the last layer: all_rows asks for every row's final
        hidden state too (hidden_rows)."""
        raise NotImplementedError

    def copy_out(self, buf, n_rows: int):
        """float32 (n_rows, n_vocab) logits of the last forward step (all rows or the last)."""
        raise NotImplementedError

    def hidden_rows(self, buf, n_rows):
        """float32 (n_rows, n_embd): the final hidden states (after output_norm, what the
        output matrix would multiply) of the first n_rows tokens of the last forward step:
        a decoder's embeddings (llama.cpp's t_embd)."""
        raise NotImplementedError

    def decode_rows(self, bufs, tokens, positions, out_rows=None):
        """One step of several sessions: token i at positions[i] of bufs[i]'s cache (a
        session's rows in position order: its next token, or a prompt chunk). Returns float32
        (len(out_rows), n_vocab): the logits of rows out_rows (ascending; default every row).
        This default runs the rows one by one (the reference backend's slow twin); a backend
        that can share the matrix products across rows overrides it."""
        want = set(range(len(bufs)) if out_rows is None else out_rows)
        rows = []
        for i, (buf, tok, pos) in enumerate(zip(bufs, tokens, positions)):
            self.copy_in(buf, [tok], pos)
            self.forward(buf, 1, pos, False)
            if i in want:
                rows.append(self.copy_out(buf, 1))
        return np.concatenate(rows) if rows else np.zeros((0, self.spec.hp.n_vocab), np.float32)

    @property
    def code_files(self) -> tuple:
        """The files holding the code that computes the logits (their hash is the build id
        prompt-cache files carry, engine/statefile.py)."""
        import sys
        return (sys.modules[type(self).__module__].__file__,)

    def kv_cache(self, buf):
        """(k, v): uint8 views (n_layer, n_ctx, bytes of a row) of a session's KV cache, one
        position's row after another (prompt-cache files read and write them in place)."""
        raise NotImplementedError

    def kv_layers(self, buf):
        """[(k, v)]: uint8 views (n_ctx, bytes of the layer's row) of each attention layer's
        cache that holds rows, in layer order; a layer's rows are its own size (gemma4).
        Prompt-cache files read and write them in place."""
        k, v = self.kv_cache(buf)
        return list(zip(k, v))

    def copy_kv(self, dst, src, n: int) -> None:
        """Copy the KV cache of positions [0, n) from session buffer src to dst (same n_ctx):
        Session.fork."""
        raise NotImplementedError

    def recurrent(self, buf):
        """A session's recurrent state (engine/recurrent.py RecurrentState), or None for a
        model without recurrent layers."""
        return None

    def close(self) -> None:
        pass


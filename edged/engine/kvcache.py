"""The KV cache's storage types, as llama.cpp's --cache-type-k / --cache-type-v (-ctk/-ctv).

f16 (the default), q8_0 and q4_0: the ones llama.cpp users pick to fit a long context on a
small device (q8_0 stores 34 bytes per 32 values, 0.53x of f16; q4_0 18 bytes, 0.28x). K and
V are chosen separately. A row of the cache (one position, every KV head) is stored as a row
of the type when its token is evaluated; head_dim must be a multiple of the 32-value block so
a block never spans two heads. llama.cpp runs a quantized V only with flash attention; the
compiled path reads it the same way (cython_kernels/forward/forward.h, ed_attn_flash_row).

Like llama.cpp, a quantized cache stores rotated rows when head_dim is a multiple of 64: q and
k (for a quantized K) and v (for a quantized V) are multiplied by an orthonormal Walsh-Hadamard
matrix before k and v are stored, and the attention output by V's matrix after (H H = I). The
rotation spreads an outlier channel over the block, so one large value does not set a 32-value
block's scale (SmolLM2-135M, q4_0 K: KL 0.19 to the F16 cache without it, 0.03 with it).
K's matrix is the largest power of two dividing head_dim, V's is 64 (`rotation`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..format.gguf import GGMLType
from ..format.quants import row_bytes
from .recurrent import state_bytes

CACHE_TYPES = {"f16": GGMLType.F16, "q8_0": GGMLType.Q8_0, "q4_0": GGMLType.Q4_0}


def cache_type(name, option="cache_type_k"):
    """'q8_0' (any case) or a GGMLType -> GGMLType; ConfigError naming the option otherwise."""
    if isinstance(name, GGMLType) and name in CACHE_TYPES.values():
        return name
    t = CACHE_TYPES.get(str(name).lower()) if isinstance(name, str) else None
    if t is None:
        raise ConfigError(f"{option}={name!r}: expected one of {', '.join(CACHE_TYPES)}")
    return t


@dataclass(frozen=True)
class CacheTypes:
    """The storage types of a session's K and V cache."""
    k: GGMLType = GGMLType.F16
    v: GGMLType = GGMLType.F16

    @classmethod
    def parse(cls, k=None, v=None):
        return cls(cache_type(k or "f16", "cache_type_k"), cache_type(v or "f16", "cache_type_v"))

    @property
    def names(self):
        return self.k.name.lower(), self.v.name.lower()

    def check(self, head_dim):
        """ConfigError when a quantized type's 32-value blocks would span two heads (head_dim:
        one size, or every layer's)."""
        sizes = head_dim if isinstance(head_dim, tuple) else (head_dim,)
        for option, t in (("cache_type_k", self.k), ("cache_type_v", self.v)):
            for d in sizes:
                if t != GGMLType.F16 and d % 32:
                    raise ConfigError(f"{option}={t.name.lower()}: head_dim {d} of this "
                                      "model is not a multiple of the type's block of 32 (use f16)")

    def nbytes(self, hp, n_ctx):
        """Bytes of the K and V cache of n_ctx positions of a model with hyperparameters hp,
        with the convolution cache of its convolution layers (lfm2: n_embd float32 per
        position each), and the recurrent state of its DeltaNet layers (qwen35: constant per
        sequence, with its checkpoints). Each layer's rows are its own size (gemma4: head
        size and KV heads per layer; none for a layer that reads an earlier layer's cache)."""
        rows = sum(row_bytes(self.k, d) + row_bytes(self.v, d) for d in hp.kv_dims())
        return n_ctx * rows + hp.n_conv_layers * n_ctx * 4 * hp.n_embd + state_bytes(hp)

    def rotation(self, head_dim):
        """(n_k, n_v): the Hadamard sizes q/k and v/output are rotated with, 0 for none."""
        def size(t, largest):
            if t == GGMLType.F16 or head_dim % 64:
                return 0
            n = 64
            while largest and head_dim % (2 * n) == 0:
                n *= 2
            return n
        return size(self.k, True), size(self.v, False)

    def __str__(self):
        return "/".join(self.names)


DEFAULT = CacheTypes()

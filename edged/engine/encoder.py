"""BERT-family encoders (`bert`, `nomic-bert`): the architecture table, its validation, and the
forward pass that turns a batch of token sequences into one hidden state per token.

What differs from the decoder table (engine/arch.py), as llama.cpp builds these graphs:
- input: token embedding + the first token-type row ("sentence A") + a learned position
  embedding (`bert`), then a LayerNorm with bias (`token_embd_norm`);
- attention is not causal (every token sees its whole sequence) and there is no KV cache;
  `nomic-bert` rotates q and k (RoPE, NeoX pairs) instead of learning positions;
- post-norm blocks with LayerNorm (not RMSNorm) and biases: x = LN(x + attn(x)),
  x = LN(x + ffn(x)); the FFN is GELU(up) -> down with biases (`bert`) or SiLU-gated
  (`nomic-bert`: ffn_gate, ffn_up, ffn_down without biases).

Sequences of one call run together: every matrix product takes the rows of all sequences at
once (the compiled quantized kernels, edged._core.matmul, on the model's thread pool), and
attention runs per sequence. With the compiled core the rest of a layer is compiled too
(cython_kernels/forward/encoder.h, on the same pool): LayerNorm with the residual and the
product's bias folded in, GELU through llama.cpp's F16 table or the SiLU gate, RoPE, and the
non-causal attention; Python makes about ten calls per layer. Without the compiled core
(EDGED_BACKEND=reference, only when asked) the same pass runs in NumPy over dequantized
weights: `_layer_reference`, the slow twin the tests hold the compiled path to.

Q8_0 weights multiply in llama.cpp's x86 order (edged._core.enc_matmul_q8_0: per block 8 lanes
of 4 integer products, one FMA each, then the 8-lane tree), not the forward pass's canonical
order (docs/kernels.md), on every kernel path. Embeddings are compared with llama.cpp's at
cosine 1e-4, and there one product rounded 1 ulp apart can flip the F16 scale of an activation
block downstream: all-MiniLM-L6-v2 amplified one such flip in layer 0 to cosine 0.9998 on
"hello world" (0.99996 in llama.cpp's order, as close as llama.cpp itself comes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .arch import SUPPORTED_TYPES, VECTOR_TYPES, _Meta
from .reference import gelu_ggml, rope, silu
from ..errors import RequestError, UnsupportedModelError
from ..format.gguf import TYPE_INFO, GGMLType, Key
from ..format.quants import dequantize

# llama.cpp's llama_pooling_type values as GGUF `<arch>.pooling_type` stores them
POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
POOLING_NAMES = ("none", "mean", "cls", "last")


@dataclass(frozen=True)
class EncoderArch:
    name: str
    learned_pos: bool       # position_embd rows added to the input (bert)
    rope: bool              # NeoX RoPE on q and k (nomic-bert)
    gated_ffn: bool         # SiLU(gate) * up, no FFN biases (nomic-bert); else GELU(up) + biases


ENCODERS = {
    "bert": EncoderArch("bert", learned_pos=True, rope=False, gated_ffn=False),
    "nomic-bert": EncoderArch("nomic-bert", learned_pos=False, rope=True, gated_ffn=True),
}


@dataclass(frozen=True)
class EncoderHParams:
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    head_dim: int
    norm_eps: float         # attention.layer_norm_epsilon
    rope_freq_base: float
    pooling: str            # the file's pooling type (POOLING_NAMES)


@dataclass(frozen=True)
class EncoderSpec:
    arch: EncoderArch
    hp: EncoderHParams
    tensors: dict           # role -> tensor name (None when the file has none); per layer "blk.i."


def _refuse(msg):
    raise UnsupportedModelError(msg)


def pooling_of(metadata, arch_name, default="none"):
    """The file's `<arch>.pooling_type` as a name ("none" when absent, as llama.cpp; "rank"
    for a reranker)."""
    key = Key.arch(Key.POOLING_TYPE, arch_name)
    v = metadata.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) not in POOLING:
        _refuse(f"{key} = {v!r} is not a pooling type (0 none, 1 mean, 2 cls, 3 last, 4 rank)")
    return POOLING[int(v)]       # "rank": a reranker's head (engine/rank.py)


def validate(metadata, tensors, n_vocab_tokenizer=None, log=None):
    """One validation pass over an encoder file: keys, every tensor's shape and type."""
    name = metadata.get(Key.ARCHITECTURE)
    a = ENCODERS[name]
    m = _Meta(metadata, name)
    E = m.get(Key.EMBEDDING_LENGTH, required=True)
    n_layer = m.get(Key.BLOCK_COUNT, required=True)
    n_head = m.get(Key.HEAD_COUNT, required=True)
    F = m.get(Key.FEED_FORWARD_LENGTH, required=True)
    n_head_kv = m.get(Key.HEAD_COUNT_KV, default=n_head)
    if n_head_kv != n_head or E % n_head or (E // n_head) % 2:
        _refuse(f"{name}: head_count {n_head} / head_count_kv {n_head_kv} with embedding_length "
                f"{E} not supported (equal counts, an even head size)")
    eps = m.get(Key.LAYERNORM_EPS, required=True)
    base = m.get(Key.ROPE_FREQ_BASE, default=10000.0)
    n_ctx = m.get(Key.CONTEXT_LENGTH, required=True)
    causal = m.get(Key.CAUSAL)          # llama.cpp: absent means causal attention
    if causal is None or causal:
        _refuse(f"{m.name(Key.CAUSAL)} is {'absent (llama.cpp then runs the file causally)' if causal is None else 'true'}: "
                f"a causal {name} is not supported (converters write false)")
    embd = tensors.get("token_embd.weight")
    if embd is None or len(embd.shape) != 2 or int(embd.shape[0]) != E:
        _refuse(f"tensor 'token_embd.weight' missing or not ({E}, n_vocab)")
    V = int(embd.shape[1])
    if n_vocab_tokenizer is not None and n_vocab_tokenizer != V:
        _refuse(f"tokenizer has {n_vocab_tokenizer} tokens but token_embd.weight has {V} rows")
    n_types = m.get(Key.TOKEN_TYPE_COUNT, default=0)

    roles = {}

    def get(role, tname, shape, vector=False, required=True):
        t = tensors.get(tname)
        if t is None:
            if required:
                _refuse(f"missing tensor {tname!r}")
            roles[role] = None
            return
        if tuple(int(x) for x in t.shape) != tuple(shape):
            _refuse(f"tensor {tname!r} has shape {tuple(int(x) for x in t.shape)}, expected "
                    f"{tuple(shape)} from the hyperparameters")
        if t.type not in (VECTOR_TYPES if vector else SUPPORTED_TYPES):
            _refuse(f"tensor {tname!r} has type {getattr(t.type, 'name', t.type)}, which edged "
                    "does not support" + (" for a norm/bias vector" if vector else ""))
        if not vector and shape[0] % TYPE_INFO[t.type].block_size:
            _refuse(f"tensor {tname!r}: row length {shape[0]} is not a multiple of the "
                    f"{t.type.name} block size {TYPE_INFO[t.type].block_size}")
        roles[role] = tname
        if log:
            log(t)

    # token_embd, token_types and position_embd are gathered row by row: any type
    get("token_embd", "token_embd.weight", (E, V))
    get("token_types", "token_types.weight", (E, max(n_types, 1)), required=False)
    if a.learned_pos:
        get("position_embd", "position_embd.weight", (E, n_ctx))
    get("token_embd_norm", "token_embd_norm.weight", (E,), vector=True)
    get("token_embd_norm_b", "token_embd_norm.bias", (E,), vector=True)
    for i in range(n_layer):
        p = f"blk.{i}."
        if p + "attn_qkv.weight" in tensors:
            get(p + "attn_qkv", p + "attn_qkv.weight", (E, 3 * E))
            get(p + "attn_qkv_b", p + "attn_qkv.bias", (3 * E,), vector=True, required=False)
        else:
            for r in ("attn_q", "attn_k", "attn_v"):
                get(p + r, p + r + ".weight", (E, E))
                get(p + r + "_b", p + r + ".bias", (E,), vector=True, required=False)
        get(p + "attn_output", p + "attn_output.weight", (E, E))
        get(p + "attn_output_b", p + "attn_output.bias", (E,), vector=True, required=False)
        get(p + "attn_output_norm", p + "attn_output_norm.weight", (E,), vector=True)
        get(p + "attn_output_norm_b", p + "attn_output_norm.bias", (E,), vector=True)
        get(p + "ffn_up", p + "ffn_up.weight", (E, F))
        get(p + "ffn_down", p + "ffn_down.weight", (F, E))
        if a.gated_ffn:
            get(p + "ffn_gate", p + "ffn_gate.weight", (E, F))
        else:
            get(p + "ffn_up_b", p + "ffn_up.bias", (F,), vector=True, required=False)
            get(p + "ffn_down_b", p + "ffn_down.bias", (E,), vector=True, required=False)
        get(p + "layer_output_norm", p + "layer_output_norm.weight", (E,), vector=True)
        get(p + "layer_output_norm_b", p + "layer_output_norm.bias", (E,), vector=True)
    hp = EncoderHParams(n_vocab=V, n_ctx_train=n_ctx, n_embd=E, n_ff=F, n_layer=n_layer,
                        n_head=n_head, head_dim=E // n_head, norm_eps=eps, rope_freq_base=base,
                        pooling=pooling_of(metadata, name))
    return EncoderSpec(arch=a, hp=hp, tensors=roles)


def layer_norm(x, w, b, eps):
    """ggml_norm then * w + b. x: (n, d) float32."""
    mu = x.mean(-1, keepdims=True, dtype=np.float64)
    xc = x - mu
    var = (xc * xc).mean(-1, keepdims=True, dtype=np.float64)
    return (xc / np.sqrt(var + eps) * w + b).astype(np.float32)


class Encoder:
    """Runs an EncoderSpec over the mapped weights: hidden states for batches of sequences."""

    @classmethod
    def build(cls, spec, tensor_infos, weights, core=None, pool=None):
        """tensor_infos: name -> TensorInfo; weights: name -> the mapped bytes; core/pool:
        edged._core and a thread pool (None: NumPy products over dequantized weights)."""
        self = object.__new__(cls)
        self.spec, self.hp = spec, spec.hp
        self._core, self._pool = core, pool
        self._mat = {}      # role -> (uint8 bytes, ggml type, N rows, K) or float32 (N, K)
        self._vec = {}      # role -> float32 vector
        gathered = ("token_embd", "token_types", "position_embd")
        for role, name in spec.tensors.items():
            if name is None:
                continue
            ti = tensor_infos[name]
            raw = np.asarray(weights[name]).reshape(-1)
            shape = tuple(int(x) for x in ti.shape)
            if len(shape) == 1:
                self._vec[role] = np.ascontiguousarray(
                    dequantize(raw, ti.type, shape), dtype=np.float32).reshape(-1)
            elif role in gathered:
                # row lookups: token_types/position_embd are small; token_embd stays mapped
                self._mat[role] = (raw, ti.type, shape)
            elif core is not None:
                self._mat[role] = (raw, int(ti.type), shape)
            else:
                self._mat[role] = np.ascontiguousarray(
                    dequantize(raw, ti.type, shape), dtype=np.float32).reshape(shape[1], shape[0])
        return self

    # --- pieces ---------------------------------------------------------------------------
    def _rows(self, role, ids):
        """Rows `ids` of an embedding-like matrix as float32 (len(ids), n_embd)."""
        raw, qtype, shape = self._mat[role]
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((len(ids), shape[0]), np.float32)
        if self._core is not None:
            self._core.dequantize_rows(out, raw, int(qtype), ids)
        else:
            rb = len(raw) // shape[1]
            for k, i in enumerate(ids.tolist()):
                out[k] = dequantize(raw[i * rb:(i + 1) * rb], qtype, (shape[0],))
        return out

    def _mm(self, x, role, bias=None):
        """x (n, K) float32 -> x @ W^T (n, N), plus the bias when the file has one."""
        w = self._mat[role]
        if isinstance(w, np.ndarray):
            y = x @ w.T
        else:
            raw, qtype, shape = w
            y = np.empty((x.shape[0], shape[1]), np.float32)
            if qtype == GGMLType.Q8_0:      # llama.cpp's order: see the module docstring
                self._core.enc_matmul_q8_0(y, raw, np.ascontiguousarray(x), self._pool)
            else:
                self._core.matmul(y, raw, qtype, np.ascontiguousarray(x), self._pool)
        b = self._vec.get(bias) if bias else None
        return y + b if b is not None else y

    def _ln(self, x, role):
        if self._core is None:
            return layer_norm(x, self._vec[role], self._vec[role + "_b"], self.hp.norm_eps)
        x = np.ascontiguousarray(x, np.float32)
        self._core.enc_norm(x, self._vec[role], self._vec[role + "_b"], self.hp.norm_eps,
                            None, None, self._pool)
        return x

    # --- the pass -------------------------------------------------------------------------
    def hidden(self, seqs, types=None):
        """Token sequences (lists of ids) -> list of float32 (len(seq), n_embd) hidden states,
        all sequences in one pass. types: per sequence, each token's type (segment) id, e.g.
        Tokenizer.encode_pair's; None adds type 0's row to every token, as llama.cpp does."""
        hp, a = self.hp, self.spec.arch
        lens = [len(s) for s in seqs]
        ids = np.concatenate([np.asarray(s, np.int64) for s in seqs])
        pos = np.concatenate([np.arange(n) for n in lens])
        x = self._rows("token_embd", ids)                           # (T, E)
        if types is not None:
            types = np.concatenate([np.asarray(t, np.int64) for t in types])
            n_types = self._mat["token_types"][2][1] if "token_types" in self._mat else 1
            if len(types) != len(ids) or types.min() < 0 or types.max() >= n_types:
                raise RequestError(f"token types must give each token a type in 0..{n_types - 1}")
        if "token_types" in self._mat:
            x += self._rows("token_types", [0] if types is None else types)   # 0: "sentence A"
        if a.learned_pos:
            x += self._rows("position_embd", pos)
        x = self._ln(x, "token_embd_norm")
        starts = np.cumsum([0] + lens)
        layer = self._layer_reference if self._core is None else self._layer_core
        for il in range(hp.n_layer):
            x = layer(f"blk.{il}.", x, starts, pos)
        return [x[s0:s1] for s0, s1 in zip(starts[:-1], starts[1:])]

    def _qkv(self, p, x, bias=True):
        """q, k, v (T, n_embd) of layer p: column slices of the fused product or three."""
        E = self.hp.n_embd
        if p + "attn_qkv" in self._mat:
            qkv = self._mm(x, p + "attn_qkv", p + "attn_qkv_b" if bias else None)
            return qkv[:, :E], qkv[:, E:2 * E], qkv[:, 2 * E:]
        return tuple(self._mm(x, p + r, p + r + "_b" if bias else None)
                     for r in ("attn_q", "attn_k", "attn_v"))

    def _layer_core(self, p, x, starts, pos):
        """One layer in compiled code between the products (biases added by the ops after)."""
        hp, a, core, pool = self.hp, self.spec.arch, self._core, self._pool
        q, k, v = self._qkv(p, x, bias=False)
        if p + "attn_qkv" in self._mat:
            E = hp.n_embd
            qb = self._vec.get(p + "attn_qkv_b")
            qb, kb, vb = (None, None, None) if qb is None else (qb[:E], qb[E:2 * E], qb[2 * E:])
        else:
            qb, kb, vb = (self._vec.get(p + r + "_b") for r in ("attn_q", "attn_k", "attn_v"))
        att = np.empty(x.shape, np.float32)
        core.enc_attention(att, q, k, v, starts.astype(np.int64), hp.n_head,
                           1.0 / math.sqrt(hp.head_dim), qb, kb, vb,
                           hp.rope_freq_base if a.rope else 0.0, pool)
        cur = self._mm(att, p + "attn_output")
        core.enc_norm(cur, self._vec[p + "attn_output_norm"], self._vec[p + "attn_output_norm_b"],
                      hp.norm_eps, x, self._vec.get(p + "attn_output_b"), pool)
        x = cur
        if a.gated_ffn:
            h = self._mm(x, p + "ffn_gate")
            core.enc_act(h, None, self._mm(x, p + "ffn_up"), pool)
        else:
            h = self._mm(x, p + "ffn_up")
            core.enc_act(h, self._vec.get(p + "ffn_up_b"), None, pool)
        cur = self._mm(h, p + "ffn_down")
        core.enc_norm(cur, self._vec[p + "layer_output_norm"], self._vec[p + "layer_output_norm_b"],
                      hp.norm_eps, x, self._vec.get(p + "ffn_down_b"), pool)
        return cur

    def _layer_reference(self, p, x, starts, pos):
        """One layer in NumPy (float64 where llama.cpp sums in double): the slow twin."""
        hp, a = self.hp, self.spec.arch
        H, D = hp.n_head, hp.head_dim
        scale = 1.0 / math.sqrt(D)
        q, k, v = (m.reshape(-1, H, D) for m in self._qkv(p, x))   # (T, H, D)
        if a.rope:
            q = rope(q, pos, D, hp.rope_freq_base, 1.0, True).astype(np.float32)
            k = rope(k, pos, D, hp.rope_freq_base, 1.0, True).astype(np.float32)
        att = np.empty((x.shape[0], H, D), np.float32)
        for s0, s1 in zip(starts[:-1], starts[1:]):             # non-causal, per sequence
            qs, ks, vs = q[s0:s1].transpose(1, 0, 2), k[s0:s1].transpose(1, 0, 2), \
                v[s0:s1].transpose(1, 0, 2)                     # (H, n, D)
            sc = qs @ ks.transpose(0, 2, 1) * np.float32(scale)  # (H, n, n)
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            att[s0:s1] = (sc @ vs).transpose(1, 0, 2)
        cur = self._mm(att.reshape(x.shape[0], -1), p + "attn_output", p + "attn_output_b")
        x = self._ln(cur + x, p + "attn_output_norm")
        if a.gated_ffn:
            h = (silu(self._mm(x, p + "ffn_gate").astype(np.float64))
                 * self._mm(x, p + "ffn_up")).astype(np.float32)
        else:
            h = gelu_ggml(self._mm(x, p + "ffn_up", p + "ffn_up_b").astype(np.float64)) \
                .astype(np.float32)
        cur = self._mm(h, p + "ffn_down", p + "ffn_down_b")
        return self._ln(cur + x, p + "layer_output_norm")


def pool(hidden, pooling):
    """One sequence's (n, n_embd) hidden states -> its embedding (pooling "none": all rows)."""
    if pooling == "mean":
        return hidden.mean(0, dtype=np.float64).astype(np.float32)
    if pooling == "cls":
        return hidden[0].copy()
    if pooling == "last":
        return hidden[-1].copy()
    if pooling == "none":
        return hidden.copy()
    raise RequestError(f"pooling {pooling!r}: expected one of {', '.join(POOLING_NAMES)}")


def normalize(v):
    """L2 normalisation (llama.cpp's embd_normalize 2), row by row; a zero vector stays zero."""
    v = np.asarray(v, np.float32)
    n = np.linalg.norm(v.astype(np.float64), axis=-1, keepdims=True)
    return (v / np.where(n > 0, n, 1.0)).astype(np.float32)

"""Benchmark models without downloads: real architectures' shapes and vocabulary sizes, random
weights quantized by edged's own quantizer (edged.format.quants) with llama.cpp's type mixes.

Weights are random rows drawn from a small pool of quantized random rows per (type, row
length), so a 0.5B-parameter file takes seconds, yet every tensor has its full size and is
streamed from memory exactly like a trained one. The vocabulary is a synthetic SentencePiece
one of the real size (bytes, characters, pairs, fillers), so tokenizing and detokenizing work.
"""
from __future__ import annotations

import os

import numpy as np

from ..errors import ConfigError
from .gguf import GGMLType, GGUFWriter, Key, TYPE_INFO, ValueType
from .quants import quantize

SHAPES = {
    # name: architecture and hyperparameters (llama.cpp's short names)
    "qwen2.5-0.5b": dict(arch="qwen2", n_embd=896, n_head=14, n_head_kv=2, n_ff=4864,
                         n_layer=24, n_vocab=151936, rope_freq_base=1e6, rms_eps=1e-6,
                         n_ctx_train=32768, tied=True, qkv_bias=True),
    "llama-3.2-1b": dict(arch="llama", n_embd=2048, n_head=32, n_head_kv=8, n_ff=8192,
                         n_layer=16, n_vocab=128256, rope_freq_base=500000.0, rms_eps=1e-5,
                         n_ctx_train=131072, tied=True, qkv_bias=False),
    "tinyllama-1.1b": dict(arch="llama", n_embd=2048, n_head=32, n_head_kv=4, n_ff=5632,
                           n_layer=22, n_vocab=32000, rope_freq_base=10000.0, rms_eps=1e-5,
                           n_ctx_train=2048, tied=False, qkv_bias=False),
    # Qwen3-30B-A3B's layer layout (q/k norms, 128 experts of 768, 8 per token) scaled to a
    # 0.4B-parameter file with 56 M active per token, for MoE benchmarks
    "qwen3moe-mini": dict(arch="qwen3moe", n_embd=1024, n_head=16, n_head_kv=4, n_ff=3072,
                          n_layer=8, n_vocab=32000, rope_freq_base=1e6, rms_eps=1e-6,
                          n_ctx_train=32768, tied=False, qkv_bias=False, qk_norm=True,
                          n_expert=32, n_expert_used=4, n_ff_exp=384),
    # a small model for demos and tests (seconds to make, milliseconds per token)
    "tiny": dict(arch="llama", n_embd=256, n_head=4, n_head_kv=2, n_ff=768, n_layer=4,
                 n_vocab=4096, rope_freq_base=10000.0, rms_eps=1e-5, n_ctx_train=2048,
                 tied=False, qkv_bias=False),
}

# file type -> (base type, type for "more bits" tensors (attn_v / ffn_down), output type)
MIXES = {
    "F32": (GGMLType.F32, GGMLType.F32, GGMLType.F32),
    "F16": (GGMLType.F16, GGMLType.F16, GGMLType.F16),
    "Q8_0": (GGMLType.Q8_0, GGMLType.Q8_0, GGMLType.Q8_0),
    "Q4_0": (GGMLType.Q4_0, GGMLType.Q4_0, GGMLType.Q6_K),
    "Q4_1": (GGMLType.Q4_1, GGMLType.Q4_1, GGMLType.Q6_K),
    "Q5_0": (GGMLType.Q5_0, GGMLType.Q5_0, GGMLType.Q6_K),
    "Q6_K": (GGMLType.Q6_K, GGMLType.Q6_K, GGMLType.Q6_K),
    "Q4_K_M": (GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q6_K),
    "Q5_K_M": (GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q6_K),
}

# llama.cpp's fallbacks when a row length is not a multiple of the K-quant super-block
from .quantize import FALLBACK  # noqa: E402


def _more_bits(il, n_layer):
    # llama.cpp's use_more_bits: first and last eighth of the layers, and every third between
    return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2


def tensor_type(role, row_len, ftype, il=0, n_layer=1):
    base, more, out = MIXES[ftype]
    if role == "output":
        t = out
    elif role in ("attn_v", "ffn_down") and ftype.endswith("_M"):
        t = more if _more_bits(il, n_layer) else base
    else:
        t = base
    while row_len % TYPE_INFO[t].block_size:
        t = FALLBACK.get(t, GGMLType.F16)
    return t


def synth_vocab(n_vocab):
    """A SentencePiece vocabulary of n_vocab pieces: <unk> <s> </s>, 256 byte tokens, then
    characters, '▁'-prefixed characters, letter pairs and fillers; scores prefer short pieces."""
    toks, types = ["<unk>", "<s>", "</s>"], [2, 3, 3]
    toks += [f"<0x{i:02X}>" for i in range(256)]
    types += [6] * 256
    chars = [chr(c) for c in range(33, 127)]
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces = ["\u2581"] + chars + ["\u2581" + c for c in chars]
    pieces += [a + b for a in letters for b in letters]
    pieces += ["\u2581" + a + b for a in letters for b in letters]
    seen = set(toks)
    for p in pieces:
        if len(toks) >= n_vocab:
            break
        if p not in seen:
            toks.append(p)
            types.append(1)
            seen.add(p)
    i = 0
    while len(toks) < n_vocab:
        toks.append(f"\u2581w{i}")
        types.append(1)
        i += 1
    scores = -np.arange(len(toks), dtype=np.float32) / len(toks)
    return toks[:n_vocab], scores[:n_vocab], np.array(types[:n_vocab], np.int32)


class _Pool:
    """Quantized random rows per (type, row length); tensors are rows drawn from the pool."""

    def __init__(self, rng, n_rows=32):
        self.rng, self.n_rows, self.cache = rng, n_rows, {}

    def rows(self, qtype, row_len, n, scale=0.02):
        key = (qtype, row_len)
        if key not in self.cache:
            x = (self.rng.standard_normal((self.n_rows, row_len), dtype=np.float32) * scale)
            self.cache[key] = np.asarray(quantize(x, qtype)).reshape(self.n_rows, -1)
        pool = self.cache[key]
        return pool[self.rng.integers(0, self.n_rows, n)]


def synth(shape, ftype, out, seed=0, progress=None):
    """Write a random-weight GGUF model of a known shape; returns the number of parameters."""
    if shape not in SHAPES:
        raise ConfigError(f"--shape {shape!r}: one of {', '.join(SHAPES)}")
    if ftype not in MIXES:
        raise ConfigError(f"--type {ftype!r}: one of {', '.join(MIXES)}")
    s = SHAPES[shape]
    arch, E, F, L, V = s["arch"], s["n_embd"], s["n_ff"], s["n_layer"], s["n_vocab"]
    H, KV = s["n_head"], s["n_head_kv"]
    hd = E // H
    w = GGUFWriter()
    data = {}  # name -> bytes, written after the header in declaration order
    A = lambda k: Key.arch(k, arch)  # noqa: E731
    w.add(Key.ARCHITECTURE, arch)
    w.add(Key.NAME, f"edged-synth-{shape}-{ftype}")
    w.add(A(Key.CONTEXT_LENGTH), s["n_ctx_train"])
    w.add(A(Key.EMBEDDING_LENGTH), E)
    w.add(A(Key.BLOCK_COUNT), L)
    w.add(A(Key.FEED_FORWARD_LENGTH), F)
    w.add(A(Key.HEAD_COUNT), H)
    w.add(A(Key.HEAD_COUNT_KV), KV)
    w.add(A(Key.ROPE_FREQ_BASE), float(s["rope_freq_base"]))
    X = s.get("n_expert", 0)
    if X:
        w.add(A(Key.EXPERT_COUNT), X)
        w.add(A(Key.EXPERT_USED_COUNT), s["n_expert_used"])
        w.add(A(Key.EXPERT_FEED_FORWARD_LENGTH), s["n_ff_exp"])
    w.add(A(Key.LAYERNORM_RMS_EPS), float(s["rms_eps"]))
    toks, scores, types = synth_vocab(V)
    w.add(Key.TOKENIZER_MODEL, "llama")
    w.add(Key.TOKENS, toks)
    w.add(Key.SCORES, scores)
    w.add(Key.TOKEN_TYPE, types)
    w.add(Key.BOS_ID, 1)
    w.add(Key.EOS_ID, 2)
    w.add(Key.UNK_ID, 0)
    w.add(Key.ADD_BOS, True)
    rng = np.random.default_rng(seed)
    pool = _Pool(rng)
    n_params = 0

    def mat(name, role, n_in, n_out, il=0, n_mat=1):
        # n_mat > 1: a 3-D (n_in, n_out, n_mat) stack of experts
        nonlocal n_params
        t = tensor_type(role, n_in, ftype, il, L)
        w.add_tensor(name, (n_in, n_out, n_mat) if n_mat > 1 else (n_in, n_out), t)
        data[name] = pool.rows(t, n_in, n_out * n_mat)
        n_params += n_in * n_out * n_mat

    def vec(name, n, value=1.0):
        nonlocal n_params
        w.add_tensor(name, (n,), GGMLType.F32)
        data[name] = np.full(n, value, np.float32)
        n_params += n

    mat("token_embd.weight", "output" if s["tied"] else "token_embd", E, V)
    vec("output_norm.weight", E)
    if not s["tied"]:
        mat("output.weight", "output", E, V)
    for il in range(L):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", E)
        mat(p + "attn_q.weight", "attn_q", E, H * hd, il)
        mat(p + "attn_k.weight", "attn_k", E, KV * hd, il)
        mat(p + "attn_v.weight", "attn_v", E, KV * hd, il)
        if s["qkv_bias"]:
            vec(p + "attn_q.bias", H * hd, 0.0)
            vec(p + "attn_k.bias", KV * hd, 0.0)
            vec(p + "attn_v.bias", KV * hd, 0.0)
        if s.get("qk_norm"):
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        mat(p + "attn_output.weight", "attn_output", H * hd, E, il)
        vec(p + "ffn_norm.weight", E)
        if X:  # the router stays F32 (llama-quantize leaves ffn_gate_inp alone)
            w.add_tensor(p + "ffn_gate_inp.weight", (E, X), GGMLType.F32)
            data[p + "ffn_gate_inp.weight"] = rng.standard_normal((X, E), np.float32) * 0.05
            n_params += E * X
            Fe = s["n_ff_exp"]
            mat(p + "ffn_gate_exps.weight", "ffn_gate", E, Fe, il, X)
            mat(p + "ffn_up_exps.weight", "ffn_up", E, Fe, il, X)
            mat(p + "ffn_down_exps.weight", "ffn_down", Fe, E, il, X)
        else:
            mat(p + "ffn_gate.weight", "ffn_gate", E, F, il)
            mat(p + "ffn_up.weight", "ffn_up", E, F, il)
            mat(p + "ffn_down.weight", "ffn_down", F, E, il)
        if progress:
            progress(il + 1, L)
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        w.write_header(f)
        for name in w.tensor_names:
            w.write_tensor(f, name, data.pop(name))
    os.replace(tmp, out)
    return n_params

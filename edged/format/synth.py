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
    # gpt-oss-20b's layer layout (64-dim heads wider than n_embd, sinks, q/k/v/o biases, a
    # 128-token window on even layers, YaRN 32 over 4096, 32 experts with 4 used, router and
    # expert biases) scaled to 0.29B parameters, 4 of 32 experts per token
    "gpt-oss-mini": dict(arch="gpt-oss", n_embd=768, n_head=16, n_head_kv=4, head_dim=64,
                         n_ff=384, n_layer=8, n_vocab=32000, rope_freq_base=150000.0,
                         rms_eps=1e-5, n_ctx_train=131072, tied=False, qkv_bias=True,
                         n_expert=32, n_expert_used=4, n_ff_exp=384, gpt_oss=True, n_swa=128,
                         yarn=(32.0, 4096)),
    # LiquidAI LFM2-350M: gated short convolutions of 3 taps on 10 layers, grouped-query
    # attention with q/k norms on layers 2, 5, 8, 10, 12 and 14, tied embeddings
    "lfm2-350m": dict(arch="lfm2", n_embd=1024, n_head=16, n_head_kv=8, n_ff=4608, n_layer=16,
                      n_vocab=65536, rope_freq_base=1e6, rms_eps=1e-5, n_ctx_train=128000,
                      tied=True, qkv_bias=False, qk_norm=True, l_cache=3,
                      attn_layers=(2, 5, 8, 10, 12, 14)),
    # Google Gemma 4 E2B (text): 35 layers, every fifth full attention (head 512, proportional
    # RoPE on a quarter of it, base 1e6), the others sliding (window 512, head 256, base 1e4);
    # one KV head; the last 20 layers read layer 13's or 14's K/V and have a double-wide FFN;
    # per-layer embeddings 256 wide; tied embeddings; logits soft-capped at 30
    "gemma4-e2b": dict(arch="gemma4", n_embd=1536, n_head=8, n_head_kv=1, head_dim=256,
                       head_dim_full=512, n_ff=6144, n_layer=35, n_vocab=262144,
                       rope_freq_base=1e6, rope_freq_base_swa=1e4, rms_eps=1e-6,
                       n_ctx_train=131072, tied=True, qkv_bias=False, n_swa=512, full_every=5,
                       n_kv_shared=20, double_wide=True, n_embd_per_layer=256,
                       rotary_full=0.25, softcap=30.0),
    # Google Gemma 4 26B-A4B (text): 30 layers, every sixth full attention (head 512, 2 KV heads,
    # V = K: no attn_v), the others sliding (window 1024, head 256, 8 KV heads); in every layer
    # a dense FFN 2112 wide beside 128 routed experts 704 wide, 8 per token, gate|up fused;
    # tied embeddings. (llama.cpp 0.3.36 confirms 30 layers, 16 heads, 2 KV heads of 512 on the
    # full layers and the experts' 704; the other sizes are the published config.json's.)
    "gemma4-26b-a4b": dict(arch="gemma4", n_embd=2816, n_head=16, n_head_kv=8, n_head_kv_full=2,
                           head_dim=256, head_dim_full=512, n_ff=2112, n_layer=30,
                           n_vocab=262144, rope_freq_base=1e6, rope_freq_base_swa=1e4,
                           rms_eps=1e-6, n_ctx_train=262144, tied=True, qkv_bias=False,
                           n_swa=1024, full_every=6, n_kv_shared=0, double_wide=False,
                           n_embd_per_layer=0, rotary_full=0.25, softcap=30.0, k_eq_v=True,
                           n_expert=128, n_expert_used=8, n_ff_exp=704),
    # Google Gemma 3n E2B (text): 30 layers, every fifth global (window 512 elsewhere), 8 heads
    # of 256 with 2 KV heads; the last 10 layers read layer 18's or 19's K/V; AltUp's 4
    # streams, LAuReL of rank 64, per-layer inputs 256 wide, the FFN gate of the first 10
    # layers cut at its 0.95 quantile; tied embeddings; logits soft-capped at 30
    "gemma-3n-e2b": dict(arch="gemma3n", n_embd=2048, n_head=8, n_head_kv=2, head_dim=256,
                         n_ff=8192, n_layer=30, n_vocab=262144, rope_freq_base=1e6,
                         rope_freq_base_swa=1e4, rms_eps=1e-6, n_ctx_train=32768, tied=True,
                         qkv_bias=False, n_swa=512, full_every=5, n_kv_shared=10,
                         n_embd_per_layer=256, softcap=30.0, altup=4, laurel_rank=64,
                         sparse_layers=10),
    # IBM Granite-4.0-H-350M (its published config.json): Mamba-2 on 28 of 32 layers (48 heads
    # of 32, state 128, 1 group, 4 taps, conv bias), grouped-query attention without RoPE on
    # layers 10, 13, 17 and 27, granite's multipliers, a dense FFN, tied embeddings
    "granite-4.0-h-350m": dict(arch="granitehybrid", n_embd=768, n_head=12, n_head_kv=4,
                               n_ff=2048, n_layer=32, n_vocab=100352, rope_freq_base=10000.0,
                               rms_eps=1e-5, n_ctx_train=32768, tied=True, qkv_bias=False,
                               attn_layers=(10, 13, 17, 27),
                               mamba2=dict(d_conv=4, d_state=128, n_head=48, n_group=1),
                               granite=(12.0, 0.246, 0.015625, 3.0)),
    # Qwen3.5-0.8B (its config.json's text_config): Gated DeltaNet on 18 layers (16 key and 16
    # value heads of 128, a 4-tap convolution), gated attention with q/k norms on every fourth
    # (8 heads of 256, 2 KV heads, 64 of them rotated in interleaved M-RoPE sections 11/11/10),
    # the FFN norm stored as post_attention_norm, tied embeddings, a 248k vocabulary
    "qwen3.5-0.8b": dict(arch="qwen35", n_embd=1024, n_head=8, n_head_kv=2, head_dim=256,
                         n_ff=3584, n_layer=24, n_vocab=248320, rope_freq_base=1e7, rms_eps=1e-6,
                         n_ctx_train=262144, tied=True, qkv_bias=False, qk_norm=True, n_rot=64,
                         sections=(11, 11, 10, 0), attn_layers=(3, 7, 11, 15, 19, 23),
                         ssm=dict(d_conv=4, d_state=128, n_group=16, dt_rank=16)),
    # IBM Granite-4.0-H-Tiny (its published config.json): the 350M's Mamba-2 layers (48 heads,
    # now of 64, state 128, 1 group, 4 taps) on 36 of 40 layers, attention without RoPE on
    # layers 5, 15, 25 and 35, 12 heads of 128 with 4 KV heads; in every layer 64 experts of 512
    # (feed_forward_length), 6 per token, and an ungated shared expert of 1024; tied embeddings
    "granite-4.0-h-tiny": dict(arch="granitehybrid", n_embd=1536, n_head=12, n_head_kv=4,
                               n_ff=512, n_layer=40, n_vocab=100352, rope_freq_base=10000.0,
                               rms_eps=1e-5, n_ctx_train=131072, tied=True, qkv_bias=False,
                               attn_layers=(5, 15, 25, 35),
                               mamba2=dict(d_conv=4, d_state=128, n_head=48, n_group=1),
                               granite=(12.0, 0.22, 0.0078125, 6.0),
                               n_expert=64, n_expert_used=6, n_ff_exp=512, n_ff_shexp=1024),
    # Qwen3.5-35B-A3B (its config.json's text_config): Gated DeltaNet on 30 of 40 layers (16 key
    # and 32 value heads of 128), gated attention on every fourth (16 heads of 256, 2 KV heads,
    # 64 rotated); in every layer 256 experts of 512, 8 per token, and a gated shared expert of
    # 512; its own output matrix
    "qwen3.5-35b-a3b": dict(arch="qwen35moe", n_embd=2048, n_head=16, n_head_kv=2, head_dim=256,
                            n_ff=512, n_layer=40, n_vocab=248320, rope_freq_base=1e7,
                            rms_eps=1e-6, n_ctx_train=262144, tied=False, qkv_bias=False,
                            qk_norm=True, n_rot=64, sections=(11, 11, 10, 0),
                            attn_layers=tuple(range(3, 40, 4)),
                            ssm=dict(d_conv=4, d_state=128, n_group=16, dt_rank=32),
                            n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512),
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
    "IQ4_NL": (GGMLType.IQ4_NL, GGMLType.IQ4_NL, GGMLType.Q6_K),
    "IQ4_XS": (GGMLType.IQ4_XS, GGMLType.IQ4_XS, GGMLType.Q6_K),  # rows of 896 fall back to IQ4_NL
    # llama-quantize's MXFP4_MOE (gpt-oss as shipped): experts MXFP4, every other matrix Q8_0
    "MXFP4_MOE": (GGMLType.Q8_0, GGMLType.Q8_0, GGMLType.Q8_0),
}

# llama.cpp's fallbacks when a row length is not a multiple of the K-quant super-block
from .quantize import FALLBACK  # noqa: E402


def _more_bits(il, n_layer):
    # llama.cpp's use_more_bits: first and last eighth of the layers, and every third between
    return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2


def tensor_type(role, row_len, ftype, il=0, n_layer=1, expert=False):
    base, more, out = MIXES[ftype]
    if expert and ftype == "MXFP4_MOE":
        t = GGMLType.MXFP4
    elif role == "output":
        t = out
    elif role in ("attn_v", "ffn_down") and ftype.endswith("_M"):
        t = more if _more_bits(il, n_layer) else base
    else:
        t = base
    while row_len % TYPE_INFO[t].block_size:
        t = FALLBACK.get(t, GGMLType.F16)
    return t


def _fill(toks, types, pieces, n_vocab):
    """Append the new `pieces` (normal tokens), then "\u2581w0", "\u2581w1", ... up to n_vocab."""
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


def _write(w, data, out):
    """Header and tensors (in declaration order) to out, through a temporary file."""
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        w.write_header(f)
        for name in w.tensor_names:
            w.write_tensor(f, name, data.pop(name))
    os.replace(tmp, out)


def _header(shape, ftype, s):
    """A writer holding the keys every synthetic file starts with (decoders and encoders)."""
    w = GGUFWriter()
    A = lambda k: Key.arch(k, s["arch"])  # noqa: E731
    w.add(Key.ARCHITECTURE, s["arch"])
    w.add(Key.NAME, f"edged-synth-{shape}-{ftype}")
    w.add(A(Key.CONTEXT_LENGTH), s["n_ctx_train"])
    w.add(A(Key.EMBEDDING_LENGTH), s["n_embd"])
    w.add(A(Key.BLOCK_COUNT), s["n_layer"])
    w.add(A(Key.FEED_FORWARD_LENGTH), s["n_ff"])
    w.add(A(Key.HEAD_COUNT), s["n_head"])
    return w


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
    _fill(toks, types, pieces, n_vocab)
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


def synth(shape, ftype, out, seed=0, progress=None, n_layer=None):
    """Write a random-weight GGUF model of a known shape; returns the number of parameters.
    n_layer: only the shape's first n_layer layers (the real layer shapes and pattern, for a
    model too large to benchmark whole); None: all of them."""
    if shape not in SHAPES:
        raise ConfigError(f"--shape {shape!r}: one of {', '.join(SHAPES)}")
    if ftype not in MIXES:
        raise ConfigError(f"--type {ftype!r}: one of {', '.join(MIXES)}")
    s = SHAPES[shape]
    if n_layer is not None:
        if s.get("n_kv_shared"):   # its last layers read earlier layers' K/V: all or nothing
            raise ConfigError(f"--layers: {shape}'s last {s['n_kv_shared']} layers reuse "
                              "earlier layers' K/V; it is written whole only")
        if not 1 <= n_layer <= s["n_layer"]:
            raise ConfigError(f"--layers {n_layer}: 1 to {shape}'s {s['n_layer']}")
        s, shape = dict(s, n_layer=n_layer), f"{shape}-{n_layer}-layers"   # general.name says so
    if s["arch"] in ("gemma4", "gemma3n"):
        return _synth_gemma(shape, ftype, out, s, seed, progress)
    arch, E, F, L, V = s["arch"], s["n_embd"], s["n_ff"], s["n_layer"], s["n_vocab"]
    H, KV = s["n_head"], s["n_head_kv"]
    hd = s.get("head_dim", E // H)
    oss = s.get("gpt_oss", False)
    w = _header(shape, ftype, s)
    data = {}  # name -> bytes, written after the header in declaration order
    A = lambda k: Key.arch(k, arch)  # noqa: E731
    attn_layers = s.get("attn_layers", range(L))      # lfm2: the others are convolutions
    mamba = s.get("mamba2")         # granitehybrid: the others are Mamba-2 layers
    if "l_cache" in s or mamba:     # a KV head count per layer, 0 on the other layers
        w.add(A(Key.HEAD_COUNT_KV), np.array([KV if il in attn_layers else 0 for il in range(L)], np.uint32))
    if "l_cache" in s:
        w.add(A(Key.SHORTCONV_L_CACHE), s["l_cache"])
    if mamba:
        DI = 2 * E                  # ssm.inner_size (llama.cpp's only expansion)
        CH = DI + 2 * mamba["n_group"] * mamba["d_state"]
        for k, v in ((Key.SSM_CONV_KERNEL, mamba["d_conv"]), (Key.SSM_INNER_SIZE, DI),
                     (Key.SSM_STATE_SIZE, mamba["d_state"]), (Key.SSM_TIME_STEP_RANK, mamba["n_head"]),
                     (Key.SSM_GROUP_COUNT, mamba["n_group"])):
            w.add(A(k), v)
    if "granite" in s:              # embedding, residual, attention multipliers, logit scale
        for k, v in zip((Key.EMBEDDING_SCALE, Key.RESIDUAL_SCALE, Key.ATTENTION_SCALE,
                         Key.LOGIT_SCALE), s["granite"]):
            w.add(A(k), float(v))
        w.add(A(Key.ROPE_SCALING_FINETUNED), False)   # Granite 4: no RoPE
    if "l_cache" not in s and not mamba:
        w.add(A(Key.HEAD_COUNT_KV), KV)
    ssm = s.get("ssm")              # qwen35: Gated DeltaNet on the layers not in attn_layers
    if ssm:
        w.add(A(Key.SSM_CONV_KERNEL), ssm["d_conv"])
        w.add(A(Key.SSM_STATE_SIZE), ssm["d_state"])
        w.add(A(Key.SSM_GROUP_COUNT), ssm["n_group"])
        w.add(A(Key.SSM_TIME_STEP_RANK), ssm["dt_rank"])
        w.add(A(Key.SSM_INNER_SIZE), ssm["d_state"] * ssm["dt_rank"])
        w.add(A(Key.FULL_ATTENTION_INTERVAL), 4)
        w.add(A(Key.ROPE_DIMENSION_SECTIONS), np.array(s["sections"], np.int32))
        w.add(A(Key.ROPE_DIMENSION_COUNT), s["n_rot"])
    w.add(A(Key.ROPE_FREQ_BASE), float(s["rope_freq_base"]))
    if hd != E // H:
        w.add(A(Key.KEY_LENGTH), hd)
        w.add(A(Key.VALUE_LENGTH), hd)
    if "n_swa" in s:
        w.add(A(Key.SLIDING_WINDOW), s["n_swa"])
    if "yarn" in s:
        w.add(A(Key.ROPE_SCALING_TYPE), "yarn")
        w.add(A(Key.ROPE_SCALING_FACTOR), float(s["yarn"][0]))
        w.add(A(Key.ROPE_SCALING_ORIG_CTX_LEN), s["yarn"][1])
    X = s.get("n_expert", 0)
    if X:
        w.add(A(Key.EXPERT_COUNT), X)
        w.add(A(Key.EXPERT_USED_COUNT), s["n_expert_used"])
        if not mamba:               # granite's experts are feed_forward_length wide
            w.add(A(Key.EXPERT_FEED_FORWARD_LENGTH), s["n_ff_exp"])
    Fs = s.get("n_ff_shexp", 0)     # a shared expert beside the routed ones
    if Fs:
        w.add(A(Key.EXPERT_SHARED_FEED_FORWARD_LENGTH), Fs)
    w.add(A(Key.LAYERNORM_RMS_EPS), float(s["rms_eps"]))
    toks, scores, types = synth_vocab(V)
    for i, (text, kind) in enumerate(s.get("extra_tokens", ()), V - len(s.get("extra_tokens", ()))):
        toks[i], scores[i], types[i] = text, 0.0, kind      # e.g. a projector's markers (type 4)
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
        t = tensor_type(role, n_in, ftype, il, L, expert=n_mat > 1)
        w.add_tensor(name, (n_in, n_out, n_mat) if n_mat > 1 else (n_in, n_out), t)
        data[name] = pool.rows(t, n_in, n_out * n_mat)
        n_params += n_in * n_out * n_mat

    def vec(name, n, value=1.0, rows=1):
        nonlocal n_params
        w.add_tensor(name, (n, rows) if rows > 1 else (n,), GGMLType.F32)
        data[name] = np.full(n * rows, value, np.float32)
        n_params += n * rows

    def taps(name, k, n):
        # a depthwise convolution's k taps per channel, F32 as llama.cpp keeps them
        nonlocal n_params
        w.add_tensor(name, (k, n), GGMLType.F32)
        data[name] = rng.standard_normal(k * n, np.float32) * 0.3
        n_params += k * n

    def ffn(p, il):
        # a dense FFN, or the router (F32: llama-quantize leaves ffn_gate_inp alone), the
        # routed experts and a shared expert (gated by a sigmoid but for granite's)
        if not X:
            mat(p + "ffn_gate.weight", "ffn_gate", E, F, il)
            mat(p + "ffn_up.weight", "ffn_up", E, F, il)
            mat(p + "ffn_down.weight", "ffn_down", F, E, il)
            return
        nonlocal n_params
        w.add_tensor(p + "ffn_gate_inp.weight", (E, X), GGMLType.F32)
        data[p + "ffn_gate_inp.weight"] = rng.standard_normal((X, E), np.float32) * 0.05
        n_params += E * X
        Fe = s["n_ff_exp"]
        mat(p + "ffn_gate_exps.weight", "ffn_gate", E, Fe, il, X)
        mat(p + "ffn_up_exps.weight", "ffn_up", E, Fe, il, X)
        mat(p + "ffn_down_exps.weight", "ffn_down", Fe, E, il, X)
        if oss:
            vec(p + "ffn_gate_inp.bias", X, 0.0)
            vec(p + "ffn_gate_exps.bias", Fe, 0.0, rows=X)
            vec(p + "ffn_up_exps.bias", Fe, 0.0, rows=X)
            vec(p + "ffn_down_exps.bias", E, 0.0, rows=X)
        if Fs:
            if not mamba:   # random: a gate logit of exactly 0 is 0 / 0 in llama.cpp's qwen2moe
                w.add_tensor(p + "ffn_gate_inp_shexp.weight", (E,), GGMLType.F32)
                data[p + "ffn_gate_inp_shexp.weight"] = rng.standard_normal(E, np.float32) * 0.05
                n_params += E
            mat(p + "ffn_gate_shexp.weight", "ffn_gate", E, Fs, il)
            mat(p + "ffn_up_shexp.weight", "ffn_up", E, Fs, il)
            mat(p + "ffn_down_shexp.weight", "ffn_down", Fs, E, il)

    mat("token_embd.weight", "output" if s["tied"] else "token_embd", E, V)
    vec("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight", E)
    if not s["tied"]:
        mat("output.weight", "output", E, V)
    for il in range(L):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", E)
        if il not in attn_layers:
            if mamba:   # a Mamba-2 layer; its vectors stay F32
                SH, G = mamba["n_head"], mamba["n_group"]
                mat(p + "ssm_in.weight", "attn_q", E, DI + CH + SH, il)
                taps(p + "ssm_conv1d.weight", mamba["d_conv"], CH)
                vec(p + "ssm_conv1d.bias", CH, 0.0)
                vec(p + "ssm_dt.bias", SH, -2.0)
                vec(p + "ssm_a", 1, -1.0, rows=SH)
                vec(p + "ssm_d", 1, 1.0, rows=SH)
                # (d_inner / G, G) even for one group, as the converter writes it
                w.add_tensor(p + "ssm_norm.weight", (DI // G, G), GGMLType.F32)
                data[p + "ssm_norm.weight"] = np.ones(DI, np.float32)
                n_params += DI
                mat(p + "ssm_out.weight", "attn_output", DI, E, il)
            elif ssm:   # a Gated DeltaNet layer; its vectors stay F32
                Sd, Hk, Hv = ssm["d_state"], ssm["n_group"], ssm["dt_rank"]
                C = Sd * (2 * Hk + Hv)
                mat(p + "attn_qkv.weight", "attn_q", E, C, il)
                mat(p + "attn_gate.weight", "attn_q", E, Sd * Hv, il)
                taps(p + "ssm_conv1d.weight", ssm["d_conv"], C)
                vec(p + "ssm_dt.bias", Hv, 0.0)
                vec(p + "ssm_a", Hv, -1.0)           # -exp(A_log)
                mat(p + "ssm_beta.weight", "attn_q", E, Hv, il)
                mat(p + "ssm_alpha.weight", "attn_q", E, Hv, il)
                vec(p + "ssm_norm.weight", Sd)
                mat(p + "ssm_out.weight", "attn_output", Sd * Hv, E, il)
            else:       # a gated short convolution
                mat(p + "shortconv.in_proj.weight", "attn_q", E, 3 * E, il)
                taps(p + "shortconv.conv.weight", s["l_cache"], E)
                mat(p + "shortconv.out_proj.weight", "attn_output", E, E, il)
            vec(p + ("post_attention_norm.weight" if ssm else "ffn_norm.weight"), E)
            ffn(p, il)
            if progress:
                progress(il + 1, L)
            continue
        mat(p + "attn_q.weight", "attn_q", E, (2 if ssm else 1) * H * hd, il)  # qwen35: q | gate
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
        if oss:  # the output bias, a sink logit per head; the FFN norm's gpt-oss name
            vec(p + "attn_output.bias", E, 0.0)
            vec(p + "attn_sinks.weight", H, 0.0)
        vec(p + ("post_attention_norm.weight" if oss or ssm else "ffn_norm.weight"), E)
        ffn(p, il)
        if progress:
            progress(il + 1, L)
    _write(w, data, out)
    return n_params


def _synth_gemma(shape, ftype, out, s, seed, progress):
    """A gemma4 file as llama.cpp's converter writes one (conversion/gemma.py, Gemma4Model):
    per-layer arrays of KV heads and FFN widths, the sliding pattern as booleans, the full
    layers' head size as key_length and the sliding one's as key_length_swa, rope_freqs of 1
    for the rotated quarter and 1e30 for the rest; with experts (26B-A4B) the router, its scale,
    the fused gate|up and down experts, their output scales and the three extra norms. Or a gemma3n one (Gemma3NModel):
    one head size, K/V tensors in every layer (llama.cpp ignores the shared layers'), the AltUp
    and per-layer input keys, and the tensors llama-quantize leaves alone (altup*, laurel*,
    per_layer_model_proj) in F16, AltUp's router and coefficients in F32."""
    arch, E, L, V, H = s["arch"], s["n_embd"], s["n_layer"], s["n_vocab"], s["n_head"]
    g3n = arch == "gemma3n"
    D, P = s["head_dim"], s["n_embd_per_layer"]
    Df = D if g3n else s["head_dim_full"]
    swa = [(il + 1) % s["full_every"] != 0 for il in range(L)]
    n_kv = L - s["n_kv_shared"]
    ff = [s["n_ff"] * (2 if s.get("double_wide") and il >= n_kv else 1) for il in range(L)]
    kv_heads = [s["n_head_kv"] if swa[il] else s.get("n_head_kv_full", s["n_head_kv"])
                for il in range(L)]
    X, Fe = s.get("n_expert", 0), s.get("n_ff_exp", 0)
    w = _header(shape, ftype, s)
    A = lambda k: Key.arch(k, arch)  # noqa: E731
    if g3n:
        w.add(A(Key.HEAD_COUNT_KV), s["n_head_kv"])
        for k, v in ((Key.ALTUP_ACTIVE_IDX, 0), (Key.ALTUP_NUM_INPUTS, s["altup"])):
            w.add(A(k), v)
        w.add(A(Key.ACTIVATION_SPARSITY_SCALE), np.array(
            [1.6448533535003662] * s["sparse_layers"] + [-np.inf] * (L - s["sparse_layers"]),
            np.float32))   # the converter's icdf(0.95) and icdf(0)
    else:
        w.add(A(Key.FEED_FORWARD_LENGTH), np.array(ff, np.uint32))
        w.add(A(Key.HEAD_COUNT_KV), np.array(kv_heads, np.uint32))
        if X:
            for k, v in ((Key.EXPERT_COUNT, X), (Key.EXPERT_USED_COUNT, s["n_expert_used"]),
                         (Key.EXPERT_FEED_FORWARD_LENGTH, Fe)):
                w.add(A(k), v)
        for k, v in ((Key.KEY_LENGTH_SWA, D), (Key.VALUE_LENGTH_SWA, D),
                     (Key.ROPE_DIMENSION_COUNT_SWA, D)):
            w.add(A(k), v)
    for k, v in ((Key.KEY_LENGTH, Df), (Key.VALUE_LENGTH, Df), (Key.ROPE_DIMENSION_COUNT, Df),
                 (Key.SLIDING_WINDOW, s["n_swa"]), (Key.SHARED_KV_LAYERS, s["n_kv_shared"]),
                 (Key.EMBD_LENGTH_PER_LAYER_INP, P)):
        w.add(A(k), v)
    w.add(A(Key.SLIDING_WINDOW_PATTERN), np.array(swa, np.bool_))
    w.add(A(Key.ROPE_FREQ_BASE), float(s["rope_freq_base"]))
    w.add(A(Key.ROPE_FREQ_BASE_SWA), float(s["rope_freq_base_swa"]))
    w.add(A(Key.LAYERNORM_RMS_EPS), float(s["rms_eps"]))
    w.add(A(Key.FINAL_LOGIT_SOFTCAPPING), float(s["softcap"]))
    toks, scores, types = synth_vocab(V)
    for k, v in ((Key.TOKENIZER_MODEL, "llama"), (Key.TOKENS, toks), (Key.SCORES, scores),
                 (Key.TOKEN_TYPE, types), (Key.BOS_ID, 1), (Key.EOS_ID, 2), (Key.UNK_ID, 0),
                 (Key.ADD_BOS, True)):
        w.add(k, v)
    pool = _Pool(np.random.default_rng(seed))
    data, n_params = {}, 0
    # gemma3n scales q.k by 1 (llama.cpp's f_attention_scale), so 1/sqrt(head_dim) goes into
    # the q and k norms, and its sandwich norms (after attention, LAuReL, the FFN and the
    # per-layer input) are 0.1: a layer adds a small update to the residual stream, as in a
    # trained model. With all norms 1 the random net is chaotic under Q8 activations (llama.cpp's
    # own logits move by up to 3.9 between a batched prompt and token by token: docs/models.md).
    # gemma4 scales q.k by 1 too: its q/k norms carry 1/sqrt of each layer's head size, and
    # its router scale is 10, so the top 8 of 128 experts are not picked among near ties
    post_norm = 0.1 if g3n else 1.0

    # llama-quantize's use_more_bits for attn_v counts the attn_v tensors, not the layers
    v_layers = [il for il in range(L) if (il < n_kv or g3n) and (swa[il] or not s.get("k_eq_v"))]
    n_v = len(v_layers)

    def mat(name, role, n_in, n_out, il=0, n_mat=1, n_of=L):
        # n_mat > 1: a 3-D (n_in, n_out, n_mat) stack of experts; il of n_of for use_more_bits
        nonlocal n_params
        t = tensor_type(role, n_in, ftype, il, n_of, expert=n_mat > 1)
        w.add_tensor(name, (n_in, n_out, n_mat) if n_mat > 1 else (n_in, n_out), t)
        data[name] = pool.rows(t, n_in, n_out * n_mat)
        n_params += n_in * n_out * n_mat

    def vec(name, values):
        nonlocal n_params
        values = np.asarray(values, np.float32)
        w.add_tensor(name, (len(values),), GGMLType.F32)
        data[name] = values
        n_params += len(values)

    def unquantized(name, n_in, n_out, n_mat=1, t=GGMLType.F16):
        # AltUp / LAuReL (gemma3n), per_layer_model_proj: llama-quantize leaves them
        nonlocal n_params
        w.add_tensor(name, (n_in, n_out, n_mat) if n_mat > 1 else (n_in, n_out), t)
        data[name] = pool.rows(t, n_in, n_out * n_mat)
        n_params += n_in * n_out * n_mat

    mat("token_embd.weight", "output", E, V)
    vec("output_norm.weight", np.ones(E))
    if g3n:
        unquantized("altup_proj.weight", E, E, s["altup"] - 1)
        unquantized("altup_unembd_proj.weight", E, E, s["altup"] - 1)
    elif not all(swa):   # only full layers read it; llama.cpp refuses a file with a tensor unread
        n_rot = int(Df * s["rotary_full"] / 2)
        vec("rope_freqs.weight", [1.0] * n_rot + [1e30] * (Df // 2 - n_rot))
    if P:
        # llama-quantize gives it the output type when embeddings are tied, as token_embd
        mat("per_layer_token_embd.weight", "output" if s["tied"] else "token_embd", P * L, V)
        unquantized("per_layer_model_proj.weight", E, P * L)   # llama-quantize leaves it
        vec("per_layer_proj_norm.weight", np.ones(P))
    for il in range(L):
        p, hd, kv = f"blk.{il}.", D if swa[il] else Df, kv_heads[il]
        vec(p + "attn_norm.weight", np.ones(E))
        mat(p + "attn_q.weight", "attn_q", E, H * hd, il)
        vec(p + "attn_q_norm.weight", np.full(hd, hd ** -0.25))
        if g3n:
            na, r = s["altup"], s["laurel_rank"]
            unquantized(p + "altup_router.weight", E, na, t=GGMLType.F32)
            vec(p + "altup_router_norm.weight", np.ones(E))
            unquantized(p + "altup_predict_coef.weight", na, na * na, t=GGMLType.F32)
            unquantized(p + "altup_correct_coef.weight", na, na, t=GGMLType.F32)
            vec(p + "altup_correct_scale.weight", np.ones(E))
            unquantized(p + "laurel_l.weight", E, r)
            unquantized(p + "laurel_r.weight", r, E)
            vec(p + "laurel_post_norm.weight", np.full(E, post_norm))
        if il < n_kv or g3n:
            mat(p + "attn_k.weight", "attn_k", E, kv * hd, il)
            if il in v_layers:
                mat(p + "attn_v.weight", "attn_v", E, kv * hd, v_layers.index(il), n_of=n_v)
            vec(p + "attn_k_norm.weight", np.full(hd, hd ** -0.25))
        mat(p + "attn_output.weight", "attn_output", H * hd, E, il)
        vec(p + "post_attention_norm.weight", np.full(E, post_norm))
        vec(p + "ffn_norm.weight", np.ones(E))
        mat(p + "ffn_gate.weight", "ffn_gate", E, ff[il], il)
        mat(p + "ffn_up.weight", "ffn_up", E, ff[il], il)
        mat(p + "ffn_down.weight", "ffn_down", ff[il], E, il)
        vec(p + "post_ffw_norm.weight", np.full(E, post_norm))
        if X:  # the router stays F32 (llama-quantize leaves ffn_gate_inp alone)
            w.add_tensor(p + "ffn_gate_inp.weight", (E, X), GGMLType.F32)
            data[p + "ffn_gate_inp.weight"] = pool.rng.standard_normal((X, E), np.float32)
            n_params += E * X
            vec(p + "ffn_gate_inp.scale", np.full(E, 10.0))
            for name, n in (("pre_ffw_norm_2.weight", E), ("post_ffw_norm_1.weight", E),
                            ("post_ffw_norm_2.weight", E), ("ffn_down_exps.scale", X)):
                vec(p + name, np.ones(n))
            mat(p + "ffn_gate_up_exps.weight", "ffn_up", E, 2 * Fe, il, X)
            mat(p + "ffn_down_exps.weight", "ffn_down", Fe, E, il, X)
        if P:
            mat(p + "inp_gate.weight", "attn_q", E, P, il)
            mat(p + "proj.weight", "attn_output", P, E, il)
            vec(p + "post_norm.weight", np.full(E, post_norm))
        if not g3n:
            vec(p + "layer_output_scale.weight", [1.0])
        if progress:
            progress(il + 1, L)
    _write(w, data, out)
    return n_params


# BERT-family encoders (engine/encoder.py): shapes of real embedding models
ENCODER_SHAPES = {
    "bert-base": dict(arch="bert", n_embd=768, n_head=12, n_ff=3072, n_layer=12, n_vocab=30522,
                      n_ctx_train=512, pooling=2),
    "bge-small": dict(arch="bert", n_embd=384, n_head=12, n_ff=1536, n_layer=12, n_vocab=30522,
                      n_ctx_train=512, pooling=2),
    "minilm-l6": dict(arch="bert", n_embd=384, n_head=12, n_ff=1536, n_layer=6, n_vocab=30522,
                      n_ctx_train=512, pooling=1),    # all-MiniLM-L6-v2
    "nomic-embed-text": dict(arch="nomic-bert", n_embd=768, n_head=12, n_ff=3072, n_layer=12,
                             n_vocab=30522, n_ctx_train=2048, pooling=1),
    # small ones for tests and goldens
    "bert-tiny": dict(arch="bert", n_embd=32, n_head=4, n_ff=64, n_layer=2, n_vocab=512,
                      n_ctx_train=128, pooling=1),
    "nomic-bert-tiny": dict(arch="nomic-bert", n_embd=32, n_head=4, n_ff=48, n_layer=2,
                            n_vocab=512, n_ctx_train=2048, pooling=1),
}


def synth_wordpiece_vocab(n_vocab):
    """A WordPiece vocabulary as llama.cpp's converter writes one: [PAD] [UNK] [CLS] [SEP]
    [MASK], then characters and pairs as word starts ("\u2581a") and continuations ("a")."""
    toks, types = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], [3, 3, 3, 3, 3]
    chars = [chr(c) for c in range(33, 127) if not chr(c).isupper()]
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces = ["\u2581" + c for c in chars] + chars
    pieces += ["\u2581" + a + b for a in letters for b in letters] + [a + b for a in letters for b in letters]
    _fill(toks, types, pieces, n_vocab)
    return toks, np.array(types, np.int32), dict(unk=1, cls=2, sep=3, pad=0, mask=4)


def synth_encoder(shape, ftype, out, seed=0, vocab=None, pooling=None):
    """Write a random-weight BERT / nomic-bert GGUF (engine/encoder.py's tensors, llama.cpp's
    names); vocab: (tokens, token types, special ids) to use instead of a synthetic one;
    pooling: the `<arch>.pooling_type` to write (default: the shape's). Returns parameters."""
    if shape not in ENCODER_SHAPES:
        raise ConfigError(f"--shape {shape!r}: one of {', '.join(ENCODER_SHAPES)}")
    if ftype not in ("F32", "F16", "Q8_0"):
        raise ConfigError(f"--type {ftype!r} for an encoder: F32, F16 or Q8_0")
    s = ENCODER_SHAPES[shape]
    arch, E, F, L, H = s["arch"], s["n_embd"], s["n_ff"], s["n_layer"], s["n_head"]
    toks, types, special = vocab or synth_wordpiece_vocab(s["n_vocab"])
    V = len(toks)
    w = _header(shape, ftype, s)
    data = {}
    A = lambda k: Key.arch(k, arch)  # noqa: E731
    w.add(A(Key.LAYERNORM_EPS), 1e-12)
    w.add(A(Key.CAUSAL), False)
    w.add(A(Key.POOLING_TYPE), int(s["pooling"] if pooling is None else pooling))
    if arch == "nomic-bert":
        w.add(A(Key.ROPE_FREQ_BASE), 1000.0)
    w.add(Key.TOKEN_TYPE_COUNT, 2)
    w.add(Key.TOKENIZER_MODEL, "bert")
    w.add(Key.TOKENS, list(toks))
    w.add(Key.TOKEN_TYPE, np.asarray(types, np.int32))
    w.add(Key.UNK_ID, special["unk"])
    w.add(Key.BOS_ID, special["cls"])
    w.add(Key.SEP_ID, special["sep"])
    w.add(Key.PAD_ID, special["pad"])
    w.add(Key.MASK_ID, special["mask"])
    rng = np.random.default_rng(seed)
    n_params = 0
    mtype = MIXES[ftype][0]

    def mat(name, n_in, n_out, scale=0.08, t=None):
        nonlocal n_params
        from .quants import quantize
        t = mtype if t is None else t
        x = rng.standard_normal((n_out, n_in), dtype=np.float32) * scale
        w.add_tensor(name, (n_in, n_out), t)
        data[name] = x if t == GGMLType.F32 else np.asarray(quantize(x, t))
        n_params += n_in * n_out

    def vec(name, n, center=0.0, scale=0.05):
        nonlocal n_params
        w.add_tensor(name, (n,), GGMLType.F32)
        data[name] = (center + rng.standard_normal(n) * scale).astype(np.float32)
        n_params += n

    mat("token_embd.weight", E, V, 0.5, GGMLType.F16 if ftype != "F32" else GGMLType.F32)
    mat("token_types.weight", E, 2, 0.5, GGMLType.F32)
    if arch == "bert":
        mat("position_embd.weight", E, s["n_ctx_train"], 0.5, GGMLType.F32)
    vec("token_embd_norm.weight", E, 1.0)
    vec("token_embd_norm.bias", E)
    for il in range(L):
        p = f"blk.{il}."
        if arch == "nomic-bert":
            mat(p + "attn_qkv.weight", E, 3 * E)
        else:
            for r in ("attn_q", "attn_k", "attn_v"):
                mat(p + r + ".weight", E, E)
                vec(p + r + ".bias", E)
        mat(p + "attn_output.weight", E, E)
        if arch == "bert":
            vec(p + "attn_output.bias", E)
        vec(p + "attn_output_norm.weight", E, 1.0)
        vec(p + "attn_output_norm.bias", E)
        if arch == "nomic-bert":
            mat(p + "ffn_gate.weight", E, F)
        mat(p + "ffn_up.weight", E, F)
        mat(p + "ffn_down.weight", F, E)
        if arch == "bert":
            vec(p + "ffn_up.bias", F)
            vec(p + "ffn_down.bias", E)
        vec(p + "layer_output_norm.weight", E, 1.0)
        vec(p + "layer_output_norm.bias", E)
    _write(w, data, out)
    return n_params


MMPROJ_SHAPES = {
    # llama.cpp's mmproj files (general.architecture = clip): the ViT and the projector
    "gemma3": dict(projector="gemma3", n_embd=1152, n_ff=4304, n_layer=27, n_head=16,
                   image_size=896, patch_size=14, n_merge=4, n_embd_text=2560),  # gemma-3-4b
    # small, for tests and goldens: 16 x 16 patches pooled 4 x 4 into 16 tokens, rows of 256
    # (tests/data/goldens' synthetic gemma3 text model's width)
    "gemma3-tiny": dict(projector="gemma3", n_embd=64, n_ff=96, n_layer=2, n_head=4,
                        image_size=112, patch_size=7, n_merge=4, n_embd_text=256),
    "smolvlm": dict(projector="idefics3", n_embd=768, n_ff=3072, n_layer=12, n_head=12,
                    image_size=512, patch_size=16, n_merge=4, n_embd_text=576,
                    longest_edge=1536),                      # SmolVLM-256M-Instruct
    # 8 x 8 patches per tile shuffled 2 x 2 into 16 tokens; up to 2 x 2 tiles and an overview
    "llava-1.5": dict(projector="mlp", n_embd=1024, n_ff=4096, n_layer=23, n_head=16,
                      image_size=336, patch_size=14, n_merge=1, n_embd_text=4096,
                      n_mid=4096),                            # llava-v1.5-7b
    # CLIP with a class token, 4 x 4 patches -> 16 tokens through a 2-layer MLP
    "llava-tiny": dict(projector="mlp", n_embd=64, n_ff=96, n_layer=3, n_head=4,
                       image_size=28, patch_size=7, n_merge=1, n_embd_text=256, n_mid=128),
    "idefics3-tiny": dict(projector="idefics3", n_embd=64, n_ff=96, n_layer=2, n_head=4,
                          image_size=32, patch_size=4, n_merge=2, n_embd_text=256,
                          longest_edge=64),
}


def synth_mmproj(shape, out, ftype="F16", seed=0):
    """Write a random-weight mmproj GGUF (engine/vision.py's tensors, llama.cpp's names and
    keys) of an MMPROJ_SHAPES shape; matrices in F16 (as llama.cpp's converter writes them) or
    F32. Returns the number of parameters."""
    if shape not in MMPROJ_SHAPES:
        raise ConfigError(f"--mmproj {shape!r}: one of {', '.join(MMPROJ_SHAPES)}")
    if ftype not in ("F32", "F16"):
        raise ConfigError(f"--type {ftype!r} for an mmproj: F32 or F16")
    s = MMPROJ_SHAPES[shape]
    E, F, L, p = s["n_embd"], s["n_ff"], s["n_layer"], s["patch_size"]
    n_pos = (s["image_size"] // p) ** 2 + (s["projector"] == "mlp")
    w = GGUFWriter()
    w.add(Key.ARCHITECTURE, "clip")
    w.add(Key.NAME, f"edged-synth-mmproj-{shape}-{ftype}")
    w.add(Key.CLIP_PROJECTOR_TYPE, s["projector"])
    w.add(Key.CLIP_HAS_VISION, True)
    clip = s["projector"] == "mlp"        # CLIP ViT (quick GELU, class token, pre-norm)
    w.add(Key.CLIP_USE_GELU, not clip)
    w.add(Key.CLIP_EMBEDDING_LENGTH, E)
    w.add(Key.CLIP_FEED_FORWARD_LENGTH, F)
    w.add(Key.CLIP_BLOCK_COUNT, L)
    w.add(Key.CLIP_PROJECTION_DIM, s["n_embd_text"])
    w.add(Key.CLIP_HEAD_COUNT, s["n_head"])
    w.add(Key.CLIP_LAYERNORM_EPS, 1e-6)
    w.add(Key.CLIP_IMAGE_SIZE, s["image_size"])
    w.add(Key.CLIP_PATCH_SIZE, p)
    mean, std = ([0.4815, 0.4578, 0.4082], [0.2686, 0.2613, 0.2758]) if clip else \
        ([0.5] * 3, [0.5] * 3)
    w.add(Key.CLIP_IMAGE_MEAN, mean, ValueType.ARRAY, ValueType.FLOAT32)
    w.add(Key.CLIP_IMAGE_STD, std, ValueType.ARRAY, ValueType.FLOAT32)
    if not clip:
        w.add(Key.CLIP_SCALE_FACTOR, s["n_merge"])
    if "longest_edge" in s:
        w.add(Key.CLIP_PREPROC_IMAGE_SIZE, s["longest_edge"])
    rng = np.random.default_rng(seed)
    mtype = GGMLType.F16 if ftype == "F16" else GGMLType.F32
    data, n_params = {}, 0

    def tensor(name, shape, scale, center=0.0, t=GGMLType.F32):
        nonlocal n_params
        x = (center + rng.standard_normal(tuple(reversed(shape)), dtype=np.float32) * scale)
        w.add_tensor(name, shape, t)
        data[name] = x.astype(np.float16 if t == GGMLType.F16 else np.float32)
        n_params += x.size

    tensor("v.patch_embd.weight", (p, p, 3, E), 1.0 / p, t=mtype)
    tensor("v.patch_embd.bias", (E,), 0.05)
    tensor("v.position_embd.weight", (E, n_pos), 0.3)   # ggml adds F32 only
    if clip:
        tensor("v.class_embd", (E,), 0.3)
        tensor("v.pre_ln.weight", (E,), 0.1, 1.0)
        tensor("v.pre_ln.bias", (E,), 0.05)
    for il in range(L):
        b = f"v.blk.{il}."
        for r in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensor(b + r + ".weight", (E, E), 1.0 / np.sqrt(E), t=mtype)
            tensor(b + r + ".bias", (E,), 0.05)
        for r in ("ln1", "ln2"):
            tensor(b + r + ".weight", (E,), 0.1, 1.0)
            tensor(b + r + ".bias", (E,), 0.05)
        tensor(b + "ffn_up.weight", (E, F), 1.0 / np.sqrt(E), t=mtype)
        tensor(b + "ffn_up.bias", (F,), 0.05)
        tensor(b + "ffn_down.weight", (F, E), 1.0 / np.sqrt(F), t=mtype)
        tensor(b + "ffn_down.bias", (E,), 0.05)
    if not clip:
        tensor("v.post_ln.weight", (E,), 0.1, 1.0)
        tensor("v.post_ln.bias", (E,), 0.05)
    if clip:
        tensor("mm.0.weight", (E, s["n_mid"]), 1.0 / np.sqrt(E), t=mtype)
        tensor("mm.0.bias", (s["n_mid"],), 0.05)
        tensor("mm.2.weight", (s["n_mid"], s["n_embd_text"]), 1.0 / np.sqrt(s["n_mid"]), t=mtype)
        tensor("mm.2.bias", (s["n_embd_text"],), 0.05)
    elif s["projector"] == "idefics3":
        k = E * s["n_merge"] ** 2
        tensor("mm.model.fc.weight", (k, s["n_embd_text"]), 1.0 / np.sqrt(k), t=mtype)
    else:
        tensor("mm.soft_emb_norm.weight", (E,), 0.1, 1.0)
        tensor("mm.input_projection.weight", (s["n_embd_text"], E), 1.0 / np.sqrt(E), t=mtype)
    _write(w, data, out)
    return n_params

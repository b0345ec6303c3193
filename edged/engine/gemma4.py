"""Gemma 4 (text, dense and mixture-of-experts): hyperparameters and tensors as llama.cpp reads them
(src/models/gemma4.cpp, llama-model.cpp, llama-hparams.cpp), and a NumPy reference forward pass.

What sets it apart from Gemma 3, all per layer:
- sliding layers (`attention.sliding_window_pattern`, a bool per layer) have their own head
  size and rotary size (`attention.key_length_swa`, `rope.dimension_count_swa`) and RoPE base
  (`rope.freq_base_swa`); full layers use `attention.key_length`, `rope.dimension_count`,
  `rope.freq_base` and the per-dimension factors `rope_freqs` ("proportional" RoPE);
- `attention.head_count_kv` and `feed_forward_length` may be arrays (one value per layer);
- the last `attention.shared_kv_layers` layers have no K/V of their own: a sliding one reads
  the KV cache of layer n_kv - 2, a full one that of layer n_kv - 1 (n_kv = n_layer - shared);
- V is RMS-normed without a weight, q and k with theirs; a layer without attn_v uses K's
  projection as V; attention is not scaled (scale 1);
- per-layer embeddings (`embedding_length_per_layer_input` P > 0, the E2B/E4B models): each
  layer adds proj(gelu(inp_gate(x)) * e_il) after its FFN, where e = (rms_norm(x0 Wp / sqrt(E))
  + per_layer_token_embd[token] * sqrt(P)) / sqrt(2), split into n_layer slices of P;
- `layer_output_scale` (one value) multiplies each layer's output; the logits are soft-capped;
- mixture-of-experts files (26B-A4B: `expert_count`, `expert_used_count`,
  `expert_feed_forward_length`) keep the dense FFN as a shared expert beside the routed ones:
  mlp = post_ffw_norm_1(FFN(ffn_norm(x))); the router reads rms_norm(x) / sqrt(E) *
  ffn_gate_inp.scale, softmax over the experts, the top k renormalised to sum 1; each chosen
  expert's gelu(gate) * up (ffn_gate_up_exps fused, gate rows first, or ffn_gate_exps and
  ffn_up_exps) then down, times ffn_down_exps.scale[e] when present, of pre_ffw_norm_2(x);
  moe = post_ffw_norm_2(the weighted sum); the FFN output is post_ffw_norm(mlp + moe). Every
  layer must have its router (llama.cpp would run a layer without `ffn_gate_inp` as dense;
  edged refuses it, naming the tensor).

arch.validate reads a file through `hparam_fields` and `tensors` below; the compiled pass
(cython_kernels/forward/forward.h, forward_layers.h, forward_moe_gemma4.h) takes the per-layer
sizes from its layer descriptors. `forward` is the NumPy reference it is checked against (the
reference backend does not run gemma4).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import MetadataValueError, UnsupportedModelError
from ..format.gguf import Key, check_number
from ..format.quants import dequantize

ARCH = "gemma4"
MAX_EXPERTS = 512  # llama.cpp's LLAMA_MAX_EXPERTS; the compiled router's limit too


@dataclass(frozen=True)
class HParams:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: tuple              # per layer
    n_ff: tuple                   # per layer
    head_dim: int                 # full layers (attention.key_length)
    head_dim_swa: int             # sliding layers (attention.key_length_swa)
    n_rot: int
    n_rot_swa: int
    rope_freq_base: float
    rope_freq_base_swa: float
    rms_eps: float
    n_swa: int
    swa_layers: tuple             # per layer: True on a sliding layer
    n_kv_shared: int              # the last n layers reuse earlier layers' KV
    n_embd_per_layer: int         # 0: no per-layer embeddings
    final_logit_softcap: float    # 0: off
    n_expert: int = 0             # routed experts (0: dense)
    n_expert_used: int = 0        # experts per token
    n_ff_exp: int = 0             # rows of one expert's gate (and up)

    def head(self, il):
        return self.head_dim_swa if self.swa_layers[il] else self.head_dim

    def kv_layer(self, il):
        """The layer whose KV cache layer il attends over."""
        n_kv = self.n_layer - self.n_kv_shared
        if il < n_kv:
            return il
        return n_kv - (2 if self.swa_layers[il] else 1)


def _refuse(msg):
    raise UnsupportedModelError(f"{ARCH}: {msg}")


def _key(md, key, kind, required=True, default=None, lo=0):
    name = Key.arch(key, ARCH)
    if name not in md:
        if required:
            _refuse(f"missing required key {name!r}")
        return default
    return check_number(name, md[name], kind, lo=lo)


def _per_layer(md, key, n_layer, lo=1):
    """A key that is one integer or an array of one per layer (llama.cpp's get_key_or_arr)."""
    name = Key.arch(key, ARCH)
    v = md.get(name)
    if v is None:
        _refuse(f"missing required key {name!r}")
    if isinstance(v, (list, tuple, np.ndarray)):
        if len(v) != n_layer:
            _refuse(f"{name} has {len(v)} entries for {n_layer} layers")
        return tuple(check_number(name, int(x), int, lo=lo) for x in v)
    return (check_number(name, v, int, lo=lo),) * n_layer


def hparams(md, n_vocab):
    """Gemma 4's hyperparameters from GGUF metadata, refused naming the key that is missing or
    wrong."""
    E = _key(md, Key.EMBEDDING_LENGTH, int, lo=1)
    L = _key(md, Key.BLOCK_COUNT, int, lo=1)
    H = _key(md, Key.HEAD_COUNT, int, lo=1)
    n_expert = _key(md, Key.EXPERT_COUNT, int, required=False, default=0)
    n_used = n_ff_exp = 0
    if n_expert:
        n_used = _key(md, Key.EXPERT_USED_COUNT, int, lo=1)
        n_ff_exp = _key(md, Key.EXPERT_FEED_FORWARD_LENGTH, int, lo=1)
        if not n_used <= n_expert <= MAX_EXPERTS:
            _refuse(f"expert_used_count {n_used} / expert_count {n_expert} invalid (at most "
                    f"{MAX_EXPERTS} experts)")
    kv = _per_layer(md, Key.HEAD_COUNT_KV, L)
    ff = _per_layer(md, Key.FEED_FORWARD_LENGTH, L)
    for il, k in enumerate(kv):
        if H % k:
            _refuse(f"layer {il}: head_count {H} is not a multiple of head_count_kv {k}")
    pat_name = Key.arch(Key.SLIDING_WINDOW_PATTERN, ARCH)
    pat = md.get(pat_name)
    if pat is None:
        _refuse(f"missing required key {pat_name!r}")
    if not (isinstance(pat, (list, tuple, np.ndarray)) and len(pat) == L
            and all(isinstance(x, (bool, np.bool_)) for x in pat)):
        raise MetadataValueError(f"{pat_name} must be an array of {L} booleans, got {pat!r}")
    swa = tuple(bool(x) for x in pat)
    D = _key(md, Key.KEY_LENGTH, int, required=False, default=E // H, lo=1)
    Dv = _key(md, Key.VALUE_LENGTH, int, required=False, default=E // H, lo=1)
    Ds = _key(md, Key.KEY_LENGTH_SWA, int, lo=1)
    Dsv = _key(md, Key.VALUE_LENGTH_SWA, int, lo=1)
    if D != Dv or Ds != Dsv:    # llama.cpp refuses these too
        _refuse(f"key_length {D} / value_length {Dv}, key_length_swa {Ds} / value_length_swa "
                f"{Dsv} must be equal")
    n_rot = _key(md, Key.ROPE_DIMENSION_COUNT, int, required=False, default=D, lo=1)
    n_rot_swa = _key(md, Key.ROPE_DIMENSION_COUNT_SWA, int, required=False, default=n_rot, lo=1)
    for name, r, d in (("rope.dimension_count", n_rot, D), ("rope.dimension_count_swa", n_rot_swa, Ds)):
        if r > d or r % 2:
            _refuse(f"{ARCH}.{name} {r} invalid for head size {d}")
    shared = _key(md, Key.SHARED_KV_LAYERS, int, required=False, default=0)
    n_kv = L - shared
    if shared and (n_kv < 2 or swa[n_kv - 1] or not swa[n_kv - 2]):
        _refuse(f"{Key.arch(Key.SHARED_KV_LAYERS, ARCH)} = {shared}: the last layers with their "
                "own KV must be a sliding then a full layer")
    base = _key(md, Key.ROPE_FREQ_BASE, float, required=False, default=10000.0)
    return HParams(
        n_vocab=n_vocab, n_embd=E, n_layer=L, n_head=H, n_head_kv=kv, n_ff=ff,
        head_dim=D, head_dim_swa=Ds, n_rot=n_rot, n_rot_swa=n_rot_swa, rope_freq_base=base,
        rope_freq_base_swa=_key(md, Key.ROPE_FREQ_BASE_SWA, float, required=False, default=base),
        rms_eps=_key(md, Key.LAYERNORM_RMS_EPS, float),
        n_swa=_key(md, Key.SLIDING_WINDOW, int), swa_layers=swa, n_kv_shared=shared,
        n_embd_per_layer=_key(md, Key.EMBD_LENGTH_PER_LAYER_INP, int),
        final_logit_softcap=_key(md, Key.FINAL_LOGIT_SOFTCAPPING, float, required=False,
                                 default=0.0),
        n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp)


class Weights:
    """The tensors of a Gemma 4 file, checked against the hyperparameters and dequantized to
    float32 on first use; W(name) is row-major (GGUF's ne1 rows of ne0)."""

    def __init__(self, f, hp):
        self.f, self.hp, self._w = f, hp, {}
        E, P, L, V = hp.n_embd, hp.n_embd_per_layer, hp.n_layer, hp.n_vocab
        want = {"token_embd.weight": (E, V), "output_norm.weight": (E,)}
        if "output.weight" in f.tensors:
            want["output.weight"] = (E, V)
        if not all(hp.swa_layers):
            want["rope_freqs.weight"] = (hp.head_dim // 2,)
        if P:
            want.update({"per_layer_token_embd.weight": (P * L, V),
                         "per_layer_model_proj.weight": (E, P * L),
                         "per_layer_proj_norm.weight": (P,)})
        for il in range(L):
            p, hd, kv, ff = f"blk.{il}.", hp.head(il), hp.n_head_kv[il], hp.n_ff[il]
            want.update({p + "attn_norm.weight": (E,), p + "attn_q.weight": (E, hd * hp.n_head),
                         p + "attn_q_norm.weight": (hd,), p + "attn_output.weight": (hd * hp.n_head, E),
                         p + "post_attention_norm.weight": (E,), p + "ffn_norm.weight": (E,),
                         p + "ffn_gate.weight": (E, ff), p + "ffn_up.weight": (E, ff),
                         p + "ffn_down.weight": (ff, E), p + "post_ffw_norm.weight": (E,)})
            if hp.kv_layer(il) == il:
                want.update({p + "attn_k.weight": (E, hd * kv), p + "attn_k_norm.weight": (hd,)})
                if p + "attn_v.weight" in f.tensors:
                    want[p + "attn_v.weight"] = (E, hd * kv)
            if p + "layer_output_scale.weight" in f.tensors:
                want[p + "layer_output_scale.weight"] = (1,)
            if P:
                want.update({p + "inp_gate.weight": (E, P), p + "proj.weight": (P, E),
                             p + "post_norm.weight": (E,)})
            if hp.n_expert:
                want.update(_expert_shapes(f, p, hp))
        for name, shape in want.items():
            t = f.tensors.get(name)
            if t is None:
                _refuse(f"missing tensor {name!r}")
            if tuple(int(x) for x in t.shape) != shape:
                _refuse(f"tensor {name!r} has shape {tuple(int(x) for x in t.shape)}, expected "
                        f"{shape} from the hyperparameters")
        self.names = frozenset(want)

    def W(self, name):
        if name not in self.names:
            return None
        a = self._w.get(name)
        if a is None:
            t = self.f.tensors[name]
            shape = tuple(int(x) for x in t.shape)[::-1]
            a = self._w[name] = dequantize(self.f.tensor_bytes(name), t.type, shape).reshape(shape)
        return a


def _expert_shapes(f, p, hp):
    """{name: GGUF shape} of layer prefix p's router and experts (llama.cpp: every layer of a
    mixture-of-experts file has them), gate|up fused or not as the file holds them."""
    E, X, Fe = hp.n_embd, hp.n_expert, hp.n_ff_exp
    want = {p + "ffn_gate_inp.weight": (E, X), p + "ffn_gate_inp.scale": (E,),
            p + "pre_ffw_norm_2.weight": (E,), p + "post_ffw_norm_1.weight": (E,),
            p + "post_ffw_norm_2.weight": (E,), p + "ffn_down_exps.weight": (Fe, E, X)}
    if p + "ffn_gate_up_exps.weight" in f.tensors:
        want[p + "ffn_gate_up_exps.weight"] = (E, 2 * Fe, X)
    else:
        want.update({p + "ffn_gate_exps.weight": (E, Fe, X), p + "ffn_up_exps.weight": (E, Fe, X)})
    if p + "ffn_down_exps.scale" in f.tensors:
        want[p + "ffn_down_exps.scale"] = (X,)
    return want


def _moe(w, p, x):
    """The routed experts' output (n, E) of layer prefix p for its input x (the residual
    after attention), as llama.cpp's gemma4 graph and build_moe_ffn compute it."""
    from .reference import gelu_ggml, rms_norm, softmax
    hp = w.hp
    k, Fe = hp.n_expert_used, hp.n_ff_exp
    r = rms_norm(x, 1.0, hp.rms_eps).astype(np.float32) * np.float32(1.0 / math.sqrt(hp.n_embd))
    probs = softmax(_mm(r * w.W(p + "ffn_gate_inp.scale"), w.W(p + "ffn_gate_inp.weight")))
    sel = np.argsort(-probs, axis=1, kind="stable")[:, :k]             # (n, k) best first
    wts = np.take_along_axis(probs, sel, 1)
    wts = wts / np.maximum(wts.sum(1, keepdims=True), 6.103515625e-5)
    h = rms_norm(x, w.W(p + "pre_ffw_norm_2.weight"), hp.rms_eps)
    gu = w.W(p + "ffn_gate_up_exps.weight")                             # (X, 2 Fe, E) or None
    gate, up = (gu[:, :Fe], gu[:, Fe:]) if gu is not None else \
        (w.W(p + "ffn_gate_exps.weight"), w.W(p + "ffn_up_exps.weight"))
    down, scale = w.W(p + "ffn_down_exps.weight"), w.W(p + "ffn_down_exps.scale")
    out = np.zeros_like(x)
    for t in range(len(x)):
        for j, e in enumerate(sel[t]):
            y = _mm(gelu_ggml(_mm(h[t:t + 1], gate[e])) * _mm(h[t:t + 1], up[e]), down[e])
            out[t] += y[0] * (1.0 if scale is None else float(scale[e])) * wts[t, j]
    return out


def _mm(x, w):
    """x (n, k) float64 times the rows of w (m, k): float32 products, as reference.py."""
    return (x.astype(np.float32) @ w.T).astype(np.float64)


@dataclass(frozen=True)
class PerLayerInputs:
    """The per-layer embeddings' global tensors (names): per_layer_token_embd (P * n_layer,
    n_vocab), per_layer_model_proj (n_embd, P * n_layer), per_layer_proj_norm (P)."""
    token_embd: str
    model_proj: str
    proj_norm: str


def hparam_fields(md, n_vocab):
    """arch.HParams's fields for a gemma4 file: the per-layer tables, and the largest head,
    KV head count, rotary size and FFN width as the model's (the compiled pass sizes its
    scratch by them)."""
    hp = hparams(md, n_vocab)
    L = hp.n_layer
    heads = tuple(hp.head(il) for il in range(L))
    rots = tuple(hp.n_rot_swa if hp.swa_layers[il] else hp.n_rot for il in range(L))
    return dict(
        n_vocab=n_vocab, n_ctx_train=_key(md, Key.CONTEXT_LENGTH, int, lo=1), n_embd=hp.n_embd,
        n_ff=max(hp.n_ff), n_layer=L, n_head=hp.n_head, n_head_kv=max(hp.n_head_kv),
        head_dim=max(heads), head_dim_v=max(heads), n_rot=max(rots),
        rope_freq_base=hp.rope_freq_base, rope_freq_scale=1.0,
        rope_freq_base_swa=hp.rope_freq_base_swa, rope_freq_scale_swa=1.0,
        rope_ext_factor=0.0, yarn_beta_fast=32.0, yarn_beta_slow=1.0, rope_attn_factor=1.0,
        n_ctx_orig=_key(md, Key.CONTEXT_LENGTH, int, lo=1), rms_eps=hp.rms_eps,
        n_swa=hp.n_swa, swa_layers=hp.swa_layers, attn_scale=1.0,
        embd_scale=math.sqrt(hp.n_embd), final_logit_softcap=hp.final_logit_softcap,
        rope_layers=(True,) * L, kv_layers=tuple(hp.kv_layer(il) for il in range(L)),
        rope_neox=True, act_gelu=True,
        head_dim_layers=heads, n_head_kv_layers=hp.n_head_kv, n_rot_layers=rots,
        n_ff_layers=hp.n_ff, n_embd_per_layer=hp.n_embd_per_layer, v_norm=True,
        n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, n_ff_exp=hp.n_ff_exp,
        expert_weights_norm=bool(hp.n_expert))


def tensors(get, hp, layer_tensors):
    """(rope_freqs, LayerTensors per layer, PerLayerInputs or None) of a gemma4 file, each
    tensor looked up with arch's checked `get(name, shape, required, vector)`."""
    E, P, L = hp.n_embd, hp.n_embd_per_layer, hp.n_layer
    rope_freqs = None
    if not all(hp.swa_layers):   # the full layers' proportional RoPE (llama.cpp: required)
        full = hp.swa_layers.index(False)
        rope_freqs = get("rope_freqs.weight", (hp.head_dim_layers[full] // 2,), vector=True)
    ple = None
    if P:
        ple = PerLayerInputs(get("per_layer_token_embd.weight", (P * L, hp.n_vocab)),
                             get("per_layer_model_proj.weight", (E, P * L)),
                             get("per_layer_proj_norm.weight", (P,), vector=True))
    layers = []
    for il in range(L):
        p = f"blk.{il}."
        hd, kv, _, ff = hp.layer_dims(il)
        own = hp.kv_layers[il] == il
        vec = lambda n, shape=(E,), required=True: get(p + n, shape, required, True)  # noqa: E731
        layers.append(layer_tensors(
            attn_norm=vec("attn_norm.weight"), attn_q=get(p + "attn_q.weight", (E, hp.n_head * hd)),
            attn_k=get(p + "attn_k.weight", (E, kv * hd)) if own else None,
            attn_v=get(p + "attn_v.weight", (E, kv * hd), required=False) if own else None,
            attn_qkv=None, attn_q_bias=None, attn_k_bias=None, attn_v_bias=None,
            attn_q_norm=vec("attn_q_norm.weight", (hd,)),
            attn_k_norm=vec("attn_k_norm.weight", (hd,)) if own else None,
            attn_output=get(p + "attn_output.weight", (hp.n_head * hd, E)),
            post_attention_norm=vec("post_attention_norm.weight"),
            ffn_norm=vec("ffn_norm.weight"), ffn_gate=get(p + "ffn_gate.weight", (E, ff)),
            ffn_up=get(p + "ffn_up.weight", (E, ff)), ffn_down=get(p + "ffn_down.weight", (ff, E)),
            post_ffw_norm=vec("post_ffw_norm.weight"),
            per_layer_inp_gate=get(p + "inp_gate.weight", (E, P)) if P else None,
            per_layer_proj=get(p + "proj.weight", (P, E)) if P else None,
            per_layer_post_norm=vec("post_norm.weight") if P else None,
            layer_output_scale=vec("layer_output_scale.weight", (1,), False),
            **(_expert_tensors(get, p, hp) if hp.n_expert else {})))
    return rope_freqs, tuple(layers), ple


def _expert_tensors(get, p, hp):
    """LayerTensors's expert fields of layer prefix p (the shapes of _expert_shapes)."""
    E, X, Fe = hp.n_embd, hp.n_expert, hp.n_ff_exp
    vec = lambda n, shape=(E,), required=True: get(p + n, shape, required, True)  # noqa: E731
    fused = get(p + "ffn_gate_up_exps.weight", (E, 2 * Fe, X), required=False)
    return dict(
        ffn_gate_inp=get(p + "ffn_gate_inp.weight", (E, X)),
        ffn_gate_inp_scale=vec("ffn_gate_inp.scale"), pre_ffw_norm_2=vec("pre_ffw_norm_2.weight"),
        post_ffw_norm_1=vec("post_ffw_norm_1.weight"), post_ffw_norm_2=vec("post_ffw_norm_2.weight"),
        ffn_gate_up_exps=fused,
        ffn_gate_exps=None if fused else get(p + "ffn_gate_exps.weight", (E, Fe, X)),
        ffn_up_exps=None if fused else get(p + "ffn_up_exps.weight", (E, Fe, X)),
        ffn_down_exps=get(p + "ffn_down_exps.weight", (Fe, E, X)),
        ffn_down_exps_scale=vec("ffn_down_exps.scale", (X,), False))


def forward(w, tokens):
    """Logits (len(tokens), n_vocab) of `tokens` at positions 0.. in one causal pass. K and V
    are held in float16, the query and softmax rows rounded to float16 for their products
    with them, as llama.cpp's F16 cache without flash attention."""
    from .reference import gelu_ggml, rms_norm, rope, softmax   # reference imports arch, arch this
    hp = w.hp
    tokens = np.asarray(tokens, dtype=np.int64)
    n, E, L, P, H = len(tokens), hp.n_embd, hp.n_layer, hp.n_embd_per_layer, hp.n_head
    pos = np.arange(n)
    x = w.W("token_embd.weight")[tokens].astype(np.float64) * np.float32(math.sqrt(E))
    if P:
        e = w.W("per_layer_token_embd.weight")[tokens].astype(np.float64).reshape(n, L, P)
        e = e * np.float32(math.sqrt(P))
        proj = (_mm(x, w.W("per_layer_model_proj.weight")) / math.sqrt(E)).reshape(n, L, P)
        proj = rms_norm(proj, w.W("per_layer_proj_norm.weight"), hp.rms_eps)
        ple = (proj + e) / math.sqrt(2.0)                              # (n, L, P)
    causal = pos[None, :] <= pos[:, None]                              # (n_q, n_k)
    local = causal & (pos[:, None] - pos[None, :] < hp.n_swa)
    cache = {}                                                         # layer -> (k, v) float16
    for il in range(L):
        p = f"blk.{il}."
        hd, swa = hp.head(il), hp.swa_layers[il]
        n_rot = hp.n_rot_swa if swa else hp.n_rot
        base = hp.rope_freq_base_swa if swa else hp.rope_freq_base
        ff = None if swa else w.W("rope_freqs.weight")
        h = rms_norm(x, w.W(p + "attn_norm.weight"), hp.rms_eps)
        q = rms_norm(_mm(h, w.W(p + "attn_q.weight")).reshape(n, H, hd),
                     w.W(p + "attn_q_norm.weight"), hp.rms_eps)
        q = rope(q, pos, n_rot, base, 1.0, True, ff)
        if hp.kv_layer(il) == il:
            kv = hp.n_head_kv[il]
            k = _mm(h, w.W(p + "attn_k.weight")).reshape(n, kv, hd)
            wv = w.W(p + "attn_v.weight")
            v = k if wv is None else _mm(h, wv).reshape(n, kv, hd)
            k = rope(rms_norm(k, w.W(p + "attn_k_norm.weight"), hp.rms_eps), pos, n_rot, base,
                     1.0, True, ff)
            v = rms_norm(v, 1.0, hp.rms_eps)
            cache[il] = (k.astype(np.float16), v.astype(np.float16))
        k16, v16 = cache[hp.kv_layer(il)]
        kv = k16.shape[1]
        group = H // kv
        mask = local if swa else causal
        out = np.empty((n, H, hd))
        for hh in range(H):                                            # attention, scale 1
            qh = q[:, hh].astype(np.float16).astype(np.float64)
            kh = k16[:, hh // group].astype(np.float64)
            s = np.where(mask, qh @ kh.T, -np.inf)
            pr = softmax(s).astype(np.float16).astype(np.float64)
            out[:, hh] = pr @ v16[:, hh // group].astype(np.float64)
        a = _mm(out.reshape(n, H * hd), w.W(p + "attn_output.weight"))
        attn_out = rms_norm(a, w.W(p + "post_attention_norm.weight"), hp.rms_eps) + x
        f = rms_norm(attn_out, w.W(p + "ffn_norm.weight"), hp.rms_eps)
        f = _mm(gelu_ggml(_mm(f, w.W(p + "ffn_gate.weight"))) * _mm(f, w.W(p + "ffn_up.weight")),
                w.W(p + "ffn_down.weight"))
        if hp.n_expert:      # the dense FFN is the shared expert beside the routed ones
            f = rms_norm(f, w.W(p + "post_ffw_norm_1.weight"), hp.rms_eps) + \
                rms_norm(_moe(w, p, attn_out), w.W(p + "post_ffw_norm_2.weight"), hp.rms_eps)
        f = rms_norm(f, w.W(p + "post_ffw_norm.weight"), hp.rms_eps)
        x = f + attn_out
        if P:
            g = gelu_ggml(_mm(x, w.W(p + "inp_gate.weight"))) * ple[:, il]
            g = rms_norm(_mm(g, w.W(p + "proj.weight")), w.W(p + "post_norm.weight"), hp.rms_eps)
            x = x + g
        s = w.W(p + "layer_output_scale.weight")
        if s is not None:
            x = x * float(s[0])
    x = rms_norm(x, w.W("output_norm.weight"), hp.rms_eps)
    out_w = w.W("output.weight")
    logits = _mm(x, out_w if out_w is not None else w.W("token_embd.weight"))
    c = hp.final_logit_softcap
    if c:
        logits = np.tanh(logits / c) * c
    return logits.astype(np.float32)

"""Gemma 3n (`gemma3n`): what its files hold beyond a gemma3 block, read as llama.cpp reads it.

llama.cpp 0.3.36 (src/models/gemma3n.cpp, llama-hparams.h) runs every Gemma 3n file with fixed
values for the AltUp width (4 streams, stream 0 active), the per-layer input width (256), the
LAuReL rank (64), KV sharing (layers from 20 on attend to layer 18's cache when sliding, 19's
when global) and activation sparsity (a Gaussian top-k on the first 10 layers' FFN gate, cut at
mean + 1.6448533 std). The converter also writes these as keys; llama.cpp ignores them. edged reads each key that is present and refuses a value other than the fixed
one, naming the key: such a file would not run as it says in llama.cpp either.

`params(metadata, n_layer)` checks the keys; `tensors(get, hp, params)` finds the extra tensors with
arch.validate's checked lookup. The computation is in reference_gemma3n.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import MetadataValueError, UnsupportedModelError
from ..format.gguf import Key, check_number

ARCH = "gemma3n"
N_ALTUP, I_ALTUP_ACT = 4, 0          # altup.num_inputs, altup.active_idx
N_EMBD_ALTUP = 256                   # embedding_length_per_layer_input
LAUREL_RANK = 64                     # laurel_l/laurel_r's inner width (no key)
N_LAYER_KV_FROM_START = 20           # layers below this have their own K/V
N_LAYER_SPARSITY = 10                # layers whose FFN gate goes through the Gaussian top-k
SPARSITY_STD_MUL = 1.6448533535003662  # the 0.95 quantile of N(0, 1), as the converter writes it
FINAL_LOGIT_SOFTCAP = 30.0           # llama-hparams.h's default; gemma3n does not read the key


@dataclass(frozen=True)
class Params:
    n_altup: int
    i_altup_act: int
    n_embd_altup: int
    laurel_rank: int
    sparsity: tuple                  # per layer: the std multiplier of the gate's top-k, 0: none


@dataclass(frozen=True)
class LayerTensors:
    """A block's AltUp, LAuReL and per-layer-input tensors (GGUF shapes)."""
    inp_gate: str                    # (n_embd, n_embd_altup)
    proj: str                        # (n_embd_altup, n_embd)
    post_norm: str                   # (n_embd,)
    altup_correct_coef: str          # (n_altup, n_altup)
    altup_correct_scale: str         # (n_embd,)
    altup_predict_coef: str          # (n_altup, n_altup * n_altup)
    altup_router: str                # (n_embd, n_altup)
    altup_router_norm: str           # (n_embd,)
    laurel_l: str                    # (n_embd, laurel_rank)
    laurel_r: str                    # (laurel_rank, n_embd)
    laurel_post_norm: str            # (n_embd,)


@dataclass(frozen=True)
class Tensors:
    params: Params
    altup_proj: str                  # (n_embd, n_embd, n_altup - 1)
    altup_unembd_proj: str           # (n_embd, n_embd, n_altup - 1)
    per_layer_token_embd: str        # (n_embd_altup * n_layer, n_vocab): one row per token
    per_layer_model_proj: str        # (n_embd, n_embd_altup * n_layer)
    per_layer_proj_norm: str         # (n_embd_altup,)
    layers: tuple                    # LayerTensors per block


def _refuse(msg):
    raise UnsupportedModelError(msg)


def _fixed(md, key, want):
    """An integer key that llama.cpp does not read: absent, or the value llama.cpp uses."""
    name = Key.arch(key, ARCH)
    if name in md and check_number(name, md[name], int) != want:
        _refuse(f"{name} = {md[name]} is not supported (llama.cpp runs gemma3n with {want})")


def kv_layers(n_layer, swa_layers):
    """Per layer, the layer whose K/V cache it attends to: itself below 20, then the last
    sliding (18) or global (19) layer with a cache, as llama.cpp's layer_reuse_cb."""
    k = N_LAYER_KV_FROM_START
    return tuple(il if il < k else k - (2 if swa_layers[il] else 1) for il in range(n_layer))


def params(md, n_layer):
    _fixed(md, Key.ALTUP_NUM_INPUTS, N_ALTUP)
    _fixed(md, Key.ALTUP_ACTIVE_IDX, I_ALTUP_ACT)
    _fixed(md, Key.EMBD_LENGTH_PER_LAYER_INP, N_EMBD_ALTUP)
    _fixed(md, Key.SHARED_KV_LAYERS, max(0, n_layer - N_LAYER_KV_FROM_START))
    sparsity = tuple(SPARSITY_STD_MUL if il < N_LAYER_SPARSITY else 0.0 for il in range(n_layer))
    name = Key.arch(Key.ACTIVATION_SPARSITY_SCALE, ARCH)
    if name in md:
        v = md[name]
        numbers = isinstance(v, (list, tuple, np.ndarray)) and all(
            isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
            for x in v)
        if not numbers or len(v) != n_layer:
            raise MetadataValueError(f"{name} must be an array of {n_layer} numbers (one per "
                                     f"layer), got {v!r}")
        # the converter writes icdf(p): -inf for p = 0 (no sparsity on that layer)
        got = tuple(float(np.float32(x)) if math.isfinite(float(x)) and float(x) > 0 else 0.0
                    for x in v)
        if got != tuple(float(np.float32(s)) for s in sparsity):
            _refuse(f"{name} = {list(v)[:12]} is not supported (llama.cpp runs gemma3n with "
                    f"{SPARSITY_STD_MUL} on the first {N_LAYER_SPARSITY} layers, none after)")
    name = Key.arch(Key.FINAL_LOGIT_SOFTCAPPING, ARCH)
    if name in md and check_number(name, md[name], float) != FINAL_LOGIT_SOFTCAP:
        _refuse(f"{name} = {md[name]} is not supported (llama.cpp runs gemma3n with "
                f"{FINAL_LOGIT_SOFTCAP})")
    return Params(n_altup=N_ALTUP, i_altup_act=I_ALTUP_ACT, n_embd_altup=N_EMBD_ALTUP,
                  laurel_rank=LAUREL_RANK, sparsity=sparsity)


def tensors(get, hp, prm):
    """The extra tensors through arch.validate's get(name, shape, required, vector)."""
    E, A, P, L = hp.n_embd, prm.n_altup, prm.n_embd_altup, hp.n_layer
    rank = prm.laurel_rank
    layers = []
    for il in range(L):
        p = f"blk.{il}."
        layers.append(LayerTensors(
            inp_gate=get(p + "inp_gate.weight", (E, P)),
            proj=get(p + "proj.weight", (P, E)),
            post_norm=get(p + "post_norm.weight", (E,), vector=True),
            altup_correct_coef=get(p + "altup_correct_coef.weight", (A, A)),
            altup_correct_scale=get(p + "altup_correct_scale.weight", (E,), vector=True),
            altup_predict_coef=get(p + "altup_predict_coef.weight", (A, A * A)),
            altup_router=get(p + "altup_router.weight", (E, A)),
            altup_router_norm=get(p + "altup_router_norm.weight", (E,), vector=True),
            laurel_l=get(p + "laurel_l.weight", (E, rank)),
            laurel_r=get(p + "laurel_r.weight", (rank, E)),
            laurel_post_norm=get(p + "laurel_post_norm.weight", (E,), vector=True),
        ))
    return Tensors(
        params=prm,
        altup_proj=get("altup_proj.weight", (E, E, A - 1)),
        altup_unembd_proj=get("altup_unembd_proj.weight", (E, E, A - 1)),
        per_layer_token_embd=get("per_layer_token_embd.weight", (P * L, hp.n_vocab)),
        per_layer_model_proj=get("per_layer_model_proj.weight", (E, P * L)),
        per_layer_proj_norm=get("per_layer_proj_norm.weight", (P,), vector=True),
        layers=tuple(layers))

"""The NumPy reference forward pass of Gemma 3n (`gemma3n`), as llama.cpp's src/models/gemma3n.cpp.

The stream is n_altup (4) copies of the hidden state (AltUp): the token embedding and three
projections of it scaled to its magnitude. Each block predicts the streams from each other
(coefficients from a tanh router on the active stream), runs the active prediction through
attention and the FFN (with LAuReL, a low-rank side path, beside attention), then corrects every
stream by the difference between the block's output and the prediction; the active stream, gated
by the token's per-layer input (a 256-wide row of per_layer_token_embd plus a projection of the
embedding), is added to the other streams. The first 10 layers cut the FFN gate at mean +
1.6448533 std (activation sparsity); layers from 20 on attend to an earlier layer's K/V cache
(arch.HParams.kv_layers, in ReferenceBackend._attention_block). At the end the streams are
projected back, scaled to the active stream's magnitude and averaged.

Shapes: X (n_altup, n, n_embd); per-layer inputs (n, n_layer, n_embd_altup).
"""
from __future__ import annotations

import math

import numpy as np

from .reference import gelu_ggml, rms_norm


def _mag(v):
    return np.sqrt((v * v).sum(-1, keepdims=True))


def _gaussian_topk(g, std_mul):
    """relu(g - (mean + std_mul * std)) per row, std with n - 1 (llama.cpp's gaussian_topk)."""
    mean = g.mean(-1, keepdims=True)
    std = np.sqrt(((g - mean) ** 2).sum(-1, keepdims=True) / (g.shape[-1] - 1))
    return np.maximum(g - (mean + std * std_mul), 0.0)


def forward(b, buf, n_tokens, pos, all_logits):
    """b: the ReferenceBackend; fills buf.hidden and buf.logits like its forward()."""
    sp, hp = b.spec, b.spec.hp
    g, W, mm, eps = sp.gemma3n, b._w, b._mm, hp.rms_eps
    prm = g.params
    A, P, act = prm.n_altup, prm.n_embd_altup, prm.i_altup_act
    toks = buf.tokens[:n_tokens]
    n = len(toks)
    positions = np.arange(pos, pos + n)
    x0 = W[sp.token_embd][toks].astype(np.float64) * hp.embd_scale          # (n, n_embd)

    # per-layer inputs: the token's row and a projection of its embedding, (n, n_layer, P)
    ple = W[g.per_layer_token_embd][toks].astype(np.float64).reshape(n, hp.n_layer, P)
    ple = ple * math.sqrt(P)
    proj = mm(x0, g.per_layer_model_proj).reshape(n, hp.n_layer, P) / math.sqrt(hp.n_embd)
    ple = (rms_norm(proj, W[g.per_layer_proj_norm], eps) + ple) / math.sqrt(2.0)

    X = [x0]
    for i in range(A - 1):
        u = mm(x0, W[g.altup_proj][i])
        X.append(u * _mag(x0) / _mag(u))
    X = np.stack(X)                                                          # (A, n, n_embd)

    def router(x, G):  # (n, n_embd) -> (n, A)
        r = rms_norm(x, W[G.altup_router_norm], eps) / hp.n_embd
        return np.tanh(mm(r, G.altup_router))

    group = hp.n_head // hp.n_head_kv
    for il, L in enumerate(sp.layers):
        G = g.layers[il]
        # predict: every stream from all of them, coefficients from the active one
        C = mm(router(X[act], G), G.altup_predict_coef).reshape(n, A, A)   # [n, j, k]
        pred = np.einsum("njk,knd->jnd", C, X) + X
        active = pred[act]
        h = rms_norm(active, W[L.attn_norm], eps)
        laurel = rms_norm(mm(mm(h, G.laurel_l), G.laurel_r), W[G.laurel_post_norm], eps) + h
        attn = b._attention_block(buf, il, L, active, h, pos, positions, None, True, group)
        attn_laurel = (attn + laurel) / math.sqrt(2.0)
        h = rms_norm(attn_laurel, W[L.ffn_norm], eps)
        gate, up = mm(h, L.ffn_gate), mm(h, L.ffn_up)
        if prm.sparsity[il]:
            gate = _gaussian_topk(gate, prm.sparsity[il])
        d = rms_norm(mm(gelu_ggml(gate) * up, L.ffn_down), W[L.post_ffw_norm], eps)
        out = d + attn_laurel                                                # (n, n_embd)
        # correct every stream by the innovation, scaled per stream by the router
        c = mm(router(out, G), G.altup_correct_coef) + 1.0                   # (n, A)
        X = pred + (out - active)[None] * c.T[:, :, None]
        first = X[act] * W[G.altup_correct_scale]
        first = gelu_ggml(mm(first, G.inp_gate)) * ple[:, il, :]            # (n, P)
        X[1:] += rms_norm(mm(first, G.proj), W[G.post_norm], eps)

    # streams back to one: projected, scaled to the active stream's magnitude, averaged
    target = _mag(X[act])
    x = X[0].copy()
    for i in range(A - 1):
        u = mm(X[i + 1], W[g.altup_unembd_proj][i])
        x += u * target / _mag(u)
    b._logits(buf, x / A, all_logits)

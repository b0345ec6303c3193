"""The NumPy reference of a Granite 4 hybrid Mamba-2 layer, as llama.cpp's build_mamba2_layer
(src/models/mamba-base.cpp) with ggml's ssm_conv and ssm_scan (ggml-cpu/ops.cpp): the slow twin
of cython_kernels/forward/mamba2.h.

ssm_in splits into z (d_inner), xBC (d_inner + 2 * n_group * d_state) and dt (n_head). xBC goes
through a causal depthwise convolution over the last d_conv inputs (zeros before position 0),
its bias and SiLU, and splits into x (n_head, head_dim), B and C (n_group, d_state). Per head,
dt = softplus(dt + dt_bias), dA = exp(dt * A); per position the state (head_dim, d_state)
becomes state * dA + x * dt * B and y = state . C + D * x. Then y * silu(z), an RMS norm per
group of d_inner / n_group values (ssm_norm), and ssm_out.

The state is the sequence's recurrent state (engine/recurrent.py: the convolution's last
d_conv - 1 inputs, then per head a (head_dim, d_state) matrix), rounded to float32 after each
position as the compiled pass keeps it, so a prompt in one batch, in chunks or token by token
gives the same bits; a rewind restores a checkpoint, a fork copies the state.
"""
from __future__ import annotations

import numpy as np

from .recurrent import layer_views
from .reference import rms_norm, silu


def softplus(x):
    """ggml_compute_softplus_f32: x above 20, else log(1 + exp(x))."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def mamba2(b, buf, slot, h, L):
    """The Mamba-2 layer L's output for the rows h (the normed stream), recurrent slot `slot`."""
    prm, W, eps = b.spec.granitehybrid, b._w, b.spec.hp.rms_eps
    conv, states = layer_views(buf.recurrent.live, b.spec.hp, slot)   # (taps-1, ch), (H, hd, N)
    n, di, ch, taps = len(h), prm.d_inner, prm.n_conv_ch, prm.d_conv
    H, hd, N, G = prm.n_head, prm.head_dim, prm.d_state, prm.n_group
    zxbcdt = b._mm(h, L.ssm_in)                                        # (n, d_in_proj)
    z, xbc, dt = zxbcdt[:, :di], zxbcdt[:, di:di + ch], zxbcdt[:, di + ch:]
    win = np.concatenate([conv.astype(np.float64), xbc.astype(np.float32)])  # (taps-1+n, ch)
    w = W[L.ssm_conv1d].astype(np.float64)                             # (n_conv_ch, d_conv)
    xbc = np.stack([(win[t:t + taps].T * w).sum(1) for t in range(n)])
    conv[:] = win[n:].astype(np.float32)
    if L.ssm_conv1d_b:
        xbc = xbc + W[L.ssm_conv1d_b]
    xbc = silu(xbc)
    x = xbc[:, :di].reshape(n, H, hd)
    B = xbc[:, di:di + G * N].reshape(n, G, N)
    C = xbc[:, di + G * N:].reshape(n, G, N)
    dt = softplus(dt + W[L.ssm_dt])                                    # (n, H)
    A = W[L.ssm_a].reshape(H).astype(np.float64)
    D = W[L.ssm_d].reshape(H).astype(np.float64)
    grp = np.arange(H) // (H // G)                                     # head -> its B/C group
    s = states.astype(np.float64)
    y = np.empty((n, H, hd))
    for t in range(n):   # the recurrence, position by position
        dA = np.exp(dt[t] * A)                                         # (H,)
        s = s * dA[:, None, None] + (x[t] * dt[t][:, None])[:, :, None] * B[t][grp][:, None, :]
        s = s.astype(np.float32).astype(np.float64)                    # the stored state
        y[t] = (s * C[t][grp][:, None, :]).sum(-1)
    states[:] = s
    y = (y + x * D[:, None]).reshape(n, di) * silu(z)
    y = rms_norm(y.reshape(n, G, di // G), W[L.ssm_norm], eps).reshape(n, di)
    return b._mm(y, L.ssm_out)

"""The NumPy reference of a Granite 4 hybrid Mamba-2 layer, as llama.cpp's build_mamba2_layer
(src/models/mamba-base.cpp) with ggml's ssm_conv and ssm_scan (ggml-cpu/ops.cpp).

ssm_in splits into z (d_inner), xBC (d_inner + 2 * n_group * d_state) and dt (n_head). xBC goes
through a causal depthwise convolution over the last d_conv inputs (zeros before position 0),
its bias and SiLU, and splits into x (n_head, head_dim), B and C (n_group, d_state). Per head,
dt = softplus(dt + dt_bias), dA = exp(dt * A); per position the state (head_dim, d_state)
becomes state * dA + x * dt * B and y = state . C + D * x. Then y * silu(z), an RMS norm per
group of d_inner / n_group values (ssm_norm), and ssm_out.

The session holds, per Mamba-2 layer and per position, the convolution's input row and the SSM
state after that position, in float32 as llama.cpp's recurrent state (so a prompt in one batch,
in chunks or token by token gives the same bits, a rewind needs no rollback, and a fork or a
prefix-cache hit copies rows like the K/V cache). That is n_ctx states per layer: fine for the
reference backend's test shapes; the compiled backend keeps one state per sequence.
"""
from __future__ import annotations

import numpy as np

from .reference import rms_norm, silu


def state_shapes(spec, n_ctx):
    """[(n_ssm_layers, n_ctx, n_conv_ch), (n_ssm_layers, n_ctx, n_head, head_dim, d_state)]."""
    prm = spec.granitehybrid.params
    n = sum(prm.ssm_layers)
    return [(n, n_ctx, prm.n_conv_ch), (n, n_ctx, prm.n_head, prm.head_dim, prm.d_state)]


def alloc(spec, n_ctx):
    return tuple(np.zeros(s, np.float32) for s in state_shapes(spec, n_ctx))


def softplus(x):
    """ggml_compute_softplus_f32: x above 20, else log(1 + exp(x))."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def mamba2(b, buf, il, h, pos):
    """The Mamba-2 layer il's output for the rows h (the normed stream) at positions pos..."""
    g = b.spec.granitehybrid
    prm, T, W, eps = g.params, g.layers[il], b._w, b.spec.hp.rms_eps
    slot = sum(prm.ssm_layers[:il])
    conv_in, states = buf.mamba2
    n, di, ch, taps = len(h), prm.d_inner, prm.n_conv_ch, prm.d_conv
    H, hd, N, G = prm.n_head, prm.head_dim, prm.d_state, prm.n_group
    zxbcdt = b._mm(h, T.ssm_in)                                        # (n, d_in_proj)
    z, xbc, dt = zxbcdt[:, :di], zxbcdt[:, di:di + ch], zxbcdt[:, di + ch:]
    conv_in[slot, pos:pos + n] = xbc.astype(np.float32)
    w = W[T.ssm_conv1d].astype(np.float64)                             # (n_conv_ch, d_conv)
    hist = np.concatenate([np.zeros((taps - 1, ch)),
                           conv_in[slot, :pos + n].astype(np.float64)])
    xbc = np.stack([(hist[pos + t:pos + t + taps].T * w).sum(1) for t in range(n)])
    if T.ssm_conv1d_b:
        xbc = xbc + W[T.ssm_conv1d_b]
    xbc = silu(xbc)
    x = xbc[:, :di].reshape(n, H, hd)
    B = xbc[:, di:di + G * N].reshape(n, G, N)
    C = xbc[:, di + G * N:].reshape(n, G, N)
    dt = softplus(dt + W[T.ssm_dt_b])                                  # (n, H)
    A = W[T.ssm_a].reshape(H).astype(np.float64)
    D = W[T.ssm_d].reshape(H).astype(np.float64)
    grp = np.arange(H) // (H // G)                                     # head -> its B/C group
    s = states[slot, pos - 1].astype(np.float64) if pos else np.zeros((H, hd, N))
    y = np.empty((n, H, hd))
    for t in range(n):   # the recurrence, position by position
        dA = np.exp(dt[t] * A)                                         # (H,)
        s = s * dA[:, None, None] + (x[t] * dt[t][:, None])[:, :, None] * B[t][grp][:, None, :]
        s = s.astype(np.float32).astype(np.float64)                    # the stored state
        states[slot, pos + t] = s
        y[t] = (s * C[t][grp][:, None, :]).sum(-1)
    y = (y + x * D[:, None]).reshape(n, di) * silu(z)
    y = rms_norm(y.reshape(n, G, di // G), W[T.ssm_norm], eps).reshape(n, di)
    return b._mm(y, T.ssm_out)

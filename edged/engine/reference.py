"""The NumPy reference forward pass: slow, obvious, and the twin of the compiled one.

Weights are dequantized once to float32 (edged.format.quants, itself checked against the PyPI gguf
package); matrix products run in float32, everything else (norms, RoPE, softmax) in float64.
The KV cache is float16 like the compiled backend's, and like llama.cpp (no flash attention)
the query and the softmax row are rounded to float16 for their products with it (a q8_0/q4_0
cache holds the values its rows store; the query then goes through q8_0 for K, and a quantized V
takes float softmax weights, as llama.cpp's flash attention), and GELU
goes through float16 in and out. Activations are not quantized (the compiled backend mirrors
that). Selected with EDGED_BACKEND=reference.
"""
from __future__ import annotations

import glob
import math
import os

import numpy as np

from .arch import EXPERT_WEIGHTS_SUM_MIN, ROPE_NEOX, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT
from .backend import Backend, BufferPlan
from .kvcache import DEFAULT as DEFAULT_CACHE
from .recurrent import RecurrentState, layer_views, state_bytes
from ..errors import UnsupportedModelError
from ..format.gguf import GGMLType
from ..format.quants import dequantize, quantize


def rms_norm(x, w, eps):
    # x: (n, d) float64; w: (d,)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_ggml(x):
    """GELU as llama.cpp's CPU backend applies it: |x| < 10 through a table over F16 inputs
    with F16 entries; below -10 zero, above 10 x."""
    g = gelu_tanh(x.astype(np.float16).astype(np.float64)).astype(np.float16).astype(np.float64)
    return np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, g))


def silu(x):
    return x / (1.0 + np.exp(-x))


def swiglu_oai(g, u):
    """gpt-oss's clamped SwiGLU (llama.cpp's ggml_swiglu_oai)."""
    x = np.minimum(g, SWIGLU_OAI_LIMIT)
    y = np.clip(u, -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
    return x / (1.0 + np.exp(-SWIGLU_OAI_ALPHA * x)) * (y + 1.0)


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def yarn_corr_dims(n_rot, n_ctx_orig, base, beta_fast, beta_slow):
    """The dims between which YaRN ramps from extrapolation to interpolation (ggml)."""
    def dim(beta):
        return n_rot * math.log(n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))
    return max(0.0, math.floor(dim(beta_fast))), min(n_rot - 1.0, math.ceil(dim(beta_slow)))


def rope(x, pos, n_rot, base, scale, neox, factors=None, attn_factor=1.0, yarn=None):
    """Rotate the first n_rot dims of each head. x: (n, n_heads, head_dim); pos: (n,).
    yarn: None or (ext_factor, n_ctx_orig, beta_fast, beta_slow) for YaRN scaling."""
    half = n_rot // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)  # (half,)
    extrap = pos[:, None].astype(np.float64) * inv[None, :]            # (n, half)
    if factors is not None:
        extrap = extrap / factors[None, :]
    theta = extrap * scale
    if yarn is not None and yarn[0]:
        ext, n_ctx_orig, fast, slow = yarn
        lo, hi = yarn_corr_dims(n_rot, n_ctx_orig, base, fast, slow)
        ramp = 1.0 - np.clip((np.arange(half) - lo) / max(0.001, hi - lo), 0.0, 1.0)
        mix = ramp * ext                                                # (half,)
        theta = theta * (1.0 - mix) + extrap * mix
        attn_factor = attn_factor * (1.0 + 0.1 * math.log(1.0 / scale))
    cos = (np.cos(theta) * attn_factor)[:, None, :]
    sin = (np.sin(theta) * attn_factor)[:, None, :]
    out = x.copy()
    if neox:  # pairs (i, i + n_rot/2)
        a, b = x[..., :half], x[..., half:n_rot]
        out[..., :half] = a * cos - b * sin
        out[..., half:n_rot] = a * sin + b * cos
    else:     # adjacent pairs (2i, 2i+1)
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * cos - b * sin
        out[..., 1:n_rot:2] = a * sin + b * cos
    return out


def hadamard(n):
    """The orthonormal n x n Walsh-Hadamard matrix (n a power of two; Sylvester's construction)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def _rotate(x, n):
    """x (..., head_dim) with each n-value chunk times the Hadamard matrix (kvcache.py)."""
    if not n:
        return x
    shape = x.shape  # float32 out, as llama.cpp's transform and cache rows hold it
    return (x.reshape(-1, n).astype(np.float64) @ hadamard(n)).astype(np.float32).reshape(shape)


def _stored(x, qtype):
    """The values a cache row of type qtype holds for x (..., n_head_kv, head_dim): each
    position's row quantized as a whole (kvcache.py) and read back."""
    shape = x.shape
    rows = x.reshape(-1, shape[-2] * shape[-1])
    return dequantize(quantize(rows, qtype), qtype, rows.shape).reshape(shape)


class _Session:
    def __init__(self, hp, n_ctx, cache):
        # k, v: (attention layers, n_ctx, n_head_kv, head_dim) float16, like llama.cpp's F16
        # cache, or float32 holding what a q8_0/q4_0 row stores (kvcache.CacheTypes)
        shape = (hp.n_kv_layers, n_ctx, hp.n_head_kv, hp.head_dim)
        self.k = np.zeros(shape, np.float16 if cache.k == GGMLType.F16 else np.float32)
        self.v = np.zeros(shape, np.float16 if cache.v == GGMLType.F16 else np.float32)
        # a convolution layer's input B * x at each position (lfm2), in float32 as llama.cpp's
        # conv state; a row per position like K/V, so a rewind needs no rollback
        self.conv = np.zeros((hp.n_conv_layers, n_ctx, hp.n_embd), np.float32)
        # the recurrent layers' state (qwen35's DeltaNet, granitehybrid's Mamba-2): one per
        # sequence, with checkpoints
        self.recurrent = RecurrentState(np.zeros(hp.recurrent_state_floats(), np.float32)) \
            if hp.n_recr_layers else None
        self.n_ctx = n_ctx
        self.tokens = None
        self.logits = None


class ReferenceBackend(Backend):
    name = "reference"

    @property
    def code_files(self):
        """Every module of the engine: the families' reference passes are spread over several
        (reference_gemma3n.py, reference_granite.py, recurrent.py, ...)."""
        return tuple(sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*.py"))))

    def __init__(self, spec, weights, n_threads=1, numa="none", cache=DEFAULT_CACHE,
                 resident_experts=False):
        super().__init__(spec, weights, n_threads, numa, cache, resident_experts)
        if spec.hp.head_dim_layers:
            raise UnsupportedModelError(
                f"{spec.arch.name}: the reference backend does not run layers of their own sizes; "
                "its NumPy reference is edged.engine.gemma4.forward (the compiled backend runs it)")
        cache.check(spec.hp.head_dim)

        self._w = {}
        self.routed = {}  # router tensor -> experts chosen so far (tests, debugging)
        for name, t in spec.tensors.items():
            a = dequantize(np.asarray(weights[name]), t.type, tuple(int(x) for x in t.shape))
            # GGUF shape (ne0, ne1) -> row-major (ne1, ne0): one output row per ne1
            shape = tuple(int(x) for x in t.shape)[::-1]
            if name.endswith("_shexp.weight") and len(shape) == 1:
                shape = (1,) + shape  # the shared expert's gate: a matrix of one row
            a = np.ascontiguousarray(a, dtype=np.float32).reshape(shape)
            self._w[name] = a

    def W(self, name):
        return self._w[name] if name else None

    @classmethod
    def extra_weight_bytes(cls, spec):
        return sum(4 * t.n_elements for t in spec.tensors.values())  # float32 copies

    @classmethod
    def plan_for(cls, spec, n_ctx, n_batch, cache=DEFAULT_CACHE):
        hp = spec.hp
        kv = hp.n_kv_layers * n_ctx * hp.n_head_kv * hp.head_dim * (
            (2 if cache.k == GGMLType.F16 else 4) + (2 if cache.v == GGMLType.F16 else 4)) \
            + hp.n_conv_layers * n_ctx * 4 * hp.n_embd + state_bytes(hp)
        scratch = 8 * n_batch * (4 * hp.n_embd + 3 * hp.n_ff + hp.n_vocab) \
            + 8 * n_batch * hp.n_head * n_ctx
        return BufferPlan(kv, scratch)

    def alloc(self, n_ctx, n_batch):
        return _Session(self.spec.hp, n_ctx, self.cache)

    def free(self, buf):
        buf.k = buf.v = None

    def kv_cache(self, buf):
        return tuple(a.view(np.uint8).reshape(a.shape[0], a.shape[1], -1) for a in (buf.k, buf.v))

    def conv_cache(self, buf):
        return buf.conv.view(np.uint8).reshape(buf.conv.shape[0], buf.conv.shape[1], -1)

    def copy_kv(self, dst, src, n):
        dst.k[:, :n] = src.k[:, :n]
        dst.v[:, :n] = src.v[:, :n]
        dst.conv[:, :n] = src.conv[:, :n]
        if src.recurrent:
            dst.recurrent.copy_from(src.recurrent)

    def recurrent(self, buf):
        return buf.recurrent

    def copy_in(self, buf, tokens, pos, rows=None):
        buf.tokens = np.asarray(tokens, dtype=np.int64)
        buf.rows = rows

    def set_noncausal(self, buf, lo, hi):
        buf.noncausal = (lo, hi)

    def hidden_rows(self, buf, n_rows):
        return rms_norm(buf.hidden[:n_rows], self._w[self.spec.output_norm],
                        self.spec.hp.rms_eps).astype(np.float32)

    def copy_out(self, buf, n_rows):
        return np.ascontiguousarray(buf.logits[-n_rows:], dtype=np.float32)

    def _mm(self, x, name):
        # x: (n, in) float64 -> (n, out) float64; weight (out, in) float32 (by name, or the
        # array: a slice of a stacked one, gemma3n's altup_proj). Row by row, so a
        # token's result does not depend on the batch it came in (BLAS sums a matrix-matrix
        # product in another order than a matrix-vector one, and the F16 roundings below
        # would turn that last-bit difference into a visible one now and then).
        w = self._w[name] if isinstance(name, str) else name
        x32 = x.astype(np.float32)
        return np.stack([w @ row for row in x32]).astype(np.float64)

    def forward(self, buf, n_tokens, pos, all_logits, all_rows=False):  # every row, always
        sp, hp, a = self.spec, self.spec.hp, self.spec.arch
        if sp.gemma3n:
            from .reference_gemma3n import forward   # it imports this module's helpers
            return forward(self, buf, n_tokens, pos, all_logits)
        toks = buf.tokens[:n_tokens]
        n = len(toks)
        positions = np.arange(pos, pos + n)
        x = self._w[sp.token_embd][toks].astype(np.float64) * hp.embd_scale  # (n, n_embd)
        if getattr(buf, "rows", None) is not None:
            x[buf.rows[0]] = buf.rows[1]                # an image's rows (engine/vision.py)
        neox = a.rope_type == ROPE_NEOX
        factors_name = sp.rope_factors(buf.n_ctx)
        factors = self._w[factors_name].astype(np.float64) if factors_name else None
        group = hp.n_head // hp.n_head_kv
        conv_slot = recr_slot = 0
        for il, L in enumerate(sp.layers):
            h = rms_norm(x, self._w[L.attn_norm], hp.rms_eps)
            if L.ssm_in:
                from .reference_granite import mamba2   # it imports this module's helpers
                x = x + mamba2(self, buf, recr_slot, h, L) * hp.residual_scale
                recr_slot += 1
            elif L.ssm_out:
                x = x + self._deltanet(buf, recr_slot, h, L)
                recr_slot += 1
            elif L.shortconv_in_proj:
                x = x + self._shortconv(buf, conv_slot, h, L, pos) * hp.residual_scale
                conv_slot += 1
            else:
                x = self._attention_block(buf, il, L, x, h, pos, positions, factors, neox, group)
            h = rms_norm(x, self._w[L.ffn_norm], hp.rms_eps)
            if L.ffn_gate_inp:
                d = self._moe(h, L)
            else:
                if L.ffn_gate:
                    g, u = self._mm(h, L.ffn_gate), self._mm(h, L.ffn_up)
                else:
                    g, u = np.split(self._mm(h, L.ffn_up), 2, axis=1)
                act = gelu_ggml(g) if a.act == "gelu" else silu(g)
                d = self._mm(act * u, L.ffn_down)
            if L.post_ffw_norm:
                d = rms_norm(d, self._w[L.post_ffw_norm], hp.rms_eps)
            x = x + d * hp.residual_scale
        self._logits(buf, x, all_logits)

    def _logits(self, buf, x, all_logits):
        sp, hp = self.spec, self.spec.hp
        buf.hidden = x                                  # (n, n_embd) before output_norm
        if not all_logits:
            x = x[-1:]
        x = rms_norm(x, self._w[sp.output_norm], hp.rms_eps)
        logits = self._mm(x, sp.output)
        if hp.final_logit_softcap:
            c = hp.final_logit_softcap
            logits = np.tanh(logits / c) * c
        buf.logits = logits * hp.logit_mul

    def _shortconv(self, buf, slot, h, L, pos):
        """lfm2's gated short convolution: in_proj -> B | C | x; B * x stored per position;
        per channel the causal convolution over the last l_cache inputs (zeros before
        position 0), times C; out_proj."""
        n, E, taps = len(h), self.spec.hp.n_embd, self.spec.hp.n_shortconv_l_cache
        bcx = self._mm(h, L.shortconv_in_proj)
        B, C, X = bcx[:, :E], bcx[:, E:2 * E], bcx[:, 2 * E:]
        buf.conv[slot, pos:pos + n] = (B * X).astype(np.float32)
        w = self._w[L.shortconv_conv].astype(np.float64)            # (n_embd, taps)
        hist = np.concatenate([np.zeros((taps - 1, E)), buf.conv[slot, :pos + n].astype(np.float64)])
        y = np.stack([(hist[pos + t:pos + t + taps].T * w).sum(1) for t in range(n)])
        return self._mm(C * y, L.shortconv_out_proj)

    def _deltanet(self, buf, slot, h, L):
        """qwen35's Gated DeltaNet for the rows h, token by token against the sequence's state
        (the canonical order: a prompt in one batch, in chunks or token by token gives the same
        bits). q|k|v through the causal convolution (the last ssm_d_conv - 1 inputs kept) and
        SiLU; q and k L2-normed; per value head h (key head h % n_group) the gated delta rule
        M *= exp(g); d = beta (v - M k); M += d k^T; o = M q / sqrt(S), the state rounded to
        float32 after each token as the compiled pass keeps it; o RMS-normed times silu(z)."""
        hp = self.spec.hp
        n, S, Hk, Hv, eps = len(h), hp.ssm_d_state, hp.ssm_n_group, hp.ssm_dt_rank, hp.rms_eps
        conv, M = layer_views(buf.recurrent.live, hp, slot)
        qkv = self._mm(h, L.attn_qkv)                                 # (n, conv_dim)
        z = self._mm(h, L.attn_gate).reshape(n, Hv, S)
        beta = 1.0 / (1.0 + np.exp(-self._mm(h, L.ssm_beta)))        # (n, Hv)
        alpha = self._mm(h, L.ssm_alpha) + self._w[L.ssm_dt]
        g = np.logaddexp(0.0, alpha) * self._w[L.ssm_a]               # softplus * -exp(A_log)
        win = np.concatenate([conv.astype(np.float64), qkv])          # (d_conv - 1 + n, C)
        w = self._w[L.ssm_conv1d].astype(np.float64)                  # (C, d_conv)
        taps = hp.ssm_d_conv
        c = silu(np.stack([(win[t:t + taps].T * w).sum(1) for t in range(n)]))
        conv[:] = win[n:].astype(np.float32)

        def l2(x):   # ggml: rms_norm(x, eps / S) / sqrt(S)
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps / S) / math.sqrt(S)
        q = l2(c[:, :S * Hk].reshape(n, Hk, S))
        k = l2(c[:, S * Hk:2 * S * Hk].reshape(n, Hk, S))
        v = c[:, 2 * S * Hk:].reshape(n, Hv, S)
        o = np.empty((n, Hv, S))
        for t in range(n):
            for hh in range(Hv):
                m = M[hh].astype(np.float64) * math.exp(g[t, hh])
                kk, qq = k[t, hh % Hk], q[t, hh % Hk]
                d = (v[t, hh] - m @ kk) * beta[t, hh]
                m = (m + d[:, None] * kk[None, :]).astype(np.float32)
                M[hh] = m
                o[t, hh] = (m.astype(np.float64) @ qq) / math.sqrt(S)
        o = rms_norm(o, self._w[L.ssm_norm], eps) * silu(z)
        return self._mm(o.reshape(n, Hv * S), L.ssm_out)

    def _attention_block(self, buf, il, L, x, h, pos, positions, factors, neox, group):
        """x plus the attention block's output for the rows h (the normed x)."""
        hp, a = self.spec.hp, self.spec.arch
        n = len(h)
        gate = None
        if hp.attn_gated_q:   # qwen35: each head's query, then its output gate
            qg = self._mm(h, L.attn_q).reshape(n, hp.n_head, 2, hp.head_dim)
            q, gate = qg[:, :, 0].reshape(n, -1), qg[:, :, 1]
            k, v = self._mm(h, L.attn_k), self._mm(h, L.attn_v)
        elif L.attn_qkv:
            qkv = self._mm(h, L.attn_qkv)
            q, k, v = np.split(qkv, [hp.n_embd_q, hp.n_embd_q + hp.n_embd_k_gqa], axis=1)
        else:
            q, k, v = self._mm(h, L.attn_q), self._mm(h, L.attn_k), self._mm(h, L.attn_v)
        if L.attn_q_bias:
            q = q + self._w[L.attn_q_bias]
            k = k + self._w[L.attn_k_bias]
            v = v + self._w[L.attn_v_bias]
        q = q.reshape(n, hp.n_head, hp.head_dim)
        k = k.reshape(n, hp.n_head_kv, hp.head_dim)
        v = v.reshape(n, hp.n_head_kv, hp.head_dim)
        if L.attn_q_norm:
            q = rms_norm(q, self._w[L.attn_q_norm], hp.rms_eps)
            k = rms_norm(k, self._w[L.attn_k_norm], hp.rms_eps)
        if a.altup:  # gemma3n: v RMS-normed too, without a weight
            v = rms_norm(v, 1.0, hp.rms_eps)
        swa = hp.swa_layers[il]
        base = hp.rope_freq_base_swa if swa else hp.rope_freq_base
        scale = hp.rope_freq_scale_swa if swa else hp.rope_freq_scale
        if hp.rope_layers[il]:
            yarn = (hp.rope_ext_factor, hp.n_ctx_orig, hp.yarn_beta_fast, hp.yarn_beta_slow)
            args = (hp.n_rot, base, scale, neox, factors, hp.rope_attn_factor, yarn)
            q = rope(q, positions, *args)
            k = rope(k, positions, *args)
        ck, cv = self.cache.k, self.cache.v
        rot_k, rot_v = self.cache.rotation(hp.head_dim)
        q, k, v = _rotate(q, rot_k), _rotate(k, rot_k), _rotate(v, rot_v)
        src = hp.kv_slots[hp.kv_layers[il]]  # gemma3n's last layers read an earlier layer's
        if hp.kv_layers[il] == il:
            buf.k[src, pos:pos + n] = k if ck == GGMLType.F16 else _stored(k, ck)
            buf.v[src, pos:pos + n] = v if cv == GGMLType.F16 else _stored(v, cv)
        K = buf.k[src, :pos + n].astype(np.float64)  # (n_kv, n_head_kv, hd)
        V = buf.v[src, :pos + n].astype(np.float64)
        # mask (n, n_kv): causal, and the sliding window on SWA layers
        kpos = np.arange(pos + n)
        lo, hi = getattr(buf, "noncausal", (0, -1))
        last = np.where((positions >= lo) & (positions <= hi), hi, positions)
        masked = kpos[None, :] > last[:, None]
        if swa and hp.n_swa:
            masked |= positions[:, None] - kpos[None, :] >= hp.n_swa
        # llama.cpp (no flash attention) rounds q to F16 for the product with the F16 K
        # cache (gemma3: after scaling it) and the softmax row to F16 for the one with V
        qs, kqs = (hp.attn_scale, 1.0) if a.scale_q else (1.0, hp.attn_scale)
        # (a quantized K: q in q8_0, as ggml's mul_mat / flash attention convert it)
        q16 = (q * qs).astype(np.float16).astype(np.float64) if ck == GGMLType.F16 \
            else _stored((q * qs).astype(np.float32), GGMLType.Q8_0).astype(np.float64)
        out = np.empty((n, hp.n_head, hp.head_dim))
        for hh in range(hp.n_head):
            kv = hh // group
            s = np.stack([K[:, kv, :] @ row for row in q16[:, hh, :]])  # (n, n_kv)
            if hp.attn_softcap:  # llama.cpp caps q.k before the softmax's scale
                s = np.tanh(s / hp.attn_softcap) * hp.attn_softcap
            s = s * kqs
            s[masked] = -np.inf
            if L.attn_sinks:  # gpt-oss: one more logit per head, in the sum only
                sink = np.full((n, 1), float(self._w[L.attn_sinks][hh]))
                s = softmax(np.concatenate([s, sink], axis=1))[:, :-1]
            else:
                s = softmax(s)
            if cv == GGMLType.F16:
                s = s.astype(np.float16).astype(np.float64)
            # else flash attention (llama.cpp's only way with a quantized V): float weights
            out[:, hh, :] = s @ V[:, kv, :]
        out = _rotate(out, rot_v)
        if gate is not None:
            out = out / (1.0 + np.exp(-gate))
        o = self._mm(out.reshape(n, -1), L.attn_output)
        if L.attn_output_bias:
            o = o + self._w[L.attn_output_bias]
        if L.post_attention_norm:
            o = rms_norm(o, self._w[L.post_attention_norm], hp.rms_eps)
        return x + o * hp.residual_scale

    def _moe(self, h, L):
        """Routed experts, token by token: softmax over the router's logits, the top k, their
        weights renormalised (qwen3moe), sum of weight * down(silu(gate) * up) per expert.
        gpt-oss: router and expert biases, the top k of the logits then softmax over those k,
        down(swiglu_oai(gate, up))."""
        hp, oai = self.spec.hp, self.spec.arch.act == "swiglu_oai"
        k = hp.n_expert_used
        logits = self._mm(h, L.ffn_gate_inp)                        # (n, n_expert)
        if L.ffn_gate_inp_bias:
            logits = logits + self._w[L.ffn_gate_inp_bias]
        p = logits if hp.expert_softmax_topk else softmax(logits)
        G, U, D = self._w[L.ffn_gate_exps], self._w[L.ffn_up_exps], self._w[L.ffn_down_exps]
        zeros = np.zeros(G.shape[:2])  # (n_expert, n_ff_exp): no bias
        gb, ub = self.W(L.ffn_gate_exps_bias), self.W(L.ffn_up_exps_bias)
        db = self.W(L.ffn_down_exps_bias)
        gb, ub = (zeros, zeros) if gb is None else (gb, ub)
        db = np.zeros(D.shape[:2]) if db is None else db             # (n_expert, n_embd)
        out = np.zeros_like(h)
        for t in range(len(h)):
            sel = np.argsort(-p[t], kind="stable")[:k]
            self.routed.setdefault(L.ffn_gate_inp, set()).update(int(e) for e in sel)
            w = softmax(p[t, sel]) if hp.expert_softmax_topk else p[t, sel]
            if hp.expert_weights_norm:
                w = w / max(w.sum(), EXPERT_WEIGHTS_SUM_MIN)
            x32 = h[t].astype(np.float32)
            for e, we in zip(sel, w):
                g = (G[e] @ x32).astype(np.float64) + gb[e]
                u = (U[e] @ x32).astype(np.float64) + ub[e]
                act = swiglu_oai(g, u) if oai else silu(g) * u
                d = (D[e] @ act.astype(np.float32)).astype(np.float64) + db[e]
                out[t] += we * d
        if L.ffn_up_shexp:  # the shared expert, gated by sigmoid(x . gate_inp_shexp)
            gate = 1.0 / (1.0 + np.exp(-self._mm(h, L.ffn_gate_inp_shexp))) \
                if L.ffn_gate_inp_shexp else 1.0     # (n, 1); granitehybrid's has no gate
            g, u = self._mm(h, L.ffn_gate_shexp), self._mm(h, L.ffn_up_shexp)
            out += self._mm(silu(g) * u, L.ffn_down_shexp) * gate
        return out

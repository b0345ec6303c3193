"""Readable NumPy reference for ggml's weight types: dequantization and llama.cpp's reference
quantizers (no importance matrix; IQ4_NL / IQ4_XS take one, as llama.cpp's do).

Block layouts are llama.cpp's (as stored in GGUF). Every function works on whole blocks at once
(vectorised over blocks); loops run only over positions inside a block where llama.cpp's
algorithm is sequential, so float32 rounding happens in the same order as in C.

    dequantize(raw_uint8, qtype, shape) -> float32 array of `shape` (GGUF order reversed, i.e.
        shape[-1] is the row length)
    quantize(x_f32, qtype) -> uint8 array (rows, row_bytes)
    quantize_q8_K(x_f32) -> uint8 array: the Q8_K activation blocks the K-quant dot products use

This is the slow twin of the compiled kernels and the oracle the tests compare them with;
dequantize is itself checked bit for bit against the PyPI gguf package.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from ..errors import UnsupportedModelError
from .gguf import GGMLType, TYPE_INFO

QK = 32      # elements per block of the 32-block types
QK_K = 256   # elements per super-block of the K-quants
GROUP_MAX_EPS = np.float32(1e-15)

F32 = np.float32


# ------------------------------------------------------------------------------ helpers ---
def _f16(raw):
    """(n, 2) uint8 -> (n, 1) float32 from IEEE half."""
    return np.ascontiguousarray(raw).view(np.float16).astype(F32)


def _to_f16_bytes(x):
    """(n,) or (n, 1) float32 -> (n, 2) uint8 half bytes (round to nearest even, as ggml)."""
    return np.asarray(x, dtype=F32).reshape(-1, 1).astype(np.float16).view(np.uint8)


def _nibbles(qs):
    """(n, 16) packed nibbles -> (n, 32): low nibbles first, then high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits(packed, n_bits):
    """(n, m) uint8 -> (n, m*8) uint8 of single bits, little-endian within each byte."""
    return np.unpackbits(packed, axis=-1, bitorder="little")[..., :n_bits]


def _bit_planes(h32):
    """Q3_K hmask / Q5_K qh: (n, 32) -> (n, 256): element 32*j + l is bit j of h32[l]."""
    n = h32.shape[0]
    return ((h32.reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1).reshape(n, QK_K)


def _pack_bit_planes(bits):
    """Inverse of _bit_planes: (n, 256) of 0/1 -> (n, 32)."""
    n = bits.shape[0]
    planes = bits.astype(np.uint8).reshape(n, 8, 32).transpose(0, 2, 1)
    return np.packbits(planes, axis=-1, bitorder="little").reshape(n, 32)


def _abs_max_signed(x):
    """Per row of x (n, k): the value with the largest magnitude (first one on ties)."""
    idx = np.argmax(np.abs(x), axis=-1)
    return np.take_along_axis(x, idx[:, None], axis=-1)  # (n, 1)


def nearest_int(v):
    """llama.cpp's nearest_int: round half to even (float32 magic-number trick)."""
    return np.rint(np.asarray(v, dtype=F32)).astype(np.int32)


def roundf(v):
    """C roundf: half away from zero."""
    v = np.asarray(v, dtype=F32)
    return (np.sign(v) * np.floor(np.abs(v) + F32(0.5))).astype(F32)


def k_scale_min(scales12):
    """Q4_K/Q5_K packed 6-bit scales: (n, 12) -> (sc (n, 8), m (n, 8)) as uint8."""
    s = scales12
    sc = np.empty(s.shape[:-1] + (8,), np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def q3_k_scales(scales12):
    """Q3_K packed 6-bit scales: (n, 12) -> (n, 16) int8 with the -32 offset applied."""
    s = scales12
    low = np.concatenate([s[..., 0:8] & 0x0F, s[..., 0:8] >> 4], axis=-1)
    high = np.concatenate([(s[..., 8:12] >> (2 * k)) & 3 for k in range(4)], axis=-1)
    return ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8)


# ----------------------------------------------------------------- dequantize per type ----
def _dq_block32(b, bits, with_min):
    """Q4_0/Q4_1/Q5_0/Q5_1 blocks: f16 d, [f16 m,] [qh[4] (5 bits),] qs[16]. Without a min the
    levels are centred on 2^(bits-1)."""
    d = _f16(b[:, 0:2])
    o = 4 if with_min else 2
    if bits == 5:
        q = _nibbles(b[:, o + 4:o + 20]) | (_bits(b[:, o:o + 4], 32) << 4)
    else:
        q = _nibbles(b[:, o:o + 16])
    if with_min:
        return d * q.astype(F32) + _f16(b[:, 2:4])
    q = q.astype(np.int8) - np.int8(1 << (bits - 1))
    return d * q.astype(F32)


def _dq_q8_0(b):
    return np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(F32) * _f16(b[:, 0:2])


def _crumbs(qs64):
    """Q2_K/Q3_K 2-bit fields: (n, 64) -> (n, 256) in element order: for each half of 128,
    shifts 0, 2, 4, 6 over 32 bytes."""
    n = qs64.shape[0]
    q = qs64.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return (q & 3).reshape(n, QK_K)


def _k_groups(q, d, sc, dmin=None, mn=None):
    """K-quant values from levels q (n, 256) in G groups: d*sc[g] * q, minus dmin*mn[g] for the
    types with mins; d, dmin (n, 1), sc, mn (n, G)."""
    n, g = sc.shape
    dl = (d * sc.astype(F32)).reshape(n, g, 1)
    v = dl * q.reshape(n, g, QK_K // g).astype(F32)
    if dmin is not None:
        v = v - (dmin * mn.astype(F32)).reshape(n, g, 1)
    return v.reshape(n, QK_K)


def _dq_q2_K(b):
    scales, qs = b[:, 0:16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    return _k_groups(_crumbs(qs), d, scales & 0x0F, dmin, scales >> 4)


def _dq_q3_K(b):
    hmask, qs, scales = b[:, 0:32], b[:, 32:96], b[:, 96:108]
    q = _crumbs(qs).astype(np.int8) - ((_bit_planes(hmask) ^ 1) << 2).astype(np.int8)
    return _k_groups(q, _f16(b[:, 108:110]), q3_k_scales(scales))


def _k4_values(qs128):
    """Q4_K/Q5_K low nibbles: (n, 128) -> (n, 256): per 32 bytes, 32 low then 32 high."""
    n = qs128.shape[0]
    q = qs128.reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, QK_K)


def _dq_k4(b, with_qh):
    """Q4_K, Q5_K (with_qh): f16 d, f16 dmin, scales[12], [qh[32],] qs[128]."""
    sc, m = k_scale_min(b[:, 4:16])
    if with_qh:
        q = _k4_values(b[:, 48:176]) | (_bit_planes(b[:, 16:48]) << 4)
    else:
        q = _k4_values(b[:, 16:144])
    return _k_groups(q, _f16(b[:, 0:2]), sc, _f16(b[:, 2:4]), m)


def _dq_q6_K(b):
    n = b.shape[0]
    ql, qh = b[:, 0:128], b[:, 128:192]
    scales = np.ascontiguousarray(b[:, 192:208]).view(np.int8)
    d = _f16(b[:, 208:210])
    # per half of 128: ql[0:32] low, ql[32:64] low, ql[0:32] high, ql[32:64] high
    low = ql.reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    low = (low & 0x0F).reshape(n, 2, 4, 32)
    high = qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    high = (high & 3).reshape(n, 2, 4, 32)
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)
    return _k_groups(q.reshape(n, QK_K), d, scales)


# the table types: nibbles index a 16-entry int8 table (llama.cpp's kvalues_iq4nl, and its
# kvalues_mxfp4: the e2m1 values doubled, with the E8M0 scale halved to match)
KV_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
KV_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)


def e8m0_half(e):
    """E8M0 exponent bytes -> float32 2^(e - 128), half the scale (e < 2: subnormals)."""
    e = np.asarray(e, np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(F32)


def _dq_iq4_nl(b):
    return _f16(b[:, 0:2]) * KV_IQ4NL[_nibbles(b[:, 2:18])].astype(F32)


def iq4_xs_scales(b):
    """IQ4_XS blocks (n, 136) -> (n, 8) sub-block scales 0..63 (the weight scale is d * (ls - 32))."""
    h = np.ascontiguousarray(b[:, 2:4]).view(np.uint16)
    lo = np.stack([b[:, 4:8] & 0x0F, b[:, 4:8] >> 4], axis=-1).reshape(-1, 8)
    hi = ((h >> (2 * np.arange(8, dtype=np.uint16))) & 3).astype(np.uint8)
    return lo | (hi << 4)


def _dq_iq4_xs(b):
    n = b.shape[0]
    dl = (_f16(b[:, 0:2]) * (iq4_xs_scales(b).astype(np.int8) - np.int8(32)).astype(F32)).reshape(n, 8, 1)
    q = KV_IQ4NL[_nibbles(b[:, 8:136].reshape(n * 8, 16))].astype(F32).reshape(n, 8, 32)
    return (dl * q).reshape(n, QK_K)


def _dq_mxfp4(b):
    return e8m0_half(b[:, 0:1]) * KV_MXFP4[_nibbles(b[:, 1:17])].astype(F32)


# the 32-block types of one layout family: (bits per level, with a min)
_BLOCK32 = {GGMLType.Q4_0: (4, False), GGMLType.Q4_1: (4, True), GGMLType.Q5_0: (5, False),
            GGMLType.Q5_1: (5, True)}


def _type(qtype):
    try:
        t = GGMLType(int(qtype))
    except ValueError:
        raise UnsupportedModelError(f"unknown ggml type id {int(qtype)}") from None
    if t not in SUPPORTED:
        raise UnsupportedModelError(f"ggml type {t.name} is not supported")
    return t


def row_bytes(qtype, n):
    info = TYPE_INFO[_type(qtype)]
    if n % info.block_size:
        raise UnsupportedModelError(
            f"row length {n} is not a multiple of the {GGMLType(qtype).name} block size {info.block_size}")
    return n // info.block_size * info.type_size


def dequantize(raw, qtype, shape):
    """raw uint8 bytes of a tensor -> float32 array of `shape` (numpy order: last axis = row).

    `shape` may also be given in GGUF order as a tuple whose product matches; only the element
    count and the row length (shape[-1]) matter for decoding.
    """
    t = _type(qtype)
    shape = tuple(int(s) for s in shape)
    n = int(np.prod(shape)) if shape else 1
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    info = TYPE_INFO[t]
    need = n // info.block_size * info.type_size
    if n % info.block_size or raw.size != need:
        raise UnsupportedModelError(
            f"{t.name} tensor of shape {shape}: expected {need} bytes, got {raw.size}")
    if t == GGMLType.F32:
        out = raw.view(F32).copy()
    elif t == GGMLType.F16:
        out = raw.view(np.float16).astype(F32)
    elif t == GGMLType.BF16:
        out = (raw.view(np.uint16).astype(np.uint32) << 16).view(F32)
    else:
        out = _BLOCK_TYPES[t][0](raw.reshape(-1, info.type_size)).astype(F32, copy=False)
    return out.reshape(shape)


# ================================================================ quantization ============
# 32-blocks: byte-identical to llama.cpp's quantize_row_*_ref.
def _inv(d):
    with np.errstate(divide="ignore"):
        return np.where(d == 0, F32(0), F32(1) / d).astype(F32)


def _trunc_u8(v):
    """C's (int8_t)(float) then uint8: truncation toward zero."""
    return np.trunc(v).astype(np.int32)


def _pack_nibbles(q):
    """(n, 32) values < 16 -> (n, 16): element j low nibble, element j+16 high nibble."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def _pack_qh(q):
    """(n, 32) 5-bit values -> (n, 4) bytes of the 5th bits (bit j = element j)."""
    return np.packbits(((q >> 4) & 1).astype(np.uint8), axis=-1, bitorder="little")


def _q_block32(x, bits, with_min):
    """Q4_0/Q4_1/Q5_0/Q5_1 blocks (n, 32) -> (n, type_size): f16 d, [f16 min,] [qh,] qs."""
    nmax = (1 << bits) - 1
    if with_min:
        mn, mx = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
        d = ((mx - mn) / F32(nmax)).astype(F32)
        q = _trunc_u8((x - mn) * _inv(d) + F32(0.5))
        head = [_to_f16_bytes(d), _to_f16_bytes(mn)]
    else:
        half = 1 << (bits - 1)
        d = (_abs_max_signed(x) / F32(-half)).astype(F32)
        q = _trunc_u8(x * _inv(d) + F32(half + 0.5))
        head = [_to_f16_bytes(d)]
    # llama.cpp does not clamp Q5_1; there (x - min) * id + 0.5 stays below 32 on finite input,
    # and the out-of-range casts of inf/NaN keep the same stored bits either way
    q = np.minimum(nmax, q)
    if bits == 5:
        head.append(_pack_qh(q))
        q = q & 0x0F
    return np.concatenate(head + [_pack_nibbles(q)], axis=-1)


def _q_q8_0(x):
    d = (np.abs(x).max(axis=-1, keepdims=True) / F32(127)).astype(F32)
    q = roundf(x * _inv(d)).astype(np.int8).view(np.uint8)
    return np.concatenate([_to_f16_bytes(d), q], axis=-1)


# K-quants: llama.cpp's quantize_row_*_ref (make_qkx2_quants, make_q3_quants, make_qx_quants).
def _fit_error(x, w, L, scale, mn, use_mad):
    """sum_i w_i * err(scale * L_i + mn - x_i), err = |.| (use_mad) or squared; x, w, L (n, k),
    scale, mn (n,). Sequential float32 accumulation over k, as in C."""
    Lf = L.astype(F32)
    err = np.zeros(x.shape[0], F32)
    for i in range(x.shape[1]):
        diff = (scale * Lf[:, i] + mn - x[:, i]).astype(F32)
        diff = np.abs(diff) if use_mad else diff * diff
        err = (err + w[:, i] * diff).astype(F32)
    return err


def _sums_wxl_wll(x, w, L):
    """(sum_i w_i x_i L_i, sum_i w_i L_i^2) per row, sequential float32 as in C."""
    Lf = L.astype(F32)
    sumlx = np.zeros(x.shape[0], F32); suml2 = np.zeros(x.shape[0], F32)
    for i in range(x.shape[1]):
        sumlx = (sumlx + w[:, i] * x[:, i] * Lf[:, i]).astype(F32)
        suml2 = (suml2 + w[:, i] * Lf[:, i] * Lf[:, i]).astype(F32)
    return sumlx, suml2


def _group_max(x):
    """Per row of x (n, k): the value of largest magnitude as a divisor (n,), 1 in the rows whose
    values all lie below GROUP_MAX_EPS, and those rows (n,) bool, which llama.cpp sets to 0."""
    mx = _abs_max_signed(x)[:, 0]
    zero = np.abs(mx) < GROUP_MAX_EPS
    return np.where(zero, F32(1), mx).astype(F32), zero


def _signed_fit_result(scale, L, zero, nmax):
    """make_q3/make_qx's result: levels in [-nmax, nmax) moved to [0, 2 nmax); scale and levels 0
    in the rows below GROUP_MAX_EPS."""
    return np.where(zero, F32(0), scale), np.where(zero[:, None], 0, L + nmax)


def make_qkx2_quants(x, w, nmax, rmin, rdelta, nstep, use_mad):
    """Scale + min fit of groups x (n, k) with weights w: -> (scale (n,), the_min (n,), L (n, k)).

    Sequential float32 accumulation over k, as in C."""
    n, k = x.shape
    mn = x.min(axis=-1).astype(F32)
    mx = x.max(axis=-1).astype(F32)
    sum_w = w[:, 0].copy()
    sum_x = (sum_w * x[:, 0]).astype(F32)
    for i in range(1, k):
        sum_w = (sum_w + w[:, i]).astype(F32)
        sum_x = (sum_x + w[:, i] * x[:, i]).astype(F32)
    mn = np.minimum(mn, F32(0))
    flat = mx == mn
    rng = np.where(flat, F32(1), mx - mn).astype(F32)
    iscale = (F32(nmax) / rng).astype(F32)
    scale = (F32(1) / iscale).astype(F32)
    L = np.clip(nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax)
    best = _fit_error(x, w, L, scale, mn, use_mad)
    for step in range(nstep + 1):
        # llama.cpp moves `min` when a step wins, and later steps use the moved min
        rng = np.where(flat, F32(1), mx - mn).astype(F32)
        isc = ((F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / rng).astype(F32)
        La = np.clip(nearest_int(isc[:, None] * (x - mn[:, None])), 0, nmax)
        Lf = La.astype(F32)
        sl = np.zeros(n, F32); sl2 = np.zeros(n, F32); sxl = np.zeros(n, F32)
        for i in range(k):
            wl = (w[:, i] * Lf[:, i]).astype(F32)
            sl = (sl + wl).astype(F32)
            sl2 = (sl2 + wl * Lf[:, i]).astype(F32)
            sxl = (sxl + wl * x[:, i]).astype(F32)
        D = (sum_w * sl2 - sl * sl).astype(F32)
        ok = D > 0
        Ds = np.where(ok, D, F32(1)).astype(F32)
        this_scale = ((sum_w * sxl - sum_x * sl) / Ds).astype(F32)
        this_min = ((sl2 * sum_x - sl * sxl) / Ds).astype(F32)
        pos = this_min > 0
        sl2s = np.where(sl2 == 0, F32(1), sl2)
        this_scale = np.where(pos, sxl / sl2s, this_scale).astype(F32)
        this_min = np.where(pos, F32(0), this_min).astype(F32)
        cur = _fit_error(x, w, La, this_scale, this_min, use_mad)
        better = ok & (cur < best) & ~flat
        L = np.where(better[:, None], La, L)
        best = np.where(better, cur, best)
        scale = np.where(better, this_scale, scale)
        mn = np.where(better, this_min, mn)
    scale = np.where(flat, F32(0), scale).astype(F32)
    L = np.where(flat[:, None], 0, L)
    return scale, (-mn).astype(F32), L


def make_q3_quants(x, nmax):
    """Signed scale fit with rmse iteration (do_rmse=true): x (n, k) -> (scale (n,), L (n, k))
    with L in [0, 2*nmax)."""
    n, k = x.shape
    mxs, zero = _group_max(x)
    iscale = (F32(-nmax) / mxs).astype(F32)
    L = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
    w = (x * x).astype(F32)
    sumlx, suml2 = _sums_wxl_wll(x, w, L)
    active = ~zero
    for _ in range(5):
        changed = np.zeros(n, bool)
        for i in range(k):
            wi, xi, li = w[:, i], x[:, i], L[:, i].astype(F32)
            slx = (sumlx - wi * xi * li).astype(F32)
            cand = active & (slx > 0)
            sl2 = (suml2 - wi * li * li).astype(F32)
            new_l = np.clip(nearest_int(xi * sl2 / np.where(slx > 0, slx, F32(1))), -nmax, nmax - 1)
            nlf = new_l.astype(F32)
            cand &= new_l != L[:, i]
            slx2 = (slx + wi * xi * nlf).astype(F32)
            sl22 = (sl2 + wi * nlf * nlf).astype(F32)
            accept = cand & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            L[:, i] = np.where(accept, new_l, L[:, i])
            sumlx = np.where(accept, slx2, sumlx)
            suml2 = np.where(accept, sl22, suml2)
            changed |= accept
        active &= changed
        if not active.any():
            break
    scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, F32(1)), F32(0)).astype(F32)
    return _signed_fit_result(scale, L, zero, nmax)


def make_qx_quants_rmse1(x, nmax):
    """make_qx_quants with rmse_type 1 (weights x^2), no quant weights: -> (scale, L in [0, 2nmax))."""
    mxs, zero = _group_max(x)
    w = (x * x).astype(F32)

    def fit(iscale):
        l = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
        return (l,) + _sums_wxl_wll(x, w, l)

    L, sumlx, suml2 = fit((F32(-nmax) / mxs).astype(F32))
    scale = np.where(suml2 != 0, sumlx / np.where(suml2 != 0, suml2, F32(1)), F32(0)).astype(F32)
    best = (scale * sumlx).astype(F32)
    for s in range(-9, 10):
        if s == 0:
            continue
        isc = (-(F32(nmax) + F32(0.1) * F32(s)) / mxs).astype(F32)
        l, slx, sl2 = fit(isc)
        better = (sl2 > 0) & (slx * slx > best * sl2)
        L = np.where(better[:, None], l, L)
        scale = np.where(better, slx / np.where(sl2 > 0, sl2, F32(1)), scale).astype(F32)
        best = np.where(better, scale * slx, best).astype(F32)
    return _signed_fit_result(scale, L, zero, nmax)


def _pack_k_scales(ls, lm):
    """6-bit scales/mins (n, 8) -> Q4_K/Q5_K packed (n, 12)."""
    ls = ls.astype(np.uint8); lm = lm.astype(np.uint8)
    out = np.zeros((ls.shape[0], 12), np.uint8)
    out[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    out[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:8] & 0x0F) | ((lm[:, 4:8] & 0x0F) << 4)
    return out


def _pack_crumbs(L):
    """(n, 256) 2-bit values -> (n, 64) in Q2_K/Q3_K order."""
    n = L.shape[0]
    L = L.astype(np.uint8).reshape(n, 2, 4, 32)
    return (L[:, :, 0] | (L[:, :, 1] << 2) | (L[:, :, 2] << 4) | (L[:, :, 3] << 6)).reshape(n, 64)


def _requant(x, d, dm, lo, hi, L):
    """The K-quants' last pass: groups x (n, G, g) quantized again against their stored scales d
    and mins dm (n, G, 1; dm None for the symmetric types): clip(nearest_int((x + dm) / d), lo,
    hi) - lo; a group whose scale is 0 keeps the levels L (n, G, g) of the fit."""
    ok = d != 0
    ds = np.where(ok, d, F32(1)).astype(F32)
    v = x if dm is None else x + dm
    return np.where(ok, np.clip(nearest_int(v / ds), lo, hi) - lo, L)


def _q_q2_K(x):
    nb = x.shape[0]
    g = x.reshape(nb * 16, 16)
    scales, mins, L = make_qkx2_quants(g, np.abs(g).astype(F32), 3, -0.5, 0.1, 15, True)
    scales = scales.reshape(nb, 16); mins = mins.reshape(nb, 16); L = L.reshape(nb, 16, 16)
    max_scale = np.maximum(scales.max(axis=-1), F32(0)); max_min = np.maximum(mins.max(axis=-1), F32(0))
    q4 = F32(15)
    has_s, has_m = max_scale > 0, max_min > 0
    isc = (q4 / np.where(has_s, max_scale, F32(1))).astype(F32)
    ls = np.where(has_s[:, None], nearest_int(isc[:, None] * scales), 0)
    imn = (q4 / np.where(has_m, max_min, F32(1))).astype(F32)
    lm = np.where(has_m[:, None], nearest_int(imn[:, None] * mins), 0)
    sc_byte = ((ls & 0xFF) | ((lm << 4) & 0xFF)).astype(np.uint8)  # C stores into uint8
    d16 = _to_f16_bytes(np.where(has_s, max_scale / q4, F32(0)).astype(F32))
    m16 = _to_f16_bytes(np.where(has_m, max_min / q4, F32(0)).astype(F32))
    d = (_f16(d16) * (sc_byte & 0x0F).astype(F32)).astype(F32)[:, :, None]
    dm = (_f16(m16) * (sc_byte >> 4).astype(F32)).astype(F32)[:, :, None]
    L = _requant(x.reshape(nb, 16, 16), d, dm, 0, 3, L).reshape(nb, QK_K)
    return np.concatenate([sc_byte, _pack_crumbs(L), d16, m16], axis=-1)


def _q_q3_K(x):
    nb = x.shape[0]
    scales, L = make_q3_quants(x.reshape(nb * 16, 16), 4)
    scales = scales.reshape(nb, 16); L = L.reshape(nb, 16, 16)
    max_scale = _abs_max_signed(scales)[:, 0]
    has = max_scale != 0
    iscale = (F32(-32) / np.where(has, max_scale, F32(1))).astype(F32)
    l = np.clip(nearest_int(iscale[:, None] * scales), -32, 31) + 32
    l = np.where(has[:, None], l, 0).astype(np.uint8)
    packed = np.zeros((nb, 12), np.uint8)
    packed[:, 0:8] = (l[:, 0:8] & 0x0F) | ((l[:, 8:16] & 0x0F) << 4)
    for j in range(16):
        packed[:, 8 + j % 4] |= (l[:, j] >> 4) << (2 * (j // 4))
    d16 = _to_f16_bytes(np.where(has, F32(1) / iscale, F32(0)).astype(F32))
    sc = q3_k_scales(packed).astype(F32)
    d = (_f16(d16) * sc).astype(F32)[:, :, None]
    L = _requant(x.reshape(nb, 16, 16), d, None, -4, 3, L).reshape(nb, QK_K)
    high = L > 3
    low = np.where(high, L - 4, L)
    return np.concatenate([_pack_bit_planes(high), _pack_crumbs(low), packed, d16], axis=-1)


def _q_k4_common(x, nmax, rmin, rdelta, nstep):
    nb = x.shape[0]
    g = x.reshape(nb * 8, 32)
    sum_x2 = np.zeros(g.shape[0], F32)
    for i in range(32):
        sum_x2 = (sum_x2 + g[:, i] * g[:, i]).astype(F32)
    av_x = np.sqrt(sum_x2 / F32(32)).astype(F32)
    w = (av_x[:, None] + np.abs(g)).astype(F32)
    scales, mins, L = make_qkx2_quants(g, w, nmax, rmin, rdelta, nstep, False)
    scales = scales.reshape(nb, 8); mins = mins.reshape(nb, 8)
    max_scale = np.maximum(scales.max(axis=-1), F32(0)); max_min = np.maximum(mins.max(axis=-1), F32(0))
    inv_s = np.where(max_scale > 0, F32(63) / np.where(max_scale > 0, max_scale, F32(1)), F32(0)).astype(F32)
    inv_m = np.where(max_min > 0, F32(63) / np.where(max_min > 0, max_min, F32(1)), F32(0)).astype(F32)
    ls = np.minimum(63, nearest_int(inv_s[:, None] * scales) & 0xFF)
    lm = np.minimum(63, nearest_int(inv_m[:, None] * mins) & 0xFF)
    packed = _pack_k_scales(ls, lm)
    d16 = _to_f16_bytes((max_scale / F32(63)).astype(F32))
    m16 = _to_f16_bytes((max_min / F32(63)).astype(F32))
    sc, m = k_scale_min(packed)
    d = (_f16(d16) * sc.astype(F32)).astype(F32)[:, :, None]
    dm = (_f16(m16) * m.astype(F32)).astype(F32)[:, :, None]
    L = _requant(x.reshape(nb, 8, 32), d, dm, 0, nmax, L.reshape(nb, 8, 32)).reshape(nb, QK_K)
    return d16, m16, packed, L


def _q_q4_K(x):
    d16, m16, packed, L = _q_k4_common(x, 15, -1.0, 0.1, 20)
    nb = x.shape[0]
    L = L.astype(np.uint8).reshape(nb, 4, 2, 32)
    qs = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(nb, 128)
    return np.concatenate([d16, m16, packed, qs], axis=-1)


def _q_q5_K(x):
    d16, m16, packed, L = _q_k4_common(x, 31, -0.5, 0.1, 15)
    nb = x.shape[0]
    L = L.astype(np.uint8)
    qh = _pack_bit_planes((L >> 4) & 1)
    L = L.reshape(nb, 4, 2, 32)
    qs = ((L[:, :, 0] & 0x0F) | ((L[:, :, 1] & 0x0F) << 4)).reshape(nb, 128)
    return np.concatenate([d16, m16, packed, qh, qs], axis=-1)


def _q_q6_K(x):
    nb = x.shape[0]
    scales, L = make_qx_quants_rmse1(x.reshape(nb * 16, 16), 32)
    scales = scales.reshape(nb, 16); L = L.reshape(nb, 16, 16)
    max_scale, zero = _group_max(scales)
    iscale = (F32(-128) / max_scale).astype(F32)
    d16 = _to_f16_bytes(np.where(zero, F32(0), F32(1) / iscale).astype(F32))
    sc = np.minimum(127, nearest_int(iscale[:, None] * scales)).astype(np.int8)
    sc = np.where(zero[:, None], np.int8(0), sc)
    d = (_f16(d16) * sc.astype(F32)).astype(F32)[:, :, None]
    L = _requant(x.reshape(nb, 16, 16), d, None, -32, 31, L).reshape(nb, QK_K)
    L = np.where(zero[:, None], 0, L).astype(np.uint8).reshape(nb, 2, 4, 32)
    ql = np.concatenate([L[:, :, 0] & 0x0F | ((L[:, :, 2] & 0x0F) << 4),
                         L[:, :, 1] & 0x0F | ((L[:, :, 3] & 0x0F) << 4)], axis=-1).reshape(nb, 128)
    qh = ((L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4)
          | ((L[:, :, 3] >> 4) << 6)).reshape(nb, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), d16], axis=-1)
    out[zero] = 0
    return out


# Table types: llama.cpp's quantize_row_iq4_nl_impl (ntry 7) and quantize_row_mxfp4_ref.
_KV_F = KV_IQ4NL.astype(F32)


def best_index_int8(x):
    """llama.cpp's best_index_int8 over the IQ4 table: the nearest entry, the upper on ties."""
    x = np.asarray(x, F32)
    mu = np.clip(np.searchsorted(_KV_F, x, side="right"), 1, 15)
    idx = np.where(x - _KV_F[mu - 1] < _KV_F[mu] - x, mu - 1, mu)
    return np.where(x <= _KV_F[0], 0, np.where(x >= _KV_F[15], 15, idx))


def _iq4_sums(xb, w, idv):
    """sum w q x and sum w q q over the 32 weights of each sub-block (sequential, as in C), q
    the table value nearest id * x; xb, w (m, 32), idv (m,)."""
    sqx = np.zeros(xb.shape[0], F32)
    sq2 = np.zeros(xb.shape[0], F32)
    for j in range(32):
        q = _KV_F[best_index_int8(idv * xb[:, j])]
        wq = w[:, j] * q
        sqx = sqx + wq * xb[:, j]
        sq2 = sq2 + wq * q
    return sqx, sq2


def _q_iq4(x, qw, nsub):
    """IQ4_NL (nsub 1) / IQ4_XS (nsub 8) super-blocks (n, 32 nsub) -> (d16 (n, 2), packed
    scales_h (n, 2), scales_l (n, 4) for IQ4_XS, nibbles (n, 16 nsub)). qw: importance weights
    of the same shape, or None."""
    n = x.shape[0]
    m = n * nsub
    xb = x.reshape(m, 32)
    if qw is not None:
        sigma2 = np.zeros(n, F32)
        for j in range(32 * nsub):
            sigma2 = sigma2 + x[:, j] * x[:, j]
        sigma2 = sigma2 * F32(2.0 / (32 * nsub))
        w = (qw.reshape(m, 32) * np.sqrt(np.repeat(sigma2, nsub)[:, None] + xb * xb)).astype(F32)
    else:
        w = xb * xb
    mx = _abs_max_signed(xb)[:, 0]
    live = np.abs(mx) >= GROUP_MAX_EPS
    safe = np.where(live, mx, F32(1))
    with np.errstate(divide="ignore", invalid="ignore"):
        d0 = (-safe / F32(-127)).astype(F32)
        sqx, sq2 = _iq4_sums(xb, w, (F32(1) / d0).astype(F32))
        d = np.where(sq2 > 0, sqx / sq2, F32(0)).astype(F32)
        best = d * sqx
        for itry in range(-7, 8):
            sqx, sq2 = _iq4_sums(xb, w, (F32(itry - 127) / safe).astype(F32))
            better = (sq2 > 0) & (sqx * sqx > best * sq2)
            d = np.where(better, sqx / sq2, d).astype(F32)
            best = np.where(better, d * sqx, best).astype(F32)
    scales = np.where(live, d, F32(0)).astype(F32).reshape(n, nsub)
    if nsub == 1:
        ds = scales[:, 0]
        d16 = _to_f16_bytes(ds)
        L = best_index_int8(_inv(ds)[:, None] * x)
        return d16, None, None, _pack_nibbles(L.reshape(n, 32))
    max_scale = _abs_max_signed(scales)[:, 0]
    dsup = (-max_scale / F32(32)).astype(F32)
    idsup = _inv(dsup)
    ls = np.clip(nearest_int(idsup[:, None] * scales), -32, 31)
    dl = (dsup[:, None] * ls.astype(F32)).astype(F32)
    L = best_index_int8(_inv(dl).reshape(m, 1) * xb)
    ls = (ls + 32).astype(np.uint16)
    scales_h = ((ls >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(axis=-1, dtype=np.uint16)
    lo = (ls & 0x0F).astype(np.uint8)
    scales_l = lo[:, 0::2] | (lo[:, 1::2] << 4)
    return (_to_f16_bytes(dsup), scales_h.reshape(n, 1).view(np.uint8), scales_l,
            _pack_nibbles(L).reshape(n, 16 * nsub))


def _q_iq4_nl(x, qw=None):
    d16, _, _, qs = _q_iq4(x, qw, 1)
    return np.concatenate([d16, qs], axis=-1)


def _q_iq4_xs(x, qw=None):
    return np.concatenate(_q_iq4(x, qw, 8), axis=-1)


def _q_mxfp4(x):
    amax = np.abs(x).max(axis=-1)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, F32(1)))) - 2 + 127, 0)
    e = e.astype(np.int32).astype(np.uint8)
    d = e8m0_half(e)[:, None, None]
    err = np.abs((KV_MXFP4.astype(F32).reshape(1, 1, 16) * d).astype(F32) - x[:, :, None])
    q = np.argmin(err, axis=-1)  # the first of equal errors, as the C loop keeps
    return np.concatenate([e[:, None], _pack_nibbles(q)], axis=-1)


# Every weight type, one row each: the float types (converted inline), then each block type's
# dequantizer and quantizer. The compiled core's list (cython_kernels/kernels/ed_types.h,
# ED_TYPES) is checked against this one, and gguf.py's ids and block sizes against both
# (tests/format/test_type_list.py).
FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
_BLOCK_TYPES = {
    **{t: (partial(_dq_block32, bits=b, with_min=m), partial(_q_block32, bits=b, with_min=m))
       for t, (b, m) in _BLOCK32.items()},
    GGMLType.Q8_0: (_dq_q8_0, _q_q8_0),
    GGMLType.Q2_K: (_dq_q2_K, _q_q2_K),
    GGMLType.Q3_K: (_dq_q3_K, _q_q3_K),
    GGMLType.Q4_K: (partial(_dq_k4, with_qh=False), _q_q4_K),
    GGMLType.Q5_K: (partial(_dq_k4, with_qh=True), _q_q5_K),
    GGMLType.Q6_K: (_dq_q6_K, _q_q6_K),
    GGMLType.IQ4_NL: (_dq_iq4_nl, _q_iq4_nl),
    GGMLType.IQ4_XS: (_dq_iq4_xs, _q_iq4_xs),
    GGMLType.MXFP4: (_dq_mxfp4, _q_mxfp4),
}
BLOCK_TYPES = tuple(_BLOCK_TYPES)
SUPPORTED = FLOAT_TYPES + BLOCK_TYPES


# the types whose quantizer takes an importance matrix here (llama.cpp's *_impl with
# quant_weights); llama.cpp's Q8_0 and MXFP4 quantizers ignore one
WEIGHTED = (GGMLType.IQ4_NL, GGMLType.IQ4_XS)
IGNORES_WEIGHTS = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.MXFP4)


def quantize(x, qtype, quant_weights=None):
    """float rows (..., k) -> uint8 (rows, row_bytes) in `qtype`, llama.cpp's reference algorithm;
    quant_weights (k,): an importance matrix row for the WEIGHTED types (llama.cpp's algorithm
    with quant_weights)."""
    t = _type(qtype)
    if quant_weights is not None and t not in IGNORES_WEIGHTS:
        if t not in WEIGHTED:
            raise UnsupportedModelError(f"no importance-matrix quantizer for {t.name} (edged has one "
                                        f"for {', '.join(w.name for w in WEIGHTED)})")
        x = np.asarray(x, dtype=F32)
        k = x.shape[-1]
        bs = TYPE_INFO[t].block_size
        rows = x.reshape(-1, k)
        qw = np.tile(np.asarray(quant_weights, F32).reshape(-1, bs), (rows.shape[0], 1))
        out = _BLOCK_TYPES[t][1](np.ascontiguousarray(rows.reshape(-1, bs)), qw)
        return out.reshape(rows.shape[0], row_bytes(t, k))
    x = np.asarray(x, dtype=F32)
    k = x.shape[-1] if x.ndim else 1
    x2 = x.reshape(-1, k)
    rb = row_bytes(t, k)
    if t == GGMLType.F32:
        return x2.copy().view(np.uint8)
    if t == GGMLType.F16:
        return x2.astype(np.float16).view(np.uint8)
    if t == GGMLType.BF16:
        return _to_bf16(x2).view(np.uint8)
    info = TYPE_INFO[t]
    blocks = np.ascontiguousarray(x2.reshape(-1, info.block_size))
    out = np.empty((blocks.shape[0], info.type_size), np.uint8)
    step = 4096  # bound the temporaries
    for i in range(0, blocks.shape[0], step):
        out[i:i + step] = _BLOCK_TYPES[t][1](blocks[i:i + step])
    return out.reshape(x2.shape[0], rb)


def _to_bf16(x):
    """float32 -> bf16 bits, round to nearest even, NaN kept quiet (ggml's rule)."""
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 64).astype(np.uint16), r)


def quantize_q8_K(x):
    """Activation rows (n, k) -> Q8_K blocks (n, k/256*292): float d, int8 qs[256], int16 bsums[16]."""
    x = np.asarray(x, dtype=F32)
    k = x.shape[-1]
    b = x.reshape(-1, QK_K)
    mx = _abs_max_signed(b)[:, 0]
    zero = mx == 0
    iscale = (F32(-127) / np.where(zero, F32(1), mx)).astype(F32)
    q = np.minimum(127, nearest_int(iscale[:, None] * b)).astype(np.int8)
    q[zero] = 0
    bsums = q.reshape(-1, 16, 16).astype(np.int16).sum(axis=-1, dtype=np.int16)
    d = np.where(zero, F32(0), F32(1) / iscale).astype(F32)
    out = np.concatenate([d.reshape(-1, 1).view(np.uint8), q.view(np.uint8),
                          bsums.view(np.uint8)], axis=-1)
    return out.reshape(x.reshape(-1, k).shape[0], -1)

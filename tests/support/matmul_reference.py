"""The float64 reference a matrix-product kernel is checked against: the weights dequantized,
the activations exactly as the kernel sees them (llama.cpp's x86 Q8_0/Q8_1 activation rounding,
Q8_K), and a named tolerance per type."""
import numpy as np
import pytest

from edged.format import quants
from edged.format.gguf import GGMLType, TYPE_INFO

core = pytest.importorskip("edged._core")

# named tolerances: |edged - reference| <= TOL * sum_i |w_i * x_i| (float32 accumulation order;
# Q4_1/Q5_1 also carry llama.cpp's f16-rounded activation block sum `s`)
TOL_EXACT_INT = 2e-5
TOL_Q8_1_SUM = 2e-3
TOL = {GGMLType.Q4_1: TOL_Q8_1_SUM, GGMLType.Q5_1: TOL_Q8_1_SUM}


def partner_activations(x, t):
    """The activations exactly as the kernel sees them, back in float64."""
    if t == GGMLType.F32:
        return x.astype(np.float64)
    if t == GGMLType.F16:
        return x.astype(np.float16).astype(np.float64)
    if t == GGMLType.BF16:
        return quants.dequantize(quants.quantize(x, t), t, x.shape).astype(np.float64)
    if TYPE_INFO[t].block_size == 256:
        b = quants.quantize_q8_K(x).reshape(-1, 292)
        d = b[:, :4].copy().view(np.float32)
        return (d.astype(np.float64) * b[:, 4:260].view(np.int8)).reshape(x.shape)
    b = q8_act_llama_x86(x).reshape(-1, 34)  # Q8_0 (and Q8_1's values): as llama.cpp's x86 build
    d = b[:, :2].copy().view(np.float16).astype(np.float64)
    return (d * b[:, 2:].view(np.int8)).reshape(x.shape)


def random_weights(t, n, k, rng):
    w = rng.standard_normal((n, k)).astype(np.float32) * np.float32(0.1)
    raw = quants.quantize(w, t)
    return raw.reshape(-1), quants.dequantize(raw, t, (n, k)).astype(np.float64)


def check_matmul(raw, wd, t, x, *where):
    """core.matmul(W, x) against the float64 product of the dequantized W and the activations
    as the kernel sees them, within the type's named tolerance."""
    out = np.full((x.shape[0], wd.shape[0]), np.nan, np.float32)
    core.matmul(out, raw, int(t), x)
    xa = partner_activations(x, t)
    ref = xa @ wd.T
    scale = np.abs(xa) @ np.abs(wd).T
    err = np.abs(out - ref)
    tol = TOL.get(t, TOL_EXACT_INT) * scale + 1e-6
    assert np.all(err <= tol), (*where, t.name, x.shape, wd.shape, float((err / (scale + 1e-9)).max()))


def q8_act_llama_x86(x, with_sum=False):
    """llama.cpp's x86 quantize_row_q8_0 / q8_1 for activations: multiplier 127 / amax in
    float32, halves to even (its reference quantizer for weights uses 1 / d and rounds halves
    away from zero; the activations of the golden logits went through this one)."""
    b = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(b).max(1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        mul = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(b * mul[:, None]).astype(np.int8)
    parts = [d.astype(np.float16).view(np.uint8).reshape(-1, 2)]
    if with_sum:
        parts.append((q.sum(1).astype(np.float32) * d).astype(np.float16).view(np.uint8).reshape(-1, 2))
    parts.append(q.view(np.uint8))
    return np.concatenate(parts, axis=1).reshape(x.shape[0], -1)

"""Compare edged's compiled quantizers byte for byte with llama.cpp's own, called in its
libggml-base through ggml_quantize_chunk, on random rows (several scales, zero groups, all
positive rows, importance rows with zeros), with and without an importance row.

    python tools/check_quantizers_vs_ggml.py LIBGGML_BASE [--seeds 4] [--k 256,512,4096]

LIBGGML_BASE: the path of a llama.cpp build's libggml-base.so. Prints one line per type and
exits 1 if any row differs. (The tests hold llama-quantize's output on model files, see
tests/format/test_imatrix_weighted.py; this covers more data than fits in tests.)
"""
import argparse
import ctypes
import sys

import numpy as np

from edged import _core
from edged.format.gguf import GGMLType
from edged.format.quants import row_bytes

TYPES = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q2_K,
         GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_NL, GGMLType.IQ4_XS]


def ggml(path):
    g = ctypes.CDLL(path)
    g.ggml_quantize_chunk.restype = ctypes.c_size_t
    g.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    g.ggml_quantize_init.argtypes = [ctypes.c_int]
    return g


def cases(rng, n, k):
    for trial in range(6):
        x = (rng.standard_normal((n, k)) * rng.choice([0.02, 1.0, 1e-3])).astype(np.float32)
        if trial == 4:
            x[:, :40] = 0          # zero groups
        if trial == 5:
            x = np.abs(x)          # no negative value
        qw = (rng.random(k) ** 3 * 10).astype(np.float32)
        if trial == 3:
            qw[:64] = 0
        yield x, None
        yield x, qw


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--k", default="256,512,4096")
    a = ap.parse_args()
    g = ggml(a.lib)
    bad_total = 0
    for t in TYPES:
        g.ggml_quantize_init(int(t))
        bad = checked = 0
        for seed in range(a.seeds):
            rng = np.random.default_rng(seed)
            for k in map(int, a.k.split(",")):
                for x, qw in cases(rng, 16, k):
                    ref = np.zeros((x.shape[0], row_bytes(t, k)), np.uint8)
                    g.ggml_quantize_chunk(int(t), x.ctypes.data, ref.ctypes.data, 0, x.shape[0], k,
                                          qw.ctypes.data if qw is not None else None)
                    got = _core.quantize_rows(x, int(t), None, qw)
                    bad += int((got != ref).any(axis=1).sum())
                    checked += x.shape[0]
        print(f"{t.name:7s} {checked} rows, {bad} differ")
        bad_total += bad
    sys.exit(1 if bad_total else 0)


if __name__ == "__main__":
    main()

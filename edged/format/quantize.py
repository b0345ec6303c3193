"""Quantize a GGUF model file into one of llama.cpp's mixes (Q4_K_M, Q8_0, ...).

Which tensor gets which type follows llama.cpp's llama_tensor_get_type: 1-D tensors and norms stay as they are; `output.weight` (and tied `token_embd.weight`) get Q6_K
unless the mix is Q8_0; attn_v / ffn_down get more bits on "use_more_bits" layers in the _M
mixes; shapes a type's block does not divide fall back (Q4_K -> Q5_0, Q6_K -> Q8_0, ..., F16).
The rows themselves are quantized by the compiled quantizers (cython_kernels/kernels/ed_quant.h)
or edged.format.quants, their NumPy twin: llama.cpp's reference algorithms, and with an
importance matrix from llama-imatrix its weighted ones (the same bytes as llama-quantize
--imatrix) for every type llama-quantize weights: Q4_0..Q5_1, Q2_K..Q6_K, IQ4_NL, IQ4_XS (the
NumPy twin has the IQ4 ones only; Q8_0 and MXFP4 ignore the matrix, as in llama.cpp).

    quantize_file(src, dst, mix, progress=None, imatrix=None)   writes dst atomically (temp
        file + rename), with the mode the umask gives a new file
"""
from __future__ import annotations

import os
import re
import tempfile

import numpy as np

from . import quants
from ..errors import ConfigError, UnsupportedModelError
from ..files import creation_mode
from ..system import default_threads
from .gguf import (FileType, GGMLType, GGUFFile, GGUFWriter, Key, QUANTIZATION_VERSION,
                   TYPE_INFO, ValueType, check_number)
from .imatrix import read_imatrix

F = FileType
MIXES = {
    "F32": F.ALL_F32, "F16": F.MOSTLY_F16, "BF16": F.MOSTLY_BF16, "Q8_0": F.MOSTLY_Q8_0,
    "Q4_0": F.MOSTLY_Q4_0, "Q4_1": F.MOSTLY_Q4_1, "Q5_0": F.MOSTLY_Q5_0, "Q5_1": F.MOSTLY_Q5_1,
    "Q2_K": F.MOSTLY_Q2_K, "Q2_K_S": F.MOSTLY_Q2_K_S, "Q3_K_S": F.MOSTLY_Q3_K_S,
    "Q3_K_M": F.MOSTLY_Q3_K_M, "Q3_K_L": F.MOSTLY_Q3_K_L, "Q4_K_S": F.MOSTLY_Q4_K_S,
    "Q4_K_M": F.MOSTLY_Q4_K_M, "Q5_K_S": F.MOSTLY_Q5_K_S, "Q5_K_M": F.MOSTLY_Q5_K_M,
    "Q6_K": F.MOSTLY_Q6_K, "IQ4_NL": F.MOSTLY_IQ4_NL, "IQ4_XS": F.MOSTLY_IQ4_XS,
    "MXFP4_MOE": F.MOSTLY_MXFP4_MOE,
}
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}

G = GGMLType
DEFAULT_TYPE = {
    F.ALL_F32: G.F32, F.MOSTLY_F16: G.F16, F.MOSTLY_BF16: G.BF16, F.MOSTLY_Q8_0: G.Q8_0,
    F.MOSTLY_Q4_0: G.Q4_0, F.MOSTLY_Q4_1: G.Q4_1, F.MOSTLY_Q5_0: G.Q5_0, F.MOSTLY_Q5_1: G.Q5_1,
    F.MOSTLY_Q2_K: G.Q2_K, F.MOSTLY_Q2_K_S: G.Q2_K, F.MOSTLY_Q3_K_S: G.Q3_K,
    F.MOSTLY_Q3_K_M: G.Q3_K, F.MOSTLY_Q3_K_L: G.Q3_K, F.MOSTLY_Q4_K_S: G.Q4_K,
    F.MOSTLY_Q4_K_M: G.Q4_K, F.MOSTLY_Q5_K_S: G.Q5_K, F.MOSTLY_Q5_K_M: G.Q5_K,
    F.MOSTLY_Q6_K: G.Q6_K, F.MOSTLY_IQ4_NL: G.IQ4_NL, F.MOSTLY_IQ4_XS: G.IQ4_XS,
    F.MOSTLY_MXFP4_MOE: G.MXFP4,
}
_LAYER = re.compile(r"blk\.(\d+)\.")
FLOAT_TYPES = (G.F32, G.F16, G.BF16)
FALLBACK = {G.Q2_K: G.Q4_0, G.Q3_K: G.Q4_0, G.Q4_K: G.Q5_0, G.Q5_K: G.Q5_1, G.Q6_K: G.Q8_0,
            G.IQ4_XS: G.IQ4_NL}
IQ4_MIXES = (F.MOSTLY_IQ4_NL, F.MOSTLY_IQ4_XS)
# the types llama-quantize quantizes importance-weighted; the compiled quantizers have all of
# them, edged.format.quants the ones in quants.WEIGHTED
WEIGHTED = (G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K,
            G.IQ4_NL, G.IQ4_XS)


def parse_mix(name):
    key = ALIASES.get(name.upper(), name.upper())
    if key not in MIXES:
        raise ConfigError(f"unknown quantization type {name!r} (one of {', '.join(MIXES)})")
    return MIXES[key]


def _category(name):
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):   # llama.cpp's rule
        return "token_embd"
    for part, cat in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_v"),
                      ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"),
                      ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
                      ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down")):
        if part in name:
            return cat
    return "other"


# Tensors llama.cpp keeps at their type whatever the target (llama-quant.cpp,
# tensor_allows_quantization): names containing one of these, and two exact names (BERT).
_KEEP_PARTS = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
               "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight",
               "indexer.k_proj.weight", "indexer.q_proj.weight", "attn_rel_b.weight",
               "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
               "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight",
               "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight",
               "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
               "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
               "time_mix_lerp_fused.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
               "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook",
               "mm.a.code_embd")
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")


def _quantizable(name, shape):
    return (len(shape) >= 2 and name.endswith("weight") and name not in _KEEP_NAMES
            and not any(part in name for part in _KEEP_PARTS))


def tensor_order(names):
    """llama.cpp's order for quantizing and writing: non-layer tensors first, then by layer
    number, by name within a layer (its weights map)."""
    def key(name):
        m = _LAYER.match(name)
        return (int(m.group(1)) if m else -1, name)
    return sorted(names, key=key)


def _use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def choose_types(f, ftype, has_imatrix=False):
    """name -> target GGMLType for every tensor of `f` under llama.cpp's rules for `ftype`
    (has_imatrix: an importance matrix is given, which changes a few choices as in llama.cpp)."""
    ftype = FileType(ftype)
    default = DEFAULT_TYPE[ftype]
    md = f.metadata
    arch = md.get(Key.ARCHITECTURE, "")

    def count(key, default):        # a per-layer array counts as its largest value
        name = Key.arch(key, arch)
        v = md.get(name, default)
        if isinstance(v, np.ndarray) and v.dtype.kind in "iu" and v.size:
            v = v.max()
        return check_number(name, v, int)

    n_layer = count(Key.BLOCK_COUNT, 0)
    n_head = count(Key.HEAD_COUNT, 1)
    n_gqa = n_head // max(1, count(Key.HEAD_COUNT_KV, n_head))
    n_expert = count(Key.EXPERT_COUNT, 0)
    falcon = arch == "falcon"
    cats = {name: _category(name) for name in f.tensors}
    tied = "output.weight" not in f.tensors
    n_attn_v = sum(1 for c in cats.values() if c in ("attn_v", "attn_qkv"))
    i_attn_v = i_ffn_down = 0
    out = {}
    for name in tensor_order(f.tensors):
        ti = f.tensors[name]
        if not _quantizable(name, ti.shape):
            out[name] = ti.type
            continue
        t = default
        if default not in FLOAT_TYPES:
            cat = cats[name]
            if cat == "output" or (tied and cat == "token_embd"):
                qk = TYPE_INFO[t].block_size
                if ftype == F.MOSTLY_MXFP4_MOE or falcon or ti.shape[0] % qk:
                    t = G.Q8_0
                elif t != G.Q8_0:
                    t = G.Q6_K
            elif ftype == F.MOSTLY_MXFP4_MOE:  # expert tensors (3-D) MXFP4, the rest Q8_0
                t = G.MXFP4 if len(ti.shape) >= 3 and ti.shape[2] > 1 else G.Q8_0
            elif cat in ("attn_v", "attn_qkv"):  # llama.cpp treats fused qkv like attn_v
                t = _attn_v_type(t, ftype, n_gqa, n_expert, i_attn_v, n_attn_v)
                i_attn_v += 1
            elif cat == "attn_k":
                if n_expert == 8:
                    t = G.Q8_0
            elif cat == "ffn_down":
                # llama.cpp's layer_info: with experts the layer is the name's (a layer may hold
                # several ffn_down tensors: gemma4's dense FFN and experts, shared experts)
                m = _LAYER.match(name)
                i = int(m.group(1)) if n_expert > 1 and m else i_ffn_down
                t = _ffn_down_type(t, ftype, i, n_layer, falcon, has_imatrix)
                i_ffn_down += 1
            elif cat == "attn_output":
                if not falcon:
                    if n_expert == 8:
                        if ftype in (F.MOSTLY_Q2_K, F.MOSTLY_Q3_K_S, F.MOSTLY_Q3_K_M,
                                     F.MOSTLY_Q4_K_S, F.MOSTLY_Q4_K_M) + IQ4_MIXES:
                            t = G.Q5_K
                    elif ftype == F.MOSTLY_Q2_K:
                        t = G.Q3_K
                    elif ftype == F.MOSTLY_Q3_K_M:
                        t = G.Q4_K
                    elif ftype == F.MOSTLY_Q3_K_L:
                        t = G.Q5_K
                elif ftype == F.MOSTLY_Q3_K_L:
                    t = G.Q4_K
            t = _fallback(name, ti.shape[0], t)
        elif t != ti.type:
            t = _fallback(name, ti.shape[0], t)
        out[name] = t
    return out


def _attn_v_type(t, ftype, n_gqa, n_expert, i, n):
    if ftype == F.MOSTLY_Q2_K:
        t = G.Q4_K if n_gqa >= 4 else G.Q3_K
    elif ftype == F.MOSTLY_Q2_K_S and n_gqa >= 4:
        t = G.Q4_K
    elif ftype == F.MOSTLY_Q3_K_M:
        t = G.Q5_K if i < 2 else G.Q4_K
    elif ftype == F.MOSTLY_Q3_K_L:
        t = G.Q5_K
    elif ftype in IQ4_MIXES and n_gqa >= 4:
        t = G.Q5_K
    elif ftype in (F.MOSTLY_Q4_K_M, F.MOSTLY_Q5_K_M) and _use_more_bits(i, n):
        t = G.Q6_K
    elif ftype == F.MOSTLY_Q4_K_S and i < 4:
        t = G.Q5_K
    if n_expert == 8:
        t = G.Q8_0
    return t


def _ffn_down_type(t, ftype, i, n, falcon, has_imatrix=False):
    if ftype == F.MOSTLY_Q2_K:
        return G.Q3_K
    if ftype == F.MOSTLY_Q2_K_S:
        return G.Q4_K if i < n // 8 else t
    if ftype == F.MOSTLY_Q3_K_M:
        if i < n // 16:
            return G.Q5_K
        return G.Q4_K if (not falcon or _use_more_bits(i, n)) else G.Q3_K
    if ftype == F.MOSTLY_Q3_K_L:
        return G.Q4_K if falcon else G.Q5_K
    if ftype == F.MOSTLY_Q4_K_M:
        if falcon:
            return G.Q6_K if i < n // 16 else G.Q5_K if _use_more_bits(i, n) else G.Q4_K
        return G.Q6_K if _use_more_bits(i, n) else t
    if ftype in IQ4_MIXES and i < n // 8 and not has_imatrix:
        return G.Q5_K
    if ftype == F.MOSTLY_Q5_K_M and _use_more_bits(i, n):
        return G.Q6_K
    if ftype == F.MOSTLY_Q4_K_S and not falcon and i < n // 8:
        return G.Q5_K
    if ftype in (F.MOSTLY_Q4_0, F.MOSTLY_Q5_0) and has_imatrix and i < n // 8:
        return G.Q4_1 if ftype == F.MOSTLY_Q4_0 else G.Q5_1  # llama.cpp's guard on early ffn_down
    return t


def _fallback(name, ncols, t):
    bs = TYPE_INFO[t].block_size
    if ncols % bs == 0:
        return t
    t2 = FALLBACK.get(t, t)
    if ncols % TYPE_INFO[t2].block_size:
        t2 = G.F16
    return t2


def _rows_as_float(f, name, r0, r1):
    ti = f.tensors[name]
    k = ti.shape[0]
    info = TYPE_INFO[ti.type]
    rb = k // info.block_size * info.type_size
    raw = f.tensor_bytes(name)[r0 * rb:r1 * rb]
    return quants.dequantize(raw, ti.type, (r1 - r0, k))


def _row_quantizer(compiled, n_threads):
    """-> (q, weighted): q(rows (n, k) float32, type, importance row (k,) or None) -> bytes, the
    compiled quantizer on a thread pool when built (same bytes as the NumPy reference, tested),
    else edged.format.quants; weighted: the types q quantizes importance-weighted."""
    if compiled:
        try:
            from .. import _core   # optional: the NumPy quantizer runs without the compiled core
        except ImportError:
            _core = None
        if _core is not None and hasattr(_core, "quantize_rows"):
            pool = _core.Pool(n_threads or default_threads())

            def q(x, t, qw=None):
                if t in FLOAT_TYPES:
                    return quants.quantize(x, t)
                if qw is not None:
                    qw = np.ascontiguousarray(qw, dtype=np.float32)
                return _core.quantize_rows(np.ascontiguousarray(x, dtype=np.float32), int(t), pool, qw)
            return q, WEIGHTED
    return quants.quantize, quants.WEIGHTED


UNQUANTIZED = (G.F32, G.F16, G.BF16)


def _refuse_requantize(src, tensors, types):
    for name, ti in tensors.items():
        if ti.type not in UNQUANTIZED and types[name] != ti.type:
            raise ConfigError(f"{src}: tensor {name!r} is already quantized ({ti.type.name}); "
                              f"requantizing it to {types[name].name} adds a second rounding error "
                              "(quantize from the F32/F16/BF16 model, or allow requantizing)")


def _refuse_without_imatrix(ftype, tensors, types, weights):
    """llama-quantize makes the Q2_K tensors of a Q2_K_S file (all but token_embd and output)
    only from an importance matrix entry ("the result will be garbage" without); so does edged."""
    if ftype != F.MOSTLY_Q2_K_S:
        return
    for name, t in types.items():
        if (t == G.Q2_K and tensors[name].type != t and name not in weights
                and _category(name) not in ("token_embd", "output")):
            raise ConfigError(f"tensor {name!r} would be Q2_K in a Q2_K_S file, which needs an importance "
                              "matrix entry for it (--imatrix FILE from llama-imatrix), as in llama-quantize")


def _imatrix_rows(f, types, im, path, weighted):
    """name -> (n_expert, n_per_row) importance weights for the tensors that get quantized with
    them, checked as llama-quantize checks them (size n_per_row * n_expert; a tensor without an
    entry is quantized without). Refuses a type with no weighted quantizer in `weighted`."""
    out = {}
    for name, t in types.items():
        ti = f.tensors[name]
        if t == ti.type or name not in im.entries or t in quants.IGNORES_WEIGHTS:
            continue
        k, n_exp = ti.shape[0], (ti.shape[2] if len(ti.shape) > 2 else 1)
        w = im.entries[name]
        if w.size != k * n_exp:
            if _category(name) == "token_embd":
                continue  # llama-quantize quantizes it without, as an old matrix's embedding rows do not fit
            raise ConfigError(f"{path}: importance matrix for {name!r} has {w.size} values, the "
                              f"tensor needs {k * n_exp} ({k} columns x {n_exp} experts)")
        if not np.all(np.isfinite(w)):
            raise ConfigError(f"{path}: importance matrix for {name!r} has non-finite values")
        if t not in weighted:
            raise ConfigError(f"{name!r} would be {t.name} with an importance matrix: without the "
                              f"compiled core edged's importance-weighted quantizers are "
                              f"{', '.join(q.name for q in weighted)} (build it: tools/bootstrap.sh)")
        out[name] = w.reshape(n_exp, k)
    return out


def quantize_file(src, dst, mix, progress=None, chunk_rows=None, compiled=True, n_threads=None,
                  allow_requantize=True, imatrix=None):
    """Quantize `src` into `dst` with the mix name or FileType `mix`. `progress(i, n, name,
    qtype, done_bytes, total_bytes)` is called after each tensor. compiled=False uses only the
    NumPy reference quantizers. allow_requantize=False refuses (as llama-quantize does) to turn
    an already quantized tensor into another type: the errors of both quantizations add up.
    imatrix: path of llama-imatrix's output; its tensors are quantized importance-weighted
    (llama.cpp's algorithm, the same bytes as llama-quantize --imatrix)."""
    ftype = parse_mix(mix) if isinstance(mix, str) else FileType(mix)
    quantize_rows, weighted_types = _row_quantizer(compiled, n_threads)
    im = read_imatrix(imatrix) if imatrix else None
    with GGUFFile.open(src) as f:
        for name, ti in f.tensors.items():
            if ti.type not in quants.SUPPORTED:
                raise UnsupportedModelError(f"{src}: tensor {name!r} has type {ti.type.name}, "
                                            "which edged cannot dequantize")
        types = choose_types(f, ftype, has_imatrix=im is not None)
        if not allow_requantize:
            _refuse_requantize(src, f.tensors, types)
        weights = _imatrix_rows(f, types, im, imatrix, weighted_types) if im is not None else {}
        _refuse_without_imatrix(ftype, f.tensors, types, weights)
        w = GGUFWriter(alignment=f.alignment)
        for key, value in f.metadata.items():
            if key in (Key.ALIGNMENT, Key.FILE_TYPE, Key.QUANTIZATION_VERSION):
                continue
            vt = f.value_types[key]
            w.add(key, value, vt if vt != ValueType.ARRAY else None)
        w.add(Key.QUANTIZATION_VERSION, QUANTIZATION_VERSION, ValueType.UINT32)
        w.add(Key.FILE_TYPE, int(ftype), ValueType.UINT32)
        if im is not None:  # what llama-quantize records of the matrix it used
            w.add(Key.QUANTIZE_IMATRIX_FILE, str(imatrix), ValueType.STRING)
            if im.datasets:
                w.add(Key.QUANTIZE_IMATRIX_DATASET, im.datasets[0], ValueType.STRING)
            w.add(Key.QUANTIZE_IMATRIX_N_ENTRIES, len(im.entries), ValueType.UINT32)
            if im.chunk_count > 0:
                w.add(Key.QUANTIZE_IMATRIX_N_CHUNKS, im.chunk_count, ValueType.UINT32)
        order = tensor_order(f.tensors)
        for name in order:
            w.add_tensor(name, f.tensors[name].shape, types[name])
        total = sum(w.tensors[n][3] for n in w.tensors)
        d = os.path.dirname(os.path.abspath(dst))
        fd, tmp = tempfile.mkstemp(prefix=".edged-quantize-", dir=d)
        try:
            os.fchmod(fd, creation_mode())
            with os.fdopen(fd, "wb") as out:
                w.write_header(out)
                done = 0
                for i, name in enumerate(order):
                    ti, t = f.tensors[name], types[name]
                    if t == ti.type:
                        out_bytes = [np.asarray(f.tensor_bytes(name))]
                    elif name in weights:  # per expert: its slice of the importance matrix
                        k = ti.shape[0]
                        per = ti.n_elements // k // len(weights[name])
                        step = chunk_rows or max(1, (1 << 20) // k)
                        out_bytes = (quantize_rows(_rows_as_float(f, name, e * per + r, e * per + min(per, r + step)),
                                                   t, weights[name][e])
                                     for e in range(len(weights[name])) for r in range(0, per, step))
                    else:
                        k = ti.shape[0]
                        rows = ti.n_elements // k
                        step = chunk_rows or max(1, (1 << 22) // k)
                        out_bytes = (quantize_rows(_rows_as_float(f, name, r, min(rows, r + step)), t)
                                     for r in range(0, rows, step))
                    w.write_tensor(out, name, out_bytes)
                    done += w.tensors[name][3]
                    if progress:
                        progress(i + 1, len(f.tensors), name, t, done, total)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, dst)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    return types


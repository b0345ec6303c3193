"""Weights repacked at load for the selected kernel path (cython_kernels/kernels/ed_repack.h).

The weights are read from the read-only mapping of the file, except where a path's kernels need
another layout (DESIGN.md). NEON with dotprod (Raspberry Pi 5) reads its Q4_0 and Q8_0
matrices, every x86 path its Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS, MXFP4 and K-quant (Q2_K..Q6_K)
matrices in the R4 layout: groups
of rows (core.R4_ROWS: 4 on Arm, 8 on x86) interleaved block by block in runs of 4 bytes, with their
scales side by side (and Q5_0's fifth bits), so one SDOT by lane serves 4 rows (one 32-byte load
is an x86 row kernel's transposed register of 8 rows) and one load brings their scales (docs/kernels.md, "Repacked weights", "Repacked weights on x86"). Those matrices are copied once into one 64-byte aligned arena sized at load, and the
mapped pages of each repacked tensor are released (madvise): the weights are not resident
twice, and peak RSS grows by at most the arena. Anything else that reads such a tensor (the
embedding lookup of a tied token_embd / output matrix) keeps reading the mapping, which pages
in only the rows it touches. Without a mapping (Model.load(mmap=False): private copies) the
copies are repacked in place, and a tensor that is also the token embedding stays as it is.

Only matrices the forward pass reads through its row tiles and panels (ed_rows) are repacked,
and only where their row ranges start on a group of rows: every 2-D projection, and the 3-D
expert tensors of a MoE layer when their experts' rows are whole groups (ne1 a multiple of the
group) and the model asks for them (`experts`): repacking copies every expert into the arena,
so all of them become resident, where the mapping pages in only the routed ones; Model decides
(docs/models.md, "Mixture of experts").

EDGED_REPACK: "auto" (default: what the path's kernels read), "off" (the mapped layout
everywhere), "r4" (the R4 layout for every matrix of a type ed_r4_ok takes, on any path: the generic twin of
the kernel where the path has none; for tests and measurements).
"""
from __future__ import annotations

import mmap
import os

import numpy as np

from ..errors import ConfigError

MODES = ("auto", "off", "r4")
_SLICE = 8 << 20  # bytes repacked between two releases of mapped pages
ROLES = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up",
         "ffn_down", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
         # the recurrent layers' projections: DeltaNet (qwen35) and Mamba-2 (granitehybrid);
         # the short convolutions' (lfm2)
         "attn_gate", "ssm_beta", "ssm_alpha", "ssm_in", "ssm_out",
         "shortconv_in_proj", "shortconv_out_proj")
EXPERT_ROLES = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps")


def mode_from_env() -> str:
    mode = os.environ.get("EDGED_REPACK") or "auto"
    if mode not in MODES:
        raise ConfigError(f"EDGED_REPACK={mode!r}: one of {', '.join(MODES)}")
    return mode


def _is_mapped(a) -> bool:
    """Whether the array's bytes belong to a file mapping (else: a private copy)."""
    while isinstance(a, np.ndarray):
        a = a.base
    if isinstance(a, memoryview):
        a = a.obj
    return isinstance(a, mmap.mmap)


class Repacked:
    """The arena of one model's repacked matrices (None when nothing was repacked)."""

    def __init__(self, arena, tensors, released):
        self.arena = arena          # uint8 (nbytes,), 64-byte aligned, or None
        self.tensors = tensors      # names repacked
        self.released = released    # bytes of mapped pages given back

    @property
    def nbytes(self) -> int:
        return 0 if self.arena is None else int(self.arena.nbytes)

    @property
    def arrays(self):
        """The arena as a list of arrays (empty when nothing was copied)."""
        return [] if self.arena is None else [self.arena]


def _types(core, mode):
    if mode == "off":
        return set()
    return {int(t) for t in core.r4_types()} if mode == "auto" else set(_all_r4_types(core))


def _takes(core, types, gtype, shape):
    """a matrix (2-D) or expert tensor (3-D: ne0, rows per expert, experts) the R4 layout takes"""
    return gtype in types and len(shape) in (2, 3) and core.r4_ok(gtype, shape[0], shape[1])


def _split_group(core, hp, L, role) -> bool:
    """Whether a fused gate|up matrix's up rows start inside a group of R4 rows: phi3's ffn_up
    (up from n_ff) or gemma4's ffn_gate_up_exps (each expert's up from n_ff_exp); it then
    stays in the mapped layout."""
    if role == "ffn_up" and L.ffn_gate is None:
        return hp.n_ff % core.R4_ROWS != 0
    return role == "ffn_gate_up_exps" and hp.n_ff_exp % core.R4_ROWS != 0


def expert_bytes(core, spec, mode="auto") -> int:
    """Bytes of the expert tensors apply(experts=True) would repack (0: none, e.g. on a path
    that repacks nothing, or experts of a type or row count the layout does not take)."""
    types = _types(core, mode)
    total = 0
    for L in spec.layers:
        for role in EXPERT_ROLES:
            name = getattr(L, role, None)
            if name is not None and not _split_group(core, spec.hp, L, role):
                t = spec.tensors[name]
                if _takes(core, types, int(t.type), tuple(int(x) for x in t.shape)):
                    total += t.nbytes
    return total


def apply(core, spec, layers, globals_, mode="auto", experts=False) -> Repacked:
    """Repack the matrices of `layers` (per layer: role -> (array, type, shape, row_bytes) or
    None, as CPUBackend builds them) and globals_["output"] that the selected path (mode
    "auto") or mode "r4" wants in the R4 layout, with experts=True the MoE expert tensors too;
    their tuples gain the layout and point at the repacked bytes (in place)."""
    types = _types(core, mode)
    if not types:
        return Repacked(None, [], 0)
    hp = spec.hp
    slots = []  # (container, key, tensor name)
    for il, L in enumerate(spec.layers):
        for role in ROLES + (EXPERT_ROLES if experts else ()):
            name = getattr(L, role, None)
            if name is None or layers[il].get(role) is None:
                continue
            if _split_group(core, hp, L, role):
                continue
            slots.append((layers[il], role, name))
    if globals_.get("output") is not None:
        slots.append((globals_, "output", spec.output))
    chosen = {}
    for holder, key, name in slots:
        arr, gtype, shape, row_bytes = holder[key][:4]
        if not _takes(core, types, gtype, shape):
            continue
        if not _is_mapped(arr) and name == spec.token_embd:
            continue  # a private copy the embedding lookup reads: not in place
        chosen.setdefault(name, []).append((holder, key))
    if not chosen:
        return Repacked(None, [], 0)
    first = {name: holders[0][0][holders[0][1]] for name, holders in chosen.items()}
    copied = [n for n, t in first.items() if _is_mapped(t[0])]
    sizes = {n: (first[n][0].nbytes + 63) // 64 * 64 for n in copied}
    arena = core.aligned_empty((sum(sizes.values()),), np.uint8) if copied else None
    off, released = 0, 0
    for name, (arr, gtype, shape, row_bytes) in ((n, t[:4]) for n, t in first.items()):
        if name in sizes:
            dst = arena[off:off + arr.nbytes]
            off += sizes[name]
            # a few MiB of rows at a time, each slice's mapped pages released once copied: the
            # peak stays the arena plus one slice, not plus the largest tensor
            g = core.R4_ROWS
            step = max(g, _SLICE // (g * row_bytes) * g) * row_bytes
            for a in range(0, arr.nbytes, step):
                b = min(a + step, arr.nbytes)
                core.r4_pack(dst[a:b], arr[a:b], gtype, shape[0], (b - a) // row_bytes)
                core.release_pages(arr[a:b])
            released += core.release_pages(arr)  # and the pages that straddled two slices
        else:
            dst = core.r4_pack(arr, arr, gtype, shape[0], arr.nbytes // row_bytes)
        for holder, key in chosen[name]:
            holder[key] = (dst, gtype, shape, row_bytes, core.LAYOUT_R4)
    return Repacked(arena, sorted(chosen), released)


def _all_r4_types(core):
    """Every type the R4 layout has (mode "r4")."""
    return [t for t in range(40) if core.r4_ok(t, 256, core.R4_ROWS)]

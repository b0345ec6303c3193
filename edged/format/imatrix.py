"""llama.cpp's importance matrix files (llama-imatrix's output), read for `edged quantize --imatrix`.

An importance matrix holds, per weight tensor, the sum of squared activations seen by each input
column (per expert for 3-D expert tensors) over a calibration text. The quantizers weight
each weight's error by it. llama-imatrix (llama.cpp 0.3.36) writes two formats:

- GGUF (the default): `general.type` = "imatrix", `imatrix.datasets`, `imatrix.chunk_count`,
  `imatrix.chunk_size`, and per tensor NAME.in_sum2 (F32, n_per_row x n_expert: the sums) and
  NAME.counts (F32, 1 x n_expert: how many activations were summed);
- legacy .dat: int32 n_entries; per entry int32 name length, name, int32 ncall, int32 nval,
  nval float32 (sum / count * ncall); then int32 chunk count and int32 length + dataset name.

Both are normalised as llama-quantize does (sum / count per expert, an expert without data
gets 1; legacy: value / ncall), in float32, so the weights are bit for bit llama.cpp's.

    read_imatrix(path) -> Imatrix(entries {tensor name: float32 (n_expert * n_per_row,)},
                                  datasets [str], chunk_count int)
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelFormatError
from .gguf import GGMLType, GGUF_MAGIC, GGUFFile, Key, check_number, open_regular

IN_SUM2, COUNTS = ".in_sum2", ".counts"   # tensor name suffixes of the GGUF format


@dataclass
class Imatrix:
    entries: dict = field(default_factory=dict)   # name -> float32 (n_expert * n_per_row,)
    datasets: list = field(default_factory=list)
    chunk_count: int = 0


def read_imatrix(path):
    """Read either format. Only a regular file is read (a FIFO or /dev/zero is refused), and
    never beyond its size: the legacy format is parsed from a read-only mapping."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size < 4:
            raise ModelFormatError(f"{path}: {size} bytes is too short for an importance matrix")
        if os.pread(fd, 4, 0) == GGUF_MAGIC:
            return _read_gguf(fd, path)
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as data:
            return _read_legacy(data, path)
    finally:
        os.close(fd)


def _read_gguf(fd, path):
    with GGUFFile.from_fd(fd, name=str(path)) as f:
        if f.metadata.get(Key.GENERAL_TYPE) != "imatrix":
            raise ModelFormatError(f"{path}: not an importance matrix (general.type is "
                                   f"{f.metadata.get(Key.GENERAL_TYPE)!r}, want 'imatrix')")
        datasets = f.metadata.get(Key.IMATRIX_DATASETS, [])
        if not isinstance(datasets, list) or not all(isinstance(d, str) for d in datasets):
            raise ModelFormatError(f"{path}: {Key.IMATRIX_DATASETS} must be an array of strings, "
                                   f"got {datasets!r:.80}")
        out = Imatrix(datasets=datasets,
                      chunk_count=check_number(Key.IMATRIX_CHUNK_COUNT,
                                               f.metadata.get(Key.IMATRIX_CHUNK_COUNT, 0), int))
        for tname, ti in f.tensors.items():
            if not tname.endswith(IN_SUM2):
                continue
            name = tname[:-len(IN_SUM2)]
            cname = name + COUNTS
            if cname not in f.tensors:
                raise ModelFormatError(f"{path}: {tname!r} has no {cname!r}")
            if ti.type != GGMLType.F32 or f.tensors[cname].type != GGMLType.F32:
                raise ModelFormatError(f"{path}: {name!r}: sums and counts must be F32")
            sums = np.array(f.tensor_bytes(tname)).view(np.float32)
            # llama.cpp rounds the (non-negative) counts to integers, then back to float
            raw = np.array(f.tensor_bytes(cname)).view(np.float32).astype(np.float64)
            counts = np.floor(raw + 0.5).astype(np.float32)
            if len(counts) == 0 or sums.size % len(counts):
                raise ModelFormatError(f"{path}: {name!r}: {sums.size} sums for {len(counts)} counts")
            per = sums.reshape(len(counts), -1)
            live = counts > 0
            safe = np.where(live, counts, np.float32(1))[:, None]
            out.entries[name] = np.where(live[:, None], per / safe, np.float32(1)).astype(np.float32).reshape(-1)
        return out


def _read_legacy(data, path):
    pos = 0

    def take(n, what):
        nonlocal pos
        if pos + n > len(data):
            raise ModelFormatError(f"{path}: truncated importance matrix reading {what} at offset {pos}")
        b = data[pos:pos + n]
        pos += n
        return b

    def i32(what):
        return struct.unpack("<i", take(4, what))[0]

    n_entries = i32("the entry count")
    if n_entries < 0 or n_entries > len(data) // 12:
        raise ModelFormatError(f"{path}: not an importance matrix ({n_entries} entries)")
    out = Imatrix()
    for i in range(n_entries):
        n = i32(f"entry {i}'s name length")
        if n <= 0 or n > 4096:
            raise ModelFormatError(f"{path}: entry {i}: bad name length {n} at offset {pos - 4}")
        name = take(n, f"entry {i}'s name").decode("utf-8", "replace")
        ncall = i32(f"{name}'s call count")
        nval = i32(f"{name}'s value count")
        if nval < 1:
            raise ModelFormatError(f"{path}: {name!r}: bad value count {nval}")
        v = np.frombuffer(take(4 * nval, f"{name}'s values"), dtype="<f4").astype(np.float32)
        out.entries[name] = (v / np.float32(ncall)).astype(np.float32) if ncall > 0 else v.copy()
    if pos + 4 <= len(data):
        out.chunk_count = i32("the chunk count")
        if pos + 4 <= len(data):
            n = i32("the dataset name length")
            if 0 < n <= len(data) - pos:
                out.datasets = [take(n, "the dataset name").decode("utf-8", "replace")]
    return out

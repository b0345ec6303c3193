"""The GGUF reader: real files against the PyPI `gguf` reader, and every rejection."""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import ROOT, testdata_files
from gguf_bytes import (ARR, BOOL, F32, STR, T_F32, T_Q4_0, U32, U64, build, kv_str, kv_u32, s,
                        tensor_info, valid_file)
from edged.errors import ModelFormatError
from edged.format.gguf import GGMLType, GGUFFile, Key

REAL_FILES = testdata_files("models", ".gguf") + testdata_files("vocab", ".gguf")


def open_bytes(tmp_path, data, name="t.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return GGUFFile.open(p)


def rejects(tmp_path, data, match):
    with pytest.raises(ModelFormatError, match=match):
        open_bytes(tmp_path, data)


# --- real files against the independent reader ------------------------------------------------

_oracle_cache = {}


def oracle(path):
    """The PyPI gguf reader's view of a file (slow on big vocabularies, so computed once)."""
    if path not in _oracle_cache:
        import gguf
        r = gguf.GGUFReader(path)
        meta = {}
        for k, f in r.fields.items():
            if k.startswith("GGUF."):
                continue
            meta[k] = (int(f.types[0]), f.contents())
        tensors = [(t.name, int(t.tensor_type), [int(x) for x in t.shape], int(t.data_offset),
                    int(t.n_bytes)) for t in r.tensors]
        _oracle_cache[path] = (meta, tensors, r)
    return _oracle_cache[path]


def same_value(ours, theirs):
    if isinstance(ours, np.ndarray):
        ours = ours.tolist()
    if isinstance(ours, float) or (isinstance(ours, list) and ours and isinstance(ours[0], float)):
        return np.allclose(np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64),
                           rtol=0, atol=0, equal_nan=True)
    return ours == theirs


@pytest.mark.skipif(not REAL_FILES, reason="shared test data missing: ../shared/testdata")
@pytest.mark.parametrize("path", REAL_FILES, ids=os.path.basename)
def test_real_file_matches_pypi_reader(path):
    meta, tensors, reader = oracle(path)
    with GGUFFile.open(path) as f:
        assert set(f.metadata) == set(meta)
        for k, (vtype, value) in meta.items():
            assert int(f.value_types[k]) == vtype, k
            assert same_value(f.metadata[k], value), k
        ours = [(t.name, int(t.type), list(t.shape), t.offset, t.nbytes) for t in f.tensors.values()]
        assert ours == tensors
        # Data views are the same bytes, zero-copy and read-only.
        for t, rt in zip(f.tensors.values(), reader.tensors):
            view = f.tensor_bytes(t.name)
            assert not view.flags.writeable
            assert np.array_equal(view, np.asarray(rt.data).reshape(-1).view(np.uint8))


@pytest.mark.skipif(not REAL_FILES, reason="shared test data missing: ../shared/testdata")
@pytest.mark.parametrize("path", REAL_FILES, ids=os.path.basename)
def test_gguf_dump_json_matches_pypi_reader(path):
    meta, tensors, _ = oracle(path)
    out = subprocess.run([sys.executable, "-m", "edged", "gguf-dump", "--json", path],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert set(d["metadata"]) == set(meta)
    for k, (vtype, value) in meta.items():
        shown = d["metadata"][k]["value"]
        if isinstance(value, list) and len(value) > 8:
            assert shown["length"] == len(value)
            value, shown = value[:8], shown["head"]
        if isinstance(value, str):
            value = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        assert same_value(shown, value), k
    assert [(t["name"], GGMLType[t["type"]].value, t["shape"], t["offset"], t["bytes"])
            for t in d["tensors"]] == tensors
    assert d["total_bytes"] == sum(t[4] for t in tensors)
    text = subprocess.run([sys.executable, "-m", "edged", "gguf-dump", path],
                          capture_output=True, text=True, cwd=ROOT)
    assert text.returncode == 0 and "tensors:" in text.stdout and "totals:" in text.stdout


def test_gguf_dump_error_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<I", 1) + b"\0" * 16)
    out = subprocess.run([sys.executable, "-m", "edged", "gguf-dump", str(bad)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "version" in out.stderr and "Traceback" not in out.stderr


# --- valid synthetic files ---------------------------------------------------------------------

@pytest.mark.parametrize("version", [2, 3])
def test_reads_v2_and_v3(tmp_path, version):
    f = open_bytes(tmp_path, valid_file(version))
    assert f.version == version
    assert f.get(Key.ARCHITECTURE) == "llama"
    assert f.get("tokenizer.ggml.tokens") == ["<unk>", "a", "é", "\u2581b"]
    assert f.get("tokenizer.ggml.scores").dtype == np.float32
    assert f.get("general.flag") is True and f.get("general.big") == -5
    assert np.array_equal(f.tensor_bytes("a").view(np.float32), np.arange(8, dtype=np.float32))
    assert np.array_equal(f.tensor_bytes("b").view(np.float32), [1, 2, 3, 4])


def test_trailing_bytes_are_allowed(tmp_path):
    f = open_bytes(tmp_path, valid_file() + b"SIGNATURE BLOCK" * 10)
    assert list(f.tensors) == ["a", "b"]


def test_size_limit_hides_trailing_bytes(tmp_path):
    data = valid_file()
    p = tmp_path / "x.gguf"
    p.write_bytes(data + b"junk")
    fd = os.open(p, os.O_RDONLY)
    try:
        f = GGUFFile.from_fd(fd, name=str(p), size=len(data))
    finally:
        os.close(fd)
    assert f.file_size == len(data)
    with pytest.raises(ModelFormatError, match="not within the file"):
        fd = os.open(p, os.O_RDONLY)
        try:
            GGUFFile.from_fd(fd, name=str(p), size=len(data) - 1)
        finally:
            os.close(fd)


def test_custom_alignment(tmp_path):
    kvs = [kv_u32(Key.ALIGNMENT, 64)]
    data = build(kvs, [tensor_info("a", [8], T_F32, 0), tensor_info("b", [8], T_F32, 64)],
                 b"\1" * 32 + b"\0" * 32 + b"\2" * 32, alignment=64)
    f = open_bytes(tmp_path, data)
    assert f.alignment == 64 and f.data_offset % 64 == 0
    assert bytes(f.tensor_bytes("b")) == b"\2" * 32


# --- rejections: header -----------------------------------------------------------------------

def test_bad_magic(tmp_path):
    rejects(tmp_path, build(magic=b"GGUX"), r"bad magic .* at offset 0")


@pytest.mark.parametrize("version", [0, 1, 4, 0xFFFFFFFF])
def test_bad_version(tmp_path, version):
    rejects(tmp_path, build(version=version), rf"unsupported GGUF version {version} \(supported: 2, 3\) at offset 4")


def test_byte_swapped_version(tmp_path):
    rejects(tmp_path, build(version=0x03000000), "byte-swapped")


def test_too_short(tmp_path):
    rejects(tmp_path, b"GGUF\3\0\0\0", "too short")


def test_huge_kv_count(tmp_path):          # CVE class: heap overflow from n_kv
    rejects(tmp_path, build(n_kv=1 << 62), r"metadata count cannot fit .* \(value 4611686018427387904\)")


def test_huge_tensor_count(tmp_path):      # CVE class: heap overflow from n_tensors
    rejects(tmp_path, build(n_tensors=(1 << 64) - 1), "tensor count cannot fit")


# --- rejections: metadata ---------------------------------------------------------------------

def test_string_length_past_end(tmp_path):  # CVE class: string length
    kv = struct.pack("<Q", 10_000) + b"general.architecture"
    rejects(tmp_path, build([kv]), r"metadata key of 10000 bytes: needs 10000 bytes")


def test_string_over_1_gib(tmp_path):
    kv = s("general.name") + struct.pack("<IQ", STR, (1 << 30) + 1) + b"x" * 64
    rejects(tmp_path, build([kv]), r"length over 1 GiB \(value 1073741825\)")


def test_array_count_past_end(tmp_path):   # CVE class: array count
    kv = s("k") + struct.pack("<IIQ", ARR, U32, 1 << 40) + b"\0" * 64
    rejects(tmp_path, build([kv]), r"'k': array of 1099511627776 elements is over 1 GiB")
    kv = s("k") + struct.pack("<IIQ", ARR, U32, 1000) + b"\0" * 64
    rejects(tmp_path, build([kv]), r"array of 1000 x UINT32: needs 4000 bytes")


def test_string_array_count_past_end(tmp_path):
    kv = s("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARR, STR, 1 << 60) + s("a")
    rejects(tmp_path, build([kv]), r"array of 1152921504606846976 strings cannot fit")


def test_string_array_element_past_end(tmp_path):
    kv = s("toks") + struct.pack("<IIQ", ARR, STR, 3) + s("a") + struct.pack("<Q", 99) + b"bc" + b"\0" * 20
    rejects(tmp_path, build([kv]), r"'toks'\[1\]: string of 99 bytes runs past the end")


def test_nested_arrays(tmp_path):
    kv = s("k") + struct.pack("<IIQ", ARR, ARR, 1) + struct.pack("<IQ", U32, 1) + b"\0" * 4
    rejects(tmp_path, build([kv]), "nested arrays")


def test_unknown_value_type(tmp_path):
    rejects(tmp_path, build([s("k") + struct.pack("<II", 13, 0)]), r"unknown value type of 'k' \(value 13\)")


def test_unknown_array_element_type(tmp_path):
    rejects(tmp_path, build([s("k") + struct.pack("<IIQ", ARR, 77, 1) + b"\0" * 8]),
            r"unknown array element type \(value 77\)")


def test_empty_key(tmp_path):
    rejects(tmp_path, build([kv_u32("", 1)]), "empty metadata key at offset 24")


def test_duplicate_key(tmp_path):
    rejects(tmp_path, build([kv_u32("a.b", 1), kv_u32("a.b", 2)]), "duplicate metadata key 'a.b'")


@pytest.mark.parametrize("kv", [
    kv_u32(Key.ALIGNMENT, 0),
    kv_u32(Key.ALIGNMENT, 48),
    s(Key.ALIGNMENT) + struct.pack("<IQ", U64, 32),
    kv_str(Key.ALIGNMENT, "32"),
], ids=["zero", "not-power-of-two", "u64", "string"])
def test_bad_alignment(tmp_path, kv):
    rejects(tmp_path, build([kv]), "general.alignment must be a power-of-two u32")


# --- rejections: tensor infos -----------------------------------------------------------------

def one_tensor(name="t", dims=(8,), ttype=T_F32, offset=0, data=b"\0" * 32, **kw):
    return build([], [tensor_info(name, list(dims), ttype, offset)], data, **kw)


def test_empty_tensor_name(tmp_path):
    rejects(tmp_path, one_tensor(name=""), "tensor 0 has an empty name")


def test_tensor_name_too_long(tmp_path):
    rejects(tmp_path, one_tensor(name="x" * 64), "is 64 bytes, over 63")
    assert open_bytes(tmp_path, one_tensor(name="x" * 63)).tensors


def test_duplicate_tensor_name(tmp_path):
    data = build([], [tensor_info("t", [8], T_F32, 0), tensor_info("t", [8], T_F32, 32)], b"\0" * 64)
    rejects(tmp_path, data, "duplicate tensor name 't'")


@pytest.mark.parametrize("n_dims", [0, 5])
def test_bad_dimension_count(tmp_path, n_dims):
    info = s("t") + struct.pack("<I", n_dims) + struct.pack(f"<{n_dims}Q", *([1] * n_dims)) + \
        struct.pack("<IQ", T_F32, 0)
    rejects(tmp_path, build([], [info], b"\0" * 32), rf"has {n_dims} dimensions")


@pytest.mark.parametrize("dims", [(8, 0), (1 << 63, 1), ((1 << 64) - 1,)], ids=["zero", "negative", "minus-one"])
def test_zero_or_negative_dimension(tmp_path, dims):
    rejects(tmp_path, one_tensor(dims=dims), "is zero or negative")


def test_dimension_overflow(tmp_path):      # CVE class: dims product / total size overflow
    rejects(tmp_path, one_tensor(dims=(1 << 32, 1 << 32, 1 << 32)), "element count overflows")


def test_huge_tensor_is_not_within_file(tmp_path):   # CVE class: total size
    rejects(tmp_path, one_tensor(dims=(1 << 30, 1 << 20)), "is not within the file")


@pytest.mark.parametrize("ttype", [4, 5, 31, 1000])
def test_unknown_ggml_type(tmp_path, ttype):
    rejects(tmp_path, one_tensor(ttype=ttype), rf"unknown ggml type \(value {ttype}\)")


def test_row_not_multiple_of_block(tmp_path):
    rejects(tmp_path, one_tensor(dims=(31, 2), ttype=T_Q4_0), "not a multiple of Q4_0's block size 32")


def test_misaligned_offset(tmp_path):
    rejects(tmp_path, one_tensor(offset=4, data=b"\0" * 64), "not a multiple of the alignment 32")


def test_overlapping_tensors(tmp_path):
    data = build([], [tensor_info("a", [16], T_F32, 0), tensor_info("b", [8], T_F32, 32)], b"\0" * 96)
    rejects(tmp_path, data, "tensor 'b' data at relative offset 32 overlaps tensor 'a'")


def test_out_of_order_tensors(tmp_path):
    data = build([], [tensor_info("a", [8], T_F32, 32), tensor_info("b", [8], T_F32, 0)], b"\0" * 64)
    rejects(tmp_path, data, "tensor 'b' data at relative offset 0 overlaps tensor 'a'")


def test_offset_past_end(tmp_path):         # CVE class: offsets past EOF
    rejects(tmp_path, one_tensor(offset=1 << 40), "is not within the file")


def test_truncated_anywhere(tmp_path):
    data = valid_file()
    for n in range(len(data)):
        with pytest.raises(ModelFormatError):
            open_bytes(tmp_path, data[:n])


# --- fuzzing ----------------------------------------------------------------------------------

SEED = valid_file() + b""


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, len(SEED) - 1), st.integers(0, 255)), min_size=1, max_size=8),
       st.integers(0, len(SEED)))
def test_fuzz_only_model_format_error(tmp_path, flips, cut):
    """Mutated valid files either parse or raise ModelFormatError; nothing else, no hang."""
    data = bytearray(SEED)
    for pos, val in flips:
        data[pos] = val
    try:
        f = open_bytes(tmp_path, bytes(data[:max(cut, 24)] if cut < len(SEED) else data))
    except ModelFormatError:
        return
    for name in f.tensors:       # whatever parsed must be readable within the file
        assert f.tensor_bytes(name).size == f.tensors[name].nbytes


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=0, max_size=300))
def test_fuzz_random_tail_after_header(tmp_path, tail):
    data = b"GGUF" + struct.pack("<IQQ", 3, 2, 3) + tail
    try:
        open_bytes(tmp_path, data)
    except ModelFormatError:
        pass

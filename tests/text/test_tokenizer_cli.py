"""`edged tokenize` on vocab-only GGUF files, as a user runs it."""
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, testdata
from edged import Tokenizer


def edged(*args):
    return subprocess.run([sys.executable, "-m", "edged", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_ids_match_the_python_api():
    path = testdata("vocab", "ggml-vocab-llama-bpe.gguf")
    r = edged("tokenize", "-m", path, "-p", "Hello world \U0001F999", "--ids")
    assert r.returncode == 0, r.stderr
    ids = json.loads(r.stdout)
    assert ids == Tokenizer.from_gguf(path).encode("Hello world \U0001F999")
    assert ids[0] == 128000


def test_default_output_lists_ids_and_pieces_and_flags_work():
    path = testdata("vocab", "ggml-vocab-qwen2.gguf")
    r = edged("tokenize", "-m", path, "-p", "<|im_start|>hi")
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) > 2 and "151644" not in r.stdout
    r = edged("tokenize", "-m", path, "-p", "<|im_start|>hi", "--parse-special", "--json")
    out = json.loads(r.stdout)
    assert out["ids"][0] == 151644 and out["pieces"][:2] == ["<|im_start|>", "hi"]
    spm = testdata("vocab", "ggml-vocab-llama-spm.gguf")
    with_bos = json.loads(edged("tokenize", "-m", spm, "-p", "Hi", "--ids").stdout)
    without = json.loads(edged("tokenize", "-m", spm, "-p", "Hi", "--ids", "--no-bos").stdout)
    assert with_bos == [1] + without
    pieces = edged("tokenize", "-m", spm, "-p", "Hi there", "--pieces", "--no-bos").stdout.splitlines()
    assert [json.loads(p) for p in pieces] == [" Hi", " there"]


def test_unknown_pre_tokenizer_fails_with_its_name(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("brand-new-pre")
    w.add_token_list(["a", "b", "ab"])
    w.add_token_types(np.array([1, 1, 1], np.int32).tolist())
    w.add_token_merges(["a b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = edged("tokenize", "-m", str(path), "-p", "ab")
    assert r.returncode == 2 and "'brand-new-pre'" in r.stderr and "Traceback" not in r.stderr
    r = edged("tokenize", "-m", str(path), "-p", "ab", "--ids", "--allow-unknown-pre")
    assert r.returncode == 0 and json.loads(r.stdout) == [2]

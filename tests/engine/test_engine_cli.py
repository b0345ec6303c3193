"""The engine's commands as a user runs them: edged generate / info / bench / synth."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, testdata


def edged(*args, check=True):
    r = subprocess.run([sys.executable, "-m", "edged", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def test_generate_prints_only_the_continuation_and_timings():
    z = np.load(testdata("golden", "stories260K.golden.npz"))
    r = edged("generate", "-m", testdata("models", "stories260K.gguf"), "-p", "Once upon a time",
              "-n", "20", "--temp", "0", "-t", "2")
    assert r.stdout.startswith(", there was a little girl named Lily")
    assert "Once upon a time" not in r.stdout
    for what in ("load time", "prompt eval time", "eval time"):
        assert what in r.stderr
    assert "tokens per second" in r.stderr


def test_generate_json_is_reproducible_with_a_seed():
    m = testdata("models", "stories260K.gguf")
    args = ("generate", "-m", m, "-p", "Once upon a time", "-n", "12", "--temp", "0.9",
            "--seed", "11", "--json")
    a, b = json.loads(edged(*args).stdout), json.loads(edged(*args).stdout)
    assert a["tokens"] == b["tokens"] and a["text"] == b["text"] and len(a["tokens"]) == 12
    assert a["finish_reason"] == "length"
    assert a["timings"]["gen_tokens"] == 12


def test_generate_refuses_unknown_file_with_one_line():
    r = edged("generate", "-m", "/nonexistent.gguf", "-p", "x", check=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_info_reports_model_needs():
    r = edged("info", "-m", testdata("models", "synthetic-gemma3-Q4_K_M.gguf"), "--json")
    info = json.loads(r.stdout)
    assert info["architecture"] == "gemma3"
    assert info["hparams"]["n_swa"] == 64 and info["swa_layers"] == [0, 1]
    assert set(info["weight_types"]) >= {"Q4_K", "F32"}
    mem = {x["n_ctx"]: x for x in info["memory"]}
    assert mem[4096]["kv_cache"] == 2 * 2 * 4096 * 128 * 2  # K+V, 2 layers, f16


def test_bench_json():
    r = edged("bench", "-m", testdata("models", "stories260K.gguf"), "-p", "16", "-n", "4",
              "-r", "1", "--json")
    res = {x["test"]: x for x in json.loads(r.stdout)["results"]}
    assert res["pp16"]["tps_mean"] > 0 and res["tg4"]["tps_mean"] > 0


def test_synth_makes_a_model_that_loads_and_generates(tmp_path):
    out = str(tmp_path / "tiny.gguf")
    edged("synth", "--shape", "tiny", "--type", "Q4_K_M", out)
    info = json.loads(edged("info", "-m", out, "--json").stdout)
    assert info["vocabulary"] == 4096 and info["hparams"]["n_layer"] == 4
    assert "Q6_K" in info["weight_types"] and "Q4_K" in info["weight_types"]
    r = edged("generate", "-m", out, "-p", "hello", "-n", "8", "--json")
    assert len(json.loads(r.stdout)["tokens"]) == 8


def test_synth_fallback_types_for_rows_not_multiple_of_256():
    from edged.format.gguf import GGMLType
    from edged.format.synth import tensor_type
    assert tensor_type("attn_q", 896, "Q4_K_M") == GGMLType.Q5_0
    assert tensor_type("output", 896, "Q4_K_M") == GGMLType.Q8_0
    assert tensor_type("ffn_down", 4864, "Q4_K_M", il=0, n_layer=24) == GGMLType.Q6_K
    assert tensor_type("ffn_down", 4864, "Q4_K_M", il=4, n_layer=24) == GGMLType.Q4_K


def test_generate_lookup_and_draft_give_the_same_tokens_and_report_acceptance():
    m = testdata("models", "stories260K.gguf")
    base = ("generate", "-m", m, "-p", "Once upon a time, a cat sat. Once upon a time, a cat", "-n", "16",
            "--temp", "0.9", "--seed", "3", "--json", "-t", "1")
    plain = json.loads(edged(*base).stdout)
    for extra in (("--lookup", "--draft-max", "4", "--lookup-ngram", "1:3"),
                  ("--draft", testdata("models", "synthetic-llama-Q4_0.gguf"))):
        r = edged(*base, *extra)
        got = json.loads(r.stdout)
        assert got["tokens"] == plain["tokens"] and got["text"] == plain["text"], extra
        assert got["timings"]["drafted"] > 0 and "drafted =" in r.stderr


def test_generate_draft_of_another_vocabulary_is_one_line_naming_it():
    r = edged("generate", "-m", testdata("models", "stories260K.gguf"), "-p", "x", "-n", "2",
              "--draft", testdata("models", "SmolLM2-135M-Instruct.Q4_1.gguf"), check=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "vocabulary differs" in r.stderr and "tokens against" in r.stderr
    r = edged("generate", "-m", testdata("models", "stories260K.gguf"), "-p", "x", "--lookup",
              "--lookup-ngram", "3:1", check=False)
    assert r.returncode == 2 and "ngram" in r.stderr


def test_bench_lookup_json_reports_acceptance_and_speedup():
    r = edged("bench", "-m", testdata("models", "stories260K.gguf"), "-n", "16", "-r", "1", "--lookup", "--json")
    plain, spec = json.loads(r.stdout)["results"]
    assert plain["test"] == "tg16 plain" and spec["test"] == "tg16 lookup"
    assert spec["same_tokens"] is True and spec["drafted"] > 0 and 0 <= spec["acceptance"] <= 1
    assert spec["speedup"] > 0


def test_synth_layers_writes_the_first_layers_of_a_shape(tmp_path):
    """`--layers N`: the shape's first N layers of their real sizes and pattern (LFM2-350M: two
    convolutions, then attention), named as such; refused past the real count and for a shape
    whose last layers reuse earlier layers' K/V."""
    out = str(tmp_path / "l.gguf")
    edged("synth", "--shape", "lfm2-350m", "--type", "Q4_0", "--layers", "3", out)
    info = json.loads(edged("info", "-m", out, "--json").stdout)
    assert info["hparams"]["n_layer"] == 3 and info["hparams"]["n_embd"] == 1024
    assert info["hparams"]["conv_layers"] == [True, True, False]
    from edged.format.gguf import GGUFFile
    with GGUFFile.open(out) as f:
        assert f.metadata["general.name"] == "edged-synth-lfm2-350m-3-layers-Q4_0"
    r = edged("synth", "--shape", "lfm2-350m", "--layers", "17", out, check=False)
    assert r.returncode != 0 and "--layers 17: 1 to lfm2-350m's 16" in r.stderr
    r = edged("synth", "--shape", "gemma4-e2b", "--layers", "10", out, check=False)
    assert r.returncode != 0 and "reuse earlier layers' K/V" in r.stderr

"""Architectures and RoPE variants beyond ../shared/testdata, against llama.cpp's recorded logits.

tests/data/goldens holds small random-weight files and llama.cpp's teacher-forced logits for
them (tools/make_goldens.py has the commands): gemma2 (attention and final soft-capping,
alternating sliding window), granite (embedding/residual/attention/logit multipliers),
smollm3 (every fourth layer without RoPE), Phi-4-mini on phi3 (partial rotary, LongRoPE
factors, attn_factor), YaRN on qwen2, qwen3moe (16 experts, 4 per token), qwen2moe (8
experts, 2 per token, a gated shared expert), gpt-oss (attention sinks, biases, alternating
window, YaRN, 4 of 8 experts by softmax over the top-4 logits, clamped SwiGLU; also with its
experts in MXFP4, quantized by gguf-py) and quantized KV caches (kv-*: q8_0 and q4_0 K and V
through llama.cpp's flash attention, a q8_0 K with an F16 V without it). Their weights are F16,
so testdata/README.md's float tolerances apply (max 0.05, mean 0.01, top-1 where decided).
NAME-MIX files are the same models quantized by llama-quantize (Q4_0, Q8_0; IQ4_NL / IQ4_XS on
a 256-wide llama; MXFP4 experts on qwen3moe), held to the README's quantized tolerances (max
0.35, mean 0.06) on the compiled paths, which quantize activations as llama.cpp does; the
float64 reference backend does not, and on these random models with logits of std ~8 lands up to ~2 away, so it is checked on
the F16 files only (and on gpt-oss-mxfp4, whose logits are of unit scale).
"""
import os
import shutil

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from edged import Model  # noqa: E402
from edged.errors import UnsupportedModelError  # noqa: E402
from gguf_clone import clone  # noqa: E402
from kernel_paths import kernels  # noqa: E402,F401  (fixture: best and generic paths)
from family_goldens import (GOLDENS, MAX_ABS, alone_batched_forked, check,  # noqa: E402
                            check_every_kernel_path, teacher_forced)

# text models' goldens (synthetic-*; a golden whose model is written again by its own test
# module, gguf_sha256, is checked there; vision-* are test_vision's)
NAMES = sorted(f[:-len(".golden.npz")] for f in os.listdir(GOLDENS)
               if f.startswith("synthetic-") and f.endswith(".golden.npz")
               and "gguf_sha256" not in np.load(os.path.join(GOLDENS, f)).files)
MOE = os.path.join(GOLDENS, "synthetic-qwen3moe.gguf")
GPT_OSS = os.path.join(GOLDENS, "synthetic-gpt-oss.gguf")
QUANTIZED = [n for n in NAMES if "-Q" in n or "-IQ" in n or "-MXFP4" in n]  # NAME-MIX files


def test_goldens_present():
    assert {"synthetic-gemma2", "synthetic-granite", "synthetic-smollm3", "synthetic-phi4mini",
            "synthetic-qwen2-yarn", "synthetic-qwen3moe", "synthetic-qwen2moe",
            "synthetic-gpt-oss", "synthetic-gpt-oss-mxfp4"} <= set(NAMES)
    assert {"synthetic-llama256-IQ4_NL", "synthetic-llama256-IQ4_XS", "synthetic-qwen3moe-MXFP4_MOE",
            "synthetic-gemma2-Q4_0", "synthetic-qwen3moe-Q8_0"} <= set(QUANTIZED)


@pytest.mark.parametrize("name", NAMES)
def test_golden_compiled(name, kernels):
    check(name, "cpu")


# the reference backend does not run gemma4 (layers of their own sizes): test_engine_gemma4
# checks its NumPy reference against the golden
NO_REFERENCE_BACKEND = {"synthetic-gemma4", "synthetic-gemma4-moe"}


@pytest.mark.parametrize("name", [n for n in NAMES if n not in QUANTIZED and n not in NO_REFERENCE_BACKEND])
def test_golden_reference(name):
    check(name, "reference")


def test_moe_batch_equals_token_by_token():
    """A prompt batch (tokens grouped by expert) gives what one token at a time gives."""
    pytest.importorskip("edged._core")
    batch, _, _ = teacher_forced(MOE, "cpu", batch=True)
    single, _, _ = teacher_forced(MOE, "cpu", batch=False)
    assert np.abs(batch - single).max() < 2e-3


def poison_experts(src, dst, keep):
    """Copy src with every expert not in keep[router tensor] filled with F16 NaNs."""
    shutil.copyfile(src, dst)
    out = np.memmap(dst, mode="r+")
    for t in gguf.GGUFReader(src).tensors:
        if t.name.endswith("_exps.weight"):
            assert t.tensor_type == gguf.GGMLQuantizationType.F16
            used = keep[t.name.rsplit(".", 2)[0] + ".ffn_gate_inp.weight"]
            per = int(t.n_bytes) // t.data.shape[0]
            for e in range(t.data.shape[0]):
                if e not in used:
                    o = int(t.data_offset) + e * per
                    out[o:o + per] = np.full(per // 2, 0x7E00, np.uint16).view(np.uint8)
    out.flush()
    del out


def test_moe_reads_only_the_selected_experts(tmp_path):
    """Experts no token is routed to are never multiplied: poisoned with NaN, the logits do
    not change (a dense evaluation of every expert times a zero weight would give NaN)."""
    pytest.importorskip("edged._core")
    with Model.load(MOE, backend="reference", n_threads=1) as m:
        z = np.load(MOE[:-5] + ".golden.npz")
        m.session(n_ctx=512).eval(z["tokens"].tolist(), logits="last")
        routed = m.backend.routed
    assert all(0 < len(v) < 16 for v in routed.values()), routed  # some experts unused
    poisoned = str(tmp_path / "poisoned.gguf")
    poison_experts(MOE, poisoned, routed)
    clean, _, _ = teacher_forced(MOE, "cpu")
    dirty, _, _ = teacher_forced(poisoned, "cpu", golden=MOE[:-5] + ".golden.npz")
    assert np.isfinite(dirty).all()
    assert np.array_equal(clean, dirty)


def test_moe_info_reports_active_weights(capsys):
    from edged.commands.info import model_info
    info = model_info(MOE, [512])
    hp = info["hparams"]
    assert (hp["n_expert"], hp["n_expert_used"], hp["n_ff_exp"]) == (16, 4, 16)
    with gguf_reader(MOE) as tensors:
        experts = sum(t.n_bytes for t in tensors if t.name.endswith("_exps.weight"))
        total = sum(t.n_bytes for t in tensors)
    assert info["weights_bytes"] == total
    # tied embeddings: the whole token_embd is read for the logits
    assert info["active_weights_bytes"] == total - experts + experts * 4 // 16
    from edged.cli import main
    main(["info", "-m", MOE, "-c", "512"])
    assert "experts: 4 of 16 per token" in capsys.readouterr().out


class gguf_reader:
    def __init__(self, path):
        self.r = gguf.GGUFReader(path)

    def __enter__(self):
        return self.r.tensors

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("meta, message", [
    ({"qwen3moe.expert_used_count": (17, gguf.GGUFValueType.UINT32)},
     "expert_used_count 17 / expert_count 16"),
    ({"qwen3moe.expert_count": (513, gguf.GGUFValueType.UINT32)},
     "expert_used_count 4 / expert_count 513"),
    ({"qwen3moe.expert_count": (8, gguf.GGUFValueType.UINT32)},
     r"tensor 'blk.0.ffn_gate_inp.weight' has shape \(64, 16\), expected \(64, 8\)"),
])
def test_moe_refusals(tmp_path, meta, message):
    p = clone(MOE, tmp_path / "x.gguf", meta=meta, drop_meta=list(meta))
    with pytest.raises(UnsupportedModelError, match=message):
        Model.load(str(p), backend="reference")


def test_moe_missing_router_refused(tmp_path):
    p = clone(MOE, tmp_path / "x.gguf", drop=["blk.1.ffn_gate_inp.weight"])
    with pytest.raises(UnsupportedModelError, match="missing tensor 'blk.1.ffn_gate_inp.weight'"):
        Model.load(str(p), backend="reference")


@pytest.mark.parametrize("name", ["synthetic-gemma2", "synthetic-qwen3moe", "synthetic-qwen2-yarn",
                                  "synthetic-gpt-oss"])
def test_long_prompt_batch(name):
    """An 80-token prompt in one batch (soft-capped attention keeps the exact kernel, sinks go
    through the blocked one; experts see groups of many tokens; gpt-oss's window of 8 slides
    far) lands where one token at a time and the reference land."""
    pytest.importorskip("edged._core")
    path = os.path.join(GOLDENS, name + ".gguf")
    toks = [1] + np.random.default_rng(5).integers(3, 512, 79).tolist()
    out = {}
    for backend, batch in (("cpu", True), ("cpu", False), ("reference", True)):
        with Model.load(path, backend=backend, n_threads=2) as m:
            s = m.session(n_ctx=128)
            if batch:
                out[backend, batch] = s.eval(toks)[0]
            else:
                for t in toks:
                    last = s.eval([t])
                out[backend, batch] = last[0]
    assert np.abs(out["cpu", True] - out["cpu", False]).max() < 0.01
    assert np.abs(out["cpu", True] - out["reference", True]).max() < MAX_ABS


def test_moe_decode_batch_of_sessions():
    """Several sessions' decode step in one pass (experts grouped across sessions) gives each
    session what its own eval gives."""
    pytest.importorskip("edged._core")
    with Model.load(MOE, n_threads=2) as m:
        prompts = [[1, 40, 41, 42], [1, 300, 7], [1, 99, 98, 97, 96, 95]]
        alone, batched, _, _ = alone_batched_forked(m, prompts)
        assert np.abs(np.array(alone) - batched).max() < 1e-4


def test_moe_budget_counts_unrouted_experts_as_pageable():
    """Mapped experts a token does not read may live in the page cache: a budget below the
    file's size but above what one token needs loads (mmap); a private copy of the weights
    (mmap=False) must fit whole and is refused."""
    pytest.importorskip("edged._core")
    from edged.errors import CapacityError
    with gguf_reader(MOE) as tensors:
        experts = sum(t.n_bytes for t in tensors if t.name.endswith("_exps.weight"))
        total = sum(t.n_bytes for t in tensors)
    budget = total - (experts - experts * 4 // 16) // 2
    with Model.load(MOE, max_memory=budget, n_threads=1) as m:
        assert m.memory_plan.paged == experts - experts * 4 // 16
        assert "unrouted experts may page" in m.memory_plan.describe()
    with pytest.raises(CapacityError, match="does not fit"):
        Model.load(MOE, max_memory=budget, mmap=False, n_threads=1)


def test_moe_quantized_prompt_batch(tmp_path):
    """Q8_0 experts: an 80-token batch takes the packed-panel product per expert group (each
    group gathered from scattered tokens); it lands where one token at a time lands, up to
    the summation-order noise this random model (logits ~50) amplifies."""
    pytest.importorskip("edged._core")
    from edged.format.quantize import quantize_file
    q8 = str(tmp_path / "moe-q8.gguf")
    quantize_file(MOE, q8, "Q8_0")
    toks = [1] + np.random.default_rng(5).integers(3, 512, 79).tolist()
    with Model.load(q8, n_threads=2) as m:
        assert {t.type.name for n, t in m.spec.tensors.items() if "_exps" in n} >= {"Q8_0"}
        batch = m.session(n_ctx=128).eval(toks)[0]
        s = m.session(n_ctx=128)
        for t in toks:
            single = s.eval([t])[0]
    assert np.abs(batch - single).max() < 0.5


@pytest.mark.parametrize("name, line", [
    ("synthetic-qwen2-yarn", "rope scaling: YaRN, factor 4 over an original context of 32"),
    ("synthetic-smollm3", "layers without RoPE: [3]"),
])
def test_info_names_rope_variants(name, line, capsys):
    from edged.cli import main
    main(["info", "-m", os.path.join(GOLDENS, name + ".gguf"), "-c", "512"])
    assert line in capsys.readouterr().out


def test_gpt_oss_sinks_take_part(tmp_path):
    """The sinks are read: with every sink at -1e4 (no weight in any softmax) the logits move
    far from llama.cpp's, and the reference backend moves the same way."""
    p = str(tmp_path / "nosinks.gguf")
    shutil.copyfile(GPT_OSS, p)
    out = np.memmap(p, mode="r+")
    for t in gguf.GGUFReader(GPT_OSS).tensors:
        if t.name.endswith("attn_sinks.weight"):
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            o = int(t.data_offset)
            out[o:o + int(t.n_bytes)] = np.full(int(t.n_elements), -1e4, np.float32).view(np.uint8)
    out.flush()
    del out
    golden = GPT_OSS[:-5] + ".golden.npz"
    got, ref, _ = teacher_forced(p, "reference", golden=golden)
    assert np.abs(got - ref).max() > 10 * MAX_ABS
    pytest.importorskip("edged._core")
    fast, _, _ = teacher_forced(p, "cpu", golden=golden)
    assert np.abs(fast - got).max() < MAX_ABS


@pytest.mark.parametrize("drop, drop_meta, message", [
    (["blk.1.attn_sinks.weight"], [], "missing tensor 'blk.1.attn_sinks.weight'"),
    (["blk.0.ffn_up_exps.bias"], [], "missing tensor 'blk.0.ffn_up_exps.bias'"),
    (["blk.0.post_attention_norm.weight"], [], "missing tensor 'blk.0.post_attention_norm.weight'"),
    ([], ["gpt-oss.attention.sliding_window"], "gpt-oss.attention.sliding_window"),
])
def test_gpt_oss_refusals(tmp_path, drop, drop_meta, message):
    p = clone(GPT_OSS, tmp_path / "x.gguf", drop=drop, drop_meta=drop_meta)
    with pytest.raises(UnsupportedModelError, match=message):
        Model.load(str(p), backend="reference")


def test_gpt_oss_info_reports_active_weights(capsys):
    from edged.commands.info import model_info
    info = model_info(GPT_OSS, [512])
    with gguf_reader(GPT_OSS) as tensors:
        experts = sum(t.n_bytes for t in tensors if "_exps." in t.name)
        embd = next(t.n_bytes for t in tensors if t.name == "token_embd.weight")
        total = sum(t.n_bytes for t in tensors)
    assert info["weights_bytes"] == total
    # one embedding row of 512, 4 of the 8 experts (weights and biases), everything else
    assert info["active_weights_bytes"] == total - experts - embd + embd // 512 + experts * 4 // 8
    from edged.cli import main
    main(["info", "-m", GPT_OSS, "-c", "512"])
    assert "experts: 4 of 8 per token" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["synthetic-gpt-oss", "synthetic-gpt-oss-mxfp4"])
def test_gpt_oss_every_kernel_path(name):
    """gpt-oss on every path this CPU has (generic, avx2, avx512; NEON runs the same C for
    sinks, biases, routing and the clamped SwiGLU), not only the best and generic ones."""
    check_every_kernel_path(pytest.importorskip("edged._core"), name)

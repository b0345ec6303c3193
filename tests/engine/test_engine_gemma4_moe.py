"""Gemma 4 mixture of experts (the 26B-A4B layout): hyperparameters and tensors as llama.cpp
reads them, refusals naming the key or tensor, the NumPy reference (edged/engine/gemma4.py)
and the compiled pass (cython_kernels/forward/forward_moe_gemma4.h) against llama.cpp.

tests/data/goldens/synthetic-gemma4-moe is a scaled-down 26B-A4B (n_embd 64; sliding layers 0,
1, 3 with head size 16, full layers 2 and 4 with head size 32 and no attn_v; every layer a dense
FFN 32 wide beside 8 routed experts 16 wide, 3 per token; layer 0 with separate gate and up
experts, the others fused; each expert's output scaled) with llama.cpp's teacher-forced logits
(a 40-token prompt, then 24 greedy tokens), made by `tools/make_goldens.py --llama-teacher BIN
gemma4-moe`. test_engine_families also runs it on the best and the generic path.
"""
import os

import numpy as np
import pytest

from edged import Model
from edged.engine import gemma4
from edged.engine.arch import validate
from edged.errors import UnsupportedModelError
from edged.format.gguf import GGUFFile
from family_goldens import (GOLDENS, MAX_ABS, MEAN_ABS, alone_batched_forked,
                            assert_batch_chunks_single_agree, check_every_kernel_path, greedy)

BASE = os.path.join(GOLDENS, "synthetic-gemma4-moe")
GOLDEN = np.load(BASE + ".golden.npz")
TOKENS, N_PROMPT = GOLDEN["tokens"].tolist(), int(GOLDEN["n_prompt"])


@pytest.fixture(scope="module")
def gguf():
    with GGUFFile.open(BASE + ".gguf") as f:
        yield f


@pytest.fixture
def core():
    return pytest.importorskip("edged._core")


def test_hparams_as_llama_cpp_reads_them(gguf):
    hp = gemma4.hparams(gguf.metadata, 512)
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp) == (8, 3, 16)
    assert hp.n_ff == (32,) * 5 and (hp.n_kv_shared, hp.n_embd_per_layer) == (0, 0)
    h = validate(gguf.metadata, gguf.tensors, 512).hp
    assert (h.n_expert, h.n_expert_used, h.n_ff_exp, h.expert_weights_norm) == (8, 3, 16, True)


def test_both_expert_layouts_are_read(gguf):
    """Layer 0 holds ffn_gate_exps and ffn_up_exps, the others ffn_gate_up_exps (what the
    converter writes now); every layer its router scale, expert scales and three norms."""
    layers = validate(gguf.metadata, gguf.tensors, 512).layers
    assert layers[0].ffn_gate_exps and layers[0].ffn_up_exps and not layers[0].ffn_gate_up_exps
    assert all(L.ffn_gate_up_exps and not L.ffn_gate_exps for L in layers[1:])
    assert all(L.ffn_gate_inp_scale and L.ffn_down_exps_scale and L.pre_ffw_norm_2
               and L.post_ffw_norm_1 and L.post_ffw_norm_2 and L.ffn_gate for L in layers)


def test_reference_forward_matches_llama_cpp(gguf):
    ref = GOLDEN["logits"]
    got = gemma4.forward(gemma4.Weights(gguf, gemma4.hparams(gguf.metadata, 512)), TOKENS)
    d = np.abs(got - ref)
    assert d.max() <= MAX_ABS and d.mean() <= MEAN_ABS and \
        (got.argmax(1) == ref.argmax(1)).all(), f"max {d.max():.4f} mean {d.mean():.5f}"


@pytest.mark.parametrize("change, message", [
    ({"gemma4.expert_used_count": None}, "missing required key 'gemma4.expert_used_count'"),
    ({"gemma4.expert_feed_forward_length": None},
     "missing required key 'gemma4.expert_feed_forward_length'"),
    ({"gemma4.expert_used_count": 9}, "expert_used_count 9 / expert_count 8 invalid"),
    ({"gemma4.expert_count": 513, "gemma4.expert_used_count": 3}, "at most 512 experts"),
])
def test_bad_expert_metadata_is_refused_naming_the_key(gguf, change, message):
    md = dict(gguf.metadata)
    for k, v in change.items():
        if v is None:
            del md[k]
        else:
            md[k] = v
    with pytest.raises(UnsupportedModelError, match=message):
        gemma4.hparams(md, 512)


@pytest.mark.parametrize("drop, message", [
    ("blk.1.ffn_gate_up_exps.weight", "missing tensor 'blk.1.ffn_gate_exps.weight'"),
    ("blk.2.ffn_gate_inp.scale", "missing tensor 'blk.2.ffn_gate_inp.scale'"),
    ("blk.3.post_ffw_norm_2.weight", "missing tensor 'blk.3.post_ffw_norm_2.weight'"),
])
def test_missing_expert_tensor_is_refused_by_both_readers(gguf, drop, message):
    tensors = {k: v for k, v in gguf.tensors.items() if k != drop}

    class Fake:
        pass
    f = Fake()
    f.tensors = tensors
    with pytest.raises(UnsupportedModelError, match=message):
        gemma4.Weights(f, gemma4.hparams(gguf.metadata, 512))
    with pytest.raises(UnsupportedModelError, match=message):
        validate(gguf.metadata, tensors, 512)


def test_misshapen_expert_tensor_is_refused(gguf):
    tensors = dict(gguf.tensors)
    tensors["blk.2.ffn_down_exps.weight"] = tensors["blk.1.ffn_gate_up_exps.weight"]
    with pytest.raises(UnsupportedModelError, match="blk.2.ffn_down_exps.weight"):
        validate(gguf.metadata, tensors, 512)


def test_golden_every_kernel_path(core):
    """Teacher-forced logits within the F16 tolerances on generic, avx2 and avx512 (every
    path this CPU has)."""
    check_every_kernel_path(core, "synthetic-gemma4-moe")


def test_greedy_16_tokens_as_llama_cpp(core):
    assert greedy(BASE + ".gguf", "cpu", TOKENS[:N_PROMPT], 16) == TOKENS[N_PROMPT:N_PROMPT + 16]


def test_batch_chunks_and_single_tokens_agree(core):
    """The prompt in one batch (tokens grouped by expert), in chunks of 7 and one token at a
    time: the same bits."""
    with Model.load(BASE + ".gguf", n_threads=2) as m:
        assert_batch_chunks_single_agree(m, TOKENS[:N_PROMPT])


def test_fork_and_decode_batch_of_sessions(core):
    prompts = [TOKENS[:12], TOKENS[5:9], [1, 300, 301, 302, 303, 304, 305]]
    with Model.load(BASE + ".gguf", n_threads=2) as m:
        alone, batched, forked, _ = alone_batched_forked(m, prompts)
    assert np.abs(np.array(alone) - batched).max() < 1e-4
    assert np.array_equal(forked, alone[0])


def test_expert_output_scale_takes_part(core, tmp_path):
    """ffn_down_exps.scale multiplies each expert's output: a file without it (llama.cpp: the
    tensor is optional) gives other logits, and the NumPy reference agrees on both."""
    pytest.importorskip("gguf")
    from gguf_clone import clone
    path = str(tmp_path / "noscale.gguf")
    clone(BASE + ".gguf", path, drop={f"blk.{il}.ffn_down_exps.scale" for il in range(5)})
    ids = TOKENS[:20]
    with Model.load(path, n_threads=2) as m:
        got = np.asarray(m.session(n_ctx=64).eval(ids, logits="all"))
    with GGUFFile.open(path) as f:
        want = gemma4.forward(gemma4.Weights(f, gemma4.hparams(f.metadata, 512)), ids)
    assert np.abs(got - want).max() < MAX_ABS
    assert np.abs(got - GOLDEN["logits"][:20]).max() > 0.1

"""Hyperparameters no trained model has are refused at load, naming the key and the value
(issues 13.8 and 41.13)."""
import math
import os

import gguf
import pytest

from gguf_clone import clone
from hardening_files import ARCH, TOKENS, kv_f32, llama_file
from edged.engine.model import Model
from edged.errors import EdgedError, MetadataValueError, ModelFormatError, UnsupportedModelError
from edged.format.gguf import GGUFFile, Key

arch = pytest.importorskip("edged.engine.arch")


def validate(tmp_path, data):
    path = tmp_path / "hp.gguf"
    path.write_bytes(data)
    with GGUFFile.open(str(path)) as f:
        return arch.validate(f.metadata, f.tensors, len(TOKENS))


@pytest.mark.parametrize("key,value", [
    (Key.LAYERNORM_RMS_EPS, 0.0), (Key.LAYERNORM_RMS_EPS, -1e-5), (Key.LAYERNORM_RMS_EPS, math.nan),
    (Key.ROPE_FREQ_BASE, 0.0), (Key.ROPE_FREQ_BASE, -10000.0), (Key.ROPE_FREQ_BASE, math.nan),
    (Key.ROPE_FREQ_BASE, math.inf),
])
def test_impossible_hyperparameter_is_refused_with_its_key(tmp_path, key, value):
    name = Key.arch(key, ARCH)
    data = llama_file()
    if key == Key.LAYERNORM_RMS_EPS:
        old = kv_f32(name, 1e-5)
        assert data.count(old) == 1
        data = data.replace(old, kv_f32(name, value))
    else:
        data = llama_file(extra_kvs=[kv_f32(name, value)])
    with pytest.raises(UnsupportedModelError, match=name.replace(".", r"\.")):
        validate(tmp_path, data)


def test_sane_values_still_load(tmp_path):
    spec = validate(tmp_path, llama_file(extra_kvs=[kv_f32(Key.arch(Key.ROPE_FREQ_BASE, ARCH), 500000.0)]))
    assert spec.hp.rope_freq_base == 500000.0 and spec.hp.rms_eps == pytest.approx(1e-5)


# --- every hyperparameter key, absurd values (issue 41.13) ---------------------------------------
# Each key of arch.HPARAM_KEYS set, in a real file of an architecture that reads it, to values no
# trained model has. Before, 2^63-1 as gpt-oss's original_context_length or sliding_window
# passed validation and failed in the compiled core (OverflowError: a 500, a CLI traceback),
# and bert's token_type_count as a string or NaN raised ValueError.
GOLDENS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "goldens")
T = gguf.GGUFValueType
COMMON = [Key.CONTEXT_LENGTH, Key.EMBEDDING_LENGTH, Key.BLOCK_COUNT, Key.HEAD_COUNT,
          Key.HEAD_COUNT_KV, Key.FEED_FORWARD_LENGTH, Key.KEY_LENGTH, Key.VALUE_LENGTH,
          Key.ROPE_DIMENSION_COUNT, Key.VOCAB_SIZE, Key.ROPE_FREQ_BASE, Key.ROPE_SCALING_TYPE,
          Key.ROPE_SCALING_FACTOR, Key.ROPE_SCALING_ATTN_FACTOR,
          Key.LAYERNORM_RMS_EPS]
FILES = {   # golden file -> keys its architecture reads
    "synthetic-gpt-oss": COMMON + [Key.SLIDING_WINDOW, Key.SLIDING_WINDOW_PATTERN,
                                   Key.ROPE_FREQ_BASE_SWA, Key.ROPE_SCALING_ORIG_CTX_LEN,
                                   Key.EXPERT_COUNT, Key.EXPERT_USED_COUNT,
                                   Key.EXPERT_FEED_FORWARD_LENGTH, Key.NEXTN_PREDICT_LAYERS],
    "synthetic-gemma2": [Key.FINAL_LOGIT_SOFTCAPPING, Key.ATTN_LOGIT_SOFTCAPPING,
                         Key.ROPE_SCALE_LINEAR],   # read where rope.scaling.factor is absent
    "synthetic-granite": [Key.EMBEDDING_SCALE, Key.RESIDUAL_SCALE, Key.ATTENTION_SCALE,
                          Key.LOGIT_SCALE, Key.ROPE_SCALING_FINETUNED],
    "synthetic-qwen2moe": [Key.EXPERT_SHARED_FEED_FORWARD_LENGTH],
    "synthetic-lfm2": [Key.SHORTCONV_L_CACHE, Key.HEAD_COUNT_KV],   # an array per layer there
    "synthetic-qwen35": [Key.SSM_CONV_KERNEL, Key.SSM_INNER_SIZE, Key.SSM_STATE_SIZE,
                         Key.SSM_TIME_STEP_RANK, Key.SSM_GROUP_COUNT, Key.FULL_ATTENTION_INTERVAL],
    "embed-bert": [Key.LAYERNORM_EPS, Key.TOKEN_TYPE_COUNT, Key.CAUSAL, Key.EMBEDDING_LENGTH,
                   Key.BLOCK_COUNT, Key.HEAD_COUNT, Key.HEAD_COUNT_KV, Key.FEED_FORWARD_LENGTH,
                   Key.CONTEXT_LENGTH, Key.ROPE_FREQ_BASE],
}
ABSURD = [("2^63-1", 2**63 - 1, (T.UINT64,)), ("-1", -1, (T.INT32,)),
          ("nan", math.nan, (T.FLOAT32,)), ("inf", math.inf, (T.FLOAT64,)),
          ("string", "8", (T.STRING,)), ("array", ["8"], (T.ARRAY, T.STRING))]
CASES = [(f, k, *v) for f, keys in FILES.items() for k in keys for v in ABSURD]


def absurd_file(tmp_path, fname, key, value, types):
    """A copy of golden `fname` with `key` set to `value`; returns (path, full key name)."""
    src = os.path.join(GOLDENS, fname + ".gguf")
    with GGUFFile.open(src) as f:
        name = Key.arch(key, f.metadata[Key.ARCHITECTURE])
    return clone(src, tmp_path / "x.gguf", meta={name: (value, *types)}, drop_meta=[name]), name


def test_every_hyperparameter_key_has_cases():
    """A key added to the table without cases here fails this test."""
    assert {c[1] for c in CASES} == set(arch.HPARAM_KEYS)


@pytest.mark.parametrize("fname,key,label,value,types", CASES,
                         ids=[f"{c[0]}-{c[1].split('.', 1)[-1]}-{c[2]}" for c in CASES])
def test_absurd_hyperparameter_is_refused_or_harmless(tmp_path, fname, key, label, value, types):
    """Refused with a 422 naming the key (and the value), or the model loads and runs."""
    pytest.importorskip("edged._core")
    path, name = absurd_file(tmp_path, fname, key, value, types)
    must_refuse = not (arch.HPARAM_KEYS[key].kind is float and label == "2^63-1")
    try:
        with Model.load(path, backend="cpu") as m:
            if m.encoder:
                m.embed(["hello world"])
            else:
                m.session(n_ctx=64).eval([1, 2, 3])
    except EdgedError as e:
        assert e.status == 422 and name in str(e), e
        assert not must_refuse or repr(value) in str(e), e
        return
    assert not must_refuse, f"{name} = {value!r} was accepted"


@pytest.mark.parametrize("fname,key,value,vtype", [
    ("synthetic-gpt-oss", Key.ROPE_SCALING_ORIG_CTX_LEN, 2**63 - 1, T.UINT64),
    ("synthetic-gpt-oss", Key.SLIDING_WINDOW, 2**62, T.UINT64),
    ("embed-bert", Key.TOKEN_TYPE_COUNT, "2", T.STRING),
    ("embed-bert", Key.TOKEN_TYPE_COUNT, math.nan, T.FLOAT32),
])
def test_issue_41_13_reproductions(tmp_path, fname, key, value, vtype):
    """The red team's files: a MetadataValueError (a ModelFormatError, 422) naming the key and
    the value, from the reference backend too (it has no C ints to overflow)."""
    path, name = absurd_file(tmp_path, fname, key, value, (vtype,))
    for backend in ("reference", "cpu"):
        with pytest.raises(MetadataValueError, match=name.replace(".", r"\.")) as e:
            Model.load(path, backend=backend)
        assert isinstance(e.value, ModelFormatError) and e.value.status == 422
        assert repr(value) in str(e.value)


@pytest.mark.parametrize("value,vtype", [("8", T.STRING), (math.nan, T.FLOAT32), (2**63, T.UINT64)])
def test_quantize_refuses_an_absurd_head_count(tmp_path, value, vtype):
    """`edged quantize` reads head and layer counts for its type choices: the same refusal
    (before: ValueError from int(), a traceback)."""
    from edged.format.quantize import quantize_file
    path, name = absurd_file(tmp_path, "synthetic-granite", Key.HEAD_COUNT, value, (vtype,))
    with pytest.raises(MetadataValueError, match=name.replace(".", r"\.")):
        quantize_file(path, str(tmp_path / "out.gguf"), "Q8_0")
    assert not (tmp_path / "out.gguf").exists()

"""The metadata keys each architecture reads, which are required and what an absent one means,
as llama.cpp applies them (src/llama-model.cpp `load_hparams`, src/models/ARCH.cpp
`load_arch_hparams`, llama-hparams.h defaults) and as its converter writes them
(convert_hf_to_gguf.py / conversion/*.py, gguf-py's constants), in the llama.cpp of the
llama-cpp-python 0.3.36 sdist.

CONVENTIONS is the list; docs/models.md "Metadata keys" prints it (a test checks the two agree).
For every architecture:
- a file is written with the PyPI `gguf` package's writer from a real-shaped file of that
  architecture keeping only the listed keys: edged loads it, and no key the converter wrote is
  left off the list;
- each required key left out is refused, naming the key;
- each optional key left out gives llama.cpp's default.
"""
import math
import os
import re

import numpy as np
import pytest

from edged.engine import arch as arch_mod
from edged.engine import encoder as enc_mod
from edged.errors import UnsupportedModelError
from edged.format.gguf import GGUFFile, Key

from family_goldens import regenerated
from gguf_clone import clone

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.path.join(ROOT, "..", "shared", "testdata", "models")
GOLD = os.path.join(ROOT, "tests", "data", "goldens")

# one file per architecture, written by the PyPI gguf writer with real shapes
FILES = {
    "llama": os.path.join(SHARED, "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "qwen2": os.path.join(GOLD, "synthetic-qwen2-yarn.gguf"),
    "qwen3": os.path.join(SHARED, "synthetic-qwen3-f32.gguf"),
    "qwen3moe": os.path.join(GOLD, "synthetic-qwen3moe.gguf"),
    "qwen2moe": os.path.join(GOLD, "synthetic-qwen2moe.gguf"),
    "phi3": os.path.join(GOLD, "synthetic-phi4mini.gguf"),
    "gemma2": os.path.join(GOLD, "synthetic-gemma2.gguf"),
    "gemma3": os.path.join(SHARED, "synthetic-gemma3-f32.gguf"),
    "granite": os.path.join(GOLD, "synthetic-granite.gguf"),
    "smollm3": os.path.join(GOLD, "synthetic-smollm3.gguf"),
    "gpt-oss": os.path.join(GOLD, "synthetic-gpt-oss.gguf"),
    "lfm2": os.path.join(GOLD, "synthetic-lfm2.gguf"),
    "gemma3n": None,   # written again from tools/make_goldens.py (family_goldens.regenerated)
    "granitehybrid": None,   # the same
    "bert": os.path.join(SHARED, "all-MiniLM-L6-v2.Q8_0.gguf"),
    "nomic-bert": os.path.join(GOLD, "embed-nomic-bert.gguf"),
}
ENCODERS = ("bert", "nomic-bert")
MOE = ("qwen3moe", "qwen2moe", "gpt-oss")
DECODERS = tuple(a for a in FILES if a not in ENCODERS)
DENSE = tuple(a for a in DECODERS if a not in MOE)
ALL = DECODERS + ENCODERS
ATTENTION_ONLY = tuple(a for a in DECODERS if a not in ("lfm2", "granitehybrid"))
GRANITE = ("granite", "granitehybrid")


def _k(md, arch, key):
    return md[f"{arch}.{key}"]


def _head(md, arch):
    return _k(md, arch, "embedding_length") // _k(md, arch, "attention.head_count")


def _key_len(md, arch):
    return md.get(f"{arch}.attention.key_length", _head(md, arch))


# (key after "ARCH.", architectures, when absent, the parsed field, llama.cpp's default given the
# rest of the metadata or None when required). "when absent" is what docs/models.md prints.
CONVENTIONS = [
    ("context_length", ALL, "required", "n_ctx_train", None),
    ("embedding_length", ALL, "required", "n_embd", None),
    ("block_count", ALL, "required", "n_layer", None),
    ("attention.head_count", ALL, "required", "n_head", None),
    ("feed_forward_length", DENSE + ENCODERS,
     "required (llama.cpp: its tensors' shapes then fail)", "n_ff", None),
    ("feed_forward_length", MOE, "expert_feed_forward_length", "n_ff",
     lambda md, a: _k(md, a, "expert_feed_forward_length")),
    ("attention.head_count_kv", ATTENTION_ONLY, "head_count", "n_head_kv",
     lambda md, a: _k(md, a, "attention.head_count")),
    ("attention.head_count_kv", ("lfm2",),
     "required (per layer; 0 marks a convolution layer)", "n_head_kv", None),
    ("shortconv.l_cache", ("lfm2",), "required", "n_shortconv_l_cache", None),
    ("attention.head_count_kv", ("granitehybrid",),
     "required (per layer; 0 marks a Mamba-2 layer)", "n_head_kv", None),
    # Mamba-2 (edged/engine/granitehybrid.py; refusals in tests/engine/test_engine_granitehybrid.py)
    ("ssm.conv_kernel", ("granitehybrid",), "required", None, None),
    ("ssm.inner_size", ("granitehybrid",), "required (must be 2 * embedding_length)", None, None),
    ("ssm.state_size", ("granitehybrid",), "required", None, None),
    ("ssm.time_step_rank", ("granitehybrid",), "required", None, None),
    ("ssm.group_count", ("granitehybrid",), "required", None, None),
    ("attention.key_length", DECODERS, "embedding_length / head_count", "head_dim", _head),
    ("attention.value_length", DECODERS, "embedding_length / head_count", "head_dim_v", _head),
    ("rope.dimension_count", DECODERS, "key_length", "n_rot", _key_len),
    ("attention.layer_norm_rms_epsilon", DECODERS, "required", "rms_eps", None),
    ("attention.layer_norm_epsilon", ENCODERS, "required", "norm_eps", None),
    ("rope.freq_base", DECODERS + ("nomic-bert",), "10000", "rope_freq_base",
     lambda md, a: 10000.0),
    ("rope.scaling.factor", DECODERS, "rope.scale_linear, else no scaling", "rope_freq_scale",
     lambda md, a: 1.0 / md[f"{a}.rope.scale_linear"] if f"{a}.rope.scale_linear" in md else 1.0),
    ("rope.scaling.original_context_length", DECODERS, "context_length", "n_ctx_orig",
     lambda md, a: _k(md, a, "context_length")),
    ("rope.freq_base_swa", ("gemma2", "gpt-oss"), "rope.freq_base", "rope_freq_base_swa",
     lambda md, a: md.get(f"{a}.rope.freq_base", 10000.0)),
    ("rope.freq_base_swa", ("gemma3", "gemma3n"), "10000", "rope_freq_base_swa",
     lambda md, a: 10000.0),
    ("attention.sliding_window", ("gpt-oss", "gemma3n"), "required", "n_swa", None),
    ("attention.sliding_window", ("gemma2",), "4096", "n_swa", lambda md, a: 4096),
    ("attention.sliding_window", ("gemma3",), "0 (no sliding window)", "n_swa", lambda md, a: 0),
    ("attention.sliding_window", ("lfm2",), "0 (no sliding window; else on every attention layer)",
     "n_swa", lambda md, a: 0),
    ("attention.sliding_window_pattern", ("gemma2", "gpt-oss"),
     "2 (or a per-layer bool array)", "swa_layers",
     lambda md, a: tuple(il % 2 < 1 for il in range(_k(md, a, "block_count")))),
    ("attention.sliding_window_pattern", ("gemma3",), "6 (or a per-layer bool array)",
     "swa_layers", lambda md, a: tuple(il % 6 < 5 for il in range(_k(md, a, "block_count")))),
    ("attention.sliding_window_pattern", ("gemma3n",), "5 (or a per-layer bool array)",
     "swa_layers", lambda md, a: tuple(il % 5 < 4 for il in range(_k(md, a, "block_count")))),
    ("attn_logit_softcapping", ("gemma2",), "50", "attn_softcap", lambda md, a: 50.0),
    ("final_logit_softcapping", ("gemma2",), "30", "final_logit_softcap", lambda md, a: 30.0),
    ("final_logit_softcapping", ("gemma3",), "0 (off)", "final_logit_softcap", lambda md, a: 0.0),
    # gemma3n: llama.cpp ignores these keys and runs every file with the values below; another
    # value in the file is refused (tests/engine/test_engine_gemma3n.py)
    ("final_logit_softcapping", ("gemma3n",), "30 (llama.cpp ignores the key; another value: "
     "refused)", "final_logit_softcap", lambda md, a: 30.0),
    ("altup.num_inputs", ("gemma3n",), "4 (as above)", None, None),
    ("altup.active_idx", ("gemma3n",), "0 (as above)", None, None),
    ("embedding_length_per_layer_input", ("gemma3n",), "256 (as above)", None, None),
    ("attention.shared_kv_layers", ("gemma3n",), "block_count - 20, at least 0 (as above)",
     None, None),
    ("activation_sparsity_scale", ("gemma3n",),
     "1.6448533 on the first 10 layers, none after (as above)", None, None),
    ("expert_count", MOE, "required", "n_expert", None),
    ("expert_used_count", MOE, "required", "n_expert_used", None),
    ("expert_feed_forward_length", MOE,
     "required (llama.cpp: its tensors' shapes then fail)", "n_ff_exp", None),
    ("expert_shared_feed_forward_length", ("qwen2moe",), "feed_forward_length", "n_ff_shexp",
     lambda md, a: _k(md, a, "feed_forward_length")),
    # granitehybrid's experts are optional (tests/engine/test_engine_granitehybrid.py, MoE)
    ("expert_count", ("granitehybrid",), "0 (dense FFN)", "n_expert", lambda md, a: 0),
    ("expert_used_count", ("granitehybrid",), "0 (required when expert_count > 0)",
     "n_expert_used", lambda md, a: 0),
    ("expert_shared_feed_forward_length", ("granitehybrid",), "0 (no shared expert)",
     "n_ff_shexp", lambda md, a: 0),
    ("logit_scale", GRANITE, "required", "logit_mul", None),
    ("residual_scale", GRANITE, "1", "residual_scale", lambda md, a: 1.0),
    ("embedding_scale", GRANITE, "1", "embd_scale", lambda md, a: 1.0),
    ("attention.scale", GRANITE, "1 / sqrt(key_length)", "attn_scale",
     lambda md, a: 1.0 / math.sqrt(_key_len(md, a))),
    ("rope.scaling.finetuned", GRANITE, "true (false: no RoPE in any layer)", "rope_layers",
     lambda md, a: (True,) * _k(md, a, "block_count")),
    ("nextn_predict_layers", DECODERS, "0 (more: refused)", None, None),
    ("attention.causal", ENCODERS, "true, which is refused (converters write false)", None, None),
    ("attention.causal", ("lfm2",), "true (false, a bidirectional embedding model: refused)",
     None, None),
    ("pooling_type", ENCODERS, "0 (none)", "pooling", lambda md, a: "none"),
]
# Keys the converter writes that edged reads as llama.cpp does only where they matter here
# (listed so that a file's every key is accounted for).
IGNORED = [
    ("vocab_size", DECODERS, "the tokenizer's token count (checked against it when present)"),
    ("rope.scaling.type", DECODERS, "linear (yarn, longrope for phi3, none also read)"),
    ("rope.scaling.attn_factor", DECODERS, "1"),
]


def _load(path):
    f = GGUFFile.open(path)
    return f.metadata, f.tensors


def _parse(md, tensors, a):
    if a in ENCODERS:
        return enc_mod.validate(md, tensors).hp
    return arch_mod.validate(md, tensors).hp


def _rows(a):
    return [r for r in CONVENTIONS if a in r[1]]


@pytest.fixture(scope="module", params=sorted(FILES))
def arch_file(request, tmp_path_factory):
    a = request.param
    if FILES[a] is None:
        FILES[a] = regenerated(a, tmp_path_factory.mktemp(a))
    if not os.path.exists(FILES[a]):
        pytest.skip(f"{FILES[a]} not present")
    md, tensors = _load(FILES[a])
    assert md["general.architecture"] == a
    return a, md, tensors


def test_every_key_the_file_has_is_on_the_list(arch_file):
    a, md, _ = arch_file
    listed = {r[0] for r in _rows(a)} | {k for k, archs, _ in IGNORED if a in archs}
    listed.add("rope.scale_linear")
    present = {k[len(a) + 1:] for k in md if k.startswith(a + ".")}
    assert present <= listed, f"{a}: keys the converter wrote that the list misses: " \
        f"{sorted(present - listed)}"


def test_a_file_written_from_the_list_loads(arch_file, tmp_path):
    """The PyPI writer copies the file keeping only the listed keys (and the general/tokenizer
    ones); edged loads it and reads the same hyperparameters."""
    a, md, tensors = arch_file
    listed = {r[0] for r in _rows(a)} | {k for k, archs, _ in IGNORED if a in archs}
    drop = [k for k in md if k.startswith(a + ".") and k[len(a) + 1:] not in listed]
    out = clone(FILES[a], tmp_path / "copy.gguf", drop_meta=drop)
    md2, tensors2 = _load(out)
    assert _parse(md2, tensors2, a) == _parse(md, tensors, a)


def test_required_keys_are_refused_by_name(arch_file):
    a, md, tensors = arch_file
    required = [r[0] for r in _rows(a) if r[4] is None and r[3] is not None]
    assert required
    for key in required:
        name = f"{a}.{key}"
        if name not in md:
            continue
        md2 = {k: v for k, v in md.items() if k != name}
        with pytest.raises(UnsupportedModelError, match=re.escape(name)):
            _parse(md2, tensors, a)


def test_absent_optional_keys_take_llama_cpp_defaults(arch_file):
    a, md, tensors = arch_file
    for key, _, _, fld, default in _rows(a):
        if default is None:
            continue
        md2 = {k: v for k, v in md.items() if k != f"{a}.{key}"}
        try:
            hp = _parse(md2, tensors, a)
        except UnsupportedModelError as e:
            # a default that contradicts the tensors' shapes (or a sibling key) is refused,
            # as llama.cpp refuses it
            assert any(w in str(e) for w in ("shape", "tensor", key.rsplit(".", 1)[-1])), (key, e)
            continue
        got, want = getattr(hp, fld), default(md2, a)
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-6), (a, key, got, want)
        else:
            assert got == want, (a, key, got, want)


def test_sliding_window_pattern_as_a_bool_array(tmp_path):
    md, tensors = _load(FILES["gemma3"])
    n = md["gemma3.block_count"]
    layers = [il % 3 == 0 for il in range(n)]
    md2 = dict(md, **{"gemma3.attention.sliding_window_pattern": np.array(layers)})
    assert arch_mod.validate(md2, tensors).hp.swa_layers == tuple(layers)
    md3 = dict(md, **{"gemma3.attention.sliding_window_pattern": np.array(layers[:-1])})
    with pytest.raises(UnsupportedModelError, match="sliding_window_pattern"):
        arch_mod.validate(md3, tensors)


def test_granite_rope_finetuned_false_turns_rope_off():
    md, tensors = _load(FILES["granite"])
    md2 = dict(md, **{"granite.rope.scaling.finetuned": False})
    assert arch_mod.validate(md2, tensors).hp.rope_layers == (False,) * md["granite.block_count"]


def test_multi_token_prediction_layers_are_refused():
    md, tensors = _load(FILES["qwen3moe"])
    md2 = dict(md, **{"qwen3moe.nextn_predict_layers": 1})
    with pytest.raises(UnsupportedModelError, match="qwen3moe.nextn_predict_layers"):
        arch_mod.validate(md2, tensors)


@pytest.mark.parametrize("value, msg", [
    (np.array([0, 0, 2, 0, 0]), "has 5 entries for 6 layers"),
    (np.array([0, 0, 2, 0, 0, 1]), "differs between attention layers"),
    (np.array([0, 0, 8, 0, 0, 8]), "must be at most 4"),
    (2, "must be an array of integers"),
])
def test_lfm2_bad_head_count_kv_is_refused_by_name(value, msg):
    md, tensors = _load(FILES["lfm2"])
    md2 = dict(md, **{"lfm2.attention.head_count_kv": value})
    with pytest.raises(UnsupportedModelError, match="lfm2.attention.head_count_kv.*" + msg):
        arch_mod.validate(md2, tensors)


@pytest.mark.parametrize("value, msg", [(1, "must be at least 2"), (4, "shortconv.conv.weight"),
                                        ("3", "must be an integer")])
def test_lfm2_bad_l_cache_is_refused_by_name(value, msg):
    md, tensors = _load(FILES["lfm2"])
    md2 = dict(md, **{"lfm2.shortconv.l_cache": value})
    with pytest.raises(UnsupportedModelError, match=msg):
        arch_mod.validate(md2, tensors)


def test_lfm2_conv_and_attention_layers_from_head_count_kv():
    md, tensors = _load(FILES["lfm2"])
    hp = arch_mod.validate(md, tensors).hp
    assert hp.conv_layers == (True, True, False, True, True, False)
    assert (hp.n_conv_layers, hp.n_head_kv, hp.n_shortconv_l_cache) == (4, 2, 3)
    md2 = dict(md, **{"lfm2.attention.causal": False})
    with pytest.raises(UnsupportedModelError, match="lfm2.attention.causal"):
        arch_mod.validate(md2, tensors)


def test_encoder_without_causal_key_is_refused():
    md, tensors = _load(FILES["bert"])
    md2 = {k: v for k, v in md.items() if k != "bert.attention.causal"}
    with pytest.raises(UnsupportedModelError, match="bert.attention.causal"):
        enc_mod.validate(md2, tensors)


def docs_table():
    """The markdown table docs/models.md prints from CONVENTIONS and IGNORED."""
    def who(archs):
        if set(archs) == set(ALL):
            return "all"
        if set(archs) == set(DECODERS):
            return "every decoder"
        if set(archs) == set(ATTENTION_ONLY):
            return "every decoder but `lfm2`, `granitehybrid`"
        if set(archs) == set(DENSE + ENCODERS):
            return "every dense decoder, the encoders"
        if set(archs) == set(DECODERS + ("nomic-bert",)):
            return "every decoder, `nomic-bert`"
        return ", ".join(f"`{x}`" for x in archs)
    lines = ["| key (`ARCH.` + ) | read by | when absent |", "|---|---|---|"]
    lines += [f"| `{k}` | {who(archs)} | {absent} |" for k, archs, absent, _, _ in CONVENTIONS]
    lines += [f"| `{k}` | {who(archs)} | {absent} |" for k, archs, absent in IGNORED]
    return "\n".join(lines)


def test_docs_print_the_list():
    text = open(os.path.join(ROOT, "docs", "models.md"), encoding="utf-8").read()
    assert docs_table() in text, "docs/models.md 'Metadata keys' is out of date; it should " \
        "contain:\n" + docs_table()

"""Gemma 3n (`gemma3n`) against llama.cpp, and its metadata as llama.cpp reads it.

tests/data/goldens/synthetic-gemma3n.golden.npz holds llama.cpp's teacher-forced logits for a
scaled-down Gemma 3n (tools/make_goldens.py gemma3n: n_embd 64, 22 layers so that the first 10
cut their FFN gate (activation sparsity) and layers 20 and 21 attend to layers 18's and 19's
K/V, AltUp's 4 streams, LAuReL, per-layer inputs 256 wide): a 40-token prompt, then its greedy
continuation of 24. The model (13 MB in F16) is written again here and checked by its SHA-256.
"""
import dataclasses

import numpy as np
import pytest

from edged import Model
from edged.engine import arch, gemma3n
from edged.errors import MetadataValueError, UnsupportedModelError
from edged.format.gguf import Key
from edged.text.sampling import SamplingParams

from family_goldens import GOLDENS, check, regenerated_fixtures, validate_changed

GOLDEN = np.load(f"{GOLDENS}/synthetic-gemma3n.golden.npz")
TOKENS, N_PROMPT = GOLDEN["tokens"].tolist(), int(GOLDEN["n_prompt"])


model_path, file_tables = regenerated_fixtures("gemma3n")


def test_golden_reference(model_path):
    """Teacher-forced logits within the F16 tolerances of ../shared/testdata/README.md."""
    check("synthetic-gemma3n", "reference", path=model_path)


def test_greedy_16_tokens_as_llama_cpp(model_path):
    with Model.load(model_path, backend="reference") as m:
        s = m.session(n_ctx=128)
        out = [o.token for o in s.generate(TOKENS[:N_PROMPT], SamplingParams(temperature=0.0),
                                           max_tokens=16) if o.token is not None]
    assert out == TOKENS[N_PROMPT:N_PROMPT + 16]


def test_layers_from_20_share_kv_and_the_first_10_are_sparse(file_tables):
    """What the file runs as in llama.cpp: layer 20 (sliding) reads layer 18's cache, 21
    (global) layer 19's; the Gaussian top-k on layers 0-9 only; q.k unscaled; logits capped
    at 30."""
    md, tensors = file_tables
    spec = arch.validate(md, tensors)
    hp, prm = spec.hp, spec.gemma3n.params
    assert hp.kv_layers == tuple(range(20)) + (18, 19)
    assert hp.swa_layers[18] and not hp.swa_layers[19] and hp.swa_layers[20] and not hp.swa_layers[21]
    assert prm.sparsity == (gemma3n.SPARSITY_STD_MUL,) * 10 + (0.0,) * 12
    assert (hp.attn_scale, hp.final_logit_softcap, hp.n_swa) == (1.0, 30.0, 8)
    # a token reads one row of each embedding table (the output matrix is its own here)
    rows = sum(t.nbytes - t.nbytes // hp.n_vocab for n, t in tensors.items()
               if n in ("token_embd.weight", "per_layer_token_embd.weight"))
    assert spec.active_weight_bytes() == sum(t.nbytes for t in spec.tensors.values()) - rows


@pytest.mark.parametrize("key,value", [
    (Key.ALTUP_NUM_INPUTS, 3), (Key.ALTUP_ACTIVE_IDX, 1), (Key.EMBD_LENGTH_PER_LAYER_INP, 128),
    (Key.SHARED_KV_LAYERS, 4), (Key.FINAL_LOGIT_SOFTCAPPING, 20.0),
    (Key.ACTIVATION_SPARSITY_SCALE, np.array([1.6448533535003662] * 12 + [-np.inf] * 10)),
])
def test_a_value_llama_cpp_would_not_honour_is_refused_naming_the_key(file_tables, key, value):
    """llama.cpp runs every gemma3n file with fixed AltUp, per-layer and sparsity settings and
    ignores these keys: a file that says otherwise is refused rather than run unlike itself."""
    name = Key.arch(key, "gemma3n")
    with pytest.raises(UnsupportedModelError, match=name.replace(".", r"\.")):
        validate_changed(*file_tables, set_={name: value})


@pytest.mark.parametrize("value", [np.array([1.0, 2.0]), ["a"] * 22, 1.6448533535003662])
def test_malformed_sparsity_array_is_refused(file_tables, value):
    name = Key.arch(Key.ACTIVATION_SPARSITY_SCALE, "gemma3n")
    with pytest.raises(MetadataValueError, match=name.replace(".", r"\.")):
        validate_changed(*file_tables, set_={name: value})


def test_absent_optional_keys_take_llama_cpps_values(file_tables):
    md, tensors = file_tables
    keys = [Key.arch(k, "gemma3n") for k in (
        Key.ALTUP_NUM_INPUTS, Key.ALTUP_ACTIVE_IDX, Key.EMBD_LENGTH_PER_LAYER_INP,
        Key.SHARED_KV_LAYERS, Key.ACTIVATION_SPARSITY_SCALE, Key.FINAL_LOGIT_SOFTCAPPING)]
    base, bare = arch.validate(md, tensors), validate_changed(md, tensors, drop=keys)
    assert bare.gemma3n == base.gemma3n and bare.hp == base.hp


def test_integer_window_pattern_defaults_to_5(file_tables):
    """Without the per-layer array llama.cpp's period is 5: every fifth layer global."""
    name = Key.arch(Key.SLIDING_WINDOW_PATTERN, "gemma3n")
    spec = validate_changed(*file_tables, drop=[name])
    assert spec.hp.swa_layers == tuple(il % 5 < 4 for il in range(22))
    assert spec.hp.kv_layers[20:] == (18, 18)


@pytest.mark.parametrize("drop_key", [Key.SLIDING_WINDOW, Key.LAYERNORM_RMS_EPS])
def test_required_key_missing_is_refused(file_tables, drop_key):
    name = Key.arch(drop_key, "gemma3n")
    with pytest.raises(UnsupportedModelError, match=name.replace(".", r"\.")):
        validate_changed(*file_tables, drop=[name])


@pytest.mark.parametrize("tensor", ["per_layer_token_embd.weight", "altup_proj.weight",
                                    "blk.21.laurel_r.weight", "blk.3.altup_router.weight",
                                    "blk.21.attn_k.weight"])
def test_missing_tensor_is_refused_naming_it(file_tables, tensor):
    with pytest.raises(UnsupportedModelError, match=tensor.replace(".", r"\.")):
        validate_changed(*file_tables, drop_tensor=tensor)


def test_wrong_shape_is_refused(file_tables):
    md, tensors = file_tables
    t = tensors["blk.0.laurel_l.weight"]
    tensors = dict(tensors, **{t.name: dataclasses.replace(t, shape=(64, 32))})
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.laurel_l\.weight"):
        arch.validate(md, tensors)


def test_compiled_backend_refuses_clearly(model_path):
    pytest.importorskip("edged._core")
    with pytest.raises(UnsupportedModelError, match="gemma3n"):
        Model.load(model_path, backend="cpu")


def test_info_names_shared_kv_layers_and_the_backend(model_path, capsys):
    from edged.cli import main
    main(["info", "-m", model_path, "-c", "512"])
    out = capsys.readouterr().out
    assert "layers [20, 21] attend to layers [18, 19]'s K/V" in out
    assert "runs on the reference backend only" in out


def test_batch_chunks_and_single_tokens_agree(model_path):
    """The prompt in one batch, in chunks of 7 and token by token: the same bits (layers 20
    and 21 read rows of layers 18 and 19 that earlier chunks wrote)."""
    p = TOKENS[:N_PROMPT]
    with Model.load(model_path, backend="reference") as m:
        whole = m.session(n_ctx=128).eval(p)[0]
        chunks = m.session(n_ctx=128, n_batch=7).eval(p)[0]
        s = m.session(n_ctx=128)
        for t in p:
            one = s.eval([t])[0]
    assert np.array_equal(whole, chunks) and np.array_equal(whole, one)

"""Gemma 3n (`gemma3n`) against llama.cpp, and its metadata as llama.cpp reads it.

tests/data/goldens/synthetic-gemma3n.golden.npz holds llama.cpp's teacher-forced logits for a
scaled-down Gemma 3n (tools/make_goldens.py gemma3n: n_embd 64, 22 layers so that the first 10
cut their FFN gate (activation sparsity) and layers 20 and 21 attend to layers 18's and 19's
K/V, AltUp's 4 streams, LAuReL, per-layer inputs 256 wide): a 40-token prompt, then its greedy
continuation of 24. The model (13 MB in F16) is written again here and checked by its SHA-256.
The compiled pass (cython_kernels/forward/gemma3n.h) is held to the golden on every kernel
path; the NumPy reference (edged/engine/reference_gemma3n.py) is its slow twin.
"""
import dataclasses

import numpy as np
import pytest

from edged import Model
from edged.engine import arch, gemma3n
from edged.errors import MetadataValueError, UnsupportedModelError
from edged.format.gguf import Key

from family_goldens import (GOLDENS, alone_batched_forked, assert_batch_chunks_single_agree,
                            check, check_every_kernel_path, greedy, regenerated_fixtures,
                            saved_and_recomputed, validate_changed)

GOLDEN = np.load(f"{GOLDENS}/synthetic-gemma3n.golden.npz")
TOKENS, N_PROMPT = GOLDEN["tokens"].tolist(), int(GOLDEN["n_prompt"])


model_path, file_tables = regenerated_fixtures("gemma3n")


def test_golden_reference(model_path):
    """Teacher-forced logits within the F16 tolerances of ../shared/testdata/README.md."""
    check("synthetic-gemma3n", "reference", path=model_path)


@pytest.fixture
def core():
    return pytest.importorskip("edged._core")


def test_golden_every_kernel_path(core, model_path):
    """The compiled pass: teacher-forced logits within the F16 tolerances on generic, avx2
    and avx512 (every path this CPU has)."""
    check_every_kernel_path(core, "synthetic-gemma3n", path=model_path)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_greedy_16_tokens_as_llama_cpp(model_path, backend):
    if backend == "cpu":
        pytest.importorskip("edged._core")
    assert greedy(model_path, backend, TOKENS[:N_PROMPT], 16) == TOKENS[N_PROMPT:N_PROMPT + 16]


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


def test_info_names_shared_kv_layers(core, model_path, capsys):
    from edged.cli import main
    main(["info", "-m", model_path, "-c", "512"])
    out = capsys.readouterr().out
    assert "layers [20, 21] attend to layers [18, 19]'s K/V (the KV cache holds none" in out
    # 512 positions x 20 layers x (K + V) x 2 heads x 16 values x 2 bytes (F16): 1.25 MiB
    assert "KV cache (f16/f16) 1.2 MiB" in out


def test_memory_plan_holds_no_rows_for_the_shared_kv_layers(core, model_path):
    """The K/V cache of the memory plan (`edged info`) and of the arena: rows for layers 0-19
    only."""
    with Model.load(model_path, n_threads=2) as m:
        hp = m.hp
        s = m.session(n_ctx=64)
        assert len(s._buf.state.kv_layers()) == 20
        kv = 64 * 20 * 2 * hp.n_head_kv * hp.head_dim * 2
        assert m.backend.plan(64, 8).kv_cache == kv
        assert type(m.backend).plan_for(m.spec, 64, 8).kv_cache == kv


def test_compiled_matches_the_reference_on_hidden_rows(core, model_path):
    """Every row's final hidden state (the AltUp streams projected back and averaged) of the
    compiled pass against the NumPy reference."""
    p = TOKENS[:20]
    got = {}
    for backend in ("cpu", "reference"):
        with Model.load(model_path, backend=backend, n_threads=2) as m:
            got[backend] = m.embed([p], pooling="none", normalize=False, add_special=False)[0]
    assert np.abs(got["cpu"] - got["reference"]).max() < 2e-2


def test_prompt_cache_file_round_trip_gives_the_same_bits(core, model_path, tmp_path):
    """Session.save holds the K/V rows of layers 0-19 (none for 20 and 21); a new model's
    Session.load gives the next logits of recomputation bit for bit."""
    from edged.engine import statefile
    from edged.engine.model import Session
    key, path, nxt = b"k" * 32, tmp_path / "g.edkv", TOKENS[N_PROMPT:N_PROMPT + 3]
    prompt = TOKENS[:N_PROMPT]
    with Model.load(model_path, n_threads=2) as m:
        size, want = saved_and_recomputed(m, prompt, nxt, path, key)
        rows = 20 * 2 * m.hp.n_head_kv * m.hp.head_dim * 2     # f16 K and V rows of 20 layers
    assert size == (statefile.HEADER.size + 4 * N_PROMPT + N_PROMPT * rows + statefile.MAC_BYTES)
    with Model.load(model_path, n_threads=2) as m:
        with Session.load(m, path, key) as s2:
            assert s2.tokens == prompt
            assert np.array_equal(s2.eval(nxt, logits="all"), want)


@pytest.mark.parametrize("backend,threads", [("reference", 1), ("cpu", 1), ("cpu", 2)])
def test_batch_chunks_and_single_tokens_agree(model_path, backend, threads):
    """The prompt in one batch, in chunks of 7 and token by token: the same bits (layers 20
    and 21 read rows of layers 18 and 19 that earlier chunks wrote), on 1 and 2 threads."""
    if backend == "cpu":
        pytest.importorskip("edged._core")
    with Model.load(model_path, backend=backend, n_threads=threads) as m:
        assert_batch_chunks_single_agree(m, TOKENS[:N_PROMPT])


def test_fork_and_decode_batch_of_sessions(core, model_path):
    """A fork copies the K/V rows of layers 0-19; a decode batch of several sessions runs each
    row's streams and per-layer inputs of its own token against its own cache."""
    prompts = [TOKENS[:12], TOKENS[5:9], [1, 300, 301, 302, 303, 304, 305]]
    with Model.load(model_path, n_threads=2) as m:
        alone, batched, forked, _ = alone_batched_forked(m, prompts)
    assert np.abs(np.array(alone) - batched).max() < 1e-4
    assert np.array_equal(forked, alone[0])


def test_synth_shape_writes_gemma3n_as_the_converter_does(core, tmp_path, monkeypatch):
    """`edged synth --shape gemma-3n-e2b`'s layout at a small size: the AltUp and sparsity
    keys, K/V tensors in every layer, AltUp / LAuReL / per_layer_model_proj left unquantized
    (llama-quantize's rule) with the router and coefficients in F32; read back by the PyPI gguf
    reader. The compiled pass runs it (its per-layer inputs, 256 wide, are wider than n_ff 96:
    the arena's quantized rows and panels are sized for them) with the same bits in one batch,
    in chunks and token by token, and near the NumPy reference (float64 activations): the Q8
    activations move logits of max 0.8 by 0.003 (0.07 when every norm weight was 1, a net
    whose rounding differences grow through the layers: the full-size file then matched
    llama.cpp at F16 only). (The full-size file loads in llama.cpp 0.3.36, whose logits edged's
    match.)"""
    gguf_py = pytest.importorskip("gguf")
    from edged.format import synth
    small = dict(synth.SHAPES["gemma-3n-e2b"], n_embd=64, n_head=4, head_dim=32, n_ff=96,
                 n_layer=22, n_vocab=512, n_swa=4, n_kv_shared=2)
    monkeypatch.setitem(synth.SHAPES, "test-gemma3n", small)
    path = str(tmp_path / "gemma3n.gguf")
    synth.synth("test-gemma3n", "Q4_K_M", path)
    r = gguf_py.GGUFReader(path)
    assert list(r.fields["gemma3n.activation_sparsity_scale"].contents()) == pytest.approx(
        [gemma3n.SPARSITY_STD_MUL] * 10 + [-np.inf] * 12)
    names = {t.name: t.tensor_type.name for t in r.tensors}
    assert "blk.21.attn_k.weight" in names and "output.weight" not in names
    assert names["blk.3.laurel_l.weight"] == names["altup_proj.weight"] == "F16"
    assert names["per_layer_model_proj.weight"] == "F16"
    assert names["blk.3.altup_router.weight"] == names["blk.3.altup_predict_coef.weight"] == "F32"
    ids = [1] + list(range(40, 60))
    got = {}
    for backend in ("cpu", "reference"):
        with Model.load(path, backend=backend, n_threads=2) as m:
            assert m.hp.kv_layers[20:] == (18, 18)
            got[backend] = np.asarray(m.session(n_ctx=32).eval(ids, logits="all"))
    want = got["reference"]
    assert np.abs(got["cpu"] - want).max() < 0.02 * np.abs(want).max()
    assert (got["cpu"].argmax(1) == want.argmax(1)).mean() > 0.9
    with Model.load(path, n_threads=2) as m:
        assert_batch_chunks_single_agree(m, ids, n_ctx=32)


def test_per_layer_token_embd_gets_the_output_type_when_tied(tmp_path, monkeypatch):
    """llama-quantize treats per_layer_token_embd as a token embedding: with tied embeddings it
    gets the output type (Q6_K in Q4_K_M; llama-quantize 0.3.36 on the E2B-shaped F16 file gives
    the same types as this for every tensor). `edged quantize` and `edged synth` do the same."""
    from edged.format import synth
    from edged.format.gguf import GGMLType, GGUFFile
    from edged.format.quantize import choose_types, parse_mix
    small = dict(synth.SHAPES["gemma-3n-e2b"], n_embd=256, n_head=4, head_dim=64, n_ff=512,
                 n_layer=22, n_vocab=512, n_swa=4, n_kv_shared=2)
    monkeypatch.setitem(synth.SHAPES, "test-gemma3n", small)
    types = {}
    for ftype in ("F16", "Q4_K_M"):
        synth.synth("test-gemma3n", ftype, str(tmp_path / f"{ftype}.gguf"))
        with GGUFFile.open(str(tmp_path / f"{ftype}.gguf")) as f:
            types[ftype] = ({n: t.type for n, t in f.tensors.items()} if ftype != "F16"
                            else choose_types(f, parse_mix("Q4_K_M")))
    assert types["F16"] == types["Q4_K_M"]
    assert types["F16"]["per_layer_token_embd.weight"] == GGMLType.Q6_K
    assert types["F16"]["blk.0.ffn_gate.weight"] == GGMLType.Q4_K

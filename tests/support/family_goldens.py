"""llama.cpp's recorded logits for the small files in tests/data/goldens
(tools/make_goldens.py), beside edged's: teacher forcing and the tolerances of
../shared/testdata/README.md (test_engine_families and the per-family test modules use it)."""
import hashlib
import importlib.util
import os

import numpy as np

from conftest import ROOT
from edged import Model
from edged.format.gguf import GGMLType, GGUFFile

GOLDENS = os.path.join(ROOT, "tests", "data", "goldens")
MAX_ABS, MEAN_ABS = 0.05, 0.01   # testdata/README.md, F32/F16 weights
Q_MAX_ABS, Q_MEAN_ABS = 0.35, 0.06   # testdata/README.md, any quantized type
# The NumPy reference against a quantized-KV golden: its float activations differ from
# llama.cpp's by ~1e-3, and a K/V value near a rounding boundary then lands one q8_0/q4_0 step
# away (1/127 or 1/8 of the block's largest value); measured max 0.13 (q8_0), 0.34 (q4_0), 0.56
# (q4_0, head_dim 64: rotated rows, 64 values per head), mean <= 0.036 (without the rotation
# llama.cpp applies: max 3.5, mean 0.51). The compiled path stores llama.cpp's values and meets
# MAX_ABS/MEAN_ABS.
KVQ_REF_MAX_ABS, KVQ_REF_MEAN_ABS = 0.65, 0.045
# The NumPy reference against the qwen35 golden: llama.cpp's F16 matrix products round their
# input rows to F16 and the reference does not; through the DeltaNet's L2 norms and exp gates
# one logit of 64 rows lands 0.064 away (max 0.005 with the rows rounded as llama.cpp does,
# mean 0.0011 either way). The compiled path rounds them and meets MAX_ABS/MEAN_ABS.
DELTANET_REF_MAX_ABS = 0.08


def regenerated(name, directory):
    """The model of a golden too large to commit (make_goldens.REGENERATED), written again by
    tools/make_goldens.py into directory; its SHA-256 must be the one llama.cpp ran."""
    spec = importlib.util.spec_from_file_location("make_goldens",
                                                  os.path.join(ROOT, "tools", "make_goldens.py"))
    mg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mg)
    case = dict(mg.CASES[name])
    seed = case.pop("seed")
    for k in ("prompt_seed", "n_prompt", "cache"):
        case.pop(k, None)
    path = os.path.join(str(directory), f"synthetic-{name}.gguf")
    mg.write_gguf(name, case, path, seed=seed)
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    want = str(np.load(os.path.join(GOLDENS, f"synthetic-{name}.golden.npz"))["gguf_sha256"])
    assert sha == want, f"synthetic-{name}.gguf written again differs from the one llama.cpp ran"
    return path


def teacher_forced(path, backend, batch=True, golden=None):
    """Logits for the golden's tokens: the prompt as one batch, then one token at a time."""
    z = np.load(golden or path[:-len(".gguf")] + ".golden.npz")
    toks, n_prompt, ref = z["tokens"].tolist(), int(z["n_prompt"]), z["logits"]
    # the KV cache types llama.cpp ran with (the kv-* goldens), else F16
    cache = {k: str(z[k]) for k in ("cache_type_k", "cache_type_v") if k in z.files}
    with Model.load(path, backend=backend, n_threads=2, **cache) as m:
        s = m.session(n_ctx=512)
        if batch:
            rows = [s.eval(toks[:n_prompt], logits="all")]
        else:
            rows = [s.eval([t]) for t in toks[:n_prompt]]
        rows += [s.eval([t]) for t in toks[n_prompt:]]
        return np.concatenate(rows), ref, m


def tolerances(path):
    with GGUFFile.open(path) as f:
        quantized = any(ti.type not in (GGMLType.F32, GGMLType.F16) for ti in f.tensors.values())
    return (Q_MAX_ABS, Q_MEAN_ABS) if quantized else (MAX_ABS, MEAN_ABS)


def check(name, backend, path=None):
    """path: the model when it is not in GOLDENS (regenerated())."""
    golden = os.path.join(GOLDENS, name + ".golden.npz")
    path = path or os.path.join(GOLDENS, name + ".gguf")
    got, ref, _ = teacher_forced(path, backend, golden=golden)
    assert got.shape == ref.shape
    max_abs, mean_abs = tolerances(path)
    d = np.abs(got - ref)
    top = np.sort(ref, 1)
    decided = top[:, -1] - top[:, -2] > 0.6
    misses = int((decided & (got.argmax(1) != ref.argmax(1))).sum())
    if backend == "reference" and name.startswith("synthetic-kv-"):
        max_abs, mean_abs = KVQ_REF_MAX_ABS, KVQ_REF_MEAN_ABS
    if backend == "reference" and name == "synthetic-qwen35":
        max_abs = DELTANET_REF_MAX_ABS
    assert d.max() <= max_abs and d.mean() <= mean_abs and misses == 0, \
        f"{name}/{backend}: max {d.max():.4f} mean {d.mean():.5f} top-1 misses {misses}"


def check_every_kernel_path(core, name, path=None):
    """check(name, "cpu") on generic, avx2 and avx512 (every path this CPU has); path: the
    model when it is not in GOLDENS (regenerated())."""
    before = core.kernel_path()
    try:
        for kernels in core.available_paths():
            core.set_path(kernels)
            check(name, "cpu", path=path)
    finally:
        core.set_path(before)


def greedy(path, backend, prompt, n, speculative=None, stats=None):
    """The n greedy tokens after prompt (n_ctx 128)."""
    from edged.text.sampling import SamplingParams
    with Model.load(path, backend=backend, n_threads=2) as m:
        return [o.token for o in m.session(n_ctx=128).generate(
            prompt, SamplingParams(temperature=0.0), max_tokens=n, speculative=speculative,
            stats=stats) if o.token is not None]


def assert_batch_chunks_single_agree(m, prompt, n_ctx=128, chunk=7):
    """The last logits of `prompt` in one batch, in chunks of `chunk` and one token at a time
    are the same bits."""
    whole = m.session(n_ctx=n_ctx).eval(prompt)[0]
    chunks = m.session(n_ctx=n_ctx, n_batch=chunk).eval(prompt)[0]
    s = m.session(n_ctx=n_ctx)
    for t in prompt:
        one = s.eval([t])[0]
    assert np.array_equal(whole, chunks) and np.array_equal(whole, one)


def alone_batched_forked(m, prompts):
    """Each prompt's last-token logits (n_ctx 64): (evaluated alone, as one decode batch of all
    the sessions, in a fork of the first session taken before its last token while the
    original moves on, and the sessions of the decode batch and their list)."""
    alone = []
    for p in prompts:
        s = m.session(n_ctx=64)
        s.eval(p[:-1])
        alone.append(s.eval(p[-1:])[0])
    ss = [m.session(n_ctx=64) for _ in prompts]
    for s, p in zip(ss, prompts):
        s.eval(p[:-1])
    batched = m.decode_batch(ss, [p[-1] for p in prompts])
    base = m.session(n_ctx=64)
    base.eval(prompts[0][:-1])
    fork = base.fork()
    base.eval([5, 6, 7])  # the original moves on; the fork keeps its own state
    return alone, batched, fork.eval(prompts[0][-1:])[0], ss


def regenerated_fixtures(name, names=("model_path", "file_tables")):
    """(model_path, file_tables): module fixtures of a golden whose model its test writes
    again (regenerated): the file's path, and its (metadata, tensors) tables; `names`: the
    fixtures' names (two models in one module)."""
    import pytest

    @pytest.fixture(scope="module", name=names[0])
    def model_path(tmp_path_factory):
        return regenerated(name, tmp_path_factory.mktemp(name))

    @pytest.fixture(scope="module", name=names[1])
    def file_tables(request):
        with GGUFFile.open(request.getfixturevalue(names[0])) as f:
            return dict(f.metadata), dict(f.tensors)
    return model_path, file_tables


def validate_changed(md, tensors, set_=None, drop=(), drop_tensor=None):
    """arch.validate of a file's tables with keys set or dropped, or a tensor dropped."""
    from edged.engine import arch
    md = {k: v for k, v in md.items() if k not in drop}
    md.update(set_ or {})
    tensors = {k: v for k, v in tensors.items() if k != drop_tensor}
    return arch.validate(md, tensors)


def saved_and_recomputed(m, prompt, nxt, path, key, n_ctx=64):
    """(bytes Session.save wrote to path after `prompt`, the logits of every token of `nxt`
    after `prompt` recomputed in a fresh session): what Session.load of path must give."""
    s = m.session(n_ctx=n_ctx)
    s.eval(prompt)
    size = s.save(path, key)
    fresh = m.session(n_ctx=n_ctx)
    fresh.eval(prompt)
    return size, np.asarray(fresh.eval(nxt, logits="all"))


def synth_small(tmp_path, monkeypatch, shape, ftype, **sizes):
    """`edged synth --shape SHAPE`'s layout at the given sizes: (path, the PyPI gguf reader's
    view of it, or None when only the path is wanted: reader=False)."""
    from edged.format import synth
    reader = sizes.pop("reader", True)
    monkeypatch.setitem(synth.SHAPES, "test-small", dict(synth.SHAPES[shape], **sizes))
    path = str(tmp_path / "small.gguf")
    synth.synth("test-small", ftype, path)
    if not reader:
        return path, None
    import gguf
    return path, gguf.GGUFReader(path)


def mapped_and_repacked(path, monkeypatch, n_vocab=512):
    """A 20-token prompt's and one more token's logits read from the mapping (EDGED_REPACK=off)
    and as loaded by default; with the names the default load repacked and its kernel path."""
    def logits(m):
        s = m.session(n_ctx=64)
        prompt = np.asarray(s.eval([(5 * i + 1) % n_vocab for i in range(20)], logits="all"))
        return np.concatenate([prompt.reshape(-1), np.asarray(s.eval([7])).reshape(-1)])
    monkeypatch.setenv("EDGED_REPACK", "off")
    with Model.load(path, n_threads=2) as m:
        want = logits(m)
    monkeypatch.delenv("EDGED_REPACK")
    with Model.load(path, n_threads=2) as m:
        repacked, kernel_path = set(m.backend.repacked.tensors), m.backend.kernel_path
        got = logits(m)
    return want, got, repacked, kernel_path

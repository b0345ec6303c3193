"""engine/vision.py: mmproj files, llama.cpp's image preprocessing, the SigLIP encoder with the
gemma3 projector, and image rows in a session's prompt, against llama.cpp's libmtmd
(tests/data/goldens/vision-gemma3.*, tools/make_vision_goldens.py)."""
import os

import gguf
import numpy as np
import pytest

from edged.engine.model import Model
from edged.engine.vision import ImageEmbedding, Projector, fit_padded, resize
from edged.errors import MetadataValueError, RequestError, UnsupportedModelError
from tests.support.gguf_clone import clone

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDENS = os.path.join(HERE, "..", "data", "goldens")
MODELS = os.path.join(HERE, "..", "..", "..", "shared", "testdata", "models")


def text_model_path(golden):
    """The path of a vision golden's text model: beside the goldens (idefics3's small llama
    with SmolVLM's image tokens) or among the shared synthetic models."""
    name = str(golden["model"])
    return os.path.join(GOLDENS, name) if os.path.exists(os.path.join(GOLDENS, name)) else os.path.join(MODELS, name)
MMPROJ = os.path.join(GOLDENS, "vision-gemma3.mmproj.gguf")
GOLDEN = os.path.join(GOLDENS, "vision-gemma3.golden.npz")

# ../shared/testdata/README.md's tolerances for F32/F16 files (logits), used for the image rows
# too: the encoder's products are F16 x F16 as llama.cpp's
MAX_DIFF, MEAN_DIFF = 0.05, 0.01


@pytest.fixture(scope="module")
def golden():
    g = np.load(GOLDEN)
    return {k: g[k] for k in g.files}


@pytest.fixture(scope="module")
def proj():
    with Projector.load(MMPROJ, n_threads=2) as p:
        yield p


@pytest.fixture(scope="module")
def text_model(golden):
    m = Model.load(text_model_path(golden), n_threads=2)
    yield m
    m.close()


def close_to(got, want):
    d = np.abs(np.asarray(got, np.float64) - want)
    assert d.max() <= MAX_DIFF and d.mean() <= MEAN_DIFF, (d.max(), d.mean())


@pytest.mark.parametrize("kind,src,dst", [
    ("bilinear", (150, 200), (112, 84)), ("bilinear", (31, 33), (112, 112)),
    ("bilinear", (7, 300), (3, 112)), ("bilinear", (257, 129), (64, 255)),
    ("lanczos", (150, 200), (64, 48)), ("lanczos", (48, 64), (64, 64)),
    ("lanczos", (64, 64), (32, 32)), ("lanczos", (9, 301), (300, 10)),
    ("bicubic", (150, 200), (28, 21)), ("bicubic", (20, 21), (28, 28))])
def test_resize_is_pillows(kind, src, dst):
    """mtmd-image.cpp reimplements Pillow's fixed-point resampler: Pillow is the oracle."""
    Image = pytest.importorskip("PIL.Image")
    img = np.random.default_rng(sum(src) + sum(dst)).integers(0, 256, src + (3,), dtype=np.uint8)
    want = np.asarray(Image.fromarray(img).resize(dst, getattr(Image.Resampling, kind.upper())))
    assert np.array_equal(resize(img, *dst, kind, pillow=False), want)       # the NumPy twin
    assert np.array_equal(resize(img, *dst, kind), want)


def test_fit_padded_keeps_aspect_and_centres():
    img = np.full((50, 100, 3), 200, np.uint8)
    out = fit_padded(img, 112)
    assert out.shape == (112, 112, 3)
    assert (out[:28] == 0).all() and (out[84:] == 0).all() and (out[28:84] == 200).all()
    assert fit_padded(out, 112) is out


def test_describe_and_shapes(proj):
    d = proj.describe()
    assert d["projector_type"] == "gemma3" and d["tokens_per_image"] == 16
    assert d["image_size"] == 112 and d["n_embd"] == 256
    assert proj.markers == ("<start_of_image>", "<end_of_image>")
    assert proj.memory_bytes > proj.weights_bytes > 0


def test_embeddings_match_llama_cpp(proj, golden):
    emb = proj.encode(golden["image"])
    assert emb.embeddings.shape == golden["embd"].shape == (emb.n_tokens, proj.n_embd)
    close_to(emb.embeddings, golden["embd"])


def test_compiled_encoder_matches_its_numpy_twin(proj, golden):
    squares, _ = proj.squares(golden["image"])
    close_to(proj._embed(squares), proj._embed(squares, twin=True))


def test_digest_names_the_pixels(proj, golden):
    img = golden["image"]
    a = proj.encode(img)
    assert proj.encode(img.copy()).digest == a.digest
    b = img.copy()
    b[0, 0, 0] ^= 1
    assert proj.encode(b).digest != a.digest
    assert min(a.token_ids(512)) >= 512


def test_bad_pixels_are_a_request_error(proj):
    for bad in (np.zeros((4, 4), np.uint8), np.zeros((4, 4, 3), np.float32),
                np.zeros((0, 4, 3), np.uint8), np.zeros((4, 4, 4), np.uint8)):
        with pytest.raises(RequestError, match="uint8"):
            proj.encode(bad)


def image_prompt(proj, model, golden):
    emb = proj.encode(golden["image"])
    ids = proj.prompt_ids(model, str(golden["prompt"]), [emb])
    want = golden["ids"]
    got = np.array([-1 if t >= model.hp.n_vocab else t for t in ids])
    assert np.array_equal(got, want), "tokens around the image differ from mtmd_tokenize's"
    return emb, ids


def test_logits_after_the_image_match_llama_cpp(proj, text_model, golden):
    from edged.engine.model import Session
    emb, ids = image_prompt(proj, text_model, golden)
    s = Session(text_model, n_ctx=128)
    s.add_image(emb)
    close_to(s.eval(ids)[0], golden["logits"])


def rows_and_logits(mmproj, golden, backend):
    """A projector and its golden's text model on `backend`: image rows and the logits after
    the golden's prompt, both held to llama.cpp's."""
    from edged.engine.model import Session
    with Projector.load(mmproj, n_threads=2, backend=backend) as p:
        m = Model.load(text_model_path(golden), n_threads=2, backend=backend)
        try:
            emb, ids = image_prompt(p, m, golden)
            close_to(emb.embeddings, golden["embd"])
            s = Session(m, n_ctx=128)
            s.add_image(emb)
            close_to(s.eval(ids)[0], golden["logits"])
        finally:
            m.close()


def test_the_numpy_twins_match_llama_cpp_too(golden):
    """The reference backends (EDGED_BACKEND=reference): encoder and text model in NumPy."""
    rows_and_logits(MMPROJ, golden, "reference")


def test_image_prompt_same_bits_in_any_chunking(proj, text_model, golden):
    from edged.engine.model import Session
    emb, ids = image_prompt(proj, text_model, golden)
    whole = Session(text_model, n_ctx=128)
    whole.add_image(emb)
    want = whole.eval(ids)[0]
    small = Session(text_model, n_ctx=128, n_batch=emb.n_tokens)   # the image fills a batch
    small.add_image(emb)
    assert np.array_equal(small.eval(ids)[0], want)
    # a follow-up turn about the same picture: the prefix (image included) is reused
    g = whole.start(ids + [263])
    assert len(g._pending) == 1


def test_a_fork_keeps_the_images_of_its_prompt(proj, text_model, golden):
    """n > 1 choices fork a session: a fork that goes back into the image (a truncate, then the
    same ids again) still finds its rows, and gives the same bits."""
    from edged.engine.model import Session
    emb, ids = image_prompt(proj, text_model, golden)
    s = Session(text_model, n_ctx=128)
    s.add_image(emb)
    want = s.eval(ids)[0]
    f = s.fork()
    start = next(i for i, t in enumerate(ids) if t >= text_model.hp.n_vocab)
    f.truncate(start)
    assert np.array_equal(f.eval(ids[start:])[0], want)


def test_image_bigger_than_a_batch_is_refused_before_running(proj, text_model, golden):
    from edged.engine.model import Session
    emb, ids = image_prompt(proj, text_model, golden)
    s = Session(text_model, n_ctx=128, n_batch=8)
    s.add_image(emb)
    with pytest.raises(RequestError, match="n_batch"):
        s.eval(ids)
    assert s.n_past == 0


def test_unknown_image_rows_are_refused(text_model):
    from edged.engine.model import Session
    s = Session(text_model, n_ctx=32)
    fake = ImageEmbedding(np.zeros((4, text_model.hp.n_embd), np.float32), "ab" * 32)
    with pytest.raises(RequestError, match="out of range"):
        s.eval([1] + fake.token_ids(text_model.hp.n_vocab))
    s.add_image(fake)
    assert s.eval([1] + fake.token_ids(text_model.hp.n_vocab)).shape == (1, text_model.hp.n_vocab)
    with pytest.raises(RequestError, match="n_embd"):
        s.add_image(ImageEmbedding(np.zeros((4, 8), np.float32), "cd" * 32))


def test_check_model_names_both_widths(proj):
    other = Model.load(os.path.join(MODELS, "stories260K.gguf"), n_threads=1)
    try:
        with pytest.raises(UnsupportedModelError, match="n_embd 256.*n_embd 64"):
            proj.check_model(other)
    finally:
        other.close()


F32 = gguf.GGUFValueType.FLOAT32
U32 = gguf.GGUFValueType.UINT32
STR = gguf.GGUFValueType.STRING


@pytest.mark.parametrize("change,error,match", [
    (dict(meta={"clip.vision.image_size": (1 << 20, U32)}), MetadataValueError,
     "clip.vision.image_size"),
    (dict(meta={"clip.vision.image_size": (112 * 64, U32), "clip.vision.patch_size": (1, U32)}),
     MetadataValueError, "at most"),
    (dict(meta={"clip.vision.patch_size": (5, U32)}), MetadataValueError, "multiple"),
    (dict(meta={"clip.vision.projector.scale_factor": (3, U32)}), MetadataValueError,
     "scale_factor"),
    (dict(meta={"clip.projector_type": ("resampler", STR)}), UnsupportedModelError,
     "'resampler'"),
    (dict(drop_meta=("clip.vision.attention.head_count",)), UnsupportedModelError,
     "head_count"),
    (dict(meta={"clip.vision.image_std": ([0.5, 0.0, 0.5], gguf.GGUFValueType.ARRAY, F32)}),
     MetadataValueError, "image_std"),
    (dict(drop=("v.blk.1.attn_k.weight",)), UnsupportedModelError, "v.blk.1.attn_k.weight"),
    (dict(reshape={"v.blk.0.ffn_up.weight": (64, 64)}), UnsupportedModelError,
     "v.blk.0.ffn_up.weight"),
    (dict(reshape={"v.position_embd.weight": (255, 64)}), UnsupportedModelError,
     "v.position_embd.weight"),
])
def test_malformed_mmproj_is_refused_naming_the_key(tmp_path, change, error, match):
    bad = clone(MMPROJ, tmp_path / "bad.mmproj.gguf", **change)
    with pytest.raises(error, match=match):
        Projector.load(bad, n_threads=1)


def test_a_text_model_is_not_an_mmproj():
    with pytest.raises(UnsupportedModelError, match="clip"):
        Projector.load(os.path.join(MODELS, "stories260K.gguf"), n_threads=1)


def test_synth_mmproj_cli(tmp_path):
    from edged.cli import main
    out = str(tmp_path / "t.mmproj.gguf")
    assert main(["synth", "--mmproj", "gemma3-tiny", "--type", "F32", out]) == 0
    with Projector.load(out, n_threads=1) as p:
        assert p.encode(np.zeros((10, 20, 3), np.uint8)).embeddings.shape == (16, 256)


# --- idefics3 (SmolVLM): tiles and an overview ------------------------------------------------
IDEFICS3 = os.path.join(GOLDENS, "vision-idefics3.mmproj.gguf")


@pytest.fixture(scope="module")
def idefics3():
    g = np.load(os.path.join(GOLDENS, "vision-idefics3.golden.npz"))
    return {k: g[k] for k in g.files}


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_idefics3_embeddings_match_llama_cpp(idefics3, backend):
    with Projector.load(IDEFICS3, n_threads=2, backend=backend) as p:
        emb = p.encode(idefics3["image"])
        assert emb.grid == (2, 2) and emb.n_tokens == 5 * 16 == p.describe()["tokens_per_image"]
        close_to(emb.embeddings, idefics3["embd"])


def test_idefics3_tiles_in_passes_of_any_size_give_the_same_bits(idefics3, monkeypatch):
    """The encoder runs SQUARES_PER_PASS tiles together (its scratch is sized for that, not
    for every tile of a picture); the rows do not depend on it."""
    from edged.engine import vision
    got = {}
    with Projector.load(IDEFICS3, n_threads=2) as p:
        for k in (1, 4, 5):
            monkeypatch.setattr(vision, "SQUARES_PER_PASS", k)
            got[k] = p.encode(idefics3["image"]).embeddings
    assert np.array_equal(got[1], got[4]) and np.array_equal(got[4], got[5])


def test_idefics3_prompt_layout_is_mtmds(idefics3):
    """Tiles row by row behind their <fake_token_around_image><row_Y_col_X> text, "\n" after
    each row, the overview last between "\n\n" <fake_token_around_image> <global-img> and
    <fake_token_around_image>: the ids mtmd_tokenize gave, on a vocabulary that has them."""
    m = Model.load(text_model_path(idefics3), n_threads=1)
    try:
        with Projector.load(IDEFICS3, n_threads=1) as p:
            p.check_model(m)
            emb = p.encode(idefics3["image"])
            ids = p.prompt_ids(m, str(idefics3["prompt"]), [emb])
        assert [-1 if t >= m.hp.n_vocab else t for t in ids] == idefics3["ids"].tolist()
    finally:
        m.close()


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_idefics3_rows_and_logits_match_llama_cpp(idefics3, backend):
    """The first logits after a tiled image (4 tiles and the overview, 108 prompt tokens)."""
    rows_and_logits(IDEFICS3, idefics3, backend)


def test_a_text_model_without_the_idefics3_tokens_is_refused_naming_one():
    m = Model.load(os.path.join(MODELS, "synthetic-llama-f32.gguf"), n_threads=1)
    try:
        with Projector.load(IDEFICS3, n_threads=1) as p, \
                pytest.raises(UnsupportedModelError, match="fake_token_around_image"):
            p.check_model(m)
    finally:
        m.close()


# --- LLaVA-style mlp: CLIP with a class token, its second-to-last layer, a GELU MLP ----------
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_mlp_rows_and_logits_match_llama_cpp(backend):
    g = np.load(os.path.join(GOLDENS, "vision-mlp.golden.npz"))
    rows_and_logits(os.path.join(GOLDENS, "vision-mlp.mmproj.gguf"), {k: g[k] for k in g.files},
                    backend)


def test_a_prompt_cache_file_keeps_the_image_rows(proj, text_model, golden, tmp_path):
    """Saved and restored, a session with a picture reuses its KV rows for the same picture."""
    from edged.engine.model import Session
    emb, ids = image_prompt(proj, text_model, golden)
    s = Session(text_model, n_ctx=128)
    s.add_image(emb)
    want = s.eval(ids)[0]
    key = bytes(range(32))
    s.save(tmp_path / "p.state", key=key)
    r = Session.load(text_model, tmp_path / "p.state", key=key)
    assert r.tokens == s.tokens and r.common_prefix(ids) == len(ids)
    r.truncate(len(ids) - 1)
    r.add_image(emb)
    assert np.array_equal(r.eval(ids[-1:])[0], want)


def test_a_scheduler_budget_never_splits_an_image(proj, text_model, golden):
    """Prompt chunks of a generation (the daemon's budget per step) keep a non-causal image
    whole, so the first sampled token sees the same logits as one batch."""
    from edged.engine.model import Session
    from edged.text.sampling import SamplingParams
    emb, ids = image_prompt(proj, text_model, golden)
    first = int(np.argmax(golden["logits"]))
    s = Session(text_model, n_ctx=128)
    s.add_image(emb)
    g = s.start(ids, SamplingParams(temperature=0.0), max_tokens=1)
    out, sizes = None, []
    while out is None:
        e = g.entry(budget=7)
        sizes.append(len(e.tokens))
        out = g.accept(text_model.decode([e])[0])
    assert emb.n_tokens in sizes     # cut before the image, then the image alone
    assert out.token == first


def test_an_mmproj_over_the_memory_budget_is_refused_with_the_numbers():
    with pytest.raises(UnsupportedModelError, match=r"needs .* MiB .* budget 0\.1 MiB"):
        Projector.load(MMPROJ, n_threads=1, max_memory=100_000)


@pytest.mark.parametrize("name,rows_per_pass", [("gemma3", None), ("idefics3", None),
                                                ("idefics3", 64), ("mlp", None)])
def test_an_encode_stays_within_its_memory_plan(name, rows_per_pass, monkeypatch):
    """The encoder's working memory is planned from the file (vision.work_bytes: the picture's
    squares, the rows, and one pass's buffers, whatever the number of tiles) and counted in
    memory_bytes; an encode's allocations (numpy's, as tracemalloc sees them) stay within it.
    rows_per_pass 64: one tile of the idefics3 file per pass."""
    import tracemalloc
    from edged.engine import vision
    if rows_per_pass:
        monkeypatch.setattr(vision, "ROWS_PER_PASS", rows_per_pass)
    g = np.load(os.path.join(GOLDENS, f"vision-{name}.golden.npz"))
    image = g["image"]
    with Projector.load(os.path.join(GOLDENS, f"vision-{name}.mmproj.gguf"), n_threads=2) as p:
        p.encode(image)                     # caches (GELU tables, Pillow) before counting
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            p.encode(image)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        # + Pillow's copy of the picture while it resizes, and Python's own small objects
        assert 0 < peak <= p.scratch_bytes + image.nbytes + (32 << 10), (peak, p.scratch_bytes)


def test_smolvlm_encodes_one_tile_at_a_time():
    """SmolVLM-256M's SigLIP (tiles of 32 x 32 patches, up to 9 tiles and the overview): its
    plan holds one tile's pass, not four or ten (137 MiB before), which kept the process's peak
    above libmtmd's (BENCHMARKS.md)."""
    from edged.engine import vision
    from edged.format.synth import MMPROJ_SHAPES
    s = MMPROJ_SHAPES["smolvlm"]
    E, n_pos = s["n_embd"], (s["image_size"] // s["patch_size"]) ** 2
    hp = vision.VisionHParams(
        n_embd=E, n_ff=s["n_ff"], n_layer=s["n_layer"], n_head=s["n_head"],
        head_dim=E // s["n_head"], eps=1e-6, image_size=s["image_size"],
        patch_size=s["patch_size"], n_merge=s["n_merge"], longest_edge=s["longest_edge"],
        image_mean=(0.5,) * 3, image_std=(0.5,) * 3, n_embd_text=s["n_embd_text"])
    kind = vision.PROJECTORS["idefics3"]
    assert vision.max_squares(kind, hp) == 10 and vision.squares_per_pass(kind, hp) == 1
    assert n_pos == vision.ROWS_PER_PASS
    assert vision.work_bytes(kind, hp, n_threads=1) < 80 << 20

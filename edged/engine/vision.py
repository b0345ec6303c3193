"""Images in: llama.cpp's mmproj files (`general.architecture = clip`), the vision encoder and
projector that turn a decoded picture into rows the text model reads as if they were token
embeddings.

Interface (the service half, edged/service/..., calls only this):

    proj = Projector.load(path, n_threads=None, verified=None, backend=None, max_memory=None)
        # an mmproj GGUF, validated as strictly as a model (UnsupportedModelError /
        # MetadataValueError naming the key or tensor); verified: as Model.load's (the trust
        # layer's open file, mapped up to the signed length; the projector owns it from here)
    proj.projector_type   # "gemma3", "idefics3" (SmolVLM) or "mlp" (LLaVA-1.5 style)
    proj.image_size       # the square (gemma3) or tile (idefics3) the encoder sees (pixels)
    proj.n_tokens         # rows (tokens) per square (gemma3: 256 for the real files; idefics3
                          # images are up to max_squares squares: tiles plus an overview)
    proj.n_embd           # width of those rows: must equal the text model's n_embd
    proj.memory_bytes     # weights (mapped) + the copies and scratch the encoder holds
    proj.markers          # (before, after): text around an image's rows, e.g. gemma3's
                          # ("<start_of_image>", "<end_of_image>") as llama.cpp's mtmd.cpp;
                          # () for idefics3, whose tiles prompt_ids lays out as mtmd does
    proj.describe()       # dict for `edged info`
    proj.check_model(model)   # UnsupportedModelError when the text model does not fit
    emb = proj.encode(rgb)    # rgb: numpy uint8 (H, W, 3), already decoded -> ImageEmbedding
    emb.embeddings        # float32 (n_tokens, n_embd); emb.n_tokens; emb.digest (sha256 hex
                          # of the image's shape and pixel bytes)
    ids = proj.prompt_ids(model, text, images)   # a rendered prompt holding MEDIA_MARKER once
                          # per image -> token ids, each image as its markers' tokens around
                          # emb.token_ids(n_vocab): pseudo ids >= n_vocab
    session.add_image(emb)    # before a prompt holding its pseudo ids is evaluated

Pseudo ids: an image's rows are the ids base .. base + n_tokens - 1 with base = n_vocab + a
number taken from the digest, so prompts stay plain lists of ints: the prefix cache and
Session.common_prefix work unchanged and a follow-up turn about the same picture reuses its KV
rows; the session maps those ids back to embedding rows when it stages a batch (the text
model's embedding scale does not apply to them, as in llama.cpp).

Numerics follow llama.cpp's libmtmd (tools/mtmd: clip.cpp, mtmd-image.cpp, models/siglip.cpp):
- preprocessing: the picture is resized keeping its aspect ratio into image_size squared
  (Pillow's fixed-point separable bilinear filter, which mtmd reimplements bit for bit; the
  new size rounded up) and centred on black; then x / 255, (x - mean) / std per channel with
  the file's mean and std;
- SigLIP ViT: patches (channel, row, column inside a patch; patches row by row) times
  v.patch_embd plus its bias and v.position_embd; pre-norm blocks x += attn(LN1(x)),
  x += ffn(LN2(x)) with biases, non-causal attention, GELU through ggml's F16 table; v.post_ln;
- gemma3 projector: average pooling of n_merge x n_merge patches, RMSNorm * mm.soft_emb_norm,
  then x @ mm.input_projection;
- idefics3: the longer side resized to clip.vision.preproc_image_size (Pillow's Lanczos), then
  up to whole tiles of image_size, cut row by row, plus the whole picture as an overview tile
  (every tile and the overview through the ViT together); per tile a pixel shuffle of
  n_merge x n_merge patches into one row, then mm.model.fc. In the prompt each tile follows
  "<fake_token_around_image><row_Y_col_X>", rows of tiles end in "\n", the overview comes last
  between "\n\n" <fake_token_around_image> <global-img> and <fake_token_around_image>;
- mlp (LLaVA-1.5): fitted into image_size squared on (122, 116, 104) with Pillow's bicubic;
  CLIP ViT: the class token appended after the patches, pre-norm, quick GELU (ggml's F16
  table), all layers but the last; then, as clip.cpp's llava graph does, rows 1..n_patches
  (the class token in, patch 0 out) through mm.0, GELU, mm.2; no text around the rows.
The matrix products, LayerNorm, GELU and attention run in the compiled core on the
projector's thread pool (edged._core: matmul, enc_norm, enc_act, enc_attention, the same
kernels as the BERT encoders); `_reference` is the slow NumPy twin the tests hold it to.
"""
from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from .arch import VECTOR_TYPES, _Tensors
from .reference import gelu_ggml
from ..errors import (ConfigError, MetadataValueError, RequestError, UnsupportedModelError)
from ..format.gguf import GGMLType, GGUFFile, Key, check_number
from ..format.quants import dequantize

CLIP_ARCH = "clip"
MEDIA_MARKER = "<__media__>"        # where a rendered prompt holds an image (llama.cpp's default)
MAX_IMAGE_SIZE = 4096               # pixels per side of the encoder's square (real files: 224..1024)
MAX_PATCHES = 65536                 # patches per image: attention is quadratic in them
MAX_LAYERS = 256
SQUARES_PER_PASS = 4                # idefics3: tiles the encoder runs together, at most, and
ROWS_PER_PASS = 1024                # at most this many patch rows (one SmolVLM tile): a pass's
                                    # buffers, not the picture's tiles, make the encoder's memory
MAX_TILES_SIDE = 8                  # idefics3: tiles per side (real files: up to 4)
PSEUDO_SPAN = 1 << 30               # pseudo ids live in [n_vocab, n_vocab + 2^30 + n_tokens)


def id_limit(n_vocab):
    """Every token or image-row id of a session is below this (prompt-cache files check it)."""
    return n_vocab + PSEUDO_SPAN + MAX_TILES_SIDE ** 2 * MAX_PATCHES

# Bilinear as Pillow's (and mtmd-image.cpp's) fixed-point resampler
_PRECISION_BITS = 32 - 8 - 2


@dataclass(frozen=True)
class ProjectorKind:
    name: str
    markers: tuple          # text before and after an image's rows (mtmd.cpp); () when tiled
    non_causal: bool        # llama.cpp decodes the image's rows with bidirectional attention
    resize: str             # the resampling filter (mtmd's image_resize_algo)
    tiled: bool             # tiles of image_size plus an overview (idefics3), else one square


PROJECTORS = {
    "gemma3": ProjectorKind("gemma3", ("<start_of_image>", "<end_of_image>"), non_causal=True,
                            resize="bilinear", tiled=False),
    "idefics3": ProjectorKind("idefics3", (), non_causal=False, resize="lanczos", tiled=True),
    # LLaVA-1.5 style: CLIP ViT (class token, pre-norm), its second-to-last layer, a 2-layer
    # GELU MLP; the picture fitted on llava's grey (122, 116, 104), no text around its rows
    "mlp": ProjectorKind("mlp", ("", ""), non_causal=False, resize="bicubic", tiled=False),
}
PAD_COLOR = {"mlp": (122, 116, 104)}


@dataclass(frozen=True)
class VisionHParams:
    n_embd: int             # the ViT's width
    n_ff: int
    n_layer: int
    n_head: int
    head_dim: int
    eps: float
    image_size: int
    patch_size: int
    n_merge: int            # patches per side pooled (gemma3) or shuffled (idefics3) into one token
    longest_edge: int       # idefics3: the picture's longer side before tiling (0: gemma3)
    image_mean: tuple
    image_std: tuple
    n_embd_text: int        # the projector's output width
    act: str = "gelu"       # the ViT's FFN activation: "gelu" (SigLIP) or "gelu_quick" (CLIP)
    n_layer_run: int = 0    # layers run (mlp: all but the last, llama.cpp's feature layer)

    @property
    def n_patches_side(self):
        return self.image_size // self.patch_size

    @property
    def n_tokens(self):
        return (self.n_patches_side // self.n_merge) ** 2

    @property
    def n_pos(self):
        """Position rows: the patches, and the class token where the file has one (mlp)."""
        return self.n_patches_side ** 2 + (self.act == "gelu_quick")


@dataclass(frozen=True)
class ImageEmbedding:
    embeddings: np.ndarray  # float32 (n_tokens, n_embd)
    digest: str             # sha256 hex of the image's shape and pixels
    non_causal: bool = False    # its rows attend to each other (llama.cpp: gemma3)
    grid: tuple = ()        # tiled (idefics3): (rows, columns) of tiles; the rows are the
                            # tiles' row by row, then the overview's

    @property
    def n_tokens(self):
        return int(self.embeddings.shape[0])

    def base_id(self, n_vocab):
        """The first pseudo id of this image's rows for a vocabulary of n_vocab tokens."""
        return n_vocab + int(self.digest[:16], 16) % PSEUDO_SPAN

    def token_ids(self, n_vocab):
        """Pseudo ids of the rows: base_id .. base_id + n_tokens - 1 (all >= n_vocab)."""
        b = self.base_id(n_vocab)
        return list(range(b, b + self.n_tokens))


def image_digest(rgb):
    h = hashlib.sha256(f"{rgb.shape[0]}x{rgb.shape[1]}x{rgb.shape[2]}:".encode())
    h.update(np.ascontiguousarray(rgb).data)
    return h.hexdigest()


def _refuse(msg):
    raise UnsupportedModelError(msg)


# --- preprocessing (mtmd-image.cpp) ----------------------------------------------------------

def _sinc(x):
    return 1.0 if x == 0.0 else math.sin(math.pi * x) / (math.pi * x)


# Pillow's filters: (support, weight of a distance)
def _bicubic(x, a=-0.5):     # Pillow's a (ggml and PyTorch use -0.75)
    x = abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    return (((x - 5) * x + 8) * x - 4) * a if x < 2.0 else 0.0


FILTERS = {
    "bilinear": (1.0, lambda x: max(0.0, 1.0 - abs(x))),
    "bicubic": (2.0, _bicubic),
    "lanczos": (3.0, lambda x: _sinc(x) * _sinc(x / 3.0) if -3.0 <= x < 3.0 else 0.0),
}


def _coeffs(n_in, n_out, kind):
    """Pillow's precompute_coeffs: per output pixel the first input pixel and fixed-point
    weights (n_out, ksize) int64 (zero past each pixel's count)."""
    fsupport, fw = FILTERS[kind]
    scale = n_in / n_out
    filterscale = max(scale, 1.0)
    support = fsupport * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    xmin = np.empty(n_out, np.int64)
    k = np.zeros((n_out, ksize), np.int64)
    for xx in range(n_out):
        center = (xx + 0.5) * scale
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in) - lo
        w = [fw((x + lo - center + 0.5) / filterscale) for x in range(hi)]
        ww = sum(w)
        w = [v / ww if ww != 0.0 else v for v in w]
        xmin[xx] = lo
        for x, v in enumerate(w):
            r = v * (1 << _PRECISION_BITS)
            k[xx, x] = int(r + (-0.5 if v < 0 else 0.5))
    return xmin, k


def _resample(img, n_out, axis, kind):
    """One pass of the separable filter along axis (1: width, 0: height) of (H, W, 3) uint8,
    in int32 as Pillow (|sum| < 2^31: 255 x 2^22 x at most 1.3 of weights), a block of lines
    at a time so that a big picture costs a few MiB beyond its own bytes."""
    n_in = img.shape[axis]
    xmin, k = _coeffs(n_in, n_out, kind)
    k = k.astype(np.int32)
    src = np.moveaxis(img, axis, 0)                              # (n_in, lines, 3) view
    out = np.empty((n_out,) + src.shape[1:], np.uint8)
    block = max(1, (1 << 20) // max(1, n_out + n_in))            # lines per pass
    idx = [np.minimum(xmin + j, n_in - 1) for j in range(k.shape[1])]
    for a in range(0, src.shape[1], block):
        part = src[:, a:a + block].astype(np.int32)
        acc = np.full((n_out,) + part.shape[1:], 1 << (_PRECISION_BITS - 1), np.int32)
        for j in range(k.shape[1]):
            acc += part[idx[j]] * k[:, j][:, None, None]
        out[:, a:a + block] = np.clip(acc >> _PRECISION_BITS, 0, 255)
    return np.ascontiguousarray(np.moveaxis(out, 0, axis))


def _pil():
    """PIL.Image, or None where Pillow cannot be imported (the NumPy twin resizes then)."""
    if not _PIL:
        try:
            from PIL import Image
        except Exception:  # noqa: BLE001 - missing, or a sandbox that refuses its library
            Image = None
        _PIL.append(Image)
    return _PIL[0]


_PIL = []


def resize(img, width, height, kind="bilinear", pillow=True):
    """(H, W, 3) uint8 -> (height, width, 3): Pillow's Image.resize bits (BILINEAR, BICUBIC or
    LANCZOS), width first, as mtmd-image.cpp's resize_pillow. Pillow itself when installed (8x
    faster than the NumPy twin below: a 4000 x 3000 photo to 896 x 672 took 0.11 s against
    0.87 s; pixels in memory, no image bytes parsed), else the twin (pillow=False)."""
    if (img.shape[1], img.shape[0]) == (width, height):
        return img
    if pillow and _pil() is not None:
        Image = _pil()
        return np.asarray(Image.fromarray(np.ascontiguousarray(img)).resize(
            (width, height), getattr(Image.Resampling, kind.upper())))
    if img.shape[1] != width:
        img = _resample(img, width, 1, kind)
    if img.shape[0] != height:
        img = _resample(img, height, 0, kind)
    return img


def tiles(img, tile, longest_edge, kind="lanczos"):
    """mtmd's idefics3 preprocessing: the longer side to longest_edge (the other by the
    aspect ratio, truncated, made even), then up to whole tiles, cut into tile x tile squares
    row by row; the overview is the whole picture resized to one tile. Returns (tiles list,
    overview, (rows, columns))."""
    h, w = img.shape[:2]
    ar = w / h
    if w >= h:
        rw, rh = longest_edge, int(longest_edge / ar)
        rh += rh % 2
    else:
        rw, rh = int(longest_edge * ar), longest_edge
        rw += rw % 2
    rw, rh = max(rw, 1), max(rh, 1)
    gx, gy = -(-rw // tile), -(-rh // tile)
    refined = resize(resize(img, rw, rh, kind), gx * tile, gy * tile, kind)
    overview = resize(refined, tile, tile, kind)
    cut = [refined[y * tile:(y + 1) * tile, x * tile:(x + 1) * tile]
           for y in range(gy) for x in range(gx)]
    return cut, overview, (gy, gx)


def fit_padded(img, size, pad=(0, 0, 0), kind="bilinear"):
    """mtmd's resize with PAD_CEIL: scale to fit a size x size square keeping the aspect
    ratio (float32 arithmetic, sides rounded up), centred on `pad`."""
    h, w = img.shape[:2]
    if (h, w) == (size, size):
        return img
    scale = min(np.float32(size) / np.float32(w), np.float32(size) / np.float32(h))
    nw = min(int(math.ceil(np.float32(w) * scale)), size)
    nh = min(int(math.ceil(np.float32(h) * scale)), size)
    out = np.empty((size, size, 3), np.uint8)
    out[:] = np.asarray(pad, np.uint8)
    ox, oy = (size - nw) // 2, (size - nh) // 2
    out[oy:oy + nh, ox:ox + nw] = resize(img, nw, nh, kind)
    return out


def normalize(img, mean, std):
    """uint8 (H, W, 3) -> float32 (3, H, W): x / 255 then (x - mean) / std, channel planes."""
    x = img.astype(np.float32)
    x /= np.float32(255.0)
    x -= np.asarray(mean, np.float32)
    x /= np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


_GELU_QUICK = []


def gelu_quick_table():
    """ggml's table: gelu_quick(x) = x / (1 + expf(-1.702 x)) in float over every F16 x,
    rounded to F16; as float32 (65536,)."""
    if not _GELU_QUICK:
        x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            y = x * (np.float32(1.0) / (np.float32(1.0) + np.exp(np.float32(-1.702) * x)))
        _GELU_QUICK.append(y.astype(np.float16).astype(np.float32))
    return _GELU_QUICK[0]


def pixel_shuffle(h, side, s):
    """idefics3's merge (clip.cpp's build_patch_merge_permute): (side^2, E) patch rows ->
    ((side/s)^2, s*s*E), each row the s x s block's patches row by row."""
    E = h.shape[1]
    x = h.reshape(side // s, s, side // s, s, E).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(x.reshape(-1, s * s * E))


def patches(planes, p):
    """float32 (3, H, W) -> (n_patches, 3 * p * p): patch rows in row-major patch order, each
    (channel, row, column) as ggml_conv_2d's im2col lays them out."""
    c, h, w = planes.shape
    x = planes.reshape(c, h // p, p, w // p, p).transpose(1, 3, 0, 2, 4)
    return np.ascontiguousarray(x.reshape((h // p) * (w // p), c * p * p))


# --- validation -------------------------------------------------------------------------------

def _num(md, key, kind=int, required=True, default=None, **bounds):
    v = md.get(key)
    if v is None:
        if required:
            _refuse(f"mmproj: missing key {key}")
        return default
    return check_number(key, v, kind, **bounds)


def _floats3(md, key):
    v = md.get(key)
    try:
        a = [float(x) for x in v]
    except (TypeError, ValueError):
        raise MetadataValueError(f"{key} must be an array of 3 numbers, got {v!r}") from None
    if len(a) != 3 or not all(math.isfinite(x) for x in a):
        raise MetadataValueError(f"{key} must be an array of 3 finite numbers, got {v!r}")
    return tuple(a)


def validate(md, tensors):
    """One pass over an mmproj file: keys in range, every tensor's shape and type. Returns
    (ProjectorKind, VisionHParams, roles: role -> tensor name or None)."""
    arch = md.get(Key.ARCHITECTURE)
    if arch != CLIP_ARCH:
        _refuse(f"{Key.ARCHITECTURE} = {arch!r}: an mmproj file says {CLIP_ARCH!r}")
    if md.get(Key.CLIP_HAS_VISION) is not True:
        _refuse(f"{Key.CLIP_HAS_VISION} is not true: no vision encoder in this mmproj file")
    ptype = md.get(Key.CLIP_VISION_PROJECTOR_TYPE, md.get(Key.CLIP_PROJECTOR_TYPE))
    if ptype not in PROJECTORS:
        _refuse(f"{Key.CLIP_PROJECTOR_TYPE} = {ptype!r}: edged runs "
                f"{', '.join(sorted(PROJECTORS))} projectors")
    kind = PROJECTORS[ptype]
    E = _num(md, Key.CLIP_EMBEDDING_LENGTH, positive=True, hi=1 << 16)
    F = _num(md, Key.CLIP_FEED_FORWARD_LENGTH, positive=True, hi=1 << 18)
    L = _num(md, Key.CLIP_BLOCK_COUNT, positive=True, hi=MAX_LAYERS)
    H = _num(md, Key.CLIP_HEAD_COUNT, positive=True, hi=E)
    H_kv = _num(md, Key.CLIP_HEAD_COUNT_KV, required=False, default=H, positive=True, hi=E)
    if H_kv != H or E % H or (E // H) % 2:
        _refuse(f"mmproj: {Key.CLIP_HEAD_COUNT} {H} (kv {H_kv}) with {Key.CLIP_EMBEDDING_LENGTH} "
                f"{E}: equal counts and an even head size are supported")
    eps = _num(md, Key.CLIP_LAYERNORM_EPS, float, positive=True, hi=1.0)
    size = _num(md, Key.CLIP_IMAGE_SIZE, lo=1, hi=MAX_IMAGE_SIZE)
    p = _num(md, Key.CLIP_PATCH_SIZE, lo=1, hi=size)
    if size % p:
        raise MetadataValueError(f"{Key.CLIP_IMAGE_SIZE} {size} is not a multiple of "
                                 f"{Key.CLIP_PATCH_SIZE} {p}")
    side = size // p
    if side * side > MAX_PATCHES:
        raise MetadataValueError(f"{Key.CLIP_IMAGE_SIZE} {size} / {Key.CLIP_PATCH_SIZE} {p}: "
                                 f"{side * side} patches per image, at most {MAX_PATCHES}")
    if kind.name == "mlp":
        merge, longest = 1, 0
        if md.get(Key.CLIP_IMAGE_GRID_PINPOINTS) is not None:
            _refuse(f"mmproj: {Key.CLIP_IMAGE_GRID_PINPOINTS} (LLaVA-1.6 tiling) is not supported")
    elif kind.tiled:      # pixel shuffle: llama.cpp asserts a factor above 1
        merge = _num(md, Key.CLIP_SCALE_FACTOR, lo=2, hi=side)
        longest = _num(md, Key.CLIP_PREPROC_IMAGE_SIZE, lo=1, hi=MAX_TILES_SIDE * size)
    else:
        merge = _num(md, Key.CLIP_SCALE_FACTOR, required=False, default=4, lo=1, hi=side)
        longest = 0
    if side % merge:
        raise MetadataValueError(f"{Key.CLIP_SCALE_FACTOR} {merge} does not divide the "
                                 f"{side} patches per side")
    if md.get(Key.CLIP_USE_SILU):
        _refuse(f"mmproj: {Key.CLIP_USE_SILU} = true: edged runs GELU vision encoders")
    act = "gelu" if md.get(Key.CLIP_USE_GELU) is True else "gelu_quick"   # clip.cpp's default
    if (act == "gelu_quick") != (kind.name == "mlp"):
        _refuse(f"mmproj: {ptype} with {Key.CLIP_USE_GELU} = {md.get(Key.CLIP_USE_GELU)!r}: "
                "edged runs SigLIP (GELU) for gemma3/idefics3 and CLIP (quick GELU) for mlp")
    mean, std = _floats3(md, Key.CLIP_IMAGE_MEAN), _floats3(md, Key.CLIP_IMAGE_STD)
    if not all(s > 0 for s in std):
        raise MetadataValueError(f"{Key.CLIP_IMAGE_STD} must be positive, got {std}")

    ts, roles = _Tensors(tensors), {}

    def get(role, name, shape, types=None, required=True):
        """types: None (any matrix type the kernels take), VECTOR_TYPES, or a narrower set."""
        roles[role] = ts.get(name, shape, required, vector=types is VECTOR_TYPES)
        if roles[role] and types is not None and tensors[name].type not in types:
            _refuse(f"mmproj: tensor {name!r} has type {tensors[name].type.name}, expected one "
                    f"of {', '.join(sorted(x.name for x in types))}")

    plain = frozenset({GGMLType.F32, GGMLType.F16})
    get("patch_embd", "v.patch_embd.weight", (p, p, 3, E), plain)
    get("patch_bias", "v.patch_embd.bias", (E,), VECTOR_TYPES, required=False)
    # added to the patches by ggml_add, which takes F32 only (llama.cpp's converter keeps it so)
    n_pos = side * side + (kind.name == "mlp")
    get("position_embd", "v.position_embd.weight", (E, n_pos), frozenset({GGMLType.F32}))
    if kind.name == "mlp":
        get("class_embd", "v.class_embd", (E,), VECTOR_TYPES)
        get("pre_ln", "v.pre_ln.weight", (E,), VECTOR_TYPES)
        get("pre_ln_b", "v.pre_ln.bias", (E,), VECTOR_TYPES)
    for i in range(L):
        b = f"v.blk.{i}."
        for r in ("attn_q", "attn_k", "attn_v", "attn_out"):
            get(b + r, b + r + ".weight", (E, E))
            get(b + r + "_b", b + r + ".bias", (E,), VECTOR_TYPES, required=False)
        for r in ("ln1", "ln2"):
            get(b + r, b + r + ".weight", (E,), VECTOR_TYPES)
            get(b + r + "_b", b + r + ".bias", (E,), VECTOR_TYPES)
        # older converters wrote SigLIP's fc1/fc2 as ffn_down/ffn_up: llama.cpp swaps them back
        # when ffn_down's rows are n_embd long
        down = tensors.get(b + "ffn_down.weight")
        up_name, down_name = ("ffn_down", "ffn_up") if down is not None and \
            int(down.shape[0]) == E and E != F else ("ffn_up", "ffn_down")
        get(b + "ffn_up", b + up_name + ".weight", (E, F))
        get(b + "ffn_up_b", b + up_name + ".bias", (F,), VECTOR_TYPES, required=False)
        get(b + "ffn_down", b + down_name + ".weight", (F, E))
        get(b + "ffn_down_b", b + down_name + ".bias", (E,), VECTOR_TYPES, required=False)
    get("post_ln", "v.post_ln.weight", (E,), VECTOR_TYPES, required=False)
    get("post_ln_b", "v.post_ln.bias", (E,), VECTOR_TYPES, required=roles["post_ln"] is not None)
    # the projector: its output width is the text model's n_embd
    pname, pin = {"idefics3": ("mm.model.fc.weight", E * merge * merge),
                  "mlp": ("mm.2.weight", None)}.get(kind.name, ("mm.input_projection.weight", None))
    proj = tensors.get(pname)
    if proj is None or len(proj.shape) != 2:
        _refuse(f"mmproj: missing tensor {pname!r}")
    n_text = int(proj.shape[0] if kind.name == "gemma3" else proj.shape[1])
    check_number(f"{pname} output width", n_text, int, lo=1, hi=1 << 17)
    if kind.name == "mlp":
        mid = int(proj.shape[0])
        get("mm0", "mm.0.weight", (E, mid))
        get("mm0_b", "mm.0.bias", (mid,), VECTOR_TYPES)
        get("mm2", "mm.2.weight", (mid, n_text))
        get("mm2_b", "mm.2.bias", (n_text,), VECTOR_TYPES)
    elif kind.tiled:
        get("fc", pname, (pin, n_text))
    else:
        get("input_projection", pname, (n_text, E), plain)
        get("soft_emb_norm", "mm.soft_emb_norm.weight", (E,), VECTOR_TYPES)
    hp = VisionHParams(n_embd=E, n_ff=F, n_layer=L, n_head=H, head_dim=E // H, eps=eps,
                       image_size=size, patch_size=p, n_merge=merge, longest_edge=longest,
                       image_mean=mean, image_std=std, n_embd_text=n_text, act=act,
                       n_layer_run=L - 1 if kind.name == "mlp" else L)
    return kind, hp, roles


# --- the encoder's memory ---------------------------------------------------------------------

ATTN_QUERY_ROWS = 16                # queries per block of enc_attention (encoder.h's ED_ENC_QROWS)


def max_squares(kind, hp):
    """Squares the encoder runs per image: 1, or the most tiles plus the overview."""
    return (-(-hp.longest_edge // hp.image_size)) ** 2 + 1 if kind.tiled else 1


def squares_per_pass(kind, hp):
    """Squares through the encoder together: up to SQUARES_PER_PASS of them and ROWS_PER_PASS
    patch rows (at least one square)."""
    return max(1, min(SQUARES_PER_PASS, max_squares(kind, hp), ROWS_PER_PASS // hp.n_pos))


def work_bytes(kind, hp, n_threads):
    """The most memory one encode allocates besides the weights (the plan Projector._embed
    and _vit keep to; test_vision holds an encode to it): the uint8 squares of the picture, the
    rows of all (float32), and one pass at its peak: its patch rows, x and the four (rows,
    n_embd) and one (rows, n_ff) float32 buffers of _vit, a product's activations in the
    weight's partner format (the longest rows: at most float32, or F16 and its float32 values
    for enc_matmul_f16), the attention's scratch per
    thread (a block of queries' scores, a head's V^T and keys) and its positions."""
    rows = squares_per_pass(kind, hp) * hp.n_pos
    p2, side = 3 * hp.patch_size ** 2, hp.image_size
    if kind.tiled:      # the picture resized to its longest edge and to whole tiles, the overview
        big = -(-hp.longest_edge // side) * side
        pictures = 3 * (hp.longest_edge ** 2 + big * big + side * side)
    else:
        pictures = 3 * side * side
    floats = (max_squares(kind, hp) * hp.n_tokens * hp.n_embd_text
              + rows * (p2 + 5 * hp.n_embd + hp.n_ff) + rows * max(p2, hp.n_embd, hp.n_ff) * 3 // 2
              + n_threads * (ATTN_QUERY_ROWS + 2 * hp.head_dim) * hp.n_pos + rows)
    return pictures + 4 * floats


# --- the projector ----------------------------------------------------------------------------

class Projector:
    """A loaded mmproj file: immutable, shareable by requests (encode() holds no state)."""

    def __init__(self):
        raise TypeError("use Projector.load(path, ...)")

    @classmethod
    def load(cls, path, n_threads=None, verified=None, backend=None, max_memory=None):
        from ..system import available_memory, default_threads
        from .backends import backend_class
        self = object.__new__(cls)
        self.path = os.fspath(path)
        self.signer, self.file, self._verified = None, None, verified   # closed if the load fails
        t0 = time.perf_counter()
        try:
            if verified is None:
                self.file = GGUFFile.open(self.path)
            else:   # map the very descriptor the trust layer hashed, up to the signed length
                if os.fspath(verified.path) != self.path:
                    raise ConfigError(f"Projector.load({self.path!r}, verified=...): the "
                                      f"verified file is {verified.path!r}")
                self.signer = verified.signer
                self.file = GGUFFile.from_fd(verified.fd, name=self.path,
                                             size=verified.signed_length)
            self._init(n_threads, backend, max_memory, default_threads, available_memory,
                       backend_class)
        except BaseException:
            self.close()
            raise
        self.load_ms = (time.perf_counter() - t0) * 1000
        return self

    def _init(self, n_threads, backend, max_memory, default_threads, available_memory,
              backend_class):
        f = self.file
        self.kind, self.hp, self._roles = validate(f.metadata, f.tensors)
        self.n_threads = int(n_threads) if n_threads else default_threads()
        if self.n_threads < 1:
            raise ConfigError(f"n_threads={n_threads}: must be >= 1")
        used = [n for n in self._roles.values() if n]
        self.weights_bytes = sum(f.tensors[n].nbytes for n in used)
        self.scratch_bytes = work_bytes(self.kind, self.hp, self.n_threads)
        proj = self._roles.get("input_projection")     # gemma3 keeps a transposed copy
        self.memory_bytes = self.weights_bytes + self.scratch_bytes + (
            f.tensors[proj].nbytes if proj else 0)
        budget = int(max_memory) if max_memory else available_memory()
        if self.memory_bytes > budget:
            raise UnsupportedModelError(
                f"mmproj {os.path.basename(self.path)} needs {self.memory_bytes / 2**20:.1f} MiB "
                f"(weights {self.weights_bytes / 2**20:.1f} MiB + scratch), budget "
                f"{budget / 2**20:.1f} MiB")
        cls = backend_class(backend)
        if cls.name == "reference":
            self._core = self._pool = None
        else:
            from .cpu import _require_core
            self._core = _require_core()
            self._pool = self._core.Pool(self.n_threads)
        self.backend_name = cls.name
        self._vec, self._mat = {}, {}
        for role, name in self._roles.items():
            if name is None:
                continue
            ti = f.tensors[name]
            raw = f.tensor_bytes(name)
            shape = tuple(int(x) for x in ti.shape)
            if len(shape) == 1:
                self._vec[role] = dequantize(raw, ti.type, shape).astype(np.float32).reshape(-1)
            elif role == "position_embd":
                self._vec[role] = dequantize(raw, ti.type, shape).astype(np.float32) \
                    .reshape(shape[1], shape[0])
            elif role == "input_projection":
                # ggml_cont(ggml_transpose(w)): the same type, rows of n_embd (the ViT's width)
                w = dequantize(raw, ti.type, shape).astype(np.float32).reshape(shape[1], shape[0])
                wt = np.ascontiguousarray(w.T)
                if ti.type == GGMLType.F16:
                    wt = wt.astype(np.float16)
                self._mat[role] = (np.frombuffer(wt.tobytes(), np.uint8), int(ti.type),
                                   (shape[1], shape[0]))
            else:
                k = int(np.prod(shape[:-1]))
                self._mat[role] = (raw, int(ti.type), (k, shape[-1]))

    # --- what the service shows -------------------------------------------------------------
    projector_type = property(lambda self: self.kind.name)
    image_size = property(lambda self: self.hp.image_size)
    n_tokens = property(lambda self: self.hp.n_tokens)
    n_embd = property(lambda self: self.hp.n_embd_text)
    markers = property(lambda self: self.kind.markers)
    non_causal = property(lambda self: self.kind.non_causal)

    max_squares = property(lambda self: max_squares(self.kind, self.hp))

    def describe(self):
        hp = self.hp
        return {"projector_type": self.kind.name, "image_size": hp.image_size,
                "patch_size": hp.patch_size, "tokens_per_image": hp.n_tokens * self.max_squares,
                "n_embd": hp.n_embd_text, "vision_n_embd": hp.n_embd,
                "vision_layers": hp.n_layer, "memory_bytes": self.memory_bytes,
                "weights_bytes": self.weights_bytes, "signer": self.signer}

    def check_model(self, model):
        """The text model must read rows of this projector's width (and, for idefics3, have
        the tokens its tile layout names): UnsupportedModelError otherwise."""
        n = int(model.hp.n_embd)
        if n != self.hp.n_embd_text:
            raise UnsupportedModelError(
                f"mmproj {os.path.basename(self.path)} projects to n_embd {self.hp.n_embd_text}, "
                f"model {os.path.basename(getattr(model, 'path', '?'))} has n_embd {n}")
        if self.kind.tiled:     # the tokens its prompt layout looks up
            for piece in ("<fake_token_around_image>", "<global-img>", "\n", "\n\n"):
                self._token(model.tokenizer, piece)

    def close(self):
        if getattr(self, "file", None) is not None:
            self._vec = self._mat = {}
            self.file.close()
            self.file = None
        v, self._verified = getattr(self, "_verified", None), None
        if v is not None and hasattr(v, "close"):
            v.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- encode -----------------------------------------------------------------------------
    def _patch_rows(self, square):
        """uint8 (image_size, image_size, 3) -> float32 (n_patches, 3 * patch^2) patch rows"""
        return patches(normalize(square, self.hp.image_mean, self.hp.image_std), self.hp.patch_size)

    def squares(self, rgb):
        """uint8 (H, W, 3) -> (list of the uint8 squares the encoder sees, resized as mtmd
        does: the tiles row by row then the overview when tiled; the grid of tiles or ())."""
        rgb = np.asarray(rgb)
        if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3 or min(rgb.shape[:2]) < 1:
            raise RequestError(f"image: expected uint8 (height, width, 3) pixels, got "
                               f"{rgb.dtype} {tuple(rgb.shape)}")
        hp = self.hp
        if self.kind.tiled:
            cut, overview, grid = tiles(rgb, hp.image_size, hp.longest_edge, self.kind.resize)
            squares = cut + [overview]
        else:
            squares = [fit_padded(rgb, hp.image_size, PAD_COLOR.get(self.kind.name, (0, 0, 0)),
                                  self.kind.resize)]
            grid = ()
        return squares, grid

    def encode(self, rgb):
        """A decoded picture -> ImageEmbedding (n_tokens rows of the text model's width)."""
        if self.file is None:
            raise RequestError("mmproj is closed")
        squares, grid = self.squares(rgb)
        return ImageEmbedding(embeddings=self._embed(squares, twin=self._core is None),
                              digest=image_digest(np.asarray(rgb)),
                              non_causal=self.kind.non_causal, grid=grid)

    @property
    def squares_per_pass(self):
        """Squares the encoder runs together: up to SQUARES_PER_PASS, ROWS_PER_PASS rows."""
        return squares_per_pass(self.kind, self.hp)

    def _embed(self, squares, twin=False):
        """uint8 squares -> the projected rows of all, in order, squares_per_pass squares per
        encoder pass, each square's patch rows made when its pass starts (a row's bits do not
        depend on its batch). twin: NumPy. The memory this takes: work_bytes."""
        vit, k = self._vit_reference if twin else self._vit, self.squares_per_pass
        out = np.empty((len(squares) * self.hp.n_tokens, self.hp.n_embd_text), np.float32)
        for i in range(0, len(squares), k):
            n_seq = len(squares[i:i + k])
            h = vit(np.concatenate([self._patch_rows(q) for q in squares[i:i + k]]), n_seq)
            n = h.shape[0] // n_seq
            for j in range(n_seq):
                t = (i + j) * self.hp.n_tokens
                out[t:t + self.hp.n_tokens] = self._project(h[j * n:(j + 1) * n], twin)
            del h
        return out

    def _project(self, h, twin):
        """One square's ViT output (n_pos, n_embd) -> its rows for the text model."""
        mm = self._ref_mm if twin else self._mm
        if self.kind.tiled:     # idefics3: pixel shuffle, then mm.model.fc
            return mm(pixel_shuffle(h, self.hp.n_patches_side, self.hp.n_merge), "fc")
        if self.kind.name == "mlp":
            # llama.cpp appends the class token after the patches and then takes rows
            # 1..n_patches (clip.cpp's "patches" input): patch 0 out, the class token in
            y = mm(h[1:], "mm0", "mm0_b")
            if twin:
                y = gelu_ggml(y.astype(np.float64)).astype(np.float32)
            else:
                self._core.enc_act(y, None, None, self._pool)
            return mm(y, "mm2", "mm2_b")
        return mm(self._pool_norm(h), "input_projection")

    def _inputs(self, x, n_seq, mm):
        """Patch rows -> the first layer's input: patch embeddings (+ the class token after
        each square's patches, mlp) + positions, pre-normed (mlp)."""
        v = self._vec
        x = mm(x, "patch_embd", "patch_bias")
        if "class_embd" in v:
            n = x.shape[0] // n_seq
            x = np.concatenate([r for i in range(n_seq)
                                for r in (x[i * n:(i + 1) * n], v["class_embd"][None])])
        pos = v["position_embd"]
        for i in range(n_seq):
            x[i * len(pos):(i + 1) * len(pos)] += pos
        return x

    def _ffn_act(self, h, bias, twin):
        """In place: the ViT FFN's activation after its up product's bias."""
        if self.hp.act == "gelu_quick":     # ggml's F16 table of x * sigmoid(1.702 x)
            if bias is not None:
                h += bias
            np.take(gelu_quick_table(), h.astype(np.float16).view(np.uint16), out=h)
        elif twin:
            h[...] = gelu_ggml((h + (0 if bias is None else bias)).astype(np.float64))
        else:
            self._core.enc_act(h, bias, None, self._pool)

    def _mm(self, x, role, bias=None, out=None):
        raw, qtype, (k, n) = self._mat[role]
        y = np.empty((x.shape[0], n), np.float32) if out is None else out
        x = np.ascontiguousarray(x, np.float32)
        if qtype != GGMLType.F16 or self._core.enc_matmul_f16(y, raw, x, self._pool) is None:
            self._core.matmul(y, raw, qtype, x, self._pool)
        b = self._vec.get(bias) if bias else None
        if b is not None:
            y += b
        return y

    def _vit(self, x, n_seq):
        """SigLIP over n_seq squares' patch rows (n_seq * n_patches, K), all in each product;
        attention per square. Besides x, four (rows, n_embd) buffers and one (rows, n_ff),
        reused by every layer (work_bytes)."""
        hp, core, pool, v = self.hp, self._core, self._pool, self._vec
        x = self._inputs(x, n_seq, self._mm)
        n = x.shape[0] // n_seq
        if "pre_ln" in v:
            core.enc_norm(x, v["pre_ln"], v["pre_ln_b"], hp.eps, None, None, pool)
        starts = np.arange(n_seq + 1, dtype=np.int64) * n
        scale = 1.0 / math.sqrt(hp.head_dim)
        cur, q, k, vv = (np.empty_like(x) for _ in range(4))
        h = np.empty((x.shape[0], hp.n_ff), np.float32)
        for il in range(hp.n_layer_run):
            b = f"v.blk.{il}."
            np.copyto(cur, x)
            core.enc_norm(cur, v[b + "ln1"], v[b + "ln1_b"], hp.eps, None, None, pool)
            for r, out in (("attn_q", q), ("attn_k", k), ("attn_v", vv)):
                self._mm(cur, b + r, out=out)
            core.enc_attention(cur, q, k, vv, starts, hp.n_head, scale, v.get(b + "attn_q_b"),
                               v.get(b + "attn_k_b"), v.get(b + "attn_v_b"), 0.0, pool)
            x += self._mm(cur, b + "attn_out", b + "attn_out_b", out=q)
            np.copyto(cur, x)
            core.enc_norm(cur, v[b + "ln2"], v[b + "ln2_b"], hp.eps, None, None, pool)
            self._mm(cur, b + "ffn_up", out=h)
            self._ffn_act(h, v.get(b + "ffn_up_b"), False)
            x += self._mm(h, b + "ffn_down", b + "ffn_down_b", out=q)
        if "post_ln" in v:
            core.enc_norm(x, v["post_ln"], v["post_ln_b"], hp.eps, None, None, pool)
        return x

    def _pool_norm(self, x):
        """gemma3: n_merge x n_merge average pooling (ggml_pool_2d: a float sum in row, column
        order, then / k^2), then RMSNorm (sum of squares in double) * soft_emb_norm."""
        hp = self.hp
        s, m = hp.n_patches_side, hp.n_merge
        g = x.reshape(s // m, m, s // m, m, -1)
        acc = np.zeros((s // m, s // m, x.shape[1]), np.float32)
        for ky in range(m):
            for kx in range(m):
                acc += g[:, ky, :, kx]
        acc = (acc / np.float32(m * m)).reshape(-1, x.shape[1])
        ms = (acc.astype(np.float64) ** 2).mean(-1, keepdims=True)
        scale = (1.0 / np.sqrt((ms + hp.eps).astype(np.float32))).astype(np.float32)
        return (acc * scale) * self._vec["soft_emb_norm"]

    # --- the slow twin ----------------------------------------------------------------------
    def _w(self, role):
        """float32 (n, k) weight of a product: what the compiled kernel multiplies."""
        raw, qtype, (k, n) = self._mat[role]
        return dequantize(raw, GGMLType(qtype), (k, n)).astype(np.float32).reshape(n, k)

    def _ref_mm(self, x, role, bias=None):
        raw, qtype, _ = self._mat[role]
        if qtype == GGMLType.F16:       # ggml multiplies F16 weights with F16 activations
            x = x.astype(np.float16)
        y = (x.astype(np.float64) @ self._w(role).T.astype(np.float64)).astype(np.float32)
        b = self._vec.get(bias) if bias else None
        return y + b if b is not None else y

    def _vit_reference(self, x, n_seq):
        from .encoder import layer_norm
        hp, v = self.hp, self._vec
        H, D = hp.n_head, hp.head_dim
        x = self._inputs(x, n_seq, self._ref_mm)
        if "pre_ln" in v:
            x = layer_norm(x, v["pre_ln"], v["pre_ln_b"], hp.eps)
        for il in range(hp.n_layer_run):
            b = f"v.blk.{il}."
            cur = layer_norm(x, v[b + "ln1"], v[b + "ln1_b"], hp.eps)
            q, k, vv = (self._ref_mm(cur, b + r, b + r + "_b").reshape(n_seq, -1, H, D)
                        .transpose(0, 2, 1, 3) for r in ("attn_q", "attn_k", "attn_v"))
            sc = (q.astype(np.float64) @ k.transpose(0, 1, 3, 2)) / math.sqrt(D)
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)     # (n_seq, H, n, n): each square on its own
            att = (sc @ vv).transpose(0, 2, 1, 3).reshape(x.shape).astype(np.float32)
            x = x + self._ref_mm(att, b + "attn_out", b + "attn_out_b")
            cur = layer_norm(x, v[b + "ln2"], v[b + "ln2_b"], hp.eps)
            h = self._ref_mm(cur, b + "ffn_up")
            self._ffn_act(h, v.get(b + "ffn_up_b"), True)
            x = x + self._ref_mm(h, b + "ffn_down", b + "ffn_down_b")
        if "post_ln" in v:
            x = layer_norm(x, v["post_ln"], v["post_ln_b"], hp.eps)
        return x

    # --- prompts ----------------------------------------------------------------------------
    def _layout(self, emb, rows, add, add_id, tok):
        """One image's place in the prompt as mtmd.cpp lays it out: add(text) tokenizes a
        piece (special tokens parsed), add_id(id) appends one id."""
        if not self.kind.tiled:
            before, after = self.kind.markers
            add(before)
            for r in rows:
                add_id(r)
            add(after)
            return
        # idefics3: each tile after "<fake_token_around_image><row_Y_col_X>", "\n" between
        # rows of tiles; then "\n\n" <fake_token_around_image> <global-img> (tokens found by
        # their exact text, as mtmd's lookup_token) and the overview, closed by
        # <fake_token_around_image>
        gy, gx = emb.grid
        n = len(rows) // (gy * gx + 1)
        if n * (gy * gx + 1) != len(rows):
            raise RequestError(f"image of {len(rows)} rows does not split into {gy}x{gx} tiles "
                               "and an overview")
        for y in range(gy):
            for x in range(gx):
                add(f"<fake_token_around_image><row_{y + 1}_col_{x + 1}>")
                k = (y * gx + x) * n
                for r in rows[k:k + n]:
                    add_id(r)
            if y != gy - 1:
                add_id(self._token(tok, "\n"))
        for piece in ("\n\n", "<fake_token_around_image>", "<global-img>"):
            add_id(self._token(tok, piece))
        for r in rows[gy * gx * n:]:
            add_id(r)
        add_id(self._token(tok, "<fake_token_around_image>"))

    def _token(self, tok, text):
        """The id of the token whose text is exactly `text` (llama.cpp's lookup_token)."""
        cache = self.__dict__.setdefault("_tokens", {})
        key = (id(tok), text)
        if key not in cache:
            want = text.encode()
            hit = next((i for i in range(tok.n_vocab) if tok.token_piece(i) == want), None)
            if hit is None:
                raise UnsupportedModelError(f"the text model has no token {text!r}, which "
                                            f"{self.kind.name} images need")
            cache[key] = hit
        return cache[key]

    def prompt_ids(self, model, text, images, add_special=True, marker=MEDIA_MARKER,
                   marked=False):
        """A rendered prompt holding `marker` once per image -> token ids, as mtmd_tokenize
        lays them out: each piece of text, and each image's markers (proj.markers), tokenized
        on its own (special tokens parsed), the image as its pseudo ids, BOS/EOS around the
        whole as the model asks. marker: pass a per-request string user text cannot contain
        (the default is llama.cpp's); marked: the text holds tokenizer.defuse()d content."""
        parts = text.split(marker)
        if len(parts) - 1 != len(images):
            raise RequestError(f"prompt holds {len(parts) - 1} image markers for "
                               f"{len(images)} images")
        tok, nv = model.tokenizer, model.hp.n_vocab
        ids = []

        def add(piece, mk=False):
            if piece:
                ids.extend(tok.encode(piece, add_special=False, parse_special=True, marked=mk))

        for i, part in enumerate(parts):
            add(part, marked)
            if i < len(images):
                self._layout(images[i], images[i].token_ids(nv), add, ids.append, tok)
        if add_special:     # what encode(add_special=True) puts before and after a text
            ids = list(tok._first) + ids + list(tok._last)
        return ids


# --- a session's images ----------------------------------------------------------------------

class ImageTable:
    """The images a session's prompts refer to: pseudo id -> embedding row (engine/model.py's
    Session.add_image fills it; its batches are staged from it)."""

    def __init__(self, n_vocab):
        self.n_vocab = n_vocab
        self._by_base = {}          # base id -> ImageEmbedding
        self._bases = []            # sorted

    def add(self, emb):
        b = emb.base_id(self.n_vocab)
        old = self._by_base.get(b)
        if old is not None and old.digest != emb.digest:
            raise RequestError("two images share pseudo ids in one session (a digest collision)")
        if old is None:
            self._by_base[b] = emb
            self._bases = sorted(self._by_base)

    def copy(self):
        """A table of its own holding the same (immutable) embeddings: Session.fork."""
        t = ImageTable(self.n_vocab)
        t._by_base, t._bases = dict(self._by_base), list(self._bases)
        return t

    def lookup(self, t):
        """(ImageEmbedding, row) of pseudo id t, or None."""
        import bisect
        i = bisect.bisect_right(self._bases, t) - 1
        if i < 0:
            return None
        emb = self._by_base[self._bases[i]]
        r = t - self._bases[i]
        return (emb, r) if r < emb.n_tokens else None

    def unknown(self, ids):
        """The first id >= n_vocab no image here explains, or None."""
        return next((t for t in ids if t >= self.n_vocab and self.lookup(t) is None), None)

    def spans(self, ids):
        """[(start, end)] index ranges of ids holding consecutive rows of one non-causal image."""
        out, i, n = [], 0, len(ids)
        while i < n:
            hit = self.lookup(ids[i]) if ids[i] >= self.n_vocab else None
            if hit is None or not hit[0].non_causal:
                i += 1
                continue
            j = i + 1
            while j < n and ids[j] == ids[j - 1] + 1 and self.lookup(ids[j]) is not None \
                    and self.lookup(ids[j])[0] is hit[0]:
                j += 1
            out.append((i, j))
            i = j
        return out

    def cut(self, ids, n):
        """n, or the nearest cut that splits no non-causal image of ids[:...] (back to the
        image's start when it does not start ids, else past its end) and leaves at most one
        in the batch (a second image starts the next one: a pass has one non-causal span)."""
        for k, (a, b) in enumerate(s for s in self.spans(ids) if s[0] < n):
            if k == 1:
                return a
            if a < n < b:
                return a if a > 0 else b
        return n

    def rows(self, ids):
        """(indices into ids of image rows int64, their embeddings float32 (k, n_embd))."""
        idx = [i for i, t in enumerate(ids) if t >= self.n_vocab]
        if not idx:
            return None
        embd = np.stack([self.lookup(ids[i])[0].embeddings[self.lookup(ids[i])[1]] for i in idx])
        return np.asarray(idx, np.int64), np.ascontiguousarray(embd, np.float32)

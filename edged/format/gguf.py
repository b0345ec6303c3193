"""GGUF: the container format. Every piece of format knowledge in edged lives in this module:
magic, versions, value types, ggml type ids and block sizes, metadata key names, the reader.

The reader trusts nothing. Each count, length, offset and size is checked against the bytes
left in the file and against overflow before it is used; a malformed file raises
ModelFormatError naming the field, the value and the file offset. Tensor data is mapped
read-only from the open file descriptor and handed out as zero-copy views; nothing in the
data section is touched at open.
"""
import enum
import mmap
import os
import stat
import struct
from dataclasses import dataclass

import numpy as np

from .._gguf_scan import scan_strings   # compiled; no silent slow fallback
from ..errors import MetadataValueError, ModelFormatError

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
GGUF_DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_NAME_BYTES = 63                 # GGML_MAX_NAME is 64 including the terminating NUL
MAX_STRING_BYTES = 1 << 30          # 1 GiB: no legitimate key, value or token is larger
MAX_ARRAY_BYTES = 1 << 30
# What a metadata number may hold where edged uses it: llama.cpp keeps hyperparameters in
# (u)int32 and float; the compiled core takes them as C int and float.
INT32_MAX = 2**31 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


class ValueType(enum.IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size value types: struct format and numpy dtype (little-endian).
_SCALAR = {
    ValueType.UINT8: ("<B", np.dtype("<u1")),
    ValueType.INT8: ("<b", np.dtype("<i1")),
    ValueType.UINT16: ("<H", np.dtype("<u2")),
    ValueType.INT16: ("<h", np.dtype("<i2")),
    ValueType.UINT32: ("<I", np.dtype("<u4")),
    ValueType.INT32: ("<i", np.dtype("<i4")),
    ValueType.FLOAT32: ("<f", np.dtype("<f4")),
    ValueType.BOOL: ("<?", np.dtype("?")),
    ValueType.UINT64: ("<Q", np.dtype("<u8")),
    ValueType.INT64: ("<q", np.dtype("<i8")),
    ValueType.FLOAT64: ("<d", np.dtype("<f8")),
}


class GGMLType(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


class FileType(enum.IntEnum):
    """general.file_type: llama.cpp's llama_ftype (the quantization mix of a whole file)."""
    ALL_F32 = 0
    MOSTLY_F16 = 1
    MOSTLY_Q4_0 = 2
    MOSTLY_Q4_1 = 3
    MOSTLY_Q8_0 = 7
    MOSTLY_Q5_0 = 8
    MOSTLY_Q5_1 = 9
    MOSTLY_Q2_K = 10
    MOSTLY_Q3_K_S = 11
    MOSTLY_Q3_K_M = 12
    MOSTLY_Q3_K_L = 13
    MOSTLY_Q4_K_S = 14
    MOSTLY_Q4_K_M = 15
    MOSTLY_Q5_K_S = 16
    MOSTLY_Q5_K_M = 17
    MOSTLY_Q6_K = 18
    MOSTLY_Q2_K_S = 21
    MOSTLY_IQ4_NL = 25
    MOSTLY_IQ4_XS = 30
    MOSTLY_BF16 = 32
    MOSTLY_MXFP4_MOE = 38


QUANTIZATION_VERSION = 2   # general.quantization_version written by current llama.cpp


@dataclass(frozen=True)
class TypeInfo:
    block_size: int     # elements per block
    type_size: int      # bytes per block


QK_K = 256  # super-block size of the K-quants

TYPE_INFO = {
    GGMLType.F32: TypeInfo(1, 4),
    GGMLType.F16: TypeInfo(1, 2),
    GGMLType.Q4_0: TypeInfo(32, 18),
    GGMLType.Q4_1: TypeInfo(32, 20),
    GGMLType.Q5_0: TypeInfo(32, 22),
    GGMLType.Q5_1: TypeInfo(32, 24),
    GGMLType.Q8_0: TypeInfo(32, 34),
    GGMLType.Q8_1: TypeInfo(32, 36),
    GGMLType.Q2_K: TypeInfo(QK_K, 84),
    GGMLType.Q3_K: TypeInfo(QK_K, 110),
    GGMLType.Q4_K: TypeInfo(QK_K, 144),
    GGMLType.Q5_K: TypeInfo(QK_K, 176),
    GGMLType.Q6_K: TypeInfo(QK_K, 210),
    GGMLType.Q8_K: TypeInfo(QK_K, 292),
    GGMLType.IQ2_XXS: TypeInfo(QK_K, 66),
    GGMLType.IQ2_XS: TypeInfo(QK_K, 74),
    GGMLType.IQ3_XXS: TypeInfo(QK_K, 98),
    GGMLType.IQ1_S: TypeInfo(QK_K, 50),
    GGMLType.IQ4_NL: TypeInfo(32, 18),
    GGMLType.IQ3_S: TypeInfo(QK_K, 110),
    GGMLType.IQ2_S: TypeInfo(QK_K, 82),
    GGMLType.IQ4_XS: TypeInfo(QK_K, 136),
    GGMLType.I8: TypeInfo(1, 1),
    GGMLType.I16: TypeInfo(1, 2),
    GGMLType.I32: TypeInfo(1, 4),
    GGMLType.I64: TypeInfo(1, 8),
    GGMLType.F64: TypeInfo(1, 8),
    GGMLType.IQ1_M: TypeInfo(QK_K, 56),
    GGMLType.BF16: TypeInfo(1, 2),
    GGMLType.TQ1_0: TypeInfo(QK_K, 54),
    GGMLType.TQ2_0: TypeInfo(QK_K, 66),
    GGMLType.MXFP4: TypeInfo(32, 17),
}


def row_bytes(qtype, n):
    """Bytes of a row of `n` elements of `qtype` (n must be a multiple of the block size)."""
    info = TYPE_INFO[GGMLType(qtype)]
    return n // info.block_size * info.type_size


class Key:
    """GGUF metadata key names. Per-architecture keys are templates: Key.arch(Key.X, arch)."""

    # general
    ARCHITECTURE = "general.architecture"
    QUANTIZATION_VERSION = "general.quantization_version"
    ALIGNMENT = "general.alignment"
    NAME = "general.name"
    FILE_TYPE = "general.file_type"
    GENERAL_TYPE = "general.type"           # "model", or "imatrix" for llama-imatrix's files

    # importance matrices (llama-imatrix), and what llama-quantize records of the one it used
    IMATRIX_DATASETS = "imatrix.datasets"
    IMATRIX_CHUNK_COUNT = "imatrix.chunk_count"
    QUANTIZE_IMATRIX_FILE = "quantize.imatrix.file"
    QUANTIZE_IMATRIX_DATASET = "quantize.imatrix.dataset"
    QUANTIZE_IMATRIX_N_ENTRIES = "quantize.imatrix.entries_count"
    QUANTIZE_IMATRIX_N_CHUNKS = "quantize.imatrix.chunks_count"

    # per architecture ("{arch}.…")
    VOCAB_SIZE = "{arch}.vocab_size"
    CONTEXT_LENGTH = "{arch}.context_length"
    EMBEDDING_LENGTH = "{arch}.embedding_length"
    BLOCK_COUNT = "{arch}.block_count"
    EXPERT_COUNT = "{arch}.expert_count"
    EXPERT_USED_COUNT = "{arch}.expert_used_count"
    EXPERT_FEED_FORWARD_LENGTH = "{arch}.expert_feed_forward_length"
    EXPERT_SHARED_FEED_FORWARD_LENGTH = "{arch}.expert_shared_feed_forward_length"
    EMBEDDING_SCALE = "{arch}.embedding_scale"
    RESIDUAL_SCALE = "{arch}.residual_scale"
    LOGIT_SCALE = "{arch}.logit_scale"
    ATTENTION_SCALE = "{arch}.attention.scale"
    FEED_FORWARD_LENGTH = "{arch}.feed_forward_length"
    HEAD_COUNT = "{arch}.attention.head_count"
    HEAD_COUNT_KV = "{arch}.attention.head_count_kv"
    KEY_LENGTH = "{arch}.attention.key_length"
    VALUE_LENGTH = "{arch}.attention.value_length"
    LAYERNORM_EPS = "{arch}.attention.layer_norm_epsilon"
    CAUSAL = "{arch}.attention.causal"
    POOLING_TYPE = "{arch}.pooling_type"
    CLASSIFIER_OUTPUT_LABELS = "{arch}.classifier.output_labels"
    LAYERNORM_RMS_EPS = "{arch}.attention.layer_norm_rms_epsilon"
    SLIDING_WINDOW = "{arch}.attention.sliding_window"
    SLIDING_WINDOW_PATTERN = "{arch}.attention.sliding_window_pattern"
    ATTN_LOGIT_SOFTCAPPING = "{arch}.attn_logit_softcapping"
    FINAL_LOGIT_SOFTCAPPING = "{arch}.final_logit_softcapping"
    ROPE_DIMENSION_COUNT = "{arch}.rope.dimension_count"
    ROPE_FREQ_BASE = "{arch}.rope.freq_base"
    ROPE_FREQ_BASE_SWA = "{arch}.rope.freq_base_swa"
    ROPE_SCALE_LINEAR = "{arch}.rope.scale_linear"
    ROPE_SCALING_TYPE = "{arch}.rope.scaling.type"
    ROPE_SCALING_FACTOR = "{arch}.rope.scaling.factor"
    ROPE_SCALING_ATTN_FACTOR = "{arch}.rope.scaling.attn_factor"
    ROPE_SCALING_ORIG_CTX_LEN = "{arch}.rope.scaling.original_context_length"
    ROPE_SCALING_FINETUNED = "{arch}.rope.scaling.finetuned"
    NEXTN_PREDICT_LAYERS = "{arch}.nextn_predict_layers"
    SHORTCONV_L_CACHE = "{arch}.shortconv.l_cache"
    # gemma3n
    ALTUP_ACTIVE_IDX = "{arch}.altup.active_idx"
    ALTUP_NUM_INPUTS = "{arch}.altup.num_inputs"
    EMBD_LENGTH_PER_LAYER_INP = "{arch}.embedding_length_per_layer_input"
    SHARED_KV_LAYERS = "{arch}.attention.shared_kv_layers"
    ACTIVATION_SPARSITY_SCALE = "{arch}.activation_sparsity_scale"

    # mmproj files (general.architecture = "clip"; llama.cpp's tools/mtmd/clip-impl.h)
    CLIP_PROJECTOR_TYPE = "clip.projector_type"
    CLIP_VISION_PROJECTOR_TYPE = "clip.vision.projector_type"   # files with several modalities
    CLIP_HAS_VISION = "clip.has_vision_encoder"
    CLIP_USE_GELU = "clip.use_gelu"
    CLIP_USE_SILU = "clip.use_silu"
    CLIP_EMBEDDING_LENGTH = "clip.vision.embedding_length"
    CLIP_FEED_FORWARD_LENGTH = "clip.vision.feed_forward_length"
    CLIP_BLOCK_COUNT = "clip.vision.block_count"
    CLIP_PROJECTION_DIM = "clip.vision.projection_dim"
    CLIP_HEAD_COUNT = "clip.vision.attention.head_count"
    CLIP_HEAD_COUNT_KV = "clip.vision.attention.head_count_kv"
    CLIP_LAYERNORM_EPS = "clip.vision.attention.layer_norm_epsilon"
    CLIP_IMAGE_SIZE = "clip.vision.image_size"
    CLIP_PATCH_SIZE = "clip.vision.patch_size"
    CLIP_IMAGE_MEAN = "clip.vision.image_mean"
    CLIP_IMAGE_STD = "clip.vision.image_std"
    CLIP_SCALE_FACTOR = "clip.vision.projector.scale_factor"
    CLIP_PREPROC_IMAGE_SIZE = "clip.vision.preproc_image_size"  # idefics3: the longest edge
    CLIP_IMAGE_GRID_PINPOINTS = "clip.vision.image_grid_pinpoints"  # LLaVA-1.6 tiling
    ROPE_DIMENSION_SECTIONS = "{arch}.rope.dimension_sections"
    FULL_ATTENTION_INTERVAL = "{arch}.full_attention_interval"
    ATTENTION_RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"
    SSM_CONV_KERNEL = "{arch}.ssm.conv_kernel"
    SSM_INNER_SIZE = "{arch}.ssm.inner_size"
    SSM_STATE_SIZE = "{arch}.ssm.state_size"
    SSM_TIME_STEP_RANK = "{arch}.ssm.time_step_rank"
    SSM_GROUP_COUNT = "{arch}.ssm.group_count"

    # tokenizer
    TOKENIZER_MODEL = "tokenizer.ggml.model"
    PRE = "tokenizer.ggml.pre"
    TOKENS = "tokenizer.ggml.tokens"
    TOKEN_TYPE = "tokenizer.ggml.token_type"
    TOKEN_TYPE_COUNT = "tokenizer.ggml.token_type_count"
    SCORES = "tokenizer.ggml.scores"
    MERGES = "tokenizer.ggml.merges"
    BOS_ID = "tokenizer.ggml.bos_token_id"
    EOS_ID = "tokenizer.ggml.eos_token_id"
    EOT_ID = "tokenizer.ggml.eot_token_id"
    EOM_ID = "tokenizer.ggml.eom_token_id"
    UNK_ID = "tokenizer.ggml.unknown_token_id"
    SEP_ID = "tokenizer.ggml.seperator_token_id"   # sic: the GGUF spelling
    PAD_ID = "tokenizer.ggml.padding_token_id"
    MASK_ID = "tokenizer.ggml.mask_token_id"
    FIM_PRE_ID = "tokenizer.ggml.fim_pre_token_id"
    FIM_SUF_ID = "tokenizer.ggml.fim_suf_token_id"
    FIM_MID_ID = "tokenizer.ggml.fim_mid_token_id"
    FIM_PAD_ID = "tokenizer.ggml.fim_pad_token_id"
    FIM_REP_ID = "tokenizer.ggml.fim_rep_token_id"
    FIM_SEP_ID = "tokenizer.ggml.fim_sep_token_id"
    PREFIX_ID = "tokenizer.ggml.prefix_token_id"    # older files' FIM prefix/suffix/middle
    SUFFIX_ID = "tokenizer.ggml.suffix_token_id"
    MIDDLE_ID = "tokenizer.ggml.middle_token_id"
    ADD_BOS = "tokenizer.ggml.add_bos_token"
    ADD_EOS = "tokenizer.ggml.add_eos_token"
    ADD_SEP = "tokenizer.ggml.add_sep_token"
    ADD_PREFIX = "tokenizer.ggml.add_space_prefix"
    NORMALIZER_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"
    NORMALIZER_STRIP_ACCENTS = "tokenizer.ggml.normalizer.strip_accents"
    REMOVE_EXTRA_WS = "tokenizer.ggml.remove_extra_whitespaces"
    CHAT_TEMPLATE = "tokenizer.chat_template"
    CHAT_TEMPLATE_N = "tokenizer.chat_template.{name}"

    @staticmethod
    def arch(template, arch):
        return template.format(arch=arch)


def check_number(name, v, kind, lo=0, hi=None, positive=False):
    """Metadata value `v` of key `name` as `kind` (int or float), type- and range-checked:
    ints in lo..hi (default INT32_MAX), floats finite as float32 and >= lo (> 0 if positive).
    Raises MetadataValueError naming the key and the value. GGUF integers are accepted as
    floats (a rope.freq_base written as u32); bools, strings and arrays are refused."""
    if isinstance(v, (bool, np.bool_)) or isinstance(v, (str, list, np.ndarray)):
        ok = False
    else:
        ok = isinstance(v, (int, np.integer)) or kind is float and isinstance(v, (float, np.floating))
    if not ok:
        raise MetadataValueError(f"{name} must be {'an integer' if kind is int else 'a number'}, "
                                 f"got {v!r}")
    if kind is int:
        v, hi = int(v), INT32_MAX if hi is None else hi
    else:
        v, hi = float(v), FLOAT32_MAX if hi is None else hi
        if not abs(v) <= FLOAT32_MAX:
            raise MetadataValueError(f"{name} must be a finite float32, got {v!r}")
    if positive and v <= 0 or v < lo:
        raise MetadataValueError(f"{name} must be positive, got {v!r}" if positive or lo == 1
                                 else f"{name} must be at least {lo}, got {v!r}")
    if v > hi:
        raise MetadataValueError(f"{name} must be at most {hi}, got {v!r}")
    return v


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: GGMLType
    shape: tuple        # GGUF/ggml order: shape[0] (ne0) is the row length
    offset: int         # absolute file offset of the data
    nbytes: int
    n_elements: int


class _Cursor:
    """Bounds-checked little-endian reads over the mapped header."""

    __slots__ = ("buf", "pos", "end", "name")

    def __init__(self, buf, pos, end, name):
        self.buf, self.pos, self.end, self.name = buf, pos, end, name

    def fail(self, what, value=None, at=None):
        at = self.pos if at is None else at
        shown = "" if value is None else f" (value {value})"
        raise ModelFormatError(f"{self.name}: {what}{shown} at offset {at}")

    def need(self, n, what):
        if n < 0 or n > self.end - self.pos:
            self.fail(f"{what}: needs {n} bytes but only {max(self.end - self.pos, 0)} remain "
                      f"(file truncated or length corrupt)")

    def unpack(self, fmt, size, what):
        self.need(size, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def u32(self, what):
        return self.unpack("<I", 4, what)

    def u64(self, what):
        return self.unpack("<Q", 8, what)

    def string(self, what):
        start = self.pos
        n = self.u64(f"{what} length")
        if n > MAX_STRING_BYTES:
            self.fail(f"{what} length over 1 GiB", n, start)
        self.need(n, f"{what} of {n} bytes")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw.decode("utf-8", "surrogateescape")


def _read_string_array(cur, count, what):
    start = cur.pos
    # Each element takes at least its 8-byte length prefix.
    if count > (cur.end - cur.pos) // 8:
        cur.fail(f"{what}: array of {count} strings cannot fit in the {cur.end - cur.pos} bytes left",
                 count, start)
    values, pos, err = scan_strings(cur.buf, cur.pos, cur.end, count, MAX_STRING_BYTES)
    if err is not None:
        index, at, n = err
        cur.fail(f"{what}[{index}]: string of {n} bytes runs past the end of the file or over 1 GiB",
                 n, at)
    cur.pos = pos
    return values


def _read_value(cur, vtype, what):
    if vtype in _SCALAR:
        fmt, dt = _SCALAR[vtype]
        return cur.unpack(fmt, dt.itemsize, what)
    if vtype == ValueType.STRING:
        return cur.string(what)
    if vtype == ValueType.ARRAY:
        at = cur.pos
        etype = cur.u32(f"{what} array element type")
        count = cur.u64(f"{what} array length")
        if etype == ValueType.ARRAY:
            cur.fail(f"{what}: nested arrays are not supported", None, at)
        if etype == ValueType.STRING:
            return _read_string_array(cur, count, what)
        if etype not in _SCALAR:
            cur.fail(f"{what}: unknown array element type", etype, at)
        dt = _SCALAR[ValueType(etype)][1]
        if count > MAX_ARRAY_BYTES // dt.itemsize:
            cur.fail(f"{what}: array of {count} elements is over 1 GiB", count, at)
        n = count * dt.itemsize
        cur.need(n, f"{what}: array of {count} x {ValueType(etype).name}")
        arr = np.frombuffer(cur.buf, dtype=dt, count=count, offset=cur.pos).copy()
        cur.pos += n
        return arr
    cur.fail(f"{what}: unknown value type", vtype)


_NOT_REGULAR = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
                (stat.S_ISSOCK, "a socket"))


def open_regular(path):
    """A read-only descriptor of `path`, which must be a regular file: a FIFO would block the
    open (hence O_NONBLOCK) or the reads, and a device such as /dev/zero never ends; a file's
    size is what bounds every read of it. Raises ModelFormatError naming what `path` is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = next((name for test, name in _NOT_REGULAR if test(mode)), "a special file")
        raise ModelFormatError(f"{path}: is {what}, not a regular file")
    return fd


class GGUFFile:
    """A parsed, validated GGUF file whose tensor data stays mapped read-only."""

    def __init__(self, mapping, size, name):
        self.name = name
        self.file_size = size
        self._map = mapping
        self.metadata = {}
        self.value_types = {}   # key -> ValueType (and element type for arrays)
        self.tensors = {}
        self._parse()

    # --- construction ----------------------------------------------------------------------
    @classmethod
    def open(cls, path):
        fd = open_regular(path)
        try:
            return cls.from_fd(fd, name=str(path))
        finally:
            os.close(fd)

    @classmethod
    def from_fd(cls, fd, name="<fd>", size=None):
        """Map `fd` read-only and parse it. The caller may close `fd` afterwards. `size`, if
        given, limits the file to its first `size` bytes (e.g. the signed length)."""
        st_size = os.fstat(fd).st_size
        size = st_size if size is None else min(size, st_size)
        if size < 24:
            raise ModelFormatError(f"{name}: file of {size} bytes is too short for a GGUF header "
                                   f"(24 bytes) at offset 0")
        mapping = mmap.mmap(fd, st_size, mmap.MAP_SHARED, mmap.PROT_READ)
        try:
            return cls(mapping, size, name)
        except BaseException:
            mapping.close()
            raise

    def close(self):
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:   # views still exported: the mapping goes when they do
                pass
            self._map = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- access ----------------------------------------------------------------------------
    def get(self, key, default=None):
        return self.metadata.get(key, default)

    def tensor_bytes(self, name):
        """Zero-copy, read-only uint8 view of a tensor's data."""
        t = self.tensors[name]
        return np.frombuffer(self._map, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    @property
    def mapping(self):
        return self._map

    # --- parsing ---------------------------------------------------------------------------
    def _parse(self):
        cur = _Cursor(self._map, 0, self.file_size, self.name)
        magic = bytes(self._map[0:4])
        if magic != GGUF_MAGIC:
            cur.fail(f"bad magic {magic!r}, expected {GGUF_MAGIC!r} (not a GGUF file)")
        cur.pos = 4
        version = cur.u32("version")
        if version not in GGUF_VERSIONS:
            swapped = struct.unpack("<I", struct.pack(">I", version))[0]
            if swapped in GGUF_VERSIONS:
                cur.fail("byte-swapped version: big-endian GGUF files are not supported", version, 4)
            cur.fail(f"unsupported GGUF version {version} "
                     f"(supported: {', '.join(map(str, GGUF_VERSIONS))})", None, 4)
        self.version = version
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        left = cur.end - cur.pos
        # Smallest possible metadata entry: 8-byte key length, 1-byte key, 4-byte type, 1-byte value.
        if n_kv > left // 14:
            cur.fail(f"metadata count cannot fit in the {left} bytes left", n_kv, 16)
        # Smallest tensor info: name length 8 + 1 byte, n_dims 4, one dim 8, type 4, offset 8.
        if n_tensors > left // 33:
            cur.fail(f"tensor count cannot fit in the {left} bytes left", n_tensors, 8)

        for _ in range(n_kv):
            at = cur.pos
            key = cur.string("metadata key")
            if not key:
                cur.fail("empty metadata key", None, at)
            if key in self.metadata:
                cur.fail(f"duplicate metadata key {key!r}", None, at)
            vat = cur.pos
            vtype = cur.u32(f"type of {key!r}")
            if vtype not in ValueType.__members__.values():
                cur.fail(f"unknown value type of {key!r}", vtype, vat)
            self.metadata[key] = _read_value(cur, ValueType(vtype), repr(key))
            self.value_types[key] = ValueType(vtype)

        self.alignment = GGUF_DEFAULT_ALIGNMENT
        if Key.ALIGNMENT in self.metadata:
            a = self.metadata[Key.ALIGNMENT]
            if self.value_types[Key.ALIGNMENT] != ValueType.UINT32 or a == 0 or a & (a - 1):
                raise ModelFormatError(
                    f"{self.name}: {Key.ALIGNMENT} must be a power-of-two u32 "
                    f"(value {a!r}, type {self.value_types[Key.ALIGNMENT].name})")
            self.alignment = int(a)

        infos, seen = [], set()
        for i in range(n_tensors):
            at = cur.pos
            name = cur.string(f"tensor {i} name")
            if not name:
                cur.fail(f"tensor {i} has an empty name", None, at)
            if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
                cur.fail(f"tensor name {name[:80]!r} is {len(name)} bytes, over {MAX_NAME_BYTES}",
                         None, at)
            if name in seen:
                cur.fail(f"duplicate tensor name {name!r}", None, at)
            seen.add(name)
            dat = cur.pos
            n_dims = cur.u32(f"tensor {name!r} dimension count")
            if not 1 <= n_dims <= MAX_DIMS:
                cur.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)", n_dims, dat)
            shape = []
            n_elements = 1
            for d in range(n_dims):
                dat = cur.pos
                ne = cur.u64(f"tensor {name!r} dimension {d}")
                if ne == 0 or ne >= 1 << 63:
                    cur.fail(f"tensor {name!r} dimension {d} is zero or negative", ne, dat)
                n_elements *= ne
                if n_elements >= 1 << 62:
                    cur.fail(f"tensor {name!r} element count overflows", n_elements, dat)
                shape.append(ne)
            tat = cur.pos
            tid = cur.u32(f"tensor {name!r} type")
            try:
                qtype = GGMLType(tid)
            except ValueError:
                cur.fail(f"tensor {name!r} has unknown ggml type", tid, tat)
            info = TYPE_INFO[qtype]
            if shape[0] % info.block_size:
                cur.fail(f"tensor {name!r}: first dimension {shape[0]} is not a multiple of "
                         f"{qtype.name}'s block size {info.block_size}", shape[0], dat)
            nbytes = n_elements // info.block_size * info.type_size
            oat = cur.pos
            offset = cur.u64(f"tensor {name!r} offset")
            if offset % self.alignment:
                cur.fail(f"tensor {name!r} offset is not a multiple of the alignment {self.alignment}",
                         offset, oat)
            infos.append((name, qtype, tuple(shape), offset, nbytes, n_elements, oat))

        header_end = cur.pos
        self.data_offset = -(-header_end // self.alignment) * self.alignment
        prev_end, prev_name = 0, None
        for name, qtype, shape, offset, nbytes, n_elements, oat in infos:
            if offset < prev_end:
                what = "overlaps" if prev_name else "is before"
                raise ModelFormatError(
                    f"{self.name}: tensor {name!r} data at relative offset {offset} {what} "
                    f"{'tensor ' + repr(prev_name) if prev_name else 'the data section'} "
                    f"(ends at {prev_end}); offsets must be increasing (field at offset {oat})")
            start = self.data_offset + offset
            if start + nbytes > self.file_size:
                raise ModelFormatError(
                    f"{self.name}: tensor {name!r} data [{start}, {start + nbytes}) is not within the "
                    f"file ({self.file_size} bytes): file truncated or offset corrupt "
                    f"(field at offset {oat})")
            self.tensors[name] = TensorInfo(name, qtype, shape, start, nbytes, n_elements)
            prev_end, prev_name = offset + nbytes, name

    # --- summaries -------------------------------------------------------------------------
    def totals_by_type(self):
        out = {}
        for t in self.tensors.values():
            n, b = out.get(t.type.name, (0, 0))
            out[t.type.name] = (n + 1, b + t.nbytes)
        return out


# --- writer ---------------------------------------------------------------------------------
_NP_TO_VTYPE = {np.dtype(dt): vt for vt, (_, dt) in _SCALAR.items()}


class GGUFWriter:
    """Streaming GGUF v3 writer: declare metadata and tensors, write the header, then each
    tensor's bytes in declaration order (so a big model is never held in memory).

        w = GGUFWriter(alignment=32)
        w.add(Key.ARCHITECTURE, "llama")                 # type inferred, or pass vtype=
        w.add_tensor("token_embd.weight", (n_embd, n_vocab), GGMLType.Q4_K)   # ggml order
        with open(tmp, "wb") as f:
            w.write_header(f)
            for name in w.tensor_names: w.write_tensor(f, name, data_uint8)
    """

    def __init__(self, alignment=GGUF_DEFAULT_ALIGNMENT):
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment {alignment} is not a power of two")
        self.alignment = alignment
        self.kv = {}          # key -> (ValueType, value, element ValueType or None)
        self.tensors = {}     # name -> (shape, GGMLType, relative offset, nbytes)
        self._data_size = 0
        self._next = 0
        if alignment != GGUF_DEFAULT_ALIGNMENT:
            self.add(Key.ALIGNMENT, alignment, ValueType.UINT32)

    @property
    def tensor_names(self):
        return list(self.tensors)

    def add(self, key, value, vtype=None, element_type=None):
        """Metadata entry. Without vtype: str -> STRING, bool -> BOOL, int -> INT64 if it does
        not fit UINT32 else UINT32, float -> FLOAT32, list[str] -> STRING array, numpy arrays
        by dtype."""
        if vtype is None:
            vtype, element_type = self._infer(value)
        if vtype == ValueType.ARRAY and element_type is None:
            element_type = self._infer(value)[1]
        self.kv[key] = (ValueType(vtype), value, element_type)

    @staticmethod
    def _infer(value):
        if isinstance(value, str):
            return ValueType.STRING, None
        if isinstance(value, (bool, np.bool_)):
            return ValueType.BOOL, None
        if isinstance(value, (int, np.integer)):
            return (ValueType.UINT32 if 0 <= value < 1 << 32 else ValueType.INT64), None
        if isinstance(value, (float, np.floating)):
            return ValueType.FLOAT32, None
        if isinstance(value, np.ndarray):
            vt = _NP_TO_VTYPE.get(value.dtype.newbyteorder("<"))
            if vt is None:
                raise ValueError(f"no GGUF element type for numpy dtype {value.dtype}")
            return ValueType.ARRAY, vt
        if isinstance(value, (list, tuple)):
            if all(isinstance(v, str) for v in value):
                return ValueType.ARRAY, ValueType.STRING
            return ValueType.ARRAY, GGUFWriter._infer(np.asarray(value))[1]
        raise ValueError(f"cannot infer a GGUF value type for {type(value).__name__}")

    def add_tensor(self, name, shape, qtype):
        """Declare a tensor (shape in GGUF/ggml order, ne0 first)."""
        qtype = GGMLType(qtype)
        info = TYPE_INFO[qtype]
        shape = tuple(int(s) for s in shape)
        if name in self.tensors:
            raise ValueError(f"duplicate tensor {name!r}")
        if not 1 <= len(shape) <= MAX_DIMS or shape[0] % info.block_size:
            raise ValueError(f"tensor {name!r}: bad shape {shape} for {qtype.name}")
        n = int(np.prod(shape))
        nbytes = n // info.block_size * info.type_size
        self.tensors[name] = (shape, qtype, self._data_size, nbytes)
        self._data_size += -(-nbytes // self.alignment) * self.alignment

    # encoding
    @staticmethod
    def _string(s):
        b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
        return struct.pack("<Q", len(b)) + b

    def _value(self, vtype, value, etype):
        if vtype in _SCALAR:
            return struct.pack(_SCALAR[vtype][0], value)
        if vtype == ValueType.STRING:
            return self._string(value)
        if etype == ValueType.STRING:
            return struct.pack("<IQ", etype, len(value)) + b"".join(self._string(v) for v in value)
        arr = np.asarray(value, dtype=_SCALAR[etype][1])
        return struct.pack("<IQ", etype, arr.size) + arr.tobytes()

    def header_bytes(self):
        out = [GGUF_MAGIC, struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))]
        for key, (vt, value, et) in self.kv.items():
            out += [self._string(key), struct.pack("<I", vt), self._value(vt, value, et)]
        for name, (shape, qtype, off, _) in self.tensors.items():
            out += [self._string(name), struct.pack("<I", len(shape)),
                    struct.pack(f"<{len(shape)}Q", *shape), struct.pack("<IQ", qtype, off)]
        head = b"".join(out)
        return head + b"\0" * (-len(head) % self.alignment)

    def write_header(self, f):
        f.write(self.header_bytes())
        self._next = 0

    def write_tensor(self, f, name, data):
        """Write the bytes of the next declared tensor (order is checked), padded. `data` is
        an array / bytes, or an iterable of arrays written one after the other."""
        names = list(self.tensors)
        if self._next >= len(names) or names[self._next] != name:
            want = names[self._next] if self._next < len(names) else None
            raise ValueError(f"tensor {name!r} written out of order (expected {want!r})")
        nbytes = self.tensors[name][3]
        parts = [data] if isinstance(data, (bytes, bytearray, memoryview, np.ndarray)) else data
        n = 0
        for part in parts:
            buf = memoryview(np.ascontiguousarray(part)).cast("B")
            f.write(buf)
            n += buf.nbytes
        if n != nbytes:
            raise ValueError(f"tensor {name!r}: {n} bytes given, {nbytes} declared")
        f.write(b"\0" * (-nbytes % self.alignment))
        self._next += 1

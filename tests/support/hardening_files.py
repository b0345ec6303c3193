"""GGUF files for the hardening corpus and fuzz tests, assembled byte by byte (tests/gguf_bytes.py)
so that a test controls, and can corrupt, every field."""
import math
import struct

import gguf_bytes as gb
from edged.format.gguf import Key

ARCH = "llama"
TOKENS = ["<unk>", "<s>", "</s>", "a"]

def kv(key, vtype, fmt, value):
    return gb.s(key) + struct.pack("<I" + fmt, vtype, value)


def kv_u32(key, v):
    return kv(key, gb.U32, "I", v)


def kv_u64(key, v):
    return kv(key, gb.U64, "Q", v)


def kv_f32(key, v):
    return kv(key, gb.F32, "f", v)


def kv_u32_array(key, items):
    return gb.s(key) + struct.pack(f"<IIQ{len(items)}I", gb.ARR, gb.U32, len(items), *items)


def kv_i32_array(key, items):
    return gb.s(key) + struct.pack(f"<IIQ{len(items)}i", gb.ARR, gb.I32, len(items), *items)


def hp_kvs(block_count=1, n_embd=8, n_head=2, n_ff=16):
    a = lambda k: Key.arch(k, ARCH)  # noqa: E731
    return [gb.kv_str(Key.ARCHITECTURE, ARCH),
            kv_u32(a(Key.CONTEXT_LENGTH), 64),
            kv_u32(a(Key.EMBEDDING_LENGTH), n_embd),
            kv_u64(a(Key.BLOCK_COUNT), block_count),
            kv_u32(a(Key.HEAD_COUNT), n_head),
            kv_u32(a(Key.FEED_FORWARD_LENGTH), n_ff),
            kv_f32(a(Key.LAYERNORM_RMS_EPS), 1e-5)]


def tokenizer_kvs(tokens=TOKENS, types=None, tokens_kv=None):
    types = types or [2, 3, 3] + [1] * (len(tokens) - 3)      # unknown, control x2, normal
    return [gb.kv_str(Key.TOKENIZER_MODEL, "llama"),
            tokens_kv if tokens_kv is not None else gb.kv_str_array(Key.TOKENS, tokens),
            gb.kv_f32_array(Key.SCORES, [0.0] * len(tokens)),
            kv_i32_array(Key.TOKEN_TYPE, types),
            kv_u32(Key.BOS_ID, 1), kv_u32("tokenizer.ggml.eos_token_id", 2)]


def llama_file(block_count=1, n_vocab=len(TOKENS), extra_kvs=(), tok_kvs=None, E=8, F=16):
    """A tiny but complete llama model (F32 weights), valid unless a caller corrupts it."""
    shapes = [("token_embd.weight", (E, n_vocab)), ("output_norm.weight", (E,))]
    for i in range(min(block_count, 1)):
        p = f"blk.{i}."
        shapes += [(p + "attn_norm.weight", (E,)), (p + "attn_q.weight", (E, E)),
                   (p + "attn_k.weight", (E, E)), (p + "attn_v.weight", (E, E)),
                   (p + "attn_output.weight", (E, E)), (p + "ffn_norm.weight", (E,)),
                   (p + "ffn_gate.weight", (E, F)), (p + "ffn_up.weight", (E, F)),
                   (p + "ffn_down.weight", (F, E))]
    infos, data = [], b""
    for name, shape in shapes:
        n = math.prod(shape)
        infos.append(gb.tensor_info(name, list(shape), gb.T_F32, len(data)))
        blob = struct.pack(f"<{n}f", *([0.01] * n))
        data += blob + b"\0" * ((-len(blob)) % 32)
    kvs = hp_kvs(block_count) + (tokenizer_kvs() if tok_kvs is None else tok_kvs) + list(extra_kvs)
    return gb.build(kvs, infos, data)


def header(n_tensors, n_kv):
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def one_tensor(dims, ttype=gb.T_F32, offset=0, data=b"\0" * 64, kvs=(), alignment=32):
    return gb.build(list(kvs), [gb.tensor_info("t", dims, ttype, offset)], data, alignment=alignment)




# --- the reader corpus: (id, bytes, message pattern); shared with tests/service/test_hardening_daemon.py -------------------------------------

READER_CASES = [
    # counts
    ("huge-n_kv", header(0, 2**63) + b"\0" * 64, "metadata count cannot fit"),
    ("huge-n_tensors", header(2**62, 0) + b"\0" * 64, "tensor count cannot fit"),
    ("n_kv-one-too-many", gb.build([gb.kv_u32("a.b", 1)], n_kv=2) + b"\0" * 32, "empty metadata key|needs|cannot fit"),
    # string lengths
    ("key-length-2^64-1", header(0, 1) + struct.pack("<Q", 2**64 - 1) + b"\0" * 64, "over 1 GiB"),
    ("string-value-past-eof", header(0, 1) + gb.s("k") + struct.pack("<IQ", gb.STR, 10**6) + b"x" * 32,
     "needs 1000000 bytes"),
    ("tensor-name-2^40", header(1, 0) + struct.pack("<Q", 2**40) + b"\0" * 64, "over 1 GiB|needs"),
    ("tensor-name-over-63-bytes", one_tensor([8]).replace(gb.s("t"), gb.s("t" * 64)), "over 63"),
    # array lengths
    ("string-array-2^61", header(0, 1) + gb.s("k") + struct.pack("<IIQ", gb.ARR, gb.STR, 2**61) + b"\0" * 64,
     "strings cannot fit"),
    ("string-array-element-2^63", header(0, 1) + gb.s("k") + struct.pack("<IIQQ", gb.ARR, gb.STR, 2, 2**63)
     + b"\0" * 64, r"k'\[0\]: string of"),
    ("f32-array-2^62", header(0, 1) + gb.s("k") + struct.pack("<IIQ", gb.ARR, gb.F32, 2**62) + b"\0" * 64,
     "over 1 GiB"),
    ("u8-array-past-eof", header(0, 1) + gb.s("k") + struct.pack("<IIQ", gb.ARR, gb.U8, 4096) + b"\0" * 64,
     "needs 4096 bytes"),
    ("nested-array", header(0, 1) + gb.s("k") + struct.pack("<IIQ", gb.ARR, gb.ARR, 1) + b"\0" * 64,
     "nested arrays"),
    ("unknown-value-type", header(0, 1) + gb.s("k") + struct.pack("<I", 0xdead) + b"\0" * 64,
     "unknown value type"),
    ("unknown-array-element-type", header(0, 1) + gb.s("k") + struct.pack("<IIQ", gb.ARR, 77, 1) + b"\0" * 64,
     "unknown array element type"),
    # dimensions and sizes
    ("dimension-product-overflow", one_tensor([2**32, 2**32, 2**32]), "element count overflows"),
    ("dimension-2^63", one_tensor([2**63]), "zero or negative"),
    ("dimension-zero", one_tensor([8, 0]), "zero or negative"),
    ("five-dimensions", one_tensor([1, 1, 1, 1, 1]), r"5 dimensions \(1 to 4"),
    ("total-size-2^63-bytes", one_tensor([2**31, 2**30]), "not within the file"),
    ("q4_0-size-wraps-as-u64", one_tensor([2**40, 2**20], gb.T_Q4_0), "overflows|not within the file"),
    ("row-not-multiple-of-block", one_tensor([33], gb.T_Q4_0), "not a multiple of Q4_0's block size 32"),
    ("unknown-ggml-type", one_tensor([8], 1000), "unknown ggml type"),
    # offsets
    ("offset-past-eof", one_tensor([8], offset=1 << 20), "not within the file"),
    ("offset-wraps-to-header", one_tensor([8], offset=2**64 - 64), "not within the file"),
    ("data-overlaps-previous-tensor",
     gb.build([], [gb.tensor_info("a", [16], gb.T_F32, 0), gb.tensor_info("b", [16], gb.T_F32, 32)],
              b"\0" * 128), "overlaps tensor 'a'"),
    ("truncated-data", one_tensor([64], data=b"\0" * 100), "not within the file"),
    # alignment
    ("alignment-zero", one_tensor([8], kvs=[gb.kv_u32(Key.ALIGNMENT, 0)]), "power-of-two u32"),
    ("alignment-not-power-of-two", one_tensor([8], kvs=[gb.kv_u32(Key.ALIGNMENT, 24)], alignment=24),
     "power-of-two u32"),
    ("alignment-wrong-type", one_tensor([8], kvs=[gb.kv_str(Key.ALIGNMENT, "32")]), "power-of-two u32"),
    ("tensor-offset-misaligned", one_tensor([8], offset=4), "not a multiple of the alignment 32"),
    # names and header
    ("duplicate-key", gb.build([gb.kv_u32("a.b", 1), gb.kv_u32("a.b", 2)]), "duplicate metadata key"),
    ("duplicate-tensor", gb.build([], [gb.tensor_info("t", [8], 0, 0), gb.tensor_info("t", [8], 0, 32)],
                                  b"\0" * 64), "duplicate tensor name"),
    ("empty-key", gb.build([gb.kv_u32("", 1)]), "empty metadata key"),
    ("bad-magic", b"GGML" + gb.build([])[4:], "bad magic"),
    ("version-1", gb.build([], version=1), "unsupported GGUF version 1"),
    ("big-endian", gb.build([], version=3 << 24), "big-endian"),
    ("truncated-header", b"GGUF\x03\0\0\0", "too short"),
]


# Tokenizer cases: (id, llama_file keyword arguments, message pattern).
TOKENIZER_CASES = [
    ("byte-token-<0x-1>", dict(tokens=TOKENS + ["<0x-1>"], types=[2, 3, 3, 1, 6]), r"<0x-1>"),
    ("byte-token-<0x100>", dict(tokens=TOKENS + ["<0x100>"], types=[2, 3, 3, 1, 6]), r"<0x100>"),
    ("tokens-array-of-u32", dict(tokens_kv=kv_u32_array(Key.TOKENS, [1, 2, 3, 4])), Key.TOKENS),
    ("tokens-not-an-array", dict(tokens_kv=kv_u32(Key.TOKENS, 4)), Key.TOKENS),
    ("token-type-length-mismatch", dict(types=[2, 3]), Key.TOKEN_TYPE),
]

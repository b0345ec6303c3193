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



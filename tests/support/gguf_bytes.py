"""Hand-assembled GGUF bytes for reader tests: every field is under the test's control, so a
test can corrupt exactly one of them. Independent of edged's own code."""
import struct

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
T_F32, T_F16, T_Q4_0, T_Q8_0, T_Q4_K = 0, 1, 2, 8, 12


def s(text):
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv_u32(key, v):
    return s(key) + struct.pack("<II", U32, v)


def kv_str(key, v):
    return s(key) + struct.pack("<I", STR) + s(v)


def kv_str_array(key, items):
    return s(key) + struct.pack("<IIQ", ARR, STR, len(items)) + b"".join(s(x) for x in items)


def kv_f32_array(key, items):
    return s(key) + struct.pack("<IIQ", ARR, F32, len(items)) + struct.pack(f"<{len(items)}f", *items)


def tensor_info(name, dims, ttype, offset):
    return s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + \
        struct.pack("<IQ", ttype, offset)


def build(kvs=(), infos=(), data=b"", version=3, n_kv=None, n_tensors=None, alignment=32,
          magic=b"GGUF"):
    """Assemble a GGUF file: header, metadata, tensor infos, padding to `alignment`, data."""
    kvs, infos = list(kvs), list(infos)
    head = magic + struct.pack("<I", version)
    head += struct.pack("<QQ", len(infos) if n_tensors is None else n_tensors,
                        len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(infos)
    pad = (-len(body)) % alignment
    return body + b"\0" * pad + data


def valid_file(version=3):
    """A small valid model-like file: metadata of several types and two F32 tensors."""
    kvs = [
        kv_str("general.architecture", "llama"),
        kv_u32("llama.block_count", 1),
        kv_str_array("tokenizer.ggml.tokens", ["<unk>", "a", "é", "\u2581b"]),
        kv_f32_array("tokenizer.ggml.scores", [0.0, -1.0, -2.0, -3.0]),
        s("general.flag") + struct.pack("<I?", BOOL, True),
        s("general.big") + struct.pack("<Iq", I64, -5),
    ]
    a = struct.pack("<8f", *range(8))           # 8 floats: tensor "a" 8x1
    b = struct.pack("<4f", 1, 2, 3, 4)          # tensor "b" 4
    infos = [tensor_info("a", [8], T_F32, 0), tensor_info("b", [4], T_F32, 32)]
    return build(kvs, infos, a + b, version=version)

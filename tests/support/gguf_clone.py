"""A GGUF file copied through the PyPI `gguf` package's reader and writer with metadata or
tensors changed: models edged must refuse, built from real files by an independent writer."""
import gguf
import numpy as np


def clone(src, dst, drop=(), meta=None, drop_meta=(), reshape=None, arch=None, tokens=None,
          add=None):
    """Copy a GGUF file with the PyPI writer, changing metadata/tensors; add: name -> array
    of tensors to append (numpy's (rows, cols) is GGUF's (cols, rows))."""
    r = gguf.GGUFReader(src)
    old_arch = r.fields["general.architecture"].contents()
    arch = arch or old_arch
    w = gguf.GGUFWriter(str(dst), arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in drop_meta:
            continue
        v = f.contents()
        if k == "tokenizer.ggml.tokens" and tokens is not None:
            v = tokens
        if k in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type") and tokens is not None:
            v = v[:len(tokens)]
        nk = k.replace(old_arch + ".", arch + ".", 1) if k.startswith(old_arch + ".") else k
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(nk, v, vt, sub_type=f.types[-1])
        else:
            w.add_key_value(nk, v, vt)
    for k, v in (meta or {}).items():   # (value, type) or (items, ARRAY, element type)
        w.add_key_value(k.format(arch=arch), v[0], v[1], *v[2:])
    for t in r.tensors:
        if t.name in drop:
            continue
        data = np.array(t.data)
        if reshape and t.name in reshape:
            data = np.zeros(reshape[t.name], np.float32)
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type if t.tensor_type != 0 else None)
    for name, data in (add or {}).items():
        w.add_tensor(name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(dst)

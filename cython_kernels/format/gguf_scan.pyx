# Compiled scan of GGUF string arrays (vocabularies and merges: ~300k strings in a Qwen2
# vocab), bounds-checked exactly like the Python reader in edged/gguf.py.
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcpy
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF


cdef extern from "Python.h":
    object PyUnicode_DecodeUTF8(const char* s, Py_ssize_t size, const char* errors)


def scan_strings(const uint8_t[::1] buf, Py_ssize_t pos, Py_ssize_t end, uint64_t count,
                 uint64_t max_len):
    """Read `count` GGUF strings (u64 length + UTF-8 bytes) from buf[pos:end].

    Returns (values, new_pos, None), or (None, pos, (index, offset, length)) for the first
    string whose length prefix or bytes run past `end` or over `max_len`."""
    cdef object v
    cdef uint64_t i, n
    cdef const uint8_t* p = &buf[0]
    if end > buf.shape[0]:
        end = buf.shape[0]
    if pos > end or count > <uint64_t>(end - pos) // 8:   # each string has an 8-byte length
        return None, pos, (0, pos, count)
    cdef list out = PyList_New(<Py_ssize_t>count)
    for i in range(count):
        if end - pos < 8:
            return None, pos, (i, pos, 8)
        memcpy(&n, p + pos, 8)     # GGUF is little-endian; so are the hosts edged supports
        if n > max_len or n > <uint64_t>(end - pos - 8):
            return None, pos, (i, pos, n)
        pos += 8
        v = PyUnicode_DecodeUTF8(<const char*>p + pos, <Py_ssize_t>n, "surrogateescape")
        Py_INCREF(v)
        PyList_SET_ITEM(out, <Py_ssize_t>i, v)
        pos += n
    return out, pos, None

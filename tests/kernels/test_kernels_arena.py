"""Every buffer the kernels write comes from one 64-byte aligned arena per session."""
import numpy as np
import pytest

from conftest import testdata

core = pytest.importorskip("edged._core")


def test_session_arena_and_its_buffers_are_64_byte_aligned():
    from edged import Model
    m = Model.load(testdata("models", "stories260K.gguf"), n_threads=2)
    try:
        for n_ctx, n_batch in [(64, 8), (33, 7), (257, 31)]:
            buf = m.backend.alloc(n_ctx, n_batch)
            st = buf.state
            assert st.address % 64 == 0 and st.nbytes > 0
            k, v = st.kv_cache()
            views = [k, v, st.input_rows(), st.logits(1), buf.inp]
            for a in views:
                assert a.ctypes.data % 64 == 0, (n_ctx, n_batch, a.shape)
                assert st.address <= a.ctypes.data < st.address + st.nbytes  # inside the arena
            # F16 KV cache by default: rows of n_head_kv * head_dim halves
            kvd = m.hp.n_head_kv * m.hp.head_dim
            assert st.cache_types == (1, 1) and k.dtype == np.uint8
            assert k.shape == v.shape == (m.hp.n_layer, n_ctx, 2 * kvd)
    finally:
        m.close()


def test_aligned_empty_helper():
    for shape, dt in [((1,), np.float32), ((3, 5), np.uint16), ((7, 33), np.uint8)]:
        a = core.aligned_empty(shape, dt)
        assert a.ctypes.data % 64 == 0 and a.shape == shape and a.dtype == dt

"""The read-bandwidth reference of tools/bench_kernels.py (`read_bandwidth_pass`,
cython_kernels/kernels/ed_readbw.h): on every path and thread count it must read every 8-byte
word of the buffer exactly once, so its checksum is the XOR of all of them (NumPy's), over sizes
that leave every tail (a partial 512-byte step, a partial word, slices of uneven length)."""
import numpy as np
import pytest

core = pytest.importorskip("edged._core")


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_read_pass_reads_every_word_once(kernel_path, threads):
    rng = np.random.default_rng(threads)
    pool = None if threads == 1 else core.Pool(threads)
    data = np.frombuffer(rng.bytes(1 << 16), np.uint8)
    for n in (7, 8, 504, 512, 520, 4096 + 64 + 8 + 3, len(data)):
        buf = np.ascontiguousarray(data[:n])
        want = int(np.bitwise_xor.reduce(data[:n // 8 * 8].view(np.uint64))) if n >= 8 else 0
        assert core.read_bandwidth_pass(buf, pool) == want, (kernel_path, threads, n)
    # a buffer that does not start on a 64-byte boundary
    odd = data[3:3 + 4096 + 40]
    assert core.read_bandwidth_pass(odd, pool) == int(np.bitwise_xor.reduce(
        np.frombuffer(odd.tobytes()[:len(odd) // 8 * 8], np.uint64)))


def test_read_pass_says_what_it_loads(kernel_path):
    want = {"avx512": "64-byte", "avx2": "32-byte", "neon": "16-byte", "generic": "8-byte"}[core.kernel_path()]
    assert core.read_pass_loads().startswith(want)

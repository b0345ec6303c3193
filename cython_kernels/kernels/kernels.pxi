# Weight kernels, SIMD path selection, thread pinning and aligned buffers (included from core.pyx
# after forward.pxi, whose Pool / ed_pool this file uses).
#
# C-level API for the forward pass (all noexcept nogil, raw pointers, caller owns buffers):
#   ed_types.h   ED_TRAITS[ggml type] = {block, type_size, vec_type, ref}: the weight type's
#                activation format (vec_type: ED_F32/ED_F16/ED_BF16/ED_Q8_0/ED_Q8_1/ED_Q8_K) and
#                its plain C dot; the chosen path's (ed_kernels) float ED_DOT[type](int k,
#                const void *w_row, const void *x_quantized_row);
#                ED_QUANT[vec_type](const float *x, void *xq, int k) quantizes activations;
#                ed_act_row_bytes(type, k): bytes of one quantized activation row.
#   ed_simd.h    int ed_types_init(const char *force): selects the const table of the best
#                path this CPU supports, or the forced one ("generic", "avx2", "avx512",
#                "neon", NULL/"auto", or a family less a feature: "avx2-vnni", "avx512-vnni",
#                "neon-dotprod"); -1 if unsupported.
#                void ed_mdot_rows(int type, int k, const uint8_t *w, size_t w_row_bytes, int nr,
#                    const uint8_t *xq, size_t xq_row_bytes, int nc, float *out, size_t ldo):
#                    out[c*ldo + r] = W[r] . xq[c] for r < nr, c < nc; the matmul tile (each
#                    weight row decoded once per 4 activation rows where a tile kernel exists;
#                    for one activation row, Q8_0 reads it once per 4 weight rows).
#                void ed_axpy_f16(int n, float a, const ed_half *x, float *y): y += a * x (F16).
#                unsigned ed_cpu_features(void); int ed_path_supported(const char *name).
#   ed_quant.h   int ed_quantize_row(int type, const float *x, void *y, int64_t k): llama.cpp's
#                reference weight quantizers (same bytes as edged/quants.py).
#   ed_dequant.h int ed_dequantize_row(int type, const void *x, float *y, int64_t k): weight rows
#                back to float (embedding lookup), same bits as edged/quants.py and gguf-py.
#   ed_threads.h int ed_pool_pin(ed_pool *p, const int *cpus, int n, const cpu_set_t *initial)
#   forward.h    (engine) ed_rms_norm, ed_rope, ed_gelu, ed_silu, ed_attention use the above.
#
# The path is chosen once at import from $EDGED_KERNELS (forward.pxi's select_kernels()).
# Python surface (checks first, then `with nogil:`): kernel_path() (forward.pxi), cpu_features(),
# available_paths(), set_path(name), bf16_dp(on), act_row_bytes(qtype, k), quantize_act(x, qtype),
# matmul(out, w, qtype, x, pool=None), quantize_rows(x, qtype, pool=None),
# dequantize_rows(out, w, qtype, rows=None), pin_pool(pool, cpus),
# default_threads(), aligned_empty(shape, dtype), read_bandwidth_pass(buf, pool=None),
# read_pass_loads(), and the
# forward pass's ops for tests: rmsnorm, rope, activation, attention.
import os as _os

from libc.stdlib cimport malloc, free
from libc.stdint cimport uint32_t, uint64_t

from edged.errors import ConfigError as _ConfigError

cdef extern from "ed_simd.h" nogil:
    unsigned ed_cpu_features()
    int ed_path_supported(const char *name)
    const char *ED_CPU_FEATURE_NAMES[]
    int ED_BF16_DP
    ctypedef void (*ed_quant_fn)(const float *x, void *y, int k) noexcept nogil
    ctypedef float (*ed_dot_fn)(int n, const void *w, const void *xq) noexcept nogil
    ctypedef struct ed_act_traits:
        int block, type_size
        ed_quant_fn ref
    ed_act_traits ED_ACT[ED_NTYPES]
    ed_quant_fn ED_QUANT[ED_NTYPES]
    ctypedef void (*ed_tile_fn)(int k, const void *w, const void *xq, size_t xs, int nc, float *out,
                                size_t ldo) noexcept nogil
    ctypedef void (*ed_rows_fn)(int k, const void *w, size_t wstride, int nr, const void *xq, size_t xs,
                                int nc, float *out, size_t ldo) noexcept nogil
    ctypedef void (*ed_unpack_lift_fn)(const void *row, int K, uint8_t *u, float *A, float *C,
                                       uint8_t lift) noexcept nogil
    cdef struct ed_gemm_path:
        ed_unpack_lift_fn unpack[ED_NTYPES]
    ctypedef struct ed_kernels:
        const char *name
        const ed_dot_fn *dot
        const ed_quant_fn *quant
        const ed_tile_fn *tile
        const ed_rows_fn *rows
        const ed_rows_fn *rows_r4
        const ed_gemm_path *gemm
    const ed_kernels *ed_kern
    ctypedef struct ed_type_row:
        int id
        const char *name
        int block, type_size, vec_type, weight, act
    const ed_type_row ED_TYPE_LIST[]
    size_t ed_act_row_bytes(int type, int64_t k)
    size_t ed_attn_ws_floats(int hd, int n_ctx)
    void ed_mdot_rows(int type, int k, const uint8_t *w, size_t wstride, int nr,
                      const uint8_t *xq, size_t xs, int nc, float *out, size_t ldo)
    int ED_GEMM_MIN_COLS
    int ed_gemm_min_cols()
    void *aligned_alloc(size_t alignment, size_t size)
    int ed_gemm_ok(int type)
    ctypedef struct ed_ginfo:
        float dy
        int32_t yoff
        float dys
    size_t ed_gemm_scratch(int64_t K)
    size_t ed_gemm_info_len(int64_t K)
    void ed_gemm_info(int vt, int K, const uint8_t *row, ed_ginfo *info)
    void ed_gemm_rows(int type, int K, const uint8_t *w, size_t row_bytes, int nr,
                      const uint8_t *xq, size_t xs, const ed_ginfo *info, size_t istride, int n,
                      float *out, size_t ldo, uint8_t *scratch)
    void ed_gemm_rows_layout(int type, int layout, int K, const uint8_t *w, size_t row_bytes, int nr,
                             const uint8_t *xq, size_t xs, const ed_ginfo *info, size_t istride,
                             const float *dy, int n, float *out, size_t ldo, uint8_t *scratch)
    int ed_gemm_reads_dy(int type, int layout)
    size_t ed_gemm_dy_len(int64_t n, int64_t K)
    void ed_gemm_dy_r4(int K, const uint8_t *row, int t, float *dy)
    void ed_mdot_rows_r4(int type, int k, const uint8_t *w, size_t row_bytes, int nr,
                         const uint8_t *xq, size_t xs, int nc, float *out, size_t ldo)
    ctypedef void (*ed_task_fn)(void *arg, int ith, int nth) noexcept nogil
    void ed_pool_run(ed_pool *p, ed_task_fn fn, void *arg)

cdef extern from "sched.h" nogil:
    ctypedef struct cpu_set_t:
        pass
    int sched_getaffinity(int pid, size_t size, cpu_set_t *mask)

cdef extern from "ed_threads.h" nogil:
    int64_t ed_claim(ed_pool *p, int64_t n)
    int ed_pool_pin(ed_pool *p, const int *cpus, int n, const cpu_set_t *initial)

PATHS = ("generic", "avx2", "avx512", "neon")
# a family less a feature: the variant a CPU without it gets (to test and measure it anywhere)
VARIANTS = ("avx2-vnni", "avx512-vnni", "neon-dotprod")
cdef cpu_set_t _initial_affinity
sched_getaffinity(0, sizeof(cpu_set_t), &_initial_affinity)


def cpu_features():
    """Names of the SIMD features this CPU has (those the kernels care about)."""
    cdef unsigned f = ed_cpu_features()
    cdef int i = 0
    out = []
    while ED_CPU_FEATURE_NAMES[i] != NULL:
        if f & (1u << i):
            out.append(ED_CPU_FEATURE_NAMES[i].decode())
        i += 1
    return out


def available_paths():
    """The kernel paths this CPU can run, slowest first."""
    return [p for p in PATHS if ed_path_supported(p.encode())]


def type_list():
    """The one list of types the compiled core knows (ed_types.h ED_TYPES), in its order: per type
    its ggml id, name, elements and bytes per block, the activation format it is multiplied with
    (vec_type), and whether it is a weight type (weight) and an activation format (act)."""
    cdef const ed_type_row *r = ED_TYPE_LIST
    out = []
    while r.name != NULL:
        out.append({"id": r.id, "name": r.name.decode(), "block": r.block, "type_size": r.type_size,
                    "vec_type": r.vec_type, "weight": bool(r.weight), "act": bool(r.act)})
        r += 1
    return out


def kernel_tables():
    """The selected path's tables: for each role (dot, tile, rows, rows_r4, quant, gemm) the type
    ids it has a function for."""
    cdef const ed_kernels *k = ed_kern
    return {"dot": [t for t in range(ED_NTYPES) if k.dot[t] != NULL],
            "tile": [t for t in range(ED_NTYPES) if k.tile[t] != NULL],
            "rows": [t for t in range(ED_NTYPES) if k.rows[t] != NULL],
            "rows_r4": [t for t in range(ED_NTYPES) if k.rows_r4 != NULL and k.rows_r4[t] != NULL],
            "quant": [t for t in range(ED_NTYPES) if k.quant[t] != NULL],
            "gemm": [t for t in range(ED_NTYPES) if k.gemm.unpack[t] != NULL]}


def kernel_variant():
    """The table the selected path runs: "avx2+vnni", "avx2", "neon+dotprod", ..."""
    return ed_kern.name.decode()


def bf16_dp(on=None):
    """Whether the AVX-512 paths' BF16 products may use VDPBF16PS where the CPU has it (the
    default; else its emulation by FMAs, the same bits: tests compare the two); with on, set it
    and return the old setting."""
    global ED_BF16_DP
    old = bool(ED_BF16_DP)
    if on is not None:
        ED_BF16_DP = 1 if on else 0
    return old


def set_path(name=None):
    """Select a kernel path (None/"" = best supported; a family as in PATHS, or one of
    VARIANTS). Raises ConfigError when unsupported."""
    cdef bytes b = (name or "").encode()
    if name and name not in PATHS + VARIANTS + ("auto",):
        raise _ConfigError(f"EDGED_KERNELS={name!r}: unknown kernel path (one of {', '.join(PATHS + VARIANTS)})")
    if ed_types_init(b) != 0:
        ed_types_init(b"generic")
        raise _ConfigError(f"EDGED_KERNELS={name!r}: not supported on this CPU "
                           f"(features: {' '.join(cpu_features()) or 'none'}; "
                           f"supported paths: {', '.join(available_paths())})")
    return kernel_path()



cdef int _check_type(int qtype) except -1:
    if qtype < 0 or qtype >= ED_NTYPES or ED_TRAITS[qtype].ref == NULL:
        raise ValueError(f"no kernel for ggml type {qtype}")
    return 0


def act_row_bytes(int qtype, int k):
    """Bytes of one activation row of k elements in the format weights of `qtype` multiply with."""
    _check_type(qtype)
    return ed_act_row_bytes(qtype, k)


def quantize_act(const float[:, ::1] x, int qtype):
    """Activation rows (n, k) -> uint8 (n, act_row_bytes) in the weight type's partner format."""
    _check_type(qtype)
    cdef int n = x.shape[0], k = x.shape[1], t
    if k % ED_TRAITS[qtype].block:
        raise ValueError(f"row length {k} is not a multiple of the block size {ED_TRAITS[qtype].block}")
    cdef size_t rb = ed_act_row_bytes(qtype, k)
    out = np.empty((n, rb), np.uint8)
    cdef uint8_t[:, ::1] o = out
    cdef ed_quant_fn q = ED_QUANT[ED_TRAITS[qtype].vec_type]
    with nogil:
        for t in range(n):
            q(&x[t, 0], &o[t, 0], k)
    return out


ctypedef struct _mm_args:
    float *out
    const uint8_t *w
    const uint8_t *xq
    size_t row_bytes, xq_row
    int K, N, n, type
    int layout              # 0: the rows as mapped, 1: repacked in groups of ED_R4_ROWS (ed_repack.h's R4)
    const ed_ginfo *info    # group sums of xq when the product uses packed panels, else NULL
    const float *dy         # with info, the block scales of xq as floats for a path's own R4 panels
    ed_pool *pool           # the pool running the task (NULL: one thread)


# The tiles' cache blocks: _MM_BLOCK_BYTES of activations (a token block that stays in the
# L2 cache while _MM_BLOCK_ROWS weight rows pass it, 16 at a time, each tile reused by every 4
# tokens of the block), instead of every token's row streaming from memory once per 16 rows
# (bert-base's FFN over 2,000 tokens: 12 MB of F16 activations per 16 rows).
cdef enum:
    _MM_BLOCK_BYTES = 131072
    _MM_BLOCK_ROWS = 64


cdef void _mm_blocks(_mm_args *a, int ith, int nth) noexcept nogil:
    # blocks of (tokens, rows), claimed one at a time by whichever thread is free: every
    # (row, token) has its own sum in one order, so who takes what changes no bit
    cdef int64_t tb = max(4, min(<int64_t>a.n, <int64_t>(_MM_BLOCK_BYTES // a.xq_row) // 4 * 4))
    cdef int64_t nt = (a.n + tb - 1) // tb, nr = (a.N + _MM_BLOCK_ROWS - 1) // _MM_BLOCK_ROWS
    cdef int64_t blk = ith - 1, t0, t1, r0, r1, rt, rend
    while True:
        if a.pool != NULL:
            blk = ed_claim(a.pool, nt * nr)
        else:
            blk = blk + 1 if blk + 1 < nt * nr else -1
        if blk < 0:
            return
        t0 = blk // nr * tb
        t1 = min(t0 + tb, <int64_t>a.n)
        r0 = blk % nr * _MM_BLOCK_ROWS
        r1 = min(r0 + _MM_BLOCK_ROWS, <int64_t>a.N)
        rt = r0
        while rt < r1:
            rend = min(rt + 16, r1)
            ed_mdot_rows(a.type, a.K, a.w + rt * a.row_bytes, a.row_bytes, <int>(rend - rt),
                         a.xq + t0 * a.xq_row, a.xq_row, <int>(t1 - t0), a.out + t0 * a.N + rt, a.N)
            rt = rend


cdef void _mm_task(void *arg, int ith, int nth) noexcept nogil:
    # rows split evenly over threads; a tile of 16 rows stays in cache while every token passes
    # (or, for a batch of at least gemm_min_cols() tokens, packed 16-row panels: ed_gemm.h;
    # more tokens than a tile takes: cache blocks, _mm_blocks)
    cdef _mm_args *a = <_mm_args *>arg
    if a.info == NULL and not a.layout and a.n > 4:
        _mm_blocks(a, ith, nth)
        return
    cdef int64_t per = (a.N + nth - 1) // nth
    if a.layout:
        per = (per + ED_R4_ROWS - 1) // ED_R4_ROWS * ED_R4_ROWS  # whole groups
    cdef int64_t r0 = min(per * ith, <int64_t>a.N), r1 = min(r0 + per, <int64_t>a.N), rt, rend
    cdef uint8_t *scratch
    if a.info != NULL and r1 > r0:
        scratch = <uint8_t *>aligned_alloc(64, ed_gemm_scratch(a.K))
        if scratch != NULL:
            ed_gemm_rows_layout(a.type, a.layout, a.K, a.w + r0 * a.row_bytes, a.row_bytes, <int>(r1 - r0),
                                a.xq, a.xq_row, a.info, ed_gemm_info_len(a.K), a.dy, a.n, a.out + r0, a.N,
                                scratch)
            free(scratch)
            return
    if a.layout:                        # the thread's rows in one call, as the engine's ed_rows
        if r1 > r0:
            ed_mdot_rows_r4(a.type, a.K, a.w + r0 * a.row_bytes, a.row_bytes, <int>(r1 - r0),
                            a.xq, a.xq_row, a.n, a.out + r0, a.N)
        return
    rt = r0
    while rt < r1:
        rend = min(rt + 16, r1)
        ed_mdot_rows(a.type, a.K, a.w + rt * a.row_bytes, a.row_bytes, <int>(rend - rt),
                     a.xq, a.xq_row, a.n, a.out + rt, a.N)
        rt = rend


def matmul(float[:, ::1] out, const uint8_t[::1] w, int qtype, const float[:, ::1] x, Pool pool=None,
           bint r4=False):
    """out[t, r] = W[r] . x[t] with W (N rows of K) in ggml type `qtype`; activations are
    quantized to the type's partner format first, as in the forward pass. r4: W is in the R4
    layout (r4_pack), read by the path's R4 kernels as the engine reads repacked weights."""
    _check_type(qtype)
    cdef int n = x.shape[0], K = x.shape[1], N = out.shape[1]
    if out.shape[0] != n:
        raise ValueError(f"out has {out.shape[0]} rows, x has {n}")
    if r4 and not ed_r4_ok(qtype, K, N):
        raise ValueError(f"type {qtype} with {N} rows of {K} has no R4 layout")
    cdef int blk = ED_TRAITS[qtype].block
    if K % blk:
        raise ValueError(f"row length {K} is not a multiple of the block size {blk}")
    cdef size_t rb = <size_t>(K // blk) * ED_TRAITS[qtype].type_size
    if <size_t>w.shape[0] != rb * N:
        raise ValueError(f"weights: expected {rb * N} bytes for {N} rows of {K}, got {w.shape[0]}")
    xq = quantize_act(x, qtype)
    cdef const uint8_t[:, ::1] xqv = xq
    cdef _mm_args a
    a.out = &out[0, 0]; a.w = &w[0]; a.xq = &xqv[0, 0]; a.row_bytes = rb
    a.xq_row = xq.shape[1]; a.K = K; a.N = N; a.n = n; a.type = qtype; a.info = NULL; a.dy = NULL; a.layout = 1 if r4 else 0
    a.pool = pool.p if pool is not None else NULL
    cdef size_t ilen = ed_gemm_info_len(K)
    cdef ed_ginfo *info = NULL
    cdef float *dy = NULL
    cdef int t
    if n >= ed_gemm_min_cols() and ed_gemm_ok(qtype):
        info = <ed_ginfo *>malloc(ilen * n * sizeof(ed_ginfo) + 64)
        if a.layout and ed_gemm_reads_dy(qtype, a.layout):
            dy = <float *>malloc(ed_gemm_dy_len(n, K) * sizeof(float) + 64)
        if info == NULL or (a.layout and ed_gemm_reads_dy(qtype, a.layout) and dy == NULL):
            free(info)
            raise MemoryError()
    with nogil:
        if info != NULL:
            for t in range(n):
                ed_gemm_info(ED_TRAITS[qtype].vec_type, K, a.xq + t * a.xq_row, info + t * ilen)
                if dy != NULL:
                    ed_gemm_dy_r4(K, a.xq + t * a.xq_row, t, dy)
            a.info = info
            a.dy = dy
        if pool is None:
            _mm_task(&a, 0, 1)
        else:
            ed_pool_run(pool.p, _mm_task, &a)
    free(info)
    free(dy)
    return out


def gemm_min_cols(n=None):
    """Tokens from which a matrix product uses packed panels (ed_gemm.h) where the path has
    them: the threshold in force (the selected path's own unless set). With n, set it (tests
    use 1 to run every shape through them; 0 = the path's own again) and return the old
    setting (0 when it was the path's)."""
    global ED_GEMM_MIN_COLS
    if n is None:
        return ed_gemm_min_cols()
    if int(n) < 0:
        raise ValueError(f"gemm_min_cols must be >= 0, got {n}")
    old = ED_GEMM_MIN_COLS
    ED_GEMM_MIN_COLS = int(n)
    return old


def gemm_types():
    """ggml type ids the selected path multiplies with packed panels."""
    return [t for t in range(ED_NTYPES) if ed_gemm_ok(t)]


def pin_pool(Pool pool, cpus):
    """Pin worker i of `pool` (worker 0 = the calling thread) to cpus[i % len(cpus)];
    an empty list restores the affinity the process started with."""
    cdef int n = len(cpus), i
    cdef int *c = <int *>malloc(sizeof(int) * max(n, 1))
    if c == NULL:
        raise MemoryError()
    for i in range(n):
        c[i] = int(cpus[i])
    cdef int failed
    with nogil:
        failed = ed_pool_pin(pool.p, c, n, &_initial_affinity)
    free(c)
    if failed:
        raise OSError(f"could not pin {failed} worker thread(s) to CPUs {list(cpus)}")


def aligned_empty(shape, dtype=np.float32, int align=64):
    """A numpy array whose data starts on an `align`-byte boundary (over-allocate and slice)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) * dt.itemsize
    raw = np.empty(n + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + n].view(dt).reshape(shape)


cdef extern from "ed_readbw.h" nogil:
    uint64_t ed_read_pass(const uint8_t *p, size_t n)
    const char *ed_read_pass_loads()


ctypedef struct _rd_args:
    const uint8_t *p
    size_t n
    uint64_t sums[64]


cdef void _read_task(void *arg, int ith, int nth) noexcept nogil:
    # one contiguous slice per thread (as the matrix-vector product splits its rows), read with
    # the selected path's widest loads and 8 independent accumulators (ed_readbw.h)
    cdef _rd_args *a = <_rd_args *>arg
    cdef size_t per = ((a.n + nth - 1) // nth + 63) // 64 * 64
    cdef size_t i0 = min(per * ith, a.n), i1 = min(i0 + per, a.n)
    a.sums[ith % 64] ^= ed_read_pass(a.p + i0, i1 - i0)


def read_bandwidth_pass(const uint8_t[::1] buf, Pool pool=None):
    """Read `buf` once (all pool threads, one contiguous slice each) with the selected path's
    widest loads (read_pass_loads()) into 8 independent accumulators; returns a checksum. Timed,
    it is the read bandwidth the weight-streaming kernels are compared with: run it on the same
    buffer and thread count as they use."""
    cdef _rd_args a
    a.p = &buf[0]
    a.n = buf.shape[0]
    memset(a.sums, 0, sizeof(a.sums))
    with nogil:
        if pool is None:
            _read_task(&a, 0, 1)
        else:
            ed_pool_run(pool.p, _read_task, &a)
    cdef uint64_t s = 0
    for i in range(64):
        s ^= a.sums[i]
    return s


def read_pass_loads():
    """What read_bandwidth_pass loads with on the selected path, e.g. "32-byte ymm loads"."""
    return ed_read_pass_loads().decode()


def default_threads():
    """Physical cores in the allowed CPU set (edged.system)."""
    from edged.system import default_threads as _dt
    return _dt()


# --- the forward pass's small ops (forward.h), exposed for the tests against NumPy ----------
cdef extern from "forward.h" nogil:
    void ed_rms_norm(float *out, const float *x, const float *w, int n, float eps)
    void ed_rope(float *x, int n_heads, int head_dim, int n_rot, int pos, float base,
                 float freq_scale, const float *ff, float mscale, int neox)
    float ed_gelu(float x)
    float ed_silu(float x)
    ctypedef struct ed_pm_fns:
        pass
    const ed_pm_fns *ED_PM
    void ed_pm_silu_mul(const ed_pm_fns *pm, int n, float *g, const float *u)
    void ed_attention(ed_state *s, const ed_model *m, int il, int ith, int nth, int ldqkv)


def rmsnorm(float[:, ::1] out, const float[:, ::1] x, const float[::1] w=None, float eps=1e-6):
    """out[t] = x[t] / rms(x[t]) * w."""
    cdef int n = x.shape[1], t
    if out.shape[0] != x.shape[0] or out.shape[1] != n or (w is not None and w.shape[0] != n):
        raise ValueError("rmsnorm: shapes of out, x and w disagree")
    cdef const float *wp = &w[0] if w is not None else NULL
    with nogil:
        for t in range(x.shape[0]):
            ed_rms_norm(&out[t, 0], &x[t, 0], wp, n, eps)


def rope(float[:, ::1] x, int pos, int n_rot, float base=10000.0, float freq_scale=1.0,
         const float[::1] freq_factors=None, bint neox=False, float mscale=1.0):
    """Rotate x (n_heads, head_dim) in place for position `pos` (normal or NeoX pairing)."""
    cdef int hd = x.shape[1]
    if n_rot > hd or n_rot % 2 or n_rot > 1024:
        raise ValueError(f"n_rot {n_rot} must be even and <= head_dim {hd}")
    if freq_factors is not None and freq_factors.shape[0] < n_rot // 2:
        raise ValueError(f"freq_factors needs {n_rot // 2} values")
    cdef const float *ff = &freq_factors[0] if freq_factors is not None else NULL
    with nogil:
        ed_rope(&x[0, 0], x.shape[0], hd, n_rot, pos, base, freq_scale, ff, mscale, neox)


def activation(float[::1] x, str kind, const float[::1] up=None):
    """In place: 'silu' or 'gelu' (tanh approximation); with `up`, x = act(x) * up, the gated
    FFN's form (for SiLU the forward pass's path-selected code)."""
    cdef Py_ssize_t i
    cdef bint g = kind == "gelu"
    if kind not in ("silu", "gelu"):
        raise ValueError(f"activation {kind!r}")
    if up is not None and up.shape[0] != x.shape[0]:
        raise ValueError(f"up has {up.shape[0]} values, x {x.shape[0]}")
    if up is not None and not g:
        with nogil:
            ed_pm_silu_mul(ED_PM, <int>x.shape[0], &x[0], &up[0])
        return
    with nogil:
        for i in range(x.shape[0]):
            x[i] = ed_gelu(x[i]) if g else ed_silu(x[i])
            if up is not None:
                x[i] = x[i] * up[i]


def attention(float[:, ::1] out, float[:, ::1] q, uint16_t[:, ::1] k_cache,
              uint16_t[:, ::1] v_cache, int pos, int n_head, int n_head_kv, float scale,
              int n_swa=0, const float[::1] sinks=None):
    """Causal attention of n tokens at positions pos.. over an F16 cache (n_ctx, n_head_kv *
    head_dim) that already holds their keys/values; q, out: (n, n_head * head_dim).
    Grouped-query heads; n_swa > 0 masks keys older than the sliding window; sinks: one
    more softmax logit per head (gpt-oss)."""
    cdef int n = q.shape[0], Qd = q.shape[1], hd, n_ctx = k_cache.shape[0]
    if n_head < 1 or n_head_kv < 1 or n_head % n_head_kv or Qd % n_head:
        raise ValueError("attention: heads do not divide")
    hd = Qd // n_head
    if hd > 1024 or k_cache.shape[1] != n_head_kv * hd or v_cache.shape[0] != n_ctx \
            or v_cache.shape[1] != k_cache.shape[1] or out.shape[0] != n or out.shape[1] != Qd:
        raise ValueError("attention: shapes of q, out and the caches disagree")
    if pos < 0 or pos + n > n_ctx:
        raise ValueError(f"positions [{pos}, {pos + n}) outside the cache of {n_ctx}")
    if sinks is not None and sinks.shape[0] != n_head:
        raise ValueError(f"attention: {sinks.shape[0]} sinks for {n_head} heads")
    cdef ed_model m
    cdef ed_layer layer
    cdef ed_state s
    cdef size_t kv_off[2]
    memset(&m, 0, sizeof(m)); memset(&layer, 0, sizeof(layer)); memset(&s, 0, sizeof(s))
    att = aligned_empty(max(ed_attn_ws_floats(hd, n_ctx), <size_t>n_ctx), np.float32)
    qh = np.empty(hd, np.uint16)
    vacc = np.empty(80 * hd, np.float32)  # the lane rows of the V sums (forward.h)
    cdef float[::1] attv = att
    cdef uint16_t[::1] qhv = qh
    cdef float[::1] vaccv = vacc
    m.head_dim = hd; m.n_head = n_head; m.n_head_kv = n_head_kv; m.attn_scale = scale
    m.n_swa = n_swa; m.n_layer = 1; layer.swa = n_swa > 0; layer.kv = 1; m.layers = &layer
    layer.head_dim = hd; layer.n_head_kv = n_head_kv; layer.kv_src = 0  # the layer's own sizes
    kv_off[0] = kv_off[1] = 0   # one layer: its K and V rows start at 0
    s.m = &m; s.kv_off = kv_off  # read through the state (ed_layer_cache)
    if sinks is not None:
        layer.attn_sinks.data = <const uint8_t *>&sinks[0]
    s.n_ctx = n_ctx; s.n_tokens = n; s.pos = pos
    s.k_cache = <uint8_t *>&k_cache[0, 0]; s.v_cache = <uint8_t *>&v_cache[0, 0]
    s.type_k = s.type_v = 1; s.k_row = s.v_row = 2 * k_cache.shape[1]  # F16 rows
    s.att = &attv[0]; s.att_stride = att.shape[0]; s.qh = &qhv[0]; s.qkv = &q[0, 0]; s.xb = &out[0, 0]
    s.vacc = &vaccv[0]
    with nogil:
        ed_attention(&s, &m, 0, 0, 1, Qd)


# --- compiled weight quantizers (ed_quant.h), the fast twin of edged.format.quants.quantize --------
cdef extern from "ed_quant.h" nogil:
    int ed_quantize_row(int type, const float *x, void *y, int64_t k)
    int ed_quantize_row_w(int type, const float *x, const float *qw, void *y, int64_t k)

ctypedef struct _q_args:
    const float *x
    const float *qw
    uint8_t *y
    int64_t k, rows
    size_t rb
    int type


cdef void _q_task(void *arg, int ith, int nth) noexcept nogil:
    cdef _q_args *a = <_q_args *>arg
    cdef int64_t per = (a.rows + nth - 1) // nth
    cdef int64_t r0 = per * ith, r1 = min(r0 + per, a.rows), r
    for r in range(r0, r1):
        if a.qw == NULL:
            ed_quantize_row(a.type, a.x + r * a.k, a.y + r * a.rb, a.k)
        else:
            ed_quantize_row_w(a.type, a.x + r * a.k, a.qw, a.y + r * a.rb, a.k)


def quantize_rows(const float[:, ::1] x, int qtype, Pool pool=None, const float[::1] quant_weights=None):
    """Float rows (n, k) -> uint8 (n, row_bytes) quantized to `qtype` with llama.cpp's reference
    algorithms (same bytes as edged.format.quants.quantize); rows split over the pool's threads.
    quant_weights (k,): an importance row (llama-imatrix's, for these rows' matrix or expert):
    llama.cpp's weighted algorithms instead (quantize_<type> with quant_weights)."""
    cdef int64_t n = x.shape[0], k = x.shape[1]
    if qtype < 0 or qtype >= ED_NTYPES or ED_TRAITS[qtype].ref == NULL or ED_TRAITS[qtype].block == 1:
        raise ValueError(f"no compiled quantizer for ggml type {qtype}")
    if k % ED_TRAITS[qtype].block:
        raise ValueError(f"row length {k} is not a multiple of the block size {ED_TRAITS[qtype].block}")
    if quant_weights is not None and quant_weights.shape[0] != k:
        raise ValueError(f"importance row has {quant_weights.shape[0]} values, the rows {k}")
    if quant_weights is not None and ed_quantize_row_w(qtype, NULL, NULL, NULL, 0) != 0:  # k = 0: only asks
        raise ValueError(f"no compiled importance-weighted quantizer for ggml type {qtype}")
    cdef size_t rb = <size_t>(k // ED_TRAITS[qtype].block) * ED_TRAITS[qtype].type_size
    out = np.empty((n, rb), np.uint8)
    if n == 0:
        return out
    cdef uint8_t[:, ::1] o = out
    cdef _q_args a
    a.x = &x[0, 0]; a.y = &o[0, 0]; a.k = k; a.rows = n; a.rb = rb; a.type = qtype
    a.qw = &quant_weights[0] if quant_weights is not None else NULL
    with nogil:
        if pool is None:
            _q_task(&a, 0, 1)
        else:
            ed_pool_run(pool.p, _q_task, &a)
    return out


# --- dequantization (ed_dequant.h): embedding row lookup ------------------------------------
cdef extern from "ed_dequant.h" nogil:
    int ed_dequantize_row(int type, const void *x, float *y, int64_t k)


def dequantize_rows(float[:, ::1] out, const uint8_t[::1] w, int qtype, const int64_t[::1] rows=None):
    """out[i] = row rows[i] (or row i) of the weight matrix W (rows of out.shape[1] elements
    of ggml type `qtype`), dequantized: the embedding lookup. Same bits as edged.format.quants."""
    _check_type(qtype)
    cdef int64_t k = out.shape[1], n = out.shape[0], i, r
    cdef int blk = ED_TRAITS[qtype].block
    if k % blk:
        raise ValueError(f"row length {k} is not a multiple of the block size {blk}")
    cdef size_t rb = <size_t>(k // blk) * ED_TRAITS[qtype].type_size
    cdef int64_t n_rows = w.shape[0] // rb
    if <size_t>w.shape[0] % rb:
        raise ValueError(f"weights: {w.shape[0]} bytes are not whole rows of {rb}")
    if rows is None:
        if n > n_rows:
            raise ValueError(f"{n} rows asked, the matrix has {n_rows}")
    else:
        if rows.shape[0] != n:
            raise ValueError(f"{rows.shape[0]} row indices for {n} output rows")
        for i in range(n):
            if rows[i] < 0 or rows[i] >= n_rows:
                raise IndexError(f"row {rows[i]} outside the matrix of {n_rows} rows")
    if n == 0:
        return out
    with nogil:
        for i in range(n):
            r = i if rows is None else rows[i]
            ed_dequantize_row(qtype, &w[0] + r * rb, &out[i, 0], k)
    return out


# --- weights repacked at load (ed_repack.h): the R4 layout of a path's row kernels ---------
cdef extern from "ed_simd.h" nogil:
    int ed_r4_ok(int type, int64_t ne0, int64_t ne1)
    int ed_r4_wanted(int type)
    void ed_r4_pack(int type, int K, const uint8_t *src, size_t row_bytes, int64_t nrows,
                    uint8_t *dst, uint8_t *tmp)
    void ed_r4_unpack_row(int type, int K, const uint8_t *group, int i, uint8_t *row)
    const int ED_R4_ROWS

cdef extern from "<sys/mman.h>" nogil:
    int madvise(void *addr, size_t length, int advice)
    int munlock(const void *addr, size_t length)
    const int MADV_DONTNEED

LAYOUT_MAPPED, LAYOUT_R4 = 0, 1
R4_ROWS = ED_R4_ROWS  # rows per group of the R4 layout: 8 on x86, 4 on Arm


def r4_types():
    """The weight types the selected path's row kernels read in the R4 layout (repacked at
    load, edged/engine/repack.py); none on most paths."""
    return [t for t in range(ED_NTYPES) if ed_r4_wanted(t)]


def r4_ok(int qtype, int64_t ne0, int64_t ne1):
    """Whether a matrix of ne1 rows of ne0 weights of `qtype` can take the R4 layout."""
    return bool(ed_r4_ok(qtype, ne0, ne1))


def r4_pack(uint8_t[::1] dst, const uint8_t[::1] src, int qtype, int64_t ne0, int64_t ne1):
    """dst = the matrix src (ne1 rows of ne0 weights of `qtype`, the mapped layout) in the R4
    layout: the same size; dst may be src itself (repacked in place)."""
    if not ed_r4_ok(qtype, ne0, ne1):
        raise ValueError(f"ggml type {qtype}, {ne1} rows of {ne0}: no R4 layout")
    cdef size_t rb = <size_t>(ne0 // ED_TRAITS[qtype].block) * ED_TRAITS[qtype].type_size
    if <size_t>src.shape[0] != rb * ne1 or dst.shape[0] != src.shape[0]:
        raise ValueError(f"R4 repack: {src.shape[0]} -> {dst.shape[0]} bytes for {ne1} rows of {rb}")
    cdef uint8_t *tmp = <uint8_t *>malloc(ED_R4_ROWS * rb)
    if tmp == NULL:
        raise MemoryError("R4 repack: one group of rows")
    with nogil:
        ed_r4_pack(qtype, <int>ne0, &src[0], rb, ne1, &dst[0], tmp)
    free(tmp)
    return dst


def r4_unpack(uint8_t[::1] dst, const uint8_t[::1] src, int qtype, int64_t ne0, int64_t ne1):
    """The inverse of r4_pack (tests): dst = the R4 matrix src back in the mapped layout."""
    if not ed_r4_ok(qtype, ne0, ne1):
        raise ValueError(f"ggml type {qtype}, {ne1} rows of {ne0}: no R4 layout")
    cdef size_t rb = <size_t>(ne0 // ED_TRAITS[qtype].block) * ED_TRAITS[qtype].type_size
    if <size_t>src.shape[0] != rb * ne1 or dst.shape[0] != src.shape[0]:
        raise ValueError(f"R4 unpack: {src.shape[0]} -> {dst.shape[0]} bytes for {ne1} rows of {rb}")
    cdef int64_t r
    with nogil:
        for r in range(ne1):
            ed_r4_unpack_row(qtype, <int>ne0, &src[0] + (r // ED_R4_ROWS) * ED_R4_ROWS * rb, r % ED_R4_ROWS,
                             &dst[0] + r * rb)
    return dst


def release_pages(const uint8_t[::1] mapped):
    """Drop this process's resident pages of a file mapping's bytes (the whole pages inside
    them): unlocked (mlockall locks them) and advised MADV_DONTNEED. The bytes stay readable;
    a later read pages them in again from the file. Returns the bytes released (0 when the
    kernel refused)."""
    if mapped.shape[0] == 0:
        return 0
    cdef size_t page = <size_t>sysconf(_SC_PAGESIZE)
    cdef uintptr_t a = <uintptr_t>&mapped[0], lo = (a + page - 1) // page * page
    cdef uintptr_t hi = (a + <size_t>mapped.shape[0]) // page * page
    if hi <= lo:
        return 0
    cdef int rc
    with nogil:
        munlock(<const void *>lo, hi - lo)
        rc = madvise(<void *>lo, hi - lo, MADV_DONTNEED)
    return 0 if rc else int(hi - lo)

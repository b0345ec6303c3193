# The encoder's per-layer float work (included from core.pyx after kernels.pxi; C in
# encoder.h): edged/engine/encoder.py calls these between its matrix products, on the model's
# thread pool. Checks first, then `with nogil:`; the caller owns every buffer.
#   enc_norm(x, w, b, eps, res=None, bias=None, pool=None)   x = LN(x + bias + res) * w + b
#   enc_act(h, bias=None, up=None, pool=None)                h = GELU(h + bias) | SiLU(h) * up
#   enc_attention(out, q, k, v, starts, n_head, scale, ...)  non-causal attention per sequence
#   enc_matmul_q8_0(out, w, x, pool=None)                   out = x W^T in llama.cpp's x86 order
#   enc_matmul_f16(out, w, x, pool=None)                    out = x W^T, matmul's bits, or None

cdef extern from "encoder.h" nogil:
    ctypedef struct ed_enc_norm_args:
        float *x
        const float *res
        const float *bias
        const float *w
        const float *b
        int64_t n
        int E
        float eps
    ctypedef struct ed_enc_act_args:
        float *h
        const float *bias
        const float *up
        int64_t n
        int F
    ctypedef struct ed_enc_attn_args:
        float *out
        float *q
        float *k
        float *v
        const float *qb
        const float *kb
        const float *vb
        const int64_t *starts
        const int32_t *pos
        float *ws
        size_t ws_floats
        size_t ld
        int64_t n_tokens
        int n_seq, H, D
        float scale, rope_base
        ed_pool *pool
    ctypedef struct ed_enc_mm_args:
        float *out
        const uint8_t *w
        const float *x
        uint8_t *xq
        uint8_t *al
        float *dy
        uint8_t *strips
        int64_t T
        int N, K
        ed_pool *pool
    ctypedef struct ed_enc_mm_f16_args:
        float *out
        const uint8_t *w
        const float *x
        uint8_t *xq
        float *xf
        int64_t T
        int N, K
        ed_pool *pool
    int ed_enc_mm_f16_ok(int K)
    int ED_ENC_BLOCKS
    void ed_enc_mm_f16_task(void *arg, int ith, int nth) noexcept
    void ed_enc_mm_q8_0_task(void *arg, int ith, int nth) noexcept
    enum: ED_STRIP_BLOCK
    enum: ED_ENC_QROWS
    void ed_enc_norm_task(void *arg, int ith, int nth) noexcept
    void ed_enc_act_task(void *arg, int ith, int nth) noexcept
    void ed_enc_attn_task(void *arg, int ith, int nth) noexcept


cdef inline void _enc_run(Pool pool, ed_task_fn fn, void *arg) noexcept nogil:
    if pool is None:
        fn(arg, 0, 1)
    else:
        ed_pool_run(pool.p, fn, arg)


cdef const float *_vec_or_null(const float[::1] v, int n, str what) except? NULL:
    if v is None:
        return NULL
    if v.shape[0] != n:
        raise ValueError(f"{what} has {v.shape[0]} values, expected {n}")
    return &v[0]


def enc_norm(float[:, ::1] x, const float[::1] w, const float[::1] b, float eps,
             const float[:, ::1] res=None, const float[::1] bias=None, Pool pool=None):
    """In place, row by row: x = LayerNorm(x + bias + res) * w + b (ggml_norm, then the norm's
    weight and bias); bias (the preceding product's) and res (the residual) may be None."""
    cdef int E = x.shape[1]
    if w.shape[0] != E or b.shape[0] != E:
        raise ValueError(f"enc_norm: w/b have {w.shape[0]}/{b.shape[0]} values, rows have {E}")
    if res is not None and (res.shape[0] != x.shape[0] or res.shape[1] != E):
        raise ValueError("enc_norm: res and x shapes differ")
    cdef ed_enc_norm_args a
    a.x = &x[0, 0] if x.shape[0] else NULL
    a.res = &res[0, 0] if res is not None and x.shape[0] else NULL
    a.bias = _vec_or_null(bias, E, "enc_norm: bias")
    a.w = &w[0]; a.b = &b[0]; a.n = x.shape[0]; a.E = E; a.eps = eps
    if a.n:
        with nogil:
            _enc_run(pool, ed_enc_norm_task, &a)


def enc_act(float[:, ::1] h, const float[::1] bias=None, const float[:, ::1] up=None, Pool pool=None):
    """In place: h = GELU(h + bias) (llama.cpp's F16-table GELU), or with `up` (a gated FFN),
    h = SiLU(h) * up."""
    cdef int F = h.shape[1]
    if up is not None and (up.shape[0] != h.shape[0] or up.shape[1] != F):
        raise ValueError("enc_act: up and h shapes differ")
    if up is not None and bias is not None:
        raise ValueError("enc_act: a gated FFN has no up bias here")
    cdef ed_enc_act_args a
    a.h = &h[0, 0] if h.shape[0] else NULL
    a.bias = _vec_or_null(bias, F, "enc_act: bias")
    a.up = &up[0, 0] if up is not None and h.shape[0] else NULL
    a.n = h.shape[0]; a.F = F
    if a.n:
        with nogil:
            _enc_run(pool, ed_enc_act_task, &a)


def enc_attention(float[:, ::1] out, float[:, :] q, float[:, :] k, float[:, :] v,
                  const int64_t[::1] starts, int n_head, float scale,
                  const float[::1] q_bias=None, const float[::1] k_bias=None,
                  const float[::1] v_bias=None, float rope_base=0.0, Pool pool=None):
    """Non-causal attention of the sequences whose rows are starts[i]:starts[i+1]: out (n,
    n_head * head_dim) = softmax(scale * q k^T) v per sequence and head. q, k, v: (n, n_head *
    head_dim) rows with the same row stride (e.g. column slices of one fused qkv product);
    their biases are added and, with rope_base > 0, NeoX RoPE at positions 0.. of each
    sequence applied to q and k, in place."""
    cdef int64_t n = q.shape[0]
    cdef int Qd = q.shape[1], ns = starts.shape[0] - 1, s, D
    if n_head < 1 or Qd % n_head or (Qd // n_head) % 2:
        raise ValueError(f"enc_attention: {Qd} columns do not make {n_head} heads of even size")
    D = Qd // n_head
    if k.shape[0] != n or v.shape[0] != n or out.shape[0] != n \
            or k.shape[1] != Qd or v.shape[1] != Qd or out.shape[1] != Qd:
        raise ValueError("enc_attention: shapes of q, k, v and out differ")
    if q.strides[1] != 4 or k.strides[1] != 4 or v.strides[1] != 4 \
            or k.strides[0] != q.strides[0] or v.strides[0] != q.strides[0] or q.strides[0] % 4:
        raise ValueError("enc_attention: q, k, v need unit column stride and one row stride")
    if ns < 1 or starts[0] != 0 or starts[ns] != n:
        raise ValueError(f"enc_attention: starts must run from 0 to {n}")
    cdef int64_t nmax = 0
    for s in range(ns):
        if starts[s + 1] <= starts[s]:
            raise ValueError(f"enc_attention: sequence {s} is empty or starts go backwards")
        nmax = max(nmax, starts[s + 1] - starts[s])
    pos = np.concatenate([np.arange(starts[s + 1] - starts[s], dtype=np.int32) for s in range(ns)])
    cdef const int32_t[::1] posv = pos
    cdef int nth = pool.p.n_threads if pool is not None else 1
    cdef size_t wsf = <size_t>((ED_ENC_QROWS + 2 * D) * nmax)  # a block's scores, V^T, K
    ws = np.empty(nth * wsf, np.float32)
    cdef float[::1] wsv = ws
    cdef ed_enc_attn_args a
    a.out = &out[0, 0]; a.q = &q[0, 0]; a.k = &k[0, 0]; a.v = &v[0, 0]
    a.qb = _vec_or_null(q_bias, Qd, "enc_attention: q_bias")
    a.kb = _vec_or_null(k_bias, Qd, "enc_attention: k_bias")
    a.vb = _vec_or_null(v_bias, Qd, "enc_attention: v_bias")
    a.starts = &starts[0]; a.pos = &posv[0]; a.ws = &wsv[0]; a.ws_floats = wsf
    a.ld = <size_t>(q.strides[0] // 4); a.n_tokens = n; a.n_seq = ns; a.H = n_head; a.D = D
    a.scale = scale; a.rope_base = rope_base; a.pool = pool.p if pool is not None else NULL
    with nogil:
        _enc_run(pool, ed_enc_attn_task, &a)
    return out


def enc_matmul_q8_0(float[:, ::1] out, const uint8_t[::1] w, const float[:, ::1] x, Pool pool=None):
    """out[t, r] = W[r] . x[t] for a Q8_0 weight W (out.shape[1] rows of x.shape[1] values),
    x quantized to Q8_0 first, each product in llama.cpp's x86 order (ed_parity.h) on every
    kernel path: an encoder's products, which embeddings compare with llama.cpp's closely."""
    cdef int64_t T = x.shape[0]
    cdef int K = x.shape[1], N = out.shape[1]
    if out.shape[0] != T:
        raise ValueError(f"enc_matmul_q8_0: out has {out.shape[0]} rows, x has {T}")
    if K % 32 or K == 0:
        raise ValueError(f"enc_matmul_q8_0: row length {K} is not a multiple of 32")
    cdef size_t rb = <size_t>(K // 32) * 34
    if <size_t>w.shape[0] != rb * N:
        raise ValueError(f"enc_matmul_q8_0: {w.shape[0]} weight bytes, expected {rb * N} "
                         f"for {N} Q8_0 rows of {K}")
    if T == 0 or N == 0:
        return out
    cdef int nth = pool.p.n_threads if pool is not None else 1
    xq = np.empty(T * rb, np.uint8)
    al = np.empty(T * K, np.uint8)
    dy = np.empty(T * (K // 32), np.float32)
    strips = np.empty(nth * (K // 32) * ED_STRIP_BLOCK, np.uint8)
    cdef uint8_t[::1] xqv = xq, alv = al, sv = strips
    cdef float[::1] dyv = dy
    cdef ed_enc_mm_args a
    a.out = &out[0, 0]; a.w = &w[0]; a.x = &x[0, 0]; a.xq = &xqv[0]
    a.al = &alv[0]; a.dy = &dyv[0]; a.strips = &sv[0]
    a.T = T; a.N = N; a.K = K; a.pool = pool.p if pool is not None else NULL
    with nogil:
        _enc_run(pool, ed_enc_mm_q8_0_task, &a)
    return out


def enc_matmul_f16(float[:, ::1] out, const uint8_t[::1] w, const float[:, ::1] x, Pool pool=None):
    """out[t, r] = W[r] . x[t] for an F16 weight W (out.shape[1] rows of x.shape[1] values), x
    rounded to F16: matmul's bits (the path's F16 row kernel), faster for a batch of tokens
    (an image's patches). Returns out, or None where the path has no block kernel for it (then
    call matmul)."""
    cdef int64_t T = x.shape[0]
    cdef int K = x.shape[1], N = out.shape[1]
    if out.shape[0] != T:
        raise ValueError(f"enc_matmul_f16: out has {out.shape[0]} rows, x has {T}")
    if <size_t>w.shape[0] != <size_t>K * 2 * N:
        raise ValueError(f"enc_matmul_f16: {w.shape[0]} weight bytes, expected {K * 2 * N} "
                         f"for {N} F16 rows of {K}")
    if T < 4 or N == 0 or not ed_enc_mm_f16_ok(K):
        return None
    xq = np.empty(T * K * 2, np.uint8)
    xf = np.empty(T * K, np.float32)
    cdef uint8_t[::1] xqv = xq
    cdef float[::1] xfv = xf
    cdef ed_enc_mm_f16_args a
    a.out = &out[0, 0]; a.w = &w[0]; a.x = &x[0, 0]; a.xq = &xqv[0]; a.xf = &xfv[0]
    a.T = T; a.N = N; a.K = K; a.pool = pool.p if pool is not None else NULL
    with nogil:
        _enc_run(pool, ed_enc_mm_f16_task, &a)
    return out


def enc_blocks(on=None):
    """Whether enc_attention and enc_matmul_f16 use the block kernels of encoder_x86.h (the
    default); with on, set it (tests compare the two) and return the old setting."""
    global ED_ENC_BLOCKS
    old = bool(ED_ENC_BLOCKS)
    if on is not None:
        ED_ENC_BLOCKS = 1 if on else 0
    return old

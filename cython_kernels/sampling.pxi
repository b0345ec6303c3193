# The sampler's per-token work in compiled code (included from core.pyx). The NumPy twin is
# edged.sampling.sample_reference; both take the same arguments and give the same token.
from libc.math cimport exp, log, INFINITY
from libc.stdlib cimport malloc, free, qsort
from libc.stdint cimport int32_t

cdef struct _cand:
    float logit
    int32_t id

cdef int _cand_cmp(const void *a, const void *b) noexcept nogil:
    # descending by logit, ties: lower id first (the reference's stable argsort of -x)
    cdef const _cand *x = <const _cand *>a
    cdef const _cand *y = <const _cand *>b
    if x.logit > y.logit: return -1
    if x.logit < y.logit: return 1
    return -1 if x.id < y.id else (1 if x.id > y.id else 0)


cdef inline void _heap_sift_down(_cand *h, int n, int i) noexcept nogil:
    # min-heap on (logit, -id): the root is the worst of the kept top-k
    cdef int l, r, s
    cdef _cand t
    while True:
        l = 2 * i + 1; r = l + 1; s = i
        if l < n and _cand_cmp(&h[l], &h[s]) > 0: s = l
        if r < n and _cand_cmp(&h[r], &h[s]) > 0: s = r
        if s == i: return
        t = h[i]; h[i] = h[s]; h[s] = t
        i = s


cdef int _sample(float *x, int n, int top_k, float top_p, float min_p, float temp, double u) noexcept nogil:
    cdef int i, k, m = 0, keep
    cdef float mx = -INFINITY
    cdef int am = 0
    cdef double total = 0.0, cum, thr, target, p0
    cdef _cand *c
    for i in range(n):
        if x[i] > mx:
            mx = x[i]; am = i
    if temp <= 0:
        return am
    if mx == INFINITY:
        # a +inf logit (a bias or a penalty overflowed float: repeat_penalty 1e-300 is 0.0f)
        # takes all the probability mass; the windowing below would never converge on it
        return am
    if top_k > 0 and top_k < n:
        k = top_k
        c = <_cand *>malloc(k * sizeof(_cand))
        if c == NULL: return am
        for i in range(k):
            c[i].logit = x[i]; c[i].id = i
        for i in range(k // 2 - 1, -1, -1):
            _heap_sift_down(c, k, i)
        for i in range(k, n):
            if x[i] > c[0].logit:
                c[0].logit = x[i]; c[0].id = i
                _heap_sift_down(c, k, 0)
        m = k
        for i in range(m):
            total += exp(<double>c[i].logit - mx)
    else:
        # normalise over the whole vocabulary, then keep only what can matter: tokens within
        # a window of the max, widened until it holds the top-p mass (the nucleus is a prefix
        # of the sorted order, and so is any window)
        for i in range(n):
            total += exp(<double>x[i] - mx)
        c = <_cand *>malloc(n * sizeof(_cand))
        if c == NULL: return am
        thr = 8.0
        while True:
            m = 0; cum = 0.0
            for i in range(n):
                if x[i] >= mx - thr:
                    c[m].logit = x[i]; c[m].id = i; m += 1
                    cum += exp(<double>x[i] - mx)
            # thr >= 1e30: stop even when NaN logits or top_p > 1 keep the mass from adding up
            if m == n or cum / total >= top_p or thr >= 1e30:
                if top_p >= 1.0 and m < n and thr < 1e30:
                    # no nucleus cut: min-p alone bounds the candidates, else take them all
                    thr = (-log(min_p) + 1e-3) if min_p > 0.0 else 1e38
                    if thr >= 1e30 or thr > 8.0:
                        continue
                    # min-p window is narrower than the first one: rebuild with it
                    m = 0
                    for i in range(n):
                        if x[i] >= mx - thr:
                            c[m].logit = x[i]; c[m].id = i; m += 1
                break
            thr *= 2.0           # any window holding the nucleus gives the same result
    qsort(c, m, sizeof(_cand), _cand_cmp)
    keep = m
    if top_p < 1.0:
        cum = 0.0
        for i in range(m):
            cum += exp(<double>c[i].logit - mx) / total
            if cum >= top_p:
                keep = i + 1
                break
    if min_p > 0.0:
        p0 = exp(<double>c[0].logit - mx) / total
        for i in range(keep):
            if exp(<double>c[i].logit - mx) / total < min_p * p0:
                keep = i
                break
        if keep < 1: keep = 1
    cum = 0.0
    for i in range(keep):
        cum += exp((<double>c[i].logit - c[0].logit) / temp)
    target = u * cum
    cum = 0.0
    k = c[keep - 1].id
    for i in range(keep):
        cum += exp((<double>c[i].logit - c[0].logit) / temp)
        if cum > target:
            k = c[i].id
            break
    free(c)
    return k


def sample_logits(const float[::1] logits, const int32_t[::1] bias_ids, const float[::1] bias_vals,
                  const int32_t[::1] pen_ids, const int32_t[::1] pen_counts, float repeat_penalty,
                  float presence_penalty, float frequency_penalty, float temperature, int top_k,
                  float top_p, float min_p, double u):
    """Bias, penalties, then greedy or top-k/top-p/min-p/temperature with the uniform draw u."""
    cdef int n = logits.shape[0], i, t
    cdef float v
    cdef float *x = <float *>malloc(n * sizeof(float))
    if x == NULL:
        raise MemoryError()
    for i in range(bias_ids.shape[0]):
        if not 0 <= bias_ids[i] < n:
            free(x)
            raise ValueError(f"logit_bias id {bias_ids[i]} out of range")
    for i in range(pen_ids.shape[0]):
        if not 0 <= pen_ids[i] < n:
            free(x)
            raise ValueError(f"penalty id {pen_ids[i]} out of range")
    with nogil:
        for i in range(n):
            x[i] = logits[i]
        for i in range(bias_ids.shape[0]):
            x[bias_ids[i]] += bias_vals[i]
        for i in range(pen_ids.shape[0]):
            t = pen_ids[i]
            v = x[t]
            v = v / repeat_penalty if v > 0 else v * repeat_penalty
            v -= pen_counts[i] * frequency_penalty + (presence_penalty if pen_counts[i] > 0 else 0.0)
            x[t] = v
        t = _sample(x, n, top_k, top_p, min_p, temperature, u)
    free(x)
    return t

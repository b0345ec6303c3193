# The sampler's per-token work in compiled code (included from core.pyx, after forward.pxi). The
# NumPy twin is edged.text.sampling.sample_reference; both take the same arguments and give the same
# token (up to the rounding of a sum's order, ~1e-15).
#
# No full sort of the vocabulary. Every cut in the chain (top-k, top-p, min-p, the draw) is a
# prefix of the vocabulary sorted by logit. So: the totals the cuts need come from one vector
# pass (ed_sample.h: exp in double); the tokens within a distance t of the max are gathered
# (t = -log(min_p) when min-p bounds the kept set, else 4, growing by 2 or sqrt(2) until the bucket
# counts prove the gathered tokens hold the k-th token / the top-p mass / the drawn mass); they
# are grouped by buckets of width 1/_BW of that distance (bucket order is sorted order); the
# walks then sum whole buckets and sort only the one bucket a cut falls inside. If rounding
# leaves a cut just outside, the walk is redone over the whole vocabulary.
from libc.math cimport exp, log, INFINITY
from libc.stdlib cimport malloc, free, qsort
from libc.stdint cimport int32_t, uint16_t, uint8_t, uint32_t

cdef extern from "ed_sample.h" nogil:
    int _NB "ED_SNB"      # buckets; the last one holds everything from d >= (_NB - 1) / _BW on
    float _BW "ED_SBW"    # buckets per unit of logit
    int _bucket "ed_sbucket"(float v, float mx)
    float ed_smax(const float *x, int n)
    double ed_sexp(const float *x, int n, float mx, double s, double *out)
    void ed_shist(const float *x, int n, float mx, int *cnt, uint16_t *bk)
    int ed_sabove(const float *x, int n, float t, int32_t *idx, float *val)
    int ed_sfind(const float *x, int n, float t)

cdef enum:
    _NBMAX = 4096         # ED_SNB, for the stack arrays

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


cdef int _lb_bucket(const int *cnt, int m, double temp, double target) noexcept nogil:
    # the first bucket b such that buckets 0..b surely weigh more than `target` (weights
    # exp(-d / temp)): each token of bucket b weighs at least exp(-(b + 1) / _BW / temp), with
    # room for the float rounding of d; -1 if even all m tokens may not
    cdef int b, seen = 0
    cdef double lb = 0.0, r = exp(-1.0 / _BW / temp), wb = exp(-1e-5 / temp) * r
    for b in range(_NB - 1):
        lb += cnt[b] * wb
        wb *= r
        seen += cnt[b]
        if lb > target * (1.0 + 1e-9):
            return b
        if seen == m:
            break
    return -1


cdef struct _walk:
    _cand *c          # (m,) gathered candidates, grouped by bucket in bucket order
    float *xs         # (m,) their logits, contiguous for the vector exp
    double *w         # (m,) exp((logit - mx) * scale), valid below position wdone
    const int *start  # (_NB + 1,) start[b]: first position of bucket b
    char *sorted_     # (_NB,) bucket b's positions are in sorted order
    int m, wdone
    float mx
    double scale


cdef inline void _wupto(_walk *s, int e) noexcept nogil:
    # weights up to position e, computed ahead in chunks (the vector exp wants long runs)
    cdef int e2
    if e > s.wdone:
        e2 = s.wdone + 2048 if s.wdone + 2048 > e else e
        e2 = e2 if e2 < s.m else s.m
        ed_sexp(s.xs + s.wdone, e2 - s.wdone, s.mx, s.scale, s.w + s.wdone)
        s.wdone = e2


cdef int _sort_bucket(_walk *s, int j) noexcept nogil:
    # sorts the bucket holding position j (its weights follow); returns its first position
    cdef int b = _bucket(s.c[j].logit, s.mx), i, st = s.start[b], e = s.start[b + 1]
    if not s.sorted_[b]:
        qsort(s.c + st, e - st, sizeof(_cand), _cand_cmp)
        for i in range(st, e):
            s.xs[i] = s.c[i].logit
        if st < s.wdone:
            ed_sexp(s.xs + st, (e if e < s.wdone else s.wdone) - st, s.mx, s.scale, s.w + st)
        s.sorted_[b] = 1
    return st


cdef int _cross(_walk *s, int m, double target, bint strict, double div) noexcept nogil:
    # The first position j < m in sorted order where the running sum of w / div reaches target
    # (cum > target if strict, else cum >= target), or -1. Whole buckets are summed unsorted;
    # only the bucket where the sum crosses is sorted and walked one by one.
    cdef int j, e, p = 0
    cdef double cum = 0.0, before
    while p < m:
        e = s.start[_bucket(s.c[p].logit, s.mx) + 1]
        e = e if e < m else m
        _wupto(s, e)
        before = cum
        for j in range(p, e):
            cum += s.w[j] / div
        if (cum > target) if strict else (cum >= target):
            _sort_bucket(s, p)
            cum = before
            for j in range(p, e):
                cum += s.w[j] / div
                if (cum > target) if strict else (cum >= target):
                    return j
        p = e
    return -1


cdef inline size_t _al(size_t b) noexcept nogil:
    return (b + 63) & ~(<size_t>63)


cdef size_t _work_bytes(size_t n) noexcept nogil:
    # x copy, idx, xg, bk, then c, w, xs for up to n candidates
    return (_al(n * sizeof(float)) + _al(n * sizeof(int32_t)) + _al(n * sizeof(float))
            + _al(n * sizeof(uint16_t)) + _al(n * sizeof(_cand)) + _al(n * sizeof(double))
            + _al(n * sizeof(float)) + 64)


cdef int _sample(const float *x, int n, int top_k, double top_p, double min_p, double temp,
                 double u, uint8_t *work) noexcept nogil:
    # the token; work: _work_bytes(n) after the x copy's share, 64-byte aligned
    cdef int i, b, j, m, g, keep, res
    cdef float mx = ed_smax(x, n)
    cdef int am = ed_sfind(x, n, mx)
    cdef double t, total = 1.0, total_t = 0.0, thr
    cdef int cnt[_NBMAX]
    cdef int start[_NBMAX + 1]
    cdef char srt[_NBMAX]
    cdef int32_t *idx
    cdef float *xg
    cdef uint16_t *bk
    cdef const float *xv
    cdef _walk s
    cdef bint use_k = 0 < top_k < n, everything, enough, retry = False
    cdef bint all_kept = not use_k and top_p >= 1.0 and min_p <= 0.0
    cdef bint min_p_bound = min_p > 0.0 and (not use_k or top_p >= 1.0)
    # greedy; a +inf logit (a bias or a penalty overflowed float: repeat_penalty 1e-300 is
    # 0.0f) takes all the probability mass; no finite logit at all: nothing to weigh
    if temp <= 0 or mx == INFINITY or mx == -INFINITY:
        return am if am >= 0 else 0
    if not use_k and top_p < 1.0:
        total = ed_sexp(x, n, mx, 1.0, NULL)
    if all_kept:
        total_t = ed_sexp(x, n, mx, 1.0 / temp, NULL)
    # the tokens within t of the max, t growing until they surely hold every cut (min-p bounds
    # them at once: what it keeps is within -log(min_p) of the max)
    t = -log(min_p) + 1e-3 if min_p_bound else 4.0
    idx = <int32_t *>work
    xg = <float *>(work + _al(n * sizeof(int32_t)))
    bk = <uint16_t *>(<uint8_t *>xg + _al(n * sizeof(float)))
    s.c = <_cand *>(<uint8_t *>bk + _al(n * sizeof(uint16_t)))
    s.w = <double *>(<uint8_t *>s.c + _al(n * sizeof(_cand)))
    s.xs = <float *>(<uint8_t *>s.w + _al(n * sizeof(double)))
    while True:
        everything = t > 64.0
        if everything:
            m, xv = n, x
        else:
            m = ed_sabove(x, n, <float>(<double>mx - t), idx, xg)
            xv = xg
        ed_shist(xv, m, mx, cnt, bk)
        g = _NB - 1       # g: the last bucket any cut can reach
        if use_k:
            j = 0
            for g in range(_NB):
                j += cnt[g]
                if j >= top_k:
                    break
            enough = j >= top_k or min_p_bound   # fewer within the min-p window: no cut
        elif min_p_bound:
            enough = True
        elif top_p < 1.0:
            g = _lb_bucket(cnt, m, 1.0, top_p * total)
            enough = g >= 0
        else:
            g = _lb_bucket(cnt, m, temp, u * total_t)
            enough = g >= 0
        if not enough and not everything:
            # few tokens so far: double; else finer steps gather fewer tokens past the cut
            t *= 2.0 if m < 1024 else 1.4142135623730951
            continue
        if g < 0 or retry:
            g = _NB - 1
        # group buckets 0..g by bucket (counting sort, stable: ids ascend within a bucket)
        j = 0
        for b in range(_NB):
            start[b] = j
            srt[b] = 0
            if b <= g:
                j += cnt[b]
            cnt[b] = start[b]
        start[_NB] = j
        s.start, s.sorted_, s.mx, s.m, s.wdone = start, srt, mx, j, 0
        s.scale = 1.0 / temp if all_kept else 1.0
        for j in range(m):
            b = bk[j]
            if b <= g:
                i = cnt[b]
                cnt[b] += 1
                s.c[i].logit = xv[j]
                s.c[i].id = j if everything else idx[j]
                s.xs[i] = xv[j]
        m = s.m
        keep = m
        if use_k:         # top-k: sort the bucket holding the k-th, keep k
            if m > top_k:
                _sort_bucket(&s, top_k - 1)
                keep = top_k
            _wupto(&s, keep)
            total = 0.0
            for j in range(keep):
                total += s.w[j]
        if top_p < 1.0:   # the smallest prefix whose probability reaches top_p
            j = _cross(&s, keep, top_p, False, total)
            if j >= 0:
                keep = j + 1
            elif not use_k and not min_p_bound and not retry:
                t, retry = INFINITY, True  # rounding left the nucleus just outside
                continue
        if min_p > 0.0:   # the prefix with p >= min_p * p_max (p_max = 1 / total)
            thr = min_p * (1.0 / total)
            _wupto(&s, keep)
            j = 0
            while j < keep and s.w[j] / total >= thr:
                j += 1
            if j < keep:  # sort the bucket where it flips and look again there
                j = _sort_bucket(&s, j)
                while j < keep and s.w[j] / total >= thr:
                    j += 1
            keep = j if j > 0 else 1
        # the draw: weights exp((logit - max) / temp) over the kept prefix
        if s.scale != 1.0 / temp:
            s.scale, s.wdone = 1.0 / temp, 0
        if not all_kept:
            _wupto(&s, keep)
            total_t = 0.0
            for j in range(keep):
                total_t += s.w[j]
        j = _cross(&s, keep, u * total_t, True, 1.0)
        if j < 0 and all_kept and not retry:
            t, retry = INFINITY, True
            continue
        if j < 0:         # rounding: the last kept candidate, as the reference clamps
            _sort_bucket(&s, keep - 1)
            j = keep - 1
        return s.c[j].id



def sample_work_bytes(int n):
    """Bytes of scratch sample_logits needs for n logits (pass it as `work` to reuse it)."""
    return _work_bytes(n) + _al(n * sizeof(float))


def sample_logits(const float[::1] logits, params, const int32_t[::1] bias_ids,
                  const float[::1] bias_vals, const int32_t[::1] pen_ids,
                  const int32_t[::1] pen_counts, double u, uint8_t[::1] work=None,
                  const uint32_t[::1] mask=None):
    """Bias, penalties, then greedy or top-k/top-p/min-p/temperature with the uniform draw u.
    params: a SamplingParams (edged/text/sampling.py, already checked against its bounds); its
    logit bias comes as the arrays bias_ids / bias_vals. work: optional scratch of
    sample_work_bytes(len(logits)) bytes, reused across calls (a fresh allocation per token
    costs page faults). mask: optional allowed-token bitmask (structured output), bit i % 32 of
    word i // 32 set = token i may be drawn; the others are -inf before anything else."""
    cdef float repeat_penalty = params.repeat_penalty
    cdef double presence_penalty = params.presence_penalty
    cdef double frequency_penalty = params.frequency_penalty
    cdef double temperature = params.temperature
    cdef int top_k = params.top_k
    cdef double top_p = params.top_p, min_p = params.min_p
    cdef int n = logits.shape[0], i, t
    cdef float v
    cdef float *x
    cdef uint8_t *buf
    cdef uint8_t *own = NULL
    cdef const uint32_t *mk = NULL
    if n < 1:
        raise ValueError("empty logits")
    if mask is not None:
        if mask.shape[0] < (n + 31) // 32:
            raise ValueError(f"mask of {mask.shape[0]} words for {n} logits")
        mk = &mask[0]
    for i in range(bias_ids.shape[0]):
        if not 0 <= bias_ids[i] < n:
            raise ValueError(f"logit_bias id {bias_ids[i]} out of range")
    for i in range(pen_ids.shape[0]):
        if not 0 <= pen_ids[i] < n:
            raise ValueError(f"penalty id {pen_ids[i]} out of range")
    if pen_counts.shape[0] != pen_ids.shape[0] or bias_vals.shape[0] != bias_ids.shape[0]:
        raise ValueError("ids and values differ in length")
    if work is not None and <size_t>work.shape[0] >= _work_bytes(n) + _al(n * sizeof(float)):
        buf = &work[0]
    else:
        own = <uint8_t *>malloc(_work_bytes(n) + _al(n * sizeof(float)))
        if own == NULL:
            raise MemoryError()
        buf = own
    buf = <uint8_t *>_al(<size_t>buf)
    x = <float *>buf
    with nogil:
        for i in range(n):   # a NaN logit (a broken model) is never drawn: -inf
            v = logits[i]
            x[i] = v if v == v else -INFINITY
        if mk != NULL:       # tokens the grammar does not allow: -inf (bias cannot revive them)
            for i in range(n):
                if not (mk[i >> 5] >> (i & 31)) & 1:
                    x[i] = -INFINITY
        for i in range(bias_ids.shape[0]):
            x[bias_ids[i]] += bias_vals[i]
        for i in range(pen_ids.shape[0]):
            t = pen_ids[i]
            v = x[t]
            v = v / repeat_penalty if v > 0 else v * repeat_penalty
            # in double, then rounded once: what NumPy does with the int counts
            v = <float>(<double>v - (pen_counts[i] * frequency_penalty
                                     + (presence_penalty if pen_counts[i] > 0 else 0.0)))
            x[t] = v
        t = _sample(x, n, top_k, top_p, min_p, temperature, u, buf + _al(n * sizeof(float)))
    free(own)
    return t

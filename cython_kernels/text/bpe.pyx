# cython: language_level=3
"""Compiled core of edged's tokenizers (edged._bpe).

Three pieces, all over plain C arrays with the GIL released:

- the pre-tokenizers: llama.cpp splits text into words with a list of regexes chosen by
  `tokenizer.ggml.pre`; each regex is one *op* here, applied in turn to every piece the
  previous op produced (ops in edged/tokenizer.py, `PRE_TOKENIZERS`). Unicode categories come
  from a table generated from Unicode 15.1 (cython_kernels/text/unicode_ranges.h), the version
  llama.cpp's tables use; whitespace is Unicode's White_Space set (without U+001C..U+001F,
  as in llama.cpp).
- byte-level BPE (`BPEModel`): words as raw UTF-8 bytes, merges by rank, lowest rank first and
  leftmost first among equals (llama.cpp's priority queue). With `raw=True` the same merge loop
  runs over UTF-8 characters of a vocabulary written as plain text (Gemma 4's SentencePiece-style
  BPE: U+2581 for spaces, `<0xXX>` byte tokens for what no token covers).
- SentencePiece BPE (`SPMModel`): UTF-8 characters merged by vocabulary score, highest first
  and leftmost first among equals, then byte fallback.

Strings are interned once at load into a hash table (`StrTable`): a merge is then a lookup of
two integer ids, with no string built per step.
"""
from cpython.unicode cimport PyUnicode_READ, PyUnicode_KIND, PyUnicode_DATA, PyUnicode_GET_LENGTH
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy

cdef extern from "unicode_ranges.h":
    int EDGED_UNICODE_N_RANGES
    const unsigned int EDGED_UNICODE_RANGES[]

# --- Unicode flags ---------------------------------------------------------------------------
# low 4 bits: category code (1 unassigned, 2 N, 3 L, 4 Z, 5 M, 6 P, 7 S, 8 C); 0 = outside text
DEF CAT_MASK = 0x0F
DEF CAT_N = 2
DEF CAT_L = 3
DEF CAT_M = 5
DEF CAT_P = 6
DEF WS = 0x10
DEF N_CPS = 0x110000
DEF OOR = 0xFFFFFFFF        # "code point" outside the current piece

cdef uint8_t *UFLAGS = <uint8_t *> malloc(N_CPS)


cdef void _init_flags():
    cdef int i
    cdef uint32_t cp, end
    for i in range(EDGED_UNICODE_N_RANGES):
        end = EDGED_UNICODE_RANGES[2 * i + 2] if i + 1 < EDGED_UNICODE_N_RANGES else N_CPS
        for cp in range(EDGED_UNICODE_RANGES[2 * i], end):
            UFLAGS[cp] = <uint8_t> EDGED_UNICODE_RANGES[2 * i + 1]
    for cp in (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x2001, 0x2002,
               0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029,
               0x202F, 0x205F, 0x3000):
        UFLAGS[cp] |= WS


if UFLAGS == NULL:
    raise MemoryError("unicode table")
_init_flags()


def unicode_flags(str ch):
    """Flags of one character (tests): (category code, is_whitespace)."""
    cdef uint32_t cp = ord(ch)
    return UFLAGS[cp] & CAT_MASK, bool(UFLAGS[cp] & WS)


# --- growable int64 vector --------------------------------------------------------------------
cdef struct Vec:
    int64_t *d
    Py_ssize_t n
    Py_ssize_t cap


cdef int vec_push(Vec *v, int64_t x) except -1 nogil:
    cdef int64_t *nd
    if v.n == v.cap:
        v.cap = v.cap * 2 if v.cap else 64
        nd = <int64_t *> realloc(v.d, v.cap * sizeof(int64_t))
        if nd == NULL:
            with gil:
                raise MemoryError()
        v.d = nd
    v.d[v.n] = x
    v.n += 1
    return 0


# --- pre-tokenizer ops -------------------------------------------------------------------------
# op codes (mirrored in edged/tokenizer.py)
DEF OP_GPT2 = 1        # 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
DEF OP_LLAMA3 = 2      # (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
DEF OP_QWEN2 = 3       # as OP_LLAMA3 with \p{N} (one digit per word)
DEF OP_QWEN35 = 4      # as OP_QWEN2 with [\p{L}\p{M}]+ letter runs
DEF OP_RUN = 5         # CLASS+
DEF OP_ONE = 6         # CLASS
DEF OP_WS_RUN = 7      # \s?CLASS+
DEF OP_TRAIL_WS = 8    # \s+$
DEF OP_DIGITS3 = 9     # [0-9][0-9][0-9]
DEF OP_NEWLINES = 10   # [^\n]+|[\n]+
DEF OP_GPT4O = 11      # o200k (gpt-4o, gpt-oss), as llama.cpp runs it: see split_gpt4o
# classes
DEF CL_N = 1           # \p{N}
DEF CL_L = 2           # \p{L}
DEF CL_P = 3           # \p{P}
DEF CL_P_DEFAULT = 4   # [\p{P}\$\+<=>\^~\|]
DEF CL_P_FALCON = 5    # [\p{P}\$\+<=>\^~\|`]
DEF CL_CRLF = 6        # [\r\n]
DEF CL_RANGES = 7      # literal code point ranges (the op's own list)


cdef struct Text:
    const uint32_t *cp
    const uint8_t *fl


cdef inline uint8_t F(Text t, Py_ssize_t pos, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return t.fl[pos] if a <= pos < b else 0


cdef inline uint32_t C(Text t, Py_ssize_t pos, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return t.cp[pos] if a <= pos < b else OOR


cdef inline bint is_l(uint8_t f) noexcept nogil:
    return (f & CAT_MASK) == CAT_L


cdef inline bint is_n(uint8_t f) noexcept nogil:
    return (f & CAT_MASK) == CAT_N


cdef inline bint is_m(uint8_t f) noexcept nogil:
    return (f & CAT_MASK) == CAT_M


cdef inline bint is_ws(uint8_t f) noexcept nogil:
    return (f & WS) != 0


cdef inline uint32_t ascii_lower(uint32_t c) noexcept nogil:
    return c + 32 if 0x41 <= c <= 0x5A else c


cdef inline int contraction(Text t, Py_ssize_t pos, Py_ssize_t b, bint fold) noexcept nogil:
    """Length of 's 't 're 've 'm 'll 'd at pos (case-folded if fold), else 0."""
    cdef uint32_t n1, n2
    if t.cp[pos] != 0x27 or pos + 1 >= b:
        return 0
    n1 = t.cp[pos + 1]
    if fold:
        n1 = ascii_lower(n1)
    if n1 == 0x73 or n1 == 0x74 or n1 == 0x6D or n1 == 0x64:      # s t m d
        return 2
    if pos + 2 < b:
        n2 = t.cp[pos + 2]
        if fold:
            n2 = ascii_lower(n2)
        if (n1 == 0x72 and n2 == 0x65) or (n1 == 0x76 and n2 == 0x65) or (n1 == 0x6C and n2 == 0x6C):
            return 3                                                 # re ve ll
    return 0


cdef int split_gpt2(Text t, Py_ssize_t a, Py_ssize_t b, Vec *out) except -1 nogil:
    cdef Py_ssize_t pos = a, prev = a, nws
    cdef uint32_t cpt
    cdef uint8_t f, f2
    cdef int k
    while pos < b:
        cpt = t.cp[pos]
        f = t.fl[pos]
        k = contraction(t, pos, b, False)
        if k:
            pos += k
        else:
            f2 = F(t, pos + 1, a, b) if cpt == 0x20 else f
            if is_l(f2) or is_n(f2) or (not (is_ws(f2) or is_l(f2) or is_n(f2)) and f2 != 0):
                pos += (cpt == 0x20)
                if is_l(f2):
                    while is_l(f2):
                        pos += 1
                        f2 = F(t, pos, a, b)
                elif is_n(f2):
                    while is_n(f2):
                        pos += 1
                        f2 = F(t, pos, a, b)
                else:
                    while not (is_ws(f2) or is_l(f2) or is_n(f2)) and f2 != 0:
                        pos += 1
                        f2 = F(t, pos, a, b)
            else:
                nws = 0
                while is_ws(F(t, pos + nws, a, b)):
                    nws += 1
                if nws > 1 and pos + nws < b:
                    pos += nws - 1                 # \s+(?!\S)
                elif nws > 0:
                    pos += nws                     # \s+
                else:
                    pos += 1                       # no match: one code point
        if pos > prev:
            vec_push(out, pos - prev)
            prev = pos
    return 0


cdef inline Py_ssize_t ws_end(Text t, Py_ssize_t pos, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    """End of the match at pos of \\s*[\\r\\n]+|\\s+(?!\\S)|\\s+ (else of one code point)."""
    cdef Py_ssize_t nws = 0, last_rn = 0
    cdef uint32_t c2
    while is_ws(F(t, pos + nws, a, b)):
        c2 = t.cp[pos + nws]
        if c2 == 0x0D or c2 == 0x0A:
            last_rn = pos + nws + 1
        nws += 1
    if last_rn > 0:
        return last_rn                                 # \s*[\r\n]+
    if nws > 1 and pos + nws < b:
        return pos + nws - 1                           # \s+(?!\S)
    if nws > 0:
        return pos + nws                               # \s+
    return pos + 1


cdef int split_llama3(Text t, Py_ssize_t a, Py_ssize_t b, Vec *out, int variant) except -1 nogil:
    """variant: OP_LLAMA3 (\\p{N}{1,3}), OP_QWEN2 (\\p{N}), OP_QWEN35 (\\p{N}, letters with marks)."""
    cdef Py_ssize_t pos = a, prev = a, ini
    cdef uint32_t cpt, c2
    cdef uint8_t f, f2
    cdef bint marks = variant == OP_QWEN35
    cdef int k
    while pos < b:
        cpt = t.cp[pos]
        f = t.fl[pos]
        k = contraction(t, pos, b, True)
        if k:
            pos += k
            vec_push(out, pos - prev)
            prev = pos
            continue
        # [^\r\n\p{L}\p{N}]?\p{L}+   (qwen35: [\p{L}\p{M}]+)
        if not (cpt == 0x0D or cpt == 0x0A or is_n(f)):
            f2 = F(t, pos + 1, a, b)
            if is_l(f) or is_l(f2) or (marks and (is_m(f) or is_m(f2))):
                pos += 1
                f2 = F(t, pos, a, b)
                while is_l(f2) or (marks and is_m(f2)):
                    pos += 1
                    f2 = F(t, pos, a, b)
                vec_push(out, pos - prev)
                prev = pos
                continue
        if is_n(f):
            if variant == OP_LLAMA3:                   # \p{N}{1,3}
                ini = pos
                while is_n(F(t, pos, a, b)):
                    pos += 1
                    if pos - ini >= 3:
                        vec_push(out, pos - prev)
                        prev = pos
                        ini = pos
            else:                                      # \p{N}
                pos += 1
            if pos > prev:
                vec_push(out, pos - prev)
                prev = pos
            continue
        # ' ?[^\s\p{L}\p{N}]+[\r\n]*'   (qwen35 also excludes \p{M})
        f2 = F(t, pos + 1, a, b) if cpt == 0x20 else f
        if not (is_ws(f2) or is_l(f2) or is_n(f2) or (marks and is_m(f2))) and f != 0:
            pos += (cpt == 0x20)
            while not (is_ws(f2) or is_l(f2) or is_n(f2) or (marks and is_m(f2))) and f2 != 0:
                pos += 1
                f2 = F(t, pos, a, b)
            c2 = C(t, pos, a, b)
            while c2 == 0x0D or c2 == 0x0A:
                pos += 1
                c2 = C(t, pos, a, b)
            vec_push(out, pos - prev)
            prev = pos
            continue
        pos = ws_end(t, pos, a, b)
        vec_push(out, pos - prev)
        prev = pos
    return 0


cdef inline bint is_upper(uint32_t c, uint8_t f) noexcept nogil:
    """(?=[\p{L}])[^a-z]: a letter that is not an ASCII lower-case one."""
    return is_l(f) and not (0x61 <= c <= 0x7A)


cdef inline bint is_lower(uint32_t c, uint8_t f) noexcept nogil:
    """(?=[\p{L}])[^A-Z]: a letter that is not an ASCII capital (other letters are both)."""
    return is_l(f) and not (0x41 <= c <= 0x5A)


cdef inline Py_ssize_t lower_run(Text t, Py_ssize_t pos, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    while pos < b and is_lower(t.cp[pos], t.fl[pos]):
        pos += 1
    return pos


cdef int split_gpt4o(Text t, Py_ssize_t a, Py_ssize_t b, Vec *out) except -1 nogil:
    """llama.cpp's o200k regex (the case classes as lookaheads, run by std::regex):
         [^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+CONTR?
        |[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*CONTR?
        |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
       CONTR = '[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD], alternatives in order.
       A non-ASCII letter counts as both upper and lower case there."""
    cdef Py_ssize_t pos = a, prev = a, q, u, j, ini
    cdef uint32_t cpt, c2
    cdef uint8_t f, f2
    while pos < b:
        cpt = t.cp[pos]
        f = t.fl[pos]
        # the words: an optional leading [^\r\n\p{L}\p{N}], then letters
        q = pos
        if not (is_l(f) or is_n(f) or cpt == 0x0D or cpt == 0x0A) and is_l(F(t, pos + 1, a, b)):
            q = pos + 1
        if is_l(F(t, q, a, b)):
            u = q                                      # the upper-case run (greedy)
            while u < b and is_upper(t.cp[u], t.fl[u]):
                u += 1
            if u < b and is_lower(t.cp[u], t.fl[u]):   # 1st: upper* lower+
                pos = lower_run(t, u, a, b)
            else:
                j = u - 1                              # 1st, backtracking the upper run to
                while j >= q and t.cp[j] < 0x80:       # its last letter that is also lower
                    j -= 1
                pos = lower_run(t, j, a, b) if j >= q else u   # else 2nd: upper+ lower*
            if pos < b:
                pos += contraction(t, pos, b, True)
            vec_push(out, pos - prev)
            prev = pos
            continue
        if is_n(f):                                    # \p{N}{1,3}
            ini = pos
            while pos < b and is_n(t.fl[pos]) and pos - ini < 3:
                pos += 1
            vec_push(out, pos - prev)
            prev = pos
            continue
        # ' ?[^\s\p{L}\p{N}]+[\r\n/]*'
        f2 = F(t, pos + 1, a, b) if cpt == 0x20 else f
        if not (is_ws(f2) or is_l(f2) or is_n(f2)) and f2 != 0:
            pos += (cpt == 0x20)
            while not (is_ws(f2) or is_l(f2) or is_n(f2)) and f2 != 0:
                pos += 1
                f2 = F(t, pos, a, b)
            c2 = C(t, pos, a, b)
            while c2 == 0x0D or c2 == 0x0A or c2 == 0x2F:
                pos += 1
                c2 = C(t, pos, a, b)
            vec_push(out, pos - prev)
            prev = pos
            continue
        pos = ws_end(t, pos, a, b)
        vec_push(out, pos - prev)
        prev = pos
    return 0


cdef inline bint in_class(Text t, Py_ssize_t pos, int cls, const uint32_t *rng, Py_ssize_t nrng) noexcept nogil:
    cdef uint32_t c = t.cp[pos]
    cdef uint8_t f = t.fl[pos]
    cdef uint8_t cat = f & CAT_MASK
    cdef Py_ssize_t lo, hi, mid
    if cls == CL_N:
        return cat == CAT_N
    if cls == CL_L:
        return cat == CAT_L
    if cls == CL_P:
        return cat == CAT_P
    if cls == CL_P_DEFAULT or cls == CL_P_FALCON:
        if cat == CAT_P:
            return True
        if c == 0x24 or c == 0x2B or c == 0x3C or c == 0x3D or c == 0x3E or c == 0x5E or c == 0x7E or c == 0x7C:
            return True
        return cls == CL_P_FALCON and c == 0x60
    if cls == CL_CRLF:
        return c == 0x0D or c == 0x0A
    # literal ranges: llama.cpp matches these on text where non-ASCII whitespace became U+000B
    if c >= 0x80 and (f & WS):
        return False
    lo = 0
    hi = nrng
    while lo < hi:                                     # first range with end >= c
        mid = (lo + hi) // 2
        if rng[2 * mid + 1] < c:
            lo = mid + 1
        else:
            hi = mid
    return lo < nrng and rng[2 * lo] <= c


cdef int split_regex(Text t, Py_ssize_t a, Py_ssize_t b, Vec *out, int op, int cls,
                     const uint32_t *rng, Py_ssize_t nrng) except -1 nogil:
    """Leftmost non-overlapping matches of one simple regex; the text between matches is kept
    as pieces of its own (llama.cpp's std::regex splitting)."""
    cdef Py_ssize_t p = a, q, last = a
    while p < b:
        q = -1
        if op == OP_RUN or op == OP_ONE:
            if in_class(t, p, cls, rng, nrng):
                q = p + 1
                if op == OP_RUN:
                    while q < b and in_class(t, q, cls, rng, nrng):
                        q += 1
        elif op == OP_WS_RUN:
            if is_ws(t.fl[p]) and p + 1 < b and in_class(t, p + 1, cls, rng, nrng):
                q = p + 2
            elif in_class(t, p, cls, rng, nrng):
                q = p + 1
            if q >= 0:
                while q < b and in_class(t, q, cls, rng, nrng):
                    q += 1
        elif op == OP_TRAIL_WS:
            q = b
            while q > p and is_ws(t.fl[q - 1]):
                q -= 1
            if q == b:
                break
            p = q                                      # the trailing whitespace run
            q = b
        elif op == OP_NEWLINES:                        # every piece matches: runs of \n or of the rest
            q = p + 1
            while q < b and (t.cp[q] == 0x0A) == (t.cp[p] == 0x0A):
                q += 1
        elif op == OP_DIGITS3:
            if (p + 2 < b and 0x30 <= t.cp[p] <= 0x39 and 0x30 <= t.cp[p + 1] <= 0x39
                    and 0x30 <= t.cp[p + 2] <= 0x39):
                q = p + 3
        if q < 0:
            p += 1
            continue
        if p > last:
            vec_push(out, p - last)
        vec_push(out, q - p)
        last = q
        p = q
    if b > last:
        vec_push(out, b - last)
    return 0


cdef class PreTokenizer:
    """A list of ops; `split(text)` -> words (tests and debugging)."""
    cdef int n_ops
    cdef int ops[16]
    cdef int classes[16]
    cdef uint32_t *ranges[16]
    cdef Py_ssize_t n_ranges[16]

    def __cinit__(self, list ops):
        cdef int i
        cdef Py_ssize_t j
        if len(ops) > 16:
            raise ValueError("too many pre-tokenizer ops")
        self.n_ops = len(ops)
        for i in range(16):
            self.ranges[i] = NULL
            self.n_ranges[i] = 0
        for i, (op, cls, rng) in enumerate(ops):
            self.ops[i] = op
            self.classes[i] = cls
            if rng:
                self.ranges[i] = <uint32_t *> malloc(2 * len(rng) * sizeof(uint32_t))
                if self.ranges[i] == NULL:
                    raise MemoryError()
                for j, (lo, hi) in enumerate(rng):
                    self.ranges[i][2 * j] = lo
                    self.ranges[i][2 * j + 1] = hi
                self.n_ranges[i] = len(rng)

    def __dealloc__(self):
        for i in range(16):
            free(self.ranges[i])

    cdef int run(self, Text t, Py_ssize_t n, Vec *words) except -1 nogil:
        """Split t[0:n] into words: piece lengths (code points) in `words`."""
        cdef Vec cur, nxt, tmp
        cdef int i
        cdef Py_ssize_t k, start, ln
        cur.d = NULL; cur.n = 0; cur.cap = 0
        nxt.d = NULL; nxt.n = 0; nxt.cap = 0
        try:
            if n > 0:
                vec_push(&cur, n)
            for i in range(self.n_ops):
                nxt.n = 0
                start = 0
                for k in range(cur.n):
                    ln = cur.d[k]
                    if self.ops[i] == OP_GPT2:
                        split_gpt2(t, start, start + ln, &nxt)
                    elif self.ops[i] == OP_LLAMA3 or self.ops[i] == OP_QWEN2 or self.ops[i] == OP_QWEN35:
                        split_llama3(t, start, start + ln, &nxt, self.ops[i])
                    elif self.ops[i] == OP_GPT4O:
                        split_gpt4o(t, start, start + ln, &nxt)
                    else:
                        split_regex(t, start, start + ln, &nxt, self.ops[i], self.classes[i],
                                    self.ranges[i], self.n_ranges[i])
                    start += ln
                tmp = cur
                cur = nxt
                nxt = tmp
            words.n = 0
            for k in range(cur.n):
                vec_push(words, cur.d[k])
        finally:
            free(cur.d)
            free(nxt.d)
        return 0

    def split(self, str text):
        cdef TextBuf tb = TextBuf(text)
        cdef Vec words
        cdef Py_ssize_t k, start = 0
        words.d = NULL; words.n = 0; words.cap = 0
        try:
            self.run(tb.text(), tb.n, &words)
            res = []
            for k in range(words.n):
                res.append(text[start:start + words.d[k]])
                start += words.d[k]
            return res
        finally:
            free(words.d)


cdef class TextBuf:
    """A str as code points + flags + UTF-8 bytes (lone surrogates as 3-byte sequences, the
    way `surrogatepass` writes them) with the byte offset of every code point."""
    cdef uint32_t *cp
    cdef uint8_t *fl
    cdef unsigned char *utf8
    cdef int64_t *boff
    cdef Py_ssize_t n

    def __cinit__(self, str s):
        cdef Py_ssize_t i, nb = 0
        cdef int kind = PyUnicode_KIND(s)
        cdef void *data = PyUnicode_DATA(s)
        cdef uint32_t c
        self.n = PyUnicode_GET_LENGTH(s)
        self.cp = <uint32_t *> malloc((self.n + 1) * sizeof(uint32_t))
        self.fl = <uint8_t *> malloc(self.n + 1)
        self.boff = <int64_t *> malloc((self.n + 1) * sizeof(int64_t))
        self.utf8 = <unsigned char *> malloc(4 * self.n + 1)
        if self.cp == NULL or self.fl == NULL or self.boff == NULL or self.utf8 == NULL:
            raise MemoryError()
        for i in range(self.n):
            c = PyUnicode_READ(kind, data, i)
            self.cp[i] = c
            self.fl[i] = UFLAGS[c]
            self.boff[i] = nb
            if c < 0x80:
                self.utf8[nb] = c
                nb += 1
            elif c < 0x800:
                self.utf8[nb] = 0xC0 | (c >> 6)
                self.utf8[nb + 1] = 0x80 | (c & 0x3F)
                nb += 2
            elif c < 0x10000:
                self.utf8[nb] = 0xE0 | (c >> 12)
                self.utf8[nb + 1] = 0x80 | ((c >> 6) & 0x3F)
                self.utf8[nb + 2] = 0x80 | (c & 0x3F)
                nb += 3
            else:
                self.utf8[nb] = 0xF0 | (c >> 18)
                self.utf8[nb + 1] = 0x80 | ((c >> 12) & 0x3F)
                self.utf8[nb + 2] = 0x80 | ((c >> 6) & 0x3F)
                self.utf8[nb + 3] = 0x80 | (c & 0x3F)
                nb += 4
        self.boff[self.n] = nb

    def __dealloc__(self):
        free(self.cp)
        free(self.fl)
        free(self.boff)
        free(self.utf8)

    cdef Text text(self) noexcept nogil:
        cdef Text t
        t.cp = self.cp
        t.fl = self.fl
        return t


# --- interned strings ------------------------------------------------------------------------
cdef inline uint64_t fnv1a(const unsigned char *p, Py_ssize_t n) noexcept nogil:
    cdef uint64_t h = 1469598103934665603ULL
    cdef Py_ssize_t i
    for i in range(n):
        h = (h ^ p[i]) * 1099511628211ULL
    h ^= h >> 33                                       # mix the high bits into the low ones
    h *= 0xFF51AFD7ED558CCDULL
    h ^= h >> 33
    return h


cdef class StrTable:
    """Byte strings -> dense ids (sid), open addressing over one pool."""
    cdef unsigned char *pool
    cdef int64_t pool_len, pool_cap
    cdef int64_t *off
    cdef int32_t *ln
    cdef int32_t n, cap
    cdef int32_t *slots
    cdef uint64_t mask

    def __cinit__(self, Py_ssize_t expected):
        cdef uint64_t size = 1024
        cdef uint64_t i
        while size < <uint64_t> (2 * expected + 16):
            size *= 2
        self.mask = size - 1
        self.slots = <int32_t *> malloc(size * sizeof(int32_t))
        self.cap = <int32_t> (expected + 16)
        self.off = <int64_t *> malloc(self.cap * sizeof(int64_t))
        self.ln = <int32_t *> malloc(self.cap * sizeof(int32_t))
        self.pool_cap = 8 * (expected + 16)          # grows by doubling
        self.pool = <unsigned char *> malloc(self.pool_cap)
        if self.slots == NULL or self.off == NULL or self.ln == NULL or self.pool == NULL:
            raise MemoryError()
        for i in range(size):
            self.slots[i] = -1
        self.n = 0
        self.pool_len = 0

    def __dealloc__(self):
        free(self.slots)
        free(self.off)
        free(self.ln)
        free(self.pool)

    cdef inline int32_t find(self, const unsigned char *p, Py_ssize_t n) noexcept nogil:
        cdef uint64_t h = fnv1a(p, n) & self.mask
        cdef int32_t s
        while True:
            s = self.slots[h]
            if s < 0:
                return -1
            if self.ln[s] == n and memcmp(self.pool + self.off[s], p, n) == 0:
                return s
            h = (h + 1) & self.mask

    cdef int32_t intern(self, const unsigned char *p, Py_ssize_t n) except -2:
        cdef uint64_t h = fnv1a(p, n) & self.mask
        cdef int32_t s
        cdef unsigned char *np
        while True:
            s = self.slots[h]
            if s < 0:
                break
            if self.ln[s] == n and memcmp(self.pool + self.off[s], p, n) == 0:
                return s
            h = (h + 1) & self.mask
        if self.n == self.cap or 2 * (<uint64_t> self.n + 1) > self.mask:
            raise OverflowError("string table full")
        while self.pool_len + n > self.pool_cap:
            self.pool_cap *= 2
            np = <unsigned char *> realloc(self.pool, self.pool_cap)
            if np == NULL:
                raise MemoryError()
            self.pool = np
        memcpy(self.pool + self.pool_len, p, n)
        s = self.n
        self.off[s] = self.pool_len
        self.ln[s] = <int32_t> n
        self.pool_len += n
        self.n += 1
        self.slots[h] = s
        return s

    cdef int32_t intern_bytes(self, bytes b) except -2:
        return self.intern(<const unsigned char *> b, len(b))


# --- byte-level BPE ----------------------------------------------------------------------------
cdef struct MergeSlot:
    uint64_t key        # (sid_left + 1) << 32 | (sid_right + 1); 0 = empty
    int32_t rank
    int32_t merged      # sid of left + right


cdef struct Sym:
    int32_t sid         # -1 once merged into its left neighbour
    int32_t prev
    int32_t next


cdef struct Bigram:
    int32_t rank
    int32_t left
    int32_t right
    int32_t sid_l
    int32_t sid_r
    int32_t merged


cdef struct SBigram:    # SentencePiece BPE: the best-scoring pair merges first
    float score
    int32_t left
    int32_t right
    int32_t size


# One binary heap serves both merge loops; only the order differs.
ctypedef fused AnyBigram:
    Bigram
    SBigram


cdef inline bint bigram_before(AnyBigram *x, AnyBigram *y) noexcept nogil:
    if AnyBigram is Bigram:
        return x.rank < y.rank or (x.rank == y.rank and x.left < y.left)
    else:
        return x.score > y.score or (x.score == y.score and x.left < y.left)


cdef inline void heap_push(AnyBigram *h, Py_ssize_t *n, AnyBigram b) noexcept nogil:
    cdef Py_ssize_t i = n[0], p
    n[0] += 1
    while i > 0:
        p = (i - 1) >> 1
        if not bigram_before(&b, &h[p]):
            break
        h[i] = h[p]
        i = p
    h[i] = b


cdef inline AnyBigram heap_pop(AnyBigram *h, Py_ssize_t *n) noexcept nogil:
    cdef AnyBigram top = h[0], last
    cdef Py_ssize_t i = 0, c, m
    n[0] -= 1
    m = n[0]
    if m > 0:
        last = h[m]
        while True:
            c = 2 * i + 1
            if c >= m:
                break
            if c + 1 < m and bigram_before(&h[c + 1], &h[c]):
                c += 1
            if not bigram_before(&h[c], &last):
                break
            h[i] = h[c]
            i = c
        h[i] = last
    return top


cdef class BPEModel:
    """Byte-level BPE over raw bytes.

    vocab: the token strings by id (GPT-2 byte-level text; tokens with other characters are
    never produced by merging); merges: "left right" strings in rank order. After
    construction, `bad_merge` is the index of the first merge without a separating space, or -1.

    raw: the vocabulary and merges are plain UTF-8 text (llama.cpp's `byte_encode = false`, the
    `gemma4` tokenizer model): a word starts as one symbol per UTF-8 character, and a symbol that
    is no token comes out as its bytes' `<0xXX>` tokens. newline_tokens: a word made only of
    newlines that is itself a token is that token (llama.cpp's Gemma 4 rule).
    """
    cdef StrTable strs
    cdef int32_t *sid_token          # sid -> token id or -1
    cdef int32_t byte_sid[256]
    cdef int32_t byte_token[256]
    cdef MergeSlot *mslots
    cdef uint64_t mmask
    cdef bint ignore_merges
    cdef bint raw
    cdef bint newline_tokens
    cdef PreTokenizer pre
    cdef readonly Py_ssize_t bad_merge

    def __cinit__(self, list vocab, list merges, PreTokenizer pre, bint ignore_merges=False,
                  bint raw=False, bint newline_tokens=False):
        cdef Py_ssize_t i, n, sp, maxlen = 1
        cdef int32_t s, sl, sr, sm
        cdef uint64_t size = 1024, h, key
        cdef str t
        cdef bytes bl, br
        cdef unsigned char *buf = NULL
        cdef unsigned char one
        self.pre = pre
        self.ignore_merges = ignore_merges
        self.raw = raw
        self.newline_tokens = newline_tokens
        self.bad_merge = -1
        self.sid_token = NULL
        self.mslots = NULL
        self.strs = StrTable(len(vocab) + 3 * len(merges) + 256)
        self.sid_token = <int32_t *> malloc((self.strs.cap + 1) * sizeof(int32_t))
        if self.sid_token == NULL:
            raise MemoryError()
        for i in range(self.strs.cap + 1):
            self.sid_token[i] = -1
        for t in vocab:
            maxlen = max(maxlen, PyUnicode_GET_LENGTH(t))
        for t in merges:
            maxlen = max(maxlen, PyUnicode_GET_LENGTH(t))
        buf = <unsigned char *> malloc(maxlen + 1)
        if buf == NULL:
            raise MemoryError()
        try:
            for i in range(len(vocab)):
                t = vocab[i]
                n = PyUnicode_GET_LENGTH(t)
                if raw and n > 0:
                    s = self.strs.intern_bytes(t.encode("utf-8", "surrogateescape"))
                    self.sid_token[s] = <int32_t> i
                elif n > 0 and _decode_byte_level(t, 0, n, buf):
                    s = self.strs.intern(buf, n)
                    self.sid_token[s] = <int32_t> i    # the last of equal strings wins
            for i in range(256):
                one = <unsigned char> i
                self.byte_sid[i] = self.strs.intern(&one, 1)
            while size < <uint64_t> (2 * len(merges) + 16):
                size *= 2
            self.mmask = size - 1
            self.mslots = <MergeSlot *> malloc(size * sizeof(MergeSlot))
            if self.mslots == NULL:
                raise MemoryError()
            for h in range(size):
                self.mslots[h].key = 0
            for i in range(len(merges)):
                t = merges[i]
                n = PyUnicode_GET_LENGTH(t)
                sp = t.find(" ", 1) if n > 1 else -1
                if sp < 0:
                    self.bad_merge = i
                    return
                if raw:
                    bl = t[:sp].encode("utf-8", "surrogateescape")
                    br = t[sp + 1:].encode("utf-8", "surrogateescape")
                    sl = self.strs.intern_bytes(bl)
                    sr = self.strs.intern_bytes(br)
                    sm = self.strs.intern_bytes(bl + br)
                elif not (_decode_byte_level(t, 0, sp, buf) and _decode_byte_level(t, sp + 1, n, buf + sp)):
                    continue                            # a side that is not byte-level text
                else:
                    sl = self.strs.intern(buf, sp)
                    sr = self.strs.intern(buf + sp, n - sp - 1)
                    sm = self.strs.intern(buf, n - 1)
                key = ((<uint64_t> sl + 1) << 32) | (<uint64_t> sr + 1)
                h = (key * 0x9E3779B97F4A7C15ULL) >> 20 & self.mmask
                while self.mslots[h].key != 0 and self.mslots[h].key != key:
                    h = (h + 1) & self.mmask
                if self.mslots[h].key == key:
                    continue                            # the first (lowest) rank wins
                self.mslots[h].key = key
                self.mslots[h].rank = <int32_t> i
                self.mslots[h].merged = sm
        finally:
            free(buf)
        for i in range(256):
            self.byte_token[i] = self.sid_token[self.byte_sid[i]]
            if raw:                                     # byte fallback through <0xXX> tokens
                bl = f"<0x{i:02X}>".encode()
                s = self.strs.find(bl, 6)
                self.byte_token[i] = self.sid_token[s] if s >= 0 else -1

    def __dealloc__(self):
        free(self.sid_token)
        free(self.mslots)

    cdef inline bint find_merge(self, int32_t sl, int32_t sr, int32_t *rank, int32_t *merged) noexcept nogil:
        cdef uint64_t key = ((<uint64_t> sl + 1) << 32) | (<uint64_t> sr + 1)
        cdef uint64_t h = (key * 0x9E3779B97F4A7C15ULL) >> 20 & self.mmask
        while True:
            if self.mslots[h].key == key:
                rank[0] = self.mslots[h].rank
                merged[0] = self.mslots[h].merged
                return True
            if self.mslots[h].key == 0:
                return False
            h = (h + 1) & self.mmask

    cdef inline void add_bigram(self, Sym *sy, Bigram *heap, Py_ssize_t *nh, int32_t l, int32_t r) noexcept nogil:
        cdef Bigram bg
        if l < 0 or r < 0 or sy[l].sid < 0 or sy[r].sid < 0:
            return
        if not self.find_merge(sy[l].sid, sy[r].sid, &bg.rank, &bg.merged):
            return
        bg.left = l
        bg.right = r
        bg.sid_l = sy[l].sid
        bg.sid_r = sy[r].sid
        heap_push(heap, nh, bg)

    cdef int emit_sid(self, int32_t sid, Vec *out) except -1 nogil:
        cdef int32_t tok = self.sid_token[sid]
        cdef int32_t k
        cdef const unsigned char *p
        if tok >= 0:
            vec_push(out, tok)
            return 0
        p = self.strs.pool + self.strs.off[sid]
        for k in range(self.strs.ln[sid]):            # not a token: its bytes, where they are
            if self.byte_token[p[k]] >= 0:
                vec_push(out, self.byte_token[p[k]])
        return 0

    cdef int encode_word(self, const unsigned char *w, Py_ssize_t n, Sym *sy, Bigram *heap, Vec *out) except -1 nogil:
        cdef Py_ssize_t i, nh = 0
        cdef int32_t sid
        if n <= 0:
            return 0
        if self.raw:
            return self.encode_word_raw(w, n, sy, heap, out)
        if n == 1:
            return self.emit_sid(self.byte_sid[w[0]], out)
        if self.ignore_merges:
            sid = self.strs.find(w, n)
            if sid >= 0 and self.sid_token[sid] >= 0:
                vec_push(out, self.sid_token[sid])
                return 0
        for i in range(n):
            sy[i].sid = self.byte_sid[w[i]]
            sy[i].prev = <int32_t> i - 1
            sy[i].next = <int32_t> i + 1 if i + 1 < n else -1
        for i in range(1, n):
            self.add_bigram(sy, heap, &nh, <int32_t> i - 1, <int32_t> i)
        self.merge_loop(sy, heap, nh)
        i = 0
        while i >= 0:
            self.emit_sid(sy[i].sid, out)
            i = sy[i].next
        return 0

    cdef inline void merge_loop(self, Sym *sy, Bigram *heap, Py_ssize_t nh) noexcept nogil:
        """Lowest rank first, leftmost among equals, until no pair of neighbours merges."""
        cdef int32_t l, r
        cdef Bigram bg
        while nh > 0:
            bg = heap_pop(heap, &nh)
            l = bg.left
            r = bg.right
            if sy[l].sid != bg.sid_l or sy[r].sid != bg.sid_r:
                continue                                # stale: a side was merged since
            sy[l].sid = bg.merged
            sy[r].sid = -1
            sy[l].next = sy[r].next
            if sy[r].next >= 0:
                sy[sy[r].next].prev = l
            self.add_bigram(sy, heap, &nh, sy[l].prev, l)
            self.add_bigram(sy, heap, &nh, l, sy[l].next)

    cdef int encode_word_raw(self, const unsigned char *w, Py_ssize_t n, Sym *sy, Bigram *heap,
                             Vec *out) except -1 nogil:
        """One word of a plain-text vocabulary (raw=True). A character that is neither a token
        nor a side of a merge gets sid -2 - (its byte offset): it never merges and comes out
        as its bytes."""
        cdef Py_ssize_t i, nsym = 0, off = 0, nh = 0, clen
        cdef int32_t sid, k
        cdef const unsigned char *p
        cdef unsigned char c
        if self.newline_tokens:
            i = 0
            while i < n and w[i] == 0x0A:
                i += 1
            if i == n:
                sid = self.strs.find(w, n)
                if sid >= 0 and self.sid_token[sid] >= 0:
                    vec_push(out, self.sid_token[sid])
                    return 0
        while off < n:                                  # one symbol per UTF-8 character
            c = w[off]
            clen = 1 if c < 0xC0 else (2 if c < 0xE0 else (3 if c < 0xF0 else 4))
            if clen > n - off:
                clen = n - off
            sid = self.strs.find(w + off, clen)
            sy[nsym].sid = sid if sid >= 0 else <int32_t> (-2 - off)
            sy[nsym].prev = <int32_t> nsym - 1
            off += clen
            sy[nsym].next = -1 if off == n else <int32_t> nsym + 1
            nsym += 1
        for i in range(1, nsym):
            self.add_bigram(sy, heap, &nh, <int32_t> i - 1, <int32_t> i)
        self.merge_loop(sy, heap, nh)
        i = 0
        while i >= 0:
            sid = sy[i].sid
            if sid >= 0:
                self.emit_sid(sid, out)
            else:                                       # an unknown character: its bytes
                off = -2 - sid
                c = w[off]
                clen = 1 if c < 0xC0 else (2 if c < 0xE0 else (3 if c < 0xF0 else 4))
                if clen > n - off:
                    clen = n - off
                for k in range(<int32_t> clen):
                    if self.byte_token[w[off + k]] >= 0:
                        vec_push(out, self.byte_token[w[off + k]])
            i = sy[i].next
        return 0

    def encode(self, str text):
        """Token ids of one raw-text fragment (no special tokens)."""
        cdef TextBuf tb = TextBuf(text)
        cdef Vec words, out
        cdef Py_ssize_t k, start = 0, maxlen = 0, b0, b1
        cdef Sym *sy = NULL
        cdef Bigram *heap = NULL
        words.d = NULL; words.n = 0; words.cap = 0
        out.d = NULL; out.n = 0; out.cap = 0
        try:
            with nogil:
                self.pre.run(tb.text(), tb.n, &words)
                for k in range(words.n):
                    b1 = tb.boff[start + words.d[k]] - tb.boff[start]
                    if b1 > maxlen:
                        maxlen = b1
                    start += words.d[k]
                sy = <Sym *> malloc((maxlen + 1) * sizeof(Sym))
                heap = <Bigram *> malloc((3 * maxlen + 1) * sizeof(Bigram))
                if sy == NULL or heap == NULL:
                    with gil:
                        raise MemoryError()
                start = 0
                for k in range(words.n):
                    b0 = tb.boff[start]
                    b1 = tb.boff[start + words.d[k]]
                    self.encode_word(tb.utf8 + b0, b1 - b0, sy, heap, &out)
                    start += words.d[k]
            return [out.d[k] for k in range(out.n)]
        finally:
            free(words.d)
            free(out.d)
            free(sy)
            free(heap)


# --- SentencePiece BPE ---------------------------------------------------------------------------
cdef struct SSym:
    int32_t start
    int32_t n           # bytes; 0 once merged into its left neighbour
    int32_t prev
    int32_t next


cdef class SPMModel:
    """SentencePiece BPE: vocab (the token texts by id, encoded to UTF-8 here; texts the GGUF
    reader decoded with surrogateescape get their raw bytes back), scores (float32 by id),
    byte_tokens (256 ids, -1 where the vocabulary has none). Building the table is one loop in
    C: a 150k-token vocabulary costs milliseconds, not a Python loop per token."""
    cdef StrTable strs
    cdef int32_t *sid_token
    cdef float *score
    cdef int32_t byte_token[256]

    def __cinit__(self, list vocab, const float[::1] scores, byte_tokens):
        cdef Py_ssize_t i, n = len(vocab)
        cdef int32_t s
        cdef bytes raw
        self.sid_token = NULL
        self.score = NULL
        if scores.shape[0] != n:
            raise ValueError(f"{scores.shape[0]} scores for {n} tokens")
        self.strs = StrTable(n)
        self.sid_token = <int32_t *> malloc((n + 1) * sizeof(int32_t))
        self.score = <float *> malloc((n + 1) * sizeof(float))
        if self.sid_token == NULL or self.score == NULL:
            raise MemoryError()
        for i in range(n):
            raw = (<str> vocab[i]).encode("utf-8", "surrogateescape")
            s = self.strs.intern_bytes(raw)        # equal texts share an id: the last one wins
            self.sid_token[s] = <int32_t> i
            self.score[i] = scores[i]
        for i in range(256):
            self.byte_token[i] = byte_tokens[i]

    def __dealloc__(self):
        free(self.sid_token)
        free(self.score)

    cdef inline int32_t token_of(self, const unsigned char *p, Py_ssize_t n) noexcept nogil:
        cdef int32_t s = self.strs.find(p, n)
        return self.sid_token[s] if s >= 0 else -1

    cdef inline void try_bigram(self, const unsigned char *t, SSym *sy, SBigram *heap, Py_ssize_t *nh,
                                int32_t l, int32_t r) noexcept nogil:
        cdef SBigram bg
        cdef int32_t tok
        if l < 0 or r < 0:
            return
        tok = self.token_of(t + sy[l].start, sy[l].n + sy[r].n)
        if tok < 0:
            return
        bg.score = self.score[tok]
        bg.left = l
        bg.right = r
        bg.size = sy[l].n + sy[r].n
        heap_push(heap, nh, bg)

    cdef int encode_chunk(self, const unsigned char *t, Py_ssize_t n, SSym *sy, SBigram *heap,
                          Vec *out) except -1 nogil:
        cdef Py_ssize_t nsym = 0, off = 0, nh = 0, i
        cdef int32_t clen, l, r, tok, k
        cdef SBigram bg
        cdef unsigned char c
        while off < n:                                  # one symbol per UTF-8 character
            c = t[off]
            clen = 1 if c < 0xC0 else (2 if c < 0xE0 else (3 if c < 0xF0 else 4))
            if clen > n - off:
                clen = <int32_t> (n - off)
            sy[nsym].start = <int32_t> off
            sy[nsym].n = clen
            sy[nsym].prev = <int32_t> nsym - 1
            off += clen
            sy[nsym].next = -1 if off == n else <int32_t> nsym + 1
            nsym += 1
        for i in range(1, nsym):
            self.try_bigram(t, sy, heap, &nh, <int32_t> i - 1, <int32_t> i)
        while nh > 0:                                   # best score first, leftmost among equals
            bg = heap_pop(heap, &nh)
            l = bg.left
            r = bg.right
            if sy[l].n == 0 or sy[r].n == 0 or sy[l].n + sy[r].n != bg.size:
                continue
            sy[l].n += sy[r].n
            sy[r].n = 0
            sy[l].next = sy[r].next
            if sy[r].next >= 0:
                sy[sy[r].next].prev = l
            self.try_bigram(t, sy, heap, &nh, sy[l].prev, l)
            self.try_bigram(t, sy, heap, &nh, l, sy[l].next)
        i = 0
        while nsym and i >= 0:
            tok = self.token_of(t + sy[i].start, sy[i].n)
            if tok >= 0:
                vec_push(out, tok)
            else:                                       # byte fallback
                for k in range(sy[i].n):
                    if self.byte_token[t[sy[i].start + k]] >= 0:
                        vec_push(out, self.byte_token[t[sy[i].start + k]])
            i = sy[i].next
        return 0

    def encode(self, bytes text, bint split_words=False):
        """Token ids of one whitespace-escaped UTF-8 fragment.

        split_words: the text may be cut before every U+2581 that follows another character,
        and each word merged on its own. That gives the same ids when no token has U+2581
        after another character (the caller checks the vocabulary) and keeps the merge queue
        small and in cache."""
        cdef const unsigned char *t = text
        cdef Py_ssize_t n = len(text), i, start = 0, maxw = 0
        cdef SSym *sy = NULL
        cdef SBigram *heap = NULL
        cdef Vec out, cuts
        out.d = NULL; out.n = 0; out.cap = 0
        cuts.d = NULL; cuts.n = 0; cuts.cap = 0
        if n == 0:
            return []
        try:
            with nogil:
                if split_words:                         # word starts: "\xe2\x96\x81" after a non-U+2581
                    for i in range(3, n - 2):
                        if t[i] == 0xE2 and t[i + 1] == 0x96 and t[i + 2] == 0x81 and not (
                                t[i - 3] == 0xE2 and t[i - 2] == 0x96 and t[i - 1] == 0x81):
                            vec_push(&cuts, i)
                vec_push(&cuts, n)
                for i in range(cuts.n):
                    if cuts.d[i] - start > maxw:
                        maxw = cuts.d[i] - start
                    start = cuts.d[i]
                sy = <SSym *> malloc((maxw + 1) * sizeof(SSym))
                heap = <SBigram *> malloc((3 * maxw + 1) * sizeof(SBigram))
                if sy == NULL or heap == NULL:
                    with gil:
                        raise MemoryError()
                start = 0
                for i in range(cuts.n):
                    self.encode_chunk(t + start, cuts.d[i] - start, sy, heap, &out)
                    start = cuts.d[i]
            return [out.d[i] for i in range(out.n)]
        finally:
            free(sy)
            free(heap)
            free(out.d)
            free(cuts.d)


# --- GPT-2 byte-level text <-> bytes (load-time helpers) ---------------------------------------
cdef int16_t CHAR_BYTE[0x144]       # character (< U+0144) -> the byte it stands for, -1 if none


cdef void _init_byte_chars():
    cdef int b, n = 0
    for b in range(0x144):
        CHAR_BYTE[b] = -1
    for b in range(256):
        if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF:
            CHAR_BYTE[b] = b
        else:
            CHAR_BYTE[256 + n] = b
            n += 1


_init_byte_chars()


cdef bint _decode_byte_level(str s, Py_ssize_t a, Py_ssize_t b, unsigned char *out):
    """s[a:b] as the bytes its characters stand for, into out; False if it has other characters."""
    cdef int kind = PyUnicode_KIND(s)
    cdef void *data = PyUnicode_DATA(s)
    cdef Py_ssize_t i
    cdef uint32_t c
    for i in range(a, b):
        c = PyUnicode_READ(kind, data, i)
        if c >= 0x144 or CHAR_BYTE[c] < 0:
            return False
        out[i - a] = <unsigned char> CHAR_BYTE[c]
    return True


cdef object _byte_level(str s, Py_ssize_t a, Py_ssize_t b):
    cdef int kind = PyUnicode_KIND(s)
    cdef void *data = PyUnicode_DATA(s)
    cdef Py_ssize_t i
    cdef uint32_t c
    cdef bytearray out = bytearray(b - a)
    for i in range(a, b):
        c = PyUnicode_READ(kind, data, i)
        if c >= 0x144 or CHAR_BYTE[c] < 0:
            return None
        out[i - a] = CHAR_BYTE[c]
    return bytes(out)


def byte_level_decode(list strs):
    """For each str of a byte-level vocabulary, the raw bytes it stands for, or None when it
    has characters outside the 256 that stand for bytes (added tokens such as "<|im_end|>"
    with spaces or other text)."""
    cdef str s
    return [_byte_level(s, 0, PyUnicode_GET_LENGTH(s)) for s in strs]

# NUMA memory placement (included from core.pyx): mbind(2) through the C library's syscall(),
# so the call number comes from this build's own headers (no libnuma). edged/threads.py decides
# the policy; this only applies it to a range of the process's memory.
from libc.errno cimport errno
from libc.stdint cimport uintptr_t

cdef extern from "<sys/syscall.h>":
    const long SYS_mbind

cdef extern from "<unistd.h>" nogil:
    long syscall(long number, ...)
    long sysconf(int name)
    const int _SC_PAGESIZE

cdef enum:
    _MASK_WORDS = 16      # node mask of 16 unsigned longs: node ids below 1024 (64-bit)


def mbind_word_bits():
    """Bits per word of an mbind(2) node mask here (the C library's unsigned long)."""
    return 8 * sizeof(unsigned long)


def mbind(uintptr_t addr, size_t length, int mode, mask, unsigned flags=0):
    """Set the memory policy `mode` (MPOL_*) over the node mask `mask` (words of
    mbind_word_bits() bits, bit n = node n) for the pages covering [addr, addr + length), with
    mbind flags `flags` (MPOL_MF_MOVE: migrate pages already there). Returns 0, or the errno
    (ENOSYS: a kernel without NUMA; EPERM: refused, e.g. by seccomp)."""
    cdef unsigned long words[_MASK_WORDS]
    cdef int i
    cdef uintptr_t page = <uintptr_t>sysconf(_SC_PAGESIZE)
    cdef uintptr_t start = addr & ~(page - 1)
    cdef uintptr_t end = (addr + length + page - 1) & ~(page - 1)
    cdef long r
    if len(mask) > _MASK_WORDS:
        raise ValueError(f"node mask of {len(mask)} words: at most {_MASK_WORDS}")
    memset(words, 0, sizeof(words))
    for i in range(len(mask)):
        words[i] = mask[i]
    if length == 0:
        return 0
    with nogil:
        # maxnode counts one bit more than the mask holds (the kernel reads maxnode - 1 bits)
        r = syscall(SYS_mbind, <void *>start, <unsigned long>(end - start), mode, words,
                    <unsigned long>(_MASK_WORDS * 8 * sizeof(unsigned long) + 1), flags)
    return 0 if r == 0 else errno

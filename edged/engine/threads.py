"""Thread and memory placement: which CPU each worker runs on, and which NUMA node holds the
weights and arenas. The machine's facts (topology from sysfs within the process's allowed CPU
set, the CPU quota, the default thread count) are read by edged/system.py, below every layer;
placement never leaves the allowed set.

NUMA policies, as llama.cpp's --numa, for threads and for memory (the weights, and each
session's arena: KV cache, activations, scratch):
  isolate     every worker on the node of the CPU the process started on; memory preferred
              on that node (MPOL_PREFERRED: it spills to other nodes rather than fail)
  distribute  workers spread evenly over the nodes (round robin, physical cores first); memory
              interleaved page by page over the nodes (MPOL_INTERLEAVE)
  numactl     every worker keeps the inherited CPU set as it is (no per-CPU pinning); memory
              keeps the inherited policy (what `numactl --membind/--interleave` set)
  none        no pinning, no memory policy
Memory policies are set with mbind(2) (edged._core.mbind) over the nodes that have an allowed
CPU and are in the process's Mems_allowed (cpuset); pages already touched are migrated
(MPOL_MF_MOVE). The weights of a file mapping that other processes also map stay where they
are, and the kernel places page-cache pages by the policy of the thread that first reads them
(the pinned workers). On a single node the policy is recorded but places nothing differently;
a kernel without NUMA (ENOSYS) or a refusal (EPERM) is logged and skipped.
"""
from __future__ import annotations

import errno
import logging
import mmap
import os
from dataclasses import dataclass

from ..errors import ConfigError
from ..system import default_threads, parse_cpu_list, read_text, read_topology

log = logging.getLogger("edged.engine.threads")

POLICIES = ("none", "isolate", "distribute", "numactl")


def current_cpu(proc_root="/proc"):
    """The CPU this thread last ran on (field 39 of /proc/thread-self/stat), or None."""
    text = (read_text(os.path.join(proc_root, "thread-self", "stat"))
            or read_text(os.path.join(proc_root, "self", "stat")))
    if not text:
        return None
    try:
        return int(text.rsplit(")", 1)[1].split()[36])
    except (IndexError, ValueError):
        return None


def placement(topo, n_threads, policy, start_cpu=None):
    """CPU for each worker (worker 0 = the calling thread), or None for no per-CPU pinning
    (policies none and numactl: workers keep the inherited set)."""
    if policy not in POLICIES:
        raise ConfigError(f"numa={policy!r}: expected one of {', '.join(POLICIES)}")
    if n_threads < 1:
        raise ConfigError(f"n_threads={n_threads}: must be >= 1")
    if policy in ("none", "numactl"):
        return None
    if policy == "isolate":
        cpu = start_cpu if start_cpu in topo.allowed else topo.allowed[0]
        order = topo.ordered(topo.nodes[topo.node_of(cpu)])
    else:  # distribute: round robin over nodes, each node's physical cores first
        per_node = [topo.ordered(cpus) for _, cpus in sorted(topo.nodes.items())]
        order = []
        for i in range(max(len(p) for p in per_node)):
            order.extend(p[i] for p in per_node if i < len(p))
    return [order[i % len(order)] for i in range(n_threads)]


def pin_workers(pool, policy, topo=None, start_cpu=None):
    """Apply `policy` to a running edged._core.Pool. Returns the CPU list used (None: none)."""
    from .. import _core   # here: topology and placement work without the compiled core
    topo = topo or read_topology()
    if start_cpu is None and policy == "isolate":
        start_cpu = current_cpu()
    cpus = placement(topo, pool.n_threads, policy, start_cpu)
    if policy == "none":
        return None
    _core.pin_pool(pool, cpus or [])  # [] restores the inherited set (numactl)
    return cpus


def describe(topo=None):
    """Facts for `edged info`."""
    topo = topo or read_topology()
    return {"allowed_cpus": list(topo.allowed), "physical_cores": len(topo.cores()),
            "cpu_quota": topo.cpu_quota,
            "numa_nodes": {n: list(c) for n, c in topo.nodes.items()},
            "default_threads": default_threads(topo)}


# --- memory placement -----------------------------------------------------------------------
MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE = 1, 2, 3
MPOL_MF_MOVE = 1 << 1
_MODES = {"prefer": MPOL_PREFERRED, "bind": MPOL_BIND, "interleave": MPOL_INTERLEAVE}


@dataclass(frozen=True)
class MemoryPolicy:
    mode: str       # "prefer" or "interleave" (as /proc/PID/numa_maps spells them)
    nodes: tuple    # node ids
    reason: str = ""  # why it places nothing differently here ("" if it does)


def mems_allowed(proc_root="/proc"):
    """The memory nodes this process may use (cpuset Mems_allowed_list), or None if unknown."""
    for line in (read_text(os.path.join(proc_root, "self", "status")) or "").splitlines():
        if line.startswith("Mems_allowed_list:"):
            return set(parse_cpu_list(line.split(":", 1)[1]))
    return None


def memory_policy(topo, policy, cpu=None, mems=None):
    """The memory policy for NUMA `policy`: isolate prefers the node of `cpu` (the first pinned
    worker's), distribute interleaves over the nodes with allowed CPUs and allowed memory
    (`mems`, default: this process's Mems_allowed); none and numactl: None (keep the inherited
    policy)."""
    if policy not in POLICIES:
        raise ConfigError(f"numa={policy!r}: expected one of {', '.join(POLICIES)}")
    if policy in ("none", "numactl"):
        return None
    mems = mems_allowed() if mems is None else set(mems)
    nodes = sorted(n for n in topo.nodes if mems is None or n in mems)
    if not nodes:
        return None
    if policy == "isolate":
        n = topo.node_of(cpu if cpu in topo.allowed else topo.allowed[0])
        mode, nodes = "prefer", [n if n in nodes else nodes[0]]
    else:
        mode = "interleave"
    reason = "one NUMA node" if len(topo.nodes) == 1 else ""
    return MemoryPolicy(mode, tuple(nodes), reason)


def node_mask(nodes, word_bits=64):
    """Node ids -> the words of an mbind(2) node mask (bit n of the mask for node n)."""
    words = [0] * (max(nodes, default=-1) // word_bits + 1)
    for n in nodes:
        words[n // word_bits] |= 1 << (n % word_bits)
    return words


def address_ranges(arrays, page=None):
    """(start, end) page ranges covering the arrays' data, merged where they touch or overlap
    (the tensors of one file mapping become one range)."""
    page = page or mmap.PAGESIZE
    spans = []
    for a in arrays:
        if a.nbytes:
            p = a.__array_interface__["data"][0]
            spans.append((p // page * page, -(-(p + a.nbytes) // page) * page))
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def place_memory(mpol, ranges, what="memory"):
    """Apply `mpol` (a MemoryPolicy or None) to (start, end) address ranges with mbind(2).
    Returns True if applied; a kernel without NUMA or a refusal is logged and skipped."""
    if mpol is None or not ranges:
        return False
    from .. import _core   # here: topology and placement work without the compiled core
    for start, end in ranges:
        mask = node_mask(mpol.nodes, _core.mbind_word_bits())
        err = _core.mbind(start, end - start, _MODES[mpol.mode], mask, MPOL_MF_MOVE)
        if err:
            why = {errno.ENOSYS: "kernel without NUMA support", errno.EPERM: "refused (seccomp?)"}
            log.info("numa: %s not placed (%s %s): mbind: %s", what, mpol.mode,
                     list(mpol.nodes), why.get(err, os.strerror(err)))
            return False
    if mpol.reason:
        log.info("numa: %s %s %s (%s: places nothing differently)", what, mpol.mode,
                 list(mpol.nodes), mpol.reason)
    return True

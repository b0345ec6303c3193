"""CPU topology and thread placement: how many workers, and which CPU each one runs on.

Topology comes from sysfs (`<root>/devices/system/cpu`, `<root>/devices/system/node`; the root
is injectable so tests can present fake machines) intersected with the process's allowed CPU
set (sched_getaffinity: what numactl, taskset, a cgroup or systemd's CPUAffinity= allow).
Placement never leaves that set. The default thread count is the physical cores of that set,
and no more than the CPU quota rounded up: cgroup v2 `cpu.max` (what systemd's CPUQuota= and
`docker --cpus` set) or cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, of the process's
cgroup (`<proc>/self/cgroup`) and every cgroup above it, under `<root>/fs/cgroup`.

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
import math
import mmap
import os
from dataclasses import dataclass, field

from ..errors import ConfigError

log = logging.getLogger("edged.engine.threads")

POLICIES = ("none", "isolate", "distribute", "numactl")


def parse_cpu_list(text):
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (sysfs / Cpus_allowed_list format)."""
    out = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def _read(path, default=None):
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except OSError:
        return default


@dataclass(frozen=True)
class Topology:
    allowed: tuple          # online CPUs this process may run on, ascending
    nodes: dict             # node id -> tuple of allowed CPUs on it
    siblings: dict = field(default_factory=dict)  # cpu -> tuple of SMT siblings (incl. itself)
    cpu_quota: float | None = None  # CPUs per period the cgroup allows (None: no limit)

    def node_of(self, cpu):
        for n, cpus in self.nodes.items():
            if cpu in cpus:
                return n
        return min(self.nodes) if self.nodes else 0

    def cores(self, cpus=None):
        """Physical cores among `cpus` (default: allowed), each a tuple of its allowed SMT
        siblings, in order of their first CPU."""
        pool = set(self.allowed if cpus is None else cpus)
        seen, out = set(), []
        for c in sorted(pool):
            if c in seen:
                continue
            group = tuple(s for s in self.siblings.get(c, (c,)) if s in pool) or (c,)
            seen.update(group)
            out.append(group)
        return out

    def ordered(self, cpus=None):
        """CPUs with one per physical core first, then the SMT siblings."""
        cores = self.cores(cpus)
        depth = max((len(g) for g in cores), default=0)
        return [g[i] for i in range(depth) for g in cores if i < len(g)]


def _quota_v2(text):
    """cpu.max "150000 100000" -> 1.5; "max 100000" -> None."""
    parts = (text or "").split()
    if len(parts) == 2 and parts[0] != "max" and int(parts[1]) > 0:
        return int(parts[0]) / int(parts[1])
    return None


def _quota_v1(quota, period):
    """cpu.cfs_quota_us "-1" means no limit."""
    if quota is None or period is None or int(quota) <= 0 or int(period) <= 0:
        return None
    return int(quota) / int(period)


def cpu_quota(sysfs_root="/sys", proc_root="/proc"):
    """CPUs per period this process's cgroups allow (the smallest limit on the way up to the
    hierarchy's root), or None without a limit (or without cgroups)."""
    cg = os.path.join(sysfs_root, "fs", "cgroup")
    limits = []
    for line in (_read(os.path.join(proc_root, "self", "cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # cgroup v2 (unified): pure v2 mounts it at fs/cgroup itself
            bases, v1 = [cg, os.path.join(cg, "unified")], False
        elif "cpu" in controllers.split(","):  # cgroup v1's cpu controller
            bases, v1 = [os.path.join(cg, controllers)], True
        else:
            continue
        rel = path.strip("/")
        for base in bases:
            here = rel
            while True:
                d = os.path.join(base, here) if here else base
                if v1:
                    q = _quota_v1(_read(os.path.join(d, "cpu.cfs_quota_us")),
                                  _read(os.path.join(d, "cpu.cfs_period_us")))
                else:
                    q = _quota_v2(_read(os.path.join(d, "cpu.max")))
                if q is not None:
                    limits.append(q)
                if not here:
                    break
                here = os.path.dirname(here)
    return min(limits) if limits else None


def read_topology(sysfs_root="/sys", allowed=None, proc_root="/proc"):
    """Topology of this machine (or of the fake tree under sysfs_root). `allowed` defaults to
    os.sched_getaffinity(0); the CPU quota comes from the cgroups of <proc_root>/self/cgroup
    under <sysfs_root>/fs/cgroup."""
    cpu_dir = os.path.join(sysfs_root, "devices", "system", "cpu")
    node_dir = os.path.join(sysfs_root, "devices", "system", "node")
    online_text = _read(os.path.join(cpu_dir, "online"))
    if online_text is None:
        online = sorted(os.sched_getaffinity(0)) if allowed is None else sorted(allowed)
    else:
        online = parse_cpu_list(online_text)
    aff = set(os.sched_getaffinity(0) if allowed is None else allowed)
    usable = tuple(c for c in online if c in aff)
    if not usable:
        raise ConfigError(f"no online CPU in the allowed set {sorted(aff)} (online: {online})")
    siblings = {}
    for c in usable:
        s = _read(os.path.join(cpu_dir, f"cpu{c}", "topology", "thread_siblings_list"))
        siblings[c] = tuple(parse_cpu_list(s)) if s else (c,)
    nodes = {}
    if os.path.isdir(node_dir):
        for name in sorted(os.listdir(node_dir)):
            if not (name.startswith("node") and name[4:].isdigit()):
                continue
            cl = _read(os.path.join(node_dir, name, "cpulist"))
            cpus = tuple(c for c in parse_cpu_list(cl or "") if c in usable)
            if cpus:
                nodes[int(name[4:])] = cpus
    placed = {c for cpus in nodes.values() for c in cpus}
    rest = tuple(c for c in usable if c not in placed)
    if rest:  # no node information (or CPUs outside every node): one implicit node
        nodes.setdefault(min(nodes) if nodes else 0, ())
        k = min(nodes)
        nodes[k] = tuple(sorted(set(nodes[k]) | set(rest)))
    return Topology(allowed=usable, nodes=nodes, siblings=siblings,
                    cpu_quota=cpu_quota(sysfs_root, proc_root))


def default_threads(topo=None):
    """Physical cores in the allowed set (SMT siblings counted once), at most the CPU quota
    rounded up (1.5 CPUs: 2 threads, which share the quota between them)."""
    topo = topo or read_topology()
    n = len(topo.cores())
    if topo.cpu_quota is not None:
        n = min(n, math.ceil(topo.cpu_quota - 1e-9))
    return max(1, n)


def current_cpu(proc_root="/proc"):
    """The CPU this thread last ran on (field 39 of /proc/thread-self/stat), or None."""
    text = _read(os.path.join(proc_root, "thread-self", "stat")) or _read(os.path.join(proc_root, "self", "stat"))
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
    for line in (_read(os.path.join(proc_root, "self", "status")) or "").splitlines():
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

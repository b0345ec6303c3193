"""What this machine gives the process: the CPUs it may run on, its default thread count and
its available memory. Below every layer (format, engine, service all read it); imports only the
standard library and edged.errors.

CPU topology comes from sysfs (`<root>/devices/system/cpu`, `<root>/devices/system/node`; the
root is injectable so tests can present fake machines) intersected with the process's allowed
CPU set (sched_getaffinity: what numactl, taskset, a cgroup or systemd's CPUAffinity= allow).
The default thread count is the physical cores of that set, and no more than the CPU quota
rounded up: cgroup v2 `cpu.max` (what systemd's CPUQuota= and `docker --cpus` set) or cgroup v1
`cpu.cfs_quota_us` / `cpu.cfs_period_us`, of the process's cgroup (`<proc>/self/cgroup`) and
every cgroup above it, under `<root>/fs/cgroup`. Placing threads and memory on those CPUs is
the engine's (edged/engine/threads.py).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from .errors import ConfigError


def available_memory():
    """MemAvailable from /proc/meminfo in bytes (None when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


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


def read_text(path, default=None):
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
    for line in (read_text(os.path.join(proc_root, "self", "cgroup")) or "").splitlines():
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
                    q = _quota_v1(read_text(os.path.join(d, "cpu.cfs_quota_us")),
                                  read_text(os.path.join(d, "cpu.cfs_period_us")))
                else:
                    q = _quota_v2(read_text(os.path.join(d, "cpu.max")))
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
    online_text = read_text(os.path.join(cpu_dir, "online"))
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
        s = read_text(os.path.join(cpu_dir, f"cpu{c}", "topology", "thread_siblings_list"))
        siblings[c] = tuple(parse_cpu_list(s)) if s else (c,)
    nodes = {}
    if os.path.isdir(node_dir):
        for name in sorted(os.listdir(node_dir)):
            if not (name.startswith("node") and name[4:].isdigit()):
                continue
            cl = read_text(os.path.join(node_dir, name, "cpulist"))
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

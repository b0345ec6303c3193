"""CPU topology and thread placement: how many workers, and which CPU each one runs on.

Topology comes from sysfs (`<root>/devices/system/cpu`, `<root>/devices/system/node`; the root
is injectable so tests can present fake machines) intersected with the process's allowed CPU
set (sched_getaffinity: what numactl, taskset, a cgroup or systemd's CPUAffinity= allow).
Placement never leaves that set.

NUMA policies, as llama.cpp's --numa:
  isolate     every worker on the node of the CPU the process started on
  distribute  workers spread evenly over the nodes (round robin, physical cores first)
  numactl     every worker keeps the inherited CPU set as it is (no per-CPU pinning)
  none        no pinning at all
Memory placement (interleaving buffers over nodes) is not done here: on the single-node
devices edged targets the kernel's first-touch policy already puts pages on the right node.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from .errors import ConfigError

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


def read_topology(sysfs_root="/sys", allowed=None):
    """Topology of this machine (or of the fake tree under sysfs_root). `allowed` defaults to
    os.sched_getaffinity(0)."""
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
    return Topology(allowed=usable, nodes=nodes, siblings=siblings)


def default_threads(topo=None):
    """Physical cores in the allowed set (SMT siblings counted once)."""
    topo = topo or read_topology()
    return max(1, len(topo.cores()))


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
    from . import _core
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
            "numa_nodes": {n: list(c) for n, c in topo.nodes.items()},
            "default_threads": default_threads(topo)}

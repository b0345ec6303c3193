"""Fake sysfs trees (devices/system/cpu and devices/system/node) for topology and NUMA tests:
which CPUs are online, their SMT siblings and their nodes, under a temporary root."""
import pytest

from edged import system


def make_sysfs(root, online, nodes, siblings=None, offline=()):
    cpu = root / "devices" / "system" / "cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text(online + "\n")
    all_cpus = system.parse_cpu_list(online) + list(offline)
    for c in all_cpus:
        t = cpu / f"cpu{c}" / "topology"
        t.mkdir(parents=True)
        sib = (siblings or {}).get(c, str(c))
        (t / "thread_siblings_list").write_text(sib + "\n")
    node = root / "devices" / "system" / "node"
    node.mkdir(parents=True)
    for n, cl in nodes.items():
        (node / f"node{n}").mkdir()
        (node / f"node{n}" / "cpulist").write_text(cl + "\n")
    return str(root)


@pytest.fixture
def two_nodes_smt(tmp_path):
    # 2 nodes x 2 cores x 2 threads: node0 = cpus 0,1 + siblings 4,5; node1 = 2,3 + 6,7
    sib = {0: "0,4", 4: "0,4", 1: "1,5", 5: "1,5", 2: "2,6", 6: "2,6", 3: "3,7", 7: "3,7"}
    return make_sysfs(tmp_path, "0-7", {0: "0-1,4-5", 1: "2-3,6-7"}, sib)

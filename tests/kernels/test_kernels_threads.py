"""Topology from fake sysfs trees, placement per NUMA policy, and real pinning of the pool's
workers checked through /proc/self/task/*/status."""
import os

import pytest

from edged.engine import threads
from edged.errors import ConfigError


def make_sysfs(root, online, nodes, siblings=None, offline=()):
    cpu = root / "devices" / "system" / "cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text(online + "\n")
    all_cpus = threads.parse_cpu_list(online) + list(offline)
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


def test_parse_cpu_list():
    assert threads.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert threads.parse_cpu_list("") == []


def test_two_nodes_smt_default_threads_counts_physical_cores(two_nodes_smt):
    t = threads.read_topology(two_nodes_smt, allowed=range(8))
    assert t.nodes == {0: (0, 1, 4, 5), 1: (2, 3, 6, 7)}
    assert threads.default_threads(t) == 4
    assert t.ordered() == [0, 1, 2, 3, 4, 5, 6, 7]


def test_isolate_stays_on_start_node(two_nodes_smt):
    t = threads.read_topology(two_nodes_smt, allowed=range(8))
    assert threads.placement(t, 2, "isolate", start_cpu=3) == [2, 3]
    assert threads.placement(t, 4, "isolate", start_cpu=3) == [2, 3, 6, 7]
    assert threads.placement(t, 2, "isolate", start_cpu=5) == [0, 1]


def test_distribute_spreads_over_nodes(two_nodes_smt):
    t = threads.read_topology(two_nodes_smt, allowed=range(8))
    assert threads.placement(t, 4, "distribute") == [0, 2, 1, 3]
    assert threads.placement(t, 6, "distribute") == [0, 2, 1, 3, 4, 6]


def test_none_and_numactl_do_not_pin_per_cpu(two_nodes_smt):
    t = threads.read_topology(two_nodes_smt, allowed=range(8))
    assert threads.placement(t, 3, "none") is None
    assert threads.placement(t, 3, "numactl") is None
    with pytest.raises(ConfigError, match="numa='fast'"):
        threads.placement(t, 3, "fast")


def test_offline_cpus_are_ignored(tmp_path):
    root = make_sysfs(tmp_path, "0-1,3", {0: "0-3"}, offline=(2,))
    t = threads.read_topology(root, allowed=range(4))
    assert t.allowed == (0, 1, 3)
    assert threads.placement(t, 3, "isolate", start_cpu=0) == [0, 1, 3]


def test_restricted_mask_is_never_left(two_nodes_smt):
    # a cgroup / taskset that only allows cpus 5 and 6 (one per node)
    t = threads.read_topology(two_nodes_smt, allowed={5, 6})
    assert t.allowed == (5, 6) and threads.default_threads(t) == 2
    for pol in ("isolate", "distribute"):
        cpus = threads.placement(t, 4, pol, start_cpu=6)
        assert set(cpus) <= {5, 6}
    assert threads.placement(t, 2, "isolate", start_cpu=6) == [6, 6]
    assert threads.placement(t, 2, "distribute") == [5, 6]
    with pytest.raises(ConfigError, match="no online CPU"):
        threads.read_topology(two_nodes_smt, allowed={42})


def test_single_node_raspberry_pi(tmp_path):
    root = make_sysfs(tmp_path, "0-3", {0: "0-3"})
    t = threads.read_topology(root, allowed=range(4))
    assert threads.default_threads(t) == 4
    assert threads.placement(t, 4, "distribute") == [0, 1, 2, 3]
    assert threads.placement(t, 4, "isolate", start_cpu=2) == [0, 1, 2, 3]


def test_missing_node_directory_means_one_node(tmp_path):
    cpu = tmp_path / "devices" / "system" / "cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-1\n")
    t = threads.read_topology(str(tmp_path), allowed={0, 1})
    assert t.nodes == {0: (0, 1)}


def _affinities():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        out[int(tid)] = threads.parse_cpu_list(line.split(":", 1)[1])
        except OSError:
            pass
    return out


def test_real_workers_are_pinned_as_the_policy_says():
    core = pytest.importorskip("edged._core")
    import threading
    allowed = sorted(os.sched_getaffinity(0))
    before = set(_affinities())
    pool = core.Pool(2)
    workers = set(_affinities()) - before
    assert len(workers) == 1  # the caller is worker 0
    try:
        topo = threads.read_topology()
        cpus = threads.pin_workers(pool, "isolate", topo)
        aff = _affinities()
        main = threading.get_native_id()
        assert aff[main] == [cpus[0]]
        assert [aff[w] for w in workers] == [[cpus[1]]]
        assert set(cpus) <= set(allowed)
        assert threads.pin_workers(pool, "numactl", topo) is None
        aff = _affinities()
        assert aff[main] == allowed and all(aff[w] == allowed for w in workers)
    finally:
        core.pin_pool(pool, [])
    assert sorted(os.sched_getaffinity(0)) == allowed

"""Topology from fake sysfs trees, placement per NUMA policy, and real pinning of the pool's
workers checked through /proc/self/task/*/status."""
import os

import pytest

from edged import system
from edged.engine import threads
from edged.errors import ConfigError
from fake_sysfs import make_sysfs, two_nodes_smt  # noqa: F401  (fixture)


def test_parse_cpu_list():
    assert system.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert system.parse_cpu_list("") == []


def test_two_nodes_smt_default_threads_counts_physical_cores(two_nodes_smt):
    t = system.read_topology(two_nodes_smt, allowed=range(8))
    assert t.nodes == {0: (0, 1, 4, 5), 1: (2, 3, 6, 7)}
    assert system.default_threads(t) == 4
    assert t.ordered() == [0, 1, 2, 3, 4, 5, 6, 7]


def test_isolate_stays_on_start_node(two_nodes_smt):
    t = system.read_topology(two_nodes_smt, allowed=range(8))
    assert threads.placement(t, 2, "isolate", start_cpu=3) == [2, 3]
    assert threads.placement(t, 4, "isolate", start_cpu=3) == [2, 3, 6, 7]
    assert threads.placement(t, 2, "isolate", start_cpu=5) == [0, 1]


def test_distribute_spreads_over_nodes(two_nodes_smt):
    t = system.read_topology(two_nodes_smt, allowed=range(8))
    assert threads.placement(t, 4, "distribute") == [0, 2, 1, 3]
    assert threads.placement(t, 6, "distribute") == [0, 2, 1, 3, 4, 6]


def test_none_and_numactl_do_not_pin_per_cpu(two_nodes_smt):
    t = system.read_topology(two_nodes_smt, allowed=range(8))
    assert threads.placement(t, 3, "none") is None
    assert threads.placement(t, 3, "numactl") is None
    with pytest.raises(ConfigError, match="numa='fast'"):
        threads.placement(t, 3, "fast")


def test_offline_cpus_are_ignored(tmp_path):
    root = make_sysfs(tmp_path, "0-1,3", {0: "0-3"}, offline=(2,))
    t = system.read_topology(root, allowed=range(4))
    assert t.allowed == (0, 1, 3)
    assert threads.placement(t, 3, "isolate", start_cpu=0) == [0, 1, 3]


def test_restricted_mask_is_never_left(two_nodes_smt):
    # a cgroup / taskset that only allows cpus 5 and 6 (one per node)
    t = system.read_topology(two_nodes_smt, allowed={5, 6})
    assert t.allowed == (5, 6) and system.default_threads(t) == 2
    for pol in ("isolate", "distribute"):
        cpus = threads.placement(t, 4, pol, start_cpu=6)
        assert set(cpus) <= {5, 6}
    assert threads.placement(t, 2, "isolate", start_cpu=6) == [6, 6]
    assert threads.placement(t, 2, "distribute") == [5, 6]
    with pytest.raises(ConfigError, match="no online CPU"):
        system.read_topology(two_nodes_smt, allowed={42})


def test_single_node_raspberry_pi(tmp_path):
    root = make_sysfs(tmp_path, "0-3", {0: "0-3"})
    t = system.read_topology(root, allowed=range(4))
    assert system.default_threads(t) == 4
    assert threads.placement(t, 4, "distribute") == [0, 1, 2, 3]
    assert threads.placement(t, 4, "isolate", start_cpu=2) == [0, 1, 2, 3]


def test_missing_node_directory_means_one_node(tmp_path):
    cpu = tmp_path / "devices" / "system" / "cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-1\n")
    t = system.read_topology(str(tmp_path), allowed={0, 1})
    assert t.nodes == {0: (0, 1)}


def _affinities():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        out[int(tid)] = system.parse_cpu_list(line.split(":", 1)[1])
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
        topo = system.read_topology()
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


def fake_cgroups(root, proc, lines, files):
    """<proc>/self/cgroup with `lines`, and files {relative path under <root>/fs/cgroup: text}."""
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("".join(line + "\n" for line in lines))
    for rel, text in files.items():
        f = root / "fs" / "cgroup" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text + "\n")


def test_cgroup_v2_cpu_max_limits_default_threads(tmp_path):
    # systemd's CPUQuota=150% on edged.service writes "150000 100000" to its cpu.max
    root = tmp_path / "sys"
    make_sysfs(root, "0-3", {0: "0-3"})
    fake_cgroups(root, tmp_path / "proc", ["0::/system.slice/edged.service"],
                 {"system.slice/edged.service/cpu.max": "150000 100000",
                  "system.slice/cpu.max": "max 100000"})
    t = system.read_topology(str(root), allowed=range(4), proc_root=str(tmp_path / "proc"))
    assert t.cpu_quota == 1.5
    assert system.default_threads(t) == 2      # 1.5 CPUs rounded up, not the 4 cores
    assert threads.describe(t)["cpu_quota"] == 1.5


def test_cgroup_quota_of_a_parent_counts_and_the_smallest_wins(tmp_path):
    root = tmp_path / "sys"
    make_sysfs(root, "0-7", {0: "0-7"})
    fake_cgroups(root, tmp_path / "proc", ["0::/machine.slice/box/edged"],
                 {"machine.slice/box/edged/cpu.max": "300000 100000",
                  "machine.slice/box/cpu.max": "50000 50000",     # docker --cpus=1 on the container
                  "machine.slice/cpu.max": "max 100000"})
    t = system.read_topology(str(root), allowed=range(8), proc_root=str(tmp_path / "proc"))
    assert t.cpu_quota == 1.0 and system.default_threads(t) == 1


def test_cgroup_v1_cfs_quota(tmp_path):
    root = tmp_path / "sys"
    make_sysfs(root, "0-3", {0: "0-3"})
    fake_cgroups(root, tmp_path / "proc",
                 ["4:memory:/x", "2:cpu,cpuacct:/system.slice/edged.service", "0::/"],
                 {"cpu,cpuacct/system.slice/edged.service/cpu.cfs_quota_us": "250000",
                  "cpu,cpuacct/system.slice/edged.service/cpu.cfs_period_us": "100000",
                  "cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000"})
    t = system.read_topology(str(root), allowed=range(4), proc_root=str(tmp_path / "proc"))
    assert t.cpu_quota == 2.5 and system.default_threads(t) == 3


def test_no_quota_leaves_the_physical_cores(tmp_path):
    root = tmp_path / "sys"
    make_sysfs(root, "0-3", {0: "0-3"})
    fake_cgroups(root, tmp_path / "proc", ["0::/user.slice"], {"user.slice/cpu.max": "max 100000"})
    t = system.read_topology(str(root), allowed=range(4), proc_root=str(tmp_path / "proc"))
    assert t.cpu_quota is None and system.default_threads(t) == 4
    # no cgroup file at all (a kernel without cgroups, or a sandbox hiding them)
    t = system.read_topology(str(root), allowed=range(4), proc_root=str(tmp_path / "nowhere"))
    assert t.cpu_quota is None and system.default_threads(t) == 4
    # a quota larger than the allowed cores changes nothing
    fake_cgroups(root, tmp_path / "proc2", ["0::/"], {"cpu.max": "800000 100000"})
    t = system.read_topology(str(root), allowed=range(4), proc_root=str(tmp_path / "proc2"))
    assert t.cpu_quota == 8.0 and system.default_threads(t) == 4

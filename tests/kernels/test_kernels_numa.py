"""NUMA memory placement: the policy and node masks per NUMA policy on fake 2-node machines,
and the real thing on this machine: after a load with numa=distribute/isolate,
/proc/self/numa_maps shows the policy on the weights' and the session arena's pages."""
import pytest

from conftest import testdata
from edged import system
from edged.engine import threads
from fake_sysfs import make_sysfs, two_nodes_smt  # noqa: F401  (fixture)


def test_isolate_prefers_the_node_of_the_first_worker(two_nodes_smt):  # noqa: F811
    t = system.read_topology(two_nodes_smt, allowed=range(8))
    p = threads.memory_policy(t, "isolate", cpu=6, mems={0, 1})
    assert (p.mode, p.nodes, p.reason) == ("prefer", (1,), "")
    assert threads.node_mask(p.nodes) == [0b10]
    p = threads.memory_policy(t, "isolate", cpu=4, mems={0, 1})
    assert p.nodes == (0,) and threads.node_mask(p.nodes) == [0b01]


def test_distribute_interleaves_over_the_allowed_nodes(two_nodes_smt):  # noqa: F811
    t = system.read_topology(two_nodes_smt, allowed=range(8))
    p = threads.memory_policy(t, "distribute", mems={0, 1})
    assert (p.mode, p.nodes) == ("interleave", (0, 1))
    assert threads.node_mask(p.nodes) == [0b11]
    # a cpuset that only gives memory on node 1 (Mems_allowed_list: 1)
    p = threads.memory_policy(t, "distribute", mems={1})
    assert p.nodes == (1,) and threads.node_mask(p.nodes) == [0b10]
    assert threads.memory_policy(t, "isolate", cpu=0, mems={1}).nodes == (1,)
    # a CPU mask that only allows node 1's CPUs: node 0 has no worker, no interleaving there
    t1 = system.read_topology(two_nodes_smt, allowed={2, 3})
    assert threads.memory_policy(t1, "distribute", mems={0, 1}).nodes == (1,)


def test_none_and_numactl_keep_the_inherited_policy(two_nodes_smt):  # noqa: F811
    t = system.read_topology(two_nodes_smt, allowed=range(8))
    assert threads.memory_policy(t, "none") is None
    assert threads.memory_policy(t, "numactl") is None


def test_single_node_is_recorded_as_such(tmp_path):
    t = system.read_topology(make_sysfs(tmp_path, "0-3", {0: "0-3"}), allowed=range(4))
    p = threads.memory_policy(t, "distribute", mems={0})
    assert (p.mode, p.nodes, p.reason) == ("interleave", (0,), "one NUMA node")


def test_node_mask_words():
    assert threads.node_mask([0, 65]) == [1, 2]
    assert threads.node_mask([0, 33], word_bits=32) == [1, 2]
    assert threads.node_mask([]) == []


def test_address_ranges_merge_touching_arrays():
    import numpy as np
    buf = np.zeros(5 * 4096, np.uint8)
    base = buf.__array_interface__["data"][0]
    a, b = buf[100:200], buf[4096 + 10:4096 + 20]    # neighbouring pages: one range
    r = threads.address_ranges([a, b, buf[:0]])
    first = (base + 100) // 4096 * 4096              # the buffer may start anywhere in a page
    assert r == [(first, (base + 4096 + 20 + 4095) // 4096 * 4096)]
    far = buf[3 * 4096 + 10:3 * 4096 + 20]   # a whole untouched page between (not a second array,
                                             # which the allocator may place right after): two ranges
    assert threads.address_ranges([a, far]) == [
        (first, (base + 200 + 4095) // 4096 * 4096),
        ((base + 3 * 4096 + 10) // 4096 * 4096, (base + 3 * 4096 + 20 + 4095) // 4096 * 4096)]


def _numa_maps():
    out = {}
    with open("/proc/self/numa_maps") as f:
        for line in f:
            addr, policy = line.split()[:2]
            out[int(addr, 16)] = (policy, line)
    return out


def _policy_at(maps, addr):
    """The numa_maps entry of the mapping holding addr (ranges with one policy are merged by
    the kernel, so the entry may start below addr)."""
    start = max(a for a in maps if a <= addr)
    return maps[start]


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("numa,policy", [("distribute", "interleave:0"), ("isolate", "prefer:")])
def test_real_load_places_weights_and_arena(numa, policy, mmap):
    pytest.importorskip("edged._core")
    from edged.engine.model import Model
    import numpy as np
    import os
    path = testdata("models", "synthetic-llama-Q8_0.gguf")
    affinity = os.sched_getaffinity(0)   # isolate pins the calling thread (worker 0)
    m = Model.load(path, n_threads=1, numa=numa, mmap=mmap)
    try:
        be = m.backend
        if not be.memory_placed:
            pytest.skip("mbind refused or the kernel has no NUMA support (logged)")
        buf = be.alloc(64, 8)
        maps = _numa_maps()
        weights = threads.address_ranges([np.asarray(w) for w in be.weights.values()])
        arena = buf.state.address // 4096 * 4096
        starts = [s for s, _ in weights] + [arena]
        for s in starts:
            assert _policy_at(maps, s)[0].startswith(policy), _policy_at(maps, s)[1]
        if mmap:   # one range: the file's mapping
            assert len(weights) == 1 and "file=" in maps[weights[0][0]][1]
        if numa == "isolate":
            node = system.read_topology().node_of(be.pinned_cpus[0])
            assert _policy_at(maps, arena)[0] == f"prefer:{node}"
        be.free(buf)
        del buf
    finally:
        m.close()
        os.sched_setaffinity(0, affinity)


def test_real_load_without_policy_leaves_default():
    # in a fresh process: freed memory keeps the policy the other tests gave it
    import os
    import subprocess
    import sys
    pytest.importorskip("edged._core")
    code = """if True:
        import sys
        from edged.engine.model import Model
        m = Model.load(sys.argv[1], n_threads=1, numa="numactl", mmap=False)
        assert m.backend.memory_policy is None and not m.backend.memory_placed
        buf = m.backend.alloc(64, 8)
        for line in open("/proc/self/numa_maps"):
            assert line.split()[1].split(":")[0] not in ("interleave", "prefer", "bind"), line
        print("ok")
    """
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", code, testdata("models", "synthetic-llama-Q8_0.gguf")],
                       capture_output=True, text=True, cwd=root, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_sandbox_leaves_mbind_allowed():
    from edged.service import sandbox
    assert "mbind" not in sandbox.DENIED_SYSCALLS

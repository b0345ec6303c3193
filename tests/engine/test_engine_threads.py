"""The thread pool under contention (cython_kernels/forward/ed_threads.h): matrix products are
split into chunks claimed from a shared counter, so a late thread's chunks are taken by the
others, and the pool drops workers that keep arriving late. Neither may change a single bit:
logits with one thread, with two threads whose chunk claims are made lopsided on purpose
(Pool.debug_slow: one thread sleeps before each claim), and with the adaptive count dropping a
worker mid-generation are compared for equality."""
import os
import time

import numpy as np
import pytest

from conftest import testdata

pytest.importorskip("edged._core")
from edged import Model  # noqa: E402

# a real model (every layer Q4_1, 49k vocabulary) and a mixed-type one (Q4_K_M: gate and up of
# different activation formats in some layers); 40 prompt tokens take the packed-panel GEMM and
# the blocked attention, the decode steps the one-token path
MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "synthetic-qwen2-Q4_K_M.gguf"]
PROMPT = [(7 * i + 3) % 200 + 10 for i in range(40)]


def run(model, steps=6):
    """Logits of the prompt's every row, then of `steps` greedy decode steps."""
    s = model.session(128)
    out = [s.eval(PROMPT, logits="all")]
    for _ in range(steps):
        out.append(s.eval([int(out[-1][-1].argmax())]))
    s.close()
    return np.concatenate(out)


@pytest.fixture(scope="module", params=MODELS)
def reference(request):
    with Model.load(testdata("models", request.param), n_threads=1) as m:
        return request.param, run(m)


@pytest.mark.parametrize("slow", [0, 1])
def test_lopsided_chunk_claims_change_no_bit(reference, slow):
    name, want = reference
    with Model.load(testdata("models", name), n_threads=2) as m:
        pool = m.backend.pool
        pool.adaptive = False          # keep both threads in every task
        pool.debug_slow(slow, 300)     # this thread sleeps 0.3 ms before each claim
        got = run(m, steps=2)
        claimed = pool.stats()["claimed"]   # of the last task (a decode step)
    # the other thread took most chunks
    assert claimed[1 - slow] > 2 * claimed[slow], claimed
    np.testing.assert_array_equal(got, want[:len(got)])


def test_late_worker_is_dropped_then_taken_back_without_changing_a_bit(reference):
    name, want = reference
    with Model.load(testdata("models", name), n_threads=2) as m:
        pool = m.backend.pool
        assert pool.adaptive and pool.active_threads == 2
        pool.debug_slow(1, 2000)       # worker 1 arrives late at every barrier: dropped
        s = m.session(128)
        got = [s.eval(PROMPT, logits="all")]
        for _ in range(6):
            got.append(s.eval([int(got[-1][-1].argmax())]))
        assert pool.stats()["drops"] >= 1 and pool.active_threads == 1, pool.stats()
        np.testing.assert_array_equal(np.concatenate(got), want)
        # the machine "quiets": a probe after >= 0.2 s finds worker 1 on time and keeps it.
        # Probes repeat with a growing interval while the machine keeps it late; so that a
        # machine loaded by other tests cannot fail this, any probe short of waiting for the
        # worker 95% of the time counts as on time here (tools/bench_contention.py measures the
        # real threshold's effect)
        pool.debug_slow(1, 0)
        pool.late_share = 0.95
        pool.debug_free_cpus(2.0)      # and its CPUs look idle (the probe gate is tested below)
        deadline = time.monotonic() + 30
        # (a worker on probation already counts as active; wait for the probe's verdict: a task
        # shorter than the pool's minimum leaves it pending)
        while pool.stats()["retakes"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
            s.truncate(len(PROMPT))
            for j in range(3):
                s.eval([int(want[39 + j].argmax())])
        st = pool.stats()
        assert st["probes"] >= 1 and st["retakes"] >= 1 and pool.active_threads == 2, st
        s.truncate(len(PROMPT))
        np.testing.assert_array_equal(s.eval([int(want[39].argmax())]), want[40:41])
        s.close()


def test_pool_without_adaptation_keeps_every_worker():
    import edged._core as core
    pool = core.Pool(2, adapt=False)
    assert not pool.adaptive and pool.active_threads == 2
    assert pool.late_share is None     # 1/n: where n - 1 threads become faster
    with pytest.raises(ValueError, match="worker 5"):
        pool.debug_slow(5, 10)
    with pytest.raises(ValueError, match="late_share 0.0"):
        pool.late_share = 0.0


def test_waiter_parks_at_once_when_the_thread_it_waits_for_shares_its_cpu(reference, monkeypatch):
    """A barrier waiter spins up to EDGED_SPIN_US before parking, but not while the thread it
    waits for last ran on the waiter's own CPU: there spinning only keeps that thread off the
    CPU. Both threads pinned to one CPU with a 0.2 s spin: (almost) every wait that does not end
    at once parks; a pool that spun instead would park on none (each spin ends when the
    scheduler's slice does and the other thread has arrived), and take seconds per token."""
    import edged._core as core
    name, want = reference
    monkeypatch.setenv("EDGED_SPIN_US", "200000")
    with Model.load(testdata("models", name), n_threads=2) as m:
        pool = m.backend.pool
        pool.adaptive = False
        assert pool.stats()["spin_us"] == 200000
        core.pin_pool(pool, [min(os.sched_getaffinity(0))])
        try:
            before = pool.stats()
            got = run(m, steps=2)
            st = pool.stats()
        finally:
            core.pin_pool(pool, [])
    waits, parks = st["waits"] - before["waits"], st["parks"] - before["parks"]
    assert waits > 50 and parks > waits // 2, (waits, parks)
    assert sum(st["wake_us_hist"]) - sum(before["wake_us_hist"]) == parks
    np.testing.assert_array_equal(got, want[:len(got)])


def test_two_preempted_tasks_do_not_drop_a_worker(reference):
    """A quiet machine preempts a thread now and then (another program's time slice): the
    adaptive count must not drop a worker for one or two tasks spent waiting, only for lateness
    that lasts (the test above). A task's share counts at most 1, smoothed with weight 0.2
    (ed_threads.h), so from a fresh start two tasks of share 1 and one more task, however busy
    the machine, reach at most 1 - 0.8^3 = 0.49, under the 1/n = 0.5 that drops one of two
    threads. The count starts afresh just before the spike: the tasks before it may have been
    judged on a loaded machine (CPU time lost to other programs is a reason to drop)."""
    name, want = reference
    with Model.load(testdata("models", name), n_threads=2) as m:
        pool = m.backend.pool
        s = m.session(128)
        got = [s.eval(PROMPT, logits="all")]
        for _ in range(2):
            got.append(s.eval([int(got[-1][-1].argmax())]))
        pool.adaptive = False            # every worker back, smoothed share 0
        pool.adaptive = True
        drops = pool.stats()["drops"]
        pool.debug_slow(1, 3000)       # two tasks: worker 1 sleeps 3 ms before every claim
        for _ in range(2):
            got.append(s.eval([int(got[-1][-1].argmax())]))
        pool.debug_slow(1, 0)
        got.append(s.eval([int(got[-1][-1].argmax())]))
        st = pool.stats()
        assert st["drops"] == drops and pool.active_threads == 2, st
        np.testing.assert_array_equal(np.concatenate(got), want[:len(PROMPT) + 5])
        s.close()


def test_threads_sharing_one_cpu_drop_a_worker_without_changing_a_bit():
    """Two threads pinned to one CPU arrive at every barrier together (the waiter parks at
    once, the other runs), so the waiting share stays small while each runs half the time: two
    threads on one CPU are slower than one. Each thread's CPU time over the pass (the "lost"
    share: 2 - the threads' CPU time / wall time, about 1 here) must drop the worker within a
    few passes; the logits stay those of one thread. (The real model: the synthetic one's
    passes are shorter than the pool judges.)"""
    import edged._core as core
    name = MODELS[0]
    with Model.load(testdata("models", name), n_threads=1) as m:
        want = run(m, steps=10)
    with Model.load(testdata("models", name), n_threads=2) as m:
        pool = m.backend.pool
        core.pin_pool(pool, [min(os.sched_getaffinity(0))])
        try:
            got = run(m, steps=10)
            st = pool.stats()
        finally:
            core.pin_pool(pool, [])
    assert st["drops"] >= 1, st
    np.testing.assert_array_equal(got, want)


def test_a_dropped_worker_is_not_probed_while_no_cpu_is_idle():
    """A probe runs the dropped worker again for a few passes, each slower than one thread when
    another program keeps the CPUs busy. So the pool looks at the CPUs' idle time first
    (/proc/stat) and probes only when some CPU had time to spare since the drop: with none, no
    probe for as long as it lasts; once there is, the probe comes at the next look."""
    import edged._core as core
    name = MODELS[0]
    with Model.load(testdata("models", name), n_threads=1) as m:
        want = run(m, steps=10)
    with Model.load(testdata("models", name), n_threads=2) as m:
        pool = m.backend.pool
        core.pin_pool(pool, [min(os.sched_getaffinity(0))])   # two threads on one CPU: a drop
        try:
            got = run(m, steps=10)
        finally:
            core.pin_pool(pool, [])
        st = pool.stats()
        assert st["drops"] >= 1 and st["active"] == 1, st
        pool.debug_free_cpus(0.0)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.8:                     # past four looks 0.2 s apart
            run(m, steps=2)
        quiet = pool.stats()
        assert quiet["probes"] == st["probes"] and quiet["probe_skips"] >= 2, quiet
        assert quiet["active"] == 1, quiet
        pool.debug_free_cpus(2.0)
        t0 = time.monotonic()
        while pool.stats()["probes"] == quiet["probes"] and time.monotonic() - t0 < 2.0:
            run(m, steps=2)
        assert pool.stats()["probes"] > quiet["probes"], pool.stats()
    np.testing.assert_array_equal(got, want)


def test_idle_cpus_come_from_proc_stat():
    """The idle time the probes look at: with a busy loop on every CPU of the process (at the
    same priority), almost none of them is idle; the reading stays within the CPUs it covers."""
    import edged._core as core
    import subprocess
    allowed = sorted(os.sched_getaffinity(0))
    pool = core.Pool(1)
    assert pool.free_cpus() is None                      # the first look starts the window
    time.sleep(0.1)
    free = pool.free_cpus()
    assert free is not None and 0.0 <= free <= len(allowed) + 0.2, free
    loops = [subprocess.Popen(["taskset", "-c", str(c), "sh", "-c", "while :; do :; done"])
             for c in allowed]
    try:
        time.sleep(0.3)
        pool.free_cpus()
        time.sleep(0.5)
        busy = pool.free_cpus()
    finally:
        for p in loops:
            p.kill()
            p.wait()
    assert busy is not None and busy < 0.3, busy


def test_a_thread_sharing_a_cpu_moves_to_another_and_keeps_its_affinity():
    """When every CPU runs something, the kernel places a woken worker beside its waker and the
    two take turns on one CPU; a waiter that sees another thread of the pool on its CPU moves
    itself (its affinity without this CPU, then the whole set again). Here the calling thread
    does it: it must end on another CPU with the same affinity as before; a pinned pool never
    moves (pinning is the user's choice)."""
    import edged._core as core
    allowed = os.sched_getaffinity(0)
    assert len(allowed) >= 2, "needs two CPUs"
    pool = core.Pool(2)
    before, after, moved = pool.debug_nudge()
    assert moved and before != after and after in allowed, (before, after, moved)
    assert os.sched_getaffinity(0) == allowed
    assert pool.stats()["nudges"] == 1
    core.pin_pool(pool, [min(allowed)])
    try:
        time.sleep(0.02)                # past the per-thread minimum interval between moves
        assert pool.debug_nudge()[2] is False
    finally:
        core.pin_pool(pool, [])
    assert os.sched_getaffinity(0) == allowed

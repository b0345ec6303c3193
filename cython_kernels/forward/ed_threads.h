/* The persistent worker pool of the forward pass: tasks, barriers, work chunks, an adaptive
 * thread count, and pinning workers to CPUs.
 *
 * Written here rather than taken from OpenMP: the forward pass runs hundreds of barriers per
 * token, and what it must survive is an edge device's other software taking a core. OpenMP's
 * barriers spin or yield for a fixed policy (GOMP_SPINCOUNT) and its team size is fixed per
 * region; neither lets a late worker's work move to the others or the team shrink while the
 * machine is busy and grow back when it quiets.
 *
 *   ed_pool *ed_pool_create(int n_threads) / void ed_pool_destroy(ed_pool *p)
 *   void ed_pool_run(ed_pool *p, ed_task_fn fn, void *arg)
 *       fn(arg, ith, nth) on this task's threads (the caller is ith 0; nth may be fewer than
 *       n_threads while workers are dropped, see below); returns when all have finished.
 *   void ed_pool_run_all(ed_pool *p, ed_task_fn fn, void *arg)
 *       the same on every worker, ith = the worker's number (pinning).
 *   void ed_barrier(ed_pool *p)
 *       inside a task: all nth threads wait for each other. A waiter spins up to ED_SPIN_NS,
 *       then parks on a futex (no spin-then-sched_yield storm while a descheduled thread is
 *       late); the last arriver wakes the parked ones. A waiter whose awaited thread last ran
 *       on the waiter's own CPU parks at once.
 *   int64_t ed_claim(ed_pool *p, int64_t n)
 *       the next of an op's n chunks (0..n-1) from the task's shared counter, or -1 when all
 *       are taken. Every thread of the task calls it until -1, and a barrier follows before the
 *       next op claims: a late thread takes fewer chunks and the others take the rest. The
 *       counter is never reset inside a task: each thread knows where the op's numbers start
 *       because every thread makes exactly one failing claim per op (n + nth numbers per op).
 *   int ed_pool_pin(ed_pool *p, const int *cpus, int n, const cpu_set_t *initial)
 *       worker i is pinned to cpus[i % n]; n == 0 restores `initial`. Returns the failures.
 *
 * Adaptive thread count. Every barrier's last arriver adds the gap since the first arrival to
 * its own lateness; after each task the caller computes the share L/T of the task's wall time
 * T that the others spent waiting (a quiet machine: a few percent). With n threads doing work
 * W, T = W/n + L, and n - 1 threads would take W/(n-1): fewer threads are faster once
 * L/T > 1/n. Threads that share a CPU (with each other, or each with another program's busy
 * loop) arrive at the barriers together and still run part time: that costs the same and the
 * waiting share does not see it, so each thread also reads its own CPU time over the task
 * (CLOCK_THREAD_CPUTIME_ID: spinning counts, parked or descheduled time does not) over its
 * own time on the task, and the task's "lost" share sums 1 - that ratio over its threads: the
 * CPUs, in threads, that the task did not get (quiet: about 0; two threads on one CPU: 1). A
 * worker's wake-up is not in it (a late start is lateness at the first barrier), so a probe
 * that wakes a sleeping worker is not judged by its wake-up. A task counts with
 * the larger of the two shares. So when that share (at most 1 per task), smoothed over tasks (weight
 * ED_ADAPT_ALPHA: one or two preempted tasks on a quiet machine do not reach it, a core kept
 * busy by another program does within a few tasks), passes 1/n (or the pool's late_share when
 * set) the pool drops one worker (the latest, or where CPU time was lost the one that got the
 * least; if that is the caller, the highest-numbered one): it sleeps on its futex and takes no part until a probe. Probes re-admit the last
 * dropped worker for ED_PROBE_TASKS tasks after ED_PROBE_MIN_NS, doubling after each failed
 * probe up to ED_PROBE_MAX_NS; a probe whose mean share is under the threshold keeps it (a
 * probe ends early once its mean can no longer come under it). A probe waits, moreover,
 * until the process's CPUs had at least ED_PROBE_FREE CPUs' worth of idle time since the drop
 * or the last look (/proc/stat, looked at every ED_PROBE_MIN_NS): while another program keeps
 * every CPU busy a probe could only fail, and each failed probe costs slow tasks; when the
 * machine quiets the next look lets it run. Results do not depend on
 * it: every op's split (chunks of whole 16-row tiles, token ranges) gives bit-identical sums
 * whatever the thread count. Tasks shorter than ED_ADAPT_MIN_NS are not judged (wake-up
 * latency), nor by lost CPU time when shorter than ED_LOST_MIN_NS.
 *
 * Waiting: spin long, park at once when sharing a CPU. Parking is expensive on a busy device:
 * a parked thread's CPU goes to whatever else is runnable (under EEVDF a nice-19 task keeps it
 * for its slice), and a futex wake-up in a VM costs about 100 us even then. With a 30 us spin
 * and only nice-19 work beside it, a 2-thread tg run of the 0.5B model slept ~35 times per
 * token per thread and waited p90 0.4 ms, p99 4 ms to run again after each wake-up (`perf
 * sched timehist`): two threads were slower than one (docs/threads.md, Pool.stats' "parks"
 * and "wake_us_hist" count it).
 * So a waiter spins up to ED_SPIN_NS (1 ms: a token's barriers are tens of microseconds apart
 * when both threads run) and parks only when the thread it waits for is really away; but if
 * that thread last ran on the waiter's own CPU (the kernel placed both there at a wake-up),
 * spinning would keep it off the CPU, so the waiter parks at once. Between tasks a worker
 * spins ED_IDLE_SPIN_NS (the caller's Python work between tokens), so an idle pool is asleep
 * 1 ms after its last task.
 *
 * Needs _GNU_SOURCE in the translation unit (Python.h defines it before anything else) for
 * CPU_SET and pthread_setaffinity_np. The CPU list comes from edged/engine/threads.py, which
 * only ever picks CPUs inside the process's sched_getaffinity set.
 */
#ifndef EDGED_ED_THREADS_H
#define EDGED_ED_THREADS_H

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ED_SPIN_NS 1000000          /* inside a task, spin this long before parking ... */
#define ED_IDLE_SPIN_NS 1000000     /* ... and between tasks ($EDGED_SPIN_US, $EDGED_IDLE_SPIN_US) */
#define ED_WAKE_BUCKETS 16          /* wake-up latency histogram: bucket b holds [2^(b-1), 2^b) us */
#define ED_NUDGE_NS 10000000        /* a thread moves off a shared CPU at most this often */
#define ED_ADAPT_MIN_NS 1000000     /* shorter tasks are not judged */
#define ED_LOST_MIN_NS 4000000      /* nor, shorter than this, by the CPU time they lost (one
                                       time slice of another program is all of such a task) */
#define ED_ADAPT_ALPHA 0.2          /* weight of a task's waiting share in the smoothed share */
#define ED_PROBE_TASKS 3            /* a probe judges the mean share of this many tasks */
#define ED_PROBE_MIN_NS 200000000   /* first probe of a dropped worker after 0.2 s ... */
#define ED_PROBE_MAX_NS 3200000000LL  /* ... doubling after each failed probe, up to 3.2 s */
#define ED_PROBE_FREE 0.5           /* and only when the pool's CPUs had this much idle time (in
                                       CPUs) since the drop or the last look (/proc/stat) */

typedef void (*ed_task_fn)(void *arg, int ith, int nth);

typedef struct ed_pool ed_pool;

/* one worker's wake word, on its own cache line */
typedef struct {
    atomic_int go;         /* bumped by the caller to start this worker on the current task */
    atomic_int parked;     /* the worker sleeps on `go` */
    int ith;               /* its thread index in the current task */
    int w;                 /* its worker number */
    ed_pool *p;
} __attribute__((aligned(64))) ed_worker;

struct ed_pool {
    int n_threads;             /* workers created, the caller included */
    int n_active;              /* threads of the current task */
    pthread_t *threads;        /* (n_threads) [0] unused: the caller */
    ed_worker *workers;        /* (n_threads) */
    ed_task_fn fn;
    void *arg;
    int stop;
    atomic_int remaining;      /* workers still running the task */
    atomic_int join_parked;
    atomic_int barrier_count;
    atomic_int barrier_phase;
    atomic_int barrier_parked;
    atomic_llong chunk_next;   /* ed_claim's counter, zeroed per task */
    int64_t *arrive_ns;        /* (n_threads) by task index: last barrier arrival */
    int64_t *late_ns;          /* (n_threads) by task index: gaps it closed as last arriver */
    int64_t *cpu_ns;           /* (n_threads) by task index: CPU time it got during the task ... */
    int64_t *run_ns;           /* ... and the wall time from its start on the task to its end */
    int *claimed;              /* (n_threads) by worker: chunks taken in the last task */
    int *task_worker;          /* (n_threads) task index -> worker number */
    /* adaptive thread count (the caller's, between tasks) */
    int adapt;
    unsigned char *active;     /* (n_threads) by worker: takes part in tasks */
    int *dropped;              /* (n_threads) stack of dropped workers, last dropped on top */
    int n_dropped, probing;    /* probing: the worker re-admitted on probation, else 0 */
    int probe_tasks;           /* tasks judged so far on this probation */
    double probe_share;        /* their waiting shares' sum */
    double late_share;         /* the waiting share that drops a worker; 0: 1/n threads */
    double late_ewma, last_share, last_lost;
    int64_t probe_at, backoff;
    long n_drops, n_probes, n_retakes, n_probe_skips;
    /* the idle time of the process's CPUs (/proc/stat, in clock ticks) at the last look */
    long long idle_ticks;
    int64_t idle_at;                   /* when (0: no look yet, or /proc/stat unreadable) */
    double last_free, free_override;   /* CPUs idle over the last look's window; tests: < 0 off */
    int64_t spin_ns, idle_spin_ns;     /* spin before parking: inside a task / between tasks */
    atomic_int *cpu_of;                /* (n_threads) by worker: the CPU it last ran on */
    int trace;                         /* $EDGED_THREAD_TRACE: log the adaptive count's decisions */
    /* moving off a CPU shared with another thread of the pool (unpinned pools only) */
    int pinned, nudge;
    atomic_llong n_nudges;
    /* waiting, for measurements (Pool.stats): waits inside tasks, how many parked, for how
       long, and how long a parked waiter took to run again after its release */
    atomic_llong n_waits, n_parks, park_ns;
    atomic_llong wake_hist[ED_WAKE_BUCKETS];
    atomic_llong release_ns;           /* when the last barrier or join was released */
    /* debug: worker slow_worker sleeps slow_ns before each claim (tests of uneven claiming) */
    int slow_worker;
    int64_t slow_ns;
};

static _Thread_local int ed_tls_ith;          /* this thread's index in the current task */
static _Thread_local int ed_tls_worker;       /* its worker number */
static _Thread_local int64_t ed_tls_chunk0;   /* where the current op's chunk numbers start */
static _Thread_local int ed_tls_claimed;

static inline int64_t ed_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t ed_clock_ns(void) { return ed_ns(CLOCK_MONOTONIC); }
/* this thread's CPU time (spinning included; parked or descheduled time not) */
static inline int64_t ed_thread_cpu_ns(void) { return ed_ns(CLOCK_THREAD_CPUTIME_ID); }

static inline void ed_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield");
#endif
}

static inline void ed_futex_wait(atomic_int *addr, int val) {
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static inline void ed_futex_wake(atomic_int *addr) {
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Does a thread this waiter waits for last run on the waiter's own CPU? Then spinning only
   keeps it off the CPU: park at once. In a task: any other thread of the task; between tasks
   (w_only >= 0): the caller, who starts the next one. */
static int ed_shares_cpu(ed_pool *p, int me, int w_only) {
    const int cpu = sched_getcpu();
    if (cpu < 0) return 0;
    if (w_only >= 0) return atomic_load_explicit(&p->cpu_of[w_only], memory_order_relaxed) == cpu;
    for (int i = 0; i < p->n_active; i++) {
        const int w = p->task_worker[i];
        if (w != me && atomic_load_explicit(&p->cpu_of[w], memory_order_relaxed) == cpu) return 1;
    }
    return 0;
}

static _Thread_local int64_t ed_tls_nudged_ns;

/* A waiter inside a task that finds a thread of the pool on its own CPU moves itself to another
   of the process's CPUs: its affinity without this CPU (the kernel migrates it at once, to the
   least loaded of the others), then the whole set again (no move back). The kernel places a
   woken worker beside its waker when no CPU is idle (every CPU running something, even a
   nice-19 task), and the two then take turns on one CPU for as long as the load balancer lets
   them. At most once per ED_NUDGE_NS per thread; never for pinned pools (the pinning is the
   user's choice) or a thread allowed one CPU. Returns whether it moved. */
static int ed_nudge(ed_pool *p) {
    if (!p->nudge || p->pinned) return 0;
    const int64_t now = ed_clock_ns();
    if (now - ed_tls_nudged_ns < ED_NUDGE_NS) return 0;
    ed_tls_nudged_ns = now;
    const int cpu = sched_getcpu();
    cpu_set_t allowed, others;
    if (cpu < 0 || cpu >= CPU_SETSIZE || pthread_getaffinity_np(pthread_self(), sizeof allowed, &allowed) != 0 ||
        !CPU_ISSET(cpu, &allowed)) return 0;
    others = allowed;
    CPU_CLR(cpu, &others);
    if (CPU_COUNT(&others) == 0 || pthread_setaffinity_np(pthread_self(), sizeof others, &others) != 0) return 0;
    pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed);
    atomic_store_explicit(&p->cpu_of[ed_tls_worker], sched_getcpu(), memory_order_relaxed);
    atomic_fetch_add_explicit(&p->n_nudges, 1, memory_order_relaxed);
    return 1;
}

/* Return once *w != val: spin up to spin_ns (idle: idle_spin_ns), then sleep on the futex.
   Whoever changes *w wakes the sleepers when *parked > 0 (both sides sequentially consistent:
   one of them sees the other). A waiter that finds a thread it waits for on its own CPU (the
   kernel put both there at a wake-up while every CPU ran something) parks at once: spinning
   would only keep that thread off the CPU. `me` is the waiter's worker number; a wait inside
   a task (idle = 0) is counted in p's statistics. */
static void ed_wait_change(ed_pool *p, atomic_int *w, int val, atomic_int *parked, int me, int idle) {
    const int64_t spin_ns = idle ? p->idle_spin_ns : p->spin_ns;
    int64_t t0 = 0;
    if (!idle) atomic_fetch_add_explicit(&p->n_waits, 1, memory_order_relaxed);
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(w, memory_order_acquire) != val) return;
        ed_cpu_relax();
        if ((i & 63) == 0) {
            const int64_t t = ed_clock_ns();
            if (!t0) t0 = t;
            else if (t - t0 > spin_ns) break;
            if (ed_shares_cpu(p, me, idle ? 0 : -1)) {
                if (!idle && ed_nudge(p)) { t0 = 0; continue; }  /* moved: spin on there */
                break;
            }
        }
    }
    atomic_fetch_add(parked, 1);
    while (atomic_load(w) == val) ed_futex_wait(w, val);
    atomic_fetch_sub(parked, 1);
    if (!idle) {
        const int64_t now = ed_clock_ns();
        int64_t lat = now - atomic_load_explicit(&p->release_ns, memory_order_relaxed);
        int b = 0;
        for (int64_t us = lat / 1000; us > 0 && b < ED_WAKE_BUCKETS - 1; us >>= 1) b++;
        atomic_fetch_add_explicit(&p->n_parks, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->park_ns, now - t0, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->wake_hist[b], 1, memory_order_relaxed);
    }
}

static inline void ed_wake(atomic_int *w, atomic_int *parked) {
    if (atomic_load(parked) > 0) ed_futex_wake(w);
}

static void ed_barrier(ed_pool *p) {
    const int nth = p->n_active;
    if (nth == 1) return;
    const int ith = ed_tls_ith;
    const int64_t now = ed_clock_ns();
    p->arrive_ns[ith] = now;
    atomic_store_explicit(&p->cpu_of[ed_tls_worker], sched_getcpu(), memory_order_relaxed);
    const int phase = atomic_load_explicit(&p->barrier_phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&p->barrier_count, 1, memory_order_acq_rel) == nth - 1) {
        int64_t first = now;
        for (int j = 0; j < nth; j++) if (p->arrive_ns[j] < first) first = p->arrive_ns[j];
        p->late_ns[ith] += now - first;
        atomic_store_explicit(&p->barrier_count, 0, memory_order_relaxed);
        atomic_store_explicit(&p->release_ns, now, memory_order_relaxed);
        atomic_fetch_add(&p->barrier_phase, 1);
        ed_wake(&p->barrier_phase, &p->barrier_parked);
        return;
    }
    ed_wait_change(p, &p->barrier_phase, phase, &p->barrier_parked, ed_tls_worker, 0);
}

static int64_t ed_claim(ed_pool *p, int64_t n) {
    if (p->slow_ns && ed_tls_worker == p->slow_worker) {
        struct timespec ts = {(time_t)(p->slow_ns / 1000000000), (long)(p->slow_ns % 1000000000)};
        nanosleep(&ts, NULL);
    }
    const int64_t c = atomic_fetch_add_explicit(&p->chunk_next, 1, memory_order_relaxed) - ed_tls_chunk0;
    if (c < n) { ed_tls_claimed++; return c; }
    ed_tls_chunk0 += n + p->n_active;
    return -1;
}

static void ed_task_enter(int ith, int w) {
    ed_tls_ith = ith; ed_tls_worker = w; ed_tls_chunk0 = 0; ed_tls_claimed = 0;
}

static void *ed_worker_main(void *vp) {
    ed_worker *me = (ed_worker *)vp;
    ed_pool *p = me->p;
    int seen = 0;
    for (;;) {
        ed_wait_change(p, &me->go, seen, &me->parked, me->w, 1);
        seen = atomic_load_explicit(&me->go, memory_order_acquire);
        if (p->stop) return NULL;
        ed_task_enter(me->ith, me->w);
        atomic_store_explicit(&p->cpu_of[me->w], sched_getcpu(), memory_order_relaxed);
        const int64_t cpu0 = p->adapt ? ed_thread_cpu_ns() : 0, run0 = p->adapt ? ed_clock_ns() : 0;
        p->fn(p->arg, me->ith, p->n_active);
        p->claimed[me->w] = ed_tls_claimed;
        const int64_t done = ed_clock_ns();
        if (p->adapt) {
            p->cpu_ns[me->ith] = ed_thread_cpu_ns() - cpu0;
            p->run_ns[me->ith] = done - run0;
        }
        p->arrive_ns[me->ith] = done;
        atomic_store_explicit(&p->cpu_of[me->w], sched_getcpu(), memory_order_relaxed);
        if (atomic_load_explicit(&p->remaining, memory_order_relaxed) == 1)
            atomic_store_explicit(&p->release_ns, done, memory_order_relaxed);
        if (atomic_fetch_sub(&p->remaining, 1) == 1) ed_wake(&p->remaining, &p->join_parked);
    }
}

/* the caller's side of a task: number the threads taking part, start them, run share 0, join */
static void ed_pool_task(ed_pool *p, ed_task_fn fn, void *arg, int all) {
    int nth = 1;
    p->task_worker[0] = 0;
    for (int w = 1; w < p->n_threads; w++)
        if (all || p->active[w]) { p->workers[w].ith = nth; p->task_worker[nth++] = w; }
    p->fn = fn; p->arg = arg; p->n_active = nth;
    for (int i = 0; i < nth; i++) p->late_ns[i] = p->cpu_ns[i] = p->run_ns[i] = 0;
    const int64_t cpu0 = p->adapt ? ed_thread_cpu_ns() : 0, run0 = p->adapt ? ed_clock_ns() : 0;
    for (int w = 0; w < p->n_threads; w++) p->claimed[w] = 0;
    atomic_store_explicit(&p->chunk_next, 0, memory_order_relaxed);
    atomic_store(&p->remaining, nth - 1);
    atomic_store_explicit(&p->cpu_of[0], sched_getcpu(), memory_order_relaxed);
    for (int i = 1; i < nth; i++) {
        ed_worker *wk = &p->workers[p->task_worker[i]];
        atomic_fetch_add(&wk->go, 1);
        ed_wake(&wk->go, &wk->parked);
    }
    ed_task_enter(0, 0);
    fn(arg, 0, nth);
    p->claimed[0] = ed_tls_claimed;
    const int64_t mine = ed_clock_ns();
    atomic_store_explicit(&p->cpu_of[0], sched_getcpu(), memory_order_relaxed);
    int left;
    while ((left = atomic_load(&p->remaining)) != 0) ed_wait_change(p, &p->remaining, left, &p->join_parked, 0, 0);
    if (p->adapt) {
        p->cpu_ns[0] = ed_thread_cpu_ns() - cpu0;
        p->run_ns[0] = ed_clock_ns() - run0;
    }
    if (nth > 1) {  /* the join is a barrier too: its last arriver was late by the gap */
        p->arrive_ns[0] = mine;
        int64_t first = mine, last = mine;
        int who = 0;
        for (int i = 0; i < nth; i++) {
            if (p->arrive_ns[i] < first) first = p->arrive_ns[i];
            if (p->arrive_ns[i] > last) { last = p->arrive_ns[i]; who = i; }
        }
        p->late_ns[who] += last - first;
    }
}

/* The idle time so far of the CPUs this process may run on, in clock ticks (USER_HZ), from
   /proc/stat's per-CPU lines: idle + iowait, and nice (the time of niced programs, which a
   thread of ours preempts) unless this process is niced itself (then its own time is in "nice"
   too, and other niced programs may be its equals). -1 when /proc/stat cannot be read (then
   probes are not gated). */
static long long ed_idle_ticks(void) {
    char buf[16384];  /* the per-CPU lines come first; a line cut at the end is not read */
    const int fd = open("/proc/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = 0, r;
    while (n < (ssize_t)sizeof buf - 1 && (r = read(fd, buf + n, sizeof buf - 1 - n)) > 0) n += r;
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
    const int count_nice = getpriority(PRIO_PROCESS, 0) <= 0;
    long long ticks = 0;
    int seen = 0;
    for (char *line = buf; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (!strchr(line, '\n')) break;
        if (strncmp(line, "cpu", 3) != 0 || line[3] < '0' || line[3] > '9') continue;
        char *e;
        const long cpu = strtol(line + 3, &e, 10);
        if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed)) continue;
        long long f[5] = {0, 0, 0, 0, 0};  /* user nice system idle iowait */
        for (int i = 0; i < 5; i++) f[i] = strtoll(e, &e, 10);
        ticks += f[3] + f[4] + (count_nice ? f[1] : 0);
        seen++;
    }
    return seen ? ticks : -1;
}

/* A look: the idle ticks now (ed_idle_ticks; -1: unreadable, no look) start the next window. */
static void ed_idle_mark(ed_pool *p, long long ticks, int64_t now) {
    p->idle_ticks = ticks;
    p->idle_at = ticks >= 0 ? now : 0;
}

/* CPUs (of the process's set) idle on average since the last look, and a new look; -1 when
   unknown (first look, /proc/stat unreadable, a window under 20 ms: that one goes on). */
static double ed_free_cpus(ed_pool *p, int64_t now) {
    if (p->free_override >= 0.0) return p->free_override;
    const long long ticks = ed_idle_ticks();
    if (ticks < 0 || !p->idle_at) {
        ed_idle_mark(p, ticks, now);
        return -1.0;
    }
    const int64_t window = now - p->idle_at;
    if (window < 20000000) return -1.0;
    const double free = (double)(ticks - p->idle_ticks) * 1e9 / sysconf(_SC_CLK_TCK) / (double)window;
    ed_idle_mark(p, ticks, now);
    p->last_free = free;
    return free;
}

static void ed_pool_drop(ed_pool *p, int w, int64_t now) {
    p->active[w] = 0;
    p->dropped[p->n_dropped++] = w;
    p->probe_at = now + p->backoff;
    ed_idle_mark(p, ed_idle_ticks(), now);  /* the window the next probe looks at starts here */
}

/* after a task: judge how long its threads waited for each other (see the top of the file) */
static void ed_pool_adapt(ed_pool *p, int64_t t0) {
    const int64_t now = ed_clock_ns(), wall = now - t0;
    const int nth = p->n_active;
    if (wall < ED_ADAPT_MIN_NS || nth < 2) return;
    int64_t late = 0;
    int latest = 0;
    for (int i = 0; i < nth; i++) {
        late += p->late_ns[i];
        if (p->late_ns[i] > p->late_ns[latest]) latest = i;
    }
    /* at most 1: one long preemption (a task's waits can sum past its wall time) weighs as
       one task entirely spent waiting, not several */
    const double waited = late < wall ? (double)late / (double)wall : 1.0;
    /* the CPU time the task's threads did not get while on it, in threads (the sum of each
       one's 1 - CPU time / wall time from its start on the task to its end), at most 1:
       threads that share a CPU with each other or with another program arrive at the barriers
       together yet each runs part time, which the waiting share does not see. (A worker's
       wake-up is not in it: a late start shows as lateness at the first barrier.) */
    double lost = 0.0, most = 0.0;
    int starved = 0;  /* the thread that lost the largest part of its time */
    if (wall >= ED_LOST_MIN_NS) for (int i = 0; i < nth; i++) {
        if (p->run_ns[i] <= 0 || p->cpu_ns[i] >= p->run_ns[i]) continue;
        const double l = 1.0 - (double)p->cpu_ns[i] / (double)p->run_ns[i];
        lost += l;
        if (l > most) { most = l; starved = i; }
    }
    lost = lost > 1.0 ? 1.0 : lost;
    const double share = waited > lost ? waited : lost;
    const double limit = p->late_share > 0.0 ? p->late_share : 1.0 / nth;
    p->last_share = waited;
    p->last_lost = lost;
    if (p->probing) {
        p->probe_share += share;
        if (p->trace)
            fprintf(stderr, "edged threads: probe of worker %d: %d threads, %.2f ms, waiting share %.2f, CPU lost %.2f\n",
                    p->probing, nth, wall / 1e6, waited, lost);
        /* judged after ED_PROBE_TASKS tasks, or as soon as their mean can no longer come under
           the limit (the same verdict, fewer slow tasks) */
        if (++p->probe_tasks < ED_PROBE_TASKS && p->probe_share < limit * ED_PROBE_TASKS) return;
        const int w = p->probing;
        const double mean = p->probe_share / p->probe_tasks;
        p->probing = 0;
        if (p->trace)
            fprintf(stderr, "edged threads: probe worker %d: waiting share %.2f over %d tasks (limit %.2f): %s\n",
                    w, mean, p->probe_tasks, limit, mean < limit ? "kept" : "dropped again");
        if (mean < limit) {  /* quiet again: keep it */
            p->n_retakes++;
            p->late_ewma = mean;
            p->backoff = ED_PROBE_MIN_NS;
            p->probe_at = now + p->backoff;
        } else {
            p->backoff = p->backoff * 2 < ED_PROBE_MAX_NS ? p->backoff * 2 : ED_PROBE_MAX_NS;
            ed_pool_drop(p, w, now);
        }
        return;
    }
    p->late_ewma = (1.0 - ED_ADAPT_ALPHA) * p->late_ewma + ED_ADAPT_ALPHA * share;
    if (p->trace)
        fprintf(stderr, "edged threads: %d threads, %.2f ms, waiting share %.2f, CPU lost %.2f, smoothed %.2f%s\n",
                nth, wall / 1e6, waited, lost, p->late_ewma, p->late_ewma > limit ? ": drop" : "");
    if (p->trace > 1)
        for (int i = 0; i < nth; i++)
            fprintf(stderr, "  thread %d (worker %d): CPU %.2f ms of %.2f ms on the task, closed %.2f ms of waits\n",
                    i, p->task_worker[i], p->cpu_ns[i] / 1e6, p->run_ns[i] / 1e6, p->late_ns[i] / 1e6);
    if (p->late_ewma > limit) {
        p->n_drops++;
        p->late_ewma = 0.0;
        const int who = lost > waited ? starved : latest;
        ed_pool_drop(p, p->task_worker[who ? who : nth - 1], now);
    }
}

/* Is it worth probing a dropped worker now? Not while the pool's CPUs had no idle time since
   the drop (or the last look): another program keeps them busy and the probe would only cost
   slow tasks. Looking is cheap (one read of /proc/stat), so it is repeated every
   ED_PROBE_MIN_NS; the doubling backoff spaces probes that were tried and failed. */
static int ed_probe_now(ed_pool *p) {
    const int64_t now = ed_clock_ns();
    if (now < p->probe_at) return 0;
    const double free = ed_free_cpus(p, now);
    if (free < 0.0 || free >= ED_PROBE_FREE) return 1;
    p->n_probe_skips++;
    p->probe_at = now + ED_PROBE_MIN_NS;
    if (p->trace)
        fprintf(stderr, "edged threads: no probe: %.2f CPUs idle since the last look\n", free);
    return 0;
}

static void ed_pool_run(ed_pool *p, ed_task_fn fn, void *arg) {
    if (p->adapt && p->n_dropped && !p->probing && ed_probe_now(p)) {
        p->probing = p->dropped[--p->n_dropped];  /* probe: ED_PROBE_TASKS tasks with it back */
        p->active[p->probing] = 1;
        p->probe_tasks = 0;
        p->probe_share = 0.0;
        p->n_probes++;
    }
    const int64_t t0 = ed_clock_ns();
    ed_pool_task(p, fn, arg, 0);
    if (p->adapt) ed_pool_adapt(p, t0);
}

static void ed_pool_run_all(ed_pool *p, ed_task_fn fn, void *arg) {
    ed_pool_task(p, fn, arg, 1);
}

/* Adaptive thread count on or off; off takes every dropped worker back. */
static void ed_pool_set_adapt(ed_pool *p, int on) {
    p->adapt = on;
    if (!on) {
        for (int w = 0; w < p->n_threads; w++) p->active[w] = 1;
        p->n_dropped = 0; p->probing = 0; p->late_ewma = 0.0;
        p->backoff = ED_PROBE_MIN_NS;
    }
}

static int ed_pool_active(const ed_pool *p) {
    int n = 0;
    for (int w = 0; w < p->n_threads; w++) n += p->active[w];
    return n;
}

/* $name in microseconds (measurements), else def_ns */
static int64_t ed_env_us(const char *name, int64_t def_ns) {
    const char *v = getenv(name);
    return v && *v ? (int64_t)(atof(v) * 1000.0) : def_ns;
}

static ed_pool *ed_pool_create(int n_threads) {
    ed_pool *p = (ed_pool *)calloc(1, sizeof(ed_pool));
    if (!p) return NULL;
    const int n = n_threads < 1 ? 1 : n_threads;
    p->threads = (pthread_t *)calloc(n, sizeof(pthread_t));
    p->workers = (ed_worker *)aligned_alloc(64, sizeof(ed_worker) * n);
    p->arrive_ns = (int64_t *)calloc(n, sizeof(int64_t));
    p->late_ns = (int64_t *)calloc(n, sizeof(int64_t));
    p->cpu_ns = (int64_t *)calloc(n, sizeof(int64_t));
    p->run_ns = (int64_t *)calloc(n, sizeof(int64_t));
    p->claimed = (int *)calloc(n, sizeof(int));
    p->task_worker = (int *)calloc(n, sizeof(int));
    p->active = (unsigned char *)calloc(n, 1);
    p->dropped = (int *)calloc(n, sizeof(int));
    p->cpu_of = (atomic_int *)calloc(n, sizeof(atomic_int));
    for (int i = 0; p->cpu_of && i < n; i++) atomic_init(&p->cpu_of[i], -1);
    if (!p->cpu_of || !p->threads || !p->workers || !p->arrive_ns || !p->late_ns || !p->cpu_ns || !p->run_ns || !p->claimed ||
        !p->task_worker || !p->active || !p->dropped) {
        free(p->threads); free(p->workers); free(p->arrive_ns); free(p->late_ns); free(p->cpu_ns); free(p->run_ns);
        free(p->claimed); free(p->task_worker); free(p->active); free(p->dropped);
        free(p->cpu_of); free(p);
        return NULL;
    }
    memset(p->workers, 0, sizeof(ed_worker) * n);
    p->n_threads = 1;
    p->n_active = 1;
    p->active[0] = 1;
    p->adapt = 1;
    p->backoff = ED_PROBE_MIN_NS;
    p->free_override = -1.0;
    p->last_free = -1.0;
    p->slow_worker = -1;
    p->spin_ns = ed_env_us("EDGED_SPIN_US", ED_SPIN_NS);
    p->idle_spin_ns = ed_env_us("EDGED_IDLE_SPIN_US", ED_IDLE_SPIN_NS);
    p->nudge = !(getenv("EDGED_NUDGE") && strcmp(getenv("EDGED_NUDGE"), "0") == 0);
    p->trace = getenv("EDGED_THREAD_TRACE") ? atoi(getenv("EDGED_THREAD_TRACE")) : 0;  /* 2: per thread */
    for (int i = 1; i < n; i++) {
        p->workers[i].p = p; p->workers[i].w = i;
        if (pthread_create(&p->threads[i], NULL, ed_worker_main, &p->workers[i]) != 0)
            break;  /* run with the threads we got */
        p->active[i] = 1;
        p->n_threads = i + 1;
    }
    return p;
}

static void ed_pool_destroy(ed_pool *p) {
    if (!p) return;
    p->stop = 1;
    for (int w = 1; w < p->n_threads; w++) {
        atomic_fetch_add(&p->workers[w].go, 1);
        ed_futex_wake(&p->workers[w].go);
    }
    for (int w = 1; w < p->n_threads; w++) pthread_join(p->threads[w], NULL);
    free(p->threads); free(p->workers); free(p->arrive_ns); free(p->late_ns); free(p->cpu_ns); free(p->run_ns);
    free(p->claimed); free(p->task_worker); free(p->active); free(p->dropped);
    free(p->cpu_of); free(p);
}

/* ---------------------------------------------------------------- pinning -------------- */
typedef struct {
    const int *cpus;
    int n;
    cpu_set_t initial;
    atomic_int failures;
} ed_pin_req;

static void ed_pin_task(void *arg, int ith, int nth) {
    ed_pin_req *r = (ed_pin_req *)arg;
    (void)nth;
    int rc;
    if (r->n > 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(r->cpus[ith % r->n], &set);
        rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    } else {
        rc = pthread_setaffinity_np(pthread_self(), sizeof r->initial, &r->initial);
    }
    if (rc != 0) atomic_fetch_add(&r->failures, 1);
}

static int ed_pool_pin(ed_pool *p, const int *cpus, int n, const cpu_set_t *initial) {
    ed_pin_req r;
    r.cpus = cpus; r.n = n; r.initial = *initial;
    atomic_init(&r.failures, 0);
    ed_pool_run_all(p, ed_pin_task, &r);
    p->pinned = n > 0;
    return atomic_load(&r.failures);
}

#endif

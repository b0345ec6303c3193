/* Pinning the persistent pool's workers (forward.h's ed_pool) to CPUs.
 *
 *   int ed_pool_pin(ed_pool *p, const int *cpus, int n, const cpu_set_t *initial)
 *       worker i (the calling thread is worker 0) is pinned to cpus[i % n]; n == 0 unpins
 *       (each worker gets `initial`, the set the process started with). Runs as one pool task, so
 *       every worker pins itself. Returns the number of workers whose pinning failed.
 *
 * Needs _GNU_SOURCE in the translation unit (Python.h defines it before anything else) for
 * CPU_SET and pthread_setaffinity_np.
 *
 * The CPU list comes from edged/threads.py, which only ever picks CPUs inside the process's
 * sched_getaffinity set (numactl / taskset / cgroup / CPUAffinity=).
 */
#ifndef EDGED_ED_THREADS_H
#define EDGED_ED_THREADS_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

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
    ed_pool_run(p, ed_pin_task, &r);
    return atomic_load(&r.failures);
}

#endif

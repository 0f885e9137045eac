/*
 * copier: a small pool of threads that copy memory for the zero-copy data
 * paths (registered client buffers <-> arena pages, or SSD -> client
 * buffers), so that no event loop ever spends its time in a big memcpy or
 * waits on a disk. It knows nothing of objects or
 * buffers: a job is a list of segments and a completion protocol; a
 * segment that touches a registered buffer which may shrink names it as its
 * guard, and the copy runs inside shmbuf_access_begin/end (shmbuf.h). The
 * threads share a job segment by segment, so one big transfer uses them
 * all; jobs are started in submission order.
 *
 * Lifetime of a job: the submitter owns the job and its segments. The pool
 * reads them until it finishes the job, then either marks it done (the
 * owner notices, through copy_job_done, and frees it) or, when the owner
 * abandoned it meanwhile (copy_job_abandon: its connection closed), calls
 * job->release itself. Exactly one side frees a job.
 *
 * Threads: copier_submit and copy_job_* from any thread; the job's release
 * hook runs on a pool thread; the wake hook (a job finished) on a pool
 * thread with no lock held.
 */
#ifndef COPIER_H
#define COPIER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

struct copier;
struct shmbuf;

/*
 * A segment: copy len bytes from src to dst; or, when run is set, call
 * run(arg) instead: blocking work of the same transfer (an SSD read
 * straight into the destination), shared among the threads like a copy.
 * guard: the guarded buffer (shmbuf_guarded) dst or src lies in, or NULL
 * (arena memory, a sealed buffer: nothing to guard, nothing spent).
 */
struct copy_seg {
    void *dst;
    const void *src;
    size_t len;
    void (*run)(void *arg);
    void *arg;
    struct shmbuf *guard;
};

enum copy_job_state { COPY_JOB_RUNNING = 0, COPY_JOB_DONE = 1, COPY_JOB_ABANDONED = 2 };

struct copy_job {
    struct copy_seg *segs;                  /* owner's; read until the job ends */
    size_t nsegs;
    void (*release)(struct copy_job *job);  /* frees an abandoned job (pool thread) */
    _Atomic int state;                      /* enum copy_job_state */
    /* the pool's: */
    struct copy_job *next;                  /* queue link */
    size_t claim;                           /* next segment to hand out (pool lock) */
    _Atomic size_t left;                    /* segments not finished yet */
};

/*
 * copier_stream: memcpy with non-temporal stores: dst's lines are written
 * without being read first and are not left in the cache, the right copy
 * into arena pages nobody reads soon. Fenced (sfence) before it returns, so
 * a later release (publishing the object) orders after the stores. Plain
 * memcpy for copies under 64 bytes and on CPUs without SSE2. Any thread.
 */
void copier_stream(void *dst, const void *src, size_t len);

/*
 * copier_create: start `threads` copy threads (at least 1). wake(arg) is
 * called after each job that is not abandoned ends. Returns 0 and *out, or
 * -ENOMEM / -errno (no thread).
 */
int copier_create(int threads, void (*wake)(void *arg), void *wake_arg, struct copier **out);

/*
 * copier_destroy: finish every queued job, stop the threads, free. Accepts
 * NULL. No copier_submit may run meanwhile.
 */
void copier_destroy(struct copier *c);

/* copier_submit: queue a job (state must be COPY_JOB_RUNNING). */
void copier_submit(struct copier *c, struct copy_job *job);

/* copy_job_done: true once every segment is copied (the job is the owner's again). */
bool copy_job_done(const struct copy_job *job);

/*
 * copy_job_abandon: the owner gives up on a job. Returns true when it had
 * finished already (the owner frees it now), false when the pool will call
 * job->release when it ends (the owner must not touch it again).
 */
bool copy_job_abandon(struct copy_job *job);

#endif

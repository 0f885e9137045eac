/*
 * copier: the copy thread pool behind copier.h. Each thread takes the next
 * segment of the job at the head of the queue (so a job's segments are
 * copied in parallel, jobs started in order); whichever thread finishes a
 * job's last segment completes it. The only shared state is the queue (and
 * each job's segment cursor) under one mutex, and each job's count of
 * segments left.
 *
 * Big copies use non-temporal stores: the destination (a client's buffer,
 * or arena pages) is not read back by this CPU soon, and streaming it past
 * the cache saves the read-for-ownership of every destination line, about
 * half again the bandwidth of memcpy on the machine this was measured on.
 */
#include "copier.h"

#include "shmbuf.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__SSE2__)
#include <emmintrin.h>
#define COPIER_STREAM 1
#endif

#define COPIER_STREAM_MIN (64u * 1024u) /* smaller copies stay in the cache: plain memcpy */

struct copier {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct copy_job *head;
    struct copy_job *tail;
    bool stop;
    void (*wake)(void *arg);
    void *wake_arg;
    pthread_t *threads;
    int nthreads;
};

void
copier_stream(void *dst, const void *src, size_t len)
{
#ifdef COPIER_STREAM
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;

    if (len < head + 64) {
        memcpy(dst, src, len);
        return;
    }
    memcpy(d, s, head);             /* up to the first 16-byte aligned destination byte */
    d += head;
    s += head;
    len -= head;
    for (; len >= 64; len -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));

        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    _mm_sfence();
    memcpy(d, s, len);
#else
    memcpy(dst, src, len);
#endif
}

/*
 * copier_copy: memcpy, streaming big copies past the cache (the stores are
 * fenced before it returns, so the job's completion, published with a
 * release, orders after them).
 */
static void
copier_copy(void *dst, const void *src, size_t len)
{
    if (len >= COPIER_STREAM_MIN) {
        copier_stream(dst, src, len);
    } else {
        memcpy(dst, src, len);
    }
}

/* copier_finish: the last segment of job is done: hand it back, or release it. */
static void
copier_finish(struct copier *c, struct copy_job *job)
{
    int expected = COPY_JOB_RUNNING;

    /* After this exchange the job is not ours: the owner's, or ours to release. */
    if (atomic_compare_exchange_strong_explicit(&job->state, &expected, COPY_JOB_DONE,
                                                memory_order_acq_rel, memory_order_acquire)) {
        if (c->wake != NULL) {
            c->wake(c->wake_arg);
        }
    } else {
        job->release(job);
    }
}

static void *
copier_main(void *arg)
{
    struct copier *c = arg;

    for (;;) {
        struct copy_job *job;
        size_t i;

        pthread_mutex_lock(&c->lock);
        while (c->head == NULL && !c->stop) {
            pthread_cond_wait(&c->cond, &c->lock);
        }
        job = c->head;
        if (job == NULL) {
            pthread_mutex_unlock(&c->lock);
            break;
        }
        /* Take one segment; the job leaves the queue with its last one handed out. */
        i = job->claim++;
        if (job->claim == job->nsegs) {
            c->head = job->next;
            if (c->head == NULL) {
                c->tail = NULL;
            }
        }
        pthread_mutex_unlock(&c->lock);

        if (atomic_load_explicit(&job->state, memory_order_acquire) != COPY_JOB_ABANDONED) {
            struct copy_seg *sg = &job->segs[i];

            if (sg->guard != NULL) {
                shmbuf_access_begin(sg->guard);     /* a client may shrink it meanwhile */
            }
            if (sg->run != NULL) {
                sg->run(sg->arg);
            } else {
                copier_copy(sg->dst, sg->src, sg->len);
            }
            if (sg->guard != NULL) {
                shmbuf_access_end();
            }
        }
        if (atomic_fetch_sub_explicit(&job->left, 1, memory_order_acq_rel) == 1) {
            copier_finish(c, job);
        }
    }
    return NULL;
}

int
copier_create(int threads, void (*wake)(void *arg), void *wake_arg, struct copier **out)
{
    struct copier *c = calloc(1, sizeof(*c));
    int rc;

    *out = NULL;
    if (c == NULL) {
        return -ENOMEM;
    }
    if (threads < 1) {
        threads = 1;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    c->wake = wake;
    c->wake_arg = wake_arg;
    c->threads = calloc((size_t)threads, sizeof(*c->threads));
    if (c->threads == NULL) {
        copier_destroy(c);
        return -ENOMEM;
    }
    for (int i = 0; i < threads; i++) {
        rc = pthread_create(&c->threads[i], NULL, copier_main, c);
        if (rc != 0) {
            copier_destroy(c);
            return -rc;
        }
        c->nthreads++;
    }
    *out = c;
    return 0;
}

void
copier_destroy(struct copier *c)
{
    if (c == NULL) {
        return;
    }
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    for (int i = 0; i < c->nthreads; i++) {
        pthread_join(c->threads[i], NULL);     /* they finish the queue first */
    }
    free(c->threads);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    free(c);
}

void
copier_submit(struct copier *c, struct copy_job *job)
{
    job->next = NULL;
    job->claim = 0;
    atomic_store_explicit(&job->left, job->nsegs, memory_order_relaxed);
    if (job->nsegs == 0) {
        copier_finish(c, job);
        return;
    }
    pthread_mutex_lock(&c->lock);
    if (c->tail != NULL) {
        c->tail->next = job;
    } else {
        c->head = job;
    }
    c->tail = job;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

bool
copy_job_done(const struct copy_job *job)
{
    return atomic_load_explicit(&job->state, memory_order_acquire) == COPY_JOB_DONE;
}

bool
copy_job_abandon(struct copy_job *job)
{
    int expected = COPY_JOB_RUNNING;

    return !atomic_compare_exchange_strong_explicit(&job->state, &expected, COPY_JOB_ABANDONED,
                                                    memory_order_acq_rel, memory_order_acquire);
}

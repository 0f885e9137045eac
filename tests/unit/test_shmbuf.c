/*
 * test_shmbuf: registered shared-memory buffers and the copy threads, as the
 * zero-copy methods use them: shared memory at least the registered size is
 * accepted, guarded unless sealed against shrinking; a guarded buffer that
 * shrinks under a copy fails (the copy finishes, over zeros) instead of
 * killing the process, while a SIGBUS anywhere else still does; failed
 * buffers leave their set; ranges are checked with overflow;
 * a buffer stays mapped while a transfer holds it, even after unregister;
 * copy jobs finish, and an abandoned one is released by the pool exactly
 * once.
 */
#include <criterion/criterion.h>

#include "copier.h"
#include "kverr.h"
#include "shmbuf.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#define T_TMPFS_MAGIC 0x01021994
#define T_HUGETLBFS_MAGIC 0x958458f6

static int
t_memfd(size_t size, bool seal)
{
    int fd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);

    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)size), 0);
    if (seal) {
        cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    }
    return fd;
}

Test(shmbuf, shared_memory_of_the_declared_size_guarded_unless_sealed)
{
    struct shmbuf_set *s;
    struct shmbuf *b;
    struct statfs sf;
    const char *why;
    uint64_t id;
    char path[] = "./kvstash-shmbuf-XXXXXX";
    int pipefd[2];
    int fd;

    cr_assert_eq(shmbuf_set_create(&s), 0);
    cr_assert_eq(shmbuf_register(s, t_memfd(4096, true), 8192, &id, &why), KV_INVALID_ARGUMENT);
    cr_assert_eq(shmbuf_register(s, t_memfd(4096, true), 0, &id, &why), KV_INVALID_ARGUMENT);
    cr_assert_eq(shmbuf_register(s, t_memfd(4096, false), 8192, &id, &why), KV_INVALID_ARGUMENT);
    cr_assert_eq(pipe(pipefd), 0);
    close(pipefd[1]);
    cr_assert_eq(shmbuf_register(s, pipefd[0], 4096, &id, &why), KV_INVALID_ARGUMENT, "a pipe");
    cr_assert(strstr(why, "shared memory") != NULL, "%s", why);
    /* a file on a disk file system is no shared memory (here, unless "." is on tmpfs) */
    fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    unlink(path);
    cr_assert_eq(ftruncate(fd, 4096), 0);
    cr_assert_eq(fstatfs(fd, &sf), 0);
    cr_assert_eq(shmbuf_register(s, fd, 4096, &id, &why),
                 sf.f_type == T_TMPFS_MAGIC || (long)sf.f_type == (long)T_HUGETLBFS_MAGIC
                 ? 0 : KV_INVALID_ARGUMENT, "a file on a disk is refused, one on tmpfs taken");

    cr_assert_eq(shmbuf_register(s, t_memfd(1 << 20, true), 1 << 20, &id, &why), 0);
    b = shmbuf_get(s, id);
    cr_assert(!shmbuf_guarded(b), "a memfd sealed against shrinking needs no guard");
    shmbuf_unref(b);
    cr_assert_eq(shmbuf_register(s, t_memfd(1 << 20, false), 1 << 20, &id, &why), 0, "%s", why);
    b = shmbuf_get(s, id);
    cr_assert(shmbuf_guarded(b), "an unsealed memfd is guarded");
    shmbuf_unref(b);
    fd = memfd_create("t-unsealable", MFD_CLOEXEC);      /* as SGLang's alloc_shm makes it */
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, 65536), 0);
    cr_assert_eq(shmbuf_register(s, fd, 65536, &id, &why), 0, "%s", why);
    b = shmbuf_get(s, id);
    cr_assert(shmbuf_guarded(b) && !shmbuf_failed(b));
    shmbuf_unref(b);
    shmbuf_set_destroy(s);
}

Test(shmbuf, ranges_are_checked_with_overflow)
{
    struct shmbuf_set *s;
    struct shmbuf *b;
    const char *why;
    uint64_t id;

    cr_assert_eq(shmbuf_set_create(&s), 0);
    cr_assert_eq(shmbuf_register(s, t_memfd(65536, true), 65536, &id, &why), 0);
    b = shmbuf_get(s, id);
    cr_assert_not_null(b);
    cr_assert_not_null(shmbuf_range(b, 0, 65536));
    cr_assert_not_null(shmbuf_range(b, 65536, 0));
    cr_assert_null(shmbuf_range(b, 1, 65536));
    cr_assert_null(shmbuf_range(b, 65537, 0));
    cr_assert_null(shmbuf_range(b, UINT64_MAX, 2));
    cr_assert_null(shmbuf_range(b, 10, UINT64_MAX - 5));
    cr_assert_null(shmbuf_get(s, id + 1));
    shmbuf_unref(b);
    shmbuf_set_destroy(s);
}

Test(shmbuf, a_held_buffer_outlives_unregister)
{
    struct shmbuf_set *s;
    struct shmbuf *b;
    const char *why;
    uint64_t id;
    uint8_t *p;

    cr_assert_eq(shmbuf_set_create(&s), 0);
    cr_assert_eq(shmbuf_register(s, t_memfd(8192, true), 8192, &id, &why), 0);
    b = shmbuf_get(s, id);
    cr_assert_eq(shmbuf_unregister(s, id), 0);
    cr_assert_eq(shmbuf_unregister(s, id), KV_NOT_FOUND);
    cr_assert_null(shmbuf_get(s, id), "an unregistered id is gone for new transfers");
    p = shmbuf_range(b, 0, 8192);
    memset(p, 0xab, 8192);          /* still mapped: a copy in flight may finish */
    cr_assert_eq(p[8191], 0xab);
    shmbuf_unref(b);
    shmbuf_set_destroy(s);
}

/* ---- copier ---- */

static _Atomic int t_wakes;
static _Atomic int t_released;

static void
t_wake(void *arg)
{
    (void)arg;
    atomic_fetch_add(&t_wakes, 1);
}

static void
t_release(struct copy_job *job)
{
    atomic_fetch_add(&t_released, 1);
    free(job->segs);
    free(job);
}

static struct copy_job *
t_job(void *dst, const void *src, size_t len, size_t nsegs)
{
    struct copy_job *job = calloc(1, sizeof(*job));
    size_t per = len / nsegs;

    cr_assert_not_null(job);
    job->segs = calloc(nsegs, sizeof(*job->segs));
    cr_assert_not_null(job->segs);
    for (size_t i = 0; i < nsegs; i++) {
        job->segs[i].dst = (uint8_t *)dst + i * per;
        job->segs[i].src = (const uint8_t *)src + i * per;
        job->segs[i].len = i + 1 == nsegs ? len - i * per : per;
    }
    job->nsegs = nsegs;
    job->release = t_release;
    atomic_init(&job->state, COPY_JOB_RUNNING);
    return job;
}

Test(copier, jobs_copy_every_segment_and_wake)
{
    struct copier *c;
    size_t len = 8 << 20;
    uint8_t *src = malloc(len);
    uint8_t *dst[4];
    struct copy_job *jobs[4];

    cr_assert_not_null(src);
    for (size_t i = 0; i < len; i++) {
        src[i] = (uint8_t)(i * 7 + (i >> 13));
    }
    cr_assert_eq(copier_create(2, t_wake, NULL, &c), 0);
    for (int j = 0; j < 4; j++) {
        dst[j] = calloc(1, len);
        cr_assert_not_null(dst[j]);
        jobs[j] = t_job(dst[j], src, len, (size_t)(1 + j * 5));
        copier_submit(c, jobs[j]);
    }
    for (int j = 0; j < 4; j++) {
        for (int spin = 0; !copy_job_done(jobs[j]) && spin < 10000; spin++) {
            usleep(1000);
        }
        cr_assert(copy_job_done(jobs[j]));
        cr_assert_eq(memcmp(dst[j], src, len), 0, "job %d copied wrong bytes", j);
        cr_assert(copy_job_abandon(jobs[j]), "a finished job is the owner's to free");
        free(jobs[j]->segs);
        free(jobs[j]);
        free(dst[j]);
    }
    copier_destroy(c);
    cr_assert_eq(atomic_load(&t_wakes), 4);
    cr_assert_eq(atomic_load(&t_released), 0);
    free(src);
}

Test(copier, an_abandoned_job_is_released_by_the_pool_once)
{
    struct copier *c;
    size_t len = 64 << 20;
    uint8_t *src = calloc(1, len);
    uint8_t *dst = calloc(1, len);
    struct copy_job *big;
    struct copy_job *later;
    int abandoned_early = 0;

    cr_assert(src != NULL && dst != NULL);
    cr_assert_eq(copier_create(1, t_wake, NULL, &c), 0);
    big = t_job(dst, src, len, 64);             /* keeps the only thread busy a while */
    later = t_job(dst, src, 4096, 1);
    copier_submit(c, big);
    copier_submit(c, later);
    if (!copy_job_abandon(later)) {
        abandoned_early = 1;                    /* the pool frees it; we must not */
    } else {
        free(later->segs);
        free(later);
    }
    copier_destroy(c);                          /* finishes the queue first */
    cr_assert(copy_job_done(big));
    cr_assert_eq(atomic_load(&t_released), abandoned_early);
    free(big->segs);
    free(big);
    free(src);
    free(dst);
}

/*
 * Big segments go through the streaming copy: whatever the alignment of either
 * side and whatever the length's remainder, every byte arrives and none around.
 */
Test(copier, big_copies_at_any_alignment_are_exact)
{
    static const size_t lens[] = {64 * 1024, 64 * 1024 + 37, 1 << 20, (1 << 20) + 63, 300001};
    static const size_t offs[] = {0, 1, 15, 16, 33};
    size_t cap = (1 << 20) + 256;
    uint8_t *src = malloc(cap), *dst = malloc(cap + 64);
    struct copier *c;

    cr_assert(src != NULL && dst != NULL);
    for (size_t i = 0; i < cap; i++) {
        src[i] = (uint8_t)(i * 13 + (i >> 11));
    }
    cr_assert_eq(copier_create(1, NULL, NULL, &c), 0);
    for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
        for (size_t o = 0; o < sizeof(offs) / sizeof(offs[0]); o++) {
            size_t so = (offs[o] * 7) % 16;
            struct copy_job *job;

            memset(dst, 0xa5, cap + 64);
            job = t_job(dst + offs[o], src + so, lens[l], 1);
            copier_submit(c, job);
            for (int spin = 0; !copy_job_done(job) && spin < 10000; spin++) {
                usleep(100);
            }
            cr_assert(copy_job_done(job));
            cr_assert_eq(memcmp(dst + offs[o], src + so, lens[l]), 0,
                         "len %zu at dst+%zu src+%zu: wrong bytes", lens[l], offs[o], so);
            for (size_t i = 0; i < offs[o]; i++) {
                cr_assert_eq(dst[i], 0xa5, "a byte before the destination was written");
            }
            for (size_t i = offs[o] + lens[l]; i < cap + 64; i++) {
                cr_assert_eq(dst[i], 0xa5, "byte %zu after the destination was written", i);
            }
            cr_assert(copy_job_abandon(job));
            free(job->segs);
            free(job);
        }
    }
    copier_destroy(c);
    free(src);
    free(dst);
}

/* ---- the SIGBUS guard ---- */

/* A guarded buffer of size bytes filled with 0x5a; *fd: the caller's descriptor of it. */
static struct shmbuf *
t_guarded(struct shmbuf_set *s, size_t size, int *fd, uint64_t *id)
{
    const char *why;
    struct shmbuf *b;
    int mine = memfd_create("t-guarded", MFD_CLOEXEC);
    uint8_t *p;

    cr_assert_geq(mine, 0);
    cr_assert_eq(ftruncate(mine, (off_t)size), 0);
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, mine, 0);
    cr_assert_neq(p, MAP_FAILED);
    memset(p, 0x5a, size);
    munmap(p, size);
    cr_assert_eq(shmbuf_register(s, dup(mine), size, id, &why), 0, "%s", why);
    b = shmbuf_get(s, *id);
    cr_assert(b != NULL && shmbuf_guarded(b));
    *fd = mine;
    return b;
}

static void
t_wait(struct copy_job *job)
{
    for (int spin = 0; !copy_job_done(job) && spin < 20000; spin++) {
        usleep(500);
    }
    cr_assert(copy_job_done(job), "the copy job never finished");
}

/* Copies out of and into a buffer whose file was cut to nothing: they finish, it failed. */
Test(shmbuf_guard, a_buffer_cut_short_fails_its_copies_not_the_process)
{
    size_t len = 4 << 20;
    struct shmbuf_set *s;
    struct copier *c;
    struct shmbuf *b;
    struct copy_job *job;
    uint8_t *dst = malloc(len);
    uint64_t id;
    int fd;

    cr_assert_not_null(dst);
    cr_assert_eq(shmbuf_set_create(&s), 0);
    cr_assert_eq(copier_create(2, NULL, NULL, &c), 0);
    b = t_guarded(s, len, &fd, &id);

    /* untouched, a guarded copy is a plain copy */
    job = t_job(dst, shmbuf_range(b, 0, len), len, 8);
    for (size_t i = 0; i < job->nsegs; i++) {
        job->segs[i].guard = b;
    }
    copier_submit(c, job);
    t_wait(job);
    cr_assert(!shmbuf_failed(b));
    cr_assert(dst[0] == 0x5a && dst[len - 1] == 0x5a);
    free(job->segs);
    free(job);

    /* a put from it after the client cut it in half: finishes over zeros, fails */
    cr_assert_eq(ftruncate(fd, (off_t)(len / 2)), 0);
    job = t_job(dst, shmbuf_range(b, 0, len), len, 8);
    for (size_t i = 0; i < job->nsegs; i++) {
        job->segs[i].guard = b;
    }
    copier_submit(c, job);
    t_wait(job);
    cr_assert(shmbuf_failed(b), "the fault was not noticed");
    free(job->segs);
    free(job);

    /* a get into it, once zero pages replaced it: nothing faults any more */
    job = t_job(shmbuf_range(b, 0, len), dst, len, 8);
    for (size_t i = 0; i < job->nsegs; i++) {
        job->segs[i].guard = b;
    }
    copier_submit(c, job);
    t_wait(job);
    free(job->segs);
    free(job);

    cr_assert_eq(shmbuf_set_drop_failed(s), 1);
    cr_assert_null(shmbuf_get(s, id), "a failed buffer leaves its set");
    cr_assert_eq(shmbuf_set_drop_failed(s), 0);
    shmbuf_unref(b);
    copier_destroy(c);
    shmbuf_set_destroy(s);
    close(fd);
    free(dst);
}

struct t_cutter {
    int fd;
    size_t len;
    _Atomic int go;
};

static void *
t_cut(void *arg)
{
    struct t_cutter *t = arg;

    while (atomic_load(&t->go) == 0) {
        ;
    }
    usleep(200);
    cr_assert_eq(ftruncate(t->fd, (off_t)(t->len / 8)), 0);
    return NULL;
}

/*
 * A thread cuts the file while the copy threads stream into and out of it, many
 * times: never a crash; a copy that overlapped the cut reports the buffer failed.
 */
Test(shmbuf_guard, cut_during_copies_many_times)
{
    size_t len = 16 << 20;
    uint8_t *arena = malloc(len);
    struct copier *c;

    cr_assert_not_null(arena);
    memset(arena, 0x33, len);
    cr_assert_eq(copier_create(3, NULL, NULL, &c), 0);
    for (int round = 0; round < 20; round++) {
        struct shmbuf_set *s;
        struct shmbuf *b;
        struct copy_job *job;
        struct t_cutter t = {.len = len};
        pthread_t th;
        uint64_t id;
        bool into = round % 2 == 1;

        cr_assert_eq(shmbuf_set_create(&s), 0);
        b = t_guarded(s, len, &t.fd, &id);
        job = into ? t_job(shmbuf_range(b, 0, len), arena, len, 64)
                   : t_job(arena, shmbuf_range(b, 0, len), len, 64);
        for (size_t i = 0; i < job->nsegs; i++) {
            job->segs[i].guard = b;
        }
        cr_assert_eq(pthread_create(&th, NULL, t_cut, &t), 0);
        copier_submit(c, job);
        atomic_store(&t.go, 1);
        t_wait(job);
        pthread_join(th, NULL);
        if (!shmbuf_failed(b) && !into) {
            /* no fault: the copy ended before the cut, so every byte is the client's */
            for (size_t i = 0; i < len; i += 4096) {
                cr_assert_eq(arena[i], 0x5a, "round %d: a clean copy with a wrong byte", round);
            }
        }
        free(job->segs);
        free(job);
        shmbuf_unref(b);
        shmbuf_set_destroy(s);
        close(t.fd);
    }
    copier_destroy(c);
    free(arena);
}

/* A SIGBUS outside any guarded access still kills the process, handler installed or not. */
Test(shmbuf_guard, a_fault_elsewhere_stays_a_crash, .signal = SIGBUS)
{
    struct shmbuf_set *s;
    struct shmbuf *b;
    uint64_t id;
    int fd;
    int other = memfd_create("t-other", MFD_CLOEXEC);
    volatile uint8_t *p;

    cr_assert_eq(shmbuf_set_create(&s), 0);
    b = t_guarded(s, 65536, &fd, &id);         /* the handler is installed now */
    cr_assert_geq(other, 0);
    cr_assert_eq(ftruncate(other, 65536), 0);
    p = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, other, 0);
    cr_assert_neq((void *)p, MAP_FAILED);
    cr_assert_eq(ftruncate(other, 0), 0);
    shmbuf_access_begin(b);                   /* guarding b, not this mapping */
    p[100] = 1;
    shmbuf_access_end();
    cr_assert_fail("touching a cut mapping outside the guarded buffer did not fault");
    shmbuf_unref(b);
}

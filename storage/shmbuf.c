/*
 * shmbuf: registered shared-memory buffers behind shmbuf.h. A set is a
 * small array of (id, buffer); lookups are linear (a connection registers a
 * few big buffers once). The mapping is MAP_SHARED, read-write.
 *
 * The SIGBUS guard (shmbuf.h, "Safety"): one process-wide handler, installed
 * with the first guarded buffer and kept for the process's life, and one
 * thread-local pointer per thread (the guarded buffer it touches now). The
 * handler does only async-signal-safe things: read that pointer, one atomic
 * store, one mmap. Replacing the whole mapping (not just the faulting page)
 * means every later access to the buffer, from any thread, finds memory and
 * no second fault follows; the failed flag, stored before the mmap, is seen
 * by whoever reads the zeros once their copy is done. The thread-local is
 * in the executable's own TLS (initial-exec), so reading it in the handler
 * allocates nothing.
 */
#include "shmbuf.h"

#include "kverr.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct shmbuf {
    _Atomic uint32_t refs;
    uint8_t *base;
    uint64_t size;
    bool guarded;                   /* not sealed against shrinking */
    _Atomic bool failed;            /* lost pages under an access (set by the handler) */
};

struct shmbuf_entry {
    uint64_t id;
    struct shmbuf *buf;
};

struct shmbuf_set {
    struct shmbuf_entry *e;
    uint32_t n;
    uint32_t cap;
    uint64_t next_id;
};

int
shmbuf_set_create(struct shmbuf_set **out)
{
    *out = calloc(1, sizeof(**out));
    if (*out == NULL) {
        return -ENOMEM;
    }
    (*out)->next_id = 1;
    return 0;
}

void
shmbuf_set_destroy(struct shmbuf_set *s)
{
    if (s == NULL) {
        return;
    }
    for (uint32_t i = 0; i < s->n; i++) {
        shmbuf_unref(s->e[i].buf);
    }
    free(s->e);
    free(s);
}

/* ---- the SIGBUS guard ---- */

static _Thread_local struct shmbuf *shmbuf_cur;   /* this thread's guarded buffer, or NULL */
static struct sigaction shmbuf_old_sigbus;        /* the disposition before ours */
static pthread_once_t shmbuf_guard_once = PTHREAD_ONCE_INIT;
static int shmbuf_guard_rc;

/*
 * shmbuf_sigbus_pass: a SIGBUS that is not a guarded buffer's: to the
 * handler there was before ours, or, with none, the default action. A fault
 * raised by an instruction (si_code > 0) strikes again when we return, now
 * under the default action; one sent by kill is raised again.
 */
static void
shmbuf_sigbus_pass(int sig, siginfo_t *si, void *uc)
{
    if ((shmbuf_old_sigbus.sa_flags & SA_SIGINFO) && shmbuf_old_sigbus.sa_sigaction != NULL) {
        shmbuf_old_sigbus.sa_sigaction(sig, si, uc);
        return;
    }
    if (!(shmbuf_old_sigbus.sa_flags & SA_SIGINFO) && shmbuf_old_sigbus.sa_handler != SIG_DFL
        && shmbuf_old_sigbus.sa_handler != SIG_IGN) {
        shmbuf_old_sigbus.sa_handler(sig);
        return;
    }
    signal(SIGBUS, SIG_DFL);
    if (si->si_code <= 0) {
        raise(SIGBUS);
    }
}

static void
shmbuf_sigbus(int sig, siginfo_t *si, void *uc)
{
    struct shmbuf *b = shmbuf_cur;
    uint8_t *addr = si->si_addr;
    int saved = errno;

    if (b != NULL && si->si_code > 0 && addr >= b->base && addr < b->base + b->size) {
        atomic_store_explicit(&b->failed, true, memory_order_seq_cst);
        if (mmap(b->base, (size_t)b->size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS, -1, 0) != MAP_FAILED) {
            errno = saved;
            return;                 /* the access goes on over zero pages */
        }
    }
    shmbuf_sigbus_pass(sig, si, uc);
    errno = saved;
}

static void
shmbuf_guard_setup(void)
{
    struct sigaction sa = {0};

    sa.sa_sigaction = shmbuf_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    shmbuf_guard_rc = sigaction(SIGBUS, &sa, &shmbuf_old_sigbus) != 0 ? -errno : 0;
}

/* shmbuf_guard_install: the handler, once per process. 0 or -errno. */
static int
shmbuf_guard_install(void)
{
    pthread_once(&shmbuf_guard_once, shmbuf_guard_setup);
    return shmbuf_guard_rc;
}

bool
shmbuf_guarded(const struct shmbuf *b)
{
    return b->guarded;
}

void
shmbuf_access_begin(struct shmbuf *b)
{
    shmbuf_cur = b;
    atomic_signal_fence(memory_order_seq_cst);  /* set before the first access */
}

void
shmbuf_access_end(void)
{
    atomic_signal_fence(memory_order_seq_cst);  /* cleared after the last access */
    shmbuf_cur = NULL;
}

void
shmbuf_fail(struct shmbuf *b)
{
    atomic_store_explicit(&b->failed, true, memory_order_seq_cst);
}

bool
shmbuf_failed(const struct shmbuf *b)
{
    return atomic_load_explicit(&b->failed, memory_order_seq_cst);
}

/* ---- sets ---- */

int
shmbuf_register(struct shmbuf_set *s, int fd, uint64_t size, uint64_t *id, const char **why)
{
    struct shmbuf *b = NULL;
    struct stat st;
    bool guarded;
    int seals;
    int rc;

    *why = NULL;
    if (s->n >= SHMBUF_MAX_PER_SET) {
        *why = "too many buffers registered on this connection";
        rc = KV_QUOTA_EXCEEDED;
        goto fail;
    }
    /* Seals exist on shmem and hugetlbfs files only: memfds, /dev/shm, tmpfs. */
    seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        *why = "the descriptor is not shared memory (a memfd, or a file on tmpfs or hugetlbfs)";
        rc = KV_INVALID_ARGUMENT;
        goto fail;
    }
    if (size == 0 || size > SIZE_MAX || (uint64_t)st.st_size < size) {
        *why = "size is 0 or larger than the file";
        rc = KV_INVALID_ARGUMENT;
        goto fail;
    }
    guarded = !(seals & F_SEAL_SHRINK);
    if (guarded && (rc = shmbuf_guard_install()) != 0) {
        *why = "the SIGBUS handler for buffers not sealed against shrinking could not be set";
        goto fail;
    }
    if (s->n == s->cap) {
        uint32_t cap = s->cap != 0 ? s->cap * 2 : 4;
        struct shmbuf_entry *e = realloc(s->e, cap * sizeof(*e));

        if (e == NULL) {
            rc = -ENOMEM;
            goto fail;
        }
        s->e = e;
        s->cap = cap;
    }
    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        rc = -ENOMEM;
        goto fail;
    }
    b->base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (b->base == MAP_FAILED) {
        rc = -errno;
        *why = "mmap of the memfd failed";
        free(b);
        goto fail;
    }
    close(fd);
    b->size = size;
    b->guarded = guarded;
    atomic_init(&b->failed, false);
    atomic_init(&b->refs, 1);
    *id = s->next_id++;
    s->e[s->n].id = *id;
    s->e[s->n].buf = b;
    s->n++;
    return 0;

fail:
    close(fd);
    return rc;
}

int
shmbuf_unregister(struct shmbuf_set *s, uint64_t id)
{
    for (uint32_t i = 0; s != NULL && i < s->n; i++) {
        if (s->e[i].id == id) {
            shmbuf_unref(s->e[i].buf);
            s->e[i] = s->e[--s->n];
            return 0;
        }
    }
    return KV_NOT_FOUND;
}

uint32_t
shmbuf_set_drop_failed(struct shmbuf_set *s)
{
    uint32_t dropped = 0;

    for (uint32_t i = 0; s != NULL && i < s->n;) {
        if (!shmbuf_failed(s->e[i].buf)) {
            i++;
            continue;
        }
        log_warn("shm: buffer %" PRIu64 " (%" PRIu64 " bytes) shrank under a transfer: "
                 "its transfers failed, it is dropped", s->e[i].id, s->e[i].buf->size);
        shmbuf_unref(s->e[i].buf);
        s->e[i] = s->e[--s->n];
        dropped++;
    }
    return dropped;
}

struct shmbuf *
shmbuf_get(struct shmbuf_set *s, uint64_t id)
{
    for (uint32_t i = 0; s != NULL && i < s->n; i++) {
        if (s->e[i].id == id) {
            atomic_fetch_add_explicit(&s->e[i].buf->refs, 1, memory_order_relaxed);
            return s->e[i].buf;
        }
    }
    return NULL;
}

void
shmbuf_unref(struct shmbuf *b)
{
    if (b != NULL && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1) {
        munmap(b->base, (size_t)b->size);
        free(b);
    }
}

uint8_t *
shmbuf_range(const struct shmbuf *b, uint64_t off, uint64_t len)
{
    if (off > b->size || len > b->size - off) {
        return NULL;
    }
    return b->base + off;
}

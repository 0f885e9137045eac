/*
 * rebalance: the walk after a view change (rebalance.h). The thread compares the current
 * view with the last one a walk completed under (done); when the active members or their
 * weights differ, it walks the store one table part at a time (store_walk_shard copies the
 * keys out under that part's lock), and for each key whose owner set changed asks the new
 * owners what they lack and pushes it. Peer calls are synchronous here (a condition
 * variable waits for the pool's answer, bounded by peer_timeout); with an RDMA device here a
 * message's resident values go by repl_push (repl.h), which waits the same way, its objects
 * referenced until the new owner has READ them and answered.
 *
 * Must not: hold a store lock while calling a peer (keys are copied out first), push a key
 * it is not responsible for (see rebalance.h), or run faster than REBALANCE_RATE.
 */
#include "rebalance.h"

#include <errno.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#include "clock.h"
#include "crc32c.h"
#include "kverr.h"
#include "log.h"
#include "member.h"
#include "mp.h"
#include "peer.h"
#include "place.h"
#include "prio.h"
#include "repl.h"
#include "store.h"
#include "view.h"

#define RB_POLL_MS 100                  /* how often the view is looked at */
#define RB_MSG_BYTES (1ull << 20)       /* value bytes per peer_put: what goes at line rate */
#define RB_PACE_SLACK_US 16000          /* behind the pacing by more than this: it starts anew */

/* One key copied out of the store. */
struct rb_key {
    uint32_t tenant;
    uint32_t klen;
    uint64_t size;
    bool cache;
    uint8_t *key;
};

struct rb_keys {
    struct rb_key *k;
    size_t n, cap;
    bool failed;                        /* out of memory while copying: the part is redone */
};

/* One key to push: the key and the new owner (an index into the new view). */
struct rb_push {
    const struct rb_key *k;
    size_t node;
};

struct rebalance {
    struct rebalance_config cfg;
    pthread_t thread;
    bool started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stop;
    uint64_t due_us;                    /* pacing: when the bytes sent so far are due */
    _Atomic uint64_t walks, restarts, keys_moved, bytes_moved, keys_checked, running;
    _Atomic uint64_t settled;           /* revision of the view the thread last settled on */
    _Atomic bool drain_asked;           /* member.c's drain hook ran (registered as draining) */
    bool drained;                       /* a walk completed under a view where this node drains */
    bool left;                          /* member_leave was called */
};

void
rebalance_drain_hook(void *arg)
{
    struct rebalance *rb = arg;

    atomic_store_explicit(&rb->drain_asked, true, memory_order_release);
    pthread_mutex_lock(&rb->lock);
    pthread_cond_signal(&rb->cond);
    pthread_mutex_unlock(&rb->lock);
}

/* rb_maybe_leave: the hand-off is done and member.c asked for it: leave the pool, once. */
static void
rb_maybe_leave(struct rebalance *rb)
{
    if (rb->drained && !rb->left && atomic_load_explicit(&rb->drain_asked, memory_order_acquire)) {
        rb->left = true;
        log_info("cluster: drained: every key this node owned is with its new owners");
        member_leave();
    }
}

/* A synchronous peer call's answer. */
struct rb_wait {
    pthread_mutex_t m;
    pthread_cond_t c;
    bool done;
    int status;
    uint8_t *res;
    size_t len;
};

static void
rb_add(_Atomic uint64_t *c, uint64_t n)
{
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

static bool
rb_stopping(struct rebalance *rb)
{
    bool stop;

    pthread_mutex_lock(&rb->lock);
    stop = rb->stop;
    pthread_mutex_unlock(&rb->lock);
    return stop;
}

/* rb_sleep: wait ms or until stopped. Returns true when stopped. */
static bool
rb_sleep(struct rebalance *rb, uint64_t ms)
{
    struct timespec ts;
    bool stop;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&rb->lock);
    if (!rb->stop) {
        pthread_cond_timedwait(&rb->cond, &rb->lock, &ts);
    }
    stop = rb->stop;
    pthread_mutex_unlock(&rb->lock);
    return stop;
}

/* ---- peer calls ---- */

static void
rb_answer(void *arg, int status, const uint8_t *res, size_t len)
{
    struct rb_wait *w = arg;

    pthread_mutex_lock(&w->m);
    w->status = status;
    if (status == 0 && (w->res = malloc(len ? len : 1)) != NULL) {
        memcpy(w->res, res, len);
        w->len = len;
    } else if (status == 0) {
        w->status = -ENOMEM;
    }
    w->done = true;
    pthread_cond_signal(&w->c);
    pthread_mutex_unlock(&w->m);
}

/* rb_call: one peer call, waited for (the pool answers within peer_timeout). 0 and *res
 * (malloc'd, the caller frees), or the failure. params is transferred. */
static int
rb_call(struct rebalance *rb, const char *addr, const char *method, msgpack_sbuffer *sb,
        uint8_t **res, size_t *len)
{
    struct rb_wait w = {.done = false};
    int rc;

    if (sb->data == NULL) {
        return -ENOMEM;
    }
    pthread_mutex_init(&w.m, NULL);
    pthread_cond_init(&w.c, NULL);
    rc = peer_call(rb->cfg.pool, addr, method, (uint8_t *)sb->data, sb->size, rb_answer, &w);
    sb->data = NULL;                    /* the pool's now */
    if (rc == 0) {
        pthread_mutex_lock(&w.m);
        while (!w.done) {
            pthread_cond_wait(&w.c, &w.m);
        }
        pthread_mutex_unlock(&w.m);
        rc = w.status;
    }
    pthread_cond_destroy(&w.c);
    pthread_mutex_destroy(&w.m);
    *res = w.res;
    *len = w.len;
    return rc;
}

/* ---- the walk ---- */

static void
rb_collect(void *arg, const struct kv_key *key, uint64_t size, bool cache)
{
    struct rb_keys *ks = arg;
    struct rb_key *k;

    if (ks->failed) {
        return;
    }
    if (ks->n == ks->cap) {
        size_t cap = ks->cap ? ks->cap * 2 : 256;
        struct rb_key *nk = realloc(ks->k, cap * sizeof(*nk));
        if (nk == NULL) {
            ks->failed = true;
            return;
        }
        ks->k = nk;
        ks->cap = cap;
    }
    k = &ks->k[ks->n];
    k->key = malloc(key->len ? key->len : 1);
    if (k->key == NULL) {
        ks->failed = true;
        return;
    }
    memcpy(k->key, key->ptr, key->len);
    k->tenant = key->tenant;
    k->klen = key->len;
    k->size = size;
    k->cache = cache;
    ks->n++;
}

static void
rb_keys_clear(struct rb_keys *ks)
{
    for (size_t i = 0; i < ks->n; i++) {
        free(ks->k[i].key);
    }
    ks->n = 0;
    ks->failed = false;
}

static bool
rb_has_id(const struct cluster_view *v, const size_t *own, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(v->nodes[own[i]].id, id) == 0) {
            return true;
        }
    }
    return false;
}

/*
 * rb_value: key k's value. With obj non-NULL and the value resident and not empty: a
 * reference on its object in *obj (repl_push names its extents), *buf NULL. Otherwise its
 * bytes copied into a malloc'd buffer *buf (an SSD-only value is read here, without loading
 * it) and their CRC-32C in *crc. *len either way. 0, or -1 when gone.
 */
static int
rb_value(struct rebalance *rb, const struct rb_key *k, struct store_obj **obj, uint8_t **buf,
         uint64_t *len, uint32_t *crc)
{
    struct kv_key key = {.tenant = k->tenant, .len = k->klen, .ptr = k->key};
    struct store *st = rb->cfg.store;
    struct store_obj *o;
    struct iovec iov[STORE_MAX_EXTENTS];
    int rc = store_get_stored(st, &key, &o);

    *buf = NULL;
    if (obj != NULL) {
        *obj = NULL;
    }
    if (rc == 0) {
        /* on the SSD only: read it here (this thread may block) without loading it */
        uint64_t size = store_obj_size(o);
        uint64_t cap = (size + STORE_PAGE_SIZE - 1) / STORE_PAGE_SIZE * STORE_PAGE_SIZE;
        void *p = NULL;

        if (posix_memalign(&p, STORE_PAGE_SIZE, cap ? cap : STORE_PAGE_SIZE) != 0) {
            store_obj_unref(st, o);
            return -1;
        }
        iov[0].iov_base = p;
        iov[0].iov_len = cap ? cap : STORE_PAGE_SIZE;
        rc = store_read_stored(st, o, iov, 1);
        store_obj_unref(st, o);
        if (rc != 0) {
            free(p);
            return -1;
        }
        *buf = p;
        *len = size;
        *crc = crc32c_extend(0, p, size);
        return 0;
    }
    if (store_get(st, &key, &o) != 0) {
        return -1;                      /* removed or evicted meanwhile */
    }
    *len = store_obj_size(o);
    if (obj != NULL && *len > 0) {
        *obj = o;                       /* the caller's reference now */
        return 0;
    }
    *buf = malloc(*len ? *len : 1);
    if (*buf == NULL) {
        store_obj_unref(st, o);
        return -1;
    }
    store_obj_read(o, 0, *buf, *len);
    store_obj_unref(st, o);
    *crc = crc32c_extend(0, *buf, *len);
    return 0;
}

static uint64_t
rb_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/*
 * rb_rate: keep the walk under REBALANCE_RATE, paced message by message: the bytes just
 * sent are due bytes/REBALANCE_RATE after the previous ones, and the walk sleeps until then.
 * A message (at most RB_MSG_BYTES) goes at line rate, and nothing more: a walk does not send
 * a second's worth in one burst and then wait, which on a small host queued the event loops'
 * replies behind the burst. Behind schedule (a slow peer, a pause) by more than
 * RB_PACE_SLACK_US, the schedule starts anew from now, so no burst catches up either.
 * Returns true when stopped.
 */
static bool
rb_rate(struct rebalance *rb, uint64_t bytes)
{
    uint64_t now = rb_now_us();

    if (rb->due_us + RB_PACE_SLACK_US < now) {
        rb->due_us = now;
    }
    rb->due_us += bytes * 1000000u / REBALANCE_RATE;
    if (rb->due_us > now + 1000) {
        return rb_sleep(rb, (rb->due_us - now) / 1000);
    }
    return false;
}

/* rb_moved: key j of a push has its owner's answer code: counted when it was stored there. */
static void
rb_moved(struct rebalance *rb, uint64_t code, uint64_t len)
{
    if (code == 0) {
        rb_add(&rb->keys_moved, 1);
        rb_add(&rb->bytes_moved, len);
    }
}

/*
 * rb_put_copies: one peer_put to addr of the c values vals[0..c) (copies; freed here) of
 * keys ks[0..c) (one tenant), with their lengths and CRC-32Cs, waited for.
 */
static void
rb_put_copies(struct rebalance *rb, const char *addr, uint32_t tenant,
              const struct rb_key *const *ks, uint8_t **vals, const uint64_t *lens,
              const uint32_t *crcs, size_t c)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    struct mp_reader rd;
    uint8_t *res = NULL;
    size_t len = 0;
    uint32_t an, two;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint32(&pk, tenant);
    msgpack_pack_array(&pk, c);
    for (size_t j = 0; j < c; j++) {
        msgpack_pack_bin(&pk, ks[j]->klen);
        msgpack_pack_bin_body(&pk, ks[j]->key, ks[j]->klen);
    }
    msgpack_pack_array(&pk, c);
    for (size_t j = 0; j < c; j++) {
        msgpack_pack_bin(&pk, (size_t)lens[j]);
        msgpack_pack_bin_body(&pk, vals[j], (size_t)lens[j]);
        free(vals[j]);
    }
    msgpack_pack_array(&pk, c);
    for (size_t j = 0; j < c; j++) {
        msgpack_pack_uint32(&pk, crcs[j]);
    }
    if (rb_call(rb, addr, "peer_put", &sb, &res, &len) == 0) {
        mp_reader_init(&rd, res, len);
        if (mp_read_array(&rd, &an) == 0 && an == c) {
            for (size_t j = 0; j < c; j++) {
                uint64_t code, crc;
                if (mp_read_array(&rd, &two) == 0 && mp_read_uint(&rd, &code) == 0
                    && mp_read_uint(&rd, &crc) == 0) {
                    rb_moved(rb, code, lens[j]);
                }
            }
        }
    }
    free(res);
    msgpack_sbuffer_destroy(&sb);
}

/*
 * rb_push_objs: the c resident values objs[0..c) of keys ks[0..c) (one tenant; references,
 * given back here) to addr over RDMA (repl_push: the owner READs them, or a peer_put when it
 * cannot); with no device here, copied and sent as rb_put_copies.
 */
static void
rb_push_objs(struct rebalance *rb, const char *addr, uint32_t tenant,
             const struct rb_key *const *ks, struct store_obj **objs, size_t c)
{
    int codes[REBALANCE_BATCH];
    uint8_t *vals[REBALANCE_BATCH];
    uint64_t lens[REBALANCE_BATCH];
    uint32_t crcs[REBALANCE_BATCH];
    const struct rb_key *kc[REBALANCE_BATCH];
    size_t m = 0;

    if (repl_push(rb->cfg.repl, addr, tenant, objs, (uint32_t)c, codes) == 0) {
        for (size_t j = 0; j < c; j++) {
            rb_moved(rb, (uint64_t)codes[j], store_obj_size(objs[j]));
            store_obj_unref(rb->cfg.store, objs[j]);
        }
        return;
    }
    for (size_t j = 0; j < c; j++) {
        lens[m] = store_obj_size(objs[j]);
        vals[m] = malloc(lens[m]);
        if (vals[m] != NULL) {
            store_obj_read(objs[j], 0, vals[m], lens[m]);
            crcs[m] = store_obj_crc(objs[j]);
            kc[m++] = ks[j];
        }
        store_obj_unref(rb->cfg.store, objs[j]);
    }
    if (m > 0) {
        rb_put_copies(rb, addr, tenant, kc, vals, lens, crcs, m);
    }
}

/*
 * rb_push_batch: p[0..n) go to one node, one tenant: ask, then send what is missing, at most
 * RB_MSG_BYTES of values a message: the resident ones over RDMA where this node has a device
 * (rb_push_objs), the others (on the SSD only, or no device) copied into a peer_put.
 */
static void
rb_push_batch(struct rebalance *rb, const struct cluster_view *v, const struct rb_push *p,
              size_t n)
{
    const char *addr = v->nodes[p[0].node].addr;
    uint32_t tenant = p[0].k->tenant;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    struct mp_reader rd;
    uint8_t *res = NULL;
    size_t len = 0;
    bool missing[REBALANCE_BATCH];
    uint32_t m;
    size_t i = 0;

    rb_add(&rb->keys_checked, n);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint32(&pk, tenant);
    msgpack_pack_array(&pk, n);
    for (size_t j = 0; j < n; j++) {
        msgpack_pack_bin(&pk, p[j].k->klen);
        msgpack_pack_bin_body(&pk, p[j].k->key, p[j].k->klen);
    }
    if (rb_call(rb, addr, "peer_exists", &sb, &res, &len) != 0) {
        msgpack_sbuffer_destroy(&sb);
        free(res);
        return;                         /* unreachable: the next walk (or a read) catches up */
    }
    msgpack_sbuffer_destroy(&sb);
    mp_reader_init(&rd, res, len);
    if (mp_read_array(&rd, &m) != 0 || m != n) {
        free(res);
        return;
    }
    for (size_t j = 0; j < n; j++) {
        bool has = true;
        missing[j] = mp_read_bool(&rd, &has) == 0 && !has;
    }
    free(res);
    while (i < n) {
        uint8_t *vals[REBALANCE_BATCH];
        uint64_t lens[REBALANCE_BATCH], bytes = 0;
        uint32_t crcs[REBALANCE_BATCH];
        const struct rb_key *kv[REBALANCE_BATCH], *ko[REBALANCE_BATCH];
        struct store_obj *objs[REBALANCE_BATCH];
        size_t c = 0, co = 0;

        for (; i < n && bytes < RB_MSG_BYTES; i++) {
            struct store_obj *o;
            uint64_t vlen;

            if (!missing[i]
                || rb_value(rb, p[i].k, rb->cfg.repl != NULL ? &o : NULL, &vals[c], &vlen,
                            &crcs[c]) != 0) {
                continue;
            }
            if (vals[c] == NULL) {
                objs[co] = o;
                ko[co++] = p[i].k;
            } else {
                lens[c] = vlen;
                kv[c++] = p[i].k;
            }
            bytes += vlen;
        }
        if (c == 0 && co == 0) {
            break;
        }
        if (co > 0) {
            rb_push_objs(rb, addr, tenant, ko, objs, co);
        }
        if (c > 0) {
            rb_put_copies(rb, addr, tenant, kv, vals, lens, crcs, c);
        }
        if (rb_rate(rb, bytes)) {
            return;
        }
    }
}

static int
rb_push_cmp(const void *a, const void *b)
{
    const struct rb_push *x = a, *y = b;

    if (x->node != y->node) {
        return x->node < y->node ? -1 : 1;
    }
    return x->k->tenant < y->k->tenant ? -1 : x->k->tenant > y->k->tenant;
}

/*
 * rb_part: one table part of the walk from old to new: ownership marks, then the pushes
 * grouped by new owner and tenant.
 */
static void
rb_part(struct rebalance *rb, const struct cluster_view *old, const struct cluster_view *new,
        struct rb_keys *ks)
{
    const char *self = new->nodes[new->self].id;
    struct rb_push *push = NULL;
    size_t np = 0, cap = 0;

    for (size_t i = 0; i < ks->n; i++) {
        const struct rb_key *k = &ks->k[i];
        struct kv_key key = {.tenant = k->tenant, .len = k->klen, .ptr = k->key};
        size_t o_old[PLACE_R_MAX], o_new[PLACE_R_MAX];
        size_t nold = view_owners(old, k->key, k->klen, rb->cfg.replicas, o_old);
        size_t nnew = view_owners(new, k->key, k->klen, rb->cfg.replicas, o_new);
        bool self_old = rb_has_id(old, o_old, nold, self);
        bool self_new = rb_has_id(new, o_new, nnew, self);

        if (nnew > 0 && k->cache == self_new) {
            (void)store_set_cache(rb->cfg.store, &key, !self_new);
        }
        if (!self_old && !self_new) {
            continue;                   /* a cache copy: its owners push it */
        }
        for (size_t j = 0; j < nnew; j++) {
            const char *id = new->nodes[o_new[j]].id;
            if (strcmp(id, self) == 0 || rb_has_id(old, o_old, nold, id)) {
                continue;
            }
            if (np == cap) {
                size_t nc = cap ? cap * 2 : 64;
                struct rb_push *p2 = realloc(push, nc * sizeof(*p2));
                if (p2 == NULL) {
                    break;
                }
                push = p2;
                cap = nc;
            }
            push[np].k = k;
            push[np].node = o_new[j];
            np++;
        }
    }
    if (np > 1) {
        qsort(push, np, sizeof(*push), rb_push_cmp);
    }
    for (size_t i = 0; i < np && !rb_stopping(rb);) {
        size_t j = i;
        while (j < np && j - i < REBALANCE_BATCH && push[j].node == push[i].node
               && push[j].k->tenant == push[i].k->tenant) {
            j++;
        }
        rb_push_batch(rb, new, push + i, j - i);
        i = j;
    }
    free(push);
}

/* rb_walk: one walk from old to new. 0 completed, 1 a newer view came (restart), -1 stop. */
static int
rb_walk(struct rebalance *rb, const struct cluster_view *old, const struct cluster_view *new)
{
    struct rb_keys ks = {0};
    int rc = 0;

    atomic_store_explicit(&rb->running, 1, memory_order_relaxed);
    for (unsigned part = 0; part < STORE_WALK_PARTS; part++) {
        struct cluster_view *cur;

        if (rb_stopping(rb)) {
            rc = -1;
            break;
        }
        cur = view_acquire();
        if (cur == NULL || cur->revision != new->revision) {
            view_release(cur);
            rb_add(&rb->restarts, 1);
            rc = 1;
            break;
        }
        view_release(cur);
        (void)store_walk_shard(rb->cfg.store, part, rb_collect, &ks);
        if (ks.failed) {
            log_warn("cluster: rebalance out of memory copying keys; the walk restarts");
            rc = 1;
            break;
        }
        rb_part(rb, old, new, &ks);
        rb_keys_clear(&ks);
    }
    rb_keys_clear(&ks);
    free(ks.k);
    atomic_store_explicit(&rb->running, 0, memory_order_relaxed);
    return rc;
}

/* rb_same: the active members and their weights are the same (placement is unchanged). */
static bool
rb_same(const struct cluster_view *a, const struct cluster_view *b)
{
    size_t na = 0, nb = 0;

    for (size_t i = 0; i < a->n; i++) {
        int j;
        if (a->nodes[i].state != VIEW_ACTIVE) {
            continue;
        }
        na++;
        j = view_find(b, a->nodes[i].id);
        if (j < 0 || b->nodes[j].state != VIEW_ACTIVE || b->nodes[j].weight != a->nodes[i].weight) {
            return false;
        }
    }
    for (size_t i = 0; i < b->n; i++) {
        nb += b->nodes[i].state == VIEW_ACTIVE;
    }
    return na == nb;
}

/*
 * rb_lost: an active member of a is gone from b without draining: not in b at all (failed,
 * cut off), or back as joining (restarted, loading its SSD index: it will own its keys again).
 */
static bool
rb_lost(const struct cluster_view *a, const struct cluster_view *b)
{
    for (size_t i = 0; i < a->n; i++) {
        int j;
        if (a->nodes[i].state != VIEW_ACTIVE) {
            continue;
        }
        j = view_find(b, a->nodes[i].id);
        if (j < 0 || b->nodes[j].state == VIEW_JOINING) {
            return true;
        }
    }
    return false;
}

/*
 * rb_as_active: v with this node active again: what it owned before its drain began, the
 * old side of a drain's walk (whatever view this node saw first). NULL without memory.
 */
static struct cluster_view *
rb_as_active(const struct cluster_view *v)
{
    struct cluster_view *c;

    if (view_create(v->n, &c) != 0) {
        return NULL;
    }
    c->revision = v->revision;
    memcpy(c->nodes, v->nodes, v->n * sizeof(v->nodes[0]));
    c->nodes[v->self].state = VIEW_ACTIVE;
    view_seal(c, v->nodes[v->self].id);
    return c;
}

/* rb_settle: v becomes the view walks compare against (done's reference given back). */
static struct cluster_view *
rb_settle(struct rebalance *rb, struct cluster_view *done, struct cluster_view *v)
{
    view_release(done);
    atomic_store_explicit(&rb->settled, v->revision, memory_order_relaxed);
    return v;
}

/*
 * rb_background: this thread is a background job (rebalance.h): named, and at
 * REPL_WALK_NICE, as the pool it sends through, so an event loop that wakes with a request
 * takes the CPU from it at once.
 */
static void
rb_background(void)
{
    int rc;

    (void)pthread_setname_np(pthread_self(), "kvstash-rebal");
    if ((rc = prio_thread_nice(REPL_WALK_NICE)) != 0) {
        log_warn("cluster: the rebalance thread keeps the process's priority: %s",
                 strerror(-rc));
    }
}

static void *
rb_main(void *arg)
{
    struct rebalance *rb = arg;
    struct cluster_view *done = NULL;   /* the last view a walk completed under */
    uint64_t lost_since = 0;

    rb_background();
    while (!rb_sleep(rb, RB_POLL_MS)) {
        struct cluster_view *v = view_acquire();
        int rc;

        rb_maybe_leave(rb);
        if (v == NULL || v->self < 0) {
            view_release(v);            /* no pool yet, or this node is not in it */
            continue;
        }
        if (v->nodes[v->self].state == VIEW_DRAINING && !rb->drained) {
            /* a drain: hand off what this node owns, whatever it saw before */
            struct cluster_view *was = rb_as_active(v);
            rc = was != NULL ? rb_walk(rb, was, v) : 1;
            view_release(was);
            if (rc < 0) {
                view_release(v);
                break;
            }
            if (rc == 0) {
                rb_add(&rb->walks, 1);
                rb->drained = true;
                log_info("cluster: drain of view %llu walked: %llu keys pushed so far",
                         (unsigned long long)v->revision,
                         (unsigned long long)atomic_load_explicit(&rb->keys_moved,
                                                                  memory_order_relaxed));
                rb_maybe_leave(rb);
                done = rb_settle(rb, done, v);
            } else {
                view_release(v);
            }
            continue;
        }
        if (done == NULL || rb_same(done, v)) {
            done = rb_settle(rb, done, v);
            lost_since = 0;
            continue;
        }
        if (rb_lost(done, v)) {
            uint64_t now = clock_ms();
            if (lost_since == 0) {
                lost_since = now;
                log_info("cluster: a member left the view without draining; its keys are "
                         "re-replicated in %llu ms unless it comes back",
                         (unsigned long long)rb->cfg.delay_ms);
            }
            if (now - lost_since < rb->cfg.delay_ms) {
                view_release(v);
                continue;
            }
        }
        uint64_t moved = atomic_load_explicit(&rb->keys_moved, memory_order_relaxed);
        uint64_t t0 = clock_ms();
        rc = rb_walk(rb, done, v);
        if (rc != 0) {
            view_release(v);
            if (rc < 0) {
                break;
            }
            continue;
        }
        rb_add(&rb->walks, 1);
        log_info("cluster: rebalance to view %llu done in %llu ms: %llu keys pushed",
                 (unsigned long long)v->revision, (unsigned long long)(clock_ms() - t0),
                 (unsigned long long)(atomic_load_explicit(&rb->keys_moved, memory_order_relaxed)
                                      - moved));
        done = rb_settle(rb, done, v);
        lost_since = 0;
    }
    view_release(done);
    return NULL;
}

int
rebalance_start(const struct rebalance_config *cfg, struct rebalance **out)
{
    struct rebalance *rb = calloc(1, sizeof(*rb));
    int rc;

    if (rb == NULL) {
        return -ENOMEM;
    }
    rb->cfg = *cfg;
    pthread_mutex_init(&rb->lock, NULL);
    pthread_cond_init(&rb->cond, NULL);
    rc = pthread_create(&rb->thread, NULL, rb_main, rb);
    if (rc != 0) {
        rebalance_stop(rb);
        return -rc;
    }
    rb->started = true;
    *out = rb;
    return 0;
}

void
rebalance_stop(struct rebalance *rb)
{
    if (rb == NULL) {
        return;
    }
    if (rb->started) {
        member_set_drain_hook(NULL, NULL);
        pthread_mutex_lock(&rb->lock);
        rb->stop = true;
        pthread_cond_signal(&rb->cond);
        pthread_mutex_unlock(&rb->lock);
        pthread_join(rb->thread, NULL);
    }
    pthread_cond_destroy(&rb->cond);
    pthread_mutex_destroy(&rb->lock);
    free(rb);
}

void
rebalance_stats(struct rebalance *rb, struct rebalance_stats *out)
{
    out->walks = atomic_load_explicit(&rb->walks, memory_order_relaxed);
    out->restarts = atomic_load_explicit(&rb->restarts, memory_order_relaxed);
    out->keys_moved = atomic_load_explicit(&rb->keys_moved, memory_order_relaxed);
    out->bytes_moved = atomic_load_explicit(&rb->bytes_moved, memory_order_relaxed);
    out->keys_checked = atomic_load_explicit(&rb->keys_checked, memory_order_relaxed);
    out->running = atomic_load_explicit(&rb->running, memory_order_relaxed);
    out->settled = atomic_load_explicit(&rb->settled, memory_order_relaxed);
}

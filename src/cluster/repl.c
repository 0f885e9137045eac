/*
 * repl: the fetch table, the fetches and the replication of puts (repl.h).
 *
 * The fetch table maps (tenant, key) to one struct repl_fetch while a key is
 * being fetched and for REPL_FETCH_KEEP_MS after (so the request that waited
 * finds the outcome when it is dispatched again). A pending entry holds a
 * reference on the view its owners were computed in, and is named by the
 * one peer_get batch that asks for it now; the batch's answer (peer
 * thread) stores what came, moves what did not to the next owner, and
 * marks the rest done. Done entries are freed oldest first, from a FIFO.
 * A peer_get's values are received straight into reservations made for them
 * as they arrive (repl_sink: the reply's bodies cross user space once, and
 * are checksummed in pieces while they are in the CPU cache), then published
 * when the whole reply is in and each one's CRC-32C matches; a value that
 * could not be reserved is buffered and copied in as before.
 * Over RDMA the same batch is a peer_sizes and a peer_get_into instead
 * (repl_rdma.c).
 *
 * A client's puts wait in their event loop's thread-local batch (repl_out: an
 * object reference, its owner and ticket per key and owner) until the request
 * layer calls repl_flush at the end of the request; the flush sends one
 * peer_put per owner and tenant, its answer (peer thread) settles each key.
 * Over RDMA it is a peer_put_from instead (repl_rdma.c), which falls back to
 * a peer_put here (repl_send_tcp).
 *
 * Must not: block an event loop (everything it sends goes through the peer
 * pool's queue), take the table lock around store calls, or keep a view
 * past the entries that use it.
 */
#include "repl.h"

#include <errno.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "clock.h"
#include "crc32c.h"
#include "kverr.h"
#include "log.h"
#include "mp.h"
#include "peer.h"
#include "place.h"
#include "repl_int.h"
#include "store.h"
#include "view.h"

static void
repl_ticket_unref(struct repl_ticket *t)
{
    if (t != NULL && atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) == 1) {
        free(t);
    }
}

bool
repl_ticket_done(void *arg, void *ticket)
{
    struct repl_ticket *t = ticket;

    (void)arg;
    return atomic_load_explicit(&t->pending, memory_order_acquire) == 0;
}

void
repl_ticket_put(void *arg, void *ticket)
{
    (void)arg;
    repl_ticket_unref(ticket);
}

static uint64_t
repl_hash(uint32_t tenant, const uint8_t *key, uint32_t klen)
{
    return place_hash(key, klen) ^ ((uint64_t)tenant * 0x9e3779b97f4a7c15ull);
}

/* ---- the table (lock held) ---- */

static struct repl_fetch *
repl_find_locked(struct repl *r, uint64_t hash, uint32_t tenant, const uint8_t *key,
                 uint32_t klen)
{
    struct repl_fetch *e = r->table[hash & (REPL_BUCKETS - 1)];

    for (; e != NULL; e = e->hnext) {
        if (e->hash == hash && e->tenant == tenant && e->klen == klen
            && memcmp(e->key, key, klen) == 0) {
            return e;
        }
    }
    return NULL;
}

/* repl_sweep_locked: free done entries older than REPL_FETCH_KEEP_MS (the FIFO is in order). */
static void
repl_sweep_locked(struct repl *r, uint64_t now)
{
    while (r->dhead != NULL && now - r->dhead->done_ms >= REPL_FETCH_KEEP_MS) {
        struct repl_fetch *e = r->dhead;
        struct repl_fetch **pp = &r->table[e->hash & (REPL_BUCKETS - 1)];

        r->dhead = e->dnext;
        if (r->dhead == NULL) {
            r->dtail = NULL;
        }
        while (*pp != e) {
            pp = &(*pp)->hnext;
        }
        *pp = e->hnext;
        r->entries--;
        free(e);
    }
}

static void
repl_done_locked(struct repl *r, struct repl_fetch *e, uint64_t now)
{
    e->state = REPL_DONE;
    e->done_ms = now;
    e->dnext = NULL;
    if (r->dtail != NULL) {
        r->dtail->dnext = e;
    } else {
        r->dhead = e;
    }
    r->dtail = e;
}

/* repl_fail: no owner could be asked for failed[0..n): each is a remote miss, done. */
static void
repl_fail(struct repl *r, struct repl_fetch **failed, uint32_t n, uint64_t now)
{
    if (n == 0) {
        return;
    }
    pthread_mutex_lock(&r->lock);
    for (uint32_t i = 0; i < n; i++) {
        repl_add(&r->remote_misses, 1);
        view_release(failed[i]->view);
        failed[i]->view = NULL;
        repl_done_locked(r, failed[i], now);
    }
    pthread_mutex_unlock(&r->lock);
}

/* ---- fetching ---- */

static void repl_fetch_answer(void *arg, int status, struct mp_reader *res);

/*
 * repl_sink_take: the reply's value i ([3, i, 1] in the reply message: the bin of the pair
 * [crc, value]) is received straight into a reservation for entry i, so it crosses user
 * space once; declined (buffered, then copied as before) when no room can be reserved.
 */
static int
repl_sink_take(void *arg, const uint32_t *path, int depth, uint64_t len, struct iovec *iov,
               int max)
{
    struct repl_batch *b = arg;
    struct repl_fetch *e;
    struct store_obj *o;
    struct kv_key key;
    uint32_t i;

    if (depth != 3 || path[0] != 3 || path[2] != 1 || path[1] >= b->n || max < STORE_MAX_EXTENTS
        || b->slot[path[1]].obj != NULL) {
        return 0;
    }
    i = path[1];
    e = b->e[i];
    key.tenant = e->tenant;
    key.len = e->klen;
    key.ptr = e->key;
    if (store_reserve(b->r->cfg.store, &key, len, &o) != 0) {
        return 0;                   /* there already, being written, or no room: buffered */
    }
    b->slot[i].obj = o;
    b->slot[i].crc = 0;
    b->cur = i;
    return store_obj_iov(o, iov, max);
}

/* repl_sink_landed: bytes of the value landing, checksummed while they are in the cache. */
static void
repl_sink_landed(void *arg, const uint8_t *p, size_t n)
{
    struct repl_batch *b = arg;

    b->slot[b->cur].crc = crc32c_extend(b->slot[b->cur].crc, p, n);
}

static const struct peer_sink repl_sink = {
    .min = 64u * 1024u,
    .take = repl_sink_take,
    .landed = repl_sink_landed,
};

static void
repl_batch_free(struct repl_batch *b)
{
    for (uint32_t i = 0; b->slot != NULL && i < b->n; i++) {
        store_abort(b->r->cfg.store, b->slot[i].obj);   /* not published: its space returns */
    }
    free(b->slot);
    free(b);
}

/* repl_batch_addr: the owner batch b asks (all its entries ask the same one). */
const char *
repl_batch_addr(const struct repl_batch *b)
{
    const struct repl_fetch *e = b->e[0];

    return e->view->nodes[e->owners[e->next]].addr;
}

/* repl_pack_keys: [tenant, keys, (one more param follows when more)] of b into pk. */
void
repl_pack_keys(const struct repl_batch *b, msgpack_packer *pk, bool more)
{
    msgpack_pack_array(pk, more ? 3 : 2);
    msgpack_pack_uint32(pk, b->tenant);
    msgpack_pack_array(pk, b->n);
    for (uint32_t j = 0; j < b->n; j++) {
        msgpack_pack_bin(pk, b->e[j]->klen);
        msgpack_pack_bin_body(pk, b->e[j]->key, b->e[j]->klen);
    }
}

/*
 * repl_batch_go: send b: over RDMA (peer_sizes first) when this node has a device, else (or
 * tcp) as a peer_get whose values land in reservations through repl_sink. 0, or -1 when
 * nothing was sent (b is the caller's still).
 */
int
repl_batch_go(struct repl_batch *b, bool tcp)
{
    struct repl *r = b->r;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    bool rdma = !tcp && r->cfg.rdma_arena != NULL;

    for (uint32_t i = 0; i < b->n; i++) {
        store_abort(r->cfg.store, b->slot[i].obj);  /* a batch sent again: from scratch */
        memset(&b->slot[i], 0, sizeof(b->slot[i]));
    }
    b->cur = 0;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    repl_pack_keys(b, &pk, false);
    if (sb.data == NULL) {
        return -1;
    }
    if (rdma) {
        return peer_call_rdma(r->pool, repl_batch_addr(b), "peer_sizes", (uint8_t *)sb.data,
                              sb.size, false, repl_rdma_sizes, b) != 0 ? -1 : 0;
    }
    return peer_call_sink(r->pool, repl_batch_addr(b), "peer_get", (uint8_t *)sb.data, sb.size,
                          &repl_sink, repl_fetch_answer, b) != 0 ? -1 : 0;
}

/*
 * repl_send: one peer_get per owner node for the entries e[0..n) (each asks its
 * owners[next]). Entries whose batch cannot be sent are returned in *failed (their count).
 */
static void
repl_send(struct repl *r, uint32_t tenant, struct repl_fetch **e, uint32_t n,
          struct repl_fetch **failed, uint32_t *nfailed)
{
    bool *sent = calloc(n, sizeof(*sent));

    if (sent == NULL) {
        for (uint32_t i = 0; i < n; i++) {
            failed[(*nfailed)++] = e[i];
        }
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint16_t node = e[i]->owners[e[i]->next];
        const struct cluster_view *v = e[i]->view;
        struct repl_batch *b;
        uint32_t m = 0;

        if (sent[i]) {
            continue;
        }
        for (uint32_t j = i; j < n; j++) {
            m += !sent[j] && e[j]->view == v && e[j]->owners[e[j]->next] == node;
        }
        b = malloc(sizeof(*b) + m * sizeof(b->e[0]));
        if (b == NULL) {
            for (uint32_t j = i; j < n; j++) {
                if (!sent[j] && e[j]->view == v && e[j]->owners[e[j]->next] == node) {
                    sent[j] = true;
                    failed[(*nfailed)++] = e[j];
                }
            }
            continue;
        }
        b->r = r;
        b->tenant = tenant;
        b->n = 0;
        b->slot = calloc(m, sizeof(*b->slot));
        for (uint32_t j = i; j < n; j++) {
            if (!sent[j] && e[j]->view == v && e[j]->owners[e[j]->next] == node) {
                sent[j] = true;
                b->e[b->n++] = e[j];
            }
        }
        if (b->slot == NULL || repl_batch_go(b, false) != 0) {
            for (uint32_t j = 0; j < b->n; j++) {
                failed[(*nfailed)++] = b->e[j];
            }
            repl_batch_free(b);
        }
    }
    free(sent);
}

/*
 * repl_fetch_value: read one key's answer ([crc, bin] or nil) and keep the value when its
 * checksum holds. Returns 1 kept (or there already), 0 not there, -2 damaged (its checksum
 * failed: the rest of the reply is still read), -1 unreadable (the rest is not).
 */
static int
repl_fetch_value(struct repl *r, struct mp_reader *rd, const struct repl_fetch *e,
                 struct repl_slot *slot)
{
    const uint8_t *vp;
    const struct mp_hole *hole;
    uint64_t vlen;
    uint32_t n;
    uint64_t crc;
    struct kv_key key = {.tenant = e->tenant, .len = e->klen, .ptr = e->key};
    int rc;

    if (mp_peek(rd) == MP_NIL) {
        mp_read_nil(rd);
        return 0;
    }
    if (mp_read_array(rd, &n) != 0 || n != 2 || mp_read_uint(rd, &crc) != 0
        || mp_read_bin_ref(rd, &vp, &vlen, &hole) != 0 || (hole != NULL) != (slot->obj != NULL)
        || crc > UINT32_MAX) {
        return -1;
    }
    if (hole != NULL) {
        /* received into its reservation and checksummed as it landed: published if whole */
        struct store_obj *o = slot->obj;

        slot->obj = NULL;
        if (slot->crc != (uint32_t)crc || store_obj_size(o) != vlen) {
            store_abort(r->cfg.store, o);
            rc = KV_CHECKSUM_MISMATCH;
        } else {
            rc = store_commit_crc(r->cfg.store, o, (uint32_t)crc, !e->owned);
        }
    } else {
        /* buffered (no room was reserved): checked as it is copied into the arena */
        rc = store_put_crc(r->cfg.store, &key, vp, vlen, (uint32_t)crc, !e->owned);
    }
    if (rc == KV_CHECKSUM_MISMATCH) {
        repl_add(&r->checksum_mismatches, 1);
        log_warn("cluster: a value fetched from %s failed its CRC-32C; asking the next owner",
                 e->view->nodes[e->owners[e->next]].addr);
        return -2;
    }
    return rc == 0 || rc == KV_EXISTS || rc == KV_BUSY ? 1 : 0;
}

/*
 * repl_batch_settle: b's answer is in: got[i] 1 kept, 0 absent, < 0 failed (got NULL: all
 * failed). Entries not kept go to their next owner, the others are done; b is freed and the
 * waiting requests woken (peer thread).
 */
void
repl_batch_settle(struct repl_batch *b, const int8_t *got)
{
    struct repl *r = b->r;
    struct repl_fetch **retry = malloc((b->n ? b->n : 1) * sizeof(*retry));
    struct repl_fetch **failed = malloc((b->n ? b->n : 1) * sizeof(*failed));
    uint32_t nretry = 0, nfailed = 0;
    uint64_t now;

    for (uint32_t i = 0; i < b->n; i++) {
        store_abort(r->cfg.store, b->slot[i].obj);  /* a reply cut short: before any retry */
        b->slot[i].obj = NULL;
    }
    now = clock_ms();
    pthread_mutex_lock(&r->lock);
    for (uint32_t i = 0; i < b->n; i++) {
        struct repl_fetch *e = b->e[i];
        int g = got != NULL ? got[i] : -1;

        if (g != 1 && e->next + 1 < e->nowners && retry != NULL) {
            e->next++;
            retry[nretry++] = e;
            continue;
        }
        repl_add(g == 1 ? &r->remote_hits : &r->remote_misses, 1);
        view_release(e->view);
        e->view = NULL;
        repl_done_locked(r, e, now);
    }
    pthread_mutex_unlock(&r->lock);
    if (nretry > 0) {
        repl_send(r, b->tenant, retry, nretry, failed, &nfailed);
    }
    repl_fail(r, failed, nfailed, now);
    free(retry);
    free(failed);
    repl_batch_free(b);
    r->cfg.wake(r->cfg.wake_arg);   /* the requests that waited look again */
}

/* The answer to one peer_get (peer thread). */
static void
repl_fetch_answer(void *arg, int status, struct mp_reader *res)
{
    struct repl_batch *b = arg;
    uint32_t n = 0;
    int8_t *got = calloc(b->n ? b->n : 1, sizeof(*got));   /* 1 kept, 0 absent, < 0 failed */
    bool ok = status == 0 && res != NULL && mp_read_array(res, &n) == 0 && n == b->n;

    for (uint32_t i = 0; got != NULL && i < b->n; i++) {
        got[i] = ok ? (int8_t)repl_fetch_value(b->r, res, b->e[i], &b->slot[i]) : -1;
        if (got[i] == -1) {
            ok = false;             /* a broken reply: the rest is not read */
        }
    }
    repl_batch_settle(b, got);
    free(got);
}

int
repl_fetch(void *arg, const struct kv_key *keys, uint32_t n, bool final)
{
    struct repl *r = arg;
    struct cluster_view *v;
    struct repl_fetch **fresh, **failed;
    uint32_t nfresh = 0, nfailed = 0;
    bool wait = false;
    uint64_t now = clock_ms();

    if (final || n == 0 || (v = view_acquire()) == NULL) {
        return 0;                   /* a single node, or no view yet: a miss is a miss */
    }
    fresh = malloc(n * sizeof(*fresh));
    failed = malloc(n * sizeof(*failed));
    if (fresh == NULL || failed == NULL) {
        free(fresh);
        free(failed);
        view_release(v);
        return 0;
    }
    pthread_mutex_lock(&r->lock);
    repl_sweep_locked(r, now);
    for (uint32_t i = 0; i < n; i++) {
        const struct kv_key *k = &keys[i];
        uint64_t hash = repl_hash(k->tenant, k->ptr, k->len);
        struct repl_fetch *e = repl_find_locked(r, hash, k->tenant, k->ptr, k->len);
        size_t own[PLACE_R_MAX];
        size_t no;

        if (e != NULL) {
            wait |= e->state == REPL_PENDING;
            continue;
        }
        if (r->entries >= REPL_FETCH_MAX) {
            continue;               /* too many at once: a miss */
        }
        no = view_owners(v, k->ptr, k->len, r->cfg.replicas, own);
        e = calloc(1, sizeof(*e) + k->len);
        if (e == NULL) {
            continue;
        }
        for (size_t j = 0; j < no; j++) {
            if ((int)own[j] == v->self) {
                e->owned = true;
            } else {
                e->owners[e->nowners++] = (uint16_t)own[j];
            }
        }
        if (e->nowners == 0) {
            free(e);                /* no other node to ask */
            continue;
        }
        e->hash = hash;
        e->tenant = k->tenant;
        e->klen = k->len;
        memcpy(e->key, k->ptr, k->len);
        e->state = REPL_PENDING;
        e->view = v;
        __atomic_add_fetch(&v->refs, 1, __ATOMIC_RELAXED);  /* the entry's (as view_acquire) */
        e->hnext = r->table[hash & (REPL_BUCKETS - 1)];
        r->table[hash & (REPL_BUCKETS - 1)] = e;
        r->entries++;
        fresh[nfresh++] = e;
        wait = true;
    }
    pthread_mutex_unlock(&r->lock);
    if (nfresh > 0) {
        repl_send(r, keys[0].tenant, fresh, nfresh, failed, &nfailed);
    }
    repl_fail(r, failed, nfailed, now);
    free(fresh);
    free(failed);
    view_release(v);
    return wait ? -EAGAIN : 0;
}

/* ---- replication of puts ---- */

struct repl_put {
    struct repl *r;
    uint32_t n;
    struct repl_put_key k[];
};

/* repl_put_settle: key i of p has its answer (code, the owner's checksum of it). */
void
repl_put_settle(struct repl *r, const struct repl_put_key *k, uint64_t code, uint64_t crc)
{
    if (k->push != NULL) {
        /* a rebalance push: the walk counts what moved, not the replication counters */
        repl_push_settle(k->push, k->idx, code <= (uint64_t)INT32_MAX ? (int)code : KV_INTERNAL);
        return;
    }
    if (code == 0 || (code == KV_EXISTS && crc == k->crc)) {
        repl_add(&r->repl_acked, 1);
    } else if (code == KV_EXISTS) {
        repl_add(&r->repl_conflicts, 1);    /* another writer's bytes won there */
    } else {
        repl_add(&r->repl_failed, 1);
    }
    atomic_fetch_sub_explicit(&r->queue_bytes, k->bytes, memory_order_relaxed);
    atomic_fetch_sub_explicit(&r->queue_depth, 1, memory_order_relaxed);
    if (k->ticket != NULL) {
        atomic_fetch_sub_explicit(&k->ticket->pending, 1, memory_order_release);
        repl_ticket_unref(k->ticket);
    }
}

/* The answer to one peer_put (peer thread): per key [code, crc]; anything else fails all. */
static void
repl_put_answer(void *arg, int status, const uint8_t *res, size_t len)
{
    struct repl_put *p = arg;
    struct repl *r = p->r;
    struct mp_reader rd;
    uint32_t n = 0, i = 0;
    bool waited = false;
    static const uint8_t none[1];

    mp_reader_init(&rd, res != NULL ? res : none, res != NULL ? len : 0);
    if (status == 0 && mp_read_array(&rd, &n) == 0 && n == p->n) {
        for (; i < p->n; i++) {
            uint32_t two;
            uint64_t code, crc;

            if (mp_read_array(&rd, &two) != 0 || two != 2 || mp_read_uint(&rd, &code) != 0
                || mp_read_uint(&rd, &crc) != 0) {
                break;              /* a broken reply: this key and the rest failed */
            }
            waited |= p->k[i].ticket != NULL;
            repl_put_settle(r, &p->k[i], code, crc);
        }
    }
    for (; i < p->n; i++) {
        waited |= p->k[i].ticket != NULL;
        repl_put_settle(r, &p->k[i], KV_INTERNAL, 0);
    }
    if (waited) {
        r->cfg.wake(r->cfg.wake_arg);   /* write_ack all replies may go now */
    }
    free(p);
}

/* What a peer_put's value extents hold until they are written: a reference on each object. */
struct repl_hold {
    struct store *st;
    uint8_t *hdrs;                  /* the values' bin headers, 5 bytes each */
    uint32_t n;
    struct store_obj *o[];
};

static void
repl_hold_release(void *arg)
{
    struct repl_hold *h = arg;

    for (uint32_t i = 0; i < h->n; i++) {
        store_obj_unref(h->st, h->o[i]);
    }
    free(h->hdrs);
    free(h);
}

/* This thread's batch: the puts of the request being dispatched, grouped at the flush. */
struct repl_batch_out {
    struct repl *r;
    struct cluster_view *v;         /* a reference: what items' node indexes name */
    uint32_t n, cap;
    struct repl_item *items;
};

static __thread struct repl_batch_out repl_out;

#define REPL_OUT_MAX 4096u          /* puts queued on a thread before a flush is forced */
#define REPL_MSG_SLACK (64u * 1024u) /* room left in a peer_put for its keys and framing */

/* repl_out_fail: item it could not be sent: a failed replication, its ticket settled. */
static void
repl_out_fail(struct repl *r, struct repl_item *it)
{
    struct repl_put_key k = {.ticket = it->ticket, .bytes = store_obj_size(it->o), .crc = 0};

    if (it->push != NULL) {
        repl_push_settle(it->push, it->idx, KV_INTERNAL);     /* not sent: no memory */
        store_obj_unref(r->cfg.store, it->o);
        it->o = NULL;
        return;
    }
    repl_add(&r->repl_drops, 1);
    atomic_fetch_sub_explicit(&r->queue_bytes, k.bytes, memory_order_relaxed);
    atomic_fetch_sub_explicit(&r->queue_depth, 1, memory_order_relaxed);
    if (k.ticket != NULL) {
        atomic_fetch_sub_explicit(&k.ticket->pending, 1, memory_order_release);
        repl_ticket_unref(k.ticket);
    }
    store_obj_unref(r->cfg.store, it->o);
    it->o = NULL;
}

/*
 * repl_send_group: the m items g[0..m) (one tenant) to the owner at addr: as one
 * peer_put_from when this node has an RDMA device and tcp is false (repl_send_from: the owner
 * READs the values; its failure comes back here with tcp true), else as one peer_put:
 * [tenant, keys, values, crcs], the values' bytes written from the objects' extents by
 * reference. tcp true: a resend of items counted in repl_sent already.
 */
static void
repl_send_group(struct repl *r, const char *addr, uint32_t tenant, struct repl_item **g,
                uint32_t m, int niov, bool tcp)
{
    if (!tcp && r->cfg.rdma_arena != NULL) {
        if (repl_send_from(r, addr, tenant, g, m) == 0) {
            repl_add(&r->repl_sent, m);
            return;
        }
    }
    repl_send_tcp(r, addr, tenant, g, m, niov, !tcp);
}

/*
 * repl_pack_put_head: [tenant, keys of g[0..m), (two more params follow)] into pk: the head of
 * peer_put's and peer_put_from's params.
 */
void
repl_pack_put_head(msgpack_packer *pk, uint32_t tenant, struct repl_item **g, uint32_t m)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint32(pk, tenant);
    msgpack_pack_array(pk, m);
    for (uint32_t i = 0; i < m; i++) {
        struct kv_key key;

        store_obj_key(g[i]->o, &key);
        msgpack_pack_bin(pk, key.len);
        msgpack_pack_bin_body(pk, key.ptr, key.len);
    }
}

/* repl_send_tcp: repl_send_group's peer_put; count: add the items to repl_sent. */
void
repl_send_tcp(struct repl *r, const char *addr, uint32_t tenant, struct repl_item **g,
              uint32_t m, int niov, bool count)
{
    struct iovec *iov = malloc((size_t)niov * sizeof(*iov));
    struct repl_put *p = malloc(sizeof(*p) + m * sizeof(p->k[0]));
    struct repl_hold *h = malloc(sizeof(*h) + m * sizeof(h->o[0]));
    uint8_t *hdrs = malloc((size_t)m * 5);
    struct peer_extra x = {.iov = iov, .n = 0};
    msgpack_sbuffer sb, tb;
    msgpack_packer pk, tk;

    msgpack_sbuffer_init(&sb);
    msgpack_sbuffer_init(&tb);
    if (iov == NULL || p == NULL || h == NULL || hdrs == NULL) {
        goto fail;
    }
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    repl_pack_put_head(&pk, tenant, g, m);
    msgpack_pack_array(&pk, m);
    msgpack_packer_init(&tk, &tb, msgpack_sbuffer_write);
    msgpack_pack_array(&tk, m);
    for (uint32_t i = 0; i < m; i++) {
        uint64_t size = store_obj_size(g[i]->o);
        uint8_t *b = hdrs + (size_t)i * 5;

        b[0] = 0xc6;                /* bin 32: the header of a value sent by reference */
        b[1] = (uint8_t)(size >> 24);
        b[2] = (uint8_t)(size >> 16);
        b[3] = (uint8_t)(size >> 8);
        b[4] = (uint8_t)size;
        iov[x.n].iov_base = b;
        iov[x.n++].iov_len = 5;
        x.n += store_obj_iov(g[i]->o, iov + x.n, STORE_MAX_EXTENTS);
        msgpack_pack_uint32(&tk, g[i]->crc);
    }
    if (sb.data == NULL || tb.data == NULL) {
        goto fail;
    }
    h->st = r->cfg.store;
    h->hdrs = hdrs;
    h->n = m;
    p->r = r;
    p->n = m;
    for (uint32_t i = 0; i < m; i++) {
        h->o[i] = g[i]->o;          /* the item's reference, now the hold's */
        p->k[i].ticket = g[i]->ticket;
        p->k[i].push = g[i]->push;
        p->k[i].idx = g[i]->idx;
        p->k[i].bytes = store_obj_size(g[i]->o);
        p->k[i].crc = g[i]->crc;
        g[i]->o = NULL;
    }
    x.tail = (uint8_t *)tb.data;
    x.tail_len = tb.size;
    x.release = repl_hold_release;
    x.release_arg = h;
    repl_add(&r->repl_sent, count ? m : 0);
    if (peer_call_ext(r->pool, addr, "peer_put", (uint8_t *)sb.data, sb.size,
                      &x, repl_put_answer, p) != 0) {
        repl_put_answer(p, KV_UNAVAILABLE, NULL, 0);
    }
    free(iov);                      /* peer_call_ext copied the iovecs */
    return;
fail:
    msgpack_sbuffer_destroy(&sb);
    msgpack_sbuffer_destroy(&tb);
    free(iov);
    free(p);
    free(h);
    free(hdrs);
    for (uint32_t i = 0; i < m; i++) {
        repl_out_fail(r, g[i]);
    }
}

/*
 * repl_flush: send this thread's batch: one peer_put per owner and tenant with every key it
 * is sent (split only where a message would pass max_message_size or PEER_EXTRA_MAX
 * iovecs). Event-loop threads; the request layer calls it at the end of every request
 * that stored something.
 */
void
repl_flush(void *arg)
{
    struct repl_batch_out *b = &repl_out;
    struct repl_item **g;
    uint64_t limit;

    (void)arg;
    if (b->n == 0) {
        return;
    }
    limit = b->r->cfg.max_message_size > 2 * REPL_MSG_SLACK
            ? b->r->cfg.max_message_size - REPL_MSG_SLACK : REPL_MSG_SLACK;
    g = malloc(b->n * sizeof(*g));
    for (uint32_t i = 0; i < b->n; i++) {
        struct repl_item *first = &b->items[i];
        struct kv_key k0;
        uint64_t bytes = 0;
        uint32_t m = 0;
        int niov = 0;

        if (first->sent) {
            continue;
        }
        if (g == NULL) {
            first->sent = true;
            repl_out_fail(b->r, first);
            continue;
        }
        store_obj_key(first->o, &k0);
        for (uint32_t j = i; j < b->n; j++) {
            struct repl_item *it = &b->items[j];
            struct iovec ext[STORE_MAX_EXTENTS];
            struct kv_key kj;
            uint64_t size;
            int ne;

            if (it->sent || it->node != first->node) {
                continue;
            }
            store_obj_key(it->o, &kj);
            size = store_obj_size(it->o) + kj.len + 16;
            ne = 1 + store_obj_iov(it->o, ext, STORE_MAX_EXTENTS);    /* header, extents */
            if (kj.tenant != k0.tenant
                || (m > 0 && (bytes + size > limit || niov + ne > PEER_EXTRA_MAX))) {
                continue;           /* the next message takes it */
            }
            it->sent = true;
            g[m++] = it;
            bytes += size;
            niov += ne;
        }
        repl_send_group(b->r, b->v->nodes[first->node].addr, k0.tenant, g, m, niov, false);
    }
    free(g);
    free(b->items);                 /* nothing of a thread's outlives its request (or it) */
    b->items = NULL;
    b->cap = 0;
    b->n = 0;
    view_release(b->v);
    b->v = NULL;
    b->r = NULL;
}

/*
 * repl_queue: put o (value crc) in this thread's batch for node of v, within the queue's
 * bound (what does not fit is dropped and counted).
 */
static void
repl_queue(struct repl *r, struct cluster_view *v, uint16_t node, struct store_obj *o,
           uint32_t crc, struct repl_ticket *t)
{
    struct repl_batch_out *b = &repl_out;
    uint64_t size = store_obj_size(o);
    struct repl_item *it;

    if (b->n > 0 && (b->r != r || b->v != v || b->n >= REPL_OUT_MAX)) {
        repl_flush(r);              /* another view (or pool): what was queued goes first */
    }
    if (b->n == b->cap) {
        uint32_t cap = b->cap ? b->cap * 2 : 64;
        struct repl_item *items = realloc(b->items, cap * sizeof(*items));

        if (items == NULL) {
            repl_add(&r->repl_drops, 1);
            return;
        }
        b->items = items;
        b->cap = cap;
    }
    if (atomic_fetch_add_explicit(&r->queue_bytes, size, memory_order_relaxed) + size
        > r->cfg.queue_max) {
        atomic_fetch_sub_explicit(&r->queue_bytes, size, memory_order_relaxed);
        repl_add(&r->repl_drops, 1);
        return;
    }
    if (b->n == 0) {
        b->r = r;
        b->v = v;
        __atomic_add_fetch(&v->refs, 1, __ATOMIC_RELAXED);  /* the batch's (as view_acquire) */
    }
    it = &b->items[b->n++];
    store_obj_ref(o);
    it->o = o;
    it->crc = crc;
    it->node = node;
    it->sent = false;
    it->ticket = t;
    it->push = NULL;
    it->idx = 0;
    if (t != NULL) {
        atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&t->pending, 1, memory_order_relaxed);
    }
    repl_add(&r->queue_depth, 1);
}

void *
repl_stored(void *arg, const struct kv_key *key, struct store_obj *o)
{
    struct repl *r = arg;
    struct cluster_view *v = view_acquire();
    size_t own[PLACE_R_MAX];
    struct repl_ticket *t = NULL;
    bool owned = false;
    size_t no;

    if (v == NULL) {
        return NULL;
    }
    no = view_owners(v, key->ptr, key->len, r->cfg.replicas, own);
    for (size_t j = 0; j < no; j++) {
        owned |= (int)own[j] == v->self;
    }
    if (!owned && no > 0) {
        (void)store_set_cache(r->cfg.store, key, true);
    }
    if (r->cfg.wait_acks && no > (owned ? 1u : 0u) && (t = calloc(1, sizeof(*t))) != NULL) {
        atomic_init(&t->refs, 1);   /* the request layer's */
        atomic_init(&t->pending, 0);
    }
    for (size_t j = 0; j < no; j++) {
        if ((int)own[j] != v->self) {
            /* once: kept on the object, so later peer_gets and owners are free */
            repl_queue(r, v, (uint16_t)own[j], o, store_obj_crc(o), t);
        }
    }
    view_release(v);
    return t;
}

/* ---- life ---- */

int
repl_create(const struct repl_config *cfg, struct repl **out)
{
    struct peer_config pc = {
        .timeout_ms = cfg->peer_timeout_ms,
        .max_message_size = cfg->max_message_size,
        .token = cfg->token,
        .tls_cert = cfg->tls_cert,
        .tls_key = cfg->tls_key,
        .tls_ca = cfg->tls_ca,
        .rdma_dev = cfg->rdma_arena != NULL ? cfg->rdma_dev : NULL,
    };
    struct repl *r = calloc(1, sizeof(*r));
    int rc;

    if (r == NULL) {
        return -ENOMEM;
    }
    r->cfg = *cfg;
    r->cfg.token = NULL;
    r->cfg.tls_cert = r->cfg.tls_key = r->cfg.tls_ca = NULL;
    pthread_mutex_init(&r->lock, NULL);
    rc = peer_pool_create(&pc, &r->pool);
    if (rc == 0 && pc.rdma_dev == NULL) {
        pc.nice = REPL_WALK_NICE;
        pc.name = "kvstash-rbpeer";
        rc = peer_pool_create(&pc, &r->walk_pool);
    }
    if (rc != 0) {
        peer_pool_destroy(r->pool);
        pthread_mutex_destroy(&r->lock);
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

void
repl_destroy(struct repl *r)
{
    if (r == NULL) {
        return;
    }
    peer_pool_destroy(r->walk_pool);
    peer_pool_destroy(r->pool);     /* every call is answered before it returns */
    for (unsigned i = 0; i < REPL_BUCKETS; i++) {
        while (r->table[i] != NULL) {
            struct repl_fetch *e = r->table[i];

            r->table[i] = e->hnext;
            view_release(e->view);
            free(e);
        }
    }
    pthread_mutex_destroy(&r->lock);
    free(r);
}

struct peer_pool *
repl_pool(struct repl *r)
{
    return r->pool;
}

struct peer_pool *
repl_walk_pool(struct repl *r)
{
    return r->walk_pool != NULL ? r->walk_pool : r->pool;
}

void
repl_stats(struct repl *r, struct repl_stats *out)
{
    struct peer_stats ps;

    memset(out, 0, sizeof(*out));
    out->remote_hits = atomic_load_explicit(&r->remote_hits, memory_order_relaxed);
    out->remote_misses = atomic_load_explicit(&r->remote_misses, memory_order_relaxed);
    out->checksum_mismatches = atomic_load_explicit(&r->checksum_mismatches,
                                                    memory_order_relaxed);
    out->repl_sent = atomic_load_explicit(&r->repl_sent, memory_order_relaxed);
    out->repl_acked = atomic_load_explicit(&r->repl_acked, memory_order_relaxed);
    out->repl_failed = atomic_load_explicit(&r->repl_failed, memory_order_relaxed);
    out->repl_conflicts = atomic_load_explicit(&r->repl_conflicts, memory_order_relaxed);
    out->repl_drops = atomic_load_explicit(&r->repl_drops, memory_order_relaxed);
    out->repl_queue_bytes = atomic_load_explicit(&r->queue_bytes, memory_order_relaxed);
    out->repl_queue_depth = atomic_load_explicit(&r->queue_depth, memory_order_relaxed);
    for (int i = 0; i < 2; i++) {
        struct peer_pool *p = i == 0 ? r->pool : r->walk_pool;

        if (p == NULL) {
            continue;
        }
        peer_stats(p, &ps);
        out->peer_requests += ps.requests;
        out->peer_errors += ps.errors;
        out->peer_timeouts += ps.timeouts;
        out->peer_bytes_out += ps.bytes_out;
        out->peer_bytes_in += ps.bytes_in;
        out->peer_auth_failures += ps.auth_failures;
        out->peer_rdma_connects += ps.rdma_connects;
        out->peer_rdma_fallbacks += ps.rdma_fallbacks;
    }
    out->peer_rdma_fetch_bytes = atomic_load_explicit(&r->rdma_fetch_bytes, memory_order_relaxed);
    out->peer_rdma_put_bytes = atomic_load_explicit(&r->rdma_put_bytes, memory_order_relaxed);
}

/*
 * repl_rdma: the repl module's paths over RDMA (repl.h), where this node has a device and
 * its connection to the owner a queue pair (peer.h, peer_rdma.h).
 *
 * Fetches: a batch of repl.c's asks the owner for the values' sizes (peer_sizes), reserves
 * them here, and names the reservations as (addr, length, rkey) of the registered arena in a
 * peer_get_into, whose answer comes once the owner RDMA-WROTE every value into them: each
 * one's CRC-32C is then computed over the reservation and checked. A connection without a
 * queue pair, or an owner that says its writes failed, sends the same batch as a peer_get
 * over TCP instead (peer_rdma_fail: that connection stays on TCP), so RDMA never fails a get.
 *
 * Puts: a group of replica puts is a peer_put_from, naming each value's extents in the
 * registered arena for the owner to RDMA-READ, the objects' references held until its
 * answer; any failure sends the same keys as a peer_put (repl_send_tcp).
 *
 * Must not: let a reservation or an object named to the owner go (abort, unref) before the
 * call's answer: until then the owner may still write into it or read from it (a call that
 * ends without an answer destroyed the queue pair first, peer_call_rdma).
 */
#include "repl_int.h"

#include <errno.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "crc32c.h"
#include "kverr.h"
#include "log.h"
#include "mp.h"
#include "peer.h"
#include "rdma_port.h"
#include "store.h"

/* ---- fetching ---- */

#define REPL_RDMA_SEGS 64           /* segments of one reservation (its extents, split at MRs) */

/* repl_rdma_tcp: RDMA to b's owner failed (why): that connection goes to TCP, b with it. */
static void
repl_rdma_tcp(struct repl_batch *b, const char *why)
{
    if (why != NULL) {
        peer_rdma_fail(b->r->pool, repl_batch_addr(b), why);
    }
    if (repl_batch_go(b, true) != 0) {
        repl_batch_settle(b, NULL);
    }
}

/*
 * repl_rdma_pack_segs: the (addr, length, rkey) segments of reservation o in the arena, as
 * [[addr, length, rkey], ...] into pk. 0, or -1 (not arena memory, or too many segments).
 */
static int
repl_rdma_pack_segs(struct repl *r, struct store_obj *o, msgpack_packer *pk)
{
    struct iovec iov[STORE_MAX_EXTENTS];
    struct rdma_seg segs[REPL_RDMA_SEGS];
    int n = store_obj_iov(o, iov, STORE_MAX_EXTENTS);
    int total = 0;

    for (int i = 0; i < n; i++) {
        int k;

        if (rdma_region_segs(r->cfg.rdma_arena, iov[i].iov_base, iov[i].iov_len, segs + total,
                             REPL_RDMA_SEGS - total, &k) != 0) {
            return -1;
        }
        total += k;
    }
    msgpack_pack_array(pk, (size_t)total);
    for (int i = 0; i < total; i++) {
        msgpack_pack_array(pk, 3);
        msgpack_pack_uint64(pk, segs[i].addr);
        msgpack_pack_uint64(pk, segs[i].len);
        msgpack_pack_uint32(pk, segs[i].rkey);
    }
    return 0;
}

static void repl_rdma_into(void *arg, int status, const uint8_t *res, size_t len);

/*
 * The answer to a batch's peer_sizes (peer thread): reserve each value here and ask the
 * owner to write them into the reservations (peer_get_into).
 */
void
repl_rdma_sizes(void *arg, int status, const uint8_t *res, size_t len)
{
    struct repl_batch *b = arg;
    struct repl *r = b->r;
    struct mp_reader rd;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    uint32_t n;

    if (status == KV_UNSUPPORTED) {
        repl_rdma_tcp(b, NULL);     /* no queue pair on that connection: over TCP */
        return;
    }
    mp_reader_init(&rd, res, len);
    if (status != 0 || mp_read_array(&rd, &n) != 0 || n != b->n) {
        repl_batch_settle(b, NULL);     /* as a failed peer_get: the next owners */
        return;
    }
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    repl_pack_keys(b, &pk, true);
    msgpack_pack_array(&pk, b->n);
    for (uint32_t i = 0; i < b->n; i++) {
        const struct repl_fetch *e = b->e[i];
        struct kv_key key = {.tenant = e->tenant, .len = e->klen, .ptr = e->key};
        uint64_t size;
        int rc;

        if (mp_peek(&rd) == MP_NIL) {
            mp_read_nil(&rd);
            msgpack_pack_array(&pk, 0);     /* not there: nothing to write */
            continue;
        }
        if (mp_read_uint(&rd, &size) != 0) {
            msgpack_sbuffer_destroy(&sb);
            repl_batch_settle(b, NULL);
            return;
        }
        rc = store_reserve(r->cfg.store, &key, size, &b->slot[i].obj);
        if (rc != 0) {
            b->slot[i].obj = NULL;
            b->slot[i].got = rc == KV_EXISTS || rc == KV_BUSY;  /* there, or being written */
            msgpack_pack_array(&pk, 0);
            continue;
        }
        if (repl_rdma_pack_segs(r, b->slot[i].obj, &pk) != 0) {
            msgpack_sbuffer_destroy(&sb);
            repl_rdma_tcp(b, "a reservation is not in the registered arena");
            return;
        }
    }
    if (sb.data == NULL
        || peer_call_rdma(r->pool, repl_batch_addr(b), "peer_get_into", (uint8_t *)sb.data,
                          sb.size, true, repl_rdma_into, b) != 0) {
        if (sb.data == NULL) {
            msgpack_sbuffer_destroy(&sb);
        }
        repl_batch_settle(b, NULL);
    }
}

/* repl_rdma_crc: the CRC-32C of reservation o's bytes (written by the owner). */
static uint32_t
repl_rdma_crc(struct store_obj *o)
{
    struct iovec iov[STORE_MAX_EXTENTS];
    int n = store_obj_iov(o, iov, STORE_MAX_EXTENTS);
    uint64_t left = store_obj_size(o);
    uint32_t crc = 0;

    for (int i = 0; i < n && left > 0; i++) {
        size_t k = iov[i].iov_len < left ? iov[i].iov_len : (size_t)left;

        crc = crc32c_extend(crc, iov[i].iov_base, k);
        left -= k;
    }
    return crc;
}

/*
 * The answer to a batch's peer_get_into (peer thread): per key nil, [crc, length] (written
 * into its reservation) or a code (the owner's writes failed). Each written value is checked
 * against its CRC-32C here and published; a code sends the batch over TCP.
 */
static void
repl_rdma_into(void *arg, int status, const uint8_t *res, size_t len)
{
    struct repl_batch *b = arg;
    struct repl *r = b->r;
    struct mp_reader rd, scan;
    int8_t *got;
    uint32_t n;

    if (status == KV_UNSUPPORTED) {
        /* no connected queue pair (not yet, after a new dial; or refused, counted then) */
        repl_rdma_tcp(b, NULL);
        return;
    }
    mp_reader_init(&rd, res, len);
    if (status != 0 || mp_read_array(&rd, &n) != 0 || n != b->n) {
        repl_batch_settle(b, NULL);     /* timeout, lost: peer.c destroyed the queue pair */
        return;
    }
    scan = rd;
    for (uint32_t i = 0; i < n; i++) {
        enum mp_type t = mp_peek(&scan);

        if (t != MP_NIL && t != MP_ARRAY) {
            repl_rdma_tcp(b, "its RDMA writes failed");     /* a code: the queue pair's error */
            return;
        }
        (void)mp_skip(&scan);
    }
    got = calloc(b->n ? b->n : 1, sizeof(*got));
    for (uint32_t i = 0; got != NULL && i < b->n; i++) {
        const struct repl_fetch *e = b->e[i];
        struct store_obj *o = b->slot[i].obj;
        uint32_t two;
        uint64_t crc, vlen;
        int rc;

        if (mp_peek(&rd) == MP_NIL) {
            mp_read_nil(&rd);
            got[i] = b->slot[i].got;
            continue;
        }
        if (mp_read_array(&rd, &two) != 0 || two != 2 || mp_read_uint(&rd, &crc) != 0
            || mp_read_uint(&rd, &vlen) != 0 || o == NULL) {
            free(got);
            repl_batch_settle(b, NULL);     /* a broken answer */
            return;
        }
        b->slot[i].obj = NULL;
        if (crc > UINT32_MAX || vlen != store_obj_size(o) || repl_rdma_crc(o) != (uint32_t)crc) {
            store_abort(r->cfg.store, o);
            repl_add(&r->checksum_mismatches, 1);
            log_warn("cluster: a value fetched over RDMA from %s failed its CRC-32C; asking "
                     "the next owner", repl_batch_addr(b));
            got[i] = -2;
            continue;
        }
        rc = store_commit_crc(r->cfg.store, o, (uint32_t)crc, !e->owned);
        got[i] = rc == 0 || rc == KV_EXISTS || rc == KV_BUSY;
        repl_add(&r->rdma_fetch_bytes, rc == 0 ? vlen : 0);
    }
    repl_batch_settle(b, got);
    free(got);
}

/* ---- replica puts ---- */

/*
 * One peer_put_from in flight: its items (each holding its object's reference until the
 * owner's answer: the owner READs the object's extents) and the owner's address, to send
 * the batch over TCP should RDMA fail.
 */
struct repl_from {
    struct repl *r;
    char *addr;
    uint32_t tenant;
    uint32_t n;
    struct repl_item it[];
};

/* repl_items_niov: the iovecs a peer_put of g[0..m) takes (a header and extents each). */
static int
repl_items_niov(struct repl_item **g, uint32_t m)
{
    struct iovec ext[STORE_MAX_EXTENTS];
    int niov = 0;

    for (uint32_t i = 0; i < m; i++) {
        niov += 1 + store_obj_iov(g[i]->o, ext, STORE_MAX_EXTENTS);
    }
    return niov;
}

/*
 * repl_from_tcp: the items g[0..m) (one tenant) go to the owner at addr as a peer_put (their
 * RDMA failed, or was not tried on that connection), split where one message would pass
 * PEER_EXTRA_MAX iovecs.
 */
static void
repl_from_tcp(struct repl *r, const char *addr, uint32_t tenant, struct repl_item **g,
              uint32_t m)
{
    uint32_t i = 0;

    while (i < m) {
        struct iovec ext[STORE_MAX_EXTENTS];
        uint32_t k = 0;
        int niov = 0;

        while (i + k < m) {
            int ne = 1 + store_obj_iov(g[i + k]->o, ext, STORE_MAX_EXTENTS);

            if (k > 0 && niov + ne > PEER_EXTRA_MAX) {
                break;
            }
            niov += ne;
            k++;
        }
        repl_send_tcp(r, addr, tenant, g + i, k, repl_items_niov(g + i, k), false);
        i += k;
    }
}

/*
 * The answer to a peer_put_from (peer thread): per key [code, crc] (settled as peer_put's),
 * or a bare code (the owner's READs of it failed). Those keys, or all of them when the call
 * failed (not sent: no connected queue pair; timeout, connection lost: peer.c destroyed the
 * queue pair already, so no READ of these objects lands after their references go), are
 * sent again as a peer_put.
 */
static void
repl_from_answer(void *arg, int status, const uint8_t *res, size_t len)
{
    struct repl_from *f = arg;
    struct repl *r = f->r;
    struct repl_item **again = malloc((f->n ? f->n : 1) * sizeof(*again));
    struct mp_reader rd;
    uint32_t n = 0, nagain = 0, i = 0;
    bool waited = false, broken = false;
    static const uint8_t none[1];

    mp_reader_init(&rd, res != NULL ? res : none, res != NULL ? len : 0);
    if (status == 0 && (mp_read_array(&rd, &n) != 0 || n != f->n)) {
        broken = true;
    }
    if (status != 0 && status != KV_UNSUPPORTED) {
        peer_rdma_fail(r->pool, f->addr, "a peer_put_from was not answered");
    }
    for (; i < f->n; i++) {
        struct repl_item *it = &f->it[i];
        struct repl_put_key k = {.ticket = it->ticket, .push = it->push,
                                 .bytes = store_obj_size(it->o), .crc = it->crc, .idx = it->idx};
        uint32_t two;
        uint64_t code = KV_INTERNAL, crc = 0;

        if (status == 0 && !broken && mp_peek(&rd) == MP_ARRAY) {
            if (mp_read_array(&rd, &two) != 0 || two != 2 || mp_read_uint(&rd, &code) != 0
                || mp_read_uint(&rd, &crc) != 0) {
                broken = true;      /* a broken reply: this key and the rest failed */
                code = KV_INTERNAL;
            }
        } else if (again != NULL && (status != 0 || (!broken && mp_skip(&rd) == 0))) {
            if (status == 0) {
                peer_rdma_fail(r->pool, f->addr, "its RDMA reads of a put failed");
            }
            again[nagain++] = it;   /* keeps its reference and ticket: settled by the peer_put */
            continue;
        }
        repl_add(&r->rdma_put_bytes, code == 0 ? k.bytes : 0);
        waited |= k.ticket != NULL;
        repl_put_settle(r, &k, code, crc);
        store_obj_unref(r->cfg.store, it->o);
        it->o = NULL;
    }
    if (nagain > 0) {
        repl_from_tcp(r, f->addr, f->tenant, again, nagain);
    }
    if (waited) {
        r->cfg.wake(r->cfg.wake_arg);   /* write_ack all replies may go now */
    }
    free(again);
    free(f->addr);
    free(f);
}

/*
 * repl_send_from: one peer_put_from to the owner at addr of the m items g[0..m) (one
 * tenant): [tenant, keys, extents, crcs], each value named by the (addr, length, rkey) of its
 * extents in the registered arena, for the owner to READ. The items' references become the
 * call's (g[i]->o NULL) until the answer. 0, or -1 with nothing sent (an extent outside the
 * registered arena, no memory): the caller sends them over TCP.
 */
int
repl_send_from(struct repl *r, const char *addr, uint32_t tenant, struct repl_item **g,
               uint32_t m)
{
    struct repl_from *f = malloc(sizeof(*f) + m * sizeof(f->it[0]));
    msgpack_sbuffer sb;
    msgpack_packer pk;
    int rc = f == NULL ? -1 : 0;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    repl_pack_put_head(&pk, tenant, g, m);
    msgpack_pack_array(&pk, m);
    for (uint32_t i = 0; rc == 0 && i < m; i++) {
        rc = repl_rdma_pack_segs(r, g[i]->o, &pk);
    }
    msgpack_pack_array(&pk, m);
    for (uint32_t i = 0; i < m; i++) {
        msgpack_pack_uint32(&pk, g[i]->crc);
    }
    if (rc == 0 && (sb.data == NULL || (f->addr = strdup(addr)) == NULL)) {
        rc = -1;
    }
    if (rc != 0) {
        msgpack_sbuffer_destroy(&sb);
        free(f);
        return -1;
    }
    f->r = r;
    f->tenant = tenant;
    f->n = m;
    for (uint32_t i = 0; i < m; i++) {
        f->it[i] = *g[i];               /* the item's reference, now the call's */
    }
    if (peer_call_rdma(r->pool, addr, "peer_put_from", (uint8_t *)sb.data, sb.size, true,
                       repl_from_answer, f) != 0) {
        free(f->addr);                  /* nothing sent: the items keep their references */
        free(f);
        return -1;
    }
    for (uint32_t i = 0; i < m; i++) {
        g[i]->o = NULL;
    }
    return 0;
}

/* ---- the rebalance walk's pushes ---- */

/* What repl_push waits on: the keys not answered yet, and each one's code. */
struct repl_push {
    pthread_mutex_t m;
    pthread_cond_t c;
    uint32_t pending;
    int *codes;
};

void
repl_push_settle(struct repl_push *p, uint32_t idx, int code)
{
    pthread_mutex_lock(&p->m);
    p->codes[idx] = code;
    if (--p->pending == 0) {
        pthread_cond_signal(&p->c);     /* p is the waiter's: not touched after the unlock */
    }
    pthread_mutex_unlock(&p->m);
}

int
repl_push(struct repl *r, const char *addr, uint32_t tenant, struct store_obj *const *objs,
          uint32_t n, int *codes)
{
    struct repl_push p = {.pending = n, .codes = codes};
    struct repl_item *items;
    struct repl_item **g;

    if (r->cfg.rdma_arena == NULL) {
        return KV_UNSUPPORTED;          /* no device here: the walk sends its own peer_put */
    }
    if (n == 0) {
        return 0;
    }
    items = calloc(n, sizeof(*items));
    g = malloc(n * sizeof(*g));
    if (items == NULL || g == NULL) {
        free(items);
        free(g);
        return -ENOMEM;
    }
    pthread_mutex_init(&p.m, NULL);
    pthread_cond_init(&p.c, NULL);
    for (uint32_t i = 0; i < n; i++) {
        codes[i] = KV_INTERNAL;
        store_obj_ref(objs[i]);         /* the call's, until the owner's answer */
        items[i].o = objs[i];
        items[i].crc = store_obj_crc(objs[i]);
        items[i].push = &p;
        items[i].idx = i;
        g[i] = &items[i];
    }
    if (repl_send_from(r, addr, tenant, g, n) != 0) {
        repl_from_tcp(r, addr, tenant, g, n);   /* not READable from the arena: a peer_put */
    }
    pthread_mutex_lock(&p.m);
    while (p.pending > 0) {
        pthread_cond_wait(&p.c, &p.m);  /* each call is answered within peer_timeout */
    }
    pthread_mutex_unlock(&p.m);
    pthread_cond_destroy(&p.c);
    pthread_mutex_destroy(&p.m);
    free(g);
    free(items);
    return 0;
}

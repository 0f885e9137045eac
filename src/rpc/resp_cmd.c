/*
 * resp_cmd: the RESP2 command table and handlers of the resp_listen port
 * (resp_cmd.h; docs/resp.md). Each handler checks its arguments first and
 * answers a bad command with one error reply that changes nothing; then it
 * acts through the store facade exactly as the msgpack handlers do: GET
 * sends the value by reference from the arena (outq_obj), SET commits the
 * reservation its value was received into, or stores inline bytes. The
 * store is write-once: SET on a stored key keeps the stored value and
 * answers +OK (NX tells the two apart); a key being written reads as a miss.
 *
 * It owns nothing across calls but what struct resp_client holds. It never
 * touches sockets or the event loop, and reaches objects only through
 * storage/store.h. Replies are built here whole, after the last point a
 * command can wait (-EAGAIN), so a command that waits has queued nothing.
 *
 * In a pool (srv->remote set) the commands take the msgpack port's data
 * paths: a key SET or MSET stored goes to its owners through the same hook
 * as a put (rpc_remote_stored_obj; sent per owner once the command is
 * handled, rpc_remote_flush), and with write_ack all the +OK waits in
 * ctx->deferred (rpc_defer.h, with a RESP reply) until the owners answered,
 * holding the replies after it; GET, MGET, EXISTS and STRLEN ask the owners
 * for the keys missing here first (remote->fetch), as get and
 * batch_is_exist do, and read the copies kept.
 */
#include "resp_cmd.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kverr.h"
#include "mp.h"
#include "outq.h"
#include "resp.h"
#include "rpc_ctx.h"
#include "rpc_defer.h"
#include "rpc_req.h"
#include "rpc_spill.h"
#include "store.h"

#define RESP_ARGV_STACK 16
#define RESP_STATS_MAX 160
#define RESP_REDIS_VERSION "7.2.0"  /* what INFO and HELLO claim, for clients that look */
#define RESP_DEFAULT_TENANT "default" /* AUTH <password> alone logs in as this tenant */

struct resp_req {
    struct rpc_ctx *ctx;
    struct resp_client *cl;
    struct outq *out;
    struct resp_arg *argv;
    uint32_t argc;
    bool deferred;                  /* its reply waits in ctx->deferred (write_ack all) */
};

typedef int resp_handler_fn(struct resp_req *r);

struct resp_cmd {
    const char *name;
    resp_handler_fn *fn;
    int arity;                      /* as Redis: n exactly, -n at least n */
    const char *flags;              /* COMMAND's flags, space separated */
    int first, last, step;          /* COMMAND's key positions */
    int method;                     /* the msgpack method it counts as, or -1 */
    bool noauth;                    /* allowed before AUTH when auth is required */
};

/* ---- replies ---- */

static void
resp_put(struct outq *q, const char *s)
{
    outq_write(q, s, strlen(s));
}

/*
 * resp_put_len: "<kind><n>\r\n", the header of every bulk, array and integer reply. Written
 * by hand: it is on every GET's path, where snprintf was 3% of the daemon's CPU (perf, GET of
 * 4 KiB values pipelined).
 */
static void
resp_put_len(struct outq *q, char kind, int64_t n)
{
    char b[24];
    size_t k = sizeof(b);
    uint64_t u = n < 0 ? 0 - (uint64_t)n : (uint64_t)n;

    b[--k] = '\n';
    b[--k] = '\r';
    do {
        b[--k] = (char)('0' + u % 10);
        u /= 10;
    } while (u != 0);
    if (n < 0) {
        b[--k] = '-';
    }
    b[--k] = kind;
    outq_write(q, b + k, sizeof(b) - k);
}

static void
resp_put_int(struct outq *q, int64_t v)
{
    resp_put_len(q, ':', v);
}

static void
resp_put_bulk(struct outq *q, const void *p, size_t n)
{
    resp_put_len(q, '$', (int64_t)n);
    outq_write(q, p, n);
    outq_write(q, "\r\n", 2);
}

static void
resp_put_cbulk(struct outq *q, const char *s)
{
    resp_put_bulk(q, s, strlen(s));
}

/* resp_put_err: "-<text>\r\n", the text's CR and LF made spaces (a reply is one line). */
static void
resp_put_err(struct outq *q, const char *fmt, ...)
{
    char b[512];
    va_list ap;

    b[0] = '-';
    va_start(ap, fmt);
    vsnprintf(b + 1, sizeof(b) - 3, fmt, ap);
    va_end(ap);
    for (char *p = b; *p != '\0'; p++) {
        if (*p == '\r' || *p == '\n') {
            *p = ' ';
        }
    }
    resp_put(q, b);
    outq_write(q, "\r\n", 2);
}

/* resp_printable: up to max bytes of a, non-printable bytes as '?', for an error text. */
static void
resp_printable(const struct resp_arg *a, char *buf, size_t size)
{
    size_t n = 0;

    if (a->hole == NULL) {
        for (; n < a->len && n + 1 < size && n < 128; n++) {
            unsigned char c = a->p[n];
            buf[n] = (c >= 0x20 && c < 0x7f && c != '\'') ? (char)c : '?';
        }
    }
    buf[n] = '\0';
}

int
resp_notify_error(struct outq *out, int status, const char *why)
{
    if (status == KV_PROTOCOL_ERROR) {
        resp_put_err(out, "ERR Protocol error: %s", why);
    } else if (status == KV_UNAUTHORIZED) {
        /*
         * Too many failed AUTHs, or a reload removed the tenant or changed its token:
         * Redis's words for a refused login, which its clients map to an authentication
         * error (the reason, worded for the msgpack port, goes to the log only).
         */
        resp_put_err(out, "WRONGPASS invalid username-password pair or user is disabled.");
    } else {
        resp_put_err(out, "ERR %s", why);
    }
    outq_reply_end(out);
    return out->failed ? -ENOMEM : 0;
}

/* ---- arguments ---- */

static bool
resp_is(const struct resp_arg *a, const char *word)
{
    size_t n = strlen(word);

    if (a->hole != NULL || a->len != n) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (tolower(a->p[i]) != word[i]) {
            return false;
        }
    }
    return true;
}

/* resp_key: the store key of argument a, or -1 when it is longer than max_key_size. */
static int
resp_key(const struct resp_req *r, const struct resp_arg *a, struct kv_key *k)
{
    if (a->hole != NULL || a->len > r->ctx->lim->max_key_size) {
        return -1;
    }
    k->tenant = r->ctx->tenant;
    k->ptr = a->p;
    k->len = (uint32_t)a->len;
    return 0;
}

/* resp_uint: argument a as a decimal integer; 0 or -1. */
static int
resp_uint(const struct resp_arg *a, uint64_t *v)
{
    uint64_t x = 0;

    if (a->hole != NULL || a->len == 0 || a->len > 19) {
        return -1;
    }
    for (uint64_t i = 0; i < a->len; i++) {
        if (a->p[i] < '0' || a->p[i] > '9') {
            return -1;
        }
        x = x * 10 + (uint64_t)(a->p[i] - '0');
    }
    *v = x;
    return 0;
}

static int
resp_key_error(struct resp_req *r)
{
    resp_put_err(r->out, "ERR key longer than max_key_size (%" PRIu64 " bytes)",
                 r->ctx->lim->max_key_size);
    ctr_add(&r->ctx->ctr->errors, 1);
    return 0;
}

/* ---- connection commands ---- */

static int
resp_ping(struct resp_req *r)
{
    if (r->argc > 2) {
        resp_put_err(r->out, "ERR wrong number of arguments for 'ping' command");
    } else if (r->argc == 2 && r->argv[1].hole == NULL) {
        resp_put_bulk(r->out, r->argv[1].p, r->argv[1].len);
    } else if (r->argc == 2) {
        resp_put_err(r->out, "ERR argument longer than max_key_size");
    } else {
        resp_put(r->out, "+PONG\r\n");
    }
    return 0;
}

static int
resp_echo(struct resp_req *r)
{
    if (r->argv[1].hole != NULL) {
        resp_put_err(r->out, "ERR argument longer than max_key_size");
        return 0;
    }
    resp_put_bulk(r->out, r->argv[1].p, r->argv[1].len);
    return 0;
}

/*
 * resp_login: AUTH's and HELLO AUTH's check: user is the tenant (NULL: the
 * tenant named "default"). Answers an error and returns false when refused.
 */
static bool
resp_login(struct resp_req *r, const struct resp_arg *user, const struct resp_arg *pass)
{
    const struct conf_tenants *ts = r->ctx->lim->tenants;
    const char *why = NULL;
    const char *tenant = RESP_DEFAULT_TENANT;
    uint32_t tlen = (uint32_t)strlen(RESP_DEFAULT_TENANT);
    int rc;

    if (ts == NULL || ts->n == 0) {
        resp_put_err(r->out, "ERR AUTH <password> called without any password configured for "
                             "the default user. Are you sure your configuration is correct?");
        return false;
    }
    if (user != NULL) {
        if (user->hole != NULL || pass->hole != NULL) {
            resp_put_err(r->out, "WRONGPASS invalid username-password pair or user is disabled.");
            return false;
        }
        tenant = (const char *)user->p;
        tlen = (uint32_t)user->len;
    }
    if (pass->hole != NULL) {
        resp_put_err(r->out, "WRONGPASS invalid username-password pair or user is disabled.");
        return false;
    }
    rc = rpc_login(r->ctx, tenant, tlen, pass->p, (uint32_t)pass->len, &why);
    if (rc == KV_UNAUTHORIZED) {
        resp_put_err(r->out, "WRONGPASS invalid username-password pair or user is disabled.");
        return false;
    }
    if (rc != 0) {
        resp_put_err(r->out, "ERR %s", why != NULL ? why : "cannot authenticate");
        return false;
    }
    return true;
}

static int
resp_auth(struct resp_req *r)
{
    if (r->argc > 3) {
        resp_put_err(r->out, "ERR syntax error");
        return 0;
    }
    if (resp_login(r, r->argc == 3 ? &r->argv[1] : NULL, &r->argv[r->argc - 1])) {
        resp_put(r->out, "+OK\r\n");
    }
    return 0;
}

/* resp_setname: a client name as Redis takes it (no spaces or control bytes). */
static bool
resp_setname(struct resp_req *r, const struct resp_arg *a)
{
    if (a->hole != NULL || a->len >= sizeof(r->cl->name)) {
        resp_put_err(r->out, "ERR client name longer than %zu bytes",
                     sizeof(r->cl->name) - 1);
        return false;
    }
    for (uint64_t i = 0; i < a->len; i++) {
        if (a->p[i] <= ' ' || a->p[i] > '~') {
            resp_put_err(r->out, "ERR Client names cannot contain spaces, newlines or special "
                                 "characters.");
            return false;
        }
    }
    memcpy(r->cl->name, a->p, a->len);
    r->cl->name[a->len] = '\0';
    return true;
}

static int
resp_hello(struct resp_req *r)
{
    uint64_t ver = 2;
    uint32_t i = 2;

    if (r->argc >= 2 && (resp_uint(&r->argv[1], &ver) != 0 || ver < 2 || ver > 3)) {
        resp_put_err(r->out, "NOPROTO unsupported protocol version");
        return 0;
    }
    if (ver == 3) {
        resp_put_err(r->out, "NOPROTO unsupported protocol version (kvstash speaks RESP2)");
        return 0;
    }
    /* options first, as Redis checks them all before acting */
    for (; i < r->argc; i++) {
        if (resp_is(&r->argv[i], "auth") && i + 2 < r->argc) {
            i += 2;
        } else if (resp_is(&r->argv[i], "setname") && i + 1 < r->argc) {
            i += 1;
        } else {
            char w[64];
            resp_printable(&r->argv[i], w, sizeof(w));
            resp_put_err(r->out, "ERR Syntax error in HELLO option '%s'", w);
            return 0;
        }
    }
    for (i = 2; i < r->argc; i++) {
        if (resp_is(&r->argv[i], "auth")) {
            if (!resp_login(r, &r->argv[i + 1], &r->argv[i + 2])) {
                return 0;
            }
            i += 2;
        } else {
            if (!resp_setname(r, &r->argv[i + 1])) {
                return 0;
            }
            i += 1;
        }
    }
    if (r->ctx->lim->require_auth && !r->ctx->authed) {
        resp_put_err(r->out, "NOAUTH HELLO must be called with the client already "
                             "authenticated, otherwise the HELLO <proto> AUTH <user> <pass> "
                             "option can be used to authenticate the client and select the "
                             "RESP protocol version at the same time");
        return 0;
    }
    resp_put_len(r->out, '*', 14);
    resp_put_cbulk(r->out, "server");
    resp_put_cbulk(r->out, "redis");
    resp_put_cbulk(r->out, "version");
    resp_put_cbulk(r->out, RESP_REDIS_VERSION);
    resp_put_cbulk(r->out, "proto");
    resp_put_int(r->out, 2);
    resp_put_cbulk(r->out, "id");
    resp_put_int(r->out, (int64_t)r->cl->id);
    resp_put_cbulk(r->out, "mode");
    resp_put_cbulk(r->out, "standalone");
    resp_put_cbulk(r->out, "role");
    resp_put_cbulk(r->out, "master");
    resp_put_cbulk(r->out, "modules");
    resp_put_len(r->out, '*', 0);
    return 0;
}

static int
resp_select(struct resp_req *r)
{
    uint64_t db;

    if (resp_uint(&r->argv[1], &db) != 0) {
        resp_put_err(r->out, "ERR value is not an integer or out of range");
    } else if (db != 0) {
        resp_put_err(r->out, "ERR DB index is out of range");
    } else {
        resp_put(r->out, "+OK\r\n");
    }
    return 0;
}

static int
resp_client(struct resp_req *r)
{
    const struct resp_arg *sub = &r->argv[1];

    if (resp_is(sub, "setname") && r->argc == 3) {
        if (resp_setname(r, &r->argv[2])) {
            resp_put(r->out, "+OK\r\n");
        }
    } else if (resp_is(sub, "getname") && r->argc == 2) {
        if (r->cl->name[0] == '\0') {
            resp_put(r->out, "$-1\r\n");
        } else {
            resp_put_cbulk(r->out, r->cl->name);
        }
    } else if (resp_is(sub, "setinfo") && r->argc == 4) {
        resp_put(r->out, "+OK\r\n");    /* lib-name, lib-ver: accepted, not kept */
    } else if (resp_is(sub, "id") && r->argc == 2) {
        resp_put_int(r->out, (int64_t)r->cl->id);
    } else {
        char w[64];
        resp_printable(sub, w, sizeof(w));
        resp_put_err(r->out, "ERR unknown subcommand or wrong number of arguments for '%s'. "
                             "Try CLIENT HELP.", w);
    }
    return 0;
}

static int
resp_quit(struct resp_req *r)
{
    resp_put(r->out, "+OK\r\n");
    return RESP_CMD_QUIT;
}

static int
resp_reset(struct resp_req *r)
{
    r->cl->name[0] = '\0';
    r->ctx->authed = false;
    r->ctx->admin = false;
    r->ctx->tenant = 0;
    resp_put(r->out, "+RESET\r\n");
    return 0;
}

/* ---- key commands ---- */

#define RESP_FETCH_STACK 64

/*
 * resp_fetch: in a pool, the keys argv[first .. first + n) missing here are
 * asked of their owners (remote->fetch, one peer_get per owner for them
 * all). Returns 0 when nothing is left to wait for (those found are in the
 * store now, as copies kept here; on a single node at once), -EAGAIN while
 * fetches are under way (nothing queued: the command comes back), -ENOMEM.
 * With ctx->final_try nothing new is asked.
 */
static int
resp_fetch(struct resp_req *r, uint32_t first, uint32_t n)
{
    const struct rpc_remote *rm = r->ctx->srv->remote;
    struct kv_key stack[RESP_FETCH_STACK];
    struct kv_key *ks = stack;
    uint32_t m = 0;
    int rc = 0;

    if (rm == NULL) {
        return 0;
    }
    if (n > RESP_FETCH_STACK && (ks = malloc(n * sizeof(*ks))) == NULL) {
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++) {
        /* a key over max_key_size: no node holds it */
        if (resp_key(r, &r->argv[first + i], &ks[m]) == 0
            && store_exists(r->ctx->srv->store, &ks[m]) != 1) {
            m++;
        }
    }
    if (m > 0) {
        rc = rm->fetch(rm->arg, ks, m, r->ctx->final_try);
    }
    if (ks != stack) {
        free(ks);
    }
    return rc;
}

/*
 * resp_refs: references on the objects of keys argv[first], argv[first+step],
 * ... (n of them; NULL for a miss or a key too long) or -EAGAIN (nothing
 * held) while some are being loaded from the SSD tier: every load is started
 * first, so a multi-key read waits once.
 */
static int
resp_refs(struct resp_req *r, uint32_t first, uint32_t n, struct store_obj **objs)
{
    struct store *st = r->ctx->srv->store;
    struct kv_key key;
    bool wait = false;

    for (uint32_t i = 0; i < n && !r->ctx->final_try && store_has_tier(st); i++) {
        if (resp_key(r, &r->argv[first + i], &key) == 0 && store_prefetch(st, &key) == 1) {
            rpc_tier_note(r->ctx, n, i);
            wait = true;
        }
    }
    if (wait) {
        return -EAGAIN;
    }
    for (uint32_t i = 0; i < n; i++) {
        objs[i] = NULL;
        if (resp_key(r, &r->argv[first + i], &key) != 0) {
            continue;
        }
        int rc = store_get(st, &key, &objs[i]);
        if (rc == -EAGAIN && !r->ctx->final_try) {
            for (uint32_t j = 0; j < i; j++) {
                store_obj_unref(st, objs[j]);
            }
            rpc_tier_note(r->ctx, n, i);    /* evicted since the first pass: loading again */
            return -EAGAIN;
        }
        if (rc != 0) {
            objs[i] = NULL;         /* absent, being written, or not loaded in time: a miss */
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        rpc_tier_count(r->ctx, i, objs[i]);     /* a key too long is a miss, as in Redis */
    }
    rpc_tier_forget(r->ctx);
    return 0;
}

/*
 * resp_put_value: a GET's answer: the value by reference (the reference goes with it), or
 * nil. Its lookup was counted where it resolved (rpc_tier_count).
 */
static void
resp_put_value(struct resp_req *r, struct store_obj *o)
{
    if (o == NULL) {
        resp_put(r->out, "$-1\r\n");
        return;
    }
    resp_put_len(r->out, '$', (int64_t)store_obj_size(o));
    outq_obj(r->out, o);
    outq_write(r->out, "\r\n", 2);
}

static int
resp_get(struct resp_req *r)
{
    struct store_obj *o;
    struct kv_key key;

    if (resp_key(r, &r->argv[1], &key) != 0) {
        return resp_key_error(r);
    }
    /*
     * In a pool, a key resident here is answered from one lookup, as the msgpack get does;
     * only one that is not asks the owners (resp_fetch, which looks once more first).
     */
    if (r->ctx->srv->remote != NULL && store_get(r->ctx->srv->store, &key, &o) == 0) {
        rpc_tier_count(r->ctx, 0, o);
        resp_put_value(r, o);
        return 0;
    }
    int rc = resp_fetch(r, 1, 1);
    if (rc == 0) {
        rc = resp_refs(r, 1, 1, &o);
    }
    if (rc != 0) {
        return rc;
    }
    resp_put_value(r, o);
    return 0;
}

#define RESP_MGET_AHEAD 8u          /* SSD loads an MGET keeps started ahead of its reply */

/*
 * MGET: without an SSD tier, every value at once. With one, in order: the
 * values resident now are queued (the outq holds them, by reference), and at
 * the first one still on the SSD the command waits, with the loads of the
 * next RESP_MGET_AHEAD keys started, and goes on from there when dispatched
 * again (cl->mget_next). So the reply streams out as values load, and an MGET
 * bigger than DRAM needs only a window of it resident at a time.
 */
static int
resp_mget(struct resp_req *r)
{
    struct store *st = r->ctx->srv->store;
    uint32_t n = r->argc - 1, i = 0;
    struct kv_key key;

    if (r->cl->mget_next == 0) {
        int rc = resp_fetch(r, 1, n);   /* in a pool: the misses from their owners first */
        if (rc != 0) {
            return rc;
        }
    }
    if (!store_has_tier(st)) {
        struct store_obj *stack[64];
        struct store_obj **objs = stack;

        if (n > 64) {
            objs = malloc(n * sizeof(*objs));
            if (objs == NULL) {
                return -ENOMEM;
            }
        }
        int rc = resp_refs(r, 1, n, objs);
        if (rc == 0) {
            resp_put_len(r->out, '*', n);
            for (uint32_t k = 0; k < n; k++) {
                resp_put_value(r, objs[k]);
            }
        }
        if (objs != stack) {
            free(objs);
        }
        return rc;
    }
    if (r->cl->mget_next == 0) {
        resp_put_len(r->out, '*', n);   /* the header, once */
    } else {
        i = r->cl->mget_next - 1;
    }
    for (; i < n; i++) {
        struct store_obj *o = NULL;
        int rc = -1;

        if (resp_key(r, &r->argv[1 + i], &key) == 0) {
            rc = store_get(st, &key, &o);
        }
        if (rc == -EAGAIN && !r->ctx->final_try) {
            rpc_tier_note(r->ctx, n, i);
            for (uint32_t k = i + 1; k < n && k <= i + RESP_MGET_AHEAD; k++) {
                if (resp_key(r, &r->argv[1 + k], &key) == 0 && store_prefetch(st, &key) == 1) {
                    rpc_tier_note(r->ctx, n, k);
                }
            }
            r->cl->mget_next = i + 1;
            return -EAGAIN;
        }
        rpc_tier_count(r->ctx, i, rc == 0 ? o : NULL);
        resp_put_value(r, rc == 0 ? o : NULL);
    }
    r->cl->mget_next = 0;
    return 0;
}

/*
 * resp_store: store value argument v under key argument k: commit the
 * reservation it was received into, or store its inline bytes. The key's
 * outcome (0 stored, KV_EXISTS, KV_BUSY, ...), or -EAGAIN to wait for room.
 */
static int
resp_store(struct resp_req *r, const struct resp_arg *k, const struct resp_arg *v)
{
    struct kv_key key;
    int rc;

    if (v->hole != NULL) {
        struct rpc_spill *sp = v->hole->tag;
        if (sp->obj == NULL) {
            return sp->code;        /* refused as it arrived (0: committed on an earlier try) */
        }
        rc = store_commit(r->ctx->srv->store, sp->obj);
        sp->obj = NULL;
        sp->code = rc;
        return rc;
    }
    if (resp_key(r, k, &key) != 0 || v->len > r->ctx->lim->max_value_size) {
        return KV_TOO_LARGE;
    }
    rc = store_put(r->ctx->srv->store, &key, v->p, v->len);
    if (rc == -EAGAIN) {
        return r->ctx->final_try ? KV_NO_SPACE : -EAGAIN;
    }
    return rc < 0 ? KV_INTERNAL : rc;
}

/* resp_is_error: whether a store outcome is an error (write-once: EXISTS and BUSY are not). */
static bool
resp_is_error(int rc)
{
    return rc != 0 && rc != KV_EXISTS && rc != KV_BUSY;
}

/* resp_put_store_reply: SET's and MSET's reply to store outcome rc: +OK, or its error. */
static void
resp_put_store_reply(struct outq *out, int rc)
{
    if (!resp_is_error(rc)) {
        resp_put(out, "+OK\r\n");    /* write-once: a stored key keeps its value */
    } else if (rc == KV_TOO_LARGE) {
        resp_put_err(out, "ERR key over max_key_size or value over max_value_size");
    } else if (rc == KV_NO_SPACE) {
        resp_put_err(out, "OOM command not allowed: no room in the store (memory_size)");
    } else if (rc == KV_QUOTA_EXCEEDED) {
        resp_put_err(out, "OOM command not allowed: the tenant's memory_quota is full");
    } else {
        resp_put_err(out, "ERR %s", kv_strerror(rc));
    }
}

/* resp_store_error: answer a store outcome that is an error; false when it is not one. */
static bool
resp_store_error(struct resp_req *r, int rc)
{
    if (!resp_is_error(rc)) {
        return false;
    }
    resp_put_store_reply(r->out, rc);
    ctr_add(&r->ctx->ctr->errors, 1);
    return true;
}

/*
 * resp_deferred_reply: the reply of a SET or MSET that waited for the key's owners
 * (rpc_deferred_poll calls it): the first error among its keys' outcomes, else +OK.
 */
static int
resp_deferred_reply(const struct rpc_deferred *d, struct outq *out)
{
    int first = 0;

    for (uint32_t i = 0; i < d->n && first == 0; i++) {
        first = resp_is_error(d->codes[i]) ? d->codes[i] : 0;
    }
    resp_put_store_reply(out, first);
    return out->failed ? -ENOMEM : 0;
}

/* resp_deferred_new: a waiting SET or MSET reply of n keys, all 0 so far; NULL: no memory. */
static struct rpc_deferred *
resp_deferred_new(uint32_t n)
{
    struct rpc_deferred *d = rpc_deferred_new(0, n, n > 1);

    if (d != NULL) {
        d->reply = resp_deferred_reply;
    }
    return d;
}

/*
 * resp_stored: in a pool, key argument k was just stored by this command: hand it to the
 * cluster (a cache copy if this node does not own it; queued for its other owners, sent
 * when the command is handled). Returns the ticket its reply waits for (write_ack all) or
 * NULL.
 */
static void *
resp_stored(struct resp_req *r, const struct resp_arg *k)
{
    struct store *st = r->ctx->srv->store;
    struct store_obj *o;
    struct kv_key key;
    void *ticket;

    if (r->ctx->srv->remote == NULL || resp_key(r, k, &key) != 0 || store_get(st, &key, &o) != 0) {
        return NULL;                /* (removed already, or on its way to the SSD: not sent) */
    }
    ticket = rpc_remote_stored_obj(r->ctx, o);
    store_obj_unref(st, o);
    return ticket;
}

/*
 * resp_hold: the command's reply waits in d (its tickets) until every owner answered:
 * rpc_deferred_poll queues it then, and the connection answers nothing after it before.
 * Without tickets (none to wait for, or no memory for them) d is freed and false returned:
 * answer now.
 */
static bool
resp_hold(struct resp_req *r, struct rpc_deferred *d)
{
    if (d == NULL || d->tickets == NULL) {
        rpc_deferred_free(r->ctx, d);
        return false;
    }
    r->ctx->deferred = d;
    r->deferred = true;
    return true;
}

/* resp_ticket: key i of d's command waits for ticket (NULL: nothing); d made on demand. */
static struct rpc_deferred *
resp_ticket(struct resp_req *r, struct rpc_deferred *d, uint32_t n, uint32_t i, void *ticket)
{
    const struct rpc_remote *rm = r->ctx->srv->remote;

    if (ticket == NULL) {
        return d;
    }
    if (d == NULL && (d = resp_deferred_new(n)) == NULL) {
        rm->ticket_put(rm->arg, ticket);    /* no memory to wait with: answered at once */
        return NULL;
    }
    (void)rpc_deferred_ticket(r->ctx, d, i, ticket);    /* -ENOMEM: given back, not waited */
    return d;
}

static int
resp_set(struct resp_req *r)
{
    bool nx = false;
    struct kv_key key;

    for (uint32_t i = 3; i < r->argc; i++) {
        const struct resp_arg *o = &r->argv[i];
        if (resp_is(o, "nx")) {
            nx = true;
        } else if (resp_is(o, "ex") || resp_is(o, "px") || resp_is(o, "exat")
                   || resp_is(o, "pxat") || resp_is(o, "keepttl") || resp_is(o, "get")) {
            resp_put_err(r->out, "ERR kvstash has no TTLs and never returns an old value: SET "
                                 "takes no EX, PX, EXAT, PXAT, KEEPTTL or GET");
            ctr_add(&r->ctx->ctr->errors, 1);
            return 0;
        } else if (resp_is(o, "xx")) {
            resp_put_err(r->out, "ERR kvstash values are write-once: SET takes no XX");
            ctr_add(&r->ctx->ctr->errors, 1);
            return 0;
        } else {
            resp_put_err(r->out, "ERR syntax error");
            ctr_add(&r->ctx->ctr->errors, 1);
            return 0;
        }
    }
    if (r->argv[1].hole != NULL || resp_key(r, &r->argv[1], &key) != 0) {
        return resp_key_error(r);
    }
    int rc = resp_store(r, &r->argv[1], &r->argv[2]);
    if (rc == -EAGAIN) {
        return rc;
    }
    if (resp_store_error(r, rc)) {
        return 0;
    }
    if (rc == 0 && resp_hold(r, resp_ticket(r, NULL, 1, 0, resp_stored(r, &r->argv[1])))) {
        return 0;                   /* +OK once the owners answered (write_ack all) */
    }
    if (nx && rc != 0) {
        resp_put(r->out, "$-1\r\n");    /* stored already (or being stored) */
    } else {
        resp_put(r->out, "+OK\r\n");    /* write-once: a stored key keeps its value */
    }
    return 0;
}

/*
 * MSET: each pair stored in turn. One that waits for DRAM room leaves what was done in
 * ctx->resume (a struct rpc_deferred: the outcomes and tickets of the pairs before
 * d->next), and the command comes back to go on from there, so no key is stored or sent to
 * its owners twice. With write_ack all the reply waits for every stored key's owners.
 */
static int
resp_mset(struct resp_req *r)
{
    uint32_t n = (r->argc - 1) / 2, start = 0, first_at = 0;
    struct rpc_deferred *d = r->ctx->resume;
    int first = 0;

    r->ctx->resume = NULL;
    if (r->argc % 2 != 1) {
        rpc_deferred_free(r->ctx, d);
        resp_put_err(r->out, "ERR wrong number of arguments for 'mset' command");
        return 0;
    }
    if (d != NULL && d->n != n) {
        rpc_deferred_free(r->ctx, d);   /* not this command's: cannot happen, be safe */
        d = NULL;
    }
    if (d != NULL) {
        start = d->next;
        for (uint32_t i = 0; i < start && first == 0; i++) {
            first = resp_is_error(d->codes[i]) ? d->codes[i] : 0;
            first_at = i;
        }
    }
    for (uint32_t i = start; i < n; i++) {
        const struct resp_arg *k = &r->argv[1 + 2 * i];
        struct rpc_deferred *had = d;
        int rc = resp_store(r, k, k + 1);

        if (rc == -EAGAIN && d == NULL) {
            d = resp_deferred_new(n);
        }
        if (rc == -EAGAIN && d == NULL) {
            rc = KV_NO_SPACE;       /* no memory to wait with */
        }
        if (rc == 0) {
            d = resp_ticket(r, d, n, i, resp_stored(r, k));
        }
        if (d != had && first != 0) {
            /* made now: of the pairs before i, the reply needs only the first error */
            d->codes[first_at] = first;
        }
        if (rc == -EAGAIN) {
            d->next = i;
            r->ctx->resume = d;     /* the pairs before i are done: the retry goes on here */
            return rc;
        }
        if (d != NULL) {
            d->codes[i] = rc;
        }
        if (first == 0 && resp_is_error(rc)) {
            first = rc;
            first_at = i;
        }
    }
    if (resp_is_error(first)) {
        ctr_add(&r->ctx->ctr->errors, 1);
    }
    if (!resp_hold(r, d)) {
        resp_put_store_reply(r->out, first);
    }
    return 0;
}

static int
resp_exists(struct resp_req *r)
{
    struct kv_key key;
    int64_t n = 0;
    int rc = resp_fetch(r, 1, r->argc - 1);

    if (rc != 0) {
        return rc;
    }

    for (uint32_t i = 1; i < r->argc; i++) {
        if (resp_key(r, &r->argv[i], &key) == 0) {
            n += store_exists(r->ctx->srv->store, &key) == 1;
        }
    }
    resp_put_int(r->out, n);
    return 0;
}

static int
resp_del(struct resp_req *r)
{
    struct kv_key key;
    int64_t n = 0;

    for (uint32_t i = 1; i < r->argc; i++) {
        if (resp_key(r, &r->argv[i], &key) == 0) {
            n += store_remove(r->ctx->srv->store, &key, false) == 0;
        }
    }
    resp_put_int(r->out, n);
    return 0;
}

static int
resp_strlen(struct resp_req *r)
{
    struct kv_key key;
    uint64_t size = 0;
    int rc = resp_fetch(r, 1, 1);

    if (rc != 0) {
        return rc;
    }
    if (resp_key(r, &r->argv[1], &key) == 0
        && store_size(r->ctx->srv->store, &key, &size) != 0) {
        size = 0;
    }
    resp_put_int(r->out, (int64_t)size);
    return 0;
}

/* resp_keys: the objects of the connection's namespace (its tenant's). */
static uint64_t
resp_keys(struct resp_req *r)
{
    uint64_t objects = 0, bytes = 0;

    store_tenant_usage(r->ctx->srv->store, r->ctx->tenant, &objects, &bytes);
    return objects;
}

static int
resp_dbsize(struct resp_req *r)
{
    resp_put_int(r->out, (int64_t)resp_keys(r));
    return 0;
}

static int
resp_flush(struct resp_req *r)
{
    if (r->argc == 2 && !resp_is(&r->argv[1], "sync") && !resp_is(&r->argv[1], "async")) {
        resp_put_err(r->out, "ERR syntax error");
        return 0;
    }
    (void)store_remove_all(r->ctx->srv->store, r->ctx->tenant, false, false);
    resp_put(r->out, "+OK\r\n");
    return 0;
}

/* ---- introspection ---- */

static int resp_info(struct resp_req *r);
static int resp_command(struct resp_req *r);

static const struct resp_cmd resp_cmds[] = {
    {"ping", resp_ping, -1, "fast stale", 0, 0, 0, RPC_PING, false},
    {"echo", resp_echo, 2, "fast", 0, 0, 0, -1, false},
    {"auth", resp_auth, -2, "noscript loading stale fast no_auth", 0, 0, 0, RPC_HELLO, true},
    {"hello", resp_hello, -1, "noscript loading stale fast no_auth", 0, 0, 0, RPC_HELLO, true},
    {"select", resp_select, 2, "loading stale fast", 0, 0, 0, -1, false},
    {"client", resp_client, -2, "loading stale", 0, 0, 0, -1, false},
    {"info", resp_info, -1, "loading stale", 0, 0, 0, RPC_STATS, false},
    {"command", resp_command, -1, "loading stale", 0, 0, 0, -1, false},
    {"get", resp_get, 2, "readonly fast", 1, 1, 1, RPC_GET, false},
    {"mget", resp_mget, -2, "readonly fast", 1, -1, 1, RPC_BATCH_GET, false},
    {"set", resp_set, -3, "write denyoom", 1, 1, 1, RPC_PUT, false},
    {"mset", resp_mset, -3, "write denyoom", 1, -1, 2, RPC_BATCH_PUT, false},
    {"exists", resp_exists, -2, "readonly fast", 1, -1, 1, RPC_BATCH_IS_EXIST, false},
    {"del", resp_del, -2, "write", 1, -1, 1, RPC_BATCH_REMOVE, false},
    {"unlink", resp_del, -2, "write fast", 1, -1, 1, RPC_BATCH_REMOVE, false},
    {"strlen", resp_strlen, 2, "readonly fast", 1, 1, 1, RPC_GET_SIZE, false},
    {"dbsize", resp_dbsize, 1, "readonly fast", 0, 0, 0, -1, false},
    {"flushdb", resp_flush, -1, "write", 0, 0, 0, RPC_REMOVE_ALL, false},
    {"flushall", resp_flush, -1, "write", 0, 0, 0, RPC_REMOVE_ALL, false},
    {"quit", resp_quit, -1, "noscript loading stale fast no_auth", 0, 0, 0, -1, true},
    {"reset", resp_reset, 1, "noscript loading stale fast no_auth", 0, 0, 0, -1, true},
};

#define RESP_NCMDS (sizeof(resp_cmds) / sizeof(resp_cmds[0]))

static const struct resp_cmd *
resp_lookup(const struct resp_arg *a)
{
    if (a->hole != NULL || a->len == 0) {
        return NULL;
    }
    int first = tolower(a->p[0]);

    for (size_t i = 0; i < RESP_NCMDS; i++) {
        if (resp_cmds[i].name[0] == first && resp_is(a, resp_cmds[i].name)) {
            return &resp_cmds[i];
        }
    }
    return NULL;
}

/* resp_put_cmd: one command's COMMAND INFO entry (the ten fields of Redis 7). */
static void
resp_put_cmd(struct outq *q, const struct resp_cmd *c)
{
    char flags[64];
    int nflags = 0;

    resp_put_len(q, '*', 10);
    resp_put_cbulk(q, c->name);
    resp_put_int(q, c->arity);
    for (const char *p = c->flags; *p != '\0'; p++) {
        nflags += (p == c->flags || p[-1] == ' ');
    }
    resp_put_len(q, '*', nflags);
    for (const char *p = c->flags; *p != '\0';) {
        size_t n = strcspn(p, " ");
        snprintf(flags, sizeof(flags), "+%.*s\r\n", (int)n, p);
        resp_put(q, flags);
        p += n + (p[n] == ' ');
    }
    resp_put_int(q, c->first);
    resp_put_int(q, c->last);
    resp_put_int(q, c->step);
    for (int i = 0; i < 4; i++) {
        resp_put_len(q, '*', 0);    /* acl categories, tips, key specs, subcommands */
    }
}

static int
resp_command(struct resp_req *r)
{
    if (r->argc == 1) {
        resp_put_len(r->out, '*', (int64_t)RESP_NCMDS);
        for (size_t i = 0; i < RESP_NCMDS; i++) {
            resp_put_cmd(r->out, &resp_cmds[i]);
        }
    } else if (resp_is(&r->argv[1], "count") && r->argc == 2) {
        resp_put_int(r->out, (int64_t)RESP_NCMDS);
    } else if (resp_is(&r->argv[1], "docs")) {
        resp_put_len(r->out, '*', 0);   /* no docs: clients go without hints */
    } else if (resp_is(&r->argv[1], "info")) {
        resp_put_len(r->out, '*', r->argc - 2);
        for (uint32_t i = 2; i < r->argc; i++) {
            const struct resp_cmd *c = resp_lookup(&r->argv[i]);
            if (c == NULL) {
                resp_put(r->out, "*-1\r\n");
            } else {
                resp_put_cmd(r->out, c);
            }
        }
    } else {
        char w[64];
        resp_printable(&r->argv[1], w, sizeof(w));
        resp_put_err(r->out, "ERR unknown subcommand or wrong number of arguments for '%s'. "
                             "Try COMMAND HELP.", w);
    }
    return 0;
}

/* resp_stat: the daemon counter called name, or 0. */
static uint64_t
resp_stat(const char **names, const uint64_t *values, int n, const char *name)
{
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i], name) == 0) {
            return values[i];
        }
    }
    return 0;
}

/* resp_info_wants: whether INFO's arguments ask for section s. */
static bool
resp_info_wants(const struct resp_req *r, const char *s)
{
    if (r->argc == 1) {
        return true;
    }
    for (uint32_t i = 1; i < r->argc; i++) {
        if (resp_is(&r->argv[i], s) || resp_is(&r->argv[i], "all")
            || resp_is(&r->argv[i], "default") || resp_is(&r->argv[i], "everything")) {
            return true;
        }
    }
    return false;
}

/* resp_info_line: "name:value\r\n" appended to the text being built. */
static void
resp_info_line(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (*len >= size) {
        return;
    }
    va_start(ap, fmt);
    n = vsnprintf(buf + *len, size - *len, fmt, ap);
    va_end(ap);
    if (n > 0) {
        *len += (size_t)n < size - *len ? (size_t)n : size - *len - 1;
    }
}

/*
 * INFO: the Redis sections a client reads (server, clients, memory, stats,
 * keyspace) from the daemon's own counters, and in stats every kvstash
 * counter as kvstash_<name>. A tenant that cannot see the whole daemon
 * (rpc_shared_view) gets its own keyspace and no daemon-wide counters.
 */
static int
resp_info(struct resp_req *r)
{
    static const char *names_none[1];
    const char **names = names_none;
    uint64_t values[RESP_STATS_MAX];
    int n = 0;
    bool shared = rpc_shared_view(r->ctx);
    const struct rpc_server *srv = r->ctx->srv;
    size_t size = 16384, len = 0;
    char *buf;

    const char *nm[RESP_STATS_MAX];
    if (shared && srv->stats_fn != NULL) {
        n = srv->stats_fn(srv->stats_arg, nm, values, RESP_STATS_MAX);
        names = nm;
    }
    buf = malloc(size);
    if (buf == NULL) {
        return -ENOMEM;
    }
    buf[0] = '\0';
    if (resp_info_wants(r, "server")) {
        resp_info_line(buf, size, &len,
                       "# Server\r\nredis_version:%s\r\nkvstash_version:%s\r\n"
                       "redis_mode:standalone\r\nos:Linux\r\narch_bits:64\r\n"
                       "run_id:%s\r\nuptime_in_seconds:%" PRIu64 "\r\n\r\n",
                       RESP_REDIS_VERSION, srv->version, srv->node_id,
                       resp_stat(names, values, n, "uptime_s"));
    }
    if (resp_info_wants(r, "clients")) {
        resp_info_line(buf, size, &len, "# Clients\r\nconnected_clients:%" PRIu64 "\r\n\r\n",
                       resp_stat(names, values, n, "connections"));
    }
    if (resp_info_wants(r, "memory")) {
        resp_info_line(buf, size, &len,
                       "# Memory\r\nused_memory:%" PRIu64 "\r\nmaxmemory:%" PRIu64 "\r\n"
                       "maxmemory_policy:allkeys-lru\r\n\r\n",
                       resp_stat(names, values, n, "memory_used"),
                       resp_stat(names, values, n, "memory_capacity"));
    }
    if (resp_info_wants(r, "stats")) {
        uint64_t ops = 0;
        for (int i = 0; i < n; i++) {
            if (strncmp(names[i], "ops.", 4) == 0) {
                ops += values[i];
            }
        }
        resp_info_line(buf, size, &len,
                       "# Stats\r\ntotal_connections_received:%" PRIu64 "\r\n"
                       "total_commands_processed:%" PRIu64 "\r\n"
                       "total_net_input_bytes:%" PRIu64 "\r\ntotal_net_output_bytes:%" PRIu64
                       "\r\nrejected_connections:%" PRIu64 "\r\nevicted_keys:%" PRIu64 "\r\n"
                       "keyspace_hits:%" PRIu64 "\r\nkeyspace_misses:%" PRIu64 "\r\n",
                       resp_stat(names, values, n, "connections_total"), ops,
                       resp_stat(names, values, n, "bytes_in"),
                       resp_stat(names, values, n, "bytes_out"),
                       resp_stat(names, values, n, "connections_rejected"),
                       resp_stat(names, values, n, "evictions"),
                       resp_stat(names, values, n, "hits"), resp_stat(names, values, n, "misses"));
        for (int i = 0; i < n; i++) {
            char k[96];
            snprintf(k, sizeof(k), "%s", names[i]);
            for (char *p = k; *p != '\0'; p++) {
                *p = (*p == '.' || *p == ':') ? '_' : *p;
            }
            resp_info_line(buf, size, &len, "kvstash_%s:%" PRIu64 "\r\n", k, values[i]);
        }
        resp_info_line(buf, size, &len, "\r\n");
    }
    if (resp_info_wants(r, "keyspace")) {
        uint64_t keys = resp_keys(r);
        resp_info_line(buf, size, &len, "# Keyspace\r\n");
        if (keys > 0) {
            resp_info_line(buf, size, &len, "db0:keys=%" PRIu64 ",expires=0,avg_ttl=0\r\n", keys);
        }
    }
    resp_put_bulk(r->out, buf, len);
    free(buf);
    return 0;
}

/* ---- dispatch ---- */

int
resp_spill_take(struct rpc_ctx *ctx, const uint8_t *msg, size_t len, const struct mp_hole *holes,
                size_t nholes, uint32_t arg, uint64_t vlen, struct rpc_spill *sp)
{
    struct resp_arg cmd, k;
    bool value = false;

    sp->obj = NULL;
    sp->code = KV_TOO_LARGE;
    sp->sum = false;
    sp->crc = 0;
    if (arg >= 2 && (!ctx->lim->require_auth || ctx->authed)
        && resp_arg_nth(msg, len, holes, nholes, 0, &cmd) == 0) {
        value = (resp_is(&cmd, "set") && arg == 2) || (resp_is(&cmd, "mset") && arg % 2 == 0);
    }
    if (!value) {
        return vlen > ctx->lim->max_key_size;   /* longer than any key: discarded */
    }
    if (resp_arg_nth(msg, len, holes, nholes, arg - 1, &k) != 0 || k.hole != NULL
        || k.len > ctx->lim->max_key_size || vlen > ctx->lim->max_value_size) {
        return 1;                   /* KV_TOO_LARGE: discarded */
    }
    struct kv_key key = {.tenant = ctx->tenant, .ptr = k.p, .len = (uint32_t)k.len};
    int rc = store_reserve(ctx->srv->store, &key, vlen, &sp->obj);
    if (rc == -EAGAIN && !ctx->final_try) {
        sp->obj = NULL;
        sp->code = -EAGAIN;
        return 1;
    }
    if (rc != 0) {
        sp->obj = NULL;
        sp->code = rc == -EAGAIN ? KV_NO_SPACE : rc < 0 ? KV_INTERNAL : rc;
    }
    /* in a pool: checksummed as its bytes land, the CRC-32C it travels to its owners with */
    sp->sum = sp->obj != NULL && ctx->srv->remote != NULL;
    return 1;
}

static void
resp_holes_release(struct rpc_ctx *ctx, const struct mp_hole *holes, size_t nholes)
{
    for (size_t i = 0; i < nholes; i++) {
        struct rpc_spill *sp = holes[i].tag;
        if (sp != NULL && sp->obj != NULL) {
            store_abort(ctx->srv->store, sp->obj);
            sp->obj = NULL;
        }
    }
}

/* resp_unknown: Redis's answer to a command it does not have. */
static void
resp_unknown(struct resp_req *r)
{
    char name[160], args[200];
    size_t len = 0;

    resp_printable(&r->argv[0], name, sizeof(name));
    args[0] = '\0';
    for (uint32_t i = 1; i < r->argc && len < 128; i++) {
        char w[40];
        resp_printable(&r->argv[i], w, sizeof(w));
        len += (size_t)snprintf(args + len, sizeof(args) - len, "'%s' ", w);
    }
    resp_put_err(r->out, "ERR unknown command '%s', with args beginning with: %s", name, args);
}

int
resp_dispatch(struct rpc_ctx *ctx, struct resp_client *cl, uint8_t *msg, size_t len,
              int is_inline, uint32_t argc, const struct mp_hole *holes, size_t nholes,
              struct outq *out)
{
    struct resp_arg stack[RESP_ARGV_STACK];
    struct resp_req r = {.ctx = ctx, .cl = cl, .out = out, .argv = stack, .argc = argc};
    const struct resp_cmd *c;
    int rc = 0;

    if (argc == 0) {
        return 0;                   /* an empty command: no reply, as Redis */
    }
    if (argc > RESP_ARGV_STACK) {
        r.argv = malloc(argc * sizeof(*r.argv));    /* argc <= what resp_scan bounded */
        if (r.argv == NULL) {
            resp_holes_release(ctx, holes, nholes);
            return -ENOMEM;
        }
    }
    if (resp_args(msg, len, is_inline, holes, nholes, r.argv, argc) != 0) {
        resp_put_err(out, "ERR Protocol error: malformed command");
        goto done;
    }
    c = resp_lookup(&r.argv[0]);
    if (c == NULL) {
        resp_unknown(&r);
        ctr_add(&ctx->ctr->errors, 1);
        goto done;
    }
    if (ctx->lim->require_auth && !ctx->authed && !c->noauth) {
        resp_put_err(out, "NOAUTH Authentication required.");
        ctr_add(&ctx->ctr->errors, 1);
        goto done;
    }
    if ((c->arity > 0 && argc != (uint32_t)c->arity)
        || (c->arity < 0 && argc < (uint32_t)-c->arity)) {
        resp_put_err(out, "ERR wrong number of arguments for '%s' command", c->name);
        ctr_add(&ctx->ctr->errors, 1);
        goto done;
    }
    if (c->method >= 0) {
        ctr_add(&ctx->ctr->ops[c->method], 1);
    }
    rc = c->fn(&r);
    rpc_remote_flush(ctx);          /* in a pool: what it stored, to the owners in one go */
    if (rc == -EAGAIN) {
        if (c->method >= 0) {
            atomic_fetch_sub_explicit(&ctx->ctr->ops[c->method], 1, memory_order_relaxed);
        }
        if (r.argv != stack) {
            free(r.argv);
        }
        return rc;                  /* nothing answered, the holes kept: it comes back */
    }
done:
    rpc_tier_forget(ctx);           /* a read resolved: its SSD notes go (none: no-op) */
    if (ctx->resume != NULL) {
        rpc_deferred_free(ctx, ctx->resume);   /* only the MSET that waited picks it up */
        ctx->resume = NULL;
    }
    resp_holes_release(ctx, holes, nholes);
    if (r.argv != stack) {
        free(r.argv);
    }
    if (rc == -ENOMEM || out->failed) {
        return -ENOMEM;
    }
    if (!r.deferred) {
        outq_reply_end(out);        /* a held reply is marked when it is queued */
    }
    return rc;
}

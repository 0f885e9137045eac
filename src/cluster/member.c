/*
 * member: the membership thread. Everything that talks to etcd runs on this thread's
 * event_base, one call at a time, driven by member_step: it looks at what is missing
 * (config checked, lease, our key, our key's state, the member list, a live watch, a
 * keepalive due) and sends the one call that fixes the first of them. A failed call backs
 * off (250 ms doubling to 5 s) and the step runs again; nothing is ever waited on. The
 * member list is a table on this thread; each change to it is published as a new
 * immutable view (view.h). Other threads reach the thread through `shared` (a mutex) and
 * an event made active (libevent's pthreads locking is on).
 *
 * The node key's value is JSON: {"id", "addr", "weight", "state", "tls"}. The lease id of
 * our registration is kept in <data_dir>/cluster_lease with our pid, so that a daemon
 * restarted after a crash, finding its own node key still there under its previous lease
 * (and that process gone), revokes that lease and registers again instead of refusing to
 * start as a duplicate.
 */
#include "member.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "b64.h"
#include "clock.h"
#include "config.h"
#include "etcd.h"
#include "json.h"
#include "log.h"

#define MEMBER_BACKOFF_MIN_MS 250
#define MEMBER_BACKOFF_MAX_MS 5000
#define MEMBER_TICK_MS 100          /* the step's timer while something is due */
#define MEMBER_BODY_MAX 8192        /* one request body */
/* JSON tokens for an answer of len bytes: an etcd kv object is >= 14 tokens in >= 150
 * bytes, so a third of the length covers any real answer (a hostile one is refused) */
#define MEMBER_TOKENS(len) ((uint32_t)((len) / 3 + 64))
#define MEMBER_VALUE_MAX 2048       /* one node key's value */

enum member_first { MEMBER_FIRST_PENDING, MEMBER_FIRST_DONE };

struct member {
    /* settings, read-only after member_start */
    char node_id[65];
    char cluster[65];
    char prefix[CONF_STR_MAX];
    char advertise[CONF_STR_MAX];
    char tls[CONF_STR_MAX];
    char etcd_user[CONF_STR_MAX];   /* "" = no etcd authentication */
    char lease_path[CONF_STR_MAX + 32];
    uint64_t ttl_ms;
    unsigned replicas;
    double weight;

    pthread_t thread;
    bool thread_started;
    struct event_base *base;
    struct etcd *etcd;
    struct event *kick;             /* made active by other threads */
    struct event *tick;             /* the step's timer */

    pthread_mutex_t lock;           /* guards the block below */
    pthread_cond_t cond;
    int first_rc;
    enum member_first first;
    enum view_state want;           /* the state to register */
    bool stop, leave, draining;
    member_drain_fn *drain_fn;
    void *drain_arg;
    member_ready_fn *ready_fn;
    void *ready_arg;

    /* member thread only */
    bool busy;                      /* a call is in flight */
    bool config_ok, registered, listed, refused, left, stopping, drain_told;
    bool held;                      /* the ready check holds `want` active back as joining */
    enum view_state reg_state;      /* the state our key holds */
    enum view_state goal;           /* `want` as the last step read it */
    uint64_t lease;                 /* 0: none */
    uint64_t old_lease;             /* a previous run's lease found on our key: revoke it */
    uint64_t revision;              /* of the last list or event applied */
    uint64_t next_try_ms, backoff_ms, last_ka_ms, watch_started_ms;
    struct etcd_watch *watch;
    struct view_node *tab;          /* the members, unsorted */
    size_t ntab, captab;
    char last_log[1024];            /* the last view logged */
};

static pthread_mutex_t member_global_lock = PTHREAD_MUTEX_INITIALIZER;
static struct member *member_global;

/* Counters, relaxed atomics: written by the member thread, read by anyone. */
static struct {
    uint64_t etcd_errors, lease_renewals, lease_lost, registrations, views, full_reads,
        watch_rearms, etcd_logins;
    int etcd_ok, registered, refused;
} member_ctr;

#define CTR_ADD(f) __atomic_add_fetch(&member_ctr.f, 1, __ATOMIC_RELAXED)
#define CTR_SET(f, v) __atomic_store_n(&member_ctr.f, (v), __ATOMIC_RELAXED)
#define CTR_GET(f) __atomic_load_n(&member_ctr.f, __ATOMIC_RELAXED)

static void member_step(struct member *m);

/* ---- small helpers ---- */

/* b64 of prefix + suffix into out; 0 or -E2BIG. */
static int
member_key64(const struct member *m, const char *suffix, char *out, size_t cap)
{
    char key[CONF_STR_MAX + 96];
    int n = snprintf(key, sizeof(key), "%s%s", m->prefix, suffix);

    if (n < 0 || (size_t)n >= sizeof(key)) {
        return -E2BIG;
    }
    return b64_encode(key, (size_t)n, out, cap) < 0 ? -E2BIG : 0;
}

static void
member_first_done(struct member *m, int rc)
{
    pthread_mutex_lock(&m->lock);
    if (m->first == MEMBER_FIRST_PENDING) {
        m->first = MEMBER_FIRST_DONE;
        m->first_rc = rc;
        pthread_cond_broadcast(&m->cond);
    }
    pthread_mutex_unlock(&m->lock);
}

/* A permanent refusal: one log line, no joining from now on. */
static void
member_refuse(struct member *m, int rc, const char *fmt, const char *detail)
{
    log_error(fmt, detail);
    m->refused = true;
    CTR_SET(refused, 1);
    member_first_done(m, rc);
}

static void
member_ok(struct member *m)
{
    CTR_SET(etcd_logins, etcd_logins(m->etcd));
    m->busy = false;
    m->backoff_ms = 0;
    CTR_SET(etcd_ok, 1);
}

/* A failed call: count it, back off, and say so once per outage. */
static void
member_fail(struct member *m, const char *what, int status, const char *body)
{
    m->busy = false;
    CTR_ADD(etcd_errors);
    if (status == -EPERM && (CTR_GET(etcd_ok) || m->backoff_ms == 0)) {
        log_error("cluster: etcd at %s refused the login as etcd_user %s: %.200s (see "
                  "etcd_user, etcd_password_file); serving on without etcd, retrying with "
                  "backoff", etcd_endpoint(m->etcd), m->etcd_user, body != NULL ? body : "");
    } else if (CTR_GET(etcd_ok) || m->backoff_ms == 0) {
        log_warn("cluster: etcd %s at %s failed: %s%s%.200s%s", what, etcd_endpoint(m->etcd),
                 status == -EIO ? "no answer" : status == -EACCES ? "TLS refused" :
                 status == -EPROTO ? "error answer" : "bad answer",
                 body != NULL ? ": " : "", body != NULL ? body : "",
                 status == -EACCES ? " (see etcd_tls_ca_file, etcd_tls_cert_file, "
                 "etcd_tls_key_file); serving on without etcd, retrying with backoff" : "");
    }
    CTR_SET(etcd_ok, 0);
    m->backoff_ms = m->backoff_ms == 0 ? MEMBER_BACKOFF_MIN_MS : m->backoff_ms * 2;
    if (m->backoff_ms > MEMBER_BACKOFF_MAX_MS) {
        m->backoff_ms = MEMBER_BACKOFF_MAX_MS;
    }
    m->next_try_ms = clock_ms() + m->backoff_ms;
    if (status == -EIO || status == -EACCES || status == -EPERM) {
        member_first_done(m, -EAGAIN);
    }
}

static int
member_call(struct member *m, const char *path, const char *body, etcd_done_fn *fn)
{
    int rc = etcd_call(m->etcd, path, body, fn, m);

    if (rc != 0) {
        member_fail(m, path, rc, NULL);
        return rc;
    }
    m->busy = true;
    return 0;
}

static void
member_lease_save(const struct member *m, uint64_t lease)
{
    FILE *f = fopen(m->lease_path, "w");

    if (f == NULL) {
        log_warn("cluster: cannot write %s: %s (a restart within etcd_lease_ttl may be refused "
                 "as a duplicate)", m->lease_path, strerror(errno));
        return;
    }
    fprintf(f, "%" PRIx64 " %ld\n", lease, (long)getpid());
    if (fclose(f) != 0) {
        log_warn("cluster: cannot write %s: %s", m->lease_path, strerror(errno));
    }
}

/*
 * member_lease_load: the lease this node's previous run registered under, from
 * <data_dir>/cluster_lease ("<lease hex> <pid>"), or 0 when there is none or that run is
 * still alive (its pid exists and is not us: two daemons on one data_dir are not a restart).
 */
static uint64_t
member_lease_load(const struct member *m)
{
    FILE *f = fopen(m->lease_path, "r");
    uint64_t v = 0;
    long pid = 0;

    if (f != NULL) {
        if (fscanf(f, "%" SCNx64 " %ld", &v, &pid) != 2) {
            v = 0;
        }
        fclose(f);
    }
    if (v != 0 && pid > 0 && pid != (long)getpid() && (kill((pid_t)pid, 0) == 0 ||
                                                      errno != ESRCH)) {
        return 0;
    }
    return v;
}

/* ---- the node value ---- */

static int
member_value(const struct member *m, enum view_state st, char *out, size_t cap)
{
    char id[160], addr[CONF_STR_MAX + 16], tls[CONF_STR_MAX + 16], w[32];
    int n;

    if (json_quote(m->node_id, id, sizeof(id)) < 0 ||
        json_quote(m->advertise, addr, sizeof(addr)) < 0 ||
        json_quote(m->tls, tls, sizeof(tls)) < 0) {
        return -E2BIG;
    }
    snprintf(w, sizeof(w), "%.17g", m->weight);
    n = snprintf(out, cap, "{\"id\":%s,\"addr\":%s,\"weight\":%s,\"state\":\"%s\",\"tls\":%s}",
                 id, addr, w, view_state_name(st), tls);
    return n < 0 || (size_t)n >= cap ? -E2BIG : 0;
}

/*
 * member_tls_addr: tls_listen as peers dial it: a wildcard host (0.0.0.0, ::, empty) is
 * replaced by peer_advertise's host. "" when there is no TLS listener.
 */
static void
member_tls_addr(const char *tls_listen, const char *advertise, char *out, size_t cap)
{
    const char *colon = strrchr(tls_listen, ':');
    const char *acolon = strrchr(advertise, ':');
    size_t hl = colon != NULL ? (size_t)(colon - tls_listen) : 0;

    out[0] = '\0';
    if (tls_listen[0] == '\0' || colon == NULL) {
        return;
    }
    if ((hl == 0 || (hl == 7 && memcmp(tls_listen, "0.0.0.0", 7) == 0)
         || (hl == 2 && memcmp(tls_listen, "::", 2) == 0)
         || (hl == 4 && memcmp(tls_listen, "[::]", 4) == 0)) && acolon != NULL) {
        snprintf(out, cap, "%.*s%s", (int)(acolon - advertise), advertise, colon);
    } else {
        snprintf(out, cap, "%s", tls_listen);
    }
}

/* Parse a node value (JSON) into nd; 0 or -EINVAL. */
static int
member_parse_value(const char *v, size_t len, struct view_node *nd)
{
    struct json_tok t[32];
    char state[16];

    memset(nd, 0, sizeof(*nd));
    if (json_parse(v, len, t, 32) <= 0 ||
        json_str(v, t, json_get(v, t, 0, "id"), nd->id, sizeof(nd->id)) <= 0 ||
        json_str(v, t, json_get(v, t, 0, "addr"), nd->addr, sizeof(nd->addr)) < 0 ||
        json_double(v, t, json_get(v, t, 0, "weight"), &nd->weight) != 0 ||
        json_str(v, t, json_get(v, t, 0, "state"), state, sizeof(state)) <= 0 ||
        view_state_parse(state, &nd->state) != 0 || !(nd->weight > 0.0)) {
        return -EINVAL;
    }
    int ti = json_get(v, t, 0, "tls");          /* absent (older members): no TLS */
    if (ti >= 0 && json_str(v, t, ti, nd->tls, sizeof(nd->tls)) < 0) {
        return -EINVAL;
    }
    return 0;
}

/* ---- the member table and views ---- */

static int
member_tab_find(const struct member *m, const char *id)
{
    for (size_t i = 0; i < m->ntab; i++) {
        if (strcmp(m->tab[i].id, id) == 0) {
            return (int)i;
        }
    }
    return -1;
}

static int
member_tab_put(struct member *m, const struct view_node *nd)
{
    int i = member_tab_find(m, nd->id);

    if (i >= 0) {
        m->tab[i] = *nd;
        return 0;
    }
    if (m->ntab == VIEW_NODES_MAX) {
        return -E2BIG;
    }
    if (m->ntab == m->captab) {
        size_t cap = m->captab == 0 ? 16 : m->captab * 2;
        struct view_node *t = realloc(m->tab, cap * sizeof(*t));

        if (t == NULL) {
            return -ENOMEM;
        }
        m->tab = t;
        m->captab = cap;
    }
    m->tab[m->ntab++] = *nd;
    return 0;
}

static void
member_tab_del(struct member *m, const char *id)
{
    int i = member_tab_find(m, id);

    if (i >= 0) {
        m->tab[i] = m->tab[--m->ntab];
    }
}

/* Publish the table as a view at m->revision, and log it when the members changed. */
static void
member_publish(struct member *m)
{
    struct cluster_view *v;
    char line[sizeof(m->last_log)];
    size_t used = 0;

    if (view_create(m->ntab, &v) != 0) {
        log_error("cluster: out of memory for a view of %zu members", m->ntab);
        return;
    }
    v->revision = m->revision;
    memcpy(v->nodes, m->tab, m->ntab * sizeof(*m->tab));
    view_seal(v, m->node_id);
    line[0] = '\0';
    for (size_t i = 0; i < v->n && used < sizeof(line); i++) {
        int k = snprintf(line + used, sizeof(line) - used, "%s%s(%s)", i ? " " : "",
                         v->nodes[i].id, view_state_name(v->nodes[i].state));

        used += k > 0 ? (size_t)k : 0;
    }
    if (strcmp(line, m->last_log) != 0) {
        log_info("cluster: view revision %" PRIu64 ": %zu members: %s", v->revision, v->n, line);
        snprintf(m->last_log, sizeof(m->last_log), "%s", line);
    }
    view_publish(v);
    CTR_ADD(views);
}

/* The node id of a key <prefix>/nodes/<id> (base64 in the answer), or -EINVAL. */
static int
member_key_id(const struct member *m, const char *text, const struct json_tok *t, int i,
              char *id, size_t cap)
{
    char k64[1024];
    uint8_t key[768];
    size_t klen, plen = strlen(m->prefix) + strlen("/nodes/");
    int n = json_str(text, t, i, k64, sizeof(k64));

    if (n <= 0 || b64_decode(k64, (size_t)n, key, sizeof(key) - 1, &klen) != 0 ||
        klen <= plen || klen - plen >= cap) {
        return -EINVAL;
    }
    key[klen] = '\0';
    if (memcmp(key, m->prefix, strlen(m->prefix)) != 0 ||
        memcmp(key + strlen(m->prefix), "/nodes/", 7) != 0) {
        return -EINVAL;
    }
    memcpy(id, key + plen, klen - plen + 1);
    return 0;
}

/* The node of a kv object {key, value, ...} of an answer; 0, or -EINVAL (logged). */
static int
member_kv_node(const struct member *m, const char *text, const struct json_tok *t, int kv,
               struct view_node *nd)
{
    char v64[B64_LEN(MEMBER_VALUE_MAX) + 1], id[65];
    uint8_t val[MEMBER_VALUE_MAX + 1];
    size_t vlen;
    int n;

    if (member_key_id(m, text, t, json_get(text, t, kv, "key"), id, sizeof(id)) != 0) {
        return -EINVAL;
    }
    n = json_str(text, t, json_get(text, t, kv, "value"), v64, sizeof(v64));
    if (n <= 0 || b64_decode(v64, (size_t)n, val, sizeof(val) - 1, &vlen) != 0 ||
        member_parse_value((const char *)val, vlen, nd) != 0 || strcmp(nd->id, id) != 0) {
        log_warn("cluster: ignoring member %s: its value is not a kvstash node", id);
        return -EINVAL;
    }
    return 0;
}

/* ---- watch ---- */

static void member_watch_start(struct member *m);

static void
member_on_watch_end(int status, void *arg)
{
    struct member *m = arg;

    /* The stream ended: watch again from the next revision (etcd replays what was missed,
     * or cancels with compact_revision when that history is gone: a full re-read). */
    if (status == -EKEYEXPIRED) {
        if (m->backoff_ms == 0) {       /* once in a row */
            log_info("cluster: the watch's etcd token was refused (expired, etcd restarted, "
                     "or its users changed); logging in again as %s", m->etcd_user);
        }
        m->backoff_ms = m->backoff_ms == 0 ? MEMBER_BACKOFF_MIN_MS : m->backoff_ms * 2;
        if (m->backoff_ms > MEMBER_BACKOFF_MAX_MS) {
            m->backoff_ms = MEMBER_BACKOFF_MAX_MS;
        }
        m->next_try_ms = clock_ms() + m->backoff_ms;
    } else if (status != 0) {
        CTR_ADD(etcd_errors);
        if (CTR_GET(etcd_ok)) {
            log_warn("cluster: the watch on %s/nodes/ ended (%s); watching again from revision "
                     "%" PRIu64, m->prefix, status == -EIO ? "no answer" :
                     status == -EACCES ? "TLS refused" : status == -EPERM ? "login refused" :
                     "bad answer",
                     m->revision + 1);
        }
        CTR_SET(etcd_ok, 0);
        m->backoff_ms = m->backoff_ms == 0 ? MEMBER_BACKOFF_MIN_MS : m->backoff_ms * 2;
        if (m->backoff_ms > MEMBER_BACKOFF_MAX_MS) {
            m->backoff_ms = MEMBER_BACKOFF_MAX_MS;
        }
        m->next_try_ms = clock_ms() + m->backoff_ms;
    }
    etcd_watch_stop(m->watch);
    m->watch = NULL;
    member_step(m);
}

/* A watch cancelled for its token: etcd 3.4's cancel_reason "rpc error: code =
 * Unauthenticated desc = etcdserver: invalid auth token" (and the others etcd.c logs in
 * again for). */
static bool
member_watch_token_refused(const char *line, const struct json_tok *t, int res)
{
    char why[256] = "";

    (void)json_str(line, t, json_get(line, t, res, "cancel_reason"), why, sizeof(why));
    return strstr(why, "invalid auth token") != NULL || strstr(why, "user name is empty") != NULL
           || strstr(why, "revision of auth store is old") != NULL;
}

static void
member_on_watch_line(const char *line, size_t len, void *arg)
{
    struct member *m = arg;
    struct json_tok *t = malloc(MEMBER_TOKENS(len) * sizeof(*t));
    int n, res, evs;
    uint64_t compact = 0, last = m->revision;
    bool changed = false;

    if (t == NULL || (n = json_parse(line, len, t, MEMBER_TOKENS(len))) <= 0 ||
        (res = json_get(line, t, 0, "result")) < 0) {
        log_warn("cluster: a watch message that is not etcd's: %.200s", line);
        free(t);
        etcd_watch_stop(m->watch);
        m->watch = NULL;
        m->listed = false;
        member_step(m);
        return;
    }
    if (json_get(line, t, res, "canceled") >= 0 && member_watch_token_refused(line, t, res)) {
        /* created and cancelled at once for its token (expired, or etcd restarted): log in
         * again and watch from the same revision, after the backoff of a failed watch */
        free(t);
        etcd_login_again(m->etcd);
        member_on_watch_end(-EKEYEXPIRED, m);
        return;
    }
    if (json_get(line, t, res, "created") >= 0) {
        CTR_SET(etcd_ok, 1);
        m->backoff_ms = 0;
    }
    if (json_get(line, t, res, "canceled") >= 0) {
        if (compact == 0) {
            (void)json_u64(line, t, json_get(line, t, res, "compact_revision"), &compact);
        }
        log_info("cluster: the watch from revision %" PRIu64 " was cancelled%s%" PRIu64 "; "
                 "reading the members again", m->revision + 1,
                 compact ? ": history compacted up to revision " : "", compact);
        free(t);
        etcd_watch_stop(m->watch);
        m->watch = NULL;
        m->listed = false;
        member_step(m);
        return;
    }
    evs = json_get(line, t, res, "events");
    for (uint32_t i = 0; evs >= 0 && i < t[evs].count; i++) {
        int ev = json_at(t, evs, i), kv = json_get(line, t, ev, "kv");
        char type[16] = "PUT", id[65];
        uint64_t mod = 0;
        struct view_node nd;

        (void)json_str(line, t, json_get(line, t, ev, "type"), type, sizeof(type));
        (void)json_u64(line, t, json_get(line, t, kv, "mod_revision"), &mod);
        if (mod > last) {
            last = mod;
        }
        if (strcmp(type, "DELETE") == 0) {
            if (member_key_id(m, line, t, json_get(line, t, kv, "key"), id, sizeof(id)) == 0) {
                member_tab_del(m, id);
                changed = true;
            }
        } else if (member_kv_node(m, line, t, kv, &nd) == 0) {
            changed |= member_tab_put(m, &nd) == 0;
        }
    }
    free(t);
    if (changed) {
        m->revision = last;
        member_publish(m);
    } else if (last > m->revision) {
        m->revision = last;
    }
}

static void
member_watch_start(struct member *m)
{
    char body[MEMBER_BODY_MAX], from[128], to[128];
    int rc;

    if (member_key64(m, "/nodes/", from, sizeof(from)) != 0 ||
        member_key64(m, "/nodes0", to, sizeof(to)) != 0) {
        return;
    }
    snprintf(body, sizeof(body),
             "{\"create_request\":{\"key\":\"%s\",\"range_end\":\"%s\",\"start_revision\":"
             "\"%" PRIu64 "\"}}", from, to, m->revision + 1);
    /* idle timeout: the re-arm period (the lease TTL) and one more, so it is never hit */
    rc = etcd_watch_start(m->etcd, body, 2 * m->ttl_ms, member_on_watch_line,
                          member_on_watch_end, m, &m->watch);
    if (rc != 0) {
        m->watch = NULL;
        m->listed = false;
        member_fail(m, "watch", rc, NULL);
        return;
    }
    m->watch_started_ms = clock_ms();
}

/* ---- the calls, each with its answer ---- */

static void
member_on_list(int status, const char *body, size_t len, void *arg)
{
    struct member *m = arg;
    struct json_tok *t;
    int n, kvs;
    uint64_t rev = 0;

    if (status != 0) {
        member_fail(m, "range of the members", status, body);
        member_step(m);
        return;
    }
    t = malloc(MEMBER_TOKENS(len) * sizeof(*t));
    if (t == NULL || (n = json_parse(body, len, t, MEMBER_TOKENS(len))) <= 0 ||
        json_u64(body, t, json_get(body, t, json_get(body, t, 0, "header"), "revision"),
                 &rev) != 0) {
        free(t);
        member_fail(m, "range of the members", -EPROTO, body);
        member_step(m);
        return;
    }
    member_ok(m);
    m->ntab = 0;
    kvs = json_get(body, t, 0, "kvs");
    for (uint32_t i = 0; kvs >= 0 && i < t[kvs].count; i++) {
        struct view_node nd;

        if (member_kv_node(m, body, t, json_at(t, kvs, i), &nd) == 0) {
            (void)member_tab_put(m, &nd);
        }
    }
    free(t);
    m->revision = rev;
    m->listed = true;
    CTR_ADD(full_reads);
    member_publish(m);
    member_step(m);
}

static void
member_list(struct member *m)
{
    char body[MEMBER_BODY_MAX], from[128], to[128];

    if (m->watch != NULL) {
        etcd_watch_stop(m->watch);
        m->watch = NULL;
    }
    if (member_key64(m, "/nodes/", from, sizeof(from)) != 0 ||
        member_key64(m, "/nodes0", to, sizeof(to)) != 0) {
        return;
    }
    snprintf(body, sizeof(body), "{\"key\":\"%s\",\"range_end\":\"%s\"}", from, to);
    (void)member_call(m, "/v3/kv/range", body, member_on_list);
}

static void
member_on_config(int status, const char *body, size_t len, void *arg)
{
    struct member *m = arg;
    struct json_tok t[128];
    int n, resp, kvs, kv;
    char v64[1024], hash[128];
    uint8_t val[768];
    size_t vlen;
    uint64_t replicas = 0;

    if (status != 0 || (n = json_parse(body, len, t, 128)) <= 0) {
        member_fail(m, "txn of the pool's config", status != 0 ? status : -EPROTO, body);
        member_step(m);
        return;
    }
    member_ok(m);
    if (json_get(body, t, 0, "succeeded") >= 0) {
        log_info("cluster: wrote %s/config (replicas %u, hash %s)", m->prefix, m->replicas,
                 MEMBER_HASH_NAME);
        m->config_ok = true;
        member_step(m);
        return;
    }
    /* It existed: responses[0].response_range.kvs[0].value */
    resp = json_get(body, t, json_at(t, json_get(body, t, 0, "responses"), 0), "response_range");
    kvs = json_get(body, t, resp, "kvs");
    kv = json_at(t, kvs, 0);
    n = json_str(body, t, json_get(body, t, kv, "value"), v64, sizeof(v64));
    if (n <= 0 || b64_decode(v64, (size_t)n, val, sizeof(val) - 1, &vlen) != 0 ||
        (n = json_parse((const char *)val, vlen, t, 128)) <= 0 ||
        json_u64((const char *)val, t, json_get((const char *)val, t, 0, "replicas"),
                 &replicas) != 0 ||
        json_str((const char *)val, t, json_get((const char *)val, t, 0, "hash"), hash,
                 sizeof(hash)) <= 0) {
        member_refuse(m, -EINVAL, "cluster: %s: not a kvstash pool's config: refusing to join",
                      m->prefix);
        return;
    }
    if (replicas != m->replicas || strcmp(hash, MEMBER_HASH_NAME) != 0) {
        char why[1024];

        snprintf(why, sizeof(why), "%s/config has replicas %" PRIu64 " and hash %s, this node "
                 "replicas %u and hash %s", m->prefix, replicas, hash, m->replicas,
                 MEMBER_HASH_NAME);
        member_refuse(m, -EINVAL, "cluster: the pool's config differs: %s: refusing to join",
                      why);
        return;
    }
    m->config_ok = true;
    member_step(m);
}

static void
member_config(struct member *m)
{
    char body[MEMBER_BODY_MAX], k64[128], val[256], v64[B64_LEN(256) + 1];

    snprintf(val, sizeof(val), "{\"replicas\":%u,\"hash\":\"%s\"}", m->replicas,
             MEMBER_HASH_NAME);
    if (member_key64(m, "/config", k64, sizeof(k64)) != 0 ||
        b64_encode(val, strlen(val), v64, sizeof(v64)) < 0) {
        return;
    }
    snprintf(body, sizeof(body),
             "{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"result\":\"EQUAL\","
             "\"create_revision\":\"0\"}],\"success\":[{\"request_put\":{\"key\":\"%s\","
             "\"value\":\"%s\"}}],\"failure\":[{\"request_range\":{\"key\":\"%s\"}}]}",
             k64, k64, v64, k64);
    (void)member_call(m, "/v3/kv/txn", body, member_on_config);
}

static void
member_on_grant(int status, const char *body, size_t len, void *arg)
{
    struct member *m = arg;
    struct json_tok t[32];
    uint64_t id = 0;

    if (status != 0 || json_parse(body, len, t, 32) <= 0 ||
        json_u64(body, t, json_get(body, t, 0, "ID"), &id) != 0 || id == 0) {
        member_fail(m, "lease grant", status != 0 ? status : -EPROTO, body);
        member_step(m);
        return;
    }
    member_ok(m);
    m->lease = id;
    m->last_ka_ms = clock_ms();
    member_step(m);
}

static void
member_grant(struct member *m)
{
    char body[128];

    snprintf(body, sizeof(body), "{\"TTL\":\"%" PRIu64 "\"}", m->ttl_ms / 1000);
    (void)member_call(m, "/v3/lease/grant", body, member_on_grant);
}

static void
member_on_revoke_old(int status, const char *body, size_t len, void *arg)
{
    struct member *m = arg;

    (void)len;
    if (status != 0 && status != -EPROTO) {     /* -EPROTO: it had expired meanwhile */
        member_fail(m, "revoke of the previous run's lease", status, body);
        member_step(m);
        return;
    }
    member_ok(m);
    log_info("cluster: revoked lease %" PRIx64 " of this node's previous run", m->old_lease);
    m->old_lease = 0;
    member_step(m);
}

static void
member_on_register(int status, const char *body, size_t len, void *arg)
{
    struct member *m = arg;
    struct json_tok t[128];
    int resp, kv;
    uint64_t lease = 0;

    if (status != 0 || json_parse(body, len, t, 128) <= 0) {
        if (status == -EPROTO && body != NULL && strstr(body, "lease not found") != NULL) {
            m->lease = 0;           /* expired before we used it */
            member_ok(m);
        } else {
            member_fail(m, "registration", status != 0 ? status : -EPROTO, body);
        }
        member_step(m);
        return;
    }
    member_ok(m);
    if (json_get(body, t, 0, "succeeded") >= 0) {
        m->registered = true;
        m->reg_state = m->goal;
        CTR_SET(registered, 1);
        CTR_ADD(registrations);
        member_lease_save(m, m->lease);
        log_info("cluster: registered %s/nodes/%s (%s, lease %" PRIx64 ", ttl %" PRIu64 " s) "
                 "at %s", m->prefix, m->node_id, view_state_name(m->reg_state), m->lease,
                 m->ttl_ms / 1000, etcd_endpoint(m->etcd));
        member_first_done(m, 0);
        member_step(m);
        return;
    }
    resp = json_get(body, t, json_at(t, json_get(body, t, 0, "responses"), 0), "response_range");
    kv = json_at(t, json_get(body, t, resp, "kvs"), 0);
    (void)json_u64(body, t, json_get(body, t, kv, "lease"), &lease);
    if (kv >= 0 && lease != 0 && lease != m->lease && lease == member_lease_load(m)) {
        m->old_lease = lease;       /* our own previous run: revoke it, then register */
        member_step(m);
        return;
    }
    if (kv < 0) {
        member_step(m);             /* gone meanwhile: try again */
        return;
    }
    member_refuse(m, -EEXIST, "cluster: node_id %s is already registered in the pool by another "
                  "live daemon: refusing to start (give each daemon its own node_id)",
                  m->node_id);
}

static void
member_register(struct member *m)
{
    char body[MEMBER_BODY_MAX], k64[256], val[MEMBER_VALUE_MAX], v64[B64_LEN(MEMBER_VALUE_MAX) + 1];
    char suffix[96];

    if (m->old_lease != 0) {
        snprintf(body, sizeof(body), "{\"ID\":\"%" PRIu64 "\"}", m->old_lease);
        (void)member_call(m, "/v3/lease/revoke", body, member_on_revoke_old);
        return;
    }
    snprintf(suffix, sizeof(suffix), "/nodes/%s", m->node_id);
    if (member_key64(m, suffix, k64, sizeof(k64)) != 0 ||
        member_value(m, m->goal, val, sizeof(val)) != 0 ||
        b64_encode(val, strlen(val), v64, sizeof(v64)) < 0) {
        return;
    }
    snprintf(body, sizeof(body),
             "{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"result\":\"EQUAL\","
             "\"create_revision\":\"0\"}],\"success\":[{\"request_put\":{\"key\":\"%s\","
             "\"value\":\"%s\",\"lease\":\"%" PRIu64 "\"}}],\"failure\":[{\"request_range\":"
             "{\"key\":\"%s\"}}]}", k64, k64, v64, m->lease, k64);
    (void)member_call(m, "/v3/kv/txn", body, member_on_register);
}

static void
member_on_update(int status, const char *body, size_t len, void *arg)
{
    struct member *m = arg;
    struct json_tok t[64];

    if (status == -EPROTO && body != NULL && strstr(body, "lease not found") != NULL) {
        member_ok(m);
        log_warn("cluster: lease %" PRIx64 " expired; registering again", m->lease);
        CTR_ADD(lease_lost);
        m->lease = 0;
        m->registered = false;
        CTR_SET(registered, 0);
        member_step(m);
        return;
    }
    if (status != 0 || json_parse(body, len, t, 64) <= 0) {
        member_fail(m, "state update", status != 0 ? status : -EPROTO, body);
        member_step(m);
        return;
    }
    member_ok(m);
    if (json_get(body, t, 0, "succeeded") < 0) {
        /* our key is gone (lease expired just now): register again */
        m->registered = false;
        CTR_SET(registered, 0);
        member_step(m);
        return;
    }
    m->reg_state = m->goal;
    log_info("cluster: %s is %s", m->node_id, view_state_name(m->reg_state));
    member_step(m);
}

/* Our key's state changes: a put under our lease, only while the key exists. */
static void
member_update(struct member *m)
{
    char body[MEMBER_BODY_MAX], k64[256], val[MEMBER_VALUE_MAX], v64[B64_LEN(MEMBER_VALUE_MAX) + 1];
    char suffix[96];

    snprintf(suffix, sizeof(suffix), "/nodes/%s", m->node_id);
    if (member_key64(m, suffix, k64, sizeof(k64)) != 0 ||
        member_value(m, m->goal, val, sizeof(val)) != 0 ||
        b64_encode(val, strlen(val), v64, sizeof(v64)) < 0) {
        return;
    }
    snprintf(body, sizeof(body),
             "{\"compare\":[{\"key\":\"%s\",\"target\":\"LEASE\",\"result\":\"EQUAL\","
             "\"lease\":\"%" PRIu64 "\"}],\"success\":[{\"request_put\":{\"key\":\"%s\","
             "\"value\":\"%s\",\"lease\":\"%" PRIu64 "\"}}]}", k64, m->lease, k64, v64, m->lease);
    (void)member_call(m, "/v3/kv/txn", body, member_on_update);
}

static void
member_on_keepalive(int status, const char *body, size_t len, void *arg)
{
    struct member *m = arg;
    struct json_tok t[32];
    uint64_t ttl = 0;

    if (status != 0 || json_parse(body, len, t, 32) <= 0) {
        member_fail(m, "lease keepalive", status != 0 ? status : -EPROTO, body);
        member_step(m);
        return;
    }
    member_ok(m);
    m->last_ka_ms = clock_ms();
    (void)json_u64(body, t, json_get(body, t, json_get(body, t, 0, "result"), "TTL"), &ttl);
    if (ttl == 0) {
        log_warn("cluster: lease %" PRIx64 " of %s was lost (etcd let it expire); registering "
                 "again", m->lease, m->node_id);
        CTR_ADD(lease_lost);
        m->lease = 0;
        m->registered = false;
        CTR_SET(registered, 0);
    } else {
        CTR_ADD(lease_renewals);
    }
    member_step(m);
}

static void
member_keepalive(struct member *m)
{
    char body[128];

    snprintf(body, sizeof(body), "{\"ID\":\"%" PRIu64 "\"}", m->lease);
    (void)member_call(m, "/v3/lease/keepalive", body, member_on_keepalive);
}

static void
member_on_revoke(int status, const char *body, size_t len, void *arg)
{
    struct member *m = arg;

    (void)body;
    (void)len;
    m->busy = false;
    m->registered = false;
    CTR_SET(registered, 0);
    m->lease = 0;
    member_lease_save(m, 0);
    if (status == 0 || status == -EPROTO) {
        log_info("cluster: %s left the pool (lease revoked)", m->node_id);
    } else {
        log_warn("cluster: could not revoke the lease of %s (etcd: no answer); its key goes "
                 "when the lease expires", m->node_id);
    }
    if (m->stopping) {
        event_base_loopbreak(m->base);
        return;
    }
    member_step(m);
}

static void
member_revoke(struct member *m)
{
    char body[128];

    snprintf(body, sizeof(body), "{\"ID\":\"%" PRIu64 "\"}", m->lease);
    if (member_call(m, "/v3/lease/revoke", body, member_on_revoke) != 0 && m->stopping) {
        event_base_loopbreak(m->base);
    }
}

/* ---- the step ---- */

static void
member_arm_tick(struct member *m, uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000 * 1000)};

    evtimer_add(m->tick, &tv);
}

static void
member_step(struct member *m)
{
    uint64_t now = clock_ms();
    bool leave, stop, drain_now = false;
    member_drain_fn *hook = NULL;
    void *hook_arg = NULL;
    member_ready_fn *ready;
    void *ready_arg;
    char why[256] = "";

    pthread_mutex_lock(&m->lock);
    m->want = m->draining ? VIEW_DRAINING : m->want;
    m->goal = m->want;
    leave = m->leave;
    stop = m->stop;
    ready = m->ready_fn;
    ready_arg = m->ready_arg;
    pthread_mutex_unlock(&m->lock);
    if (m->goal == VIEW_ACTIVE && ready != NULL && !ready(ready_arg, why, sizeof(why))) {
        m->goal = VIEW_JOINING;     /* not an owner until the check passes */
        if (!m->held) {
            log_info("cluster: %s stays joining until %s", m->node_id, why);
        }
        m->held = true;
    } else if (m->held) {
        m->held = false;
        log_info("cluster: %s is ready to own keys", m->node_id);
    }

    if (m->busy) {
        return;                     /* its answer steps again */
    }
    if (stop) {
        if (!m->stopping) {
            m->stopping = true;
            if (m->registered && m->lease != 0) {
                member_revoke(m);
                return;
            }
            event_base_loopbreak(m->base);
        }
        return;
    }
    if (m->refused) {
        return;
    }
    if (m->watch != NULL && now - m->watch_started_ms >= m->ttl_ms) {
        /* re-arm before the idle timeout (2 x ttl), from the next revision */
        etcd_watch_stop(m->watch);
        m->watch = NULL;
        CTR_ADD(watch_rearms);
        member_watch_start(m);
    }
    if (now < m->next_try_ms) {
        member_arm_tick(m, m->next_try_ms - now);
        return;
    }
    if (!m->config_ok) {
        member_config(m);
    } else if (leave && !m->left) {
        if (m->registered && m->lease != 0) {
            m->left = true;
            member_revoke(m);
        } else {
            m->left = true;
            member_step(m);
        }
    } else if (!m->left && m->lease == 0) {
        member_grant(m);
    } else if (!m->left && !m->registered) {
        member_register(m);
    } else if (!m->left && m->reg_state != m->goal) {
        member_update(m);
    } else if (!m->listed) {
        member_list(m);
    } else if (m->watch == NULL) {
        member_watch_start(m);
    }
    if (m->busy) {
        /* a call went out */
    } else if (!m->left && m->lease != 0 && now - m->last_ka_ms >= m->ttl_ms / 3) {
        member_keepalive(m);
    }
    if (m->registered && m->reg_state == VIEW_DRAINING && !m->drain_told) {
        pthread_mutex_lock(&m->lock);
        hook = m->drain_fn;
        hook_arg = m->drain_arg;
        pthread_mutex_unlock(&m->lock);
        m->drain_told = true;
        drain_now = true;
    }
    if (!m->busy) {
        uint64_t due = m->ttl_ms / 3 - (now - m->last_ka_ms < m->ttl_ms / 3 ?
                                         now - m->last_ka_ms : m->ttl_ms / 3);

        if (m->held) {
            due = MEMBER_TICK_MS;   /* look at the ready check again soon */
        }
        member_arm_tick(m, due < MEMBER_TICK_MS ? MEMBER_TICK_MS : due);
    } else {
        member_arm_tick(m, m->ttl_ms / 3);     /* the re-arm check runs even while busy */
    }
    if (drain_now) {
        log_info("cluster: %s is draining: handing its keys off", m->node_id);
        if (hook != NULL) {
            hook(hook_arg);
        }
    }
}

static void
member_on_event(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    member_step(arg);
}

static void *
member_main(void *arg)
{
    struct member *m = arg;

    member_step(m);
    event_base_dispatch(m->base);
    if (m->watch != NULL) {
        etcd_watch_stop(m->watch);
        m->watch = NULL;
    }
    return NULL;
}

/* ---- the public side ---- */

static void
member_destroy(struct member *m)
{
    if (m == NULL) {
        return;
    }
    etcd_destroy(m->etcd);
    if (m->kick != NULL) {
        event_free(m->kick);
    }
    if (m->tick != NULL) {
        event_free(m->tick);
    }
    if (m->base != NULL) {
        event_base_free(m->base);
    }
    pthread_mutex_destroy(&m->lock);
    pthread_cond_destroy(&m->cond);
    free(m->tab);
    free(m);
}

int
member_start(const struct kv_config *c, const char *node_id, struct member **out)
{
    struct member *m = calloc(1, sizeof(*m));
    struct etcd_tls_files tls = {c->etcd_tls_ca_file, c->etcd_tls_cert_file,
                                 c->etcd_tls_key_file};
    char why[512];
    uint64_t timeout;
    int rc;

    if (m == NULL) {
        return -ENOMEM;
    }
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->cond, NULL);
    snprintf(m->node_id, sizeof(m->node_id), "%s", node_id);
    snprintf(m->cluster, sizeof(m->cluster), "%.64s", c->cluster_name);
    snprintf(m->prefix, sizeof(m->prefix), "%s", c->etcd_prefix);
    snprintf(m->advertise, sizeof(m->advertise), "%s", c->peer_advertise);
    member_tls_addr(c->tls_listen, c->peer_advertise, m->tls, sizeof(m->tls));
    snprintf(m->lease_path, sizeof(m->lease_path), "%s/cluster_lease", c->data_dir);
    m->ttl_ms = c->etcd_lease_ttl;
    m->replicas = (unsigned)c->replicas;
    m->weight = c->node_weight;
    m->want = VIEW_JOINING;
    m->reg_state = VIEW_JOINING;
    m->first = MEMBER_FIRST_PENDING;
    /* one call must end well within a keepalive period */
    timeout = m->ttl_ms / 3 < 1000 ? 1000 : m->ttl_ms / 3;
    m->base = event_base_new();
    if (m->base == NULL) {
        member_destroy(m);
        return -ENOMEM;
    }
    rc = etcd_create(m->base, c->etcd_endpoints, &tls, timeout, &m->etcd, why, sizeof(why));
    if (rc != 0) {
        log_error("cluster: etcd_endpoints '%s': %s", c->etcd_endpoints, why);
        member_destroy(m);
        return rc;
    }
    snprintf(m->etcd_user, sizeof(m->etcd_user), "%s", c->etcd_user);
    rc = etcd_set_login(m->etcd, c->etcd_user, c->etcd_password_file, why, sizeof(why));
    if (rc != 0) {
        log_error("cluster: %s: refusing to start (etcd_user %s logs in with it)", why,
                  c->etcd_user);
        member_destroy(m);
        return -EINVAL;
    }
    m->kick = event_new(m->base, -1, 0, member_on_event, m);
    m->tick = evtimer_new(m->base, member_on_event, m);
    if (m->kick == NULL || m->tick == NULL) {
        member_destroy(m);
        return -ENOMEM;
    }
    pthread_mutex_lock(&member_global_lock);
    if (member_global != NULL) {
        pthread_mutex_unlock(&member_global_lock);
        member_destroy(m);
        return -EBUSY;
    }
    member_global = m;
    pthread_mutex_unlock(&member_global_lock);
    memset(&member_ctr, 0, sizeof(member_ctr));
    rc = pthread_create(&m->thread, NULL, member_main, m);
    if (rc != 0) {
        pthread_mutex_lock(&member_global_lock);
        member_global = NULL;
        pthread_mutex_unlock(&member_global_lock);
        member_destroy(m);
        return -rc;
    }
    m->thread_started = true;
    log_info("cluster: joining pool %s as %s (advertising %s, etcd %s%s%s, prefix %s)",
             m->cluster, m->node_id, m->advertise, c->etcd_endpoints,
             m->etcd_user[0] != '\0' ? " as user " : "", m->etcd_user, m->prefix);
    *out = m;
    return 0;
}

int
member_wait_first(struct member *m, uint64_t timeout_ms)
{
    struct timespec until;
    int rc = 0;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)(timeout_ms / 1000);
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&m->lock);
    while (m->first == MEMBER_FIRST_PENDING && rc == 0) {
        rc = pthread_cond_timedwait(&m->cond, &m->lock, &until);
    }
    rc = m->first == MEMBER_FIRST_DONE ? m->first_rc : -EAGAIN;
    pthread_mutex_unlock(&m->lock);
    return rc;
}

/* Run f on the global member under its lock, then wake its thread. */
static void
member_poke(void (*f)(struct member *, void *), void *arg)
{
    pthread_mutex_lock(&member_global_lock);
    if (member_global != NULL) {
        pthread_mutex_lock(&member_global->lock);
        f(member_global, arg);
        pthread_mutex_unlock(&member_global->lock);
        event_active(member_global->kick, 0, 0);
    }
    pthread_mutex_unlock(&member_global_lock);
}

static void
member_do_state(struct member *m, void *arg)
{
    m->want = *(enum view_state *)arg;
    if (m->want == VIEW_DRAINING) {
        m->draining = true;
    }
}

void
member_set_state(enum view_state s)
{
    member_poke(member_do_state, &s);
}

static void
member_do_hook(struct member *m, void *arg)
{
    void **fa = arg;

    m->drain_fn = (member_drain_fn *)(uintptr_t)fa[0];
    m->drain_arg = fa[1];
}

void
member_set_drain_hook(member_drain_fn *fn, void *arg)
{
    void *fa[2] = {(void *)(uintptr_t)fn, arg};

    member_poke(member_do_hook, fa);
}

static void
member_do_ready(struct member *m, void *arg)
{
    void **fa = arg;

    m->ready_fn = (member_ready_fn *)(uintptr_t)fa[0];
    m->ready_arg = fa[1];
}

void
member_set_ready_check(member_ready_fn *fn, void *arg)
{
    void *fa[2] = {(void *)(uintptr_t)fn, arg};

    member_poke(member_do_ready, fa);
}

void
member_drain(void)
{
    member_set_state(VIEW_DRAINING);
}

bool
member_draining(void)
{
    bool d = false;

    pthread_mutex_lock(&member_global_lock);
    if (member_global != NULL) {
        pthread_mutex_lock(&member_global->lock);
        d = member_global->draining;
        pthread_mutex_unlock(&member_global->lock);
    }
    pthread_mutex_unlock(&member_global_lock);
    return d;
}

static void
member_do_leave(struct member *m, void *arg)
{
    (void)arg;
    m->leave = true;
}

void
member_leave(void)
{
    member_poke(member_do_leave, NULL);
}

static void
member_do_stop(struct member *m, void *arg)
{
    (void)arg;
    m->stop = true;
}

void
member_stop(struct member *m)
{
    struct timeval second = {1, 0};

    if (m == NULL) {
        return;
    }
    if (m->thread_started) {
        member_poke(member_do_stop, NULL);
        /* the revoke gets a second; then the loop ends anyway */
        event_base_loopexit(m->base, &second);
        pthread_join(m->thread, NULL);
    }
    pthread_mutex_lock(&member_global_lock);
    member_global = NULL;
    pthread_mutex_unlock(&member_global_lock);
    view_publish(NULL);
    member_destroy(m);
}

void
member_stats(struct member_stats *out)
{
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&member_global_lock);
    if (member_global != NULL) {
        struct member *m = member_global;
        member_ready_fn *ready;
        void *ready_arg;
        char why[256];

        out->in_pool = true;
        pthread_mutex_lock(&m->lock);
        out->state = m->want;
        ready = m->ready_fn;
        ready_arg = m->ready_arg;
        pthread_mutex_unlock(&m->lock);
        if (out->state == VIEW_ACTIVE && ready != NULL && !ready(ready_arg, why, sizeof(why))) {
            out->state = VIEW_JOINING;
        }
        snprintf(out->cluster, sizeof(out->cluster), "%s", m->cluster);
        snprintf(out->prefix, sizeof(out->prefix), "%s", m->prefix);
        snprintf(out->endpoint, sizeof(out->endpoint), "%s", etcd_endpoint(m->etcd));
        out->replicas = m->replicas;
    }
    pthread_mutex_unlock(&member_global_lock);
    out->registered = CTR_GET(registered);
    out->etcd_ok = CTR_GET(etcd_ok);
    out->refused = CTR_GET(refused);
    out->etcd_errors = CTR_GET(etcd_errors);
    out->lease_renewals = CTR_GET(lease_renewals);
    out->lease_lost = CTR_GET(lease_lost);
    out->registrations = CTR_GET(registrations);
    out->views = CTR_GET(views);
    out->full_reads = CTR_GET(full_reads);
    out->watch_rearms = CTR_GET(watch_rearms);
    out->etcd_logins = CTR_GET(etcd_logins);
}

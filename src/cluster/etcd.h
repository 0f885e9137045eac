/*
 * etcd: a small client of etcd's v3 JSON gateway (POST /v3/kv/range, /v3/kv/put,
 * /v3/kv/txn, /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke, /v3/watch) over
 * HTTP/1.1 with libevent's evhttp: no gRPC. It moves JSON bodies and nothing else; the
 * requests and answers themselves are member.c's (base64 keys and values, 64-bit numbers as
 * strings, fields at their default omitted: json.h and b64.h read and write them).
 *
 * Threads: a struct etcd belongs to the thread running its event_base; every function and
 * every callback runs there. Calls go out on one keep-alive connection per endpoint, in
 * order (an https:// endpoint: a TLS connection per call); a call that fails at the
 * transport (refused, reset, timed out, TLS refused) moves later calls to the next endpoint
 * of the list. A watch has a connection of its own.
 *
 * With etcd authentication (etcd_set_login) every call and watch carries a token got from
 * POST /v3/auth/authenticate; a token etcd no longer takes (expired, etcd restarted, the
 * users or roles changed) is replaced by a new login and the call sent again, once.
 */
#ifndef ETCD_H
#define ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct etcd;
struct etcd_watch;

#define ETCD_BODY_MAX (4u << 20)    /* the largest answer (or watch line) taken */
#define ETCD_PASSWORD_MAX 1024      /* the longest password taken from etcd_password_file */

/*
 * etcd_done_fn: a call's outcome. status 0: HTTP 200, body[0..len) the answer, NUL-terminated,
 * valid during the callback only. -EIO: no
 * answer (refused, reset, timed out; body NULL); -EACCES: TLS failed (body is the reason:
 * "its certificate: ..." when etcd's certificate does not chain to the CAs or is not for
 * the endpoint's host, else OpenSSL's, e.g. an alert when etcd refused this node's
 * certificate); -EPROTO: an HTTP status other than 200
 * (body is etcd's error JSON, e.g. {"error":"etcdserver: requested lease not found",...});
 * -E2BIG: an answer over ETCD_BODY_MAX; -EPERM: etcd refused the login (etcd_set_login's user
 * and password), body is etcd's reason ("etcdserver: authentication failed, invalid user ID
 * or password"). A call whose token etcd refused is sent again after a new login, once; a
 * second refusal is its -EPROTO.
 */
typedef void etcd_done_fn(int status, const char *body, size_t len, void *arg);

/* The PEM files of TLS to etcd (each borrowed; NULL or "" = not set). */
struct etcd_tls_files {
    const char *ca;                 /* CAs etcd's certificate must chain to; "": the system's */
    const char *cert;               /* this node's certificate chain, presented when etcd asks */
    const char *key;                /* (--client-cert-auth), and its key */
};

/*
 * etcd_create: a client of endpoints (the etcd_endpoints config text: comma list of
 * http://host:port or https://host:port) on base. tls: the files https:// endpoints use
 * (read here, once; NULL: the system's CAs, no client certificate); the server's
 * certificate must chain to the CAs and name the endpoint's host (an IP address in its IP
 * SANs, a name in its DNS names). timeout_ms: the bound of one call (connect and answer).
 * Returns 0, -EINVAL (no endpoint, a bad one, a TLS file that cannot be used), -ENOMEM;
 * the reason in err. base is borrowed and must outlive the client.
 */
int etcd_create(struct event_base *base, const char *endpoints, const struct etcd_tls_files *tls,
                uint64_t timeout_ms, struct etcd **out, char *err, size_t errlen);

/*
 * etcd_set_login: log in to etcd as user with the password on the first line of
 * password_file (a regular file of mode 0600 or stricter, 1 to ETCD_PASSWORD_MAX bytes; read
 * here, once), before the first call and again whenever etcd refuses the token. user NULL or
 * "": no login (the default). Call it before the first call. Returns 0, or -ENOENT / -EACCES
 * / -EINVAL / -errno with the reason, naming the file, in err (never the password).
 */
int etcd_set_login(struct etcd *e, const char *user, const char *password_file, char *err,
                   size_t errlen);

/* etcd_logins: the logins etcd answered with a token since etcd_create. */
uint64_t etcd_logins(const struct etcd *e);

/* etcd_login_again: the token is stale (a watch was cancelled for it): the next call or
 * watch logs in first. No-op without a login. */
void etcd_login_again(struct etcd *e);

/* etcd_destroy: drop pending calls (their callbacks never run) and watches. NULL is fine. */
void etcd_destroy(struct etcd *e);

/*
 * etcd_call: POST json (NUL-terminated, copied) to path ("/v3/kv/range") on the current
 * endpoint; fn(status, body, len, arg) runs once on the loop thread, later (never inside this
 * call). With a login and no token yet the call waits for the login (started here when none
 * is in flight). Returns 0, or -ENOMEM / -EIO / -EINVAL (the login could not be queued) when
 * the request could not be queued (fn never runs).
 */
int etcd_call(struct etcd *e, const char *path, const char *json, etcd_done_fn *fn, void *arg);

/* etcd_endpoint: the endpoint calls go to now ("http://127.0.0.1:2379"). */
const char *etcd_endpoint(const struct etcd *e);

/* A watch's lines: each line the gateway streams (one JSON object), without its newline. */
typedef void etcd_line_fn(const char *line, size_t len, void *arg);

/* A watch's end: the stream closed (0), failed (-EIO: reset, timed out; -EACCES: TLS
 * refused; -EPERM: the login it waited for was refused), or a line over ETCD_BODY_MAX (-E2BIG). After it, the watch is stopped: call etcd_watch_stop. */
typedef void etcd_end_fn(int status, void *arg);

/*
 * etcd_watch_start: POST json to /v3/watch on a new connection whose read timeout is
 * idle_ms (the caller re-arms before it: a watch with no event is idle), and stream its
 * lines to on_line until on_end. With a login and no token yet it is sent once the login
 * answers. Returns 0 with *out, or -ENOMEM / -EIO.
 */
int etcd_watch_start(struct etcd *e, const char *json, uint64_t idle_ms, etcd_line_fn *on_line,
                     etcd_end_fn *on_end, void *arg, struct etcd_watch **out);

/* etcd_watch_stop: no callback of w runs after this; its connection is closed and w freed
 * on the next loop turn (safe from inside w's own callbacks). NULL is fine. */
void etcd_watch_stop(struct etcd_watch *w);

#endif

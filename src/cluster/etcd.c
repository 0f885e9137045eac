/*
 * etcd: HTTP/1.1 POSTs to etcd's JSON gateway with evhttp, over TLS (libevent's OpenSSL
 * bufferevent) for https:// endpoints. One of the two files of src/cluster/ that include
 * libevent (with member.c), and with peer_tls.c and their shared cluster_tls.c one of its TLS
 * includers. What a call sends and how its answer reads is the caller's; this module owns
 * the connections, TLS to etcd (the server's certificate and host name checked), the
 * failover between endpoints, the bounds on answers, and the watch's line splitting. It
 * never logs: statuses go back.
 *
 * libevent frees a request after its completion callback returns and must not see its
 * connection freed inside that callback, so a watch is torn down from a zero-delay timer
 * (etcd_watch_stop), and the call connections live until etcd_destroy.
 *
 * With a login (etcd_set_login) every call and watch carries the token of
 * POST /v3/auth/authenticate in its Authorization header. Calls made while there is no token
 * wait for the one login in flight. A call etcd answers with an invalid or expired token
 * (etcd 3.4: HTTP 401, gRPC code 16, "etcdserver: invalid auth token"; also "revision of auth
 * store is old" after a change to the users or roles, and "user name is empty" when auth was
 * enabled after this node found it off) drops the token, waits for a new login and is sent
 * again, once. The password is held here only, and never in an error text.
 */
#include "etcd.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster_tls.h"
#include "config.h"
#include "json.h"
#include "tls_error.h"

#define ETCD_HOST_MAX 256
#define ETCD_TOKEN_MAX 4096         /* simple tokens are ~20 bytes, JWTs well under 1 KiB */
#define ETCD_LOGIN_BODY_MAX (CONF_STR_MAX * 2 + 2 * ETCD_PASSWORD_MAX + 64)
#define ETCD_REASON_MAX 256

/* The login's state: NONE (no etcd_user), NEEDED (no token), PENDING (one in flight), OK. */
enum etcd_login_state { ETCD_LOGIN_NONE, ETCD_LOGIN_NEEDED, ETCD_LOGIN_PENDING, ETCD_LOGIN_OK };

struct etcd_endpoint {
    char url[CONF_STR_MAX];         /* "http://host:port" or "https://host:port" */
    bool tls;                       /* https: */
    char host[ETCD_HOST_MAX];       /* "host" or "[v6]" as written */
    char hostport[ETCD_HOST_MAX];   /* the Host header */
    uint16_t port;
    struct evhttp_connection *conn; /* calls' connection, made on first use */
};

/* One call in flight. */
struct etcd_req {
    struct etcd *e;
    etcd_done_fn *fn;
    void *arg;
    struct evhttp_connection *conn; /* https: the call's own connection (freed by libevent
                                       once the call ends, or at etcd_destroy) */
    struct bufferevent *bev;        /* https: its TLS bufferevent, for the reason of a failure */
    char *path, *json;              /* kept to send it again after a new login */
    uint64_t token_gen;             /* the login whose token it carried (0: none) */
    bool retried;                   /* sent again once after a refused token */
    bool login;                     /* the login itself (fn NULL) */
    struct etcd_req *prev, *next;
};

struct etcd {
    struct event_base *base;
    struct timeval timeout;
    struct etcd_endpoint ep[CONF_ETCD_ENDPOINTS_MAX];
    int nep, cur;
    SSL_CTX *ssl;                   /* with an https:// endpoint: the client context */
    struct etcd_req *reqs;          /* calls in flight (freed at destroy) */
    struct etcd_watch *watches;     /* watches not yet freed */
    /* the login (etcd_set_login) */
    enum etcd_login_state login;
    char user[CONF_STR_MAX];
    char password[ETCD_PASSWORD_MAX + 1];
    char token[ETCD_TOKEN_MAX];     /* "" with ETCD_LOGIN_OK: etcd's auth is off */
    uint64_t token_gen;             /* logins that gave a token */
    uint64_t logins;                /* logins answered with a token */
    struct etcd_req *waiting, *waiting_tail;   /* calls waiting for the login, in order */
};

struct etcd_watch {
    struct etcd *e;
    struct evhttp_connection *conn;
    struct evhttp_request *req;     /* NULL once libevent completed (and freed) it */
    struct bufferevent *bev;        /* https: the TLS bufferevent under conn */
    struct evbuffer *line;          /* bytes of a line not complete yet */
    etcd_line_fn *on_line;
    etcd_end_fn *on_end;
    void *arg;
    int stopped;                    /* no more callbacks; the free is scheduled */
    char *json;                     /* its request, while it waits for the login */
    uint64_t idle_ms;
    struct event *reaper;
    struct etcd_watch *prev, *next;
};

static int
etcd_parse_endpoint(const char *s, size_t n, struct etcd_endpoint *ep)
{
    const char *hp, *colon;
    size_t hl, skip;
    char *end;
    unsigned long port;
    char portbuf[8];

    if (n >= sizeof(ep->url)) {
        return -EINVAL;
    }
    if (n > 7 && strncmp(s, "http://", 7) == 0) {
        skip = 7;
    } else if (n > 8 && strncmp(s, "https://", 8) == 0) {
        skip = 8;
        ep->tls = true;
    } else {
        return -EINVAL;
    }
    memcpy(ep->url, s, n);
    ep->url[n] = '\0';
    hp = ep->url + skip;
    colon = strrchr(hp, ':');
    if (colon == NULL || colon == hp || strlen(colon + 1) >= sizeof(portbuf)) {
        return -EINVAL;
    }
    hl = (size_t)(colon - hp);
    if (hl >= sizeof(ep->host)) {
        return -EINVAL;
    }
    memcpy(ep->host, hp, hl);
    ep->host[hl] = '\0';
    if (strlen(hp) >= sizeof(ep->hostport)) {
        return -EINVAL;
    }
    memcpy(ep->hostport, hp, strlen(hp) + 1);
    port = strtoul(colon + 1, &end, 10);
    if (*end != '\0' || port == 0 || port > 65535) {
        return -EINVAL;
    }
    ep->port = (uint16_t)port;
    if (ep->host[0] == '[') {                   /* evhttp wants a v6 address bare */
        size_t l = strlen(ep->host);

        if (l < 3 || ep->host[l - 1] != ']') {
            return -EINVAL;
        }
        memmove(ep->host, ep->host + 1, l - 2);
        ep->host[l - 2] = '\0';
    }
    return 0;
}

/*
 * etcd_ssl_new: the client context of the https:// endpoints: TLS 1.2 at least, the
 * server's certificate verified against ca (or the system's CAs when ""), its name checked
 * per connection (etcd_conn_new), and this node's certificate when cert is set.
 */
static int
etcd_ssl_new(struct etcd *e, const struct etcd_tls_files *f, char *err, size_t errlen)
{
    const char *ca = f != NULL && f->ca != NULL ? f->ca : "";
    const char *cert = f != NULL && f->cert != NULL ? f->cert : "";
    const char *key = f != NULL && f->key != NULL ? f->key : "";
    char why[256];

    e->ssl = SSL_CTX_new(TLS_client_method());
    if (e->ssl == NULL) {
        snprintf(err, errlen, "TLS: cannot create a context: %s", tls_error(why, sizeof(why)));
        return -ENOMEM;
    }
    SSL_CTX_set_min_proto_version(e->ssl, TLS1_2_VERSION);
    SSL_CTX_set_options(e->ssl, SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_verify(e->ssl, SSL_VERIFY_PEER, NULL);
    if (ca[0] != '\0' ? SSL_CTX_load_verify_locations(e->ssl, ca, NULL) != 1
                      : SSL_CTX_set_default_verify_paths(e->ssl) != 1) {
        snprintf(err, errlen, "etcd_tls_ca_file %s: %s", ca[0] != '\0' ? ca : "(the system's)",
                 tls_error(why, sizeof(why)));
        return -EINVAL;
    }
    if (cert[0] != '\0' && SSL_CTX_use_certificate_chain_file(e->ssl, cert) != 1) {
        snprintf(err, errlen, "etcd_tls_cert_file %s: %s", cert, tls_error(why, sizeof(why)));
        return -EINVAL;
    }
    if (cert[0] != '\0' && (SSL_CTX_use_PrivateKey_file(e->ssl, key, SSL_FILETYPE_PEM) != 1 ||
                            SSL_CTX_check_private_key(e->ssl) != 1)) {
        snprintf(err, errlen, "etcd_tls_key_file %s: %s", key, tls_error(why, sizeof(why)));
        return -EINVAL;
    }
    return 0;
}

int
etcd_create(struct event_base *base, const char *endpoints, const struct etcd_tls_files *tls,
            uint64_t timeout_ms, struct etcd **out, char *err, size_t errlen)
{
    struct etcd *e = calloc(1, sizeof(*e));
    const char *p = endpoints;
    bool any_tls = false;
    int rc;

    if (e == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    e->base = base;
    e->timeout.tv_sec = (time_t)(timeout_ms / 1000);
    e->timeout.tv_usec = (suseconds_t)(timeout_ms % 1000 * 1000);
    while (*p != '\0') {
        const char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);

        if (e->nep == CONF_ETCD_ENDPOINTS_MAX ||
            etcd_parse_endpoint(p, n, &e->ep[e->nep]) != 0) {
            snprintf(err, errlen, "'%.*s' is not http://host:port or https://host:port",
                     (int)(n > 200 ? 200 : n), p);
            free(e);
            return -EINVAL;
        }
        any_tls |= e->ep[e->nep].tls;
        e->nep++;
        p += n + (comma != NULL);
    }
    if (e->nep == 0) {
        snprintf(err, errlen, "no endpoint");
        free(e);
        return -EINVAL;
    }
    if (any_tls && (rc = etcd_ssl_new(e, tls, err, errlen)) != 0) {
        etcd_destroy(e);
        return rc;
    }
    *out = e;
    return 0;
}

static void
etcd_req_free(struct etcd_req *r)
{
    if (r != NULL) {
        free(r->path);
        free(r->json);
        free(r);
    }
}

static void
etcd_watch_free(struct etcd_watch *w)
{
    if (w->req != NULL) {
        evhttp_cancel_request(w->req);  /* no callback runs */
    }
    if (w->conn != NULL) {
        evhttp_connection_free(w->conn);
    }
    if (w->line != NULL) {
        evbuffer_free(w->line);
    }
    if (w->reaper != NULL) {
        event_free(w->reaper);
    }
    free(w->json);
    if (w->prev != NULL) {
        w->prev->next = w->next;
    } else {
        w->e->watches = w->next;
    }
    if (w->next != NULL) {
        w->next->prev = w->prev;
    }
    free(w);
}

void
etcd_destroy(struct etcd *e)
{
    if (e == NULL) {
        return;
    }
    while (e->watches != NULL) {
        etcd_watch_free(e->watches);
    }
    for (int i = 0; i < e->nep; i++) {
        if (e->ep[i].conn != NULL) {
            evhttp_connection_free(e->ep[i].conn);  /* its requests go without callbacks */
        }
    }
    while (e->reqs != NULL) {
        struct etcd_req *r = e->reqs;

        e->reqs = r->next;
        if (r->conn != NULL) {
            evhttp_connection_free(r->conn);    /* an https call's own: no callback runs */
        }
        etcd_req_free(r);
    }
    while (e->waiting != NULL) {
        struct etcd_req *r = e->waiting;

        e->waiting = r->next;
        etcd_req_free(r);
    }
    SSL_CTX_free(e->ssl);
    OPENSSL_cleanse(e->password, sizeof(e->password));
    OPENSSL_cleanse(e->token, sizeof(e->token));
    free(e);
}

const char *
etcd_endpoint(const struct etcd *e)
{
    return e->ep[e->cur].url;
}

/*
 * etcd_conn_new: a connection to ep whose calls time out after tv. For https:// a TLS
 * bufferevent under it, whose session checks the server's certificate for ep's host (an IP
 * address against its IP SANs, a name against its DNS names); *bev is that bufferevent
 * (NULL for http://). libevent 2.1 cannot reconnect a TLS bufferevent whose session ended,
 * so an https connection carries one call (or one watch) and is not reused.
 */
static struct evhttp_connection *
etcd_conn_new(struct etcd *e, const struct etcd_endpoint *ep, const struct timeval *tv,
              struct bufferevent **bev)
{
    struct evhttp_connection *c;
    struct bufferevent *b = NULL;

    *bev = NULL;
    if (ep->tls) {
        SSL *ssl = SSL_new(e->ssl);

        if (ssl == NULL) {
            return NULL;
        }
        b = cluster_tls_expect_host(ssl, ep->host) == 0
                ? bufferevent_openssl_socket_new(e->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                                     BEV_OPT_CLOSE_ON_FREE |
                                                     BEV_OPT_DEFER_CALLBACKS)
                    : NULL;
        if (b == NULL) {
            SSL_free(ssl);
            return NULL;
        }
        bufferevent_openssl_set_allow_dirty_shutdown(b, 1);
        c = evhttp_connection_base_bufferevent_new(e->base, NULL, b, ep->host, ep->port);
        if (c == NULL) {
            bufferevent_free(b);                /* and the SSL with it */
            return NULL;
        }
    } else {
        c = evhttp_connection_base_new(e->base, NULL, ep->host, ep->port);
        if (c == NULL) {
            return NULL;
        }
    }
    evhttp_connection_set_timeout_tv(c, tv);
    evhttp_connection_set_retries(c, 0);
    *bev = b;
    return c;
}

/*
 * etcd_tls_refused: why the TLS session of bev failed, into why: the server's certificate
 * (not chained to the CAs, or not for the endpoint's host) or an alert (etcd refused this
 * node's certificate, or asked for one it does not have). false when TLS did not fail.
 */
static bool
etcd_tls_refused(struct bufferevent *bev, char *why, size_t len)
{
    SSL *ssl = bev != NULL ? bufferevent_openssl_get_ssl(bev) : NULL;
    unsigned long oe;
    long vr;

    if (ssl == NULL) {
        return false;
    }
    vr = SSL_get_verify_result(ssl);
    if (vr != X509_V_OK) {
        snprintf(why, len, "its certificate: %s", X509_verify_cert_error_string(vr));
        return true;
    }
    oe = bufferevent_get_openssl_error(bev);
    if (oe != 0) {
        char s[200];

        ERR_error_string_n(oe, s, sizeof(s));
        snprintf(why, len, "%s", s);
        while (bufferevent_get_openssl_error(bev) != 0) {
        }
        return true;
    }
    return false;
}

/* Read a finished request: 0 with its body copied (NUL-terminated) into *body, or a status. */
static int
etcd_answer(struct evhttp_request *req, char **body, size_t *len)
{
    struct evbuffer *in;
    size_t n;
    int code;

    *body = NULL;
    *len = 0;
    if (req == NULL || (code = evhttp_request_get_response_code(req)) == 0) {
        return -EIO;
    }
    in = evhttp_request_get_input_buffer(req);
    n = evbuffer_get_length(in);
    if (n > ETCD_BODY_MAX) {
        return -E2BIG;
    }
    *body = malloc(n + 1);
    if (*body == NULL) {
        return -ENOMEM;
    }
    evbuffer_copyout(in, *body, n);
    (*body)[n] = '\0';
    *len = n;
    return code == HTTP_OK ? 0 : -EPROTO;
}

static void etcd_login_done(struct etcd *e, int status, const char *body, size_t len);

/*
 * etcd_token_refused: etcd's error answer body says the token this call carried is not
 * (or no longer) good: log in again and send the call again. etcd 3.4 answers an expired or
 * unknown token with gRPC code 16 (Unauthenticated, HTTP 401) "etcdserver: invalid auth
 * token"; a token issued before a change to the users or roles with "etcdserver: revision of
 * auth store is old"; a call without a token, once auth is on, "etcdserver: user name is
 * empty".
 */
static bool
etcd_token_refused(const char *body)
{
    return body != NULL && (strstr(body, "invalid auth token") != NULL ||
                            strstr(body, "revision of auth store is old") != NULL ||
                            strstr(body, "user name is empty") != NULL);
}

static void
etcd_unlink(struct etcd_req **head, struct etcd_req *r)
{
    if (r->prev != NULL) {
        r->prev->next = r->next;
    } else {
        *head = r->next;
    }
    if (r->next != NULL) {
        r->next->prev = r->prev;
    }
    r->prev = r->next = NULL;
}

static void
etcd_wait_push(struct etcd *e, struct etcd_req *r)
{
    r->next = NULL;
    r->prev = e->waiting_tail;
    if (e->waiting_tail != NULL) {
        e->waiting_tail->next = r;
    } else {
        e->waiting = r;
    }
    e->waiting_tail = r;
}

static int etcd_send(struct etcd *e, struct etcd_req *r);
static int etcd_login_start(struct etcd *e);
static void etcd_watch_send_waiting(struct etcd *e, int status, const char *why);

/* A call that cannot go on: its callback with status, then it is freed. */
static void
etcd_req_end(struct etcd_req *r, int status, const char *body, size_t len)
{
    r->fn(status, body, len, r->arg);
    etcd_req_free(r);
}

/* r waits for a login (one is started when none is in flight); 0, or the login's failure. */
static int
etcd_req_wait(struct etcd *e, struct etcd_req *r)
{
    int rc = 0;

    etcd_wait_push(e, r);
    if (e->login == ETCD_LOGIN_NEEDED && (rc = etcd_login_start(e)) != 0) {
        e->waiting_tail = r->prev;          /* r was the last */
        etcd_unlink(&e->waiting, r);
    }
    return rc;
}

static void
etcd_on_done(struct evhttp_request *req, void *arg)
{
    struct etcd_req *r = arg;
    struct etcd *e = r->e;
    char *body;
    size_t len;
    int status = etcd_answer(req, &body, &len);
    char why[256];

    if (status == -EIO && etcd_tls_refused(r->bev, why, sizeof(why))) {
        status = -EACCES;                   /* body: the reason */
        body = strdup(why);
        len = body != NULL ? strlen(body) : 0;
    }
    etcd_unlink(&e->reqs, r);
    r->conn = NULL;                         /* libevent frees an https call's own */
    r->bev = NULL;
    if ((status == -EIO || status == -EACCES) && e->nep > 1) {
        e->cur = (e->cur + 1) % e->nep;     /* the next call tries the next endpoint */
    }
    if (r->login) {
        etcd_req_free(r);
        etcd_login_done(e, status, body, len);
        free(body);
        return;
    }
    if (status == -EPROTO && e->login != ETCD_LOGIN_NONE && !r->retried &&
        etcd_token_refused(body)) {
        int rc;

        r->retried = true;                  /* once: a second refusal goes to the caller */
        if (r->token_gen == e->token_gen && e->login == ETCD_LOGIN_OK) {
            e->login = ETCD_LOGIN_NEEDED;   /* the token went stale: a new login */
            OPENSSL_cleanse(e->token, sizeof(e->token));
        }
        rc = e->login == ETCD_LOGIN_OK ? etcd_send(e, r) : etcd_req_wait(e, r);
        if (rc == 0) {
            free(body);
            return;
        }
        status = rc;
    }
    etcd_req_end(r, status, body, len);
    free(body);
}

static struct evhttp_request *
etcd_request_new(void (*cb)(struct evhttp_request *, void *), void *arg, const char *hostport,
                 const char *token, const char *json)
{
    struct evhttp_request *req = evhttp_request_new(cb, arg);
    struct evkeyvalq *h;

    if (req == NULL) {
        return NULL;
    }
    h = evhttp_request_get_output_headers(req);
    if (evhttp_add_header(h, "Host", hostport) != 0 ||
        evhttp_add_header(h, "Content-Type", "application/json") != 0 ||
        (token != NULL && token[0] != '\0' &&
         evhttp_add_header(h, "Authorization", token) != 0) ||
        evbuffer_add(evhttp_request_get_output_buffer(req), json, strlen(json)) != 0) {
        evhttp_request_free(req);
        return NULL;
    }
    return req;
}

/* The token a request carries now: NULL without a login (or while etcd's auth is off). */
static const char *
etcd_token(const struct etcd *e)
{
    return e->login == ETCD_LOGIN_OK && e->token[0] != '\0' ? e->token : NULL;
}

/* etcd_send: r on the current endpoint, with the token when it is not the login. 0, -ENOMEM
 * or -EIO (r is the caller's again). */
static int
etcd_send(struct etcd *e, struct etcd_req *r)
{
    struct etcd_endpoint *ep = &e->ep[e->cur];
    struct evhttp_connection *conn = ep->conn;
    struct bufferevent *bev = NULL;
    struct evhttp_request *req;

    if (ep->tls) {
        conn = etcd_conn_new(e, ep, &e->timeout, &bev);     /* one per call (see above) */
    } else if (conn == NULL) {
        conn = ep->conn = etcd_conn_new(e, ep, &e->timeout, &bev);
    }
    if (conn == NULL) {
        return -ENOMEM;
    }
    r->token_gen = r->login ? 0 : e->token_gen;
    req = etcd_request_new(etcd_on_done, r, ep->hostport, r->login ? NULL : etcd_token(e),
                           r->json);
    if (req == NULL) {
        if (ep->tls) {
            evhttp_connection_free(conn);
        }
        return -ENOMEM;
    }
    if (evhttp_make_request(conn, req, EVHTTP_REQ_POST, r->path) != 0) {
        if (ep->tls) {                      /* evhttp freed req */
            evhttp_connection_free(conn);
        }
        return -EIO;
    }
    if (ep->tls) {
        r->conn = conn;
        r->bev = bev;
        evhttp_connection_free_on_completion(conn);
    }
    r->prev = NULL;
    r->next = e->reqs;
    if (e->reqs != NULL) {
        e->reqs->prev = r;
    }
    e->reqs = r;
    return 0;
}

static struct etcd_req *
etcd_req_new(struct etcd *e, const char *path, const char *json, etcd_done_fn *fn, void *arg)
{
    struct etcd_req *r = calloc(1, sizeof(*r));

    if (r == NULL) {
        return NULL;
    }
    r->e = e;
    r->fn = fn;
    r->arg = arg;
    r->path = strdup(path);
    r->json = strdup(json);
    if (r->path == NULL || r->json == NULL) {
        etcd_req_free(r);
        return NULL;
    }
    return r;
}

int
etcd_call(struct etcd *e, const char *path, const char *json, etcd_done_fn *fn, void *arg)
{
    struct etcd_req *r = etcd_req_new(e, path, json, fn, arg);
    int rc;

    if (r == NULL) {
        return -ENOMEM;
    }
    rc = e->login == ETCD_LOGIN_NONE || e->login == ETCD_LOGIN_OK ? etcd_send(e, r)
                                                                  : etcd_req_wait(e, r);
    if (rc != 0) {
        etcd_req_free(r);
    }
    return rc;
}

/* ---- the login ---- */

/* etcd_login_start: POST /v3/auth/authenticate; the calls waiting go once it answers. */
static int
etcd_login_start(struct etcd *e)
{
    char name[CONF_STR_MAX * 2 + 8], pass[2 * ETCD_PASSWORD_MAX + 8];
    char body[ETCD_LOGIN_BODY_MAX];
    struct etcd_req *r;
    int rc = -ENOMEM;

    if (json_quote(e->user, name, sizeof(name)) < 0 ||
        json_quote(e->password, pass, sizeof(pass)) < 0) {
        return -EINVAL;
    }
    snprintf(body, sizeof(body), "{\"name\":%s,\"password\":%s}", name, pass);
    r = etcd_req_new(e, "/v3/auth/authenticate", body, NULL, NULL);
    if (r != NULL) {
        r->login = true;
        rc = etcd_send(e, r);
        if (rc != 0) {
            etcd_req_free(r);
        }
    }
    OPENSSL_cleanse(body, sizeof(body));
    OPENSSL_cleanse(pass, sizeof(pass));
    if (rc == 0) {
        e->login = ETCD_LOGIN_PENDING;
    }
    return rc;
}

/*
 * etcd_login_done: the login's answer. A token: the calls waiting go with it. "authentication
 * is not enabled": they go without one (a token is asked for once etcd wants one). Refused
 * (any other error answer): each fails with -EPERM and etcd's reason; no answer: each fails
 * as the login did. Either way the next call logs in again.
 */
static void
etcd_login_done(struct etcd *e, int status, const char *body, size_t len)
{
    struct etcd_req *list = e->waiting, *r;
    struct json_tok t[32];
    char reason[ETCD_REASON_MAX] = "";
    int n = status == 0 || status == -EPROTO ? json_parse(body, len, t, 32) : -1;

    e->waiting = e->waiting_tail = NULL;    /* a callback below may queue calls of its own */
    if (status == 0 && (n <= 0 || json_str(body, t, json_get(body, t, 0, "token"), e->token,
                                            sizeof(e->token)) <= 0)) {
        status = -EPROTO;                   /* no token in a 200: not etcd's login answer */
        snprintf(reason, sizeof(reason), "no token in the answer to /v3/auth/authenticate");
    } else if (status == -EPROTO && body != NULL &&
               strstr(body, "authentication is not enabled") != NULL) {
        status = 0;
        e->token[0] = '\0';
    }
    if (status == 0) {
        e->login = ETCD_LOGIN_OK;
        e->token_gen++;
        e->logins += e->token[0] != '\0';
    } else {
        e->login = ETCD_LOGIN_NEEDED;
        if (status == -EPROTO) {
            status = -EPERM;
            if (reason[0] == '\0' && (n <= 0 || json_str(body, t, json_get(body, t, 0, "error"),
                                                         reason, sizeof(reason)) <= 0)) {
                snprintf(reason, sizeof(reason), "%.200s", body != NULL ? body : "");
            }
            body = reason;
            len = strlen(reason);
        }
    }
    etcd_watch_send_waiting(e, status, body);
    while ((r = list) != NULL) {
        int rc = status;

        list = r->next;
        r->prev = r->next = NULL;
        if (rc == 0 && (rc = etcd_send(e, r)) == 0) {
            continue;
        }
        etcd_req_end(r, rc, rc == status ? body : NULL, rc == status ? len : 0);
    }
}

int
etcd_set_login(struct etcd *e, const char *user, const char *password_file, char *err,
               size_t errlen)
{
    struct stat st;
    ssize_t n;
    int fd, rc;
    char *nl;

    if (user == NULL || user[0] == '\0') {
        return 0;
    }
    fd = open(password_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        rc = -errno;
        snprintf(err, errlen, "etcd_password_file %s: %s", password_file, strerror(-rc));
        return rc;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 077) != 0) {
        close(fd);
        snprintf(err, errlen, "etcd_password_file %s: must be a regular file of mode 0600 or "
                 "stricter", password_file);
        return -EACCES;
    }
    n = read(fd, e->password, sizeof(e->password) - 1);
    rc = n < 0 ? -errno : 0;
    close(fd);
    if (rc != 0) {
        snprintf(err, errlen, "etcd_password_file %s: %s", password_file, strerror(-rc));
        return rc;
    }
    e->password[n] = '\0';
    nl = strchr(e->password, '\n');
    if (nl != NULL) {
        *nl = '\0';                         /* the first line */
    }
    if (e->password[0] == '\0' || strlen(e->password) != strcspn(e->password, "\r") ||
        (nl == NULL && (size_t)n == sizeof(e->password) - 1)) {
        OPENSSL_cleanse(e->password, sizeof(e->password));
        snprintf(err, errlen, "etcd_password_file %s: its first line must hold the password, "
                 "1 to %d bytes", password_file, ETCD_PASSWORD_MAX);
        return -EINVAL;
    }
    snprintf(e->user, sizeof(e->user), "%s", user);
    e->login = ETCD_LOGIN_NEEDED;
    return 0;
}

uint64_t
etcd_logins(const struct etcd *e)
{
    return e->logins;
}

void
etcd_login_again(struct etcd *e)
{
    if (e->login == ETCD_LOGIN_OK) {
        e->login = ETCD_LOGIN_NEEDED;
        OPENSSL_cleanse(e->token, sizeof(e->token));
    }
}

/* ---- watch ---- */

static void
etcd_watch_reap(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    etcd_watch_free(arg);
}

static void
etcd_watch_end(struct etcd_watch *w, int status)
{
    if (!w->stopped) {
        w->on_end(status, w->arg);
    }
}

static void
etcd_watch_on_chunk(struct evhttp_request *req, void *arg)
{
    struct etcd_watch *w = arg;

    if (w->stopped) {
        return;
    }
    evbuffer_add_buffer(w->line, evhttp_request_get_input_buffer(req));
    for (;;) {
        struct evbuffer_ptr eol = evbuffer_search_eol(w->line, NULL, NULL, EVBUFFER_EOL_LF);
        size_t n;
        char *line;

        if (eol.pos < 0) {
            if (evbuffer_get_length(w->line) > ETCD_BODY_MAX) {
                evbuffer_drain(w->line, evbuffer_get_length(w->line));
                etcd_watch_end(w, -E2BIG);
                w->stopped = 1;
            }
            return;
        }
        n = (size_t)eol.pos;
        if (n > ETCD_BODY_MAX) {
            etcd_watch_end(w, -E2BIG);
            w->stopped = 1;
            return;
        }
        line = (char *)evbuffer_pullup(w->line, (ev_ssize_t)n + 1);
        if (line == NULL) {
            etcd_watch_end(w, -ENOMEM);
            w->stopped = 1;
            return;
        }
        line[n] = '\0';                     /* the newline's place */
        w->on_line(line, n, w->arg);
        evbuffer_drain(w->line, n + 1);
        if (w->stopped) {
            return;
        }
    }
}

static void
etcd_watch_on_done(struct evhttp_request *req, void *arg)
{
    struct etcd_watch *w = arg;

    char why[256];

    w->req = NULL;                          /* libevent frees it after this returns */
    if (req != NULL && evhttp_request_get_response_code(req) == HTTP_OK) {
        etcd_watch_end(w, 0);
    } else {
        etcd_watch_end(w, etcd_tls_refused(w->bev, why, sizeof(why)) ? -EACCES : -EIO);
    }
}

/* etcd_watch_send: w's request on a connection of its own, with the token. 0, -ENOMEM, -EIO. */
static int
etcd_watch_send(struct etcd_watch *w)
{
    struct etcd *e = w->e;
    struct etcd_endpoint *ep = &e->ep[e->cur];
    struct timeval tv = {(time_t)(w->idle_ms / 1000),
                         (suseconds_t)(w->idle_ms % 1000 * 1000)};

    w->conn = etcd_conn_new(e, ep, &tv, &w->bev);
    if (w->conn == NULL) {
        return -ENOMEM;
    }
    w->req = etcd_request_new(etcd_watch_on_done, w, ep->hostport, etcd_token(e), w->json);
    if (w->req == NULL) {
        return -ENOMEM;
    }
    evhttp_request_set_chunked_cb(w->req, etcd_watch_on_chunk);
    if (evhttp_make_request(w->conn, w->req, EVHTTP_REQ_POST, "/v3/watch") != 0) {
        w->req = NULL;                      /* freed by evhttp */
        return -EIO;
    }
    free(w->json);
    w->json = NULL;
    return 0;
}

/* The login answered: the watches waiting for it start (status 0) or end (its failure). */
static void
etcd_watch_send_waiting(struct etcd *e, int status, const char *why)
{
    (void)why;
    for (struct etcd_watch *w = e->watches; w != NULL; w = w->next) {
        int rc = status;

        if (w->json == NULL || w->stopped || w->conn != NULL) {
            continue;
        }
        if (rc == 0 && (rc = etcd_watch_send(w)) == 0) {
            continue;
        }
        free(w->json);
        w->json = NULL;
        etcd_watch_end(w, rc);
        w->stopped = 1;
    }
}

int
etcd_watch_start(struct etcd *e, const char *json, uint64_t idle_ms, etcd_line_fn *on_line,
                 etcd_end_fn *on_end, void *arg, struct etcd_watch **out)
{
    struct etcd_watch *w = calloc(1, sizeof(*w));
    int rc = -ENOMEM;

    if (w == NULL) {
        return -ENOMEM;
    }
    w->e = e;
    w->on_line = on_line;
    w->on_end = on_end;
    w->arg = arg;
    w->idle_ms = idle_ms;
    w->next = e->watches;
    if (e->watches != NULL) {
        e->watches->prev = w;
    }
    e->watches = w;
    w->line = evbuffer_new();
    w->reaper = evtimer_new(e->base, etcd_watch_reap, w);
    w->json = strdup(json);
    if (w->line == NULL || w->reaper == NULL || w->json == NULL) {
        goto fail;
    }
    if (e->login == ETCD_LOGIN_NEEDED || e->login == ETCD_LOGIN_PENDING) {
        /* sent once a login gives a token (etcd_watch_send_waiting) */
        if (e->login == ETCD_LOGIN_NEEDED && (rc = etcd_login_start(e)) != 0) {
            goto fail;
        }
    } else if ((rc = etcd_watch_send(w)) != 0) {
        goto fail;
    }
    *out = w;
    return 0;
fail:
    etcd_watch_free(w);
    return rc;
}

void
etcd_watch_stop(struct etcd_watch *w)
{
    struct timeval now = {0, 0};

    if (w == NULL || (w->stopped && evtimer_pending(w->reaper, NULL))) {
        return;
    }
    w->stopped = 1;
    evtimer_add(w->reaper, &now);
}

/*
 * admin: the metrics and probes port (admin.h). It owns its thread, event base, evhttp
 * server and listening socket, and answers each request from what server.h and metrics.h
 * give any thread. It must not touch a connection, a worker's loop or a counter, and must
 * not block on anything but its own socket: a slow scraper delays only other scrapes.
 */
#include "admin.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "metrics.h"
#include "server.h"

#define ADMIN_TIMEOUT_S 10          /* a request that does not arrive in time is dropped */
#define ADMIN_MAX_HEADERS 8192      /* bytes of one request's headers */

struct admin {
    struct server *srv;
    struct event_base *base;
    struct evhttp *http;
    int fd;
    pthread_t thread;
    bool started;
};

static void
admin_reply_text(struct evhttp_request *req, int code, const char *reason, const char *text)
{
    struct evbuffer *body = evbuffer_new();

    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; charset=utf-8");
    if (body != NULL) {
        evbuffer_add_printf(body, "%s\n", text);
    }
    evhttp_send_reply(req, code, reason, body);
    if (body != NULL) {
        evbuffer_free(body);
    }
}

static void
admin_buf_free(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    free(arg);
}

/*
 * admin_authorized: without require_auth, yes; with it, the request carries "Bearer TOKEN"
 * whose SHA-256 is the admin tenant's (compared in constant time).
 */
static bool
admin_authorized(struct admin *a, struct evhttp_request *req)
{
    const struct kv_config *c = server_config(a->srv);
    const char *h;
    uint8_t digest[SHA256_DIGEST_LENGTH];

    if (!c->require_auth) {
        return true;
    }
    h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0) {
        return false;
    }
    h += 7;
    SHA256((const uint8_t *)h, strlen(h), digest);
    for (uint32_t i = 0; i < c->tenants.n; i++) {
        const struct conf_tenant *t = &c->tenants.t[i];

        if (strcmp(t->name, CONF_ADMIN_TENANT) == 0) {
            return CRYPTO_memcmp(digest, t->token_sha256, sizeof(digest)) == 0;
        }
    }
    return false;
}

/* /metrics and /stats: a rendering of the counters, once the server serves. */
static void
admin_counters(struct admin *a, struct evhttp_request *req, bool json)
{
    struct server_stats sv;
    struct metrics_buf mb = {0};
    struct evbuffer *body;
    int rc;

    if (!admin_authorized(a, req)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate",
                          "Bearer realm=\"kvstash\"");
        admin_reply_text(req, 401, "Unauthorized",
                         "require_auth: send the admin tenant's token as a bearer token");
        return;
    }
    server_stats(a->srv, &sv);
    if (sv.phase < SERVER_PHASE_SERVING) {
        char why[160];

        server_ready(a->srv, why, sizeof(why));
        admin_reply_text(req, 503, "Service Unavailable", why);
        return;
    }
    rc = json ? metrics_stats_json(a->srv, &mb) : metrics_render(a->srv, &mb);
    if (rc != 0) {
        metrics_buf_free(&mb);
        admin_reply_text(req, 500, "Internal Server Error", "out of memory");
        return;
    }
    body = evbuffer_new();
    if (body == NULL || evbuffer_add_reference(body, mb.p, mb.len, admin_buf_free, mb.p) != 0) {
        if (body != NULL) {
            evbuffer_free(body);
        }
        metrics_buf_free(&mb);
        admin_reply_text(req, 500, "Internal Server Error", "out of memory");
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      json ? "application/json"
                           : "text/plain; version=0.0.4; charset=utf-8");
    evhttp_send_reply(req, 200, "OK", body);
    evbuffer_free(body);
}

static void
admin_on_request(struct evhttp_request *req, void *arg)
{
    struct admin *a = arg;
    const char *uri = evhttp_request_get_uri(req);
    const char *path;
    struct evhttp_uri *u = evhttp_uri_parse(uri);
    char why[160];

    path = u != NULL ? evhttp_uri_get_path(u) : NULL;
    if (path == NULL) {
        path = "";
    }
    if (strcmp(path, "/metrics") == 0) {
        admin_counters(a, req, false);
    } else if (strcmp(path, "/stats") == 0) {
        admin_counters(a, req, true);
    } else if (strcmp(path, "/healthz") == 0) {
        admin_reply_text(req, 200, "OK", "ok");
    } else if (strcmp(path, "/readyz") == 0) {
        if (server_ready(a->srv, why, sizeof(why))) {
            admin_reply_text(req, 200, "OK", why);
        } else {
            admin_reply_text(req, 503, "Service Unavailable", why);
        }
    } else {
        admin_reply_text(req, 404, "Not Found",
                         "not found: try /metrics, /healthz, /readyz or /stats");
    }
    if (u != NULL) {
        evhttp_uri_free(u);
    }
}

static void *
admin_main(void *arg)
{
    struct admin *a = arg;

    event_base_dispatch(a->base);
    return NULL;
}

int
admin_start(int fd, struct server *s, struct admin **out)
{
    struct admin *a = calloc(1, sizeof(*a));
    int rc = -ENOMEM;

    *out = NULL;
    if (a == NULL) {
        close(fd);
        return -ENOMEM;
    }
    a->srv = s;
    a->fd = fd;
    a->base = event_base_new();
    if (a->base == NULL) {
        goto fail;
    }
    a->http = evhttp_new(a->base);
    if (a->http == NULL) {
        goto fail;
    }
    evhttp_set_allowed_methods(a->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
    evhttp_set_timeout(a->http, ADMIN_TIMEOUT_S);
    evhttp_set_max_headers_size(a->http, ADMIN_MAX_HEADERS);
    evhttp_set_max_body_size(a->http, 0);
    evhttp_set_gencb(a->http, admin_on_request, a);
    if (evhttp_accept_socket(a->http, fd) != 0) {
        rc = -EINVAL;
        goto fail;
    }
    a->fd = -1;                     /* the evhttp's: freed with it */
    rc = pthread_create(&a->thread, NULL, admin_main, a);
    if (rc != 0) {
        rc = -rc;
        goto fail;
    }
    a->started = true;
    *out = a;
    return 0;
fail:
    admin_stop(a);
    return rc;
}

void
admin_stop(struct admin *a)
{
    if (a == NULL) {
        return;
    }
    if (a->started) {
        event_base_loopbreak(a->base);
        pthread_join(a->thread, NULL);
    }
    if (a->http != NULL) {
        evhttp_free(a->http);
    }
    if (a->fd >= 0) {
        close(a->fd);
    }
    if (a->base != NULL) {
        event_base_free(a->base);
    }
    free(a);
}

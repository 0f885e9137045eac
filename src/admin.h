/*
 * admin: the HTTP port of operators and their tools (metrics_listen): a
 * thread of its own running a libevent evhttp server on its own event
 * base, so a scrape or a probe never waits for, or stops, a worker or the
 * main thread (which may be busy opening the SSD index: /readyz says so
 * meanwhile). It serves, GET or HEAD only:
 *
 *   /metrics  Prometheus text format 0.0.4 (metrics.h)
 *   /healthz  200 "ok" while the process serves HTTP at all
 *   /readyz   200 "ready", or 503 with the reason (server_ready)
 *   /stats    the stats map as one JSON object (metrics_stats_json)
 *
 * With require_auth, /metrics and /stats want "Authorization: Bearer
 * TOKEN", TOKEN being the admin tenant's (the one that sees every tenant's
 * stats); the probes never do. Anything else is 404, other methods 405.
 *
 * Threads: admin_start and admin_stop belong to the main thread; the rest
 * runs on the admin thread, which reads the server through server.h's
 * any-thread calls only.
 */
#ifndef ADMIN_H
#define ADMIN_H

struct admin;
struct server;

/*
 * admin_start: serve HTTP on the listening socket fd (taken over: closed
 * by admin_stop, or here on failure) for server s, from a new thread. Call
 * after libevent was set up for threads. Returns 0 and *out, or -errno.
 */
int admin_start(int fd, struct server *s, struct admin **out);

/* admin_stop: stop the thread, close the socket, free a. Accepts NULL. */
void admin_stop(struct admin *a);

#endif

/*
 * conn: one client connection (TCP or Unix socket), owned by one worker
 * thread from adoption to close.
 *
 * Read path: bytes go into the connection buffer and through frame_scan;
 * a put value big enough to matter is received straight into its store
 * reservation (readv into the arena) instead of the buffer; each complete
 * message goes to rpc_dispatch. Write path: replies queue in an outq and
 * leave with writev, values straight from the arena. A connection whose
 * unsent output passes client_output_limit, or with client_inflight_max
 * requests in flight, is not read until it drains to half of that.
 *
 * A framing violation is answered once with the error notification, then the
 * connection closes. A connection is freed only by conn_close, at the end of
 * its own event callback or by its worker, never from inside rpc code.
 */
#ifndef CONN_H
#define CONN_H

struct worker;

/*
 * conn_adopt: make a connection of an accepted non-blocking fd on worker w
 * (called on w's thread). is_unix tells the transport. On failure the fd is
 * closed and the error logged. Returns 0 or -errno.
 */
enum conn_kind { CONN_TCP, CONN_UNIX, CONN_TLS };

int conn_adopt(struct worker *w, int fd, int kind);

/*
 * conn_drain_all: the server is stopping: close idle connections of w now;
 * the others stop reading new requests once their current message is in,
 * and close as soon as their replies are sent.
 */
void conn_drain_all(struct worker *w);

/*
 * conn_retry_waiting: the SSD tier made progress: retry every connection of
 * w whose request waits for it (called on w's thread).
 */
void conn_retry_waiting(struct worker *w);

/*
 * conn_expire_all: once a second on w's thread: reclaim the put_start
 * reservations of w's connections that outlived put_timeout_ms, and close
 * those whose output is stuck (client_output_timeout) or that are idle
 * (idle_timeout).
 */
void conn_expire_all(struct worker *w);

/* conn_close_all: close every connection of w at once (final teardown). */
void conn_close_all(struct worker *w);

/* conn_refresh_limits: load the current config snapshot into w's limits when it changed. */
void conn_refresh_limits(struct worker *w);

/*
 * conn_auth_recheck: after a reload: close (with the error notification,
 * counted in auth_revoked) every connection of w authenticated as a tenant
 * the current config no longer has, or whose token has changed since it
 * logged in. Cheap when the snapshot is the one last checked. Call on w's
 * thread, outside any connection's callback (it frees connections).
 */
void conn_auth_recheck(struct worker *w);

#endif

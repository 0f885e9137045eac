/*
 * sdnotify: systemd's readiness protocol (sd_notify(3)) without libsystemd: one datagram of
 * "KEY=value" lines to the AF_UNIX socket named by $NOTIFY_SOCKET (a path, or "@name" for
 * the abstract namespace). Outside systemd (no $NOTIFY_SOCKET) every call does nothing.
 * Knows nothing of the daemon: the caller decides when it is ready, reloading or stopping.
 */
#ifndef SDNOTIFY_H
#define SDNOTIFY_H

/*
 * sdnotify_send: send state (borrowed; e.g. "READY=1", "RELOADING=1", "STOPPING=1", or
 * several lines separated by '\n') to $NOTIFY_SOCKET. Returns 1 when sent, 0 when
 * $NOTIFY_SOCKET is unset or empty, -EINVAL when it is not a usable socket address (too
 * long, or neither a path nor "@name"), or another negative errno from socket or sendto.
 * Never blocks (a full socket is -EAGAIN). Any thread; keeps no state.
 */
int sdnotify_send(const char *state);

#endif

/*
 * tcpopt: TCP socket options that both ends of a kvstash connection set, the daemon on
 * the connections it accepts and libkvstash (and the load generators) on the ones they
 * open: whether the peer is on this host, and the congestion control such a connection
 * should use.
 *
 * Why same-host connections get their own congestion control: a pacing algorithm (bbr,
 * the default on some hosts) sizes what it keeps in flight by the path it measures, and
 * over loopback that path is microseconds long. Measured on a 2-core VM whose default is
 * bbr, one connection putting 1 MiB values: 3.0-3.2 GB/s with about one segment in 30
 * retransmitted and a congestion window of 18 segments; with cubic on the sending socket,
 * 5.1-5.2 GB/s and no retransmissions. Connections from other hosts keep the host's choice.
 *
 * Plain functions on a descriptor: no state, no allocation, safe from any thread.
 */
#ifndef TCPOPT_H
#define TCPOPT_H

/* The congestion control libkvstash sets on a TCP connection to its own host. */
#define TCPOPT_LOCAL_CONGESTION "cubic"

/*
 * tcpopt_same_host: 1 if the connected TCP socket fd talks to this host (its peer has a
 * loopback address, or the same address as the socket itself, which is how a connection
 * to one of the host's own addresses looks), else 0 (also when fd is not a connected
 * IPv4/IPv6 socket).
 */
int tcpopt_same_host(int fd);

/*
 * tcpopt_congestion: set fd's congestion control algorithm to name (TCP_CONGESTION).
 * Returns 0, or -errno: -ENOENT when the kernel does not have it, -EPERM when an
 * unprivileged process may not choose it (net.ipv4.tcp_allowed_congestion_control).
 * fd is unchanged on failure.
 */
int tcpopt_congestion(int fd, const char *name);

#endif /* TCPOPT_H */

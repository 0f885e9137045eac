/*
 * tcpopt: TCP socket options that both ends of a kvstash connection set, the daemon on
 * the connections it accepts and libkvstash (and the load generators) on the ones they
 * open: whether the peer is on this host, and the congestion control such a connection
 * should use.
 *
 * Why same-host connections get their own congestion control: over loopback there is no
 * path to share, and algorithms made for one misjudge a round trip of microseconds.
 * Measured on a 2-core VM whose default is bbr, one connection putting 1 MiB values:
 *   bbr    3.0-3.2 GB/s; it paces segments and kept 18 in flight, one in 30 retransmitted
 *   cubic  5.0-5.5 GB/s in some runs, 2.6-3.3 in others: HyStart ended slow start at 16-50
 *          segments when ACKs came in a train, and from then on segments sent from both
 *          CPUs arrived out of order, about 1,000 retransmitted per 2 GB
 *   reno   4.0-5.1 GB/s, which has neither; gets on 8 connections: 6.9-7.4 GB/s against
 *          cubic's 5.4-6.6
 * Connections from other hosts keep the host's choice.
 *
 * Plain functions on a descriptor: no state, no allocation, safe from any thread.
 */
#ifndef TCPOPT_H
#define TCPOPT_H

/* The congestion control libkvstash sets on a TCP connection to its own host. */
#define TCPOPT_LOCAL_CONGESTION "reno"

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

/*
 * tcpopt_local_congestion: tcpopt_congestion(fd, name) when tcpopt_same_host(fd), which is
 * what every kvstash end does with a connection it opens or accepts. Returns 0 (set, or
 * a peer elsewhere: the host's algorithm stays) or tcpopt_congestion's -errno.
 */
int tcpopt_local_congestion(int fd, const char *name);

#endif /* TCPOPT_H */

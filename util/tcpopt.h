/*
 * tcpopt: TCP socket options that both ends of a kvstash connection set, the daemon on
 * its listeners and the connections it accepts, libkvstash (and the load generators) on
 * the ones they open: whether the peer is on this host, and the congestion control such
 * a connection should use.
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
 * The algorithm is chosen before the handshake: on a socket before connect(), and on the
 * listening socket, whose connections inherit it, for the daemon. Set after the handshake
 * it comes too late: the host's algorithm has already started the connection, and a bbr
 * start leaves the socket paced (sk_pacing_status stays SK_PACING_NEEDED: a timer between
 * bursts of segments) for the rest of its life, whatever algorithm follows. Measured on
 * the same VM, raw TCP putting 1 MiB values on 8 connections, reno set after connect and
 * accept: 3.9-4.2 GB/s; set before: 5.5-6.1.
 *
 * Plain functions on descriptors and addresses: no state, no allocation, safe from any
 * thread.
 */
#ifndef TCPOPT_H
#define TCPOPT_H

#include <stddef.h>
#include <sys/socket.h>

/* The congestion control libkvstash sets on a TCP connection to its own host. */
#define TCPOPT_LOCAL_CONGESTION "reno"

/* Room for an algorithm's name with its NUL (TCP_CA_NAME_MAX in Linux). */
#define TCPOPT_NAME_MAX 16

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
 * tcpopt_addr_same_host: 1 if a connection to addr would stay on this host: a loopback
 * address, or one of the host's own, which the kernel routes locally (the source address
 * it picks for addr is addr itself; asked with a UDP socket's connect, which sends
 * nothing). Else 0, also for families other than IPv4/IPv6.
 */
int tcpopt_addr_same_host(const struct sockaddr *addr, socklen_t len);

/*
 * tcpopt_connect_congestion: on TCP socket fd, before connect(fd, addr, len): set name
 * when addr is on this host (tcpopt_addr_same_host). Returns 0 (set, or addr elsewhere:
 * the host's algorithm stays) or tcpopt_congestion's -errno.
 */
int tcpopt_connect_congestion(int fd, const struct sockaddr *addr, socklen_t len,
                              const char *name);

/*
 * tcpopt_host_congestion: the host's default algorithm (what a new TCP socket gets) into
 * buf, NUL-terminated. Returns 0 or -errno.
 */
int tcpopt_host_congestion(char *buf, size_t size);

/*
 * tcpopt_accepted_congestion: settle the algorithm of connection fd, accepted on a
 * listener that was given name ("" for none): name when same_host (tcpopt_same_host(fd)),
 * else the host's default, set only when fd does not have it already. A connection from
 * elsewhere was started by name and is switched at once, before any data. Returns 0 or
 * -errno of the lookup or the switch (fd keeps what it had).
 */
int tcpopt_accepted_congestion(int fd, const char *name, int same_host);

#endif /* TCPOPT_H */

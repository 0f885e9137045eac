/*
 * tcpopt: TCP options for connections between kvstash ends (see tcpopt.h for why). Only
 * socket calls; it knows nothing of the protocol.
 */
#include "tcpopt.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>

/* 1 if a is a loopback address (127/8, ::1, or 127/8 mapped into IPv6). */
static int
tcpopt_is_loopback(const struct sockaddr_storage *a)
{
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)a;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    const struct in6_addr *in6 = &((const struct sockaddr_in6 *)a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(in6) ||
           (IN6_IS_ADDR_V4MAPPED(in6) && in6->s6_addr[12] == 127);
}

int
tcpopt_same_host(int fd)
{
    struct sockaddr_storage peer, self;
    socklen_t plen = sizeof(peer), slen = sizeof(self);

    if (getpeername(fd, (struct sockaddr *)&peer, &plen) != 0 ||
        getsockname(fd, (struct sockaddr *)&self, &slen) != 0 ||
        (peer.ss_family != AF_INET && peer.ss_family != AF_INET6) ||
        peer.ss_family != self.ss_family) {
        return 0;
    }
    if (tcpopt_is_loopback(&peer)) {
        return 1;
    }
    if (peer.ss_family == AF_INET) {
        return ((struct sockaddr_in *)&peer)->sin_addr.s_addr ==
               ((struct sockaddr_in *)&self)->sin_addr.s_addr;
    }
    return memcmp(&((struct sockaddr_in6 *)&peer)->sin6_addr,
                  &((struct sockaddr_in6 *)&self)->sin6_addr, sizeof(struct in6_addr)) == 0;
}

int
tcpopt_congestion(int fd, const char *name)
{
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)strlen(name)) != 0) {
        return -errno;
    }
    return 0;
}

int
tcpopt_local_congestion(int fd, const char *name)
{
    return tcpopt_same_host(fd) ? tcpopt_congestion(fd, name) : 0;
}

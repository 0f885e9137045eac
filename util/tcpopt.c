/*
 * tcpopt: TCP options for connections between kvstash ends (see tcpopt.h for why). Only
 * socket calls; it knows nothing of the protocol.
 */
#include "tcpopt.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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

/*
 * 1 if traffic between self and peer stays on this host: peer is a loopback address, or
 * self's own address (how a connection to one of the host's addresses looks).
 */
static int
tcpopt_local_pair(const struct sockaddr_storage *peer, const struct sockaddr_storage *self)
{
    if ((peer->ss_family != AF_INET && peer->ss_family != AF_INET6) ||
        peer->ss_family != self->ss_family) {
        return 0;
    }
    if (tcpopt_is_loopback(peer)) {
        return 1;
    }
    if (peer->ss_family == AF_INET) {
        return ((const struct sockaddr_in *)peer)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)self)->sin_addr.s_addr;
    }
    return memcmp(&((const struct sockaddr_in6 *)peer)->sin6_addr,
                  &((const struct sockaddr_in6 *)self)->sin6_addr, sizeof(struct in6_addr)) == 0;
}

int
tcpopt_same_host(int fd)
{
    struct sockaddr_storage peer, self;
    socklen_t plen = sizeof(peer), slen = sizeof(self);

    return getpeername(fd, (struct sockaddr *)&peer, &plen) == 0 &&
           getsockname(fd, (struct sockaddr *)&self, &slen) == 0 &&
           tcpopt_local_pair(&peer, &self);
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
tcpopt_addr_same_host(const struct sockaddr *addr, socklen_t len)
{
    struct sockaddr_storage dst, src;
    socklen_t slen = sizeof(src);

    if (addr == NULL || len > sizeof(dst) ||
        !((addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) ||
          (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)))) {
        return 0;
    }
    memset(&dst, 0, sizeof(dst));
    memcpy(&dst, addr, len);
    if (tcpopt_is_loopback(&dst)) {
        return 1;
    }
    /* Which source address would the kernel use? A local route answers with addr itself. */
    int fd = socket(dst.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return 0;
    }
    int same = connect(fd, (struct sockaddr *)&dst, len) == 0 &&
               getsockname(fd, (struct sockaddr *)&src, &slen) == 0 &&
               tcpopt_local_pair(&dst, &src);
    close(fd);
    return same;
}

int
tcpopt_connect_congestion(int fd, const struct sockaddr *addr, socklen_t len, const char *name)
{
    return tcpopt_addr_same_host(addr, len) ? tcpopt_congestion(fd, name) : 0;
}

/* fd's algorithm into buf (size > 1), NUL-terminated; 0 or -errno. */
static int
tcpopt_get_congestion(int fd, char *buf, size_t size)
{
    socklen_t len = (socklen_t)(size - 1);

    if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, buf, &len) != 0) {
        return -errno;
    }
    buf[len] = '\0';
    return 0;
}

int
tcpopt_host_congestion(char *buf, size_t size)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0) {
        fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            return -errno;
        }
    }
    int rc = tcpopt_get_congestion(fd, buf, size);
    close(fd);
    return rc;
}

int
tcpopt_accepted_congestion(int fd, const char *name, int same_host)
{
    char want[TCPOPT_NAME_MAX], have[TCPOPT_NAME_MAX];
    int rc;

    if (same_host && name[0] != '\0') {
        snprintf(want, sizeof(want), "%s", name);
    } else if ((rc = tcpopt_host_congestion(want, sizeof(want))) != 0) {
        return rc;
    }
    if ((rc = tcpopt_get_congestion(fd, have, sizeof(have))) != 0) {
        return rc;
    }
    return strcmp(have, want) == 0 ? 0 : tcpopt_congestion(fd, want);
}

/*
 * test_tcpopt: which connections protocol/tcpopt.c counts as same-host, and setting a
 * congestion control. Real sockets on loopback (and on one of the host's own addresses
 * when it has one); no daemon.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcpopt.h"

/* A connected TCP pair to addr (port 0: the listener picks one): the client in *cfd,
 * the accepted end in *afd. false when the address cannot be bound (no IPv6, say). */
static bool
tcp_pair(const struct sockaddr *addr, socklen_t len, int *cfd, int *afd)
{
    struct sockaddr_storage bound;
    socklen_t blen = sizeof(bound);
    int lfd = socket(addr->sa_family, SOCK_STREAM, 0);

    cr_assert_geq(lfd, 0);
    if (bind(lfd, addr, len) != 0) {
        close(lfd);
        return false;
    }
    cr_assert_eq(listen(lfd, 1), 0);
    cr_assert_eq(getsockname(lfd, (struct sockaddr *)&bound, &blen), 0);
    *cfd = socket(addr->sa_family, SOCK_STREAM, 0);
    cr_assert_eq(connect(*cfd, (struct sockaddr *)&bound, blen), 0, "%s", strerror(errno));
    *afd = accept(lfd, NULL, NULL);
    cr_assert_geq(*afd, 0);
    close(lfd);
    return true;
}

static void
expect_same_host(const struct sockaddr *addr, socklen_t len, const char *what)
{
    int cfd, afd;

    if (!tcp_pair(addr, len, &cfd, &afd)) {
        cr_log_warn("%s: cannot bind, not checked", what);
        return;
    }
    cr_expect_eq(tcpopt_same_host(cfd), 1, "%s: the client's end", what);
    cr_expect_eq(tcpopt_same_host(afd), 1, "%s: the accepted end", what);
    close(cfd);
    close(afd);
}

Test(tcpopt, loopback_connections_are_same_host)
{
    struct sockaddr_in in = {.sin_family = AF_INET};
    struct sockaddr_in6 in6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};

    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    expect_same_host((struct sockaddr *)&in, sizeof(in), "127.0.0.1");
    in.sin_addr.s_addr = htonl(0x7f000002); /* all of 127/8 is loopback */
    expect_same_host((struct sockaddr *)&in, sizeof(in), "127.0.0.2");
    expect_same_host((struct sockaddr *)&in6, sizeof(in6), "::1");
}

Test(tcpopt, the_hosts_own_address_is_same_host)
{
    struct ifaddrs *ifs, *i;
    bool found = false;

    cr_assert_eq(getifaddrs(&ifs), 0);
    for (i = ifs; i != NULL && !found; i = i->ifa_next) {
        if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET &&
            (ntohl(((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr) >> 24) != 127) {
            struct sockaddr_in in = *(struct sockaddr_in *)i->ifa_addr;
            in.sin_port = 0;
            expect_same_host((struct sockaddr *)&in, sizeof(in), "the host's own address");
            found = true;
        }
    }
    freeifaddrs(ifs);
    if (!found) {
        cr_log_warn("no non-loopback IPv4 address on this host: not checked");
    }
}

Test(tcpopt, unix_and_unconnected_sockets_are_not)
{
    int sv[2];
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    cr_expect_eq(tcpopt_same_host(sv[0]), 0);
    cr_expect_eq(tcpopt_same_host(fd), 0, "no peer yet");
    cr_expect_eq(tcpopt_same_host(-1), 0);
    close(sv[0]);
    close(sv[1]);
    close(fd);
}

Test(tcpopt, congestion_is_set_or_refused_with_the_reason)
{
    struct sockaddr_in in = {.sin_family = AF_INET};
    char name[16] = "";
    socklen_t len = sizeof(name);
    int cfd, afd;

    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert(tcp_pair((struct sockaddr *)&in, sizeof(in), &cfd, &afd));
    cr_expect_eq(tcpopt_congestion(afd, TCPOPT_LOCAL_CONGESTION), 0);
    cr_assert_eq(getsockopt(afd, IPPROTO_TCP, TCP_CONGESTION, name, &len), 0);
    cr_expect_str_eq(name, TCPOPT_LOCAL_CONGESTION);
    cr_expect_eq(tcpopt_congestion(afd, "no-such-cc"), -ENOENT);
    len = sizeof(name);
    cr_assert_eq(getsockopt(afd, IPPROTO_TCP, TCP_CONGESTION, name, &len), 0);
    cr_expect_str_eq(name, TCPOPT_LOCAL_CONGESTION, "unchanged by the failure");
    close(cfd);
    close(afd);
}

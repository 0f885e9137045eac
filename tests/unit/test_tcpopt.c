/*
 * test_tcpopt: which connections util/tcpopt.c counts as same-host, and setting a
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
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "tcpopt.h"

/* Whether this host can bind a TCP socket to addr (no IPv6, say, and it cannot). */
static bool
can_bind(const struct sockaddr *addr, socklen_t len)
{
    int fd = socket(addr->sa_family, SOCK_STREAM, 0);
    bool ok = fd >= 0 && bind(fd, addr, len) == 0;

    if (fd >= 0) {
        close(fd);
    }
    return ok;
}

/* A connected TCP pair to addr (port 0: the listener picks one): the client in *cfd,
 * the accepted end in *afd. false when the address cannot be bound. */
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

    cr_assert(tcp_pair(addr, len, &cfd, &afd), "%s: cannot bind: %s", what, strerror(errno));
    cr_expect_eq(tcpopt_same_host(cfd), 1, "%s: the client's end", what);
    cr_expect_eq(tcpopt_same_host(afd), 1, "%s: the accepted end", what);
    close(cfd);
    close(afd);
}

Test(tcpopt, loopback_connections_are_same_host)
{
    struct sockaddr_in in = {.sin_family = AF_INET};

    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    expect_same_host((struct sockaddr *)&in, sizeof(in), "127.0.0.1");
    in.sin_addr.s_addr = htonl(0x7f000002); /* all of 127/8 is loopback */
    expect_same_host((struct sockaddr *)&in, sizeof(in), "127.0.0.2");
}

Test(tcpopt, ipv6_loopback_connections_are_same_host)
{
    struct sockaddr_in6 in6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};

    if (!can_bind((struct sockaddr *)&in6, sizeof(in6))) {
        cr_skip_test("::1 cannot be bound on this host (no IPv6): not checked");
    }
    expect_same_host((struct sockaddr *)&in6, sizeof(in6), "::1");
}

Test(tcpopt, the_hosts_own_address_is_same_host)
{
    struct ifaddrs *ifs, *i;
    struct sockaddr_in in = {.sin_family = AF_INET};
    bool found = false;

    cr_assert_eq(getifaddrs(&ifs), 0);
    for (i = ifs; i != NULL && !found; i = i->ifa_next) {
        if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET &&
            (ntohl(((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr) >> 24) != 127) {
            in = *(struct sockaddr_in *)i->ifa_addr;
            in.sin_port = 0;
            found = true;
        }
    }
    freeifaddrs(ifs);
    if (!found) {
        cr_skip_test("no non-loopback IPv4 address on this host: not checked");
    }
    expect_same_host((struct sockaddr *)&in, sizeof(in), "the host's own address");
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

Test(tcpopt, addresses_on_this_host_are_told_before_connecting)
{
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons(7431)};
    struct sockaddr_in6 in6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    struct ifaddrs *ifs;

    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_expect_eq(tcpopt_addr_same_host((struct sockaddr *)&in, sizeof(in)), 1, "127.0.0.1");
    in.sin_addr.s_addr = htonl(0x7f000002);
    cr_expect_eq(tcpopt_addr_same_host((struct sockaddr *)&in, sizeof(in)), 1, "127.0.0.2");
    cr_expect_eq(tcpopt_addr_same_host((struct sockaddr *)&in6, sizeof(in6)), 1, "::1");
    cr_assert_eq(inet_pton(AF_INET6, "::ffff:127.0.0.1", &in6.sin6_addr), 1);
    cr_expect_eq(tcpopt_addr_same_host((struct sockaddr *)&in6, sizeof(in6)), 1, "v4-mapped");
    /* TEST-NET-1 (RFC 5737) is nobody's: only a route is looked up, nothing is sent */
    in.sin_addr.s_addr = htonl(0xc0000201);
    cr_expect_eq(tcpopt_addr_same_host((struct sockaddr *)&in, sizeof(in)), 0, "192.0.2.1");
    cr_expect_eq(tcpopt_addr_same_host((struct sockaddr *)&in, sizeof(in) - 1), 0, "short");
    cr_expect_eq(tcpopt_addr_same_host((struct sockaddr *)&un, sizeof(un)), 0, "AF_UNIX");
    cr_expect_eq(tcpopt_addr_same_host(NULL, 0), 0);

    cr_assert_eq(getifaddrs(&ifs), 0);
    for (struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
        if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET &&
            (ntohl(((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr) >> 24) != 127) {
            struct sockaddr_in own = *(struct sockaddr_in *)i->ifa_addr;
            own.sin_port = htons(7431);
            cr_expect_eq(tcpopt_addr_same_host((struct sockaddr *)&own, sizeof(own)), 1,
                         "the host's own address on %s", i->ifa_name);
        }
    }
    freeifaddrs(ifs);
}

/* The host's default, as net.ipv4.tcp_congestion_control says it. */
static void
host_default(char *buf, size_t size)
{
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r");

    cr_assert_not_null(f);
    cr_assert_not_null(fgets(buf, (int)size, f));
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
}

static void
expect_algorithm(int fd, const char *want, const char *what)
{
    char name[TCPOPT_NAME_MAX] = "";
    socklen_t len = sizeof(name) - 1;

    cr_assert_eq(getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len), 0);
    name[len] = '\0';
    cr_expect_str_eq(name, want, "%s", what);
}

/*
 * An algorithm the host does not default to, so that getting it proves it was set; NULL
 * when the kernel offers no second one.
 */
static const char *
other_algorithm(const char *host)
{
    const char *cands[] = {TCPOPT_LOCAL_CONGESTION, "cubic", "bbr"};
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    cr_assert_geq(fd, 0);
    for (size_t i = 0; i < sizeof(cands) / sizeof(cands[0]); i++) {
        if (strcmp(cands[i], host) != 0 && tcpopt_congestion(fd, cands[i]) == 0) {
            close(fd);
            return cands[i];
        }
    }
    close(fd);
    return NULL;
}

Test(tcpopt, host_congestion_is_the_sysctls)
{
    char host[TCPOPT_NAME_MAX], got[TCPOPT_NAME_MAX];

    host_default(host, sizeof(host));
    cr_assert_eq(tcpopt_host_congestion(got, sizeof(got)), 0);
    cr_expect_str_eq(got, host, "tcpopt_host_congestion is the sysctl's");
}

Test(tcpopt, the_algorithm_is_in_place_before_the_handshake_on_both_ends)
{
    struct sockaddr_in in = {.sin_family = AF_INET};
    struct sockaddr_storage bound;
    socklen_t blen = sizeof(bound);
    char host[TCPOPT_NAME_MAX];
    const char *want;

    host_default(host, sizeof(host));
    if ((want = other_algorithm(host)) == NULL) {
        cr_skip_test("no congestion control but the host's %s can be set (tried "
                     TCPOPT_LOCAL_CONGESTION ", cubic, bbr): not checked", host);
    }
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_eq(bind(lfd, (struct sockaddr *)&in, sizeof(in)), 0);
    cr_assert_eq(listen(lfd, 4), 0);
    cr_assert_eq(tcpopt_congestion(lfd, want), 0);
    cr_assert_eq(getsockname(lfd, (struct sockaddr *)&bound, &blen), 0);

    int cfd = socket(AF_INET, SOCK_STREAM, 0);
    cr_expect_eq(tcpopt_connect_congestion(cfd, (struct sockaddr *)&bound, blen, want), 0);
    expect_algorithm(cfd, want, "the client's socket, before connect");
    cr_assert_eq(connect(cfd, (struct sockaddr *)&bound, blen), 0);
    int afd = accept(lfd, NULL, NULL);
    cr_assert_geq(afd, 0);
    expect_algorithm(afd, want, "the accepted socket inherits the listener's");

    /* settled as the daemon does: same host keeps it, elsewhere or "" gets the host's */
    cr_expect_eq(tcpopt_accepted_congestion(afd, want, 1), 0);
    expect_algorithm(afd, want, "same host");
    cr_expect_eq(tcpopt_accepted_congestion(afd, want, 0), 0);
    expect_algorithm(afd, host, "a client elsewhere");
    cr_expect_eq(tcpopt_accepted_congestion(afd, want, 1), 0);
    expect_algorithm(afd, want, "same host again");
    cr_expect_eq(tcpopt_accepted_congestion(afd, "", 1), 0);
    expect_algorithm(afd, host, "no local algorithm configured");
    cr_expect_eq(tcpopt_accepted_congestion(afd, "no-such-cc", 1), -ENOENT);
    expect_algorithm(afd, host, "unchanged by the failure");
    close(afd);
    close(cfd);

    /* a client socket headed elsewhere is left to the host's: 192.0.2.1 is TEST-NET-1 */
    cfd = socket(AF_INET, SOCK_STREAM, 0);
    in.sin_addr.s_addr = htonl(0xc0000201);
    in.sin_port = htons(7431);
    cr_expect_eq(tcpopt_connect_congestion(cfd, (struct sockaddr *)&in, sizeof(in), want), 0);
    expect_algorithm(cfd, host, "a socket to another host (never connected)");
    close(cfd);
    close(lfd);
}

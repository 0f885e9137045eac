/*
 * splice_loopback: what a zero-copy send costs on this host's loopback, without the daemon
 * (docs/performance.md, the R = 2 put: a spliced replica send, tried and not kept). A
 * sender writes 1 GiB over loopback TCP to a child that reads it 256 KiB at a time, 1 MiB
 * per send from a 64 MiB buffer, and prints the CPU (user + system) of each side:
 *
 *   cc -O2 -o /tmp/splice_loopback tests/bench/splice_loopback.c
 *   /tmp/splice_loopback MODE BACKING
 *
 * MODE: writev (the kernel copies), splice (vmsplice into a 1 MiB pipe, splice to the
 * socket: the socket references the buffer's pages). BACKING: memfd (a shared memfd mapping
 * of 4 KiB pages, as the arena), anon (anonymous, MADV_NOHUGEPAGE), thp (anonymous,
 * MADV_HUGEPAGE). Not part of make bench: run each mode several times, alternating.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOTAL (1ull << 30)
#define BUF (64ull << 20)
#define CHUNK (1ull << 20)

static double
cpu_self(void)
{
    struct rusage r;

    getrusage(RUSAGE_SELF, &r);
    return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec)
           + (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

static void
die(const char *what)
{
    fprintf(stderr, "splice_loopback: %s: %s\n", what, strerror(errno));
    exit(1);
}

/* receiver: read TOTAL bytes, write its CPU seconds to fd out. */
static void
receive(const struct sockaddr_in *a, int out)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    char *b = malloc(256u << 10);
    unsigned long long got = 0;
    double c;

    if (s < 0 || b == NULL || connect(s, (const struct sockaddr *)a, sizeof(*a)) != 0) {
        die("receiver");
    }
    while (got < TOTAL) {
        ssize_t r = read(s, b, 256u << 10);
        if (r <= 0) {
            die("read");
        }
        got += (unsigned long long)r;
    }
    c = cpu_self();
    if (write(out, &c, sizeof(c)) != sizeof(c)) {
        die("write");
    }
    exit(0);
}

int
main(int argc, char **argv)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    int splicing, ls, s, one = 1, res[2], p[2];
    unsigned long long sent = 0, off = 0;
    double c0, c1, rx = 0;
    char *buf;
    pid_t pid;

    if (argc != 3 || (strcmp(argv[1], "writev") != 0 && strcmp(argv[1], "splice") != 0)
        || (strcmp(argv[2], "memfd") != 0 && strcmp(argv[2], "anon") != 0
            && strcmp(argv[2], "thp") != 0)) {
        fprintf(stderr, "usage: splice_loopback writev|splice memfd|anon|thp\n");
        return 2;
    }
    splicing = strcmp(argv[1], "splice") == 0;
    if (strcmp(argv[2], "memfd") == 0) {
        int fd = memfd_create("splice_loopback", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)BUF) != 0) {
            die("memfd");
        }
        buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    } else {
        buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (buf != MAP_FAILED) {
            madvise(buf, BUF, strcmp(argv[2], "thp") == 0 ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
        }
    }
    if (buf == MAP_FAILED) {
        die("mmap");
    }
    memset(buf, 1, BUF);
    ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 1) != 0
        || getsockname(ls, (struct sockaddr *)&a, &al) != 0 || pipe(res) != 0) {
        die("listen");
    }
    pid = fork();
    if (pid < 0) {
        die("fork");
    }
    if (pid == 0) {
        receive(&a, res[1]);
    }
    s = accept(ls, NULL, NULL);
    if (s < 0 || pipe(p) != 0) {
        die("accept");
    }
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fcntl(p[1], F_SETPIPE_SZ, (int)CHUNK);
    c0 = cpu_self();
    while (sent < TOTAL) {
        struct iovec v = {.iov_base = buf + off, .iov_len = CHUNK};
        ssize_t n;

        if (!splicing) {
            n = writev(s, &v, 1);
            if (n <= 0) {
                die("writev");
            }
        } else {
            n = vmsplice(p[1], &v, 1, 0);
            if (n <= 0) {
                die("vmsplice");
            }
            for (ssize_t left = n; left > 0;) {
                ssize_t w = splice(p[0], NULL, s, NULL, (size_t)left, SPLICE_F_MOVE);
                if (w <= 0) {
                    die("splice");
                }
                left -= w;
            }
        }
        sent += (unsigned long long)n;
        off = (off + (unsigned long long)n) % (BUF - CHUNK);
    }
    c1 = cpu_self();
    if (read(res[0], &rx, sizeof(rx)) != sizeof(rx)) {
        die("the receiver's CPU");
    }
    waitpid(pid, NULL, 0);
    printf("%s %s: sender %.3f s, receiver %.3f s, total %.3f s of CPU for 1 GiB\n", argv[1],
           argv[2], c1 - c0, rx, c1 - c0 + rx);
    return 0;
}

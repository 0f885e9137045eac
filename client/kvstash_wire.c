/*
 * kvstash_wire: the socket I/O, request encoding and connecting of one
 * libkvstash connection.
 *
 * This module owns a struct kvstash's socket (plain or TLS), its reusable
 * request buffer and the allocation of its fixed reply buffer. It connects
 * the socket (Unix, or TCP with TLS when asked) and closes it. Requests are
 * packed with msgpack-c's packer; a value larger than KVSTASH_WIRE_COPY_MAX
 * is not copied but sent by sendmsg straight from the caller's memory, and a
 * request may carry one file descriptor (SCM_RIGHTS) on its first bytes.
 * Replies are not decoded here: kvstash_reply.c's reader pulls their bytes
 * through kvstash_wire_recv, and this module must not interpret a reply
 * byte. It must not decide policy (how batches are split and pipelined,
 * server-limit defaults, argument checks: kvstash.c), keep global state,
 * install a signal handler (sends use MSG_NOSIGNAL) or start a thread.
 */
#include "kvstash_wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <msgpack.h>

#include "kverr.h"
#include "tcpopt.h"

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

#define KVSTASH_WIRE_DEFAULT_PORT "7431"
#define KVSTASH_WIRE_COPY_MAX (8u * 1024)    /* values up to this are copied into the request */

/* A piece of the request being built: bytes of wbuf (ext NULL) or caller memory. */
struct kvstash_wire_seg {
    const uint8_t *ext;
    size_t off;
    size_t len;
};

/* ---- errors ---- */

void
kvstash_wire_errf(struct kvstash *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
}

int
kvstash_wire_fail(struct kvstash *c, int rc)
{
    if (c->err[0] == '\0') {
        kvstash_wire_errf(c, "%s", kv_strerror(rc));
    }
    c->broken = 1;
    return rc;
}

/* ---- socket I/O ---- */

static int
kvstash_wire_wait(struct kvstash *c, short events)
{
    struct pollfd p = { .fd = c->fd, .events = events, .revents = 0 };

    for (;;) {
        int r = poll(&p, 1, c->timeout_ms > 0 ? c->timeout_ms : -1);
        if (r > 0) {
            return 0; /* POLLERR/POLLHUP too: the next call reports the reason */
        }
        if (r == 0) {
            kvstash_wire_errf(c, "no progress on the connection for %d ms", c->timeout_ms);
            return -ETIMEDOUT;
        }
        if (errno != EINTR) {
            return -errno;
        }
    }
}

/*
 * kvstash_wire_recvmsg: recv on a Unix socket, keeping a descriptor that
 * comes along (SCM_RIGHTS, map_segment's reply) for kvstash_wire_take_fd.
 * Descriptors beyond the one slot are closed.
 */
static ssize_t
kvstash_wire_recvmsg(struct kvstash *c, void *buf, size_t len, int flags)
{
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(4 * sizeof(int))];
    } u;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                        .msg_controllen = sizeof(u.buf)};
    ssize_t r = recvmsg(c->fd, &mh, flags | MSG_CMSG_CLOEXEC);

    for (struct cmsghdr *cm = r >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; cm != NULL;
         cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
            continue;
        }
        size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);

        for (size_t i = 0; i < nfd; i++) {
            int fd;

            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            if (c->rfd < 0) {
                c->rfd = fd;
            } else {
                close(fd);
            }
        }
    }
    return r;
}

int
kvstash_wire_take_fd(struct kvstash *c)
{
    int fd = c->rfd;

    c->rfd = -1;
    return fd;
}

/*
 * OpenSSL writes to the socket with write(2), which raises SIGPIPE when the
 * server is gone, and a library must not kill its caller (plain sockets send
 * with MSG_NOSIGNAL). So SIGPIPE is blocked in the calling thread around the
 * TLS calls that write, and one they raised is taken back before the mask is
 * restored; one that was pending before is left alone.
 */
struct kvstash_wire_nosig {
    sigset_t old;
    bool pending;
};

static void
kvstash_wire_nosig_begin(struct kvstash_wire_nosig *ns)
{
    sigset_t pipe_set, pend;

    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    ns->pending = sigpending(&pend) == 0 && sigismember(&pend, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_set, &ns->old);
}

static void
kvstash_wire_nosig_end(const struct kvstash_wire_nosig *ns)
{
    sigset_t pipe_set, pend;
    const struct timespec zero = {0, 0};
    int saved = errno;              /* the TLS call's, which its caller reads */

    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    if (!ns->pending && sigpending(&pend) == 0 && sigismember(&pend, SIGPIPE) == 1) {
        (void)sigtimedwait(&pipe_set, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &ns->old, NULL);
    errno = saved;
}

/*
 * kvstash_wire_tls_io: one SSL_read (write false) or SSL_write of len bytes
 * at buf, waiting (poll, c->timeout_ms) while TLS wants the socket: bytes
 * (> 0) or -errno; the server's close is -ECONNRESET.
 */
static ssize_t
kvstash_wire_tls_io(struct kvstash *c, void *buf, size_t len, bool write)
{
    int n = len > INT32_MAX ? INT32_MAX : (int)len;

    for (;;) {
        struct kvstash_wire_nosig ns;
        int r, rc;

        kvstash_wire_nosig_begin(&ns);   /* SSL_read may write too (a key update, say) */
        r = write ? SSL_write(c->ssl, buf, n) : SSL_read(c->ssl, buf, n);
        kvstash_wire_nosig_end(&ns);

        if (r > 0) {
            return r;
        }
        switch (SSL_get_error(c->ssl, r)) {
        case SSL_ERROR_WANT_READ:
            rc = kvstash_wire_wait(c, POLLIN);
            break;
        case SSL_ERROR_WANT_WRITE:
            rc = kvstash_wire_wait(c, POLLOUT);
            break;
        case SSL_ERROR_ZERO_RETURN:
            kvstash_wire_errf(c, "server closed the connection");
            return -ECONNRESET;
        case SSL_ERROR_SYSCALL:
            if (errno == EINTR) {
                continue;
            }
            kvstash_wire_errf(c, "server closed the connection");
            return errno != 0 ? -errno : -ECONNRESET;
        default:
            kvstash_wire_errf(c, "TLS: %s", ERR_error_string(ERR_get_error(), NULL));
            ERR_clear_error();
            return -EPROTO;
        }
        if (rc != 0) {
            return rc;
        }
    }
}

ssize_t
kvstash_wire_recv(struct kvstash *c, void *buf, size_t len, bool all)
{
    int flags = c->timeout_ms > 0 ? MSG_DONTWAIT : (all ? MSG_WAITALL : 0);

    if (c->ssl != NULL) {
        return kvstash_wire_tls_io(c, buf, len, false);
    }
    for (;;) {
        ssize_t r = c->is_unix ? kvstash_wire_recvmsg(c, buf, len, flags)
                               : recv(c->fd, buf, len, flags);
        if (r > 0) {
            return r;
        }
        if (r == 0) {
            kvstash_wire_errf(c, "server closed the connection");
            return -ECONNRESET;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = kvstash_wire_wait(c, POLLIN);
            if (rc != 0) {
                return rc;
            }
            continue;
        }
        return -errno;
    }
}

/*
 * kvstash_wire_send_iov: write all of iov[0..n) (modified as it goes). With
 * fd >= 0 the descriptor rides, as SCM_RIGHTS, on the first sendmsg that
 * writes any byte: the kernel attaches it to those bytes, so a partial write
 * must not carry it again and the rest goes without it. 0 or -errno.
 */
static int
kvstash_wire_send_iov(struct kvstash *c, struct iovec *iov, size_t n, int fd)
{
    int flags = MSG_NOSIGNAL | (c->timeout_ms > 0 ? MSG_DONTWAIT : 0);
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;

    for (; c->ssl != NULL && n > 0; iov++, n--) {
        while (iov->iov_len > 0) {
            ssize_t w = kvstash_wire_tls_io(c, iov->iov_base, iov->iov_len, true);

            if (w < 0) {
                return (int)w;
            }
            iov->iov_base = (uint8_t *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    while (n > 0) {
        struct msghdr mh;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = n < IOV_MAX ? n : IOV_MAX;
        if (fd >= 0) {
            memset(&ctl, 0, sizeof(ctl));
            mh.msg_control = ctl.buf;
            mh.msg_controllen = sizeof(ctl.buf);
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &fd, sizeof(int));
        }
        ssize_t w = sendmsg(c->fd, &mh, flags);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = kvstash_wire_wait(c, POLLOUT);
                if (rc != 0) {
                    return rc;
                }
                continue;
            }
            return -errno;
        }
        if (w > 0) {
            fd = -1; /* it went with these bytes */
        }
        size_t left = (size_t)w;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

/* ---- request building ---- */

static int
kvstash_wire_reserve(struct kvstash *c, size_t add)
{
    if (add <= c->wcap - c->wlen) {
        return 0;
    }
    size_t cap = c->wcap ? c->wcap : 4096;
    while (cap - c->wlen < add) {
        if (cap > SIZE_MAX / 2) {
            return -ENOMEM;
        }
        cap *= 2;
    }
    uint8_t *p = realloc(c->wbuf, cap);
    if (p == NULL) {
        return -ENOMEM;
    }
    c->wbuf = p;
    c->wcap = cap;
    return 0;
}

static int
kvstash_wire_pack_write(void *data, const char *buf, size_t len)
{
    struct kvstash *c = data;

    if (c->wfail || kvstash_wire_reserve(c, len) != 0) {
        c->wfail = 1;
        return -1;
    }
    memcpy(c->wbuf + c->wlen, buf, len);
    c->wlen += len;
    return 0;
}

static int
kvstash_wire_seg_add(struct kvstash *c, const uint8_t *ext, size_t off, size_t len)
{
    if (len == 0) {
        return 0;
    }
    if (c->nsegs == c->segcap) {
        size_t cap = c->segcap ? c->segcap * 2 : 64;
        struct kvstash_wire_seg *s = realloc(c->segs, cap * sizeof(*s));
        if (s == NULL) {
            c->wfail = 1;
            return -ENOMEM;
        }
        c->segs = s;
        c->segcap = cap;
    }
    c->segs[c->nsegs++] = (struct kvstash_wire_seg){ .ext = ext, .off = off, .len = len };
    return 0;
}

/*
 * kvstash_wire_packer: a packer appending to c's request. msgpack_packer is
 * only (data, write callback), so one is made per call instead of kept in c.
 */
static msgpack_packer
kvstash_wire_packer(struct kvstash *c)
{
    msgpack_packer pk;

    msgpack_packer_init(&pk, c, kvstash_wire_pack_write);
    return pk;
}

void
kvstash_wire_req_begin(struct kvstash *c, const char *method, uint32_t nparams)
{
    msgpack_packer pk = kvstash_wire_packer(c);

    c->wlen = 0;
    c->wfail = 0;
    c->nsegs = 0;
    c->seg_start = 0;
    c->wfd = -1;
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint32(&pk, 0);
    msgpack_pack_uint32(&pk, c->next_msgid);
    msgpack_pack_str_with_body(&pk, method, strlen(method));
    msgpack_pack_array(&pk, nparams);
}

void
kvstash_wire_req_array(struct kvstash *c, uint32_t n)
{
    msgpack_packer pk = kvstash_wire_packer(c);

    msgpack_pack_array(&pk, n);
}

void
kvstash_wire_req_key(struct kvstash *c, const void *key, size_t klen)
{
    msgpack_packer pk = kvstash_wire_packer(c);

    msgpack_pack_bin_with_body(&pk, klen ? key : "", klen);
}

void
kvstash_wire_req_uint(struct kvstash *c, uint64_t v)
{
    msgpack_packer pk = kvstash_wire_packer(c);

    msgpack_pack_uint64(&pk, v);
}

void
kvstash_wire_req_value(struct kvstash *c, const void *val, size_t vlen)
{
    msgpack_packer pk = kvstash_wire_packer(c);

    if (vlen <= KVSTASH_WIRE_COPY_MAX) {
        msgpack_pack_bin_with_body(&pk, vlen ? val : "", vlen);
        return;
    }
    msgpack_pack_bin(&pk, vlen);
    kvstash_wire_seg_add(c, NULL, c->seg_start, c->wlen - c->seg_start);
    kvstash_wire_seg_add(c, val, 0, vlen);
    c->seg_start = c->wlen;
}

void
kvstash_wire_req_str(struct kvstash *c, const char *s)
{
    msgpack_packer pk = kvstash_wire_packer(c);

    msgpack_pack_str_with_body(&pk, s, strlen(s));
}

void
kvstash_wire_req_force(struct kvstash *c)
{
    msgpack_packer pk = kvstash_wire_packer(c);

    msgpack_pack_map(&pk, 1);
    msgpack_pack_str_with_body(&pk, "force", 5);
    msgpack_pack_true(&pk);
}

void
kvstash_wire_req_group_size(struct kvstash *c, uint32_t g)
{
    msgpack_packer pk = kvstash_wire_packer(c);

    msgpack_pack_map(&pk, 1);
    msgpack_pack_str_with_body(&pk, "group_size", 10);
    msgpack_pack_uint32(&pk, g);
}

void
kvstash_wire_req_bool(struct kvstash *c, bool v)
{
    msgpack_packer pk = kvstash_wire_packer(c);

    if (v) {
        msgpack_pack_true(&pk);
    } else {
        msgpack_pack_false(&pk);
    }
}

void
kvstash_wire_req_map(struct kvstash *c, uint32_t n)
{
    msgpack_packer pk = kvstash_wire_packer(c);

    msgpack_pack_map(&pk, n);
}

void
kvstash_wire_req_size(struct kvstash *c, uint64_t size)
{
    msgpack_packer pk = kvstash_wire_packer(c);

    msgpack_pack_map(&pk, 1);
    msgpack_pack_str_with_body(&pk, "size", 4);
    msgpack_pack_uint64(&pk, size);
}

void
kvstash_wire_req_fd(struct kvstash *c, int fd)
{
    c->wfd = fd;
}

int
kvstash_wire_req_send(struct kvstash *c)
{
    int fd = c->wfd;

    c->wfd = -1; /* the request's descriptor is sent (or failed to be) at most once */
    kvstash_wire_seg_add(c, NULL, c->seg_start, c->wlen - c->seg_start);
    if (c->wfail) {
        kvstash_wire_errf(c, "out of memory building a request");
        return -ENOMEM;
    }
    if (c->iovcap < c->nsegs) {
        struct iovec *v = realloc(c->iov, c->nsegs * sizeof(*v));
        if (v == NULL) {
            kvstash_wire_errf(c, "out of memory building a request");
            return -ENOMEM;
        }
        c->iov = v;
        c->iovcap = c->nsegs;
    }
    for (size_t i = 0; i < c->nsegs; i++) {
        const struct kvstash_wire_seg *s = &c->segs[i];
        c->iov[i].iov_base = (void *)(s->ext ? s->ext : c->wbuf + s->off);
        c->iov[i].iov_len = s->len;
    }
    int rc = kvstash_wire_send_iov(c, c->iov, c->nsegs, fd);
    if (rc == 0) {
        c->next_msgid++;
    }
    return rc;
}

/* ---- connecting ---- */

/*
 * kvstash_wire_sock_connect: connect fd, within timeout_ms when it is > 0. An
 * interrupted blocking connect goes on in the background, so it is waited
 * for rather than retried.
 */
static int
kvstash_wire_sock_connect(int fd, const struct sockaddr *sa, socklen_t salen, int timeout_ms)
{
    int fl = -1;

    if (timeout_ms > 0) {
        fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
            return -errno;
        }
    }
    if (connect(fd, sa, salen) != 0) {
        if (errno != EINPROGRESS && errno != EINTR) {
            return -errno;
        }
        struct pollfd p = { .fd = fd, .events = POLLOUT, .revents = 0 };
        for (;;) {
            int r = poll(&p, 1, timeout_ms > 0 ? timeout_ms : -1);
            if (r > 0) {
                break;
            }
            if (r == 0) {
                return -ETIMEDOUT;
            }
            if (errno != EINTR) {
                return -errno;
            }
        }
        int soerr = 0;
        socklen_t len = sizeof(soerr);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0) {
            return -errno;
        }
        if (soerr != 0) {
            return -soerr;
        }
    }
    if (fl >= 0 && fcntl(fd, F_SETFL, fl) != 0) {
        return -errno;
    }
    return 0;
}

static int
kvstash_wire_connect_unix(const char *path, int timeout_ms, int *fdp)
{
    struct sockaddr_un sun;

    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    if (path[0] == '\0') {
        return -EINVAL;
    }
    if (strlen(path) >= sizeof(sun.sun_path)) {
        return -ENAMETOOLONG;
    }
    memcpy(sun.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    int rc = kvstash_wire_sock_connect(fd, (const struct sockaddr *)&sun, sizeof(sun), timeout_ms);
    if (rc != 0) {
        close(fd);
        return rc;
    }
    *fdp = fd;
    return 0;
}

/*
 * kvstash_wire_port_ok: p is a TCP port: decimal digits only, 1..65535.
 * getaddrinfo would take "83737" as port 18201 (it truncates to 16 bits)
 * and a service name from /etc/services, so the address is checked here.
 */
static bool
kvstash_wire_port_ok(const char *p)
{
    unsigned long v = 0;

    if (p[0] == '\0') {
        return false;
    }
    for (; *p != '\0'; p++) {
        if (*p < '0' || *p > '9') {
            return false;
        }
        v = v * 10 + (unsigned long)(*p - '0');
        if (v > 65535) {
            return false;
        }
    }
    return v > 0;
}

/*
 * kvstash_wire_split_hostport: "host:port", "[v6]:port", "host", "[v6]" or a
 * bare v6 address into host and port (the default port when there is none).
 * 0, or -EINVAL with c->err saying what is wrong with addr.
 */
static int
kvstash_wire_split_hostport(struct kvstash *c, const char *addr, char *host, size_t hostsz,
                            char *port, size_t portsz)
{
    const char *h = addr;
    size_t hlen;
    const char *p = NULL;

    if (addr[0] == '[') {
        const char *close = strchr(addr, ']');
        if (close == NULL || (close[1] != '\0' && close[1] != ':')) {
            goto bad;
        }
        h = addr + 1;
        hlen = (size_t)(close - h);
        p = close[1] == ':' ? close + 2 : NULL;
    } else {
        const char *colon = strrchr(addr, ':');
        if (colon != NULL && strchr(addr, ':') == colon) {
            hlen = (size_t)(colon - addr);
            p = colon + 1;
        } else {
            hlen = strlen(addr); /* no port, or a bare IPv6 address */
        }
    }
    if (hlen == 0 || hlen >= hostsz) {
        goto bad;
    }
    if (p != NULL && (!kvstash_wire_port_ok(p) || strlen(p) >= portsz)) {
        if (p[0] == '\0') {
            kvstash_wire_errf(c, "bad address '%s': no port after ':'", addr);
        } else {
            kvstash_wire_errf(c, "bad address '%s': port '%s' is not a number in 1..65535",
                              addr, p);
        }
        return -EINVAL;
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    snprintf(port, portsz, "%s", p ? p : KVSTASH_WIRE_DEFAULT_PORT);
    return 0;

bad:
    kvstash_wire_errf(c, "bad address '%s' (use host:port, [v6]:port or unix:/path)", addr);
    return -EINVAL;
}

static int
kvstash_wire_connect_tcp(struct kvstash *c, const char *addr, int timeout_ms, int *fdp)
{
    char host[256];
    char port[32];
    struct addrinfo hints;
    struct addrinfo *res = NULL;
    int rc = kvstash_wire_split_hostport(c, addr, host, sizeof(host), port, sizeof(port));

    if (rc != 0) {
        return rc;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG | AI_NUMERICSERV;
    int gai = getaddrinfo(host, port, &hints, &res);
    if (gai != 0) {
        switch (gai) {
        case EAI_SYSTEM: return -errno;
        case EAI_MEMORY: return -ENOMEM;
        case EAI_AGAIN: return -EAGAIN;
        case EAI_SERVICE: return -EINVAL;
        default: return -ENXIO; /* no such host */
        }
    }
    rc = -ENXIO;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            rc = -errno;
            continue;
        }
        /* before the handshake, or it comes too late (tcpopt.h); elsewhere: the host's */
        (void)tcpopt_connect_congestion(fd, ai->ai_addr, ai->ai_addrlen, TCPOPT_LOCAL_CONGESTION);
        rc = kvstash_wire_sock_connect(fd, ai->ai_addr, ai->ai_addrlen, timeout_ms);
        if (rc == 0) {
            int one = 1;
            (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            *fdp = fd;
            break;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return rc;
}

int
kvstash_wire_connect(struct kvstash *c, const char *addr)
{
    const char *path = NULL;
    int rc;

    c->err[0] = '\0';
    if (strncmp(addr, "unix:", 5) == 0) {
        path = addr + 5;
    } else if (strchr(addr, '/') != NULL) {
        path = addr;
    }
    if (path != NULL) {
        rc = kvstash_wire_connect_unix(path, c->timeout_ms, &c->fd);
        c->is_unix = rc == 0;
    } else {
        rc = kvstash_wire_connect_tcp(c, addr, c->timeout_ms, &c->fd);
    }
    if (c->err[0] != '\0') {
        return rc; /* the address was refused with its reason */
    }
    if (rc == -EINVAL || rc == -ENAMETOOLONG) {
        kvstash_wire_errf(c, "bad address '%s' (use host:port, [v6]:port or unix:/path)", addr);
    } else if (rc == -ENXIO) {
        kvstash_wire_errf(c, "unknown host");
    } else if (rc == -ETIMEDOUT) {
        kvstash_wire_errf(c, "no answer to connect within %d ms", c->timeout_ms);
    }
    return rc;
}

/* ---- lifecycle ---- */

int
kvstash_wire_init(struct kvstash *c)
{
    c->fd = -1;
    c->wfd = -1;
    c->rfd = -1;
    c->fill_max = KVSTASH_WIRE_RBUF_SIZE;
    c->rbuf = malloc(KVSTASH_WIRE_RBUF_SIZE);
    return c->rbuf != NULL ? 0 : -ENOMEM;
}

int
kvstash_wire_tls_start(struct kvstash *c, const char *addr, const struct kvstash_tls *tls)
{
    char host[256], port[32];
    unsigned char ip[16];
    int rc;

    if (tls->ca_file == NULL || tls->ca_file[0] == '\0') {
        kvstash_wire_errf(c, "TLS needs the CA file the server's certificate chains to");
        return -EINVAL;
    }
    if (kvstash_wire_split_hostport(c, addr, host, sizeof(host), port, sizeof(port)) != 0) {
        return -EINVAL;
    }
    c->ssl_ctx = SSL_CTX_new(TLS_client_method());
    if (c->ssl_ctx == NULL) {
        return -ENOMEM;
    }
    SSL_CTX_set_min_proto_version(c->ssl_ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(c->ssl_ctx, SSL_MODE_ENABLE_PARTIAL_WRITE
                                     | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_verify(c->ssl_ctx, SSL_VERIFY_PEER, NULL);
    if (SSL_CTX_load_verify_locations(c->ssl_ctx, tls->ca_file, NULL) != 1) {
        kvstash_wire_errf(c, "TLS CA file %s: %s", tls->ca_file,
                          ERR_error_string(ERR_get_error(), NULL));
        return -EINVAL;
    }
    if (tls->cert_file != NULL && tls->cert_file[0] != '\0'
        && (SSL_CTX_use_certificate_chain_file(c->ssl_ctx, tls->cert_file) != 1
            || SSL_CTX_use_PrivateKey_file(c->ssl_ctx, tls->key_file != NULL ? tls->key_file : "",
                                           SSL_FILETYPE_PEM) != 1)) {
        kvstash_wire_errf(c, "TLS client certificate %s or key: %s", tls->cert_file,
                          ERR_error_string(ERR_get_error(), NULL));
        return -EINVAL;
    }
    c->ssl = SSL_new(c->ssl_ctx);
    if (c->ssl == NULL || SSL_set_fd(c->ssl, c->fd) != 1) {
        return -ENOMEM;
    }
    /* The name or address in addr is what the certificate must be for. */
    if (inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), host);
    } else {
        SSL_set_tlsext_host_name(c->ssl, host);
        SSL_set1_host(c->ssl, host);
    }
    if (fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK) != 0) {
        return -errno;
    }
    for (;;) {
        struct kvstash_wire_nosig ns;

        kvstash_wire_nosig_begin(&ns);
        int r = SSL_connect(c->ssl);
        kvstash_wire_nosig_end(&ns);
        if (r == 1) {
            return 0;
        }
        switch (SSL_get_error(c->ssl, r)) {
        case SSL_ERROR_WANT_READ:
            rc = kvstash_wire_wait(c, POLLIN);
            break;
        case SSL_ERROR_WANT_WRITE:
            rc = kvstash_wire_wait(c, POLLOUT);
            break;
        default:
            kvstash_wire_errf(c, "TLS handshake: %s", ERR_error_string(ERR_get_error(), NULL));
            ERR_clear_error();
            return -EPROTO;
        }
        if (rc != 0) {
            return rc;
        }
    }
}

void
kvstash_wire_deinit(struct kvstash *c)
{
    if (c->ssl != NULL) {
        struct kvstash_wire_nosig ns;

        kvstash_wire_nosig_begin(&ns);
        (void)SSL_shutdown(c->ssl);
        kvstash_wire_nosig_end(&ns);
        SSL_free(c->ssl);
        ERR_clear_error();
    }
    SSL_CTX_free(c->ssl_ctx);
    if (c->fd >= 0) {
        close(c->fd);
    }
    if (c->rfd >= 0) {
        close(c->rfd);
    }
    free(c->wbuf);
    free(c->segs);
    free(c->iov);
    free(c->rbuf);
}

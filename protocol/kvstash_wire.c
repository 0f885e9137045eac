/*
 * kvstash_wire: the socket I/O and wire codec of one libkvstash connection.
 *
 * This module owns a struct kvstash's socket, its reusable request buffer
 * and its fixed reply buffer. Requests are packed with msgpack-c's packer; a
 * value larger than KVSTASH_WIRE_COPY_MAX is not copied but sent by sendmsg
 * straight from the caller's memory, and a request may carry one file
 * descriptor (SCM_RIGHTS) on its first bytes. Replies are decoded by a
 * streaming reader that pulls bytes from the socket as it needs them, checks
 * every declared length and count against what the reply may still hold (and
 * against the caller's capacity) before acting on it, and receives large bin
 * bodies straight into the caller's buffers. The server is not trusted: a
 * malformed reply breaks the connection with -EPROTO instead of being
 * guessed at, and nothing is allocated from a wire length except a value
 * read into a malloc'd buffer (bounded by the server's max_value_size) and a
 * stats array (bounded by the reply size). It must not decide policy (how
 * batches are split and pipelined, server-limit defaults, argument checks:
 * kvstash.c), keep global state, install a signal handler (sends use
 * MSG_NOSIGNAL) or start a thread.
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
#define KVSTASH_WIRE_RBUF_SIZE (64u * 1024)  /* reply buffer; big bodies bypass it */
#define KVSTASH_WIRE_PEEK 512u               /* refill size right after a body went direct */
#define KVSTASH_WIRE_DIRECT_MIN (16u * 1024) /* bodies this big switch refills to the peek size */
#define KVSTASH_WIRE_RECV_PIECE (64u * 1024) /* at most this much per receive of a body */
#define KVSTASH_WIRE_COPY_MAX (8u * 1024)    /* values up to this are copied into the request */
#define KVSTASH_WIRE_MAX_DEPTH 16            /* nesting skipped at most */
#define KVSTASH_WIRE_SALVAGE_MS 200          /* wait for a parting notification */

/* A piece of the request being built: bytes of wbuf (ext NULL) or caller memory. */
struct kvstash_wire_seg {
    const uint8_t *ext;
    size_t off;
    size_t len;
};

enum kvstash_wire_rtype {
    RD_NIL, RD_BOOL, RD_UINT, RD_INT, RD_FLOAT, RD_STR, RD_BIN, RD_ARRAY, RD_MAP, RD_EXT
};

/* One decoded object header; bodies (str/bin/ext) and elements are still unread. */
struct kvstash_wire_head {
    enum kvstash_wire_rtype type;
    bool b;
    uint64_t u;                   /* RD_UINT */
    int64_t i;                    /* RD_INT (negative only) */
    uint64_t len;                 /* body bytes (STR/BIN/EXT), elements (ARRAY), pairs (MAP) */
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

/* kvstash_wire_bad: a malformed reply: say what, break the connection, -EPROTO. */
static int
kvstash_wire_bad(struct kvstash *c, const char *what)
{
    kvstash_wire_errf(c, "malformed reply from server: %s", what);
    c->broken = 1;
    return -EPROTO;
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

/* kvstash_wire_recv: some bytes (> 0) or -errno; end of stream is -ECONNRESET. */
static ssize_t
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

/* ---- reply reading ---- */

/* kvstash_wire_fill: make at least need (<= 9) bytes readable at rbuf[rpos]. */
static int
kvstash_wire_fill(struct kvstash *c, size_t need)
{
    size_t have = c->rlen - c->rpos;

    if (have >= need) {
        return 0;
    }
    memmove(c->rbuf, c->rbuf + c->rpos, have);
    c->rpos = 0;
    c->rlen = have;
    while (c->rlen < need) {
        size_t room = KVSTASH_WIRE_RBUF_SIZE - c->rlen;
        size_t want = c->fill_max < room ? c->fill_max : room;
        if (want < need - c->rlen) {
            want = need - c->rlen;
        }
        ssize_t r = kvstash_wire_recv(c, c->rbuf + c->rlen, want, false);
        if (r < 0) {
            return (int)r;
        }
        c->rlen += (size_t)r;
    }
    return 0;
}

/* kvstash_wire_body: consume len body bytes into dst, or drop them when dst is NULL. */
static int
kvstash_wire_body(struct kvstash *c, uint8_t *dst, uint64_t len)
{
    if (len > c->msg_left) {
        return kvstash_wire_bad(c, "body longer than the reply");
    }
    c->msg_left -= len;

    size_t have = c->rlen - c->rpos;
    size_t take = len < have ? (size_t)len : have;
    if (dst != NULL && take > 0) {
        memcpy(dst, c->rbuf + c->rpos, take);
        dst += take;
    }
    c->rpos += take;
    len -= take;
    if (len == 0) {
        c->fill_max = KVSTASH_WIRE_RBUF_SIZE;
        return 0;
    }
    if (dst == NULL) {
        /* drain through the buffer, never reading past the body */
        while (len > 0) {
            size_t want = len < KVSTASH_WIRE_RBUF_SIZE ? (size_t)len : KVSTASH_WIRE_RBUF_SIZE;
            ssize_t r = kvstash_wire_recv(c, c->rbuf, want, false);
            if (r < 0) {
                return (int)r;
            }
            len -= (uint64_t)r;
        }
        c->rpos = c->rlen = 0;
        c->fill_max = KVSTASH_WIRE_RBUF_SIZE;
        return 0;
    }
    /*
     * The rest goes straight from the socket into the caller's buffer, at most
     * KVSTASH_WIRE_RECV_PIECE bytes a call: the kernel lets the sender go on only when a
     * receive returns, so receiving a megabyte at once leaves the daemon idle meanwhile
     * (on one connection, 1 MiB gets ran 10-20% faster in 64 KiB pieces).
     */
    c->fill_max =
        take + len >= KVSTASH_WIRE_DIRECT_MIN ? KVSTASH_WIRE_PEEK : KVSTASH_WIRE_RBUF_SIZE;
    while (len > 0) {
        size_t want = len < KVSTASH_WIRE_RECV_PIECE ? (size_t)len : KVSTASH_WIRE_RECV_PIECE;
        ssize_t r = kvstash_wire_recv(c, dst, want, true);
        if (r < 0) {
            return (int)r;
        }
        dst += r;
        len -= (uint64_t)r;
    }
    return 0;
}

static uint64_t
kvstash_wire_be(const uint8_t *p, int n)
{
    uint64_t v = 0;

    for (int i = 0; i < n; i++) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* kvstash_wire_head_read: decode one object header; bodies and elements stay unread. */
static int
kvstash_wire_head_read(struct kvstash *c, struct kvstash_wire_head *h)
{
    int rc = kvstash_wire_fill(c, 1);
    if (rc != 0) {
        return rc;
    }
    uint8_t b = c->rbuf[c->rpos];
    size_t hs = 1; /* header bytes */
    int ln = 0;    /* bytes of the big-endian length/value after the type byte */
    uint64_t extra = 0;

    memset(h, 0, sizeof(*h));
    if (b <= 0x7f) {
        h->type = RD_UINT;
        h->u = b;
    } else if (b <= 0x8f) {
        h->type = RD_MAP;
        h->len = b & 0x0f;
    } else if (b <= 0x9f) {
        h->type = RD_ARRAY;
        h->len = b & 0x0f;
    } else if (b <= 0xbf) {
        h->type = RD_STR;
        h->len = b & 0x1f;
    } else if (b >= 0xe0) {
        h->type = RD_INT;
        h->i = (int8_t)b;
    } else {
        switch (b) {
        case 0xc0: h->type = RD_NIL; break;
        case 0xc2: h->type = RD_BOOL; h->b = false; break;
        case 0xc3: h->type = RD_BOOL; h->b = true; break;
        case 0xc4: h->type = RD_BIN; ln = 1; break;
        case 0xc5: h->type = RD_BIN; ln = 2; break;
        case 0xc6: h->type = RD_BIN; ln = 4; break;
        case 0xc7: h->type = RD_EXT; ln = 1; extra = 1; break;
        case 0xc8: h->type = RD_EXT; ln = 2; extra = 1; break;
        case 0xc9: h->type = RD_EXT; ln = 4; extra = 1; break;
        case 0xca: h->type = RD_FLOAT; hs = 5; break;
        case 0xcb: h->type = RD_FLOAT; hs = 9; break;
        case 0xcc: h->type = RD_UINT; ln = 1; break;
        case 0xcd: h->type = RD_UINT; ln = 2; break;
        case 0xce: h->type = RD_UINT; ln = 4; break;
        case 0xcf: h->type = RD_UINT; ln = 8; break;
        case 0xd0: h->type = RD_INT; ln = 1; break;
        case 0xd1: h->type = RD_INT; ln = 2; break;
        case 0xd2: h->type = RD_INT; ln = 4; break;
        case 0xd3: h->type = RD_INT; ln = 8; break;
        case 0xd4: h->type = RD_EXT; h->len = 2; break;
        case 0xd5: h->type = RD_EXT; h->len = 3; break;
        case 0xd6: h->type = RD_EXT; h->len = 5; break;
        case 0xd7: h->type = RD_EXT; h->len = 9; break;
        case 0xd8: h->type = RD_EXT; h->len = 17; break;
        case 0xd9: h->type = RD_STR; ln = 1; break;
        case 0xda: h->type = RD_STR; ln = 2; break;
        case 0xdb: h->type = RD_STR; ln = 4; break;
        case 0xdc: h->type = RD_ARRAY; ln = 2; break;
        case 0xdd: h->type = RD_ARRAY; ln = 4; break;
        case 0xde: h->type = RD_MAP; ln = 2; break;
        case 0xdf: h->type = RD_MAP; ln = 4; break;
        default: return kvstash_wire_bad(c, "reserved byte 0xc1");
        }
    }
    if (ln > 0) {
        hs = 1 + (size_t)ln;
    }
    if (hs > c->msg_left) {
        return kvstash_wire_bad(c, "reply longer than allowed");
    }
    rc = kvstash_wire_fill(c, hs);
    if (rc != 0) {
        return rc;
    }
    if (ln > 0) {
        uint64_t v = kvstash_wire_be(c->rbuf + c->rpos + 1, ln);
        if (h->type == RD_UINT) {
            h->u = v;
        } else if (h->type == RD_INT) {
            /* sign-extend the ln-byte two's complement value */
            int64_t s = ln == 8 ? (int64_t)v : (int64_t)(v ^ (1ull << (8 * ln - 1)))
                                                   - (int64_t)(1ull << (8 * ln - 1));
            if (s >= 0) {
                h->type = RD_UINT;
                h->u = (uint64_t)s;
            } else {
                h->i = s;
            }
        } else {
            h->len = v + extra;
        }
    }
    c->rpos += hs;
    c->msg_left -= hs;
    /* every element needs at least one byte; every body byte must fit */
    if (h->type == RD_MAP ? h->len > c->msg_left / 2 : h->len > c->msg_left) {
        return kvstash_wire_bad(c, "length or count beyond the reply size");
    }
    return 0;
}

static int kvstash_wire_skip_nested(struct kvstash *c, int depth);

/* kvstash_wire_skip_rest: consume what follows header h (read at nesting depth). */
static int
kvstash_wire_skip_rest(struct kvstash *c, const struct kvstash_wire_head *h, int depth)
{
    switch (h->type) {
    case RD_STR:
    case RD_BIN:
    case RD_EXT:
        return kvstash_wire_body(c, NULL, h->len);
    case RD_ARRAY:
    case RD_MAP:
        if (depth >= KVSTASH_WIRE_MAX_DEPTH) {
            return kvstash_wire_bad(c, "nesting too deep");
        }
        for (uint64_t i = 0; i < (h->type == RD_MAP ? 2 * h->len : h->len); i++) {
            int rc = kvstash_wire_skip_nested(c, depth + 1);

            if (rc != 0) {
                return rc;
            }
        }
        return 0;
    default:
        return 0;       /* scalars (floats too): the header read took all of it */
    }
}

static int
kvstash_wire_skip_nested(struct kvstash *c, int depth)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    return rc != 0 ? rc : kvstash_wire_skip_rest(c, &h, depth);
}

int
kvstash_wire_skip(struct kvstash *c)
{
    return kvstash_wire_skip_nested(c, 1);
}

/* kvstash_wire_str_copy: a str/bin body of len bytes into dst (truncated, NUL-terminated). */
static int
kvstash_wire_str_copy(struct kvstash *c, uint64_t len, char *dst, size_t size)
{
    size_t n = len < size - 1 ? (size_t)len : size - 1;
    int rc = kvstash_wire_body(c, (uint8_t *)dst, n);

    dst[rc == 0 ? n : 0] = '\0';
    if (rc == 0 && len > n) {
        rc = kvstash_wire_body(c, NULL, len - n);
    }
    return rc;
}

/* Read one header and require its type; why names the failure for the error message. */
static int
kvstash_wire_head_expect(struct kvstash *c, struct kvstash_wire_head *h,
                         enum kvstash_wire_rtype type, const char *why)
{
    int rc = kvstash_wire_head_read(c, h);

    if (rc == 0 && h->type != type) {
        rc = kvstash_wire_bad(c, why);
    }
    return rc;
}

int
kvstash_wire_read_uint(struct kvstash *c, uint64_t *v)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_expect(c, &h, RD_UINT, "expected a non-negative integer");

    if (rc == 0) {
        *v = h.u;
    }
    return rc;
}

int
kvstash_wire_read_code(struct kvstash *c, int *code)
{
    uint64_t v;
    int rc = kvstash_wire_read_uint(c, &v);

    if (rc != 0) {
        return rc;
    }
    if (v > INT_MAX) {
        return kvstash_wire_bad(c, "status code out of range");
    }
    *code = (int)v;
    return 0;
}

int
kvstash_wire_read_int(struct kvstash *c, int64_t *v)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type == RD_INT) {
        *v = h.i;
    } else if (h.type == RD_UINT && h.u <= INT64_MAX) {
        *v = (int64_t)h.u;
    } else {
        return kvstash_wire_bad(c, h.type == RD_UINT ? "integer out of range"
                                                     : "expected an integer");
    }
    return 0;
}

int
kvstash_wire_read_bool(struct kvstash *c, bool *v)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_expect(c, &h, RD_BOOL, "expected a bool");

    if (rc == 0) {
        *v = h.b;
    }
    return rc;
}

int
kvstash_wire_read_array(struct kvstash *c, uint64_t n)
{
    static const char why[] = "result array does not match the keys sent";
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_expect(c, &h, RD_ARRAY, why);

    if (rc == 0 && h.len != n) {
        rc = kvstash_wire_bad(c, why);
    }
    return rc;
}

/*
 * kvstash_wire_error_read: the rest of an error triple [code, name, message]
 * whose array header (n elements) was read. Keeps the message; returns the
 * code (>0) or -errno.
 */
static int
kvstash_wire_error_read(struct kvstash *c, uint64_t n)
{
    char name[32] = "";
    char msg[KVSTASH_WIRE_ERRLEN] = "";
    uint64_t code;
    int rc;

    if (n < 1) {
        return kvstash_wire_bad(c, "empty error");
    }
    rc = kvstash_wire_read_uint(c, &code);
    for (uint64_t i = 1; rc == 0 && i < n; i++) {
        struct kvstash_wire_head h;
        if (i > 2) {
            rc = kvstash_wire_skip(c);
            continue;
        }
        rc = kvstash_wire_head_read(c, &h);
        if (rc != 0) {
            break;
        }
        if (h.type == RD_STR || h.type == RD_BIN) {
            rc = i == 1 ? kvstash_wire_str_copy(c, h.len, name, sizeof(name))
                        : kvstash_wire_str_copy(c, h.len, msg, sizeof(msg));
        } else if (h.type == RD_ARRAY || h.type == RD_MAP || h.type == RD_EXT) {
            return kvstash_wire_bad(c, "error name or message is not a string");
        }
    }
    if (rc != 0) {
        return rc;
    }
    if (code == 0 || code > INT_MAX) {
        code = KVSTASH_EINTERNAL;
    }
    if (msg[0] != '\0') {
        kvstash_wire_errf(c, "%s", msg);
    } else {
        kvstash_wire_errf(c, "%s", name[0] ? name : kv_errname((int)code));
    }
    return (int)code;
}

int
kvstash_wire_reply(struct kvstash *c, uint64_t budget)
{
    for (;;) {
        struct kvstash_wire_head h;
        uint64_t kind;
        int rc;

        c->msg_left = budget;
        rc = kvstash_wire_head_read(c, &h);
        if (rc == 0 && (h.type != RD_ARRAY || h.len < 3 || h.len > 4)) {
            rc = kvstash_wire_bad(c, "not an rpc message");
        }
        if (rc == 0) {
            rc = kvstash_wire_read_uint(c, &kind);
        }
        if (rc != 0) {
            return rc;
        }
        if (kind == 2 && h.len == 3) {
            char method[32];
            struct kvstash_wire_head p;
            if (c->msg_left > KVSTASH_WIRE_NOTICE_MAX) {
                c->msg_left = KVSTASH_WIRE_NOTICE_MAX;
            }
            rc = kvstash_wire_head_read(c, &p);
            if (rc == 0 && p.type != RD_STR) {
                rc = kvstash_wire_bad(c, "notification method is not a string");
            }
            if (rc == 0) {
                rc = kvstash_wire_str_copy(c, p.len, method, sizeof(method));
            }
            if (rc != 0) {
                return rc;
            }
            if (strcmp(method, "error") != 0) {
                rc = kvstash_wire_skip(c); /* a notification this client does not know */
                if (rc != 0) {
                    return rc;
                }
                continue;
            }
            rc = kvstash_wire_head_read(c, &p);
            if (rc == 0 && p.type != RD_ARRAY) {
                rc = kvstash_wire_bad(c, "error notification without [code, name, message]");
            }
            if (rc == 0) {
                rc = kvstash_wire_error_read(c, p.len);
            }
            c->broken = 1; /* the server closes after an error notification */
            return rc;
        }
        if (kind != 1 || h.len != 4) {
            return kvstash_wire_bad(c, "unexpected message type");
        }
        uint64_t msgid;
        rc = kvstash_wire_read_uint(c, &msgid);
        if (rc != 0) {
            return rc;
        }
        if (msgid != c->want_msgid) {
            return kvstash_wire_bad(c, "reply id does not match the request");
        }
        c->want_msgid++;
        rc = kvstash_wire_head_read(c, &h);
        if (rc != 0) {
            return rc;
        }
        if (h.type == RD_NIL) {
            return 0;
        }
        if (h.type != RD_ARRAY) {
            return kvstash_wire_bad(c, "error is neither nil nor an array");
        }
        if (c->msg_left > KVSTASH_WIRE_NOTICE_MAX + KVSTASH_WIRE_SMALL_REPLY) {
            c->msg_left = KVSTASH_WIRE_NOTICE_MAX + KVSTASH_WIRE_SMALL_REPLY;
        }
        int code = kvstash_wire_error_read(c, h.len);
        if (code < 0) {
            return code;
        }
        rc = kvstash_wire_skip(c); /* the result of a failed request (nil) */
        return rc != 0 ? rc : code;
    }
}

/*
 * A server that refuses the connection writes its error notification and
 * closes, so our send fails; the notification is behind the replies owed.
 * A send that timed out has no such server behind it: it fails at once, so
 * the call ends within the timeout.
 */
int
kvstash_wire_salvage(struct kvstash *c, int rc)
{
    char why[KVSTASH_WIRE_ERRLEN];
    int saved = c->timeout_ms;

    if (rc == -ETIMEDOUT) {
        if (c->err[0] == '\0') {
            kvstash_wire_errf(c, "sending a request: %s", kv_strerror(rc));
        }
        return kvstash_wire_fail(c, rc);
    }
    memcpy(why, c->err, sizeof(why));
    c->timeout_ms = KVSTASH_WIRE_SALVAGE_MS;
    while (c->want_msgid != c->next_msgid + 1) {
        int r = kvstash_wire_reply(c, UINT64_MAX);
        if (r == 0) {
            r = kvstash_wire_skip(c);
        }
        if (r > 0 && c->broken) {
            c->timeout_ms = saved;
            return r; /* the notification, message kept */
        }
        if (r < 0) {
            break;
        }
    }
    c->timeout_ms = saved;
    memcpy(c->err, why, sizeof(why));
    if (c->err[0] == '\0') {
        kvstash_wire_errf(c, "sending a request: %s", kv_strerror(rc));
    }
    return kvstash_wire_fail(c, rc);
}

int
kvstash_wire_call(struct kvstash *c, uint64_t budget)
{
    int rc = kvstash_wire_req_send(c);

    if (rc < 0) {
        return rc == -ENOMEM ? rc : kvstash_wire_salvage(c, rc);
    }
    rc = kvstash_wire_reply(c, budget);
    if (rc < 0) {
        return kvstash_wire_fail(c, rc);
    }
    return rc;
}

/* ---- typed results ---- */

int
kvstash_wire_read_value(struct kvstash *c, void *buf, size_t cap, void **out, size_t *vlen)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type == RD_NIL) {
        *vlen = 0;
        return KVSTASH_ENOTFOUND;
    }
    if (h.type != RD_BIN && h.type != RD_STR) {
        return kvstash_wire_bad(c, "value is neither bin nor nil");
    }
    *vlen = (size_t)h.len;
    if (out != NULL) {
        uint64_t limit = c->hello.max_value_size;
        if (h.len > limit || h.len > SIZE_MAX - 1) {
            kvstash_wire_errf(c, "value of %llu bytes exceeds the server's max_value_size %llu",
                              (unsigned long long)h.len, (unsigned long long)limit);
            rc = kvstash_wire_body(c, NULL, h.len);
            return rc != 0 ? rc : KVSTASH_ETOOLARGE;
        }
        *out = malloc(h.len ? (size_t)h.len : 1);
        if (*out == NULL) {
            rc = kvstash_wire_body(c, NULL, h.len);
            kvstash_wire_errf(c, "out of memory for a value of %llu bytes",
                              (unsigned long long)h.len);
            return rc != 0 ? rc : -ENOMEM;
        }
        rc = kvstash_wire_body(c, *out, h.len);
        if (rc != 0) {
            free(*out);
            *out = NULL;
        }
        return rc;
    }
    if (h.len > cap) {
        rc = kvstash_wire_body(c, NULL, h.len);
        return rc != 0 ? rc : KVSTASH_ETOOLARGE;
    }
    return kvstash_wire_body(c, buf, h.len);
}

int
kvstash_wire_read_size(struct kvstash *c, uint64_t *size)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type == RD_NIL) {
        return KVSTASH_ENOTFOUND;
    }
    if (h.type != RD_UINT) {
        return kvstash_wire_bad(c, "size is neither an integer nor nil");
    }
    *size = h.u;
    return 0;
}

/*
 * kvstash_wire_map_entry: the next entry of a map being read: its name (a
 * str, truncated into name[0..size)) and its value's header; the value's
 * body or elements are the caller's to read or skip.
 */
static int
kvstash_wire_map_entry(struct kvstash *c, char *name, size_t size, struct kvstash_wire_head *v)
{
    struct kvstash_wire_head k;
    int rc = kvstash_wire_head_expect(c, &k, RD_STR, "a map key is not a string");

    if (rc == 0) {
        rc = kvstash_wire_str_copy(c, k.len, name, size);
    }
    return rc != 0 ? rc : kvstash_wire_head_read(c, v);
}

int
kvstash_wire_read_hello(struct kvstash *c, struct kvstash_hello *hi)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc == 0 && h.type != RD_MAP) {
        rc = kvstash_wire_bad(c, "hello result is not a map");
    }
    for (uint64_t i = 0; rc == 0 && i < h.len; i++) {
        struct kvstash_wire_head v;
        char name[32];
        uint64_t *slot = NULL;
        char *str = NULL;
        size_t strsz = 0;

        rc = kvstash_wire_map_entry(c, name, sizeof(name), &v);
        if (rc != 0) {
            break;
        }
        if (strcmp(name, "server") == 0) {
            str = hi->server;
            strsz = sizeof(hi->server);
        } else if (strcmp(name, "version") == 0) {
            str = hi->version;
            strsz = sizeof(hi->version);
        } else if (strcmp(name, "node_id") == 0) {
            str = hi->node_id;
            strsz = sizeof(hi->node_id);
        } else if (strcmp(name, "protocol") == 0) {
            slot = &hi->protocol;
        } else if (strcmp(name, "max_key_size") == 0) {
            slot = &hi->max_key_size;
        } else if (strcmp(name, "max_value_size") == 0) {
            slot = &hi->max_value_size;
        } else if (strcmp(name, "max_batch") == 0) {
            slot = &hi->max_batch;
        } else if (strcmp(name, "max_message_size") == 0) {
            slot = &hi->max_message_size;
        } else if (strcmp(name, "lease_ttl_ms") == 0) {
            slot = &hi->lease_ttl_ms;
        }
        if (strcmp(name, "rdma_qp") == 0 && v.type == RD_BIN && v.len <= sizeof(c->rdma_qp)) {
            rc = kvstash_wire_body(c, c->rdma_qp, v.len);
            c->rdma_qp_len = rc == 0 ? (size_t)v.len : 0;
        } else if (str != NULL && (v.type == RD_STR || v.type == RD_BIN)) {
            rc = kvstash_wire_str_copy(c, v.len, str, strsz);
        } else if (slot != NULL && v.type == RD_UINT) {
            *slot = v.u;
        } else {
            rc = kvstash_wire_skip_rest(c, &v, 1);
        }
    }
    return rc;
}

int
kvstash_wire_read_segment(struct kvstash *c, uint64_t *segment, uint64_t *size)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_expect(c, &h, RD_MAP, "map_segment result is not a map");

    for (uint64_t i = 0; rc == 0 && i < h.len; i++) {
        struct kvstash_wire_head v;
        char name[16];

        rc = kvstash_wire_map_entry(c, name, sizeof(name), &v);
        if (rc != 0) {
            break;
        }
        if (strcmp(name, "segment") == 0 && v.type == RD_UINT) {
            *segment = v.u;
        } else if (strcmp(name, "size") == 0 && v.type == RD_UINT) {
            *size = v.u;
        } else {
            rc = kvstash_wire_skip_rest(c, &v, 1);
        }
    }
    return rc;
}

/* kvstash_wire_places_rest: the pieces of an array header h already read. */
static int
kvstash_wire_places_rest(struct kvstash *c, const struct kvstash_wire_head *h, uint64_t arena,
                         struct kvstash_wire_piece *places, size_t cap, size_t *n)
{
    if (h->len > cap) {
        return kvstash_wire_bad(c, "more pieces than an object has");
    }
    for (uint64_t i = 0; i < h->len; i++) {
        uint64_t seg, off, len;
        int rc = kvstash_wire_read_array(c, 3);

        if (rc == 0) {
            rc = kvstash_wire_read_uint(c, &seg);
        }
        if (rc == 0) {
            rc = kvstash_wire_read_uint(c, &off);
        }
        if (rc == 0) {
            rc = kvstash_wire_read_uint(c, &len);
        }
        if (rc != 0) {
            return rc;
        }
        if (seg != 0 || off > arena || len > arena - off) {
            return kvstash_wire_bad(c, "a piece outside the arena");
        }
        places[i].offset = off;
        places[i].length = len;
    }
    *n = (size_t)h->len;
    return 0;
}

int
kvstash_wire_read_places(struct kvstash *c, uint64_t arena, struct kvstash_wire_piece *places,
                         size_t cap, size_t *n)
{
    struct kvstash_wire_head h;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type == RD_UINT) {
        return h.u > 0 && h.u <= INT_MAX ? (int)h.u : kvstash_wire_bad(c, "bad status code");
    }
    if (h.type != RD_ARRAY) {
        return kvstash_wire_bad(c, "expected pieces or a code");
    }
    return kvstash_wire_places_rest(c, &h, arena, places, cap, n);
}

int
kvstash_wire_read_replica(struct kvstash *c, uint64_t arena, struct kvstash_wire_piece *places,
                          size_t cap, size_t *n, uint64_t *size, uint64_t *lease_ms)
{
    struct kvstash_wire_head h;
    bool have_pieces = false;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc != 0) {
        return rc;
    }
    if (h.type == RD_NIL) {
        return KVSTASH_ENOTFOUND;
    }
    if (h.type != RD_MAP) {
        return kvstash_wire_bad(c, "a replica is neither nil nor a map");
    }
    for (uint64_t i = 0; rc == 0 && i < h.len; i++) {
        struct kvstash_wire_head v;
        char name[16];

        rc = kvstash_wire_map_entry(c, name, sizeof(name), &v);
        if (rc != 0) {
            break;
        }
        if (strcmp(name, "pieces") == 0 && v.type == RD_ARRAY) {
            rc = kvstash_wire_places_rest(c, &v, arena, places, cap, n);
            have_pieces = rc == 0;
        } else if (strcmp(name, "size") == 0 && v.type == RD_UINT) {
            *size = v.u;
        } else if (strcmp(name, "lease_ms") == 0 && v.type == RD_UINT) {
            *lease_ms = v.u;
        } else {
            rc = kvstash_wire_skip_rest(c, &v, 1);
        }
    }
    if (rc == 0 && !have_pieces) {
        rc = kvstash_wire_bad(c, "a replica without pieces");
    }
    return rc;
}

int
kvstash_wire_read_stats(struct kvstash *c, struct kvstash_stat **items, size_t *n)
{
    struct kvstash_wire_head h;
    struct kvstash_stat *v = NULL;
    size_t cnt = 0, cap = 0;
    int rc = kvstash_wire_head_read(c, &h);

    if (rc == 0 && h.type != RD_MAP) {
        rc = kvstash_wire_bad(c, "stats result is not a map");
    }
    for (uint64_t i = 0; rc == 0 && i < h.len; i++) {
        struct kvstash_wire_head k, val;
        struct kvstash_stat st;

        rc = kvstash_wire_head_read(c, &k);
        if (rc == 0 && k.type != RD_STR && k.type != RD_BIN) {
            rc = kvstash_wire_bad(c, "stats name is not a string");
        }
        if (rc == 0) {
            rc = kvstash_wire_str_copy(c, k.len, st.name, sizeof(st.name));
        }
        if (rc == 0) {
            rc = kvstash_wire_head_read(c, &val);
        }
        if (rc != 0) {
            break;
        }
        if (val.type != RD_UINT) {
            /* not a counter: leave it out */
            if (val.type == RD_STR || val.type == RD_BIN || val.type == RD_EXT) {
                rc = kvstash_wire_body(c, NULL, val.len);
            } else if (val.type == RD_ARRAY || val.type == RD_MAP) {
                for (uint64_t j = 0; rc == 0 && j < (val.type == RD_MAP ? 2 : 1) * val.len;
                     j++) {
                    rc = kvstash_wire_skip_nested(c, 2);
                }
            }
            continue;
        }
        if (k.len >= sizeof(st.name)) {
            continue; /* a truncated name would be a different counter */
        }
        st.value = val.u;
        if (cnt == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            struct kvstash_stat *nv = realloc(v, ncap * sizeof(*nv));
            if (nv == NULL) {
                rc = -ENOMEM;
                break;
            }
            v = nv;
            cap = ncap;
        }
        v[cnt++] = st;
    }
    if (rc != 0) {
        free(v);
        return rc;
    }
    *items = v;
    *n = cnt;
    return 0;
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

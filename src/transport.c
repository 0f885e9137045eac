/*
 * transport: the plain transports (transport.h): TCP, and the Unix socket,
 * whose reads keep the descriptors a client attaches (SCM_RIGHTS, for
 * register_buffer) in the connection's queue and whose writes may attach
 * one. One syscall a call, on the socket as it is. What becomes of a queued
 * descriptor (claimed by a request, or closed when its message has passed)
 * is conn_read.c's; TLS is transport_tls.c's.
 */
#include "transport.h"

#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "conn_int.h"
#include "log.h"
#include "rpc.h"

static ssize_t
plain_readv(struct conn *c, struct iovec *iov, int n)
{
    return readv(c->fd, iov, n);
}

/*
 * unix_readv: recvmsg, keeping the descriptors that come with the bytes in
 * arrival order. A client that sends more than RPC_MAX_FDS unclaimed ones
 * gets the extra ones closed at once.
 */
static ssize_t
unix_readv(struct conn *c, struct iovec *iov, int n)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * RPC_MAX_FDS)];
    } ctl;
    struct msghdr msg;
    ssize_t rd;

    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = (size_t)n;
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof(ctl.buf);
    rd = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);
    if (rd <= 0) {
        return rd;
    }
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
            continue;
        }
        size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int fd;

            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(fd));
            if (c->nfdq < RPC_MAX_FDS) {
                /*
                 * The kernel ends a read with the bytes a descriptor was sent with, and
                 * a sender attaches it to the first bytes of its request: the request
                 * it belongs to starts inside this read (the last one to, see
                 * conn_take_fd).
                 */
                c->fdq[c->nfdq] = fd;
                c->fdq_lo[c->nfdq] = c->rx_total;
                c->fdq_hi[c->nfdq++] = c->rx_total + (uint64_t)rd;
            } else {
                close(fd);
            }
        }
    }
    if (msg.msg_flags & MSG_CTRUNC) {
        log_info("conn %llu %s: descriptors beyond %d dropped", (unsigned long long)c->id, c->peer,
                 RPC_MAX_FDS);
    }
    return rd;
}

/* plain_send_fd: writev with descriptor fd attached to the first byte (SCM_RIGHTS). */
static ssize_t
plain_send_fd(int sock, struct iovec *iov, int n, int fd)
{
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n,
                        .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);

    memset(&u, 0, sizeof(u));
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    return sendmsg(sock, &mh, MSG_NOSIGNAL);
}

static ssize_t
plain_writev(struct conn *c, struct iovec *iov, int n, int fd)
{
    return fd < 0 ? writev(c->fd, iov, n) : plain_send_fd(c->fd, iov, n, fd);
}

const struct conn_transport transport_tcp = {
    .name = "tcp",
    .raw = true,
    .readv = plain_readv,
    .writev = plain_writev,
};

const struct conn_transport transport_unix = {
    .name = "unix",
    .raw = true,
    .readv = unix_readv,
    .writev = plain_writev,
};

/*
 * sdnotify: the sd_notify(3) datagram, written by hand so that kvstashd needs no libsystemd.
 * It owns the socket address rules ($NOTIFY_SOCKET as a path or "@abstract") and one
 * non-blocking sendto; it must not decide what to say or when (src/server.c does).
 */
#include "sdnotify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int
sdnotify_send(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa;
    size_t n;
    int fd, rc = 1;

    if (path == NULL || path[0] == '\0') {
        return 0;
    }
    n = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || n >= sizeof(sa.sun_path)) {
        return -EINVAL;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@') {
        sa.sun_path[0] = '\0'; /* abstract: the name's length counts, not a NUL */
    }
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        return -errno;
    }
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '/'));
    if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen) < 0) {
        rc = -errno;
    }
    close(fd);
    return rc;
}

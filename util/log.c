/*
 * log: the daemon's one log sink. It owns the log file descriptor and its path, and turns a
 * printf-style message into one timestamped line written with a single write(2), so lines
 * from different threads never interleave and logrotate's copy never sees half a line. It
 * must not allocate, read the config or call back into other modules: any thread, including
 * one that is failing, can log. log_lock guards log_fd and log_path; it is held across the
 * write so a reopen can never close a descriptor that a writer is still using. It is a leaf
 * lock: nothing else is taken while it is held.
 */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LOG_LINE_MAX 2048 /* one line, newline included; longer messages end in "..." */

volatile int log_level_ = LOG_LEVEL_INFO;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = STDERR_FILENO;  /* guarded by log_lock */
static char log_path[PATH_MAX];   /* guarded by log_lock; "" = stderr */

/* Indexed by enum conf_log_level. */
static const char *const log_level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

static int
log_clamp(int level)
{
    if (level < LOG_LEVEL_ERROR) {
        return LOG_LEVEL_ERROR;
    }
    return level > LOG_LEVEL_DEBUG ? LOG_LEVEL_DEBUG : level;
}

static int
log_open_fd(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY, 0644);

    return fd < 0 ? -errno : fd;
}

/*
 * Point the sink at fd, and at path unless path is NULL (a reopen keeps it). The caller holds
 * log_lock. Closes the previous file.
 */
static void
log_swap_locked(int fd, const char *path)
{
    int old = log_fd;

    log_fd = fd;
    if (path != NULL) {
        snprintf(log_path, sizeof(log_path), "%s", path);
    }
    if (old != STDERR_FILENO && old != fd) {
        close(old);
    }
}

int
log_open(const char *path, int level)
{
    int fd;

    log_set_level(level);
    if (path == NULL || path[0] == '\0') {
        log_close();
        return 0;
    }
    if (strlen(path) >= sizeof(log_path)) {
        return -ENAMETOOLONG;
    }
    pthread_mutex_lock(&log_lock);
    fd = log_open_fd(path);
    if (fd >= 0) {
        log_swap_locked(fd, path);
    }
    pthread_mutex_unlock(&log_lock);
    return fd < 0 ? fd : 0;
}

void
log_set_level(int level)
{
    log_level_ = log_clamp(level);
}

int
log_reopen(void)
{
    int fd = 0;

    pthread_mutex_lock(&log_lock);
    if (log_path[0] != '\0') {
        fd = log_open_fd(log_path);
        if (fd >= 0) {
            log_swap_locked(fd, NULL);
        }
    }
    pthread_mutex_unlock(&log_lock);
    return fd < 0 ? fd : 0;
}

void
log_close(void)
{
    pthread_mutex_lock(&log_lock);
    log_swap_locked(STDERR_FILENO, "");
    pthread_mutex_unlock(&log_lock);
}

/* Write all of buf, retrying short writes and EINTR; a failing log has nowhere to report. */
static void
log_emit(const char *buf, size_t len)
{
    pthread_mutex_lock(&log_lock);
    while (len > 0) {
        ssize_t w = write(log_fd, buf, len);

        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            break;
        }
        buf += w;
        len -= (size_t)w;
    }
    pthread_mutex_unlock(&log_lock);
}

void
log_write(int level, const char *fmt, ...)
{
    char line[LOG_LINE_MAX];
    const size_t cap = sizeof(line) - 1; /* the last byte is kept for the newline */
    int saved_errno = errno;             /* callers often log, then look at errno */
    struct timespec ts;
    struct tm tm;
    size_t head, n;
    va_list ap;
    int w;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    head = strftime(line, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    w = snprintf(line + head, cap - head, ".%03ldZ kvstashd[%ld] %s ", ts.tv_nsec / 1000000L,
                 (long)getpid(), log_level_names[log_clamp(level)]);
    head += w < 0 ? 0 : (size_t)w;

    va_start(ap, fmt);
    w = vsnprintf(line + head, cap - head, fmt, ap);
    va_end(ap);
    if (w < 0) {
        w = snprintf(line + head, cap - head, "(log format error: %s)", fmt);
    }
    if (w < 0) {
        w = 0;
    }
    if ((size_t)w >= cap - head) {
        /* vsnprintf kept cap - head - 1 bytes; mark the cut. */
        n = cap - 1;
        memcpy(line + n - 3, "...", 3);
    } else {
        n = head + (size_t)w;
    }
    /* One record per line: a trailing newline is dropped, inner ones become spaces. */
    while (n > head && (line[n - 1] == '\n' || line[n - 1] == '\r')) {
        n--;
    }
    for (size_t i = head; i < n; i++) {
        if (line[i] == '\n' || line[i] == '\r') {
            line[i] = ' ';
        }
    }
    line[n++] = '\n';
    log_emit(line, n);
    errno = saved_errno;
}

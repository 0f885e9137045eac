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
static volatile int log_format_ = LOG_FORMAT_TEXT;

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

/*
 * A line being built: it never grows past cap (LOG_LINE_MAX less LOG_RESERVE, kept for the
 * closing quote, brace and newline), so the JSON stays well formed when a message is cut.
 */
#define LOG_RESERVE 8

struct log_buf {
    char p[LOG_LINE_MAX];
    size_t len;
    size_t cap;
    int cut;
};

/* Append n bytes whole, or nothing (and mark the line cut). */
static int
log_put(struct log_buf *b, const char *s, size_t n)
{
    if (b->len + n > b->cap) {
        b->cut = 1;
        return -1;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

/* Append s[0..n): JSON-escaped (quotes not included) when json, else with line breaks as
 * spaces. Stops at the cap, at a character boundary of the escaping. */
static void
log_put_text(struct log_buf *b, const char *s, size_t n, int json)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        size_t k = 1;

        esc[0] = (char)ch;
        if (!json) {
            if (ch == '\n' || ch == '\r') {
                esc[0] = ' ';
            }
        } else if (ch == '"' || ch == '\\') {
            esc[0] = '\\';
            esc[1] = (char)ch;
            k = 2;
        } else if (ch == '\n') {
            memcpy(esc, "\\n", 2);
            k = 2;
        } else if (ch < 0x20 || ch == 0x7f) {
            k = (size_t)snprintf(esc, sizeof(esc), "\\u%04x", ch);
        }
        if (log_put(b, esc, k) != 0) {
            return;
        }
    }
}

static void
log_put_str(struct log_buf *b, const char *s)
{
    log_put(b, s, strlen(s));
}

/* The head of a line: the text prefix, or the JSON object up to the message's value. */
static void
log_head(struct log_buf *b, int level, int json)
{
    static const char *const json_levels[] = {"error", "warn", "info", "debug"};
    struct timespec ts;
    struct tm tm;
    char tbuf[64];
    int w;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(tbuf, sizeof(tbuf), "%Y-%m-%dT%H:%M:%S", &tm);
    b->len = 0;
    b->cut = 0;
    b->cap = sizeof(b->p) - LOG_RESERVE;
    level = log_clamp(level);
    if (json) {
        w = snprintf(b->p, b->cap, "{\"ts\":\"%s.%03ldZ\",\"level\":\"%s\",\"pid\":%ld,\"msg\":\"",
                     tbuf, ts.tv_nsec / 1000000L, json_levels[level], (long)getpid());
    } else {
        w = snprintf(b->p, b->cap, "%s.%03ldZ kvstashd[%ld] %s ", tbuf, ts.tv_nsec / 1000000L,
                     (long)getpid(), log_level_names[level]);
    }
    b->len = w < 0 ? 0 : (size_t)w;
}

/* The end of a line: close the message (json) or mark the cut (text), then emit it. */
static void
log_finish(struct log_buf *b, int json)
{
    if (b->cut && !json) {
        b->cap = sizeof(b->p) - 1;
        log_put(b, "...", 3);
    }
    b->cap = sizeof(b->p);
    if (json) {
        log_put(b, "}", 1);
    }
    log_put(b, "\n", 1);
    log_emit(b->p, b->len);
}

void
log_set_format(int format)
{
    log_format_ = format == LOG_FORMAT_JSON ? LOG_FORMAT_JSON : LOG_FORMAT_TEXT;
}

void
log_fields(int level, const char *msg, const struct log_field *f, int n)
{
    struct log_buf b;
    int saved_errno = errno;
    int json = log_format_ == LOG_FORMAT_JSON;

    log_head(&b, level, json);
    log_put_text(&b, msg, strlen(msg), json);
    if (json) {
        b.cap += 1;                 /* the message's closing quote always fits */
        log_put(&b, "\"", 1);
        b.cap -= 1;
    }
    for (int i = 0; i < n && !b.cut; i++) {
        char num[32];
        size_t mark = b.len;

        if (json) {
            log_put(&b, ",\"", 2);
            log_put_str(&b, f[i].key);
            log_put(&b, "\":", 2);
        } else {
            log_put(&b, " ", 1);
            log_put_str(&b, f[i].key);
            log_put(&b, "=", 1);
        }
        if (b.cut) {
            b.len = mark;           /* no half key */
            break;
        }
        if (f[i].str == NULL) {
            snprintf(num, sizeof(num), "%lld", f[i].num);
            log_put_str(&b, num);
            if (b.cut) {
                b.len = mark;
                break;
            }
            continue;
        }
        if (json) {
            log_put(&b, "\"", 1);
            log_put_text(&b, f[i].str, strlen(f[i].str), 1);
            b.cap += 1;
            log_put(&b, "\"", 1);
            b.cap -= 1;
        } else if (strpbrk(f[i].str, " \t\"") != NULL || f[i].str[0] == '\0') {
            log_put(&b, "\"", 1);  /* quoted when it would not read as one word */
            log_put_text(&b, f[i].str, strlen(f[i].str), 1);
            log_put(&b, "\"", 1);
        } else {
            log_put_text(&b, f[i].str, strlen(f[i].str), 0);
        }
    }
    log_finish(&b, json);
    errno = saved_errno;
}

void
log_write(int level, const char *fmt, ...)
{
    char text[LOG_LINE_MAX];
    int saved_errno = errno;             /* callers often log, then look at errno */
    size_t n;
    va_list ap;
    int w;

    va_start(ap, fmt);
    w = vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (w < 0) {
        w = snprintf(text, sizeof(text), "(log format error: %s)", fmt);
    }
    n = w < 0 ? 0 : (size_t)w >= sizeof(text) ? sizeof(text) - 1 : (size_t)w;
    /* One record per line: a trailing newline is dropped, inner ones become spaces. */
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r')) {
        n--;
    }
    text[n] = '\0';
    errno = saved_errno;
    log_fields(level, text, NULL, 0);
    errno = saved_errno;
}

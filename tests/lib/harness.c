/*
 * harness: starts and stops the real kvstashd for integration tests, and the
 * raw-socket and process helpers the tests share (see harness.h).
 *
 * It owns the daemon process, its temporary data dir and captured output; it
 * must not assert (tests decide what a failure means) and must never wait
 * without a deadline or talk to anything but loopback.
 */
#include "harness.h"

#include "kvstash.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HARNESS_DEFAULT_MEMORY "256m"
#define HARNESS_MAX_ARGS 64
#define HARNESS_READ_CHUNK (256u * 1024u)

uint64_t
harness_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void
harness_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int
remaining_ms(uint64_t deadline)
{
    uint64_t now = harness_now_ms();
    return now >= deadline ? 0 : (int)(deadline - now);
}

void
harness_fill(void *buf, size_t n, uint64_t seed)
{
    uint8_t *p = buf;
    uint64_t x = seed ^ 0x9e3779b97f4a7c15ull;
    if (x == 0) {
        x = 1;
    }
    size_t i = 0;
    while (i < n) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        uint64_t v = x * 0x2545f4914f6cdd1dull;
        for (int b = 0; b < 8 && i < n; b++, i++) {
            p[i] = (uint8_t)(v >> (8 * b));
        }
    }
}

uint64_t
harness_seed(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

const char *
harness_daemon_path(void)
{
    const char *p = getenv("KVSTASHD");
    return p && *p ? p : "build/release/kvstashd";
}

const char *
harness_cli_path(void)
{
    const char *p = getenv("KVSTASH_CLI");
    return p && *p ? p : "build/release/kvstash";
}

bool
harness_exited_with(int status, int code)
{
    return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == code;
}

int
harness_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    int port = -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0) {
        port = ntohs(sa.sin_port);
    } else {
        port = -errno;
    }
    close(fd);
    return port;
}

/* ---- files ---- */

static int
write_file(const char *path, const char *text)
{
    char tmp[256];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        return -errno;
    }
    size_t len = strlen(text);
    bool ok = fwrite(text, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno ? errno : EIO;
        unlink(tmp);
        return -e;
    }
    return 0;
}

static char *
read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        if (f) {
            fclose(f);
        }
        return NULL;
    }
    if (f) {
        size_t n;
        while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
            len += n;
            if (cap - len - 1 == 0) {
                char *nb = realloc(buf, cap * 2);
                if (!nb) {
                    break;
                }
                buf = nb;
                cap *= 2;
            }
        }
        fclose(f);
    }
    buf[len] = '\0';
    return buf;
}

char *
harness_read_log(const struct harness *h)
{
    return read_file(h->log_path);
}

void
harness_dump_log(const struct harness *h)
{
    char *log = harness_read_log(h);
    fprintf(stderr, "---- kvstashd output (%s) ----\n%s---- end of kvstashd output ----\n",
            h->log_path, log ? log : "(unreadable)\n");
    free(log);
}

size_t
harness_log_size(const struct harness *h)
{
    struct stat sb;
    return stat(h->log_path, &sb) == 0 ? (size_t)sb.st_size : 0;
}

bool
harness_wait_log(const struct harness *h, size_t from, const char *needle, int timeout_ms)
{
    uint64_t deadline = harness_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        char *log = harness_read_log(h);
        bool found = log && strlen(log) > from && strcasestr(log + from, needle) != NULL;
        free(log);
        if (found) {
            return true;
        }
        if (remaining_ms(deadline) == 0) {
            return false;
        }
        harness_sleep_ms(20);
    }
}

static long
status_kib(const struct harness *h, const char *field)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)h->pid);
    FILE *f = fopen(path, "r");
    if (!f) {
        return -1;
    }
    char line[256];
    long kib = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            kib = strtol(line + n + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kib;
}

long
harness_rss_kib(const struct harness *h)
{
    return status_kib(h, "VmRSS");
}

long
harness_peak_rss_kib(const struct harness *h)
{
    return status_kib(h, "VmHWM");
}

int
harness_reset_peak_rss(const struct harness *h)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/clear_refs", (int)h->pid);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        return -errno;
    }
    int rc = write(fd, "5", 1) == 1 ? 0 : -errno;
    close(fd);
    return rc;
}

bool
harness_sanitized(const struct harness *h)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)h->pid);
    FILE *f = fopen(path, "r");
    if (!f) {
        return false;
    }
    char line[512];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f)) {
        found = strstr(line, "libasan") != NULL || strstr(line, "libubsan") != NULL ||
                strstr(line, "libtsan") != NULL;
    }
    fclose(f);
    return found;
}

static int
rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* ---- the daemon ---- */

static bool
mentions(const char *conf, const char *const *args, const char *key)
{
    if (conf && strstr(conf, key)) {
        return true;
    }
    for (size_t i = 0; args && args[i]; i++) {
        if (strstr(args[i], key)) {
            return true;
        }
    }
    return false;
}

int
harness_write_conf(const struct harness *h, const char *text)
{
    size_t len = strlen(text) + 512;
    char *buf = malloc(len);
    if (!buf) {
        return -ENOMEM;
    }
    snprintf(buf, len,
             "# written by the integration-test harness\n"
             "listen %s\n"
             "data_dir %s\n"
             "memory_size " HARNESS_DEFAULT_MEMORY "\n"
             "%s\n%s",
             h->addr, h->dir, text,
             /* after the test's lines, which keep their line numbers: the default port of
              * metrics_listen is one for all the daemons */
             mentions(text, NULL, "metrics_listen") ? "" : "metrics_listen \"\"\n");
    int rc = write_file(h->conf_path, buf);
    free(buf);
    return rc;
}

static bool
tcp_accepts(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return false;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(fd);
    return ok;
}

bool
harness_alive(struct harness *h)
{
    if (h->pid <= 0) {
        return false;
    }
    int st;
    pid_t r = waitpid(h->pid, &st, WNOHANG);
    if (r == h->pid) {
        h->status = st;
        h->pid = 0;
        return false;
    }
    return true;
}

int
harness_prepare(struct harness *h)
{
    memset(h, 0, sizeof(*h));
    h->status = -1;
    h->daemon = harness_daemon_path();
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 40) {
        tmp = "/tmp";
    }
    snprintf(h->dir, sizeof(h->dir), "%s/kvstash-it-XXXXXX", tmp);
    if (!mkdtemp(h->dir)) {
        fprintf(stderr, "harness: mkdtemp %s: %s\n", h->dir, strerror(errno));
        h->dir[0] = '\0';
        return -1;
    }
    h->port = harness_free_port();
    if (h->port <= 0) {
        fprintf(stderr, "harness: no free port: %s\n", strerror(-h->port));
        return -1;
    }
    snprintf(h->addr, sizeof(h->addr), "127.0.0.1:%d", h->port);
    snprintf(h->unix_path, sizeof(h->unix_path), "%s/kvstashd.sock", h->dir);
    snprintf(h->unix_addr, sizeof(h->unix_addr), "unix:%s", h->unix_path);
    snprintf(h->log_path, sizeof(h->log_path), "%s/kvstashd.stderr", h->dir);
    snprintf(h->conf_path, sizeof(h->conf_path), "%s/kvstashd.conf", h->dir);
    return 0;
}

int
harness_start(struct harness *h, const char *conf, const char *const *args)
{
    if (harness_prepare(h) != 0) {
        return -1;
    }
    return harness_restart(h, conf, args);
}

int
harness_restart(struct harness *h, const char *conf, const char *const *args)
{
    if (h->pid > 0) {
        fprintf(stderr, "harness: restart while kvstashd still runs\n");
        return -1;
    }
    h->status = -1;
    h->expect_exit = false;
    char listen_arg[96], dir_arg[160];
    const char *argv[HARNESS_MAX_ARGS + 8];
    size_t n = 0;
    argv[n++] = h->daemon;
    if (conf) {
        int rc = harness_write_conf(h, conf);
        if (rc != 0) {
            fprintf(stderr, "harness: writing %s: %s\n", h->conf_path, strerror(-rc));
            return -1;
        }
        argv[n++] = "--config";
        argv[n++] = h->conf_path;
    } else {
        snprintf(listen_arg, sizeof(listen_arg), "--listen=%s", h->addr);
        snprintf(dir_arg, sizeof(dir_arg), "--data_dir=%s", h->dir);
        argv[n++] = listen_arg;
        argv[n++] = dir_arg;
        if (!mentions(NULL, args, "memory_size")) {
            argv[n++] = "--memory_size=" HARNESS_DEFAULT_MEMORY;
        }
        if (!mentions(NULL, args, "metrics_listen")) {
            argv[n++] = "--metrics_listen=";  /* its default port is one for all daemons */
        }
    }
    for (size_t i = 0; args && args[i]; i++) {
        if (n >= HARNESS_MAX_ARGS) {
            fprintf(stderr, "harness: too many arguments\n");
            return -1;
        }
        argv[n++] = args[i];
    }
    argv[n] = NULL;

    int logfd = open(h->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (logfd < 0) {
        fprintf(stderr, "harness: open %s: %s\n", h->log_path, strerror(errno));
        return -1;
    }
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "harness: fork: %s\n", strerror(errno));
        close(logfd);
        return -1;
    }
    if (pid == 0) {
        /* die with the test process, even when Criterion kills it at a timeout */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) {
            _exit(127);
        }
        int nullfd = open("/dev/null", O_RDONLY);
        if (nullfd >= 0) {
            dup2(nullfd, 0);
        }
        dup2(logfd, 1);
        dup2(logfd, 2);
        signal(SIGPIPE, SIG_DFL);
        execv(argv[0], (char *const *)argv);
        dprintf(2, "harness: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(logfd);
    h->pid = pid;

    bool wait_unix = !mentions(conf, args, "unix_socket");
    uint64_t deadline = harness_now_ms() + HARNESS_START_TIMEOUT_MS;
    for (;;) {
        if (!harness_alive(h)) {
            fprintf(stderr, "harness: kvstashd exited during startup (wait status 0x%x)\n",
                    (unsigned)h->status);
            harness_dump_log(h);
            h->expect_exit = true;
            return -1;
        }
        struct stat sb;
        if (tcp_accepts(h->port) && (!wait_unix || stat(h->unix_path, &sb) == 0)) {
            return 0;
        }
        if (remaining_ms(deadline) == 0) {
            fprintf(stderr, "harness: kvstashd did not accept on %s%s%s within %d ms\n",
                    h->addr, wait_unix ? " and " : "", wait_unix ? h->unix_path : "",
                    HARNESS_START_TIMEOUT_MS);
            harness_kill(h);
            harness_dump_log(h);
            return -1;
        }
        harness_sleep_ms(10);
    }
}

int
harness_signal(const struct harness *h, int sig)
{
    if (h->pid <= 0) {
        return -ESRCH;
    }
    return kill(h->pid, sig) == 0 ? 0 : -errno;
}

int
harness_wait_exit(struct harness *h, int timeout_ms)
{
    uint64_t deadline = harness_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        if (!harness_alive(h)) {
            return 0;
        }
        if (remaining_ms(deadline) == 0) {
            return -ETIMEDOUT;
        }
        harness_sleep_ms(5);
    }
}

int
harness_stop(struct harness *h, int timeout_ms)
{
    h->expect_exit = true;
    if (!harness_alive(h)) {
        return 0;
    }
    kill(h->pid, SIGTERM);
    if (harness_wait_exit(h, timeout_ms) == 0) {
        return 0;
    }
    fprintf(stderr, "harness: kvstashd did not exit within %d ms of SIGTERM; killing it\n",
            timeout_ms);
    harness_kill(h);
    h->status = -1;
    return -ETIMEDOUT;
}

int
harness_stop_clean(struct harness *h)
{
    if (harness_stop(h, HARNESS_START_TIMEOUT_MS) != 0) {
        harness_dump_log(h);
        return -1;
    }
    if (!harness_exited_with(h->status, 0)) {
        if (WIFSIGNALED(h->status)) {
            fprintf(stderr, "harness: kvstashd died of signal %d at shutdown\n",
                    WTERMSIG(h->status));
        } else {
            fprintf(stderr, "harness: kvstashd exited with %d at shutdown\n",
                    WEXITSTATUS(h->status));
        }
        harness_dump_log(h);
        return -1;
    }
    return 0;
}

void
harness_kill(struct harness *h)
{
    h->expect_exit = true;
    if (h->pid <= 0) {
        return;
    }
    kill(h->pid, SIGKILL);
    int st;
    if (waitpid(h->pid, &st, 0) == h->pid) {
        h->status = st;
    }
    h->pid = 0;
}

void
harness_destroy(struct harness *h)
{
    if (h->pid > 0) {
        harness_alive(h); /* reaps it if it exited */
    }
    if (h->dir[0] && h->pid == 0 && h->status != -1 && !h->expect_exit) {
        /* it exited on its own: tell the test's reader how */
        if (WIFSIGNALED(h->status)) {
            fprintf(stderr, "harness: kvstashd died of signal %d (%s) during the test\n",
                    WTERMSIG(h->status), strsignal(WTERMSIG(h->status)));
        } else {
            fprintf(stderr, "harness: kvstashd exited with %d during the test\n",
                    WEXITSTATUS(h->status));
        }
        harness_dump_log(h);
    }
    harness_kill(h);
    if (h->dir[0]) {
        const char *keep = getenv("KVSTASH_TEST_KEEP");
        if (keep && *keep) {
            fprintf(stderr, "harness: keeping %s\n", h->dir);
        } else {
            nftw(h->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        }
        h->dir[0] = '\0';
    }
}

/* ---- through the client library ---- */

int
harness_client(const char *addr, int timeout_ms, struct kvstash **out)
{
    uint64_t deadline = harness_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int rc = kvstash_connect(addr, out);
        if (rc == 0) {
            kvstash_set_timeout(*out, HARNESS_IO_TIMEOUT_MS * 4);
            return 0;
        }
        if ((rc != -ECONNREFUSED && rc != -ENOENT) || remaining_ms(deadline) == 0) {
            fprintf(stderr, "harness: kvstash_connect %s: %s\n", addr, kvstash_strerror(rc));
            *out = NULL;
            return rc;
        }
        harness_sleep_ms(10);
    }
}

int
harness_stat(struct kvstash *c, const char *name, uint64_t *value)
{
    struct kvstash_stat *items = NULL;
    size_t n = 0;
    int rc = kvstash_stats(c, &items, &n);
    if (rc != 0) {
        fprintf(stderr, "harness: stats: %s\n", kvstash_strerror(rc));
        return rc;
    }
    rc = KVSTASH_ENOTFOUND;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(items[i].name, name) == 0) {
            *value = items[i].value;
            rc = 0;
            break;
        }
    }
    free(items);
    return rc;
}

int
harness_wait_stat(struct kvstash *c, const char *name, uint64_t want, int timeout_ms,
                  uint64_t *last)
{
    uint64_t deadline = harness_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        uint64_t v = 0;
        int rc = harness_stat(c, name, &v);
        if (rc != 0) {
            return rc;
        }
        if (last) {
            *last = v;
        }
        if (v == want) {
            return 0;
        }
        if (remaining_ms(deadline) == 0) {
            return -ETIMEDOUT;
        }
        harness_sleep_ms(10);
    }
}

/* ---- raw connections ---- */

static void
conn_setup(struct harness_conn *c, int fd)
{
    c->fd = fd;
    c->eof = false;
    c->have_msg = false;
    msgpack_unpacker_init(&c->unp, MSGPACK_UNPACKER_INIT_BUFFER_SIZE);
    msgpack_unpacked_init(&c->msg);
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int
conn_open(struct harness_conn *c, int family, const struct sockaddr *sa, socklen_t salen,
          int timeout_ms)
{
    c->fd = -1;
    uint64_t deadline = harness_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            return -errno;
        }
        if (connect(fd, sa, salen) == 0) {
            conn_setup(c, fd);
            return 0;
        }
        int e = errno;
        close(fd);
        if ((e != ECONNREFUSED && e != ENOENT && e != EAGAIN) || remaining_ms(deadline) == 0) {
            return -e;
        }
        harness_sleep_ms(10);
    }
}

int
harness_conn_tcp(struct harness_conn *c, int port, int timeout_ms)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return conn_open(c, AF_INET, (struct sockaddr *)&sa, sizeof(sa), timeout_ms);
}

int
harness_conn_unix(struct harness_conn *c, const char *path, int timeout_ms)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        c->fd = -1;
        return -ENAMETOOLONG;
    }
    strcpy(sa.sun_path, path);
    return conn_open(c, AF_UNIX, (struct sockaddr *)&sa, sizeof(sa), timeout_ms);
}

void
harness_conn_close(struct harness_conn *c)
{
    if (c->fd < 0) {
        return;
    }
    close(c->fd);
    c->fd = -1;
    msgpack_unpacked_destroy(&c->msg);
    msgpack_unpacker_destroy(&c->unp);
}

int
harness_conn_send(struct harness_conn *c, const void *buf, size_t len, int timeout_ms)
{
    const uint8_t *p = buf;
    uint64_t deadline = harness_now_ms() + (uint64_t)timeout_ms;
    while (len > 0) {
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            return -errno;
        }
        int left = remaining_ms(deadline);
        if (left == 0) {
            return -ETIMEDOUT;
        }
        struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
        poll(&pfd, 1, left);
    }
    return 0;
}

int
harness_conn_read(struct harness_conn *c, int timeout_ms, const msgpack_object **out)
{
    uint64_t deadline = harness_now_ms() + (uint64_t)timeout_ms;
    c->have_msg = false;
    for (;;) {
        msgpack_unpack_return ur = msgpack_unpacker_next(&c->unp, &c->msg);
        if (ur == MSGPACK_UNPACK_SUCCESS) {
            c->have_msg = true;
            if (out) {
                *out = &c->msg.data;
            }
            return 1;
        }
        if (ur != MSGPACK_UNPACK_CONTINUE) {
            fprintf(stderr, "harness: the server sent bytes that are not msgpack (%d)\n",
                    (int)ur);
            return -EBADMSG;
        }
        if (c->eof) {
            return 0;
        }
        int left = remaining_ms(deadline);
        if (left == 0) {
            return -ETIMEDOUT;
        }
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        if (poll(&pfd, 1, left) <= 0) {
            continue;
        }
        if (msgpack_unpacker_buffer_capacity(&c->unp) < HARNESS_READ_CHUNK &&
            !msgpack_unpacker_reserve_buffer(&c->unp, HARNESS_READ_CHUNK)) {
            return -ENOMEM;
        }
        ssize_t n = recv(c->fd, msgpack_unpacker_buffer(&c->unp),
                         msgpack_unpacker_buffer_capacity(&c->unp), 0);
        if (n > 0) {
            msgpack_unpacker_buffer_consumed(&c->unp, (size_t)n);
        } else if (n == 0 || errno == ECONNRESET || errno == EPIPE) {
            c->eof = true;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            return -errno;
        }
    }
}

int
harness_conn_expect_close(struct harness_conn *c, int timeout_ms)
{
    uint64_t deadline = harness_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int rc = harness_conn_read(c, remaining_ms(deadline), NULL);
        if (rc == 0) {
            return 0;
        }
        if (rc == -ETIMEDOUT) {
            return rc;
        }
        if (rc < 0 && rc != -EBADMSG) {
            return 0; /* a socket error: the connection is gone */
        }
        if (rc == -EBADMSG) {
            /* skip unparseable garbage; only the close matters here */
            msgpack_unpacker_reset(&c->unp);
        }
        if (remaining_ms(deadline) == 0) {
            return -ETIMEDOUT;
        }
    }
}

/* ---- requests and responses ---- */

void
harness_req_init(struct harness_req *r)
{
    msgpack_sbuffer_init(&r->sb);
    msgpack_packer_init(&r->pk, &r->sb, msgpack_sbuffer_write);
}

void
harness_req_destroy(struct harness_req *r)
{
    msgpack_sbuffer_destroy(&r->sb);
}

void
harness_pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

void
harness_pack_bin(msgpack_packer *pk, const void *p, size_t n)
{
    msgpack_pack_bin(pk, n);
    if (n) {
        msgpack_pack_bin_body(pk, p, n);
    }
}

void
harness_req_begin(struct harness_req *r, uint32_t msgid, const char *method, uint32_t nparams)
{
    msgpack_sbuffer_clear(&r->sb);
    msgpack_pack_array(&r->pk, 4);
    msgpack_pack_uint8(&r->pk, 0);
    msgpack_pack_uint32(&r->pk, msgid);
    harness_pack_str(&r->pk, method);
    msgpack_pack_array(&r->pk, nparams);
}

void
harness_print_obj(const char *what, const msgpack_object *o)
{
    fprintf(stderr, "%s: ", what);
    if (o) {
        char buf[512];
        msgpack_object_print_buffer(buf, sizeof(buf), *o);
        fprintf(stderr, "%s\n", buf);
    } else {
        fprintf(stderr, "(none)\n");
    }
}

int
harness_call(struct harness_conn *c, const struct harness_req *r, uint32_t msgid,
             int timeout_ms, const msgpack_object **err, const msgpack_object **result)
{
    int rc = harness_conn_send(c, r->sb.data, r->sb.size, timeout_ms);
    if (rc != 0) {
        return rc;
    }
    const msgpack_object *m;
    rc = harness_conn_read(c, timeout_ms, &m);
    if (rc == 0) {
        return -ECONNRESET;
    }
    if (rc < 0) {
        return rc;
    }
    if (m->type != MSGPACK_OBJECT_ARRAY || m->via.array.size != 4 ||
        m->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        m->via.array.ptr[0].via.u64 != 1 ||
        m->via.array.ptr[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        m->via.array.ptr[1].via.u64 != msgid) {
        fprintf(stderr, "harness: expected the response to msgid %u\n", (unsigned)msgid);
        harness_print_obj("harness: got", m);
        return -EPROTO;
    }
    if (err) {
        *err = &m->via.array.ptr[2];
    }
    if (result) {
        *result = &m->via.array.ptr[3];
    }
    return 0;
}

bool
harness_obj_is_str(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    if (o->type == MSGPACK_OBJECT_STR) {
        return o->via.str.size == n && memcmp(o->via.str.ptr, s, n) == 0;
    }
    if (o->type == MSGPACK_OBJECT_BIN) {
        return o->via.bin.size == n && memcmp(o->via.bin.ptr, s, n) == 0;
    }
    return false;
}

int
harness_err_code(const msgpack_object *err)
{
    if (err->type == MSGPACK_OBJECT_NIL) {
        return -1;
    }
    if (err->type != MSGPACK_OBJECT_ARRAY || err->via.array.size != 3) {
        return -2;
    }
    const msgpack_object *e = err->via.array.ptr;
    if (e[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER || e[1].type != MSGPACK_OBJECT_STR ||
        e[2].type != MSGPACK_OBJECT_STR) {
        return -2;
    }
    return (int)e[0].via.u64;
}

bool
harness_err_name_is(const msgpack_object *err, const char *name)
{
    return harness_err_code(err) >= 0 && harness_obj_is_str(&err->via.array.ptr[1], name);
}

int
harness_notification_code(const msgpack_object *msg)
{
    if (msg->type != MSGPACK_OBJECT_ARRAY || msg->via.array.size != 3) {
        return -1;
    }
    const msgpack_object *a = msg->via.array.ptr;
    if (a[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a[0].via.u64 != 2 ||
        !harness_obj_is_str(&a[1], "error")) {
        return -1;
    }
    int code = harness_err_code(&a[2]);
    return code >= 0 ? code : -1;
}

const msgpack_object *
harness_map_get(const msgpack_object *o, const char *key)
{
    if (o->type != MSGPACK_OBJECT_MAP) {
        return NULL;
    }
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        if (harness_obj_is_str(&o->via.map.ptr[i].key, key)) {
            return &o->via.map.ptr[i].val;
        }
    }
    return NULL;
}

/* ---- running programs ---- */

struct growbuf {
    char *p;
    size_t len, cap;
};

static int
growbuf_read(struct growbuf *b, int fd)
{
    if (b->cap - b->len < 4096) {
        size_t ncap = b->cap ? b->cap * 2 : 65536;
        char *np = realloc(b->p, ncap);
        if (!np) {
            return -ENOMEM;
        }
        b->p = np;
        b->cap = ncap;
    }
    ssize_t n = read(fd, b->p + b->len, b->cap - b->len - 1);
    if (n > 0) {
        b->len += (size_t)n;
        return 1;
    }
    if (n == 0) {
        return 0;
    }
    return (errno == EAGAIN || errno == EINTR) ? 1 : -errno;
}

static char *
growbuf_finish(struct growbuf *b, size_t *len)
{
    if (!b->p) {
        b->p = malloc(1);
        b->cap = 1;
    }
    if (b->p) {
        b->p[b->len] = '\0';
    }
    *len = b->len;
    return b->p;
}

int
harness_exec(const char *const *argv, const void *in, size_t in_len, int timeout_ms,
             struct harness_proc *p)
{
    memset(p, 0, sizeof(*p));
    p->status = -1;
    int pin[2], pout[2], perr[2];
    if (pipe2(pin, O_CLOEXEC) != 0) {
        return -errno;
    }
    if (pipe2(pout, O_CLOEXEC) != 0) {
        int e = errno;
        close(pin[0]);
        close(pin[1]);
        return -e;
    }
    if (pipe2(perr, O_CLOEXEC) != 0) {
        int e = errno;
        close(pin[0]);
        close(pin[1]);
        close(pout[0]);
        close(pout[1]);
        return -e;
    }
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(pin[0]);
        close(pin[1]);
        close(pout[0]);
        close(pout[1]);
        close(perr[0]);
        close(perr[1]);
        return -e;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) {
            _exit(127);
        }
        dup2(pin[0], 0);
        dup2(pout[1], 1);
        dup2(perr[1], 2);
        signal(SIGPIPE, SIG_DFL);
        execv(argv[0], (char *const *)argv);
        dprintf(2, "harness: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pin[0]);
    close(pout[1]);
    close(perr[1]);
    int wfd = pin[1];
    fcntl(wfd, F_SETFL, O_NONBLOCK);
    if (in_len == 0) {
        close(wfd);
        wfd = -1;
    }
    struct growbuf bo = {0}, be = {0};
    int ofd = pout[0], efd = perr[0];
    const uint8_t *inp = in;
    size_t in_off = 0;
    uint64_t deadline = harness_now_ms() + (uint64_t)timeout_ms;
    bool killed = false;
    while (ofd >= 0 || efd >= 0) {
        struct pollfd pf[3];
        int np = 0, io = -1, ie = -1, iw = -1;
        if (ofd >= 0) {
            io = np;
            pf[np++] = (struct pollfd){.fd = ofd, .events = POLLIN};
        }
        if (efd >= 0) {
            ie = np;
            pf[np++] = (struct pollfd){.fd = efd, .events = POLLIN};
        }
        if (wfd >= 0) {
            iw = np;
            pf[np++] = (struct pollfd){.fd = wfd, .events = POLLOUT};
        }
        int left = remaining_ms(deadline);
        if (left == 0) {
            kill(pid, SIGKILL);
            killed = true;
            break;
        }
        if (poll(pf, (nfds_t)np, left) <= 0) {
            continue;
        }
        if (io >= 0 && pf[io].revents) {
            if (growbuf_read(&bo, ofd) <= 0) {
                close(ofd);
                ofd = -1;
            }
        }
        if (ie >= 0 && pf[ie].revents) {
            if (growbuf_read(&be, efd) <= 0) {
                close(efd);
                efd = -1;
            }
        }
        if (iw >= 0 && pf[iw].revents) {
            ssize_t n = write(wfd, inp + in_off, in_len - in_off);
            if (n > 0) {
                in_off += (size_t)n;
            }
            if ((n < 0 && errno != EAGAIN && errno != EINTR) || in_off == in_len) {
                close(wfd);
                wfd = -1;
            }
        }
    }
    if (ofd >= 0) {
        close(ofd);
    }
    if (efd >= 0) {
        close(efd);
    }
    if (wfd >= 0) {
        close(wfd);
    }
    /* the pipes are closed: the child has exited or is about to; bound the wait anyway */
    int st = -1;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            break;
        }
        if (remaining_ms(deadline) == 0 && !killed) {
            kill(pid, SIGKILL);
            killed = true;
        }
        if (killed) {
            waitpid(pid, &st, 0);
            break;
        }
        harness_sleep_ms(5);
    }
    p->status = killed ? -1 : st;
    p->out = growbuf_finish(&bo, &p->out_len);
    p->err = growbuf_finish(&be, &p->err_len);
    if (killed) {
        fprintf(stderr, "harness: %s did not finish within %d ms; killed\n", argv[0],
                timeout_ms);
    }
    return 0;
}

void
harness_proc_free(struct harness_proc *p)
{
    free(p->out);
    free(p->err);
    p->out = p->err = NULL;
}

/*
 * Integration: the `kvstash` CLI (env KVSTASH_CLI) against a real daemon, as
 * a script would use it: values round-trip byte for byte through stdin,
 * stdout and files, and the exit status tells success (0), not found or not
 * stored (1), usage error (2) and connection failure (3). A bad address or
 * input file is a usage error found before connecting, and a server that
 * accepts but never answers is a connection failure within -t, not a hang.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "kvstash.h"

static struct harness h;

static void
teardown(void)
{
    harness_destroy(&h);
}

TestSuite(cli, .fini = teardown, .timeout = 60);

/* Run `kvstash -H <addr> args...` (or no target when addr is NULL) with stdin in. */
static void
cli(struct harness_proc *p, const char *target_flag, const char *target,
    const char *const *args, const void *in, size_t in_len)
{
    const char *argv[24];
    size_t n = 0;
    argv[n++] = harness_cli_path();
    if (target_flag) {
        argv[n++] = target_flag;
        argv[n++] = target;
    }
    for (size_t i = 0; args[i] && n < 23; i++) {
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    cr_assert_eq(harness_exec(argv, in, in_len, 10000, p), 0, "cannot run %s", argv[0]);
    cr_assert_neq(p->status, -1, "%s did not finish within 10 s", argv[0]);
}

static void
expect_exit(const struct harness_proc *p, int code, const char *what)
{
    cr_assert(harness_exited_with(p->status, code), "%s: want exit %d, got status 0x%x\n%s",
              what, code, (unsigned)p->status, p->err);
}

/*
 * silent_listener: a loopback TCP socket that listens and never accepts, so
 * the kernel completes connects and nobody ever answers (a daemon that hangs
 * or whose backlog is full looks the same). Non-blocking: accept() then says
 * whether anyone connected. Asserts that it could be made.
 */
struct silent {
    int fd;
    int port;
    char addr[64];  /* "127.0.0.1:PORT" */
};

static struct silent
silent_listener(void)
{
    struct silent l = {.fd = -1};
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 16) != 0
        || getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        cr_assert_fail("cannot listen on loopback: %s", strerror(errno));
    }
    l.fd = fd;
    l.port = ntohs(sa.sin_port);
    snprintf(l.addr, sizeof(l.addr), "127.0.0.1:%d", l.port);
    return l;
}

/* nobody_connected: nothing is waiting in the listener's accept queue. */
static bool
nobody_connected(int lfd)
{
    int fd = accept(lfd, NULL, NULL);

    if (fd >= 0) {
        close(fd);
        return false;
    }
    return errno == EAGAIN || errno == EWOULDBLOCK;
}

Test(cli, put_get_exists_rm_round_trip)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct harness_proc p;
    size_t n = 300 * 1024;
    uint8_t *val = malloc(n);
    cr_assert_not_null(val);
    harness_fill(val, n, 77);
    val[0] = 0;
    val[n / 2] = '\n';

    cli(&p, "-H", h.addr, HARNESS_ARGS("put", "cli-key", "-"), val, n);
    expect_exit(&p, 0, "put from stdin");
    harness_proc_free(&p);

    cli(&p, "-H", h.addr, HARNESS_ARGS("get", "cli-key"), NULL, 0);
    expect_exit(&p, 0, "get");
    cr_assert_eq(p.out_len, n, "get wrote %zu bytes to stdout, want %zu", p.out_len, n);
    cr_assert(memcmp(p.out, val, n) == 0, "get: stdout differs from what was put");
    harness_proc_free(&p);

    /* the same value seen through the library */
    struct kvstash *c;
    cr_assert_eq(harness_client(h.addr, 2000, &c), 0);
    uint64_t size = 0;
    cr_assert_eq(kvstash_get_size(c, "cli-key", 7, &size), 0);
    cr_assert_eq(size, n);
    kvstash_close(c);

    cli(&p, "-H", h.addr, HARNESS_ARGS("size", "cli-key"), NULL, 0);
    expect_exit(&p, 0, "size");
    cr_assert_eq(strtoull(p.out, NULL, 10), n, "size printed '%s'", p.out);
    harness_proc_free(&p);

    cli(&p, "-H", h.addr, HARNESS_ARGS("put", "cli-key", "-"), "other", 5);
    expect_exit(&p, 1, "a second put of the same key");
    cr_assert(strstr(p.err, "EXISTS") != NULL, "put over a stored key does not say EXISTS: %s",
              p.err);
    harness_proc_free(&p);

    cli(&p, "-H", h.addr, HARNESS_ARGS("exists", "cli-key"), NULL, 0);
    expect_exit(&p, 0, "exists of a stored key");
    cr_assert_str_eq(p.out, "cli-key 1\n");
    harness_proc_free(&p);

    cli(&p, "-H", h.addr, HARNESS_ARGS("exists", "cli-key", "cli-missing"), NULL, 0);
    expect_exit(&p, 1, "exists with one key missing");
    cr_assert_str_eq(p.out, "cli-key 1\ncli-missing 0\n");
    harness_proc_free(&p);

    cli(&p, "-H", h.addr, HARNESS_ARGS("rm", "cli-key"), NULL, 0);
    expect_exit(&p, 0, "rm");
    harness_proc_free(&p);

    cli(&p, "-H", h.addr, HARNESS_ARGS("rm", "cli-key"), NULL, 0);
    expect_exit(&p, 1, "rm of a removed key");
    harness_proc_free(&p);

    cli(&p, "-H", h.addr, HARNESS_ARGS("get", "cli-key"), NULL, 0);
    expect_exit(&p, 1, "get of a removed key");
    cr_assert_eq(p.out_len, 0, "get of a missing key wrote %zu bytes to stdout", p.out_len);
    cr_assert(strstr(p.err, "NOT_FOUND") != NULL, "get of a missing key does not say NOT_FOUND");
    harness_proc_free(&p);
    free(val);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(cli, files_and_unix_socket)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct harness_proc p;
    char in_path[256], out_path[256];
    snprintf(in_path, sizeof(in_path), "%s/cli-in.bin", h.dir);
    snprintf(out_path, sizeof(out_path), "%s/cli-out.bin", h.dir);
    size_t n = 2u << 20;
    uint8_t *val = malloc(n);
    cr_assert_not_null(val);
    harness_fill(val, n, 99);
    FILE *f = fopen(in_path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(val, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);

    cli(&p, "-S", h.unix_path, HARNESS_ARGS("put", "cli-file", in_path), NULL, 0);
    expect_exit(&p, 0, "put FILE over the Unix socket");
    harness_proc_free(&p);

    cli(&p, "-H", h.addr, HARNESS_ARGS("get", "cli-file", "-o", out_path), NULL, 0);
    expect_exit(&p, 0, "get -o FILE");
    harness_proc_free(&p);
    f = fopen(out_path, "rb");
    cr_assert_not_null(f, "get -o did not create %s", out_path);
    uint8_t *got = malloc(n + 1);
    cr_assert_not_null(got);
    size_t glen = fread(got, 1, n + 1, f);
    fclose(f);
    cr_assert(glen == n && memcmp(got, val, n) == 0, "get -o FILE: %zu bytes, content %s", glen,
              glen == n ? "differs" : "-");
    free(got);

    cli(&p, "-S", h.unix_path, HARNESS_ARGS("ping"), NULL, 0);
    expect_exit(&p, 0, "ping over the Unix socket");
    harness_proc_free(&p);

    char missing[256];
    snprintf(missing, sizeof(missing), "%s/no-such-file", h.dir);
    cli(&p, "-H", h.addr, HARNESS_ARGS("put", "cli-nofile", missing), NULL, 0);
    expect_exit(&p, 2, "put of a missing file");
    cr_assert(strstr(p.err, "no-such-file") != NULL, "the error does not name the file: %s",
              p.err);
    harness_proc_free(&p);
    free(val);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(cli, exit_codes_for_usage_and_connection_errors)
{
    struct harness_proc p;
    int port = harness_free_port();
    cr_assert_gt(port, 0);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);

    cli(&p, "-H", addr, HARNESS_ARGS("ping"), NULL, 0);
    expect_exit(&p, 3, "ping with nobody listening");
    cr_assert_gt(p.err_len, 0, "a connection failure printed nothing");
    harness_proc_free(&p);

    cli(&p, "-H", addr, HARNESS_ARGS("frobnicate"), NULL, 0);
    expect_exit(&p, 2, "an unknown command");
    harness_proc_free(&p);

    cli(&p, "-H", addr, HARNESS_ARGS("get"), NULL, 0);
    expect_exit(&p, 2, "get without a key");
    harness_proc_free(&p);

    cli(&p, NULL, NULL, HARNESS_ARGS("--help"), NULL, 0);
    expect_exit(&p, 0, "--help");
    cr_assert(strstr(p.out, "put") != NULL, "--help does not list the commands");
    harness_proc_free(&p);
}

Test(cli, bad_port_is_a_usage_error_without_connecting)
{
    struct harness_proc p;
    struct silent l = silent_listener();
    /* port + 65536 names the listener's port when taken modulo 2^16 */
    char wrapped[64], zero[64], empty[64], word[64];
    snprintf(wrapped, sizeof(wrapped), "127.0.0.1:%d", l.port + 65536);
    snprintf(zero, sizeof(zero), "127.0.0.1:0");
    snprintf(empty, sizeof(empty), "127.0.0.1:");
    snprintf(word, sizeof(word), "127.0.0.1:p%d", l.port);
    const char *bad[] = {wrapped, zero, empty, word, "[::1]:70000"};

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cli(&p, "-H", bad[i], HARNESS_ARGS("ping"), NULL, 0);
        expect_exit(&p, 2, bad[i]);
        cr_assert(strstr(p.err, bad[i]) != NULL, "the error does not name -H %s: %s", bad[i],
                  p.err);
        cr_assert_eq(p.out_len, 0, "-H %s printed '%s'", bad[i], p.out);
        harness_proc_free(&p);
    }
    cr_assert(nobody_connected(l.fd), "the CLI connected to %s", wrapped);

    /* the library refuses it too, before connecting */
    struct kvstash *c = NULL;
    int rc = kvstash_connect_timeout(wrapped, 2000, &c);
    cr_assert_eq(rc, -EINVAL, "kvstash_connect(%s) returned %d, want -EINVAL", wrapped, rc);
    cr_assert_null(c);
    cr_assert(strstr(kvstash_last_error(NULL), "port") != NULL,
              "kvstash_last_error does not say the port is wrong: %s", kvstash_last_error(NULL));
    cr_assert(nobody_connected(l.fd), "kvstash_connect connected to %s", wrapped);
    close(l.fd);
}

Test(cli, unreadable_put_file_is_a_usage_error_without_a_daemon)
{
    struct harness_proc p;
    int port = harness_free_port();
    cr_assert_gt(port, 0);
    char addr[64], dir[] = "/tmp/kvstash-cli-XXXXXX", missing[64], want[160];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    cr_assert_not_null(mkdtemp(dir));
    snprintf(missing, sizeof(missing), "%s/no-such-file", dir);

    /* nobody listens: a file checked only after connecting would exit 3 */
    cli(&p, "-H", addr, HARNESS_ARGS("put", "cli-key", missing), NULL, 0);
    expect_exit(&p, 2, "put of a missing file with no daemon");
    snprintf(want, sizeof(want), "kvstash: %s: %s\n", missing, strerror(ENOENT));
    cr_assert_str_eq(p.err, want);
    harness_proc_free(&p);

    cli(&p, "-H", addr, HARNESS_ARGS("put", "cli-key", dir), NULL, 0);
    expect_exit(&p, 2, "put of a directory with no daemon");
    snprintf(want, sizeof(want), "kvstash: %s: %s\n", dir, strerror(EISDIR));
    cr_assert_str_eq(p.err, want);
    harness_proc_free(&p);

    /* stdin is still read after connecting: with no daemon that is a connection error */
    cli(&p, "-H", addr, HARNESS_ARGS("put", "cli-key", "-"), "v", 1);
    expect_exit(&p, 3, "put from stdin with no daemon");
    harness_proc_free(&p);
    cr_assert_eq(rmdir(dir), 0);
}

Test(cli, timeout_when_the_server_never_answers)
{
    struct harness_proc p;
    struct silent l = silent_listener();

    uint64_t t0 = harness_now_ms();
    cli(&p, "-H", l.addr, HARNESS_ARGS("-t", "500", "ping"), NULL, 0);
    uint64_t took = harness_now_ms() - t0;
    expect_exit(&p, 3, "ping -t 500 to a server that never answers");
    cr_assert_lt(took, 5000, "ping -t 500 took %llu ms", (unsigned long long)took);
    cr_assert(strstr(p.err, "timed out") != NULL, "the error does not say it timed out: %s",
              p.err);
    harness_proc_free(&p);

    /* -t 0 still means no timeout: killed at the deadline, still waiting */
    const char *argv[] = {harness_cli_path(), "-H", l.addr, "-t", "0", "ping", NULL};
    cr_assert_eq(harness_exec(argv, NULL, 0, 1500, &p), 0);
    cr_assert_eq(p.status, -1, "ping -t 0 did not wait: status 0x%x\n%s", (unsigned)p.status,
                 p.err);
    harness_proc_free(&p);
    close(l.fd);
}

Test(cli, default_timeout_is_bounded)
{
    struct harness_proc p;
    struct silent l = silent_listener();

    /* no -t: the default (10 s) ends it, well before the 20 s deadline */
    const char *argv[] = {harness_cli_path(), "-H", l.addr, "ping", NULL};
    uint64_t t0 = harness_now_ms();
    cr_assert_eq(harness_exec(argv, NULL, 0, 20000, &p), 0);
    uint64_t took = harness_now_ms() - t0;
    cr_assert_neq(p.status, -1, "ping with the default timeout still waited after 20 s");
    expect_exit(&p, 3, "ping with the default timeout to a server that never answers");
    cr_assert_lt(took, 15000, "the default timeout took %llu ms", (unsigned long long)took);
    cr_assert(strstr(p.err, "timed out") != NULL, "the error does not say it timed out: %s",
              p.err);
    harness_proc_free(&p);
    close(l.fd);
}

Test(cli, timeout_when_the_daemon_is_stopped)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct harness_proc p;

    cr_assert_eq(harness_signal(&h, SIGSTOP), 0);
    cli(&p, "-H", h.addr, HARNESS_ARGS("-t", "500", "ping"), NULL, 0);
    int status = p.status;
    char *err = strdup(p.err);
    harness_proc_free(&p);
    cr_assert_eq(harness_signal(&h, SIGCONT), 0);
    cr_assert(harness_exited_with(status, 3), "ping -t 500 to a stopped daemon: status 0x%x\n%s",
              (unsigned)status, err);
    free(err);

    cli(&p, "-H", h.addr, HARNESS_ARGS("ping"), NULL, 0);
    expect_exit(&p, 0, "ping once the daemon runs again");
    harness_proc_free(&p);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

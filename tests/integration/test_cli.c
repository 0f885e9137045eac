/*
 * Integration: the `kvstash` CLI (env KVSTASH_CLI) against a real daemon, as
 * a script would use it: values round-trip byte for byte through stdin,
 * stdout and files, and the exit status tells success (0), not found or not
 * stored (1), usage error (2) and connection failure (3).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    cr_assert(!harness_exited_with(p.status, 0), "put of a missing file succeeded");
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

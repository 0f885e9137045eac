/*
 * Integration: the daemon as an operator runs it. Bad flags and files are
 * refused with a message naming where the mistake is; --check-config
 * validates without serving; SIGHUP applies a good file and survives a bad
 * one; SIGTERM exits 0 promptly even with clients connected.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../lib/harness.h"
#include "kvstash.h"

static struct harness h, h2;

static void
teardown(void)
{
    harness_destroy(&h);
    harness_destroy(&h2);
}

TestSuite(lifecycle, .fini = teardown, .timeout = 60);

/* Run the daemon with args after its path; it must finish within 5 s. */
static void
run_daemon(struct harness_proc *p, const char *const *args)
{
    const char *argv[24];
    size_t n = 0;
    argv[n++] = harness_daemon_path();
    for (size_t i = 0; args[i] && n < 23; i++) {
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    cr_assert_eq(harness_exec(argv, NULL, 0, 5000, p), 0, "cannot run %s", argv[0]);
    cr_assert_neq(p->status, -1, "%s did not finish within 5 s", argv[0]);
}

/* stdout and stderr together, for "the message names X" checks */
static bool
output_has(const struct harness_proc *p, const char *needle)
{
    return strcasestr(p->err, needle) != NULL || strcasestr(p->out, needle) != NULL;
}

static void
expect_refused(const char *const *args, const char *names, const char *what)
{
    struct harness_proc p;
    run_daemon(&p, args);
    cr_assert(!harness_exited_with(p.status, 0) && WIFEXITED(p.status),
              "%s: want a non-zero exit, got wait status 0x%x", what, (unsigned)p.status);
    cr_assert(output_has(&p, names), "%s: the message does not name '%s':\n%s%s", what, names,
              p.out, p.err);
    harness_proc_free(&p);
}

Test(lifecycle, bad_command_line_exits_nonzero_naming_the_flag)
{
    cr_assert_eq(harness_prepare(&h), 0);
    char listen[96], dir[160];
    snprintf(listen, sizeof(listen), "--listen=%s", h.addr);
    snprintf(dir, sizeof(dir), "--data_dir=%s", h.dir);

    expect_refused(HARNESS_ARGS(listen, dir, "--memory_size=12q"), "memory_size",
                   "--memory_size=12q");
    expect_refused(HARNESS_ARGS(listen, dir, "--max_batch=lots"), "max_batch",
                   "--max_batch=lots");
    expect_refused(HARNESS_ARGS(listen, dir, "--no_such_option=1"), "no_such_option",
                   "an unknown key");
    expect_refused(HARNESS_ARGS(listen, dir, "--eviction_high_watermark=1.5"),
                   "eviction_high_watermark", "a watermark over 1");
    expect_refused(HARNESS_ARGS(listen, dir, "--lease_ttl_ms=soon"), "lease_ttl_ms",
                   "--lease_ttl_ms=soon");
    expect_refused(HARNESS_ARGS(listen, dir, "--log_level=chatty"), "log_level",
                   "--log_level=chatty");
    expect_refused(HARNESS_ARGS(listen, dir, "--config"), "config", "--config without a file");

    char missing[220];
    snprintf(missing, sizeof(missing), "%s/does-not-exist.conf", h.dir);
    expect_refused(HARNESS_ARGS("--config", missing), "does-not-exist.conf",
                   "a config file that does not exist");

    /* nothing was left listening */
    struct harness_conn c;
    cr_assert_neq(harness_conn_tcp(&c, h.port, 0), 0, "a refused daemon is listening");
}

Test(lifecycle, bad_config_file_names_file_and_line)
{
    cr_assert_eq(harness_prepare(&h), 0);
    /* harness lines are 1-4; the text starts on line 5 */
    cr_assert_eq(harness_write_conf(&h, "max_batch 100\nmemory_size 12q\n"), 0);
    expect_refused(HARNESS_ARGS("--config", h.conf_path), "kvstashd.conf:6",
                   "memory_size 12q on line 6");
    cr_assert_eq(harness_write_conf(&h, "# fine\nbogus_key 1\n"), 0);
    expect_refused(HARNESS_ARGS("--config", h.conf_path), "bogus_key", "an unknown key in a file");
}

Test(lifecycle, check_config_validates_without_serving)
{
    cr_assert_eq(harness_prepare(&h), 0);
    cr_assert_eq(harness_write_conf(&h, "max_batch 100\n"), 0);
    struct harness_proc p;
    run_daemon(&p, HARNESS_ARGS("--config", h.conf_path, "--check-config"));
    cr_assert(harness_exited_with(p.status, 0), "--check-config on a good file: status 0x%x\n%s",
              (unsigned)p.status, p.err);
    harness_proc_free(&p);
    struct harness_conn c;
    cr_assert_neq(harness_conn_tcp(&c, h.port, 0), 0, "--check-config left a server listening");

    cr_assert_eq(harness_write_conf(&h, "max_batch 100\neviction_low_watermark banana\n"), 0);
    run_daemon(&p, HARNESS_ARGS("--config", h.conf_path, "--check-config"));
    cr_assert(WIFEXITED(p.status) && WEXITSTATUS(p.status) != 0,
              "--check-config on a bad file: status 0x%x", (unsigned)p.status);
    cr_assert(output_has(&p, "kvstashd.conf:6"), "--check-config does not name file:line:\n%s%s",
              p.out, p.err);
    harness_proc_free(&p);

    /* flags are checked too, and win over the file */
    cr_assert_eq(harness_write_conf(&h, "max_batch 100\n"), 0);
    run_daemon(&p, HARNESS_ARGS("--config", h.conf_path, "--max_batch=0x", "--check-config"));
    cr_assert(WIFEXITED(p.status) && WEXITSTATUS(p.status) != 0,
              "--check-config with a bad flag: status 0x%x", (unsigned)p.status);
    cr_assert(output_has(&p, "max_batch"));
    harness_proc_free(&p);
}

Test(lifecycle, version_and_help)
{
    struct harness_proc p;
    run_daemon(&p, HARNESS_ARGS("--version"));
    cr_assert(harness_exited_with(p.status, 0), "--version: status 0x%x", (unsigned)p.status);
    cr_assert(strpbrk(p.out, "0123456789") != NULL, "--version printed no version: '%s'",
              p.out);
    harness_proc_free(&p);
    run_daemon(&p, HARNESS_ARGS("--help"));
    cr_assert(harness_exited_with(p.status, 0), "--help: status 0x%x", (unsigned)p.status);
    cr_assert(output_has(&p, "--config") && output_has(&p, "--check-config"),
              "--help does not describe the options");
    harness_proc_free(&p);
}

Test(lifecycle, flags_override_the_file)
{
    cr_assert_eq(harness_start(&h, "max_batch 100\nmax_key_size 300\n",
                               HARNESS_ARGS("--max_batch=200")),
                 0);
    struct kvstash *c;
    cr_assert_eq(harness_client(h.addr, 2000, &c), 0);
    const struct kvstash_hello *hi = kvstash_server_info(c);
    cr_assert_eq(hi->max_batch, 200, "the flag did not override the file");
    cr_assert_eq(hi->max_key_size, 300, "the file's setting was not applied");
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(lifecycle, listen_address_in_use_is_refused)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    cr_assert_eq(harness_prepare(&h2), 0);
    char listen[96], dir[160];
    snprintf(listen, sizeof(listen), "--listen=%s", h.addr);
    snprintf(dir, sizeof(dir), "--data_dir=%s", h2.dir);
    struct harness_proc p;
    run_daemon(&p, HARNESS_ARGS(listen, dir, "--memory_size=16m"));
    cr_assert(WIFEXITED(p.status) && WEXITSTATUS(p.status) != 0,
              "a second daemon on a port in use: status 0x%x", (unsigned)p.status);
    cr_assert(output_has(&p, h.addr) || output_has(&p, "in use"),
              "the message does not say which address is taken:\n%s%s", p.out, p.err);
    harness_proc_free(&p);
    cr_assert(harness_alive(&h), "the first daemon died");
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

static uint64_t
hello_max_batch(void)
{
    struct kvstash *c;
    cr_assert_eq(harness_client(h.addr, 2000, &c), 0, "the daemon stopped serving");
    uint64_t v = kvstash_server_info(c)->max_batch;
    kvstash_close(c);
    return v;
}

/* Send a raw batch_get of n keys; return the error code (-1 = none). */
static int
raw_batch_get(int n)
{
    struct harness_conn c;
    cr_assert_eq(harness_conn_tcp(&c, h.port, 2000), 0);
    struct harness_req r;
    harness_req_init(&r);
    harness_req_begin(&r, 1, "batch_get", 1);
    msgpack_pack_array(&r.pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        harness_pack_str(&r.pk, "k");
    }
    const msgpack_object *err, *res;
    cr_assert_eq(harness_call(&c, &r, 1, HARNESS_IO_TIMEOUT_MS, &err, &res), 0);
    int code = harness_err_code(err);
    harness_req_destroy(&r);
    harness_conn_close(&c);
    return code;
}

Test(lifecycle, sighup_applies_good_config_and_survives_bad)
{
    cr_assert_eq(harness_start(&h, "max_batch 1000\n", NULL), 0);
    struct kvstash *old;
    cr_assert_eq(harness_client(h.addr, 2000, &old), 0);
    cr_assert_eq(kvstash_server_info(old)->max_batch, 1000);
    cr_assert_eq(kvstash_put(old, "survives", 8, "reload", 6), 0);

    /* a good file: max_batch is reloadable, and is enforced at once */
    cr_assert_eq(harness_write_conf(&h, "max_batch 500\n"), 0);
    cr_assert_eq(harness_signal(&h, SIGHUP), 0);
    uint64_t deadline = harness_now_ms() + 3000, mb = 0;
    while ((mb = hello_max_batch()) != 500 && harness_now_ms() < deadline) {
        harness_sleep_ms(20);
    }
    cr_assert_eq(mb, 500, "hello max_batch is %llu after reloading max_batch 500",
                 (unsigned long long)mb);
    cr_assert_eq(raw_batch_get(600), 5, "a batch of 600 after the reload was not TOO_LARGE");
    cr_assert_eq(raw_batch_get(500), -1, "a batch of 500 after the reload was refused");
    cr_assert_eq(kvstash_ping(old), 0, "a connection from before the reload was dropped");

    /* bad files: the running config stays, the daemon keeps serving and says why */
    const struct {
        const char *text, *why;
    } bad[] = {
        {"max_batch banana\n", "banana"},
        {"reload_me_not_a_key 7\n", "reload_me_not_a_key"},
        {"eviction_low_watermark 0.95\neviction_high_watermark 0.5\n", "watermark"},
        /* fails only when applied: the good max_batch beside it must not be applied either */
        {"max_batch 300\nlog_file /nonexistent-kvstash-dir/kv.log\n", "nonexistent-kvstash-dir"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(harness_write_conf(&h, bad[i].text), 0);
        size_t from = harness_log_size(&h);
        cr_assert_eq(harness_signal(&h, SIGHUP), 0);
        cr_assert(harness_wait_log(&h, from, bad[i].why, 3000),
                  "after reloading a bad file (%s) the log does not say why", bad[i].why);
        cr_assert(harness_alive(&h), "the daemon exited on a bad reload (%s)", bad[i].why);
        cr_assert_eq(kvstash_ping(old), 0, "an existing client was dropped (%s)", bad[i].why);
        cr_assert_eq(hello_max_batch(), 500, "a bad file (%s) changed the running config",
                     bad[i].why);
    }

    /* a key that needs a restart: not applied live, and the log says so */
    cr_assert_eq(harness_write_conf(&h, "max_batch 500\nmemory_size 128m\n"), 0);
    size_t from = harness_log_size(&h);
    cr_assert_eq(harness_signal(&h, SIGHUP), 0);
    cr_assert(harness_wait_log(&h, from, "memory_size", 3000),
              "reloading a changed memory_size is not mentioned in the log");
    cr_assert(harness_alive(&h), "the daemon exited reloading memory_size");
    uint64_t cap = 0;
    cr_assert_eq(harness_stat(old, "memory_capacity", &cap), 0);
    cr_assert_eq(cap, 256u << 20, "memory_capacity changed to %llu without a restart",
                 (unsigned long long)cap);

    /* an unreadable file too */
    cr_assert_eq(remove(h.conf_path), 0);
    from = harness_log_size(&h);
    cr_assert_eq(harness_signal(&h, SIGHUP), 0);
    cr_assert(harness_wait_log(&h, from, strerror(ENOENT), 3000),
              "a vanished config file on SIGHUP is not logged");
    cr_assert(harness_alive(&h), "the daemon exited when its config file vanished");
    cr_assert_eq(hello_max_batch(), 500);

    uint8_t buf[8];
    size_t glen = 0;
    cr_assert_eq(kvstash_get(old, "survives", 8, buf, sizeof(buf), &glen), 0,
                 "data was lost across reloads");
    cr_assert(glen == 6 && memcmp(buf, "reload", 6) == 0);
    kvstash_close(old);
    cr_assert_eq(harness_stop(&h, 5000), 0);
    cr_assert(harness_exited_with(h.status, 0), "exit status 0x%x after SIGTERM",
              (unsigned)h.status);
}

/* count_in_file: how often needle occurs in file path (0 if it cannot be read). */
static int
count_in_file(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    int n = 0;

    if (f == NULL) {
        return 0;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        n += strstr(line, needle) != NULL;
    }
    fclose(f);
    return n;
}

Test(lifecycle, sighup_reopens_a_rotated_log_file)
{
    char log[256], rotated[300], conf[320];

    cr_assert_eq(harness_prepare(&h), 0);
    snprintf(log, sizeof(log), "%s/kv.log", h.dir);
    snprintf(rotated, sizeof(rotated), "%s.1", log);
    snprintf(conf, sizeof(conf), "log_file %s\n", log);
    cr_assert_eq(harness_restart(&h, conf, NULL), 0);   /* in the dir prepared above */
    cr_assert_eq(rename(log, rotated), 0, "cannot rotate %s: %s", log, strerror(errno));
    cr_assert_eq(harness_signal(&h, SIGHUP), 0);
    /* the reload (the file has not changed) logs into the file it reopened */
    uint64_t deadline = harness_now_ms() + 3000;
    while (count_in_file(log, "reload: no key changed") == 0 && harness_now_ms() < deadline) {
        harness_sleep_ms(20);
    }
    cr_assert_eq(count_in_file(log, "reload: no key changed"), 1,
                 "after rotation and SIGHUP nothing was written to a new %s", log);
    cr_assert_eq(count_in_file(rotated, "reload: no key changed"), 0,
                 "the daemon kept writing to the rotated file after SIGHUP");
    cr_assert_eq(harness_stop(&h, 5000), 0);
    cr_assert(harness_exited_with(h.status, 0));
}

Test(lifecycle, reloads_that_change_nothing_keep_memory_flat)
{
    cr_assert_eq(harness_start(&h, "max_batch 1000\n", NULL), 0);
    struct kvstash *c;
    uint64_t cap = 0;
    cr_assert_eq(harness_client(h.addr, 2000, &c), 0);
    cr_assert_eq(harness_stat(c, "memory_capacity", &cap), 0);
    cr_assert_eq(harness_wait_stat(c, "memory_prefaulted", cap, 20000, NULL), 0,
                 "the arena was not populated within 20 s");
    kvstash_close(c);
    long rss0 = harness_rss_kib(&h);

    /* A config snapshot is about 16 KiB and one that is replaced is kept until exit:
     * 300 reloads that each kept one would add almost 5 MiB. */
    for (int i = 0; i < 300; i++) {
        size_t from = harness_log_size(&h);
        cr_assert_eq(harness_signal(&h, SIGHUP), 0);
        cr_assert(harness_wait_log(&h, from, "reload: no key changed", 3000),
                  "reload %d of an unchanged file was not logged as such", i);
    }
    long rss1 = harness_rss_kib(&h);
    /* ASan keeps freed memory in quarantine: RSS grows with every malloc there */
    cr_assert(harness_sanitized(&h) || (rss0 > 0 && rss1 - rss0 < 2048),
              "RSS grew from %ld to %ld KiB over 300 reloads", rss0, rss1);
    cr_assert_eq(harness_stop(&h, 5000), 0);
}

Test(lifecycle, log_file_that_cannot_be_opened_stops_the_start)
{
    cr_assert_eq(harness_prepare(&h), 0);
    char listen[96], dir[160];
    snprintf(listen, sizeof(listen), "--listen=%s", h.addr);
    snprintf(dir, sizeof(dir), "--data_dir=%s", h.dir);
    expect_refused(HARNESS_ARGS(listen, dir, "--log_file=/nonexistent-kvstash-dir/kv.log"),
                   "nonexistent-kvstash-dir", "an unopenable log_file");
    struct harness_conn c;
    cr_assert_neq(harness_conn_tcp(&c, h.port, 0), 0, "a refused daemon is listening");
}

Test(lifecycle, sigterm_exits_zero_promptly_with_idle_clients)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *idle;
    cr_assert_eq(harness_client(h.addr, 2000, &idle), 0);
    struct kvstash *uidle;
    cr_assert_eq(harness_client(h.unix_addr, 2000, &uidle), 0);
    cr_assert_eq(kvstash_put(idle, "k", 1, "v", 1), 0);
    /* and a raw one that has been answered and now sends nothing (a partial request
     * is not idle: see sigterm_drains_an_in_flight_put) */
    struct harness_conn raw;
    cr_assert_eq(harness_conn_tcp(&raw, h.port, 2000), 0);
    struct harness_req r;
    harness_req_init(&r);
    harness_req_begin(&r, 1, "ping", 0);
    const msgpack_object *err, *res;
    cr_assert_eq(harness_call(&raw, &r, 1, HARNESS_IO_TIMEOUT_MS, &err, &res), 0);
    harness_req_destroy(&r);

    uint64_t t0 = harness_now_ms();
    cr_assert_eq(harness_signal(&h, SIGTERM), 0);
    int rc = harness_wait_exit(&h, 5000);
    uint64_t took = harness_now_ms() - t0;
    h.expect_exit = true;
    cr_assert_eq(rc, 0, "kvstashd still running 5 s after SIGTERM with idle clients");
    cr_assert(harness_exited_with(h.status, 0), "exit status 0x%x after SIGTERM",
              (unsigned)h.status);
    cr_assert_lt(took, 3000, "SIGTERM took %llu ms with idle clients",
                 (unsigned long long)took);
    cr_assert_eq(harness_conn_expect_close(&raw, 1000), 0, "a client was left connected");
    cr_assert_lt(kvstash_ping(idle), 0, "a client can still ping a stopped daemon");
    harness_conn_close(&raw);
    kvstash_close(idle);
    kvstash_close(uidle);
}

Test(lifecycle, restart_on_the_same_data_dir_keeps_node_id)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *c;
    cr_assert_eq(harness_client(h.addr, 2000, &c), 0);
    char node_id[sizeof(kvstash_server_info(c)->node_id)];
    strcpy(node_id, kvstash_server_info(c)->node_id);
    cr_assert_eq(kvstash_put(c, "k", 1, "v", 1), 0);
    kvstash_close(c);
    /* SIGTERM right after traffic, then start again: same port, same Unix socket path */
    cr_assert_eq(harness_stop(&h, 5000), 0, "no exit within 5 s of SIGTERM");
    cr_assert(harness_exited_with(h.status, 0), "exit status 0x%x", (unsigned)h.status);
    cr_assert_eq(harness_restart(&h, NULL, NULL), 0,
                 "kvstashd does not start again on its own data dir and port");
    cr_assert_eq(harness_client(h.unix_addr, 2000, &c), 0, "the Unix socket is not back");
    cr_assert_str_eq(kvstash_server_info(c)->node_id, node_id,
                     "node_id changed across a restart on the same data dir");
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

/* Send [0, 1, "put", [key, bin32 vlen]] and the first part bytes of val. */
static void
send_partial_put(struct harness_conn *w, const char *key, const uint8_t *val, size_t vlen,
                 size_t part)
{
    struct harness_req r;
    harness_req_init(&r);
    harness_req_begin(&r, 1, "put", 2);
    harness_pack_str(&r.pk, key);
    msgpack_pack_bin(&r.pk, vlen);
    cr_assert_eq(harness_conn_send(w, r.sb.data, r.sb.size, HARNESS_IO_TIMEOUT_MS), 0);
    cr_assert_eq(harness_conn_send(w, val, part, HARNESS_IO_TIMEOUT_MS), 0);
    harness_req_destroy(&r);
}

/* Wait until the daemon has taken in a partial put (stats reserved == 1). */
static void
wait_reserved(void)
{
    struct kvstash *c;
    cr_assert_eq(harness_client(h.addr, 2000, &c), 0);
    uint64_t last = 0;
    cr_assert_eq(harness_wait_stat(c, "reserved", 1, 3000, &last), 0,
                 "the partial put never showed as reserved (%llu)", (unsigned long long)last);
    kvstash_close(c);
}

Test(lifecycle, sigterm_drains_an_in_flight_put)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *c;
    cr_assert_eq(harness_client(h.addr, 2000, &c), 0);
    size_t vlen = 4u << 20, part = 1u << 20;
    uint8_t *val = malloc(vlen);
    cr_assert_not_null(val);
    harness_fill(val, vlen, 5);
    struct harness_conn w;
    cr_assert_eq(harness_conn_tcp(&w, h.port, 2000), 0);
    send_partial_put(&w, "in-flight", val, vlen, part);
    uint64_t last = 0;
    cr_assert_eq(harness_wait_stat(c, "reserved", 1, 3000, &last), 0);
    kvstash_close(c);

    cr_assert_eq(harness_signal(&h, SIGTERM), 0);
    harness_sleep_ms(300);
    cr_assert(harness_alive(&h), "kvstashd exited with a request half-received");

    /* the writer finishes and gets its answer */
    cr_assert_eq(harness_conn_send(&w, val + part, vlen - part, HARNESS_IO_TIMEOUT_MS), 0,
                 "the draining daemon stopped reading an in-flight request");
    const msgpack_object *m;
    int rc = harness_conn_read(&w, 3000, &m);
    cr_assert_eq(rc, 1, "no answer to the put in flight at SIGTERM (read %d)", rc);
    cr_assert(m->type == MSGPACK_OBJECT_ARRAY && m->via.array.size == 4 &&
                  harness_err_code(&m->via.array.ptr[2]) == -1 &&
                  m->via.array.ptr[3].type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
                  m->via.array.ptr[3].via.u64 == 0,
              "the put in flight at SIGTERM was not stored");
    cr_assert_eq(harness_wait_exit(&h, 3000), 0, "no exit after the last request drained");
    h.expect_exit = true;
    cr_assert(harness_exited_with(h.status, 0), "exit status 0x%x", (unsigned)h.status);
    cr_assert_eq(harness_conn_expect_close(&w, 1000), 0);
    harness_conn_close(&w);
    free(val);
}

Test(lifecycle, sigterm_deadline_bounds_a_stalled_client)
{
    cr_assert_eq(harness_start(&h, NULL, HARNESS_ARGS("--shutdown_timeout_ms=1000")), 0);
    size_t vlen = 4u << 20;
    uint8_t *val = malloc(vlen);
    cr_assert_not_null(val);
    harness_fill(val, vlen, 6);
    struct harness_conn w;
    cr_assert_eq(harness_conn_tcp(&w, h.port, 2000), 0);
    send_partial_put(&w, "stalled", val, vlen, 1u << 20);
    wait_reserved();

    uint64_t t0 = harness_now_ms();
    cr_assert_eq(harness_signal(&h, SIGTERM), 0);
    int rc = harness_wait_exit(&h, 5000);
    uint64_t took = harness_now_ms() - t0;
    h.expect_exit = true;
    cr_assert_eq(rc, 0, "a stalled client kept kvstashd alive 5 s past a 1 s drain deadline");
    cr_assert(harness_exited_with(h.status, 0), "exit status 0x%x", (unsigned)h.status);
    cr_assert_geq(took, 500, "exited after %llu ms: the drain did not wait for the client",
                  (unsigned long long)took);
    harness_conn_close(&w);
    free(val);
}

Test(lifecycle, restart_after_kill_9)
{
    cr_assert_eq(harness_start(&h, NULL, NULL), 0);
    struct kvstash *c;
    cr_assert_eq(harness_client(h.unix_addr, 2000, &c), 0);
    cr_assert_eq(kvstash_put(c, "k", 1, "v", 1), 0);
    harness_kill(&h);
    kvstash_close(c);
    /* the Unix socket file of the dead daemon is still there; a new one must cope */
    cr_assert_eq(harness_restart(&h, NULL, NULL), 0, "kvstashd does not start after a kill -9");
    cr_assert_eq(harness_client(h.unix_addr, 2000, &c), 0, "the Unix socket is not back");
    cr_assert_eq(kvstash_ping(c), 0);
    kvstash_close(c);
    cr_assert_eq(harness_stop_clean(&h), 0, "kvstashd did not shut down cleanly");
}

Test(lifecycle, second_sigint_exits_at_once)
{
    cr_assert_eq(harness_start(&h, NULL, HARNESS_ARGS("--shutdown_timeout_ms=30000")), 0);
    size_t vlen = 4u << 20;
    uint8_t *val = malloc(vlen);
    cr_assert_not_null(val);
    harness_fill(val, vlen, 8);
    struct harness_conn w;
    cr_assert_eq(harness_conn_tcp(&w, h.port, 2000), 0);
    send_partial_put(&w, "stalled", val, vlen, 1u << 20);
    wait_reserved();

    cr_assert_eq(harness_signal(&h, SIGINT), 0);
    harness_sleep_ms(300);
    cr_assert(harness_alive(&h), "the first SIGINT did not drain: the stalled client was cut");
    uint64_t t0 = harness_now_ms();
    cr_assert_eq(harness_signal(&h, SIGINT), 0);
    int rc = harness_wait_exit(&h, 3000);
    h.expect_exit = true;
    cr_assert_eq(rc, 0, "a second SIGINT did not stop kvstashd within 3 s");
    cr_assert_lt(harness_now_ms() - t0, 3000);
    harness_conn_close(&w);
    free(val);
}

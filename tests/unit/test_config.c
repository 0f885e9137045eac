/*
 * Unit tests for config (the option table, file parser, units, finalize, diff and reload
 * rules) and for log (line format, levels, reopen after rotation). No network; temp files
 * go under a fresh mkdtemp directory. Run from the repository root: the shipped
 * conf/kvstashd.conf is parsed and compared with the built-in defaults.
 */
#include <criterion/criterion.h>
#include <sys/stat.h>

#include <errno.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"

#define SHIPPED_CONF "conf/kvstashd.conf"

/* ---- helpers ---- */

static char tmpdir[64];

static void
tmp_setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvstash-test-config.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static void
tmp_teardown(void)
{
    char cmd[128];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) {
        cr_log_warn("could not remove %s", tmpdir);
    }
}

/* Write text to <tmpdir>/name and put the path in path. */
static void
write_file(const char *name, const char *text, char *path, size_t len)
{
    FILE *f;

    snprintf(path, len, "%s/%s", tmpdir, name);
    f = fopen(path, "w");
    cr_assert_not_null(f, "fopen %s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(text, 1, strlen(text), f), strlen(text));
    cr_assert_eq(fclose(f), 0);
}

/* Read a whole small file into a static buffer. */
static const char *
read_file(const char *path)
{
    static char buf[1 << 20];
    FILE *f = fopen(path, "r");
    size_t n;

    cr_assert_not_null(f, "fopen %s: %s", path, strerror(errno));
    n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Load text as a config file over c; returns conf_load_file's status, message in err. */
static int
load_text(struct kv_config *c, const char *text, char *err, size_t errlen)
{
    char path[256];

    write_file("test.conf", text, path, sizeof(path));
    return conf_load_file(c, path, err, errlen);
}

/* Expect text, as a config file, to fail with exactly "<path>:<line>: <rest>". */
static void
expect_file_error(const char *text, int line, const char *rest)
{
    struct kv_config c;
    char err[512], want[768];

    conf_init(&c);
    cr_assert_eq(load_text(&c, text, err, sizeof(err)), -1, "accepted: %s", text);
    snprintf(want, sizeof(want), "%s/test.conf:%d: %s", tmpdir, line, rest);
    cr_expect_str_eq(err, want);
}

/* Every key conf_dump knows, in table order; returns how many. */
static int
all_keys(char keys[][64], int max)
{
    struct kv_config c;
    char dump[8192];
    int n = 0;

    conf_init(&c);
    cr_assert_lt(conf_dump(&c, dump, sizeof(dump)), (int)sizeof(dump));
    for (char *line = strtok(dump, "\n"); line != NULL && n < max; line = strtok(NULL, "\n")) {
        size_t k = strcspn(line, " ");
        cr_assert_lt(k, 64);
        memcpy(keys[n], line, k);
        keys[n][k] = '\0';
        n++;
    }
    return n;
}

/* A value for every key that differs from its default, and is valid. */
static const char *const changed_values[][2] = {
    {"listen", "0.0.0.0:9999"},
    {"unix_socket", "/tmp/kvstash-test.sock"},
    {"data_dir", "/tmp/kvstash-data"},
    {"node_id", "node-7"},
    {"memory_size", "2g"},
    {"memory_hugepages", "off"},
    {"memory_file", "/dev/shm/kvstash-test.arena"},
    {"max_key_size", "2k"},
    {"max_value_size", "128m"},
    {"max_batch", "100"},
    {"max_message_size", "512m"},
    {"max_connections", "10"},
    {"io_threads", "3"},
    {"tcp_receive_window", "0"},
    {"local_tcp_congestion", "cubic"},
    {"lease_ttl_ms", "5s"},
    {"client_output_max", "8g"},
    {"client_output_timeout", "90s"},
    {"client_input_timeout", "2m"},
    {"client_inflight_max", "64"},
    {"idle_timeout", "10m"},
    {"conn_buffer_memory", "2g"},
    {"put_timeout_ms", "2m"},
    {"client_output_limit", "1m"},
    {"shutdown_timeout_ms", "1s"},
    {"eviction_high_watermark", "0.95"},
    {"eviction_low_watermark", "0.5"},
    {"eviction_policy", "slru"},
    {"ssd_dir", "/tmp/kvstash-ssd"},
    {"ssd_size", "128g"},
    {"ssd_bucket_size", "64m"},
    {"ssd_io_threads", "4"},
    {"ssd_high_watermark", "0.95"},
    {"ssd_low_watermark", "0.5"},
    {"ssd_write_rate_limit", "200m"},
    {"ssd_scrub_rate", "16m"},
    {"ssd_eviction", "lru"},
    {"ssd_offload", "write_through"},
    {"ssd_promote", "off"},
    {"rdma", "required"},
    {"rdma_device", "mlx5_1"},
    {"rdma_port", "2"},
    {"rdma_gid_index", "3"},
    {"log_level", "debug"},
    {"log_file", "/tmp/kvstash-test.log"},
    {"log_format", "json"},
    {"metrics_listen", "127.0.0.1:9100"},
    {"require_auth", "yes"},
    {"tls_listen", "127.0.0.1:7432"},
    {"resp_listen", "127.0.0.1:7433"},
    {"resp_unix_socket", "/tmp/kvstash-resp.sock"},
    {"resp_tls_listen", "127.0.0.1:7434"},
    {"tls_cert_file", "/tmp/kvstash-test.crt"},
    {"tls_key_file", "/tmp/kvstash-test.key"},
    {"tls_ca_file", "/tmp/kvstash-test-ca.crt"},
    {"allow_unauthenticated_remote", "yes"},
    {"token_file", "/tmp/kvstash-test.tokens"},
    {"cluster_name", "pool-1"},
    {"etcd_endpoints", "http://127.0.0.1:2379,https://10.0.0.2:2379"},
    {"etcd_prefix", "/kv/pool-1"},
    {"etcd_tls_ca_file", "/etc/ssl/etcd-ca.pem"},
    {"etcd_tls_cert_file", "/etc/ssl/etcd-client.pem"},
    {"etcd_tls_key_file", "/etc/ssl/etcd-client.key"},
    {"etcd_user", "kvstash"},
    {"etcd_password_file", "/etc/kvstash/etcd_password"},
    {"etcd_lease_ttl", "20s"},
    {"peer_advertise", "10.0.0.1:7431"},
    {"replicas", "3"},
    {"node_weight", "2.5"},
    {"write_ack", "local"},
    {"rebalance_delay", "2m"},
    {"peer_timeout", "1s"},
    {"tenant", "team-a token_sha256=9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
};
#define N_CHANGED (sizeof(changed_values) / sizeof(changed_values[0]))

/* The reload rules as the public documentation states them. */
static const char *const reloadable_keys[] = {
    "log_level",       "log_file",  "log_format", "lease_ttl_ms",        "put_timeout_ms", "max_key_size",
    "max_value_size",  "max_batch",        "max_message_size",    "max_connections",
    "tcp_receive_window", "local_tcp_congestion",
    "client_output_limit", "shutdown_timeout_ms", "eviction_high_watermark",
    "eviction_low_watermark", "eviction_policy", "ssd_bucket_size", "ssd_eviction",
    "ssd_high_watermark", "ssd_low_watermark", "ssd_write_rate_limit", "ssd_scrub_rate",
    "ssd_offload",
    "ssd_promote", "require_auth", "client_output_max",
    "client_output_timeout", "client_input_timeout", "client_inflight_max", "idle_timeout",
    "conn_buffer_memory",
    "tls_cert_file",
    "tls_key_file", "tls_ca_file",
    "allow_unauthenticated_remote", "token_file", "tenant",
    "write_ack", "rebalance_delay", "peer_timeout", NULL,
};

static bool
is_reloadable_key(const char *key)
{
    for (const char *const *k = reloadable_keys; *k != NULL; k++) {
        if (strcmp(*k, key) == 0) {
            return true;
        }
    }
    return false;
}

static void
make_changed(struct kv_config *c)
{
    char err[512];

    conf_init(c);
    for (size_t i = 0; i < N_CHANGED; i++) {
        cr_assert_eq(conf_set(c, changed_values[i][0], changed_values[i][1], "test", err,
                              sizeof(err)),
                     0, "%s", err);
    }
}

struct diff_log {
    int n;
    char keys[CONF_OPTIONS_MAX][64];
    bool reloadable[CONF_OPTIONS_MAX];
};

static void
diff_collect(const char *key, bool reloadable, void *arg)
{
    struct diff_log *d = arg;

    cr_assert_lt(d->n, CONF_OPTIONS_MAX);
    snprintf(d->keys[d->n], sizeof(d->keys[d->n]), "%s", key);
    d->reloadable[d->n] = reloadable;
    d->n++;
}

/* ---- the shipped file documents the defaults ---- */

Test(config, shipped_conf_equals_defaults, .init = tmp_setup, .fini = tmp_teardown)
{
    struct kv_config defaults, shipped;
    struct diff_log d = {0};
    char err[512];

    conf_init(&defaults);
    conf_init(&shipped);
    cr_assert_eq(conf_load_file(&shipped, SHIPPED_CONF, err, sizeof(err)), 0, "%s", err);
    conf_diff(&defaults, &shipped, diff_collect, &d);
    for (int i = 0; i < d.n; i++) {
        cr_expect(strcmp(d.keys[i], "data_dir") == 0 || strcmp(d.keys[i], "memory_size") == 0,
                  "%s: '%s' differs from the built-in default", SHIPPED_CONF, d.keys[i]);
    }
    cr_expect_str_eq(shipped.data_dir, "./var");
    cr_expect_eq(shipped.memory_size, 1ull << 30);
}

/*
 * Every key appears as a setting in the shipped file, and the comment block above it says
 * "Default" and the key's reload rule ("reloadable" or "restart").
 */
Test(config, shipped_conf_lists_and_documents_every_key)
{
    static char lines[512][512];
    char keys[CONF_OPTIONS_MAX][64];
    int nkeys = all_keys(keys, CONF_OPTIONS_MAX), nlines = 0;
    struct kv_config a, b;
    struct diff_log d = {0};
    FILE *f = fopen(SHIPPED_CONF, "r");

    cr_assert_not_null(f, "%s: %s (run from the repository root)", SHIPPED_CONF,
                       strerror(errno));
    while (nlines < 512 && fgets(lines[nlines], sizeof(lines[0]), f) != NULL) {
        nlines++;
    }
    fclose(f);

    /* Learn each key's reload flag from the table, through conf_diff. */
    conf_init(&a);
    make_changed(&b);
    cr_assert_eq(conf_diff(&a, &b, diff_collect, &d), nkeys,
                 "changed_values[] must cover every key");

    for (int k = 0; k < d.n; k++) {
        const char *key = d.keys[k];
        size_t klen = strlen(key);
        int at = -1;
        char comment[4096] = "";

        for (int i = 0; i < nlines; i++) {
            const char *p = lines[i] + strspn(lines[i], " \t");
            if (strncmp(p, key, klen) == 0 && (p[klen] == ' ' || p[klen] == '\t')) {
                at = i;
            }
        }
        cr_expect_geq(at, 0, "%s does not set '%s'", SHIPPED_CONF, key);
        if (at < 0) {
            continue;
        }
        /* The comment block: lines above, through neighbouring settings, up to a blank. */
        for (int i = at - 1; i >= 0 && lines[i][0] != '\n'; i--) {
            if (lines[i][0] == '#') {
                strncat(comment, lines[i], sizeof(comment) - strlen(comment) - 1);
            }
        }
        cr_expect_not_null(strstr(comment, "Default"), "%s: '%s' has no 'Default' comment",
                           SHIPPED_CONF, key);
        cr_expect_not_null(strstr(comment, d.reloadable[k] ? "reloadable" : "restart"),
                           "%s: comment of '%s' must say %s", SHIPPED_CONF, key,
                           d.reloadable[k] ? "reloadable" : "restart");
    }
}

Test(config, defaults)
{
    struct kv_config c;

    conf_init(&c);
    cr_expect_str_eq(c.listen, "127.0.0.1:7431");
    cr_expect_str_eq(c.unix_socket, "");
    cr_expect_str_eq(c.data_dir, "./var");
    cr_expect_str_eq(c.node_id, "");
    cr_expect_eq(c.memory_size, 1ull << 30);
    cr_expect_eq(c.max_key_size, 1024);
    cr_expect_eq(c.max_value_size, 256ull << 20);
    cr_expect_eq(c.max_batch, 16384);
    cr_expect_eq(c.max_message_size, 1ull << 30);
    cr_expect_eq(c.max_connections, 1024);
    cr_expect_eq(c.io_threads, 0);
    cr_expect_eq(c.tcp_receive_window, 16ull << 20);
    cr_expect_str_eq(c.local_tcp_congestion, "reno");
    cr_expect_eq(c.lease_ttl_ms, 10000);
    cr_expect_eq(c.client_output_limit, 64ull << 20);
    cr_expect_eq(c.client_inflight_max, 16384);
    cr_expect_eq(c.shutdown_timeout_ms, 10000);
    cr_expect_eq(c.eviction_high_watermark, 0.995);
    cr_expect_eq(c.eviction_low_watermark, 0.985);
    cr_expect_eq(c.eviction_policy, CONF_EVICT_LRU);
    cr_expect_str_eq(c.ssd_dir, "<data_dir>/ssd", "derived by conf_finalize");
    cr_expect_eq(c.ssd_size, 64ull << 30);
    cr_expect_eq(c.ssd_bucket_size, 256ull << 20);
    cr_expect_eq(c.ssd_io_threads, 2);
    cr_expect_eq(c.ssd_high_watermark, 0.98);
    cr_expect_eq(c.ssd_low_watermark, 0.95);
    cr_expect_eq(c.ssd_eviction, CONF_SSD_FIFO);
    cr_expect_eq(c.ssd_offload, CONF_SSD_ON_EVICT);
    cr_expect_eq(c.ssd_promote, 1);
    cr_expect_eq(c.log_level, LOG_LEVEL_INFO);
    cr_expect_str_eq(c.log_file, "");
}

/* ---- units ---- */

Test(config, size_units)
{
    static const struct {
        const char *text;
        uint64_t want;
    } ok[] = {
        {"0", 0},
        {"4096", 4096},
        {"10b", 10},
        {"10B", 10},
        {"64k", 64ull << 10},
        {"64K", 64ull << 10},
        {"2kb", 2048},
        {"2KiB", 2048},
        {"1m", 1ull << 20},
        {"1MB", 1ull << 20},
        {"4g", 4ull << 30},
        {"4gb", 4ull << 30},
        {"4GiB", 4ull << 30},
        {"4gib", 4ull << 30},
        {"4GIB", 4ull << 30},
        {"1t", 1ull << 40},
        {"16777215t", 16777215ull << 40},
        {"18446744073709551615", UINT64_MAX},
    };
    static const char *const bad[] = {
        "", "k", "12q", "1.5g", "-1", "+1", " 1", "1 ", "1 g", "1kk", "1kbb", "1bk", "1i",
        "1ki", "0x10", "1e3", "1p",
        "18446744073709551616", /* 2^64 */
        "16777216t",            /* 2^64 */
        "17179869184g",         /* 2^64 */
        "99999999999999999999999999k",
    };
    uint64_t v;

    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        v = 12345;
        cr_expect_eq(conf_parse_size(ok[i].text, &v), 0, "rejected '%s'", ok[i].text);
        cr_expect_eq(v, ok[i].want, "'%s' = %llu", ok[i].text, (unsigned long long)v);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_expect_eq(conf_parse_size(bad[i], &v), -1, "accepted '%s'", bad[i]);
    }
}

Test(config, duration_units)
{
    static const struct {
        const char *text;
        uint64_t want;
    } ok[] = {
        {"0", 0},        {"250", 250},          {"500ms", 500},     {"500MS", 500},
        {"10s", 10000},  {"5m", 300000},        {"1h", 3600000},    {"2H", 7200000},
        {"18446744073709551615ms", UINT64_MAX},
    };
    static const char *const bad[] = {
        "", "s", "ms", "10x", "1.5s", "-1", "10 s", " 10s", "10sec", "10msec", "1d",
        "18446744073709551616", "18446744073709551615h", "5124095576030432h",
    };
    uint64_t v;

    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        v = 12345;
        cr_expect_eq(conf_parse_duration_ms(ok[i].text, &v), 0, "rejected '%s'", ok[i].text);
        cr_expect_eq(v, ok[i].want, "'%s' = %llu", ok[i].text, (unsigned long long)v);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_expect_eq(conf_parse_duration_ms(bad[i], &v), -1, "accepted '%s'", bad[i]);
    }
}

Test(config, set_uses_units_and_bounds)
{
    struct kv_config c;
    char err[512];

    conf_init(&c);
    cr_assert_eq(conf_set(&c, "memory_size", "4GiB", "--memory_size", err, sizeof(err)), 0);
    cr_expect_eq(c.memory_size, 4ull << 30);
    cr_assert_eq(conf_set(&c, "lease_ttl_ms", "1500", "--lease_ttl_ms", err, sizeof(err)), 0);
    cr_expect_eq(c.lease_ttl_ms, 1500);
    cr_assert_eq(conf_set(&c, "log_level", "DEBUG", "--log_level", err, sizeof(err)), 0);
    cr_expect_eq(c.log_level, LOG_LEVEL_DEBUG);
    cr_assert_eq(conf_set(&c, "eviction_low_watermark", "1", "--x", err, sizeof(err)), 0);
    cr_expect_eq(c.eviction_low_watermark, 1.0);
    cr_assert_eq(conf_set(&c, "client_inflight_max", "0", "--x", err, sizeof(err)), 0);
    cr_expect_eq(c.client_inflight_max, 0, "0 is no cap, not an error");

    cr_expect_eq(conf_set(&c, "memory_size", "99999999999t", "--memory_size", err,
                          sizeof(err)), -1);
    cr_expect_str_eq(err, "--memory_size=99999999999t: too large (does not fit in 64 bits)");
    cr_expect_eq(conf_set(&c, "max_batch", "16k", "--max_batch", err, sizeof(err)), -1);
    cr_expect_str_eq(err, "--max_batch=16k: bad number (use a whole number, e.g. 1024)");
    cr_expect_eq(conf_set(&c, "log_level", "verbose", "--log_level", err, sizeof(err)), -1);
    cr_expect_str_eq(err, "--log_level=verbose: bad log level (use error, warn, info or debug)");
    cr_expect_eq(conf_set(&c, "eviction_high_watermark", "nan", "--e", err, sizeof(err)), -1);
    cr_expect_eq(conf_set(&c, "eviction_high_watermark", "inf", "--e", err, sizeof(err)), -1);
}

/* ---- errors ---- */

Test(config, unknown_key)
{
    struct kv_config c;
    char err[512];

    conf_init(&c);
    cr_expect_eq(conf_set(&c, "bogus", "1", "--bogus", err, sizeof(err)), -1);
    cr_expect_str_eq(err, "--bogus=1: unknown key 'bogus'");
    cr_expect_eq(conf_set(&c, "Memory_Size", "1g", NULL, err, sizeof(err)), -1);
    cr_expect_str_eq(err, "--Memory_Size=1g: unknown key 'Memory_Size'");
}

Test(config, file_errors_name_path_line_and_text, .init = tmp_setup, .fini = tmp_teardown)
{
    expect_file_error("# a comment\n\nmemory_size 12q\n", 3,
                      "'memory_size 12q': bad size (use e.g. 64k, 1m, 4g, 4GiB)");
    expect_file_error("log_level info\nbogus 1   # trailing comment\n", 2,
                      "'bogus 1': unknown key 'bogus'");
    expect_file_error("\n\neviction_low_watermark 1.5\n", 3,
                      "'eviction_low_watermark 1.5': out of range (0 < x <= 1)");
    expect_file_error("eviction_high_watermark 0\n", 1,
                      "'eviction_high_watermark 0': out of range (0 < x <= 1)");
    expect_file_error("memory_size 512k\n", 1, "'memory_size 512k': out of range (min 1m)");
    expect_file_error("max_key_size 65537\n", 1,
                      "'max_key_size 65537': out of range (min 1, max 64k)");
    expect_file_error("max_batch 0\n", 1, "'max_batch 0': out of range (min 1, max 1048576)");
    expect_file_error("io_threads 65\n", 1, "'io_threads 65': out of range (min 0, max 64)");
    expect_file_error("local_tcp_congestion BBR\n", 1,
                      "'local_tcp_congestion BBR': bad congestion control name (up to 15 "
                      "lowercase letters, digits, '_' or '-', as "
                      "net.ipv4.tcp_available_congestion_control lists them)");
    expect_file_error("lease_ttl_ms 0\n", 1, "'lease_ttl_ms 0': out of range (min 1ms, max 1h)");
    expect_file_error("lease_ttl_ms 61m\n", 1,
                      "'lease_ttl_ms 61m': out of range (min 1ms, max 1h)");
    expect_file_error("max_message_size 5g\n", 1,
                      "'max_message_size 5g': out of range (min 64k, max 4g)");
    expect_file_error("lease_ttl_ms 10 s\n", 1,
                      "'lease_ttl_ms 10 s': unexpected text after the value (put a value with "
                      "spaces in double quotes)");
    expect_file_error("log_file\n", 1, "'log_file': missing value (write \"\" for an empty one)");
    expect_file_error("log_file # nothing\n", 1,
                      "'log_file': missing value (write \"\" for an empty one)");
    expect_file_error("log_file \"/tmp/x.log\n", 1,
                      "'log_file \"/tmp/x.log': unterminated quote");
    expect_file_error("log_file \"/tmp/x.log\"x\n", 1,
                      "'log_file \"/tmp/x.log\"x': unexpected text after the closing quote");
    expect_file_error("listen 127.0.0.1\n", 1,
                      "'listen 127.0.0.1': missing port (use host:port, e.g. 127.0.0.1:7431)");
    expect_file_error("data_dir \"\"\n", 1, "'data_dir \"\"': must not be empty");
}

Test(config, errors_quote_only_a_bounded_excerpt, .init = tmp_setup, .fini = tmp_teardown)
{
    char text[600], err[512];
    struct kv_config c;

    memset(text, 'x', sizeof(text));
    memcpy(text, "node_id ", 8);
    text[sizeof(text) - 2] = '\n';
    text[sizeof(text) - 1] = '\0';
    conf_init(&c);
    cr_assert_eq(load_text(&c, text, err, sizeof(err)), -1);
    cr_expect_not_null(strstr(err, "test.conf:1: 'node_id xxx"), "%s", err);
    cr_expect_not_null(strstr(err, "...': too long (max 511 bytes)"), "%s", err);
    cr_expect_lt(strlen(err), 300);
}

Test(config, line_too_long, .init = tmp_setup, .fini = tmp_teardown)
{
    static char text[10000];
    struct kv_config c;
    char err[512];

    memset(text, ' ', sizeof(text));
    memcpy(text, "log_level info\n# ", 17);
    text[sizeof(text) - 2] = '\n';
    text[sizeof(text) - 1] = '\0';
    conf_init(&c);
    cr_assert_eq(load_text(&c, text, err, sizeof(err)), -1);
    cr_expect_not_null(strstr(err, "test.conf:2: line too long (max 4096 bytes)"), "%s", err);
}

Test(config, missing_file_is_errno, .init = tmp_setup, .fini = tmp_teardown)
{
    struct kv_config c;
    char path[256], err[512], want[512];

    conf_init(&c);
    snprintf(path, sizeof(path), "%s/nope.conf", tmpdir);
    cr_expect_eq(conf_load_file(&c, path, err, sizeof(err)), -ENOENT);
    snprintf(want, sizeof(want), "%s: cannot open: %s", path, strerror(ENOENT));
    cr_expect_str_eq(err, want);
}

Test(config, failed_set_leaves_value)
{
    struct kv_config c;
    char err[512];

    conf_init(&c);
    cr_expect_eq(conf_set(&c, "memory_size", "2x", "--memory_size", err, sizeof(err)), -1);
    cr_expect_eq(c.memory_size, 1ull << 30);
    cr_expect_eq(conf_set(&c, "listen", "nohost", "--listen", err, sizeof(err)), -1);
    cr_expect_str_eq(c.listen, "127.0.0.1:7431");
}

Test(config, listen_syntax)
{
    static const char *const ok[] = {
        "127.0.0.1:7431", "0.0.0.0:0", "0.0.0.0:65535", "localhost:7431", "kv-1.example:1",
        "[::1]:7431",     "[::]:0",    "[fe80::1]:80",  "",
    };
    static const char *const bad[] = {
        "127.0.0.1", "127.0.0.1:", ":7431", "::1:7431", "host:65536", "host:-1", "host:x",
        "[::1]", "[::1]7431", "[::1]:", "[::1]:70000", "[zz::1]:1", "[]:1", "300.1.1.1:1",
        "1.2.3:1", "a b:1", "host:7431x",
    };
    struct kv_config c;
    char err[512];

    conf_init(&c);
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        cr_expect_eq(conf_set(&c, "listen", ok[i], "--listen", err, sizeof(err)), 0,
                     "rejected '%s': %s", ok[i], err);
        cr_expect_str_eq(c.listen, ok[i]);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_expect_eq(conf_set(&c, "listen", bad[i], "--listen", err, sizeof(err)), -1,
                     "accepted '%s'", bad[i]);
    }
}

/* ---- file syntax ---- */

Test(config, quotes_comments_and_whitespace, .init = tmp_setup, .fini = tmp_teardown)
{
    struct kv_config c;
    char err[512];

    conf_init(&c);
    cr_assert_eq(load_text(&c,
                           "\xEF\xBB\xBF# whole-line comment\n"
                           "   # indented comment\n"
                           "\n"
                           "\t\n"
                           "  memory_size   64m   # trailing comment\n"
                           "log_file \"/tmp/a b#c.log\"  # quoted value with space and '#'\n"
                           "data_dir /srv/kv#1\r\n"
                           "node_id \"\"\n"
                           "unix_socket \"/tmp/q\\\"x\\\\y\"\n"
                           "listen \"\"\n"
                           "log_level\twarn",
                           err, sizeof(err)),
                 0, "%s", err);
    cr_expect_eq(c.memory_size, 64ull << 20);
    cr_expect_str_eq(c.log_file, "/tmp/a b#c.log");
    cr_expect_str_eq(c.data_dir, "/srv/kv#1");
    cr_expect_str_eq(c.node_id, "");
    cr_expect_str_eq(c.unix_socket, "/tmp/q\"x\\y");
    cr_expect_str_eq(c.listen, "");
    cr_expect_eq(c.log_level, LOG_LEVEL_WARN);
}

Test(config, last_occurrence_wins, .init = tmp_setup, .fini = tmp_teardown)
{
    struct kv_config c;
    char err[512];

    conf_init(&c);
    cr_assert_eq(load_text(&c,
                           "max_batch 10\n"
                           "log_level debug\n"
                           "max_batch 20\n"
                           "log_level error\n",
                           err, sizeof(err)),
                 0, "%s", err);
    cr_expect_eq(c.max_batch, 20);
    cr_expect_eq(c.log_level, LOG_LEVEL_ERROR);
}

Test(config, dump_reads_back_as_the_same_config, .init = tmp_setup, .fini = tmp_teardown)
{
    struct kv_config a, b;
    char dump[8192], err[512];
    int n;

    make_changed(&a);
    cr_assert_eq(conf_set(&a, "log_file", "/tmp/a \"b\" #c.log", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&a, "lease_ttl_ms", "1500", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&a, "max_key_size", "1000", "t", err, sizeof(err)), 0);
    n = conf_dump(&a, dump, sizeof(dump));
    cr_assert_gt(n, 0);
    cr_assert_lt(n, (int)sizeof(dump));
    cr_expect_eq((size_t)n, strlen(dump));
    cr_expect_not_null(strstr(dump, "memory_size 2g\n"), "%s", dump);
    cr_expect_not_null(strstr(dump, "lease_ttl_ms 1500ms\n"), "%s", dump);
    cr_expect_not_null(strstr(dump, "eviction_high_watermark 0.95\n"), "%s", dump);
    cr_expect_not_null(strstr(dump, "log_level debug\n"), "%s", dump);

    conf_init(&b);
    cr_assert_eq(load_text(&b, dump, err, sizeof(err)), 0, "%s\n%s", err, dump);
    cr_expect_eq(conf_diff(&a, &b, NULL, NULL), 0, "%s", dump);

    /* A short buffer gets a NUL-terminated prefix and the full length. */
    cr_expect_eq(conf_dump(&a, dump, 10), n);
    cr_expect_eq(strlen(dump), 9);
}

/* ---- finalize ---- */

Test(config, finalize_derives_socket_and_threads)
{
    struct kv_config c;
    char err[512];

    conf_init(&c);
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.unix_socket, "./var/kvstashd.sock");
    cr_expect_geq(c.io_threads, 1);
    cr_expect_leq(c.io_threads, 8);
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "finalize twice: %s", err);
    cr_expect_str_eq(c.unix_socket, "./var/kvstashd.sock");

    conf_init(&c);
    cr_assert_eq(conf_set(&c, "data_dir", "/srv/kv/", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&c, "io_threads", "12", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.unix_socket, "/srv/kv/kvstashd.sock");
    cr_expect_eq(c.io_threads, 12);

    conf_init(&c);
    cr_assert_eq(conf_set(&c, "unix_socket", "none", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.unix_socket, "none");

    conf_init(&c);
    cr_assert_eq(conf_set(&c, "unix_socket", "/run/kv.sock", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.unix_socket, "/run/kv.sock");
}

Test(config, finalize_cross_checks)
{
    struct kv_config c;
    char err[512], dir[300];

    conf_init(&c);
    cr_assert_eq(conf_set(&c, "eviction_low_watermark", "0.999", "t.conf:3", err, sizeof(err)),
                 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), -1);
    cr_expect_str_eq(err, "eviction_low_watermark 0.999 (t.conf:3) must not be above "
                          "eviction_high_watermark 0.995 (default)",
                     "the message names both values and what set them");
    cr_expect_str_eq(c.unix_socket, "", "a failed finalize derives nothing");
    cr_expect_eq(c.io_threads, 0);

    conf_init(&c);
    cr_assert_eq(conf_set(&c, "eviction_low_watermark", "0.995", "t", err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), 0, "low == high is fine: %s", err);

    conf_init(&c);
    cr_assert_eq(conf_set(&c, "max_value_size", "1g", "t", err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), -1);
    cr_expect_not_null(strstr(err, "max_message_size 1g (default) must hold max_value_size 1g "
                                   "(t) + max_key_size 1k (default) + 64"),
                       "%s", err);

    /* Exactly enough room passes; one byte less fails. */
    conf_init(&c);
    cr_assert_eq(conf_set(&c, "max_message_size", "1048576", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&c, "max_key_size", "1000", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&c, "max_value_size", "1047512", "t", err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    conf_init(&c);
    cr_assert_eq(conf_set(&c, "max_message_size", "1048576", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&c, "max_key_size", "1000", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&c, "max_value_size", "1047513", "t", err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), -1);

    /* The derived socket path must fit in sockaddr_un. */
    conf_init(&c);
    memset(dir, 'd', sizeof(dir));
    dir[0] = '/';
    dir[200] = '\0';
    cr_assert_eq(conf_set(&c, "data_dir", dir, "t", err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), -1);
    cr_expect_not_null(strstr(err, "unix_socket"), "%s", err);
    cr_assert_eq(conf_set(&c, "unix_socket", "none", "t", err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
}

/* ---- diff and reload ---- */

Test(config, diff_reports_changed_keys_with_reload_flag)
{
    struct kv_config a, b;
    struct diff_log d = {0};
    char err[512];

    conf_init(&a);
    conf_init(&b);
    cr_expect_eq(conf_diff(&a, &b, diff_collect, &d), 0);
    cr_assert_eq(conf_set(&b, "memory_size", "2g", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&b, "log_level", "debug", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_diff(&a, &b, diff_collect, &d), 2);
    cr_expect_str_eq(d.keys[0], "memory_size");
    cr_expect_eq(d.reloadable[0], false);
    cr_expect_str_eq(d.keys[1], "log_level");
    cr_expect_eq(d.reloadable[1], true);
}

Test(config, reload_rules_match_the_documentation)
{
    char keys[CONF_OPTIONS_MAX][64];
    int nkeys = all_keys(keys, CONF_OPTIONS_MAX);
    struct kv_config a, b;
    struct diff_log d = {0};

    cr_expect_eq(nkeys, (int)N_CHANGED);
    conf_init(&a);
    make_changed(&b);
    cr_assert_eq(conf_diff(&a, &b, diff_collect, &d), nkeys);
    for (int i = 0; i < d.n; i++) {
        cr_expect_eq(d.reloadable[i], is_reloadable_key(d.keys[i]), "%s: reloadable is %d",
                     d.keys[i], d.reloadable[i]);
    }
}

Test(config, apply_reloadable_copies_only_reloadable_keys)
{
    struct kv_config running, before, fresh;
    struct diff_log d = {0};

    conf_init(&running);
    before = running;
    make_changed(&fresh);
    conf_apply_reloadable(&running, &fresh);

    /* What still differs from the new config is exactly the restart-only keys... */
    cr_expect_eq(conf_diff(&running, &fresh, diff_collect, &d), 32);
    for (int i = 0; i < d.n; i++) {
        cr_expect_not(d.reloadable[i], "%s should have been applied", d.keys[i]);
    }
    /* ...and what changed from before is exactly the reloadable ones. */
    d.n = 0;
    cr_expect_eq(conf_diff(&before, &running, diff_collect, &d), 41);
    for (int i = 0; i < d.n; i++) {
        cr_expect(d.reloadable[i], "%s needs a restart but was applied", d.keys[i]);
    }
    cr_expect_str_eq(running.log_file, "/tmp/kvstash-test.log");
    cr_expect_eq(running.memory_size, 1ull << 30);
    cr_expect_str_eq(running.listen, "127.0.0.1:7431");
    cr_expect_eq(running.ssd_eviction, CONF_SSD_LRU);
    cr_expect_eq(running.ssd_offload, CONF_SSD_WRITE_THROUGH);
    cr_expect_eq(running.ssd_write_rate_limit, 200ull << 20);
    cr_expect_eq(running.ssd_scrub_rate, 16ull << 20);
    cr_expect_eq(running.ssd_promote, 0);
    cr_expect_eq(running.ssd_bucket_size, 64ull << 20);
    cr_expect_str_eq(running.ssd_dir, "<data_dir>/ssd");
    cr_expect_eq(running.ssd_size, 64ull << 30);
    cr_expect_eq(running.ssd_io_threads, 2);
}

/* ---- the SSD tier ---- */

Test(config, ssd_dir_derived_from_data_dir, .init = tmp_setup, .fini = tmp_teardown)
{
    static const struct {
        const char *data_dir, *want;
    } cases[] = {
        {"./var", "./var/ssd"},
        {"/srv/kv", "/srv/kv/ssd"},
        {"/srv/kv///", "/srv/kv/ssd"},
        {"/", "/ssd"},
    };
    struct kv_config c;
    char err[512];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        conf_init(&c);
        cr_assert_eq(conf_set(&c, "data_dir", cases[i].data_dir, "t", err, sizeof(err)), 0);
        cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
        cr_expect_str_eq(c.ssd_dir, cases[i].want, "data_dir %s", cases[i].data_dir);
        cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "finalize twice: %s", err);
        cr_expect_str_eq(c.ssd_dir, cases[i].want, "finalize twice, data_dir %s",
                         cases[i].data_dir);
    }

    /* data_dir set after ssd_dir in a file still counts: the default is derived at the end. */
    conf_init(&c);
    cr_assert_eq(load_text(&c, "ssd_dir <data_dir>/ssd\ndata_dir /srv/a\n", err, sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.ssd_dir, "/srv/a/ssd");

    /* A path that is set is kept as written, whatever data_dir is. */
    conf_init(&c);
    cr_assert_eq(conf_set(&c, "ssd_dir", "/mnt/nvme0/kv/", "--ssd_dir", err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&c, "data_dir", "/srv/kv", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.ssd_dir, "/mnt/nvme0/kv/");

    /* The tag means nothing outside the default. */
    cr_expect_eq(conf_set(&c, "ssd_dir", "<data_dir>/ssd2", "--ssd_dir", err, sizeof(err)), -1);
    cr_expect_str_eq(err, "--ssd_dir=<data_dir>/ssd2: <data_dir> is only understood in the "
                          "default, <data_dir>/ssd (write the whole path, or \"\" for no SSD "
                          "tier)");
    cr_expect_str_eq(c.ssd_dir, "/mnt/nvme0/kv/", "a failed set leaves the value");
}

Test(config, ssd_dir_too_long_is_rejected)
{
    struct kv_config c;
    char err[512], dir[CONF_STR_MAX + 8];

    /* A set path is bounded like every string. */
    conf_init(&c);
    memset(dir, 's', sizeof(dir));
    dir[0] = '/';
    dir[CONF_STR_MAX] = '\0';
    cr_expect_eq(conf_set(&c, "ssd_dir", dir, "--ssd_dir", err, sizeof(err)), -1);
    cr_expect_not_null(strstr(err, ": too long (max 511 bytes)"), "%s", err);
    dir[CONF_STR_MAX - 1] = '\0';
    cr_expect_eq(conf_set(&c, "ssd_dir", dir, "--ssd_dir", err, sizeof(err)), 0, "%s", err);

    /* The derived <data_dir>/ssd must fit as well: 507 + "/ssd" does, 508 does not. */
    conf_init(&c);
    cr_assert_eq(conf_set(&c, "unix_socket", "none", "t", err, sizeof(err)), 0);
    memset(dir, 'd', sizeof(dir));
    dir[0] = '/';
    dir[507] = '\0';
    cr_assert_eq(conf_set(&c, "data_dir", dir, "t", err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(strlen(c.ssd_dir), 511);

    conf_init(&c);
    cr_assert_eq(conf_set(&c, "unix_socket", "none", "t", err, sizeof(err)), 0);
    dir[507] = 'd';
    dir[508] = '\0';
    cr_assert_eq(conf_set(&c, "data_dir", dir, "t", err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), -1);
    cr_expect_str_eq(err, "ssd_dir: the default <data_dir>/ssd is longer than a path may be "
                          "(max 511 bytes): set ssd_dir to a shorter path, or \"\" for no SSD "
                          "tier");
    cr_expect_str_eq(c.ssd_dir, "<data_dir>/ssd", "a failed finalize derives nothing");
    cr_assert_eq(conf_set(&c, "ssd_dir", "", "--ssd_dir", err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), 0, "no SSD tier, nothing to derive: %s",
                 err);
}

/* Dump a finalized config, load the dump over fresh defaults, finalize: same config. */
static void
expect_dump_round_trip(const struct kv_config *a)
{
    struct kv_config b;
    char dump[8192], err[512];

    cr_assert_lt(conf_dump(a, dump, sizeof(dump)), (int)sizeof(dump));
    conf_init(&b);
    cr_assert_eq(load_text(&b, dump, err, sizeof(err)), 0, "%s\n%s", err, dump);
    cr_assert_eq(conf_finalize(&b, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(b.ssd_dir, a->ssd_dir, "%s", dump);
    cr_expect_eq(conf_diff(a, &b, NULL, NULL), 0, "%s", dump);
}

Test(config, ssd_dir_empty_disables_and_survives_dump, .init = tmp_setup, .fini = tmp_teardown)
{
    struct kv_config c;
    char dump[8192], err[512];

    /* In a file. */
    conf_init(&c);
    cr_assert_eq(load_text(&c, "data_dir /srv/kv\nssd_dir \"\"\n", err, sizeof(err)), 0, "%s",
                 err);
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.ssd_dir, "");
    cr_assert_lt(conf_dump(&c, dump, sizeof(dump)), (int)sizeof(dump));
    cr_expect_not_null(strstr(dump, "\nssd_dir \"\"\n"), "%s", dump);
    expect_dump_round_trip(&c);

    /* On the command line, --ssd_dir= */
    conf_init(&c);
    cr_assert_eq(conf_set(&c, "ssd_dir", "", "--ssd_dir", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.ssd_dir, "");
    expect_dump_round_trip(&c);

    /* The derived default and a set path round-trip too. */
    conf_init(&c);
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.ssd_dir, "./var/ssd");
    cr_assert_lt(conf_dump(&c, dump, sizeof(dump)), (int)sizeof(dump));
    cr_expect_not_null(strstr(dump, "\nssd_dir ./var/ssd\n"), "%s", dump);
    expect_dump_round_trip(&c);
    cr_assert_eq(conf_set(&c, "ssd_dir", "/mnt/ssd dir", "t", err, sizeof(err)), 0);
    expect_dump_round_trip(&c);

    /* Unfinalized, the default dumps as itself and is derived from the new data_dir. */
    conf_init(&c);
    cr_assert_lt(conf_dump(&c, dump, sizeof(dump)), (int)sizeof(dump));
    cr_expect_not_null(strstr(dump, "\nssd_dir <data_dir>/ssd\n"), "%s", dump);
    conf_init(&c);
    cr_assert_eq(load_text(&c, dump, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(conf_set(&c, "data_dir", "/srv/b", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.ssd_dir, "/srv/b/ssd");
}

Test(config, ssd_enums_and_bool_by_name, .init = tmp_setup, .fini = tmp_teardown)
{
    static const struct {
        const char *key, *text;
        int want;
    } ok[] = {
        {"ssd_eviction", "fifo", CONF_SSD_FIFO},
        {"ssd_eviction", "lru", CONF_SSD_LRU},
        {"ssd_eviction", "LRU", CONF_SSD_LRU},
        {"ssd_offload", "on_evict", CONF_SSD_ON_EVICT},
        {"ssd_offload", "write_through", CONF_SSD_WRITE_THROUGH},
        {"ssd_offload", "Write_Through", CONF_SSD_WRITE_THROUGH},
        {"ssd_offload", "off", CONF_SSD_OFF},
        {"ssd_promote", "on", 1},  {"ssd_promote", "off", 0},   {"ssd_promote", "yes", 1},
        {"ssd_promote", "no", 0},  {"ssd_promote", "true", 1},  {"ssd_promote", "false", 0},
        {"ssd_promote", "1", 1},   {"ssd_promote", "0", 0},     {"ssd_promote", "ON", 1},
        {"ssd_promote", "No", 0},  {"ssd_promote", "TRUE", 1},  {"ssd_promote", "False", 0},
    };
    static const char *const bad_promote[] = {"", "2", "01", "y", "n", "enabled", "on ", "tru"};
    struct kv_config c;
    char err[512], dump[8192];
    int v;

    conf_init(&c);
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        cr_expect_eq(conf_set(&c, ok[i].key, ok[i].text, "t", err, sizeof(err)), 0,
                     "rejected '%s %s': %s", ok[i].key, ok[i].text, err);
        v = strcmp(ok[i].key, "ssd_eviction") == 0  ? c.ssd_eviction
            : strcmp(ok[i].key, "ssd_offload") == 0 ? c.ssd_offload
                                                    : c.ssd_promote;
        cr_expect_eq(v, ok[i].want, "'%s %s' = %d", ok[i].key, ok[i].text, v);
    }
    for (size_t i = 0; i < sizeof(bad_promote) / sizeof(bad_promote[0]); i++) {
        cr_expect_eq(conf_set(&c, "ssd_promote", bad_promote[i], "t", err, sizeof(err)), -1,
                     "accepted '%s'", bad_promote[i]);
    }

    /* Bad values name the source, the text and every accepted value. */
    expect_file_error("\n\nssd_eviction random\n", 3,
                      "'ssd_eviction random': bad value (use fifo or lru)");
    expect_file_error("ssd_offload never  # comment\n", 1,
                      "'ssd_offload never': bad value (use on_evict, write_through or off)");
    expect_file_error("ssd_promote maybe\n", 1,
                      "'ssd_promote maybe': bad value (use on/off, yes/no, true/false or 1/0)");
    expect_file_error("ssd_promote \"\"\n", 1,
                      "'ssd_promote \"\"': bad value (use on/off, yes/no, true/false or 1/0)");
    expect_file_error("log_level loud\n", 1,
                      "'log_level loud': bad log level (use error, warn, info or debug)");
    expect_file_error("rdma maybe\n", 1, "'rdma maybe': bad value (use off, auto or required)");
    expect_file_error("rdma_port 0\n", 1, "'rdma_port 0': out of range (min 1, max 255)");
    conf_init(&c);
    cr_expect_eq(conf_set(&c, "ssd_eviction", "clock", "--ssd_eviction", err, sizeof(err)), -1);
    cr_expect_str_eq(err, "--ssd_eviction=clock: bad value (use fifo or lru)");
    cr_expect_eq(conf_set(&c, "ssd_promote", "maybe", "--ssd_promote", err, sizeof(err)), -1);
    cr_expect_str_eq(err, "--ssd_promote=maybe: bad value (use on/off, yes/no, true/false or "
                          "1/0)");
    cr_expect_eq(c.ssd_eviction, CONF_SSD_FIFO, "a failed set leaves the value");
    cr_expect_eq(c.ssd_promote, 1, "a failed set leaves the value");

    /* conf_dump writes names, on/off for a boolean. */
    cr_assert_eq(conf_set(&c, "ssd_eviction", "LRU", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&c, "ssd_offload", "off", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&c, "ssd_promote", "no", "t", err, sizeof(err)), 0);
    cr_assert_lt(conf_dump(&c, dump, sizeof(dump)), (int)sizeof(dump));
    cr_expect_not_null(strstr(dump, "\nssd_eviction lru\n"), "%s", dump);
    cr_expect_not_null(strstr(dump, "\nssd_offload off\n"), "%s", dump);
    cr_expect_not_null(strstr(dump, "\nssd_promote off\n"), "%s", dump);
    conf_init(&c);
    cr_assert_lt(conf_dump(&c, dump, sizeof(dump)), (int)sizeof(dump));
    cr_expect_not_null(strstr(dump, "\nssd_eviction fifo\n"), "%s", dump);
    cr_expect_not_null(strstr(dump, "\nssd_offload on_evict\n"), "%s", dump);
    cr_expect_not_null(strstr(dump, "\nssd_promote on\n"), "%s", dump);
    cr_expect_not_null(strstr(dump, "\nlog_level info\n"), "%s", dump);
}

Test(config, ssd_bounds, .init = tmp_setup, .fini = tmp_teardown)
{
    struct kv_config c;
    char err[512];

    expect_file_error("ssd_size 512k\n", 1, "'ssd_size 512k': out of range (min 1m)");
    expect_file_error("ssd_bucket_size 1023k\n", 1,
                      "'ssd_bucket_size 1023k': out of range (min 1m, max 64g)");
    expect_file_error("ssd_bucket_size 65g\n", 1,
                      "'ssd_bucket_size 65g': out of range (min 1m, max 64g)");
    expect_file_error("ssd_io_threads 0\n", 1, "'ssd_io_threads 0': out of range (min 1, max 64)");
    expect_file_error("ssd_io_threads 65\n", 1,
                      "'ssd_io_threads 65': out of range (min 1, max 64)");
    expect_file_error("ssd_high_watermark 0\n", 1,
                      "'ssd_high_watermark 0': out of range (0 < x <= 1)");
    expect_file_error("ssd_low_watermark 1.01\n", 1,
                      "'ssd_low_watermark 1.01': out of range (0 < x <= 1)");

    conf_init(&c);
    cr_expect_eq(load_text(&c,
                           "ssd_size 1m\nssd_bucket_size 64g\nssd_io_threads 64\n"
                           "ssd_high_watermark 1\nssd_low_watermark 0.001\n",
                           err, sizeof(err)),
                 0, "%s", err);
    cr_expect_eq(c.ssd_size, 1ull << 20);
    cr_expect_eq(c.ssd_bucket_size, 64ull << 30);
    cr_expect_eq(c.ssd_io_threads, 64);
    cr_expect_eq(c.ssd_high_watermark, 1.0);
    cr_expect_eq(c.ssd_low_watermark, 0.001);
}

Test(config, two_key_errors_name_the_file_line_and_flag_that_set_them)
{
    struct kv_config c;
    char err[512];

    conf_init(&c);
    cr_assert_eq(load_text(&c, "# two keys\n\neviction_high_watermark 0.5\n", err, sizeof(err)),
                 0, "%s", err);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), -1);
    cr_expect_not_null(strstr(err, "eviction_low_watermark 0.985 (default) must not be above "
                                   "eviction_high_watermark 0.5 ("),
                       "%s", err);
    cr_expect_not_null(strstr(err, "test.conf:3)"), "the file and line are not named: %s", err);

    /* a flag given after the file is what set the key */
    cr_assert_eq(conf_set(&c, "eviction_low_watermark", "0.6", NULL, err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), -1);
    cr_expect_not_null(strstr(err, "eviction_low_watermark 0.6 (--eviction_low_watermark) must "
                                   "not be above"),
                       "%s", err);
}

Test(config, finalize_refuses_what_cannot_start)
{
    struct kv_config c;
    char err[512];

    conf_init(&c);
    cr_assert_eq(conf_set(&c, "memory_size", "16777215t", NULL, err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), -1, "a DRAM tier bigger than the host");
    cr_expect_not_null(strstr(err, "memory_size 16777215t (--memory_size) is more than this "
                                   "host's memory"),
                       "%s", err);

    conf_init(&c);
    cr_assert_eq(conf_set(&c, "listen", "", NULL, err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&c, "unix_socket", "none", "x.conf:2", err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), -1, "no listener at all");
    cr_expect_not_null(strstr(err, "nothing to listen on"), "%s", err);
    cr_expect_not_null(strstr(err, "unix_socket none (x.conf:2)"), "%s", err);
    cr_assert_eq(conf_set(&c, "unix_socket", "/tmp/kv.sock", NULL, err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), 0, "a Unix socket alone is enough: %s", err);
}

Test(config, ssd_low_watermark_above_high_is_rejected)
{
    struct kv_config c;
    char err[512];

    conf_init(&c);
    cr_assert_eq(conf_set(&c, "ssd_low_watermark", "0.99", "t", err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), -1);
    cr_expect_str_eq(err, "ssd_low_watermark 0.99 (t) must not be above ssd_high_watermark 0.98 "
                          "(default)");
    cr_expect_str_eq(c.ssd_dir, "<data_dir>/ssd", "a failed finalize derives nothing");
    cr_expect_str_eq(c.unix_socket, "");

    conf_init(&c);
    cr_assert_eq(conf_set(&c, "ssd_high_watermark", "0.5", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&c, "ssd_low_watermark", "0.5", "t", err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), 0, "low == high is fine: %s", err);

    /* The DRAM and SSD watermarks are separate pairs. */
    conf_init(&c);
    cr_assert_eq(conf_set(&c, "ssd_high_watermark", "0.5", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&c, "ssd_low_watermark", "0.4", "t", err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(conf_set(&c, "ssd_high_watermark", "0.3", NULL, err, sizeof(err)), 0);
    cr_expect_eq(conf_finalize(&c, err, sizeof(err)), -1);
    cr_expect_str_eq(err, "ssd_low_watermark 0.4 (t) must not be above ssd_high_watermark 0.3 "
                          "(--ssd_high_watermark)");
}

/* Change one SSD key between two finalized configs, as a SIGHUP reload would see it. */
Test(config, ssd_reload_classification)
{
    static const struct {
        const char *key, *value;
        bool reloadable;
    } cases[] = {
        {"ssd_dir", "/mnt/ssd", false},     {"ssd_dir", "", false},
        {"ssd_size", "1t", false},          {"ssd_io_threads", "8", false},
        {"ssd_bucket_size", "1g", true},    {"ssd_eviction", "lru", true},
        {"ssd_high_watermark", "0.99", true}, {"ssd_low_watermark", "0.1", true},
        {"ssd_offload", "write_through", true}, {"ssd_offload", "off", true},
        {"ssd_promote", "false", true},
    };
    struct kv_config running, fresh, next;
    struct diff_log d;
    char err[512];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        conf_init(&running);
        cr_assert_eq(conf_finalize(&running, err, sizeof(err)), 0, "%s", err);
        conf_init(&fresh);
        cr_assert_eq(conf_set(&fresh, cases[i].key, cases[i].value, "t", err, sizeof(err)), 0,
                     "%s", err);
        cr_assert_eq(conf_finalize(&fresh, err, sizeof(err)), 0, "%s", err);

        memset(&d, 0, sizeof(d));
        cr_assert_eq(conf_diff(&running, &fresh, diff_collect, &d), 1, "%s %s", cases[i].key,
                     cases[i].value);
        cr_expect_str_eq(d.keys[0], cases[i].key);
        cr_expect_eq(d.reloadable[0], cases[i].reloadable, "%s", cases[i].key);

        /* SIGHUP applies the reloadable ones and keeps the running value of the others. */
        next = running;
        conf_apply_reloadable(&next, &fresh);
        cr_expect_eq(conf_diff(&next, &fresh, NULL, NULL), cases[i].reloadable ? 0 : 1, "%s",
                     cases[i].key);
        cr_expect_eq(conf_diff(&next, &running, NULL, NULL), cases[i].reloadable ? 1 : 0, "%s",
                     cases[i].key);
    }

    /* A new data_dir moves the derived ssd_dir: both need a restart. */
    conf_init(&running);
    cr_assert_eq(conf_finalize(&running, err, sizeof(err)), 0, "%s", err);
    conf_init(&fresh);
    cr_assert_eq(conf_set(&fresh, "data_dir", "/srv/kv", "t", err, sizeof(err)), 0);
    cr_assert_eq(conf_finalize(&fresh, err, sizeof(err)), 0, "%s", err);
    memset(&d, 0, sizeof(d));
    conf_diff(&running, &fresh, diff_collect, &d);
    for (int i = 0; i < d.n; i++) {
        cr_expect_not(d.reloadable[i], "%s", d.keys[i]);
    }
    cr_expect(d.n == 3 && strcmp(d.keys[1], "data_dir") == 0 && strcmp(d.keys[2], "ssd_dir") == 0,
              "want unix_socket, data_dir, ssd_dir; got %d keys", d.n);
}

/* ---- log ---- */

static regex_t line_re;

static void
line_re_compile(const char *level, const char *text)
{
    char pat[512];

    snprintf(pat, sizeof(pat),
             "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
             "kvstashd\\[%ld\\] %s %s$",
             (long)getpid(), level, text);
    cr_assert_eq(regcomp(&line_re, pat, REG_EXTENDED | REG_NOSUB), 0);
}

static bool
line_matches(const char *line)
{
    return regexec(&line_re, line, 0, NULL, 0) == 0;
}

/* Split buf into lines in place; returns the count. */
static int
split_lines(char *buf, char **lines, int max)
{
    int n = 0;

    for (char *p = buf; *p != '\0' && n < max;) {
        char *nl = strchr(p, '\n');

        cr_assert_not_null(nl, "unterminated log line: %s", p);
        *nl = '\0';
        lines[n++] = p;
        p = nl + 1;
    }
    return n;
}

Test(log, writes_lines_with_level_to_file, .init = tmp_setup, .fini = tmp_teardown)
{
    char path[256], *lines[16], buf[4096];
    int n;

    snprintf(path, sizeof(path), "%s/kvstashd.log", tmpdir);
    cr_assert_eq(log_open(path, LOG_LEVEL_INFO), 0);
    log_info("hello %d", 42);
    log_debug("filtered out %d", 1);
    log_warn("peer %s closed\n", "10.0.0.1:5000");
    log_error("two\nlines");
    log_set_level(LOG_LEVEL_DEBUG);
    log_debug("now shown");
    log_close();
    /* After log_close lines go to stderr (silenced here), not to the file. */
    cr_assert_not_null(freopen("/dev/null", "w", stderr));
    log_info("to stderr, not the file");

    snprintf(buf, sizeof(buf), "%s", read_file(path));
    n = split_lines(buf, lines, 16);
    cr_assert_eq(n, 4, "%s", read_file(path));
    line_re_compile("INFO", "hello 42");
    cr_expect(line_matches(lines[0]), "%s", lines[0]);
    regfree(&line_re);
    line_re_compile("WARN", "peer 10\\.0\\.0\\.1:5000 closed");
    cr_expect(line_matches(lines[1]), "%s", lines[1]);
    regfree(&line_re);
    line_re_compile("ERROR", "two lines");
    cr_expect(line_matches(lines[2]), "%s", lines[2]);
    regfree(&line_re);
    line_re_compile("DEBUG", "now shown");
    cr_expect(line_matches(lines[3]), "%s", lines[3]);
    regfree(&line_re);
}

Test(log, long_lines_are_cut_with_ellipsis, .init = tmp_setup, .fini = tmp_teardown)
{
    static char big[10000];
    char path[256];
    const char *out;
    size_t len;

    memset(big, 'a', sizeof(big) - 1);
    snprintf(path, sizeof(path), "%s/kvstashd.log", tmpdir);
    cr_assert_eq(log_open(path, LOG_LEVEL_INFO), 0);
    log_info("%s", big);
    log_info("after");
    log_close();
    out = read_file(path);
    len = strcspn(out, "\n");
    cr_expect_leq(len, 2047);
    cr_expect_gt(len, 1900);
    cr_expect_eq(strncmp(out + len - 4, "a...", 4), 0, "%.20s", out + len - 20);
    cr_expect_not_null(strstr(out + len, " INFO after\n"));
}

Test(log, reopen_after_rename_writes_new_file, .init = tmp_setup, .fini = tmp_teardown)
{
    char path[256], rotated[256];

    snprintf(path, sizeof(path), "%s/kvstashd.log", tmpdir);
    snprintf(rotated, sizeof(rotated), "%s/kvstashd.log.1", tmpdir);
    cr_assert_eq(log_open(path, LOG_LEVEL_INFO), 0);
    log_info("before rotation");
    cr_assert_eq(rename(path, rotated), 0);
    log_info("after rename, before reopen");
    cr_assert_eq(log_reopen(), 0);
    log_info("after reopen");
    log_close();

    cr_expect_not_null(strstr(read_file(rotated), "INFO before rotation\n"));
    cr_expect_not_null(strstr(read_file(rotated), "INFO after rename, before reopen\n"));
    cr_expect_null(strstr(read_file(rotated), "after reopen\n"));
    cr_expect_not_null(strstr(read_file(path), "INFO after reopen\n"));
    cr_expect_null(strstr(read_file(path), "before"));
}

Test(log, open_failure_keeps_current_sink, .init = tmp_setup, .fini = tmp_teardown)
{
    char path[256], bad[256];

    snprintf(path, sizeof(path), "%s/kvstashd.log", tmpdir);
    snprintf(bad, sizeof(bad), "%s/no/such/dir/kvstashd.log", tmpdir);
    cr_expect_eq(log_open(bad, LOG_LEVEL_INFO), -ENOENT);
    cr_assert_eq(log_open(path, LOG_LEVEL_INFO), 0);
    cr_expect_eq(log_open(bad, LOG_LEVEL_INFO), -ENOENT);
    log_info("still here");
    log_close();
    cr_expect_not_null(strstr(read_file(path), "INFO still here\n"));
    cr_expect_eq(log_reopen(), 0, "reopen with stderr is a no-op");
}

#define LOG_THREADS 4
#define LOG_PER_THREAD 500

static void *
log_thread(void *arg)
{
    long id = (long)arg;

    for (int i = 0; i < LOG_PER_THREAD; i++) {
        log_info("thread %ld line %d %s", id, i, "padding padding padding padding padding");
    }
    return NULL;
}

Test(log, concurrent_writers_and_reopen_never_mix_lines, .init = tmp_setup,
     .fini = tmp_teardown)
{
    static char buf[1 << 20];
    static char *lines[LOG_THREADS * LOG_PER_THREAD + 16];
    pthread_t th[LOG_THREADS];
    char path[256];
    int n;

    snprintf(path, sizeof(path), "%s/kvstashd.log", tmpdir);
    cr_assert_eq(log_open(path, LOG_LEVEL_INFO), 0);
    for (long i = 0; i < LOG_THREADS; i++) {
        cr_assert_eq(pthread_create(&th[i], NULL, log_thread, (void *)i), 0);
    }
    for (int i = 0; i < 50; i++) {
        cr_expect_eq(log_reopen(), 0);
    }
    for (int i = 0; i < LOG_THREADS; i++) {
        pthread_join(th[i], NULL);
    }
    log_close();

    snprintf(buf, sizeof(buf), "%s", read_file(path));
    n = split_lines(buf, lines, LOG_THREADS * LOG_PER_THREAD + 16);
    cr_assert_eq(n, LOG_THREADS * LOG_PER_THREAD);
    line_re_compile("INFO", "thread [0-9] line [0-9]+ padding padding padding padding padding");
    for (int i = 0; i < n; i++) {
        cr_assert(line_matches(lines[i]), "line %d: %s", i, lines[i]);
    }
    regfree(&line_re);
}

Test(config, rdma_keys_and_defaults)
{
    struct kv_config c;
    char err[256];

    conf_init(&c);
    cr_expect_eq(c.rdma, CONF_RDMA_AUTO);
    cr_expect_str_eq(c.rdma_device, "");
    cr_expect_eq(c.rdma_port, 1);
    cr_expect_eq(c.rdma_gid_index, 0);
    cr_assert_eq(conf_set(&c, "rdma", "required", "t", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(c.rdma, CONF_RDMA_REQUIRED);
    cr_assert_eq(conf_set(&c, "rdma", "OFF", "t", err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(c.rdma, CONF_RDMA_OFF);
    cr_assert_eq(conf_set(&c, "rdma_device", "mlx5_0", "t", err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.rdma_device, "mlx5_0");
    cr_expect_eq(conf_set(&c, "rdma_gid_index", "256", "t", err, sizeof(err)), -1);
}

/* ---- tenants and authentication ---- */

#define HASH_A "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" /* "test" */
#define HASH_B "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752" /* "test2" */

Test(config, tenant_lines_accumulate_and_dump_back, .init = tmp_setup, .fini = tmp_teardown)
{
    struct kv_config c, back;
    static char dump[1 << 16];
    char path[256], err[512];
    const struct conf_tenant *t;

    conf_init(&c);
    write_file("t.conf",
               "require_auth yes\n"
               "tenant team-a token_sha256=" HASH_A " memory_quota=512m\n"
               "tenant team_b token_sha256=" HASH_B "   # a comment\n"
               "tenant admin token_sha256=" HASH_A " ssd_quota=1g\n",
               path, sizeof(path));
    cr_assert_eq(conf_load_file(&c, path, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(c.tenants.n, 3);
    t = conf_tenant_find(&c, "team-a", 6);
    cr_assert_not_null(t);
    cr_assert_eq(t->memory_quota, 512ull << 20);
    cr_assert_eq(t->token_sha256[0], 0x9f);
    cr_assert_eq(t->id, conf_tenant_id("team-a", 6));
    cr_assert_neq(t->id, 0);
    cr_assert_null(conf_tenant_find(&c, "team", 4));
    cr_assert_eq(conf_tenant_find(&c, "admin", 5)->ssd_quota, 1ull << 30);
    /* the same name again replaces; "" clears */
    cr_assert_eq(conf_set(&c, "tenant", "team-a token_sha256=" HASH_B, "t", err, sizeof(err)), 0);
    cr_assert_eq(c.tenants.n, 3);
    cr_assert_eq(conf_tenant_find(&c, "team-a", 6)->memory_quota, 0);
    cr_assert_gt(conf_dump(&c, dump, sizeof(dump)), 0);
    write_file("dump.conf", dump, path, sizeof(path));
    conf_init(&back);
    cr_assert_eq(conf_load_file(&back, path, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(conf_finalize(&back, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(conf_diff(&c, &back, NULL, NULL), 0, "a dump does not load back the same");
    cr_assert_eq(conf_set(&c, "tenant", "", "t", err, sizeof(err)), 0);
    cr_assert_eq(c.tenants.n, 0);
}

Test(config, tenant_lines_refused_with_a_reason)
{
    static const char *const bad[][2] = {
        {"team", "a token_sha256= and no value"},
        {"x token_sha256=12", "64 hex"},
        {"x token_sha256=" HASH_A " colour=red", "unknown tenant attribute 'colour'"},
        {"x memory_quota=1g", "needs token_sha256"},
        {"bad/name token_sha256=" HASH_A, "bad tenant name"},
        {"x token_sha256=" HASH_A " memory_quota=lots", "bad memory_quota"},
    };
    struct kv_config c;
    char err[512];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        conf_init(&c);
        err[0] = '\0';
        cr_expect_neq(conf_set(&c, "tenant", bad[i][0], NULL, err, sizeof(err)), 0, "%s",
                      bad[i][0]);
        if (i > 0) {
            cr_expect_not_null(strstr(err, bad[i][1]), "'%s': %s", bad[i][0], err);
        }
        cr_expect_eq(c.tenants.n, 0, "a refused line must add nothing");
    }
}

Test(config, remote_listen_needs_auth, .init = tmp_setup, .fini = tmp_teardown)
{
    struct kv_config c;
    char err[512], path[256];

    conf_init(&c);
    cr_assert_eq(conf_set(&c, "listen", "0.0.0.0:7431", NULL, err, sizeof(err)), 0);
    cr_assert_neq(conf_finalize(&c, err, sizeof(err)), 0);
    cr_expect_not_null(strstr(err, "not a loopback address"), "%s", err);
    cr_expect_not_null(strstr(err, "require_auth yes"), "%s", err);
    cr_assert_eq(conf_set(&c, "require_auth", "yes", NULL, err, sizeof(err)), 0);
    cr_assert_neq(conf_finalize(&c, err, sizeof(err)), 0);
    cr_expect_not_null(strstr(err, "at least one tenant"), "%s", err);
    /* tenants from a token file, which must be private */
    write_file("tokens", "tenant a token_sha256=" HASH_A "\n", path, sizeof(path));
    cr_assert_eq(chmod(path, 0644), 0);
    cr_assert_eq(conf_set(&c, "token_file", path, NULL, err, sizeof(err)), 0);
    cr_assert_neq(conf_finalize(&c, err, sizeof(err)), 0);
    cr_expect_not_null(strstr(err, "chmod 600"), "%s", err);
    cr_assert_eq(chmod(path, 0600), 0);
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(c.tenants.n, 1);
    cr_assert_not_null(conf_tenant_find(&c, "a", 1));
    /* only tenant lines in a token file */
    write_file("tokens2", "memory_size 2g\n", path, sizeof(path));
    cr_assert_eq(chmod(path, 0600), 0);
    cr_assert_eq(conf_set(&c, "token_file", path, NULL, err, sizeof(err)), 0);
    cr_assert_neq(conf_finalize(&c, err, sizeof(err)), 0);
    cr_expect_not_null(strstr(err, "only tenant lines"), "%s", err);
    /* or the explicit waiver */
    conf_init(&c);
    cr_assert_eq(conf_set(&c, "listen", "0.0.0.0:7431", NULL, err, sizeof(err)), 0);
    cr_assert_eq(conf_set(&c, "allow_unauthenticated_remote", "yes", NULL, err, sizeof(err)), 0);
    cr_assert_eq(conf_finalize(&c, err, sizeof(err)), 0, "%s", err);
}

/* ---- the pool's keys (config_cluster.c) ---- */

/* Set each key=value of kv (NULL-terminated pairs) on defaults, then finalize. */
static int
cluster_conf(struct kv_config *c, const char *const *kv, char *err, size_t errlen)
{
    conf_init(c);
    for (; kv[0] != NULL; kv += 2) {
        if (conf_set(c, kv[0], kv[1], "test", err, errlen) != 0) {
            return -2;
        }
    }
    return conf_finalize(c, err, errlen);
}

Test(config, cluster_defaults_derive_prefix_and_advertise)
{
    const char *kv[] = {"cluster_name", "pool-1", "etcd_endpoints", "http://127.0.0.1:2379",
                        "listen", "127.0.0.5:7500", "data_dir", "/tmp", NULL};
    struct kv_config c;
    char err[512];

    cr_assert_eq(cluster_conf(&c, kv, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.etcd_prefix, "/kvstash/pool-1");
    cr_expect_str_eq(c.peer_advertise, "127.0.0.5:7500");
    cr_expect_eq(c.replicas, 2);
    cr_expect_eq(c.etcd_lease_ttl, 10000);
    cr_expect_eq(c.write_ack, CONF_WRITE_ACK_ALL);
    cr_expect_eq(c.rebalance_delay, 30000);
    /* finalizing again changes nothing */
    struct kv_config again = c;
    cr_assert_eq(conf_finalize(&again, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(conf_diff(&c, &again, diff_collect, &(struct diff_log){0}), 0);
}

Test(config, cluster_single_node_needs_nothing)
{
    const char *kv[] = {"data_dir", "/tmp", NULL};
    struct kv_config c;
    char err[512];

    cr_assert_eq(cluster_conf(&c, kv, err, sizeof(err)), 0, "%s", err);
    cr_expect_str_eq(c.cluster_name, "");
    cr_expect_str_eq(c.peer_advertise, "", "no pool: nothing derived");
}

Test(config, cluster_rules_refuse_with_reasons)
{
    static const struct {
        const char *kv[9];
        int rc;
        const char *why;
    } bad[] = {
        {{"cluster_name", "p", NULL}, -1, "needs etcd_endpoints"},
        {{"cluster_name", "p", "etcd_endpoints", "http://127.0.0.1:2379", "etcd_lease_ttl",
          "2500ms", NULL}, -1, "whole seconds"},
        {{"cluster_name", "p", "etcd_endpoints", "http://127.0.0.1:2379", "listen",
          "127.0.0.1:0", NULL}, -1, "set peer_advertise"},
        {{"cluster_name", "p", "etcd_endpoints", "http://127.0.0.1:2379", "listen", "", NULL},
         -1, "set peer_advertise"},
        {{"cluster_name", "p", "etcd_endpoints", "https://127.0.0.1:2379", "etcd_tls_cert_file",
          "/c.pem", NULL}, -1, "etcd_tls_cert_file and etcd_tls_key_file go together"},
        {{"cluster_name", "p", "etcd_endpoints", "http://127.0.0.1:2379", "etcd_user", "kv",
          NULL}, -1, "etcd_user and etcd_password_file go together"},
        {{"cluster_name", "p", "etcd_endpoints", "http://127.0.0.1:2379", "etcd_password_file",
          "/etc/kvstash/etcd_password", NULL}, -1, "etcd_user and etcd_password_file go together"},
        {{"cluster_name", "p", "etcd_endpoints", "http://127.0.0.1:2379", "etcd_tls_ca_file",
          "/ca.pem", NULL}, -1, "no https:// endpoint"},
        {{"cluster_name", "p q", NULL}, -2, "bad cluster_name"},
        {{"etcd_endpoints", "127.0.0.1:2379", NULL}, -2, "http://host:port"},
        {{"etcd_endpoints", "http://127.0.0.1:2379/v3", NULL}, -2, "no path"},
        {{"etcd_endpoints", "http://127.0.0.1:2379,", NULL}, -2, "http://host:port"},
        {{"etcd_endpoints", "http://a:1,http://a:2,http://a:3,http://a:4,http://a:5,"
                            "http://a:6,http://a:7,http://a:8,http://a:9", NULL}, -2, "at most 8"},
        {{"etcd_prefix", "kvstash", NULL}, -2, "bad etcd_prefix"},
        {{"etcd_prefix", "/kvstash/", NULL}, -2, "bad etcd_prefix"},
        {{"peer_advertise", "0.0.0.0:7431", NULL}, -2, "wildcard"},
        {{"peer_advertise", "10.1.1.1:0", NULL}, -2, "port 0"},
        {{"replicas", "0", NULL}, -2, "out of range"},
        {{"replicas", "17", NULL}, -2, "out of range"},
        {{"node_weight", "0", NULL}, -2, "out of range"},
        {{"write_ack", "some", NULL}, -2, "all or local"},
        {{"peer_timeout", "10ms", NULL}, -2, "out of range"},
    };
    struct kv_config c;
    char err[512];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        cr_expect_eq(cluster_conf(&c, bad[i].kv, err, sizeof(err)), bad[i].rc,
                     "case %zu (%s %s): %s", i, bad[i].kv[0], bad[i].kv[1], err);
        cr_expect(strstr(err, bad[i].why) != NULL, "case %zu: '%s' should say '%s'", i, err,
                  bad[i].why);
    }
}

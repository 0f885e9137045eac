/*
 * config: the option table and everything that reads it. conf_options[] below is the one
 * place where a setting's name, type, bounds, default and reload rule live; conf_init,
 * the file parser, --key=value flags, conf_diff, conf_apply_reloadable and conf_dump all
 * walk that table, so adding an option is one line here plus its struct field. The text
 * form of single values (sizes, durations, numbers, hex digests, listen addresses, read and
 * written) is config_value.c's, through config_int.h; this file decides which key takes
 * which form and within which bounds. This module parses and validates text into a struct
 * kv_config and nothing else: it never opens sockets, creates directories or logs (the
 * caller decides what to do with an error message), and it keeps no state, so every
 * function is safe on distinct configs from any thread.
 */
#include "config.h"
#include "config_int.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "kverr.h"
#include "log.h"

#define CONF_LINE_MAX 4096     /* longest line a config file may have, newline excluded */
#define CONF_QUOTE_MAX 96      /* how much of an offending line an error message quotes */
#define CONF_FRAME_OVERHEAD 64 /* request bytes around one key and value: header, msgpack */
#define CONF_AUTO_THREADS_MAX 8
#define CONF_NODE_ID_MAX 64
#define PLACE_REPLICAS_MAX 16  /* replicas: place.h's PLACE_R_MAX (config is below src/cluster) */

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)
#define TIB (UINT64_C(1) << 40)
#define NO_MAX UINT64_MAX

/* The size of sockaddr_un.sun_path, the bound on a unix socket path (NUL included). */
#define CONF_SUN_PATH_MAX sizeof(((struct sockaddr_un *)NULL)->sun_path)

enum conf_type {
    CONF_T_STRING,   /* char[CONF_STR_MAX], bare or "double quoted" in a file */
    CONF_T_SIZE,     /* uint64_t bytes: 4096, 64k, 1m, 4GiB */
    CONF_T_DURATION, /* uint64_t milliseconds: 250, 500ms, 10s, 5m, 1h */
    CONF_T_UINT,     /* uint64_t count, plain digits */
    CONF_T_DOUBLE,   /* double in (dmin, dmax] */
    CONF_T_ENUM,     /* int, the index of its name in names[] (case-insensitive) */
    CONF_T_BOOL,     /* int 0/1: on/off, yes/no, true/false, 1/0 (case-insensitive) */
    CONF_T_TENANTS,  /* struct conf_tenants; each line adds (or replaces) one, "" clears */
};

/* An extra check for a string option: NULL if value is acceptable, else the reason. */
typedef const char *conf_check_fn(const char *value);

struct conf_option {
    const char *name;         /* the key, also the struct field's name */
    enum conf_type type;
    size_t offset;            /* offsetof(struct kv_config, name) */
    uint64_t min;             /* integer types: inclusive bounds */
    uint64_t max;             /* NO_MAX: bounded only by 64 bits; CONF_T_ENUM: names - 1 */
    double dmin;              /* CONF_T_DOUBLE: dmin < x <= dmax */
    double dmax;
    const char *def;          /* the default, as it would be written in a config file */
    bool reloadable;          /* SIGHUP applies it; otherwise it needs a restart */
    conf_check_fn *check;     /* CONF_T_STRING only; NULL = any string that fits */
    const char *const *names; /* CONF_T_ENUM: each value's name, indexed by value */
    const char *what;         /* CONF_T_ENUM: the noun in "bad <what> (use a, b or c)" */
};

static conf_check_fn conf_check_unix_socket;
static conf_check_fn conf_check_data_dir;
static conf_check_fn conf_check_memory_file;
static conf_check_fn conf_check_node_id;
static conf_check_fn conf_check_ssd_dir;
static conf_check_fn conf_check_congestion;

/*
 * ssd_dir's default. conf_finalize replaces it with <data_dir>/ssd; until then it stands for
 * "never set", and it is how a config file (and conf_dump of an unfinalized config) writes
 * the default, so "" stays free to mean "no SSD tier".
 */
#define CONF_SSD_DIR_DEFAULT "<data_dir>/ssd"
#define CONF_DATA_DIR_TAG "<data_dir>"

/* The names of each CONF_T_ENUM option, indexed by the value stored in its field. */
static const char *const conf_log_level_names[] = {
    [LOG_LEVEL_ERROR] = "error",
    [LOG_LEVEL_WARN] = "warn",
    [LOG_LEVEL_INFO] = "info",
    [LOG_LEVEL_DEBUG] = "debug",
};
static const char *const conf_log_format_names[] = {
    [LOG_FORMAT_TEXT] = "text",
    [LOG_FORMAT_JSON] = "json",
};
static const char *const conf_eviction_policy_names[] = {
    [CONF_EVICT_LRU] = "lru",
    [CONF_EVICT_FIFO] = "fifo",
    [CONF_EVICT_SLRU] = "slru",
};
static const char *const conf_ssd_eviction_names[] = {
    [CONF_SSD_FIFO] = "fifo",
    [CONF_SSD_LRU] = "lru",
};
static const char *const conf_ssd_offload_names[] = {
    [CONF_SSD_ON_EVICT] = "on_evict",
    [CONF_SSD_WRITE_THROUGH] = "write_through",
    [CONF_SSD_OFF] = "off",
};
static const char *const conf_write_ack_names[] = {
    [CONF_WRITE_ACK_ALL] = "all",
    [CONF_WRITE_ACK_LOCAL] = "local",
};
static const char *const conf_hugepages_names[] = {
    [CONF_HUGEPAGES_AUTO] = "auto",
    [CONF_HUGEPAGES_ON] = "on",
    [CONF_HUGEPAGES_OFF] = "off",
};
static const char *const conf_rdma_names[] = {
    [CONF_RDMA_OFF] = "off",
    [CONF_RDMA_AUTO] = "auto",
    [CONF_RDMA_REQUIRED] = "required",
};

/* CONF_T_BOOL: what reads as true and as false, pairwise; conf_dump writes the first pair. */
static const char *const conf_bool_true[] = {"on", "yes", "true", "1"};
static const char *const conf_bool_false[] = {"off", "no", "false", "0"};

#define RELOAD true
#define RESTART false

#define CONF_NELEM(a) (sizeof(a) / sizeof((a)[0]))

#define OPT_INT(n, t, lo, hi, dflt, rl)                                                            \
    {                                                                                              \
        .name = #n, .type = t, .offset = offsetof(struct kv_config, n), .min = lo, .max = hi,      \
        .def = dflt, .reloadable = rl                                                              \
    }
#define OPT_STRING(n, dflt, rl, chk)                                                               \
    {                                                                                              \
        .name = #n, .type = CONF_T_STRING, .offset = offsetof(struct kv_config, n), .def = dflt,   \
        .reloadable = rl, .check = chk                                                             \
    }
#define OPT_SIZE(n, lo, hi, def, rl) OPT_INT(n, CONF_T_SIZE, lo, hi, def, rl)
#define OPT_DURATION(n, lo, hi, def, rl) OPT_INT(n, CONF_T_DURATION, lo, hi, def, rl)
#define OPT_UINT(n, lo, hi, def, rl) OPT_INT(n, CONF_T_UINT, lo, hi, def, rl)
#define OPT_DOUBLE(n, lo, hi, dflt, rl)                                                            \
    {                                                                                              \
        .name = #n, .type = CONF_T_DOUBLE, .offset = offsetof(struct kv_config, n), .dmin = lo,    \
        .dmax = hi, .def = dflt, .reloadable = rl                                                  \
    }
#define OPT_ENUM(n, nm, wh, dflt, rl)                                                              \
    {                                                                                              \
        .name = #n, .type = CONF_T_ENUM, .offset = offsetof(struct kv_config, n), .min = 0,        \
        .max = CONF_NELEM(nm) - 1, .def = dflt, .reloadable = rl, .names = nm, .what = wh          \
    }
#define OPT_BOOL(n, dflt, rl)                                                                      \
    {                                                                                              \
        .name = #n, .type = CONF_T_BOOL, .offset = offsetof(struct kv_config, n), .min = 0,        \
        .max = 1, .def = dflt, .reloadable = rl                                                    \
    }

/*
 * Table order is struct order and conf_dump order. conf/kvstashd.conf documents each row
 * (tests/unit/test_config.c checks that it does). Integer bounds are inclusive; a double
 * must satisfy min < x <= max.
 */
/* clang-format off */
static const struct conf_option conf_options[] = {
    /*         name                     default           reload   extra check */
    OPT_STRING(listen,                  "127.0.0.1:7431", RESTART, conf_check_listen),
    OPT_STRING(unix_socket,             "",               RESTART, conf_check_unix_socket),
    OPT_STRING(data_dir,                "./var",          RESTART, conf_check_data_dir),
    OPT_STRING(node_id,                 "",               RESTART, conf_check_node_id),
    /*         name                     min       max        default  reload */
    OPT_SIZE(memory_size,               MIB,      NO_MAX,    "1g",    RESTART),
    /*       name                       value names              noun         default   reload */
    OPT_ENUM(memory_hugepages,          conf_hugepages_names,    "value",     "auto",   RESTART),
    /*         name                     default           reload   extra check */
    OPT_STRING(memory_file,             "",               RESTART, conf_check_memory_file),
    /*         name                     min       max        default  reload */
    OPT_SIZE(max_key_size,              1,        64 * KIB,  "1k",    RELOAD),
    OPT_SIZE(max_value_size,            1,        4 * GIB,   "256m",  RELOAD),
    OPT_UINT(max_batch,                 1,        1048576,   "16384", RELOAD),
    OPT_SIZE(max_message_size,          64 * KIB, 4 * GIB,   "1g",    RELOAD),
    OPT_UINT(max_connections,           1,        1000000,   "1024",  RELOAD),
    OPT_UINT(io_threads,                0,        64,        "0",     RESTART),
    OPT_SIZE(tcp_receive_window,        0,        GIB,       "16m",   RELOAD),
    /*         name                     default           reload   extra check */
    OPT_STRING(local_tcp_congestion,    "reno",           RELOAD,  conf_check_congestion),
    /*         name                     min       max        default  reload */
    OPT_DURATION(lease_ttl_ms,          1,        HOUR_MS,   "10s",   RELOAD),
    OPT_DURATION(put_timeout_ms,        1,        HOUR_MS,   "30s",   RELOAD),
    OPT_SIZE(client_output_limit,       64 * KIB, NO_MAX,    "64m",   RELOAD),
    OPT_SIZE(client_output_max,         MIB,      NO_MAX,    "4g",    RELOAD),
    OPT_DURATION(client_output_timeout, 100,      HOUR_MS,   "60s",   RELOAD),
    OPT_DURATION(client_input_timeout,  100,      HOUR_MS,   "60s",   RELOAD),
    OPT_UINT(client_inflight_max,       0,        NO_MAX,    "16384", RELOAD),
    OPT_DURATION(idle_timeout,          0,        NO_MAX,    "0",     RELOAD),
    OPT_SIZE(conn_buffer_memory,        MIB,      NO_MAX,    "1g",    RELOAD),
    OPT_DURATION(shutdown_timeout_ms,   0,        HOUR_MS,   "10s",   RELOAD),
    OPT_DOUBLE(eviction_high_watermark, 0.0,      1.0,       "0.995", RELOAD),
    OPT_DOUBLE(eviction_low_watermark,  0.0,      1.0,       "0.985", RELOAD),
    /*       name                       value names                noun     default  reload */
    OPT_ENUM(eviction_policy,           conf_eviction_policy_names, "value", "lru",   RELOAD),
    /*         name                     default               reload   extra check */
    OPT_STRING(ssd_dir,                 CONF_SSD_DIR_DEFAULT, RESTART, conf_check_ssd_dir),
    /*         name                     min       max        default  reload */
    OPT_SIZE(ssd_size,                  MIB,      NO_MAX,    "64g",   RESTART),
    OPT_SIZE(ssd_bucket_size,           MIB,      64 * GIB,  "256m",  RELOAD),
    OPT_UINT(ssd_io_threads,            1,        64,        "2",     RESTART),
    OPT_DOUBLE(ssd_high_watermark,      0.0,      1.0,       "0.98",  RELOAD),
    OPT_DOUBLE(ssd_low_watermark,       0.0,      1.0,       "0.95",  RELOAD),
    OPT_SIZE(ssd_write_rate_limit,      0,        NO_MAX,    "0",     RELOAD),
    OPT_SIZE(ssd_scrub_rate,            0,        NO_MAX,    "64m",   RELOAD),
    /*       name                       value names              noun         default     reload */
    OPT_ENUM(ssd_eviction,              conf_ssd_eviction_names, "value",     "fifo",     RELOAD),
    OPT_ENUM(ssd_offload,               conf_ssd_offload_names,  "value",     "on_evict", RELOAD),
    /*       name                       default  reload */
    OPT_BOOL(ssd_promote,               "on",    RELOAD),
    /*       name                       value names              noun         default     reload */
    OPT_ENUM(rdma,                      conf_rdma_names,         "value",     "auto",     RESTART),
    /*         name                     default           reload   extra check */
    OPT_STRING(rdma_device,             "",               RESTART, NULL),
    /*         name                     min       max        default  reload */
    OPT_UINT(rdma_port,                 1,        255,       "1",     RESTART),
    OPT_UINT(rdma_gid_index,            0,        255,       "0",     RESTART),
    /*       name                       value names              noun         default     reload */
    OPT_ENUM(log_level,                 conf_log_level_names,    "log level", "info",     RELOAD),
    /*         name                     default           reload   extra check */
    OPT_STRING(log_file,                "",               RELOAD,  NULL),
    /*       name                       value names              noun         default     reload */
    OPT_ENUM(log_format,                conf_log_format_names,   "log format", "text",    RELOAD),
    /*         name                     default           reload   extra check */
    OPT_STRING(metrics_listen,          "127.0.0.1:7432", RESTART, conf_check_listen),
    /*       name                       default  reload */
    OPT_BOOL(require_auth,              "no",    RELOAD),
    OPT_BOOL(allow_unauthenticated_remote, "no", RELOAD),
    /*         name                     default           reload   extra check */
    OPT_STRING(token_file,              "",               RELOAD,  NULL),
    OPT_STRING(tls_listen,              "",               RESTART, conf_check_listen),
    OPT_STRING(tls_cert_file,           "",               RELOAD,  NULL),
    OPT_STRING(tls_key_file,            "",               RELOAD,  NULL),
    OPT_STRING(tls_ca_file,             "",               RELOAD,  NULL),
    OPT_STRING(resp_listen,             "",               RESTART, conf_check_listen),
    OPT_STRING(resp_unix_socket,        "",               RESTART, conf_check_unix_socket),
    OPT_STRING(resp_tls_listen,         "",               RESTART, conf_check_listen),
    /* the pool (docs/cluster.md); config_cluster.c has the checks */
    OPT_STRING(cluster_name,            "",               RESTART, conf_check_cluster_name),
    OPT_STRING(etcd_endpoints,          "",               RESTART, conf_check_etcd_endpoints),
    OPT_STRING(etcd_prefix,  CONF_ETCD_PREFIX_DEFAULT,    RESTART, conf_check_etcd_prefix),
    OPT_STRING(etcd_tls_ca_file,        "",               RESTART, NULL),
    OPT_STRING(etcd_tls_cert_file,      "",               RESTART, NULL),
    OPT_STRING(etcd_tls_key_file,       "",               RESTART, NULL),
    OPT_STRING(etcd_user,               "",               RESTART, NULL),
    OPT_STRING(etcd_password_file,      "",               RESTART, NULL),
    /*         name                     min       max        default  reload */
    OPT_DURATION(etcd_lease_ttl,        2000,     HOUR_MS,   "10s",   RESTART),
    /*         name                     default           reload   extra check */
    OPT_STRING(peer_advertise,          "",               RESTART, conf_check_peer_advertise),
    /*         name                     min       max        default  reload */
    OPT_UINT(replicas,                  1,        PLACE_REPLICAS_MAX, "2", RESTART),
    OPT_DOUBLE(node_weight,             0.0,      1e6,       "1",     RESTART),
    /*       name                       value names              noun         default     reload */
    OPT_ENUM(write_ack,                 conf_write_ack_names,    "value",     "all",      RELOAD),
    /*         name                     min       max        default  reload */
    OPT_DURATION(rebalance_delay,       0,        24 * HOUR_MS, "30s", RELOAD),
    OPT_DURATION(peer_timeout,          100,      HOUR_MS,   "5s",    RELOAD),
    {.name = "tenant", .type = CONF_T_TENANTS, .offset = offsetof(struct kv_config, tenants),
     .def = "", .reloadable = RELOAD},
};
/* clang-format on */

#define CONF_NOPTIONS CONF_NELEM(conf_options)
_Static_assert(CONF_NOPTIONS <= CONF_OPTIONS_MAX, "raise CONF_OPTIONS_MAX");

/* ---- small helpers ---- */

static bool
conf_is_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n' || ch == '\v' || ch == '\f';
}

static const struct conf_option *
conf_find(const char *key)
{
    for (size_t i = 0; i < CONF_NOPTIONS; i++) {
        if (strcmp(conf_options[i].name, key) == 0) {
            return &conf_options[i];
        }
    }
    return NULL;
}

static void *
conf_field(struct kv_config *c, const struct conf_option *o)
{
    return (char *)c + o->offset;
}

static const void *
conf_cfield(const struct kv_config *c, const struct conf_option *o)
{
    return (const char *)c + o->offset;
}

static size_t
conf_field_size(const struct conf_option *o)
{
    switch (o->type) {
    case CONF_T_STRING:
        return CONF_STR_MAX;
    case CONF_T_DOUBLE:
        return sizeof(double);
    case CONF_T_ENUM:
    case CONF_T_BOOL:
        return sizeof(int);
    case CONF_T_TENANTS:
        return sizeof(struct conf_tenants);
    case CONF_T_SIZE:
    case CONF_T_DURATION:
    case CONF_T_UINT:
        break;
    }
    return sizeof(uint64_t);
}

static void
conf_format_uint(const struct conf_option *o, uint64_t v, char *buf, size_t len)
{
    if (o->type == CONF_T_SIZE) {
        conf_format_size(v, buf, len);
    } else if (o->type == CONF_T_DURATION) {
        conf_format_duration(v, buf, len);
    } else {
        snprintf(buf, len, "%llu", (unsigned long long)v);
    }
}

/* ---- string checks ---- */

static const char *
conf_check_unix_socket(const char *v)
{
    if (strlen(v) >= CONF_SUN_PATH_MAX) {
        return "path too long for a unix socket (max 107 bytes)";
    }
    return NULL;
}

static const char *
conf_check_data_dir(const char *v)
{
    if (*v == '\0') {
        return "must not be empty";
    }
    /* ssd_dir's default is written <data_dir>/ssd: a data_dir holding the tag would not
     * read back the same (found by the config fuzzer) */
    return strstr(v, CONF_DATA_DIR_TAG) != NULL ? "must not contain " CONF_DATA_DIR_TAG : NULL;
}

static const char *
conf_check_memory_file(const char *v)
{
    /* "" is the memfd; a file is named from the root, whatever the daemon's directory */
    return *v != '\0' && *v != '/' ? "must be an absolute path (e.g. /dev/shm/kvstash.arena)"
                                    : NULL;
}

static const char *
conf_check_node_id(const char *v)
{
    size_t n = strlen(v);

    if (n > CONF_NODE_ID_MAX ||
        strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-") != n) {
        return "bad node_id (use up to 64 letters, digits, '.', '_', ':' or '-')";
    }
    return NULL;
}

static const char *
conf_check_ssd_dir(const char *v)
{
    /* "" (no SSD tier) and the default pass; the tag means nothing anywhere else. */
    if (strcmp(v, CONF_SSD_DIR_DEFAULT) != 0 &&
        strncmp(v, CONF_DATA_DIR_TAG, strlen(CONF_DATA_DIR_TAG)) == 0) {
        return "<data_dir> is only understood in the default, <data_dir>/ssd (write the whole "
               "path, or \"\" for no SSD tier)";
    }
    return NULL;
}

static const char *
conf_check_congestion(const char *v)
{
    size_t n = strlen(v);

    /* The kernel's names (TCP_CA_NAME_MAX is 16 with the NUL); whether it has this one
     * is only known when a connection asks for it. */
    if (n > 15 || strspn(v, "abcdefghijklmnopqrstuvwxyz0123456789_-") != n) {
        return "bad congestion control name (up to 15 lowercase letters, digits, '_' or '-', "
               "as net.ipv4.tcp_available_congestion_control lists them)";
    }
    return NULL;
}

/* ---- setting one option ---- */

/* "a, b or c" from n names, into buf. */
static void
conf_format_names(const char *const *names, size_t n, char *buf, size_t len)
{
    size_t used = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < n && used < len; i++) {
        const char *sep = i == 0 ? "" : i + 1 == n ? " or " : ", ";
        int k = snprintf(buf + used, len - used, "%s%s", sep, names[i]);

        if (k < 0) {
            break;
        }
        used += (size_t)k;
    }
}

/* Case-insensitive: the index of s in names[0..n) (NULL entries never match), or -1. */
static int
conf_name_index(const char *s, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (names[i] != NULL && strcasecmp(s, names[i]) == 0) {
            return (int)i;
        }
    }
    return -1;
}

uint32_t
conf_tenant_id(const char *name, size_t len)
{
    uint32_t h = 2166136261u;           /* FNV-1a */

    for (size_t i = 0; i < len; i++) {
        h = (h ^ (uint8_t)name[i]) * 16777619u;
    }
    return h != 0 ? h : 1;
}

const struct conf_tenant *
conf_tenant_find(const struct kv_config *c, const char *name, size_t len)
{
    for (uint32_t i = 0; i < c->tenants.n; i++) {
        const struct conf_tenant *t = &c->tenants.t[i];

        if (strlen(t->name) == len && memcmp(t->name, name, len) == 0) {
            return t;
        }
    }
    return NULL;
}

/*
 * conf_tenant_store: a tenant line's value, "NAME token_sha256=HEX
 * [memory_quota=SIZE] [ssd_quota=SIZE]", added to ts (replacing a tenant of
 * the same name), or "" to clear them all. 0, or -1 with why.
 */
static int
conf_tenant_store(void *field, const char *text, char *why, size_t whylen)
{
    struct conf_tenants *ts = field;
    struct conf_tenant t;
    const char *p = text;
    size_t n;
    bool have_token = false;

    if (*text == '\0') {
        memset(ts, 0, sizeof(*ts));
        return 0;
    }
    memset(&t, 0, sizeof(t));
    n = strcspn(p, " \t");
    if (n == 0 || n >= CONF_TENANT_NAME_MAX) {
        snprintf(why, whylen, "a tenant needs a name of 1 to %d bytes", CONF_TENANT_NAME_MAX - 1);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!isalnum((unsigned char)p[i]) && p[i] != '_' && p[i] != '-' && p[i] != '.') {
            snprintf(why, whylen, "bad tenant name (use letters, digits, _ - .)");
            return -1;
        }
    }
    memcpy(t.name, p, n);
    t.id = conf_tenant_id(p, n);
    for (p += n; *p != '\0';) {
        const char *eq;
        size_t vn;
        char val[80];

        p += strspn(p, " \t");
        n = strcspn(p, " \t");
        if (n == 0) {
            break;
        }
        eq = memchr(p, '=', n);
        vn = eq != NULL ? (size_t)(p + n - eq - 1) : 0;
        if (eq == NULL || vn == 0 || vn >= sizeof(val)) {
            snprintf(why, whylen, "tenant attributes are name=value (token_sha256=, "
                     "memory_quota=, ssd_quota=)");
            return -1;
        }
        memcpy(val, eq + 1, vn);
        val[vn] = '\0';
        if ((size_t)(eq - p) == 12 && memcmp(p, "token_sha256", 12) == 0) {
            if (conf_hex(val, vn, t.token_sha256, sizeof(t.token_sha256)) != 0) {
                snprintf(why, whylen, "token_sha256 must be 64 hex digits (sha256sum of the token)");
                return -1;
            }
            have_token = true;
        } else if ((size_t)(eq - p) == 12 && memcmp(p, "memory_quota", 12) == 0) {
            if (conf_size_parse(val, &t.memory_quota) != 0) {
                snprintf(why, whylen, "bad memory_quota (use e.g. 512m, 4g)");
                return -1;
            }
        } else if ((size_t)(eq - p) == 9 && memcmp(p, "ssd_quota", 9) == 0) {
            if (conf_size_parse(val, &t.ssd_quota) != 0) {
                snprintf(why, whylen, "bad ssd_quota (use e.g. 100g)");
                return -1;
            }
        } else {
            snprintf(why, whylen, "unknown tenant attribute '%.*s'", (int)(eq - p), p);
            return -1;
        }
        p += n;
    }
    if (!have_token) {
        snprintf(why, whylen, "a tenant needs token_sha256=<64 hex digits>");
        return -1;
    }
    for (uint32_t i = 0; i < ts->n; i++) {
        if (strcmp(ts->t[i].name, t.name) == 0) {
            ts->t[i] = t;
            return 0;
        }
    }
    if (ts->n == CONF_MAX_TENANTS) {
        snprintf(why, whylen, "too many tenants (max %d)", CONF_MAX_TENANTS);
        return -1;
    }
    ts->t[ts->n++] = t;
    return 0;
}

/*
 * Parse text (already unquoted) as option o and store it in c. On failure c is unchanged
 * and why holds the reason, without the key or source.
 */
static int
conf_store(struct kv_config *c, const struct conf_option *o, const char *text, char *why,
           size_t whylen)
{
    char lo[32], hi[32];
    const char *reason;
    uint64_t u = 0;
    double d;
    int rc = 0;

    switch (o->type) {
    case CONF_T_STRING: {
        size_t n = strlen(text);

        if (n >= CONF_STR_MAX) {
            snprintf(why, whylen, "too long (max %d bytes)", CONF_STR_MAX - 1);
            return -1;
        }
        if (o->check != NULL && (reason = o->check(text)) != NULL) {
            snprintf(why, whylen, "%s", reason);
            return -1;
        }
        memcpy(conf_field(c, o), text, n + 1);
        return 0;
    }
    case CONF_T_DOUBLE:
        if (conf_double_parse(text, &d) != 0) {
            snprintf(why, whylen, "bad number (use e.g. 0.85)");
            return -1;
        }
        if (!(d > o->dmin && d <= o->dmax)) {
            conf_format_double(o->dmin, lo, sizeof(lo));
            conf_format_double(o->dmax, hi, sizeof(hi));
            snprintf(why, whylen, "out of range (%s < x <= %s)", lo, hi);
            return -1;
        }
        memcpy(conf_field(c, o), &d, sizeof(d));
        return 0;
    case CONF_T_ENUM: {
        char list[256];
        int v = conf_name_index(text, o->names, (size_t)o->max + 1);

        if (v >= 0) {
            memcpy(conf_field(c, o), &v, sizeof(v));
            return 0;
        }
        conf_format_names(o->names, (size_t)o->max + 1, list, sizeof(list));
        snprintf(why, whylen, "bad %s (use %s)", o->what, list);
        return -1;
    }
    case CONF_T_BOOL: {
        int v = conf_name_index(text, conf_bool_true, CONF_NELEM(conf_bool_true)) >= 0;

        if (!v && conf_name_index(text, conf_bool_false, CONF_NELEM(conf_bool_false)) < 0) {
            snprintf(why, whylen, "bad value (use on/off, yes/no, true/false or 1/0)");
            return -1;
        }
        memcpy(conf_field(c, o), &v, sizeof(v));
        return 0;
    }
    case CONF_T_SIZE:
        rc = conf_size_parse(text, &u);
        reason = "bad size (use e.g. 64k, 1m, 4g, 4GiB)";
        break;
    case CONF_T_DURATION:
        rc = conf_duration_parse(text, &u);
        reason = "bad duration (use e.g. 250ms, 10s, 5m, 1h; a bare number is ms)";
        break;
    case CONF_T_UINT:
        rc = conf_uint_parse(text, &u);
        reason = "bad number (use a whole number, e.g. 1024)";
        break;
    case CONF_T_TENANTS:
        return conf_tenant_store(conf_field(c, o), text, why, whylen);
    default:
        snprintf(why, whylen, "internal error: option type %d", (int)o->type);
        return -1;
    }
    if (rc == -ERANGE) {
        snprintf(why, whylen, "too large (does not fit in 64 bits)");
        return -1;
    }
    if (rc != 0) {
        snprintf(why, whylen, "%s", reason);
        return -1;
    }
    if (u < o->min || u > o->max) {
        conf_format_uint(o, o->min, lo, sizeof(lo));
        conf_format_uint(o, o->max, hi, sizeof(hi));
        if (o->max == NO_MAX) {
            snprintf(why, whylen, "out of range (min %s)", lo);
        } else {
            snprintf(why, whylen, "out of range (min %s, max %s)", lo, hi);
        }
        return -1;
    }
    memcpy(conf_field(c, o), &u, sizeof(u));
    return 0;
}

/* "where: 'text': reason", quoting at most CONF_QUOTE_MAX bytes of text. */
static void
conf_error(char *err, size_t errlen, const char *where, const char *text, size_t textlen,
           const char *reason)
{
    if (textlen > CONF_QUOTE_MAX) {
        kv_errorf(err, errlen, "%s: '%.*s...': %s", where, CONF_QUOTE_MAX, text, reason);
    } else {
        kv_errorf(err, errlen, "%s: '%.*s': %s", where, (int)textlen, text, reason);
    }
}

void
conf_init(struct kv_config *c)
{
    char why[256];

    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < CONF_NOPTIONS; i++) {
        const struct conf_option *o = &conf_options[i];

        if (conf_store(c, o, o->def, why, sizeof(why)) != 0) {
            /* A bad default is a bug in the table above, found by the first test run. */
            fprintf(stderr, "config: default '%s %s': %s\n", o->name, o->def, why);
            abort();
        }
    }
}

/* conf_note_where: keep source in where (CONF_WHERE_MAX), its end if it is longer. */
static void
conf_note_where(char *where, const char *source)
{
    size_t n = strlen(source);

    if (n < CONF_WHERE_MAX) {
        memcpy(where, source, n + 1);
    } else {
        memcpy(where, "...", 3);
        memcpy(where + 3, source + n - (CONF_WHERE_MAX - 4), CONF_WHERE_MAX - 3);
    }
}

/* conf_src: " (what set key)", or " (default)", for messages about two keys. */
static const char *
conf_src(const struct kv_config *c, const char *key, char *buf, size_t len)
{
    const struct conf_option *o = conf_find(key);
    const char *w = o != NULL ? c->where[o - conf_options] : "";

    snprintf(buf, len, " (%s)", w[0] != '\0' ? w : "default");
    return buf;
}

int
conf_set(struct kv_config *c, const char *key, const char *value, const char *source,
         char *err, size_t errlen)
{
    char flag[CONF_QUOTE_MAX + 8];
    char text[CONF_QUOTE_MAX + 2];
    char why[256];
    const struct conf_option *o;
    int n;

    if (source == NULL) {
        snprintf(flag, sizeof(flag), "--%.*s", CONF_QUOTE_MAX, key);
        source = flag;
    }
    o = conf_find(key);
    if (o == NULL) {
        snprintf(why, sizeof(why), "unknown key '%.*s'", CONF_QUOTE_MAX, key);
    } else if (conf_store(c, o, value, why, sizeof(why)) == 0) {
        conf_note_where(c->where[o - conf_options], source);
        return 0;
    }
    /* A flag reads "--key=value: reason"; anything else "source: 'key value': reason". */
    if (source[0] == '-') {
        kv_errorf(err, errlen, "%s=%.*s%s: %s", source, CONF_QUOTE_MAX, value,
                    strlen(value) > CONF_QUOTE_MAX ? "..." : "", why);
    } else {
        n = snprintf(text, sizeof(text), "%s %s", key, value);
        conf_error(err, errlen, source, text, n < 0 ? 0 : (size_t)n, why);
    }
    return -1;
}

/* ---- the file format ---- */

/*
 * Decode the value token at s into out: bare text runs to the next whitespace; a value that
 * starts with '"' runs to the closing quote, with \" and \\ as the only escapes. *end is set
 * past the token. Returns 0, or -1 with *reason set.
 */
static int
conf_scan_value(const char *s, const char **end, char *out, size_t outlen, const char **reason)
{
    size_t n = 0;

    if (*s != '"') {
        while (*s != '\0' && !conf_is_space(*s)) {
            if (n + 1 >= outlen) {
                *reason = "value too long";
                return -1;
            }
            out[n++] = *s++;
        }
        out[n] = '\0';
        *end = s;
        return 0;
    }
    for (s++; *s != '"'; s++) {
        if (*s == '\0') {
            *reason = "unterminated quote";
            return -1;
        }
        if (*s == '\\' && (s[1] == '"' || s[1] == '\\')) {
            s++;
        }
        if (n + 1 >= outlen) {
            *reason = "value too long";
            return -1;
        }
        out[n++] = *s;
    }
    out[n] = '\0';
    *end = s + 1;
    return 0;
}

/*
 * Read one line into buf (newline dropped). Returns 1 for a line, 0 at end of file, -EFBIG
 * when the line is longer than CONF_LINE_MAX, -EILSEQ for a NUL byte, -errno on a read error.
 */
static int
conf_read_line(FILE *f, char *buf, size_t cap)
{
    size_t n = 0;
    int ch;

    while ((ch = getc(f)) != EOF && ch != '\n') {
        if (ch == '\0') {
            return -EILSEQ;
        }
        if (n + 1 >= cap) {
            return -EFBIG;
        }
        buf[n++] = (char)ch;
    }
    buf[n] = '\0';
    if (ch == EOF) {
        if (ferror(f)) {
            return errno != 0 ? -errno : -EIO;
        }
        if (n == 0) {
            return 0;
        }
    }
    return 1;
}

/* Apply one line of a config file; where is "path:line". */
static int
conf_parse_line(struct kv_config *c, const char *line, const char *where, char *err,
                size_t errlen)
{
    char value[CONF_LINE_MAX + 1];
    char name[64];
    char why[256];
    const struct conf_option *o = NULL;
    const char *reason, *key, *end;
    const char *p = line;
    size_t keylen;

    while (conf_is_space(*p)) {
        p++;
    }
    if (*p == '\0' || *p == '#') {
        return 0;
    }
    key = p;
    while (*p != '\0' && !conf_is_space(*p)) {
        p++;
    }
    keylen = (size_t)(p - key);
    while (conf_is_space(*p)) {
        p++;
    }
    if (*p == '\0' || *p == '#') {
        conf_error(err, errlen, where, key, keylen, "missing value (write \"\" for an empty one)");
        return -1;
    }
    if (keylen == 6 && memcmp(key, "tenant", 6) == 0 && *p != '"') {
        /* A tenant line's value is the rest of the line: NAME attr=value ... */
        size_t vn = strcspn(p, "#");

        while (vn > 0 && conf_is_space(p[vn - 1])) {
            vn--;
        }
        memcpy(value, p, vn);       /* vn < the line's length <= CONF_LINE_MAX */
        value[vn] = '\0';
        end = p + vn;
        p = end + strlen(end);
    } else if (conf_scan_value(p, &end, value, sizeof(value), &reason) != 0) {
        conf_error(err, errlen, where, key, strlen(key), reason);
        return -1;
    } else {
        p = end;
    }
    if (*p != '\0' && !conf_is_space(*p)) {
        conf_error(err, errlen, where, key, strlen(key), "unexpected text after the closing quote");
        return -1;
    }
    while (conf_is_space(*p)) {
        p++;
    }
    if (*p != '\0' && *p != '#') {
        conf_error(err, errlen, where, key, strlen(key),
                   "unexpected text after the value (put a value with spaces in double quotes)");
        return -1;
    }
    /* From here on the error quotes "key value" as written, without a trailing comment. */
    if (keylen < sizeof(name)) {
        memcpy(name, key, keylen);
        name[keylen] = '\0';
        o = conf_find(name);
    }
    if (o == NULL) {
        snprintf(why, sizeof(why), "unknown key '%.*s'",
                 (int)(keylen > CONF_QUOTE_MAX ? CONF_QUOTE_MAX : keylen), key);
        conf_error(err, errlen, where, key, (size_t)(end - key), why);
        return -1;
    }
    if (conf_store(c, o, value, why, sizeof(why)) != 0) {
        conf_error(err, errlen, where, key, (size_t)(end - key), why);
        return -1;
    }
    conf_note_where(c->where[o - conf_options], where);
    return 0;
}

int
conf_load_file(struct kv_config *c, const char *path, char *err, size_t errlen)
{
    char line[CONF_LINE_MAX + 1];
    char where[CONF_STR_MAX + 32];
    unsigned lineno = 0;
    FILE *f;
    int rc;

    f = fopen(path, "re");
    if (f == NULL) {
        rc = -errno;
        kv_errorf(err, errlen, "%s: cannot open: %s", path, strerror(-rc));
        return rc;
    }
    for (;;) {
        char *text = line;

        rc = conf_read_line(f, line, sizeof(line));
        lineno++;
        snprintf(where, sizeof(where), "%s:%u", path, lineno);
        if (rc == 0) {
            break;
        }
        if (rc == -EFBIG) {
            kv_errorf(err, errlen, "%s: line too long (max %d bytes)", where, CONF_LINE_MAX);
            rc = -1;
            break;
        }
        if (rc == -EILSEQ) {
            kv_errorf(err, errlen, "%s: NUL byte in line (not a text file?)", where);
            rc = -1;
            break;
        }
        if (rc < 0) {
            kv_errorf(err, errlen, "%s: read error: %s", where, strerror(-rc));
            break;
        }
        if (lineno == 1 && strncmp(text, "\xEF\xBB\xBF", 3) == 0) {
            text += 3; /* UTF-8 byte order mark */
        }
        rc = conf_parse_line(c, text, where, err, errlen);
        if (rc != 0) {
            break;
        }
    }
    fclose(f);
    return rc;
}

/* ---- whole-config operations ---- */

/* low_key's value must not be above high_key's. 0, or -1 with err naming both keys and
 * what set them. */
static int
conf_check_watermarks(const struct kv_config *c, double low, double high, const char *low_key,
                      const char *high_key, char *err, size_t errlen)
{
    char a[32], b[32], wa[CONF_WHERE_MAX + 4], wb[CONF_WHERE_MAX + 4];

    if (low <= high) {
        return 0;
    }
    conf_format_double(low, a, sizeof(a));
    conf_format_double(high, b, sizeof(b));
    kv_errorf(err, errlen, "%s %s%s must not be above %s %s%s", low_key, a,
              conf_src(c, low_key, wa, sizeof(wa)), high_key, b,
              conf_src(c, high_key, wb, sizeof(wb)));
    return -1;
}

/*
 * "<data_dir>/name" into out (CONF_STR_MAX bytes), data_dir's trailing slashes dropped.
 * Returns 0, or -1 when the result needs more than max bytes, NUL included.
 */
static int
conf_data_dir_path(const struct kv_config *c, const char *name, char *out, size_t max)
{
    size_t n = strlen(c->data_dir);
    int len;

    /* Drop trailing slashes; data_dir "/" gives "/name". */
    while (n > 0 && c->data_dir[n - 1] == '/') {
        n--;
    }
    len = snprintf(out, CONF_STR_MAX, "%.*s/%s", (int)n, c->data_dir, name);
    return len < 0 || (size_t)len >= max || (size_t)len >= CONF_STR_MAX ? -1 : 0;
}

/* conf_listen_is_loopback: listen's host is 127.x.x.x, ::1 or localhost (or TCP is off). */
static bool
conf_listen_is_loopback(const char *listen)
{
    return listen[0] == '\0' || strncmp(listen, "127.", 4) == 0
           || strncmp(listen, "[::1]:", 6) == 0 || strncmp(listen, "localhost:", 10) == 0;
}

/*
 * conf_finalize_tenants: c's tenants with token_file's added (the file must
 * be 0600 or stricter and hold only tenant lines) into *out, and the auth
 * rules checked: namespaces that do not collide, require_auth with at least
 * one tenant, and a listener off loopback only with require_auth (or
 * allow_unauthenticated_remote). 0, or -1 with err.
 */
static int
conf_finalize_tenants(const struct kv_config *c, struct conf_tenants *out, char *err,
                      size_t errlen)
{
    char w[CONF_WHERE_MAX + 4];

    *out = c->tenants;
    if (c->token_file[0] != '\0') {
        struct kv_config tf, dflt;
        struct conf_tenants got;
        struct stat st;

        if (stat(c->token_file, &st) != 0) {
            kv_errorf(err, errlen, "token_file %s: %s", c->token_file, strerror(errno));
            return -1;
        }
        if (!S_ISREG(st.st_mode) || (st.st_mode & 077) != 0) {
            kv_errorf(err, errlen, "token_file %s: must be a regular file that only its owner "
                        "can read (chmod 600)", c->token_file);
            return -1;
        }
        conf_init(&tf);
        conf_init(&dflt);
        if (conf_load_file(&tf, c->token_file, err, errlen) != 0) {
            return -1;
        }
        got = tf.tenants;
        tf.tenants = dflt.tenants;  /* only tenant lines may differ from the defaults */
        if (conf_diff(&tf, &dflt, NULL, NULL) != 0) {
            kv_errorf(err, errlen, "token_file %s: only tenant lines belong there",
                        c->token_file);
            return -1;
        }
        for (uint32_t i = 0; i < got.n; i++) {
            uint32_t k = 0;

            while (k < out->n && strcmp(out->t[k].name, got.t[i].name) != 0) {
                k++;
            }
            if (k == CONF_MAX_TENANTS) {
                kv_errorf(err, errlen, "too many tenants (max %d)", CONF_MAX_TENANTS);
                return -1;
            }
            out->t[k] = got.t[i];
            out->n += k == out->n;
        }
    }
    for (uint32_t i = 0; i < out->n; i++) {
        for (uint32_t k = i + 1; k < out->n; k++) {
            if (out->t[i].id == out->t[k].id) {
                kv_errorf(err, errlen, "tenants %s and %s would share a namespace (their "
                            "names hash alike): rename one", out->t[i].name, out->t[k].name);
                return -1;
            }
        }
    }
    if (c->require_auth && out->n == 0) {
        kv_errorf(err, errlen, "require_auth yes%s needs at least one tenant line "
                    "(tenant NAME token_sha256=HEX)", conf_src(c, "require_auth", w, sizeof(w)));
        return -1;
    }
    if (c->tls_listen[0] != '\0' && (c->tls_cert_file[0] == '\0' || c->tls_key_file[0] == '\0')) {
        kv_errorf(err, errlen, "tls_listen %s%s needs tls_cert_file and tls_key_file",
                    c->tls_listen, conf_src(c, "tls_listen", w, sizeof(w)));
        return -1;
    }
    if (!conf_listen_is_loopback(c->tls_listen) && !c->require_auth
        && !c->allow_unauthenticated_remote) {
        kv_errorf(err, errlen, "tls_listen %s%s is not a loopback address: set require_auth "
                    "yes (with tenant lines), or allow_unauthenticated_remote yes", c->tls_listen,
                    conf_src(c, "tls_listen", w, sizeof(w)));
        return -1;
    }
    if (!conf_listen_is_loopback(c->metrics_listen) && !c->require_auth
        && !c->allow_unauthenticated_remote) {
        kv_errorf(err, errlen, "metrics_listen %s%s is not a loopback address: set require_auth "
                    "yes (scrapers then send the admin tenant's token as a bearer token), or "
                    "allow_unauthenticated_remote yes", c->metrics_listen,
                    conf_src(c, "metrics_listen", w, sizeof(w)));
        return -1;
    }
    if (c->resp_tls_listen[0] != '\0'
        && (c->tls_cert_file[0] == '\0' || c->tls_key_file[0] == '\0')) {
        kv_errorf(err, errlen, "resp_tls_listen %s%s needs tls_cert_file and tls_key_file",
                    c->resp_tls_listen, conf_src(c, "resp_tls_listen", w, sizeof(w)));
        return -1;
    }
    const char *resp_ports[2][2] = {{"resp_listen", c->resp_listen},
                                    {"resp_tls_listen", c->resp_tls_listen}};
    for (int i = 0; i < 2; i++) {
        if (!conf_listen_is_loopback(resp_ports[i][1]) && !c->require_auth
            && !c->allow_unauthenticated_remote) {
            kv_errorf(err, errlen, "%s %s%s is not a loopback address: set require_auth yes "
                        "(with tenant lines), or allow_unauthenticated_remote yes",
                        resp_ports[i][0], resp_ports[i][1],
                        conf_src(c, resp_ports[i][0], w, sizeof(w)));
            return -1;
        }
    }
    if (!conf_listen_is_loopback(c->listen) && !c->require_auth
        && !c->allow_unauthenticated_remote) {
        kv_errorf(err, errlen, "listen %s%s is not a loopback address: anyone who can reach "
                    "it could read and write every object; set require_auth yes (with tenant "
                    "lines), or allow_unauthenticated_remote yes to accept that", c->listen,
                    conf_src(c, "listen", w, sizeof(w)));
        return -1;
    }
    return 0;
}

int
conf_finalize(struct kv_config *c, char *err, size_t errlen)
{
    char a[32], b[32], d[32], w1[CONF_WHERE_MAX + 4], w2[CONF_WHERE_MAX + 4];
    char w3[CONF_WHERE_MAX + 4];
    char sock[CONF_STR_MAX], ssd[CONF_STR_MAX];
    char prefix[CONF_STR_MAX], advertise[CONF_STR_MAX];
    struct conf_tenants tenants;
    uint64_t need;

    if (conf_check_watermarks(c, c->eviction_low_watermark, c->eviction_high_watermark,
                              "eviction_low_watermark", "eviction_high_watermark", err,
                              errlen) != 0 ||
        conf_check_watermarks(c, c->ssd_low_watermark, c->ssd_high_watermark,
                              "ssd_low_watermark", "ssd_high_watermark", err, errlen) != 0) {
        return -1;
    }
    /* Both operands are bounded by the table (4g, 64k), so the sum cannot overflow. */
    need = c->max_value_size + c->max_key_size + CONF_FRAME_OVERHEAD;
    if (need > c->max_message_size) {
        conf_format_size(c->max_message_size, a, sizeof(a));
        conf_format_size(c->max_value_size, b, sizeof(b));
        conf_format_size(c->max_key_size, d, sizeof(d));
        kv_errorf(err, errlen,
                    "max_message_size %s%s must hold max_value_size %s%s + max_key_size %s%s + %d "
                    "bytes of framing = %llu bytes: raise max_message_size or lower max_value_size",
                    a, conf_src(c, "max_message_size", w1, sizeof(w1)), b,
                    conf_src(c, "max_value_size", w2, sizeof(w2)), d,
                    conf_src(c, "max_key_size", w3, sizeof(w3)), CONF_FRAME_OVERHEAD,
                    (unsigned long long)need);
        return -1;
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && c->memory_size / (uint64_t)page > (uint64_t)pages) {
        conf_format_size(c->memory_size, a, sizeof(a));
        conf_format_size((uint64_t)pages * (uint64_t)page, b, sizeof(b));
        kv_errorf(err, errlen, "memory_size %s%s is more than this host's memory (%s)", a,
                  conf_src(c, "memory_size", w1, sizeof(w1)), b);
        return -1;
    }
    if (c->listen[0] == '\0' && strcmp(c->unix_socket, "none") == 0 && c->tls_listen[0] == '\0') {
        kv_errorf(err, errlen, "listen \"\"%s, unix_socket none%s and no tls_listen: nothing to "
                  "listen on", conf_src(c, "listen", w1, sizeof(w1)),
                  conf_src(c, "unix_socket", w2, sizeof(w2)));
        return -1;
    }
    if (c->unix_socket[0] == '\0') {
        if (conf_data_dir_path(c, "kvstashd.sock", sock, CONF_SUN_PATH_MAX) != 0) {
            kv_errorf(err, errlen,
                        "unix_socket: the default <data_dir>/kvstashd.sock is longer than a unix "
                        "socket path may be (max %zu bytes): set unix_socket to a shorter path, "
                        "or none",
                        CONF_SUN_PATH_MAX - 1);
            return -1;
        }
    } else {
        snprintf(sock, sizeof(sock), "%s", c->unix_socket);
    }
    if (strcmp(c->ssd_dir, CONF_SSD_DIR_DEFAULT) == 0) {
        if (conf_data_dir_path(c, "ssd", ssd, CONF_STR_MAX) != 0) {
            kv_errorf(err, errlen,
                        "ssd_dir: the default <data_dir>/ssd is longer than a path may be (max %d "
                        "bytes): set ssd_dir to a shorter path, or \"\" for no SSD tier",
                        CONF_STR_MAX - 1);
            return -1;
        }
    } else {
        snprintf(ssd, sizeof(ssd), "%s", c->ssd_dir);
    }
    if (conf_finalize_tenants(c, &tenants, err, errlen) != 0 ||
        conf_finalize_cluster(c, prefix, advertise, err, errlen) != 0) {
        return -1;
    }
    /* Every check passed: now derive, so a failed finalize leaves c as it was. */
    c->tenants = tenants;
    memcpy(c->etcd_prefix, prefix, sizeof(prefix));
    memcpy(c->peer_advertise, advertise, sizeof(advertise));
    memcpy(c->unix_socket, sock, sizeof(sock));
    memcpy(c->ssd_dir, ssd, sizeof(ssd));
    if (c->io_threads == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);

        if (cores < 1) {
            cores = 1;
        }
        c->io_threads = cores > CONF_AUTO_THREADS_MAX ? CONF_AUTO_THREADS_MAX : (uint64_t)cores;
    }
    return 0;
}

static bool
conf_field_equal(const struct conf_option *o, const struct kv_config *a,
                 const struct kv_config *b)
{
    const void *fa = conf_cfield(a, o);
    const void *fb = conf_cfield(b, o);

    switch (o->type) {
    case CONF_T_STRING:
        return strcmp(fa, fb) == 0;
    case CONF_T_DOUBLE: {
        double da, db;

        memcpy(&da, fa, sizeof(da));
        memcpy(&db, fb, sizeof(db));
        return da == db;
    }
    case CONF_T_SIZE:
    case CONF_T_DURATION:
    case CONF_T_UINT:
    case CONF_T_ENUM:
    case CONF_T_BOOL:
    case CONF_T_TENANTS:        /* unused entries are zeroed: bytes compare */
        break;
    }
    return memcmp(fa, fb, conf_field_size(o)) == 0;
}

int
conf_diff(const struct kv_config *a, const struct kv_config *b, conf_diff_fn *fn, void *arg)
{
    int n = 0;

    for (size_t i = 0; i < CONF_NOPTIONS; i++) {
        const struct conf_option *o = &conf_options[i];

        if (!conf_field_equal(o, a, b)) {
            n++;
            if (fn != NULL) {
                fn(o->name, o->reloadable, arg);
            }
        }
    }
    return n;
}

void
conf_apply_reloadable(struct kv_config *dst, const struct kv_config *src)
{
    for (size_t i = 0; i < CONF_NOPTIONS; i++) {
        const struct conf_option *o = &conf_options[i];

        if (o->reloadable) {
            memmove(conf_field(dst, o), conf_cfield(src, o), conf_field_size(o));
        }
    }
}

/* An snprintf-like sink: copies what fits, counts everything, keeps buf NUL-terminated. */
struct conf_out {
    char *buf;
    size_t len;
    size_t n;
};

static void
conf_out_add(struct conf_out *out, const char *s, size_t n)
{
    if (out->n + 1 < out->len) {
        size_t room = out->len - 1 - out->n;
        size_t k = n < room ? n : room;

        memcpy(out->buf + out->n, s, k);
        out->buf[out->n + k] = '\0';
    }
    out->n += n;
}

static void
conf_out_str(struct conf_out *out, const char *s)
{
    conf_out_add(out, s, strlen(s));
}

/* A string value: bare when it reads back as itself, else quoted with \" and \\ escaped. */
static void
conf_out_value(struct conf_out *out, const char *s)
{
    bool quote = *s == '\0' || *s == '"';

    for (const char *p = s; *p != '\0' && !quote; p++) {
        quote = conf_is_space(*p) || *p == '#';
    }
    if (!quote) {
        conf_out_str(out, s);
        return;
    }
    conf_out_add(out, "\"", 1);
    for (const char *p = s; *p != '\0'; p++) {
        if (*p == '"' || *p == '\\') {
            conf_out_add(out, "\\", 1);
        }
        conf_out_add(out, p, 1);
    }
    conf_out_add(out, "\"", 1);
}

/*
 * Returns the length of the whole dump, like snprintf: a result >= len means buf was too
 * small and holds a truncated, NUL-terminated prefix.
 */
/* conf_dump_tenants: `tenant ""` (which clears), then one line per tenant. */
static void
conf_dump_tenants(struct conf_out *out, const struct conf_tenants *ts)
{
    conf_out_str(out, "tenant \"\"\n");
    for (uint32_t i = 0; i < ts->n; i++) {
        const struct conf_tenant *t = &ts->t[i];
        char hex[2 * sizeof(t->token_sha256) + 1];
        char line[CONF_TENANT_NAME_MAX + sizeof(hex) + 128];

        for (size_t k = 0; k < sizeof(t->token_sha256); k++) {
            snprintf(hex + 2 * k, 3, "%02x", t->token_sha256[k]);
        }
        snprintf(line, sizeof(line), "tenant %s token_sha256=%s memory_quota=%llu ssd_quota=%llu\n",
                 t->name, hex, (unsigned long long)t->memory_quota,
                 (unsigned long long)t->ssd_quota);
        conf_out_str(out, line);
    }
}

int
conf_dump(const struct kv_config *c, char *buf, size_t len)
{
    struct conf_out out = {buf, len, 0};

    if (len > 0) {
        buf[0] = '\0';
    }
    for (size_t i = 0; i < CONF_NOPTIONS; i++) {
        const struct conf_option *o = &conf_options[i];
        const void *f = conf_cfield(c, o);
        char val[64];
        uint64_t u;
        double d;
        int v;

        if (o->type == CONF_T_TENANTS) {
            conf_dump_tenants(&out, f);
            continue;
        }
        conf_out_str(&out, o->name);
        conf_out_add(&out, " ", 1);
        switch (o->type) {
        case CONF_T_TENANTS:
            break;
        case CONF_T_STRING:
            conf_out_value(&out, f);
            break;
        case CONF_T_DOUBLE:
            memcpy(&d, f, sizeof(d));
            conf_format_double(d, val, sizeof(val));
            conf_out_str(&out, val);
            break;
        case CONF_T_ENUM:
            /* Only conf_store writes the field, so v is in range; the default is a fallback. */
            memcpy(&v, f, sizeof(v));
            conf_out_str(&out, v >= 0 && (uint64_t)v <= o->max ? o->names[v] : o->def);
            break;
        case CONF_T_BOOL:
            memcpy(&v, f, sizeof(v));
            conf_out_str(&out, v ? conf_bool_true[0] : conf_bool_false[0]);
            break;
        case CONF_T_SIZE:
        case CONF_T_DURATION:
        case CONF_T_UINT:
            memcpy(&u, f, sizeof(u));
            conf_format_uint(o, u, val, sizeof(val));
            conf_out_str(&out, val);
            break;
        }
        conf_out_add(&out, "\n", 1);
    }
    return out.n > INT32_MAX ? INT32_MAX : (int)out.n;
}

/* ---- the table as text (kvstashd --dump-options) ---- */

int
conf_option_describe(size_t i, struct conf_option_info *out)
{
    static const char *const type_names[] = {
        [CONF_T_STRING] = "string", [CONF_T_SIZE] = "size",   [CONF_T_DURATION] = "duration",
        [CONF_T_UINT] = "count",    [CONF_T_DOUBLE] = "number", [CONF_T_ENUM] = "enum",
        [CONF_T_BOOL] = "bool",     [CONF_T_TENANTS] = "tenant",
    };
    const struct conf_option *o;
    char lo[64], hi[64];

    if (i >= CONF_NOPTIONS) {
        return -1;
    }
    o = &conf_options[i];
    out->name = o->name;
    out->type = type_names[o->type];
    out->def = o->def;
    out->reloadable = o->reloadable;
    out->range[0] = '\0';
    switch (o->type) {
    case CONF_T_SIZE:
    case CONF_T_DURATION:
    case CONF_T_UINT:
        conf_format_uint(o, o->min, lo, sizeof(lo));
        hi[0] = '\0';
        if (o->max != NO_MAX) {
            conf_format_uint(o, o->max, hi, sizeof(hi));
        }
        snprintf(out->range, sizeof(out->range), "%s..%s", lo, hi);
        break;
    case CONF_T_DOUBLE:
        conf_format_double(o->dmin, lo, sizeof(lo));
        conf_format_double(o->dmax, hi, sizeof(hi));
        snprintf(out->range, sizeof(out->range), "(%s, %s]", lo, hi);
        break;
    case CONF_T_ENUM:
        for (uint64_t k = 0; k <= o->max; k++) {
            size_t used = strlen(out->range);
            snprintf(out->range + used, sizeof(out->range) - used, "%s%s", k ? "|" : "",
                     o->names[k]);
        }
        break;
    case CONF_T_BOOL:
        snprintf(out->range, sizeof(out->range), "%s|%s", conf_bool_true[0], conf_bool_false[0]);
        break;
    case CONF_T_STRING:
    case CONF_T_TENANTS:
        break;
    }
    return 0;
}

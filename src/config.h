/*
 * config: the daemon's settings. One option table in config.c (name, type,
 * bounds, default, reloadable) is the only place defaults live; everything
 * else (conf/kvstashd.conf, --key=value flags, SIGHUP reload) goes through it.
 *
 * A struct kv_config is a plain value: build one with conf_init, fill it
 * with conf_load_file / conf_set, check it with conf_finalize, then treat
 * it as read-only. The daemon publishes a finalized config by pointer swap;
 * threads read whichever snapshot they loaded.
 *
 * Error messages name the source (file:line or --flag), the text and the
 * reason, e.g.  "kvstashd.conf:12: 'memory_size 12q': bad size (use 64k, 1m, 4g, 4GiB)".
 */
#ifndef CONFIG_H
#define CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CONF_STR_MAX 512
#define CONF_OPTIONS_MAX 96            /* room in kv_config.where (config.c checks the table) */
#define CONF_ETCD_ENDPOINTS_MAX 8         /* etcd_endpoints: at most this many */
#define CONF_WHERE_MAX 64              /* "file:line" or "--flag" a key was last set by */


/* eviction_policy: which DRAM object goes first (storage/store.h, enum store_evict_policy). */
enum conf_eviction_policy { CONF_EVICT_LRU = 0, CONF_EVICT_FIFO = 1, CONF_EVICT_SLRU = 2 };

/* ssd_eviction: which bucket goes first when the SSD tier is full. */
enum conf_ssd_eviction { CONF_SSD_FIFO = 0, CONF_SSD_LRU = 1 };

/* ssd_offload: when a block is written to the SSD tier. */
enum conf_ssd_offload { CONF_SSD_ON_EVICT = 0, CONF_SSD_WRITE_THROUGH = 1, CONF_SSD_OFF = 2 };
/* memory_hugepages: which pages back the arena (storage/store.h, enum store_hugepages). */
enum conf_hugepages { CONF_HUGEPAGES_AUTO = 0, CONF_HUGEPAGES_ON = 1, CONF_HUGEPAGES_OFF = 2 };
enum conf_rdma { CONF_RDMA_OFF = 0, CONF_RDMA_AUTO = 1, CONF_RDMA_REQUIRED = 2 };

/* write_ack: when a put to a pool answers (docs/cluster.md). */
enum conf_write_ack { CONF_WRITE_ACK_ALL = 0, CONF_WRITE_ACK_LOCAL = 1 };

#define CONF_MAX_TENANTS 64
#define CONF_TENANT_NAME_MAX 64
#define CONF_ADMIN_TENANT "admin"      /* the tenant that sees every tenant's stats */

/* A tenant (a `tenant` line): name, the SHA-256 of its token, quotas (0 = none). */
struct conf_tenant {
    char name[CONF_TENANT_NAME_MAX];
    uint8_t token_sha256[32];
    uint64_t memory_quota;
    uint64_t ssd_quota;
    uint32_t id;                      /* conf_tenant_id(name): its keys' namespace */
};

struct conf_tenants {
    uint32_t n;
    struct conf_tenant t[CONF_MAX_TENANTS];
};

struct kv_config {
    char listen[CONF_STR_MAX];        /* host:port; "" disables TCP. default 127.0.0.1:7431 */
    char unix_socket[CONF_STR_MAX];   /* path; "" before finalize = <data_dir>/kvstashd.sock; "none" disables */
    char data_dir[CONF_STR_MAX];      /* default ./var */
    char node_id[CONF_STR_MAX];       /* "" = generated once and kept in <data_dir>/node_id */
    uint64_t memory_size;             /* DRAM tier bytes; default 1 GiB */
    int memory_hugepages;             /* enum conf_hugepages; default auto */
    char memory_file[CONF_STR_MAX];   /* the arena's file on tmpfs/hugetlbfs; "" = a memfd */
    uint64_t max_key_size;            /* default 1 KiB */
    uint64_t max_value_size;          /* default 256 MiB */
    uint64_t max_batch;               /* keys per batch request; default 16384 */
    uint64_t max_message_size;        /* wire bytes of one request; default 1 GiB */
    uint64_t max_connections;         /* default 1024 */
    uint64_t io_threads;              /* event loops; 0 before finalize = cores, at most 8 */
    uint64_t tcp_receive_window;      /* a TCP connection's first window; 16 MiB; 0 = kernel's */
    char local_tcp_congestion[CONF_STR_MAX]; /* of same-host TCP; "reno"; "" = host's */
    uint64_t lease_ttl_ms;            /* default 10 s */
    uint64_t put_timeout_ms;          /* put_start reservations never ended are reclaimed; 30 s */
    uint64_t client_output_limit;     /* stop reading a connection above this much unsent output; default 64 MiB */
    uint64_t client_output_max;       /* close a connection above this much unsent output; 4 GiB */
    uint64_t client_output_timeout;   /* ms: close one whose unsent output does not move; 60 s */
    uint64_t client_input_timeout;    /* ms: close one whose part-sent request does not move; 60 s */
    uint64_t client_inflight_max;     /* stop reading one with this many replies due; 16384 */
    uint64_t idle_timeout;            /* ms: close one with nothing in flight this long; 0 = never */
    uint64_t conn_buffer_memory;      /* all connections' input buffers together; 1 GiB */
    uint64_t shutdown_timeout_ms;     /* SIGTERM drain deadline; default 10 s */
    double eviction_high_watermark;   /* default 0.90 */
    double eviction_low_watermark;    /* default 0.80 */
    char ssd_dir[CONF_STR_MAX];       /* path; "" = no SSD tier; "<data_dir>/ssd" before finalize */
    uint64_t ssd_size;                /* bytes of the SSD tier on disk; default 64 GiB */
    uint64_t ssd_bucket_size;         /* bytes per bucket file; default 256 MiB */
    uint64_t ssd_io_threads;          /* threads reading the SSD tier; default 2 */
    double ssd_high_watermark;        /* default 0.98 */
    double ssd_low_watermark;         /* default 0.95 */
    uint64_t ssd_write_rate_limit;    /* bytes/s of on-evict SSD writes at most; 0 (default): none */
    uint64_t ssd_scrub_rate;          /* bytes/s the scrub after a rebuild reads; 0: no scrub */
    int ssd_eviction;                 /* enum conf_ssd_eviction; default fifo */
    int eviction_policy;              /* enum conf_eviction_policy; default lru */
    int ssd_offload;                  /* enum conf_ssd_offload; default on_evict */
    int ssd_promote;                  /* 1: a value read back from SSD stays in DRAM; default 1 */
    int rdma;                         /* enum conf_rdma; default auto */
    char rdma_device[CONF_STR_MAX];   /* "" = the first device found */
    uint64_t rdma_port;               /* device port; default 1 */
    uint64_t rdma_gid_index;          /* GID table index; default 0 */
    int log_level;                    /* enum log_level (log.h); default info */
    char log_file[CONF_STR_MAX];      /* "" = stderr */
    int log_format;                   /* enum log_format (log.h); default text */
    char metrics_listen[CONF_STR_MAX]; /* host:port of the HTTP metrics and probes; "" = none */
    int require_auth;                 /* 1: hello {tenant, token} before anything but ping */
    int allow_unauthenticated_remote; /* 1: a non-loopback listen may go without require_auth */
    char token_file[CONF_STR_MAX];    /* "" or a 0600 file of more tenant lines */
    char tls_listen[CONF_STR_MAX];    /* host:port of the TLS listener; "" = none */
    char tls_cert_file[CONF_STR_MAX]; /* PEM certificate chain */
    char tls_key_file[CONF_STR_MAX];  /* PEM private key */
    char tls_ca_file[CONF_STR_MAX];   /* PEM CAs of client certificates; "" = none asked */
    char resp_listen[CONF_STR_MAX];   /* host:port of the Redis-protocol (RESP2) port; "" = off */
    char resp_unix_socket[CONF_STR_MAX]; /* path of a RESP2 Unix socket; "" = none */
    char resp_tls_listen[CONF_STR_MAX]; /* host:port of the RESP2 port over TLS; "" = none */
    char cluster_name[CONF_STR_MAX];  /* "" = one node, no pool (the default) */
    char etcd_endpoints[CONF_STR_MAX]; /* comma list of http(s)://host:port; "" = none */
    char etcd_prefix[CONF_STR_MAX];   /* key prefix in etcd; default /kvstash/<cluster_name> */
    char etcd_tls_ca_file[CONF_STR_MAX];   /* https:// endpoints: PEM CAs; "" = the system's */
    char etcd_tls_cert_file[CONF_STR_MAX]; /* https:// endpoints: client certificate; "" = none */
    char etcd_tls_key_file[CONF_STR_MAX];  /* its PEM private key */
    char etcd_user[CONF_STR_MAX];          /* etcd auth: the user logged in as; "" = no auth */
    char etcd_password_file[CONF_STR_MAX]; /* its password, the file's first line (mode 0600) */
    uint64_t etcd_lease_ttl;          /* ms, whole seconds: the node key's lease; 10 s */
    char peer_advertise[CONF_STR_MAX]; /* host:port peers dial; "" before finalize = listen */
    uint64_t replicas;                /* owners of each key (R); default 2 */
    double node_weight;               /* this node's share of keys, relative; default 1 */
    int write_ack;                    /* enum conf_write_ack; default all */
    uint64_t rebalance_delay;         /* ms before a lost node's keys are re-replicated; 30 s */
    uint64_t peer_timeout;            /* ms a peer request may take; default 5 s */
    struct conf_tenants tenants;      /* tenant lines (repeatable), then token_file's */
    char where[CONF_OPTIONS_MAX][CONF_WHERE_MAX]; /* per option: what set it, "" = default;
                                                     for the errors that involve two keys */
};

/*
 * conf_tenant_id: the namespace of tenant `name` (len bytes): a 32-bit hash,
 * never 0 (the namespace of connections that did not authenticate). Stable
 * across restarts, since objects on SSD carry it; conf_finalize refuses two
 * tenants whose ids collide.
 */
uint32_t conf_tenant_id(const char *name, size_t len);

/* conf_tenant_find: the tenant called name[0..len) in c, or NULL. */
const struct conf_tenant *conf_tenant_find(const struct kv_config *c, const char *name,
                                           size_t len);

/* conf_init: fill c with every default from the option table. */
void conf_init(struct kv_config *c);

/*
 * conf_load_file: read `key value` lines from path into c ('#' starts a
 * comment, blank lines ignored, a key given twice keeps the last value).
 * Returns 0, or -1 with a message in err naming path:line, the text and the
 * reason (unknown key, bad value, out of bounds), or -errno when the file
 * cannot be read (err says which file and why).
 */
int conf_load_file(struct kv_config *c, const char *path, char *err, size_t errlen);

/*
 * conf_set: set one key from its text form. source names where it came from
 * for the error message ("--memory_size" or "file.conf:3"). Returns 0 or -1
 * with err filled (unknown key, bad value, out of bounds).
 */
int conf_set(struct kv_config *c, const char *key, const char *value, const char *source,
             char *err, size_t errlen);

/*
 * conf_finalize: derive what defaults depend on (unix_socket and ssd_dir from
 * data_dir, io_threads from the core count) and check cross-key rules (low
 * watermarks <= high watermarks, max_key_size < max_message_size, derived
 * paths that fit, ...). Returns 0 or -1 with err filled; on failure c is
 * unchanged. Finalizing a finalized config changes nothing.
 */
int conf_finalize(struct kv_config *c, char *err, size_t errlen);

/*
 * conf_diff: call fn(key, reloadable, arg) for every key whose value differs
 * between a and b. Returns the number of differing keys.
 */
typedef void conf_diff_fn(const char *key, bool reloadable, void *arg);
int conf_diff(const struct kv_config *a, const struct kv_config *b, conf_diff_fn *fn, void *arg);

/*
 * conf_apply_reloadable: copy every reloadable key from src into dst,
 * leaving the others as they are. Used on SIGHUP.
 */
void conf_apply_reloadable(struct kv_config *dst, const struct kv_config *src);

/* conf_parse_size: "4096", "64k", "1m", "4g", "4GiB", "1t" (binary units). 0 or -1. */
int conf_parse_size(const char *s, uint64_t *out);

/* conf_parse_duration_ms: "250" (ms), "500ms", "10s", "5m", "1h". 0 or -1. */
int conf_parse_duration_ms(const char *s, uint64_t *out);

/* conf_dump: write every key and its current value as a config file to buf. */
int conf_dump(const struct kv_config *c, char *buf, size_t len);

/*
 * One row of the option table as text, for `kvstashd --dump-options` (and so the
 * generated kvstashd.conf(5)): every pointer is static or into the caller's struct,
 * valid as long as it is.
 */
struct conf_option_info {
    const char *name;
    const char *type;       /* string, size, duration, count, number, enum, bool, tenant */
    const char *def;        /* the default as written in a config file ("" for none) */
    bool reloadable;        /* SIGHUP applies it; false: restart */
    char range[160];        /* "1m..", "1..1000000", "(0, 1]", "fifo|lru", "on|off", "" */
};

/*
 * conf_option_describe: row i of the option table (table order, which is conf_dump's) into
 * *out. Returns 0, or -1 once i is past the last row. Pure; any thread.
 */
int conf_option_describe(size_t i, struct conf_option_info *out);

#endif

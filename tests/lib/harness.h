/*
 * harness: the shared integration-test harness. It starts the real kvstashd
 * binary on an ephemeral loopback port with a fresh temporary data dir, talks
 * to it over raw sockets with msgpack-c, runs other programs (the CLI, the
 * daemon with bad flags) with a deadline, and stops or kills the daemon.
 *
 * It never asserts: every call returns a status and prints what went wrong to
 * stderr, so the tests decide what a failure means. Tests use the client
 * library (libkvstash) for normal traffic and the raw connections here for
 * hostile input; the harness uses libkvstash only to read stats.
 *
 * Every wait is bounded: each call that waits takes a timeout or uses the
 * fixed one named below. Only loopback addresses are used.
 *
 * Environment: KVSTASHD (daemon path, default build/release/kvstashd),
 * KVSTASH_CLI (CLI path, default build/release/kvstash), KVSTASH_TEST_KEEP
 * (set: keep data dirs after the test, for post-mortems).
 *
 * Not thread safe except where a function says so; one struct harness per
 * test process. The daemon is started with PR_SET_PDEATHSIG so it dies with
 * the test process even when the test is killed by a timeout.
 */
#ifndef HARNESS_H
#define HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <msgpack.h>

#define HARNESS_START_TIMEOUT_MS 5000
#define HARNESS_IO_TIMEOUT_MS 5000

/* HARNESS_ARGS("--a=1", "--b=2"): a NULL-terminated argument list literal. */
#define HARNESS_ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

struct harness {
    pid_t pid;              /* the daemon; 0 once reaped */
    int status;             /* its wait status once reaped, else -1 */
    bool expect_exit;       /* set by harness_stop/kill: an exit is not a crash */
    int port;               /* TCP port on 127.0.0.1 */
    char dir[128];          /* data dir (mkdtemp) */
    char addr[64];          /* "127.0.0.1:PORT" */
    char unix_path[192];    /* <dir>/kvstashd.sock */
    char unix_addr[200];    /* "unix:<unix_path>" */
    char log_path[192];     /* <dir>/kvstashd.stderr: the daemon's stdout and stderr */
    char conf_path[192];    /* <dir>/kvstashd.conf when started with a config text */
    const char *daemon;     /* binary path */
};

/*
 * harness_prepare: make the data dir, pick the port and fill in every path,
 * without starting anything (for runs of the daemon that must fail, or
 * harness_write_conf before a start). 0 or -1 (printed).
 */
int harness_prepare(struct harness *h);

/*
 * harness_start: harness_prepare, then start kvstashd and wait (HARNESS_START_TIMEOUT_MS) until it
 * accepts on TCP and, unless the caller sets unix_socket, until its Unix
 * socket exists.
 *
 * conf: NULL to pass everything as --key=value flags; otherwise the text of
 * a config file, written to h->conf_path after harness lines for listen,
 * data_dir and memory_size, and passed as --config FILE (so a SIGHUP reload of
 * a rewritten file keeps the same listen address; see harness_write_conf).
 * args: extra arguments (NULL-terminated, may be NULL), after the harness's.
 * memory_size defaults to 256m unless args or conf mention memory_size.
 *
 * Returns 0, or -1 after printing why and the daemon's log (it exited, or it
 * did not accept in time; it is then killed).
 */
int harness_start(struct harness *h, const char *conf, const char *const *args);

/*
 * harness_restart: start kvstashd again after it exited, with the same data
 * dir, port and paths (and conf/args as for harness_start). 0 or -1.
 */
int harness_restart(struct harness *h, const char *conf, const char *const *args);

/*
 * harness_write_conf: (re)write h->conf_path with the harness lines followed
 * by text, atomically (write a temp file, rename). 0 or -errno.
 */
int harness_write_conf(const struct harness *h, const char *text);

/* harness_alive: true while the daemon runs (reaps it and records status if it exited). */
bool harness_alive(struct harness *h);

/* harness_signal: send sig to the daemon. 0 or -errno. */
int harness_signal(const struct harness *h, int sig);

/*
 * harness_wait_exit: wait up to timeout_ms for the daemon to exit. Returns 0
 * (h->status holds the wait status) or -ETIMEDOUT.
 */
int harness_wait_exit(struct harness *h, int timeout_ms);

/*
 * harness_stop: SIGTERM, then wait up to timeout_ms. Returns 0 (h->status
 * set) or -ETIMEDOUT after a SIGKILL.
 */
int harness_stop(struct harness *h, int timeout_ms);

/*
 * harness_stop_clean: harness_stop with HARNESS_START_TIMEOUT_MS, and require
 * exit status 0 (a sanitizer build exits non-zero on a leak or error found at
 * exit). 0, or -1 after printing the status and the daemon's log.
 */
int harness_stop_clean(struct harness *h);

/* harness_kill: SIGKILL and reap. */
void harness_kill(struct harness *h);

/*
 * harness_destroy: kill the daemon if it still runs, report on stderr if it
 * had died unexpectedly (crash signal or exit the test did not ask for),
 * remove the data dir (unless KVSTASH_TEST_KEEP). Safe on a zeroed or
 * already destroyed struct.
 */
void harness_destroy(struct harness *h);

/* harness_read_log: the daemon's captured output as a malloc'd string (NUL-terminated). */
char *harness_read_log(const struct harness *h);

/* harness_dump_log: print the daemon's captured output to stderr. */
void harness_dump_log(const struct harness *h);

/* harness_log_size: bytes of daemon output captured so far (0 if none). */
size_t harness_log_size(const struct harness *h);

/*
 * harness_wait_log: wait up to timeout_ms for needle to appear in the log
 * past byte offset from (case-insensitive). true if it did.
 */
bool harness_wait_log(const struct harness *h, size_t from, const char *needle,
                      int timeout_ms);

/* harness_rss_kib: VmRSS of the daemon in KiB, or -1. */
long harness_rss_kib(const struct harness *h);

/*
 * harness_peak_rss_kib: VmHWM (peak RSS) of the daemon in KiB, or -1.
 * harness_reset_peak_rss: set the peak back to the current RSS
 * (/proc/PID/clear_refs); 0 or -errno.
 */
long harness_peak_rss_kib(const struct harness *h);
int harness_reset_peak_rss(const struct harness *h);

/*
 * harness_sanitized: the running daemon is built with ASan or UBSan (its
 * RSS then includes the sanitizer's quarantine and shadow memory, so RSS
 * bounds mean nothing).
 */
bool harness_sanitized(const struct harness *h);

/* harness_free_port: an ephemeral loopback port nobody listens on (bind 0, close). */
int harness_free_port(void);

/* harness_now_ms: CLOCK_MONOTONIC in ms. */
uint64_t harness_now_ms(void);

/* harness_sleep_ms: sleep ms milliseconds. */
void harness_sleep_ms(int ms);

/*
 * harness_fill: deterministic pseudo-random bytes derived from seed
 * (xorshift64*). The same seed always gives the same bytes.
 */
void harness_fill(void *buf, size_t n, uint64_t seed);

/* harness_seed: a seed from bytes (FNV-1a 64), e.g. to derive a value from its key. */
uint64_t harness_seed(const void *p, size_t n);

/* ---- through the client library ---- */

struct kvstash;

/*
 * harness_client: kvstash_connect to addr, retrying refusals for up to
 * timeout_ms, with a per-call timeout of HARNESS_IO_TIMEOUT_MS * 4 set.
 * 0 and *out, or the last kvstash_connect error (printed).
 */
int harness_client(const char *addr, int timeout_ms, struct kvstash **out);

/*
 * harness_stat: one stats counter; 0 and *value, KVSTASH_ENOTFOUND if
 * absent, or the call's error.
 */
int harness_stat(struct kvstash *c, const char *name, uint64_t *value);

/*
 * harness_wait_stat: poll stats until name == want, for up to timeout_ms.
 * 0 when it did; -ETIMEDOUT (with *last the last value seen, if last) or the call's error.
 */
int harness_wait_stat(struct kvstash *c, const char *name, uint64_t want, int timeout_ms,
                      uint64_t *last);

/* ---- raw connections ---- */

struct harness_conn {
    int fd;                 /* -1 when closed */
    bool eof;               /* the peer closed (or reset) the connection */
    bool have_msg;
    msgpack_unpacker unp;
    msgpack_unpacked msg;   /* the last message read; valid until the next read */
};

/*
 * harness_conn_tcp / harness_conn_unix: connect (retrying for up to
 * timeout_ms on refusal). 0 or -errno.
 */
int harness_conn_tcp(struct harness_conn *c, int port, int timeout_ms);
int harness_conn_unix(struct harness_conn *c, const char *path, int timeout_ms);

/* harness_conn_close: close and free. Safe on a closed connection. */
void harness_conn_close(struct harness_conn *c);

/*
 * harness_conn_send: write all of buf within timeout_ms (MSG_NOSIGNAL).
 * 0, -ETIMEDOUT, or -errno (-EPIPE/-ECONNRESET when the peer closed).
 */
int harness_conn_send(struct harness_conn *c, const void *buf, size_t len, int timeout_ms);

/*
 * harness_conn_read: read one msgpack message within timeout_ms. Returns 1
 * and *out (borrowed, valid until the next read or close), 0 on EOF or reset,
 * -ETIMEDOUT, or -errno.
 */
int harness_conn_read(struct harness_conn *c, int timeout_ms, const msgpack_object **out);

/*
 * harness_conn_expect_close: read (and discard) until the peer closes.
 * 0 when it closed within timeout_ms, -ETIMEDOUT otherwise.
 */
int harness_conn_expect_close(struct harness_conn *c, int timeout_ms);

/* ---- requests and responses ---- */

struct harness_req {
    msgpack_sbuffer sb;
    msgpack_packer pk;
};

void harness_req_init(struct harness_req *r);
void harness_req_destroy(struct harness_req *r);

/*
 * harness_req_begin: clear r and pack the start of [0, msgid, method, params]
 * with an array header for nparams; the caller packs the params.
 */
void harness_req_begin(struct harness_req *r, uint32_t msgid, const char *method,
                       uint32_t nparams);

void harness_pack_str(msgpack_packer *pk, const char *s);
void harness_pack_bin(msgpack_packer *pk, const void *p, size_t n);

/*
 * harness_call: send r (built for msgid), read one message and check that it
 * is [1, msgid, error, result]. Returns 0 with *err and *result borrowed from
 * c->msg (valid until the next read), -EPROTO (printed) if the reply has
 * another shape or msgid, or the error of send/read (0 from read becomes
 * -ECONNRESET).
 */
int harness_call(struct harness_conn *c, const struct harness_req *r, uint32_t msgid,
                 int timeout_ms, const msgpack_object **err, const msgpack_object **result);

/*
 * harness_err_code: for a response's error field: -1 when nil, the code when
 * it is [code:uint, name:str, message:str], -2 for any other shape.
 */
int harness_err_code(const msgpack_object *err);

/* harness_err_name_is: the error triple's name equals name. */
bool harness_err_name_is(const msgpack_object *err, const char *name);

/*
 * harness_notification_code: for a message [2, "error", [code, name, msg]]
 * the code, else -1.
 */
int harness_notification_code(const msgpack_object *msg);

/* harness_obj_is_str: o is a str (or bin) equal to s. */
bool harness_obj_is_str(const msgpack_object *o, const char *s);

/* harness_map_get: the value under string key in map o, or NULL. */
const msgpack_object *harness_map_get(const msgpack_object *o, const char *key);

/* harness_print_obj: print o to stderr (for failure messages). */
void harness_print_obj(const char *what, const msgpack_object *o);

/* ---- running programs ---- */

struct harness_proc {
    int status;       /* wait status; -1 if it had to be killed at the deadline */
    char *out;        /* stdout, malloc'd, NUL-terminated */
    size_t out_len;
    char *err;        /* stderr, malloc'd, NUL-terminated */
    size_t err_len;
};

/*
 * harness_exec: run argv[0] (a path) with argv, feeding in[0..in_len) on
 * stdin (then EOF), collecting stdout and stderr, for at most timeout_ms
 * (then SIGKILL). 0, or -errno when it could not be started.
 */
int harness_exec(const char *const *argv, const void *in, size_t in_len, int timeout_ms,
                 struct harness_proc *p);

/* harness_proc_free: free the buffers. */
void harness_proc_free(struct harness_proc *p);

/* harness_exited_with: status is a normal exit with this code. */
bool harness_exited_with(int status, int code);

/* harness_daemon_path / harness_cli_path: from env or the release defaults. */
const char *harness_daemon_path(void);
const char *harness_cli_path(void);

#endif

/*
 * kvstash_cli: the `kvstash` command, a thin shell over libkvstash for
 * scripts and operators (ping, hello, put, get, exists, rm, size, stats, cluster).
 *
 * It owns argument parsing, reading a value from a file or stdin (bounded by
 * the server's max_value_size, learned at connect), writing a value to stdout
 * or a file byte for byte, and the exit status: 0 success, 1 not found,
 * missing or not stored, 2 usage error, 3 connection or transport error.
 * Everything that can be checked without the server (the address, an input
 * file) is checked before connecting, so a bad argument is a usage error
 * whether or not the daemon runs. Every wait is bounded by -t (default
 * CLI_DEFAULT_TIMEOUT_MS without progress; 0 waits forever), so a daemon that
 * accepts and never answers is a transport error, not a hang. Every error
 * goes to stderr with its reason. It must not speak the wire format itself:
 * everything goes through kvstash.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_cluster.h"
#include "cli_monitor.h"
#include "kverr.h"
#include "kvstash.h"

#define CLI_DEFAULT_ADDR "127.0.0.1:7431"
#define CLI_DEFAULT_TIMEOUT_MS 10000 /* no progress for this long: exit 3 */

enum cli_exit {
    CLI_OK = 0,
    CLI_MISS = 1,     /* not found, missing, not stored, or refused by the server */
    CLI_USAGE = 2,
    CLI_CONN = 3      /* could not connect, or the connection failed */
};

/* A command's arguments, checked before connecting. */
struct cli_args {
    char **keys;      /* the KEY operands */
    int nkeys;
    const char *file; /* put: FILE or "-"; get: -o FILE or NULL */
    int fd;           /* put: FILE opened before connecting, or stdin; else -1 */
    bool force;       /* rm -f */
};

static const char cli_usage_text[] =
    "usage: kvstash [-H host:port | -S socket] [-t timeout_ms] COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  ping                  check that the server answers\n"
    "  hello                 show the server's identity and limits\n"
    "  put KEY FILE|-        store FILE (or stdin, '-') under KEY\n"
    "  get KEY [-o FILE]     write KEY's value to stdout (or FILE)\n"
    "  exists KEY...         print 'KEY 1' or 'KEY 0' for each key\n"
    "  rm [-f] KEY...        remove keys (-f: even leased ones)\n"
    "  size KEY              print the size of KEY's value in bytes\n"
    "  stats [--json|--raw]  the server's counters, grouped, in human units (--json: one\n"
    "                        JSON object; --raw: one 'name value' a line)\n"
    "  top [-d s] [-n count] a live view of rates, hit ratios and latency (q quits;\n"
    "                        plain lines when stdout is not a terminal)\n"
    "  bench [-n ops] [-s bytes] [--keep]\n"
    "                        a quick put/get load with a progress line, then\n"
    "                        kvstash-bench's result lines\n"
    "  cluster [members]     the pool: members, their states, the view's revision\n"
    "  cluster where KEY...  the nodes that own each key, in the daemon's view\n"
    "  cluster drain         hand this node's keys off, then leave the pool\n"
    "\n"
    "options:\n"
    "  -H host:port          TCP address ([v6]:port for IPv6)\n"
    "  -S path               Unix socket path\n"
    "  -t timeout_ms         give up (exit 3) when connecting, sending or awaiting a\n"
    "                        reply makes no progress for this long; default 10000,\n"
    "                        0 waits forever\n"
    "  --tls-ca FILE         speak TLS (to the daemon's tls_listen); trust FILE's CAs\n"
    "  --tls-cert FILE       with --tls-key FILE: the client certificate to present\n"
    "  -V, --version         print the client version\n"
    "  -h, --help            print this help\n"
    "\n"
    "The target defaults to $KVSTASH_ADDR, else " CLI_DEFAULT_ADDR ".\n"
    "Exit status: 0 success; 1 not found, missing or not stored; 2 usage error;\n"
    "3 connection or transport error (a timeout included).\n";

/* cli_usage: complain (fmt may be NULL) and show the synopsis of one command or all. */
static int
cli_usage(const char *synopsis, const char *fmt, const char *arg)
{
    if (fmt != NULL) {
        fputs("kvstash: ", stderr);
        fprintf(stderr, fmt, arg);
        fputs("\n", stderr);
    }
    fprintf(stderr, "usage: kvstash [-H host:port | -S socket] [-t timeout_ms] %s\n",
            synopsis ? synopsis : "ping|hello|put|get|exists|rm|size|stats|top|bench|cluster ...");
    fputs("       kvstash --help for details\n", stderr);
    return CLI_USAGE;
}

/* cli_timeout_hint: what to add to the report of a transport error rc. */
static const char *
cli_timeout_hint(int rc)
{
    return rc == -ETIMEDOUT ? " (timed out; -t sets the limit in ms, 0 for none)" : "";
}

/* cli_fail: report a failed call and map it to an exit status. */
static int
cli_fail(struct kvstash *c, const char *what, int rc)
{
    const char *msg = kvstash_last_error(c);

    if (rc < 0) {
        fprintf(stderr, "kvstash: %s: %s%s\n", what, msg[0] ? msg : kvstash_strerror(rc),
                cli_timeout_hint(rc));
        return CLI_CONN;
    }
    if (msg[0] != '\0') {
        fprintf(stderr, "kvstash: %s: %s: %s\n", what, kv_errname(rc), msg);
    } else {
        fprintf(stderr, "kvstash: %s: %s (%s)\n", what, kv_errname(rc), kvstash_strerror(rc));
    }
    return CLI_MISS;
}

static int
cli_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;

    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/*
 * cli_read_value: read all of fd (a file of st_size bytes when known, or a
 * stream) into a malloc'd buffer, refusing more than limit bytes.
 * Returns 0, KV_TOO_LARGE (*len then holds the file's size, or 0 for a
 * stream that went past the limit) or -errno.
 */
static int
cli_read_value(int fd, uint64_t limit, void **out, size_t *len)
{
    struct stat st;
    size_t cap = 64 * 1024;
    size_t n = 0;
    char *buf;

    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        if ((uint64_t)st.st_size > limit) {
            *len = (size_t)st.st_size;
            return KV_TOO_LARGE;
        }
        cap = (size_t)st.st_size + 1; /* +1: notice a file that grew meanwhile */
    }
    buf = malloc(cap);
    if (buf == NULL) {
        return -ENOMEM;
    }
    for (;;) {
        if (n == cap) {
            if ((uint64_t)cap > limit) {
                free(buf);
                *len = 0;
                return KV_TOO_LARGE;
            }
            size_t ncap = (uint64_t)cap * 2 > limit + 1 ? (size_t)limit + 1 : cap * 2;
            char *nb = realloc(buf, ncap);
            if (nb == NULL) {
                free(buf);
                return -ENOMEM;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            int e = errno;
            free(buf);
            return -e;
        }
        if (r == 0) {
            break;
        }
        n += (size_t)r;
    }
    if (n > limit) {
        free(buf);
        *len = 0;
        return KV_TOO_LARGE;
    }
    *out = buf;
    *len = n;
    return 0;
}

static int
cmd_put(struct kvstash *c, const struct cli_args *a)
{
    const char *key = a->keys[0], *path = a->file;
    void *val = NULL;
    size_t vlen = 0;
    int rc;

    uint64_t limit = kvstash_server_info(c)->max_value_size;
    rc = cli_read_value(a->fd, limit, &val, &vlen);
    if (rc == KV_TOO_LARGE) {
        if (vlen > 0) {
            fprintf(stderr, "kvstash: put %s: TOO_LARGE: %s holds %zu bytes, over the "
                    "server's max_value_size %" PRIu64 "\n", key, path, vlen, limit);
        } else {
            fprintf(stderr, "kvstash: put %s: TOO_LARGE: %s holds more than the server's "
                    "max_value_size %" PRIu64 " bytes\n", key, path, limit);
        }
        return CLI_MISS;
    }
    if (rc != 0) {
        fprintf(stderr, "kvstash: put: reading %s: %s\n", path, strerror(-rc));
        return CLI_MISS;
    }
    rc = kvstash_put(c, key, strlen(key), val, vlen);
    free(val);
    return rc == 0 ? CLI_OK : cli_fail(c, "put", rc);
}

static int
cmd_get(struct kvstash *c, const struct cli_args *a)
{
    const char *out = a->file;
    const char *key = a->keys[0];
    void *val = NULL;
    size_t vlen = 0;
    int rc, fd = STDOUT_FILENO;

    rc = kvstash_get_alloc(c, key, strlen(key), &val, &vlen);
    if (rc != 0) {
        return cli_fail(c, "get", rc);
    }
    if (out != NULL) {
        fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            fprintf(stderr, "kvstash: get: %s: %s\n", out, strerror(errno));
            free(val);
            return CLI_MISS;
        }
    }
    rc = cli_write_all(fd, val, vlen);
    free(val);
    if (out != NULL && close(fd) != 0 && rc == 0) {
        rc = -errno;
    }
    if (rc != 0) {
        fprintf(stderr, "kvstash: get: writing %s: %s\n", out ? out : "stdout", strerror(-rc));
        return CLI_MISS;
    }
    return CLI_OK;
}

/* cli_keys: argv[0..n) as the key arrays of a batch call (malloc'd). */
static int
cli_keys(int n, char **argv, const void ***keys, size_t **klens)
{
    *keys = calloc((size_t)n, sizeof(**keys));
    *klens = calloc((size_t)n, sizeof(**klens));
    if (*keys == NULL || *klens == NULL) {
        free(*keys);
        free(*klens);
        fputs("kvstash: out of memory\n", stderr);
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        (*keys)[i] = argv[i];
        (*klens)[i] = strlen(argv[i]);
    }
    return 0;
}

static int
cmd_exists(struct kvstash *c, const struct cli_args *a)
{
    const void **keys;
    size_t *klens;
    bool *ex;
    int n = a->nkeys, rc, status = CLI_OK;

    if (cli_keys(n, a->keys, &keys, &klens) != 0) {
        return CLI_CONN;
    }
    ex = calloc((size_t)n, sizeof(*ex));
    rc = ex ? kvstash_batch_is_exist(c, (size_t)n, keys, klens, ex) : -ENOMEM;
    if (rc != 0) {
        status = cli_fail(c, "exists", rc);
    } else {
        for (int i = 0; i < n; i++) {
            printf("%s %d\n", a->keys[i], ex[i] ? 1 : 0);
            if (!ex[i]) {
                status = CLI_MISS;
            }
        }
    }
    free(ex);
    free(keys);
    free(klens);
    return status;
}

static int
cmd_rm(struct kvstash *c, const struct cli_args *a)
{
    const void **keys;
    size_t *klens;
    int *codes;
    int n = a->nkeys, rc, status = CLI_OK;

    if (cli_keys(n, a->keys, &keys, &klens) != 0) {
        return CLI_CONN;
    }
    codes = calloc((size_t)n, sizeof(*codes));
    rc = codes ? kvstash_batch_remove(c, (size_t)n, keys, klens, a->force, codes) : -ENOMEM;
    if (rc != 0) {
        status = cli_fail(c, "rm", rc);
    } else {
        for (int i = 0; i < n; i++) {
            if (codes[i] != 0) {
                fprintf(stderr, "kvstash: rm %s: %s\n", a->keys[i], kv_errname(codes[i]));
                status = CLI_MISS;
            }
        }
    }
    free(codes);
    free(keys);
    free(klens);
    return status;
}

static int
cmd_size(struct kvstash *c, const struct cli_args *a)
{
    uint64_t size = 0;
    int rc;

    rc = kvstash_get_size(c, a->keys[0], strlen(a->keys[0]), &size);
    if (rc != 0) {
        return cli_fail(c, "size", rc);
    }
    printf("%" PRIu64 "\n", size);
    return CLI_OK;
}

static int
cmd_hello(struct kvstash *c, const struct cli_args *a)
{
    const struct kvstash_hello *h = kvstash_server_info(c);

    (void)a;
    printf("server %s\nversion %s\nprotocol %" PRIu64 "\nnode_id %s\n", h->server, h->version,
           h->protocol, h->node_id);
    printf("max_key_size %" PRIu64 "\nmax_value_size %" PRIu64 "\nmax_batch %" PRIu64 "\n",
           h->max_key_size, h->max_value_size, h->max_batch);
    printf("max_message_size %" PRIu64 "\nlease_ttl_ms %" PRIu64 "\n", h->max_message_size,
           h->lease_ttl_ms);
    return CLI_OK;
}

static int
cmd_ping(struct kvstash *c, const struct cli_args *a)
{
    (void)a;
    int rc = kvstash_ping(c);
    if (rc != 0) {
        return cli_fail(c, "ping", rc);
    }
    puts("pong");
    return CLI_OK;
}

struct cli_cmd {
    const char *name;
    const char *opts;  /* getopt options of the command */
    int min_keys;
    int max_keys;      /* -1: no limit */
    bool file;         /* takes FILE after the key (put) */
    const char *synopsis;
    int (*fn)(struct kvstash *c, const struct cli_args *a);
    int (*own)(struct kvstash *c, int argc, char **argv); /* parses its own arguments */
};

static const struct cli_cmd cli_cmds[] = {
    { "ping", "", 0, 0, false, "ping", cmd_ping, NULL },
    { "hello", "", 0, 0, false, "hello", cmd_hello, NULL },
    { "put", "", 1, 1, true, "put KEY FILE|-", cmd_put, NULL },
    { "get", "o:", 1, 1, false, "get KEY [-o FILE]", cmd_get, NULL },
    { "exists", "", 1, -1, false, "exists KEY...", cmd_exists, NULL },
    { "rm", "f", 1, -1, false, "rm [-f] KEY...", cmd_rm, NULL },
    { "size", "", 1, 1, false, "size KEY", cmd_size, NULL },
    { "stats", "", 0, -1, false, "stats [--json|--raw]", NULL, cli_stats },
    { "top", "", 0, -1, false, "top [-d seconds] [-n count]", NULL, cli_top },
    { "bench", "", 0, -1, false, "bench [-n ops] [-s bytes] [--keep]", NULL, cli_bench },
    { "cluster", "", 0, -1, false, "cluster [members | where KEY... | drain]", NULL, cli_cluster },
};

/* cli_parse: a command's options and operands (argv[0] is the command). 0 or CLI_USAGE. */
static int
cli_parse(const struct cli_cmd *cmd, int argc, char **argv, struct cli_args *a)
{
    char opts[8];
    int opt;

    memset(a, 0, sizeof(*a));
    a->fd = -1;
    snprintf(opts, sizeof(opts), ":%s", cmd->opts);
    optind = 0; /* glibc: start a fresh scan */
    while ((opt = getopt(argc, argv, opts)) != -1) {
        if (opt == 'o') {
            a->file = optarg;
        } else if (opt == 'f') {
            a->force = true;
        } else {
            char o[2] = { (char)optopt, '\0' };
            return cli_usage(cmd->synopsis,
                             opt == ':' ? "option -%s needs an argument" : "unknown option -%s", o);
        }
    }
    a->keys = argv + optind;
    a->nkeys = argc - optind;
    if (cmd->file) {
        if (a->nkeys != 2) {
            return cli_usage(cmd->synopsis, NULL, NULL);
        }
        a->file = a->keys[1];
        a->nkeys = 1;
    }
    if (a->nkeys < cmd->min_keys || (cmd->max_keys >= 0 && a->nkeys > cmd->max_keys)) {
        return cli_usage(cmd->synopsis, NULL, NULL);
    }
    return 0;
}

/*
 * cli_open_input: open put's FILE now, before connecting: a missing or
 * unreadable file is the caller's mistake (exit 2), whether or not the
 * server can be reached. "-" is stdin. 0 (a->fd set) or CLI_USAGE.
 */
static int
cli_open_input(struct cli_args *a)
{
    struct stat st;

    if (strcmp(a->file, "-") == 0) {
        a->fd = STDIN_FILENO;
        return 0;
    }
    a->fd = open(a->file, O_RDONLY | O_CLOEXEC);
    if (a->fd < 0) {
        fprintf(stderr, "kvstash: %s: %s\n", a->file, strerror(errno));
        return CLI_USAGE;
    }
    int err = fstat(a->fd, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : 0;
    if (err != 0) {
        /* a directory opens read-only but cannot be read */
        fprintf(stderr, "kvstash: %s: %s\n", a->file, strerror(err));
        close(a->fd);
        a->fd = -1;
        return CLI_USAGE;
    }
    return 0;
}

/*
 * cli_connect_failed: report kvstash_connect's rc for addr (given by `what`);
 * the exit status: a usage error for an address refused before connecting (a
 * port outside 1..65535, say), else a connection error.
 */
static int
cli_connect_failed(int rc, const char *addr, const char *what)
{
    const char *why = kvstash_last_error(NULL);

    if (rc == -EINVAL) {
        fprintf(stderr, "kvstash: %s: %s\n", what, why[0] ? why : kvstash_strerror(rc));
        return CLI_USAGE;
    }
    if (rc > 0) {
        fprintf(stderr, "kvstash: connecting to %s: %s: %s\n", addr, kv_errname(rc), why);
    } else {
        fprintf(stderr, "kvstash: connecting to %s: %s%s\n", addr,
                why[0] ? why : kvstash_strerror(rc), cli_timeout_hint(rc));
    }
    return CLI_CONN;
}

int
main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, 'V' },
        { "tls-ca", required_argument, NULL, 'C' },
        { "tls-cert", required_argument, NULL, 'E' },
        { "tls-key", required_argument, NULL, 'K' },
        { NULL, 0, NULL, 0 },
    };
    struct kvstash_tls tls = {NULL, NULL, NULL};
    const char *host = NULL, *sock = NULL;
    char addr[PATH_MAX + 8];
    int timeout_ms = CLI_DEFAULT_TIMEOUT_MS;
    int opt;

    while ((opt = getopt_long(argc, argv, "+H:S:t:hV", longopts, NULL)) != -1) {
        switch (opt) {
        case 'H':
            host = optarg;
            break;
        case 'S':
            sock = optarg;
            break;
        case 't': {
            char *end;
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (errno != 0 || *end != '\0' || end == optarg || v < 0 || v > INT_MAX) {
                return cli_usage(NULL, "-t wants a timeout in milliseconds, not '%s'", optarg);
            }
            timeout_ms = (int)v;
            break;
        }
        case 'C':
            tls.ca_file = optarg;
            break;
        case 'E':
            tls.cert_file = optarg;
            break;
        case 'K':
            tls.key_file = optarg;
            break;
        case 'h':
            fputs(cli_usage_text, stdout);
            return CLI_OK;
        case 'V':
            printf("kvstash %s (protocol %d)\n", kvstash_version(), KVSTASH_PROTOCOL);
            return CLI_OK;
        default:
            return cli_usage(NULL, NULL, NULL);
        }
    }
    if (host != NULL && sock != NULL) {
        return cli_usage(NULL, "-H and -S exclude each other", NULL);
    }
    if (optind >= argc) {
        return cli_usage(NULL, "no command given", NULL);
    }
    const struct cli_cmd *cmd = NULL;
    for (size_t i = 0; i < sizeof(cli_cmds) / sizeof(cli_cmds[0]); i++) {
        if (strcmp(argv[optind], cli_cmds[i].name) == 0) {
            cmd = &cli_cmds[i];
        }
    }
    if (cmd == NULL) {
        return cli_usage(NULL, "unknown command '%s'", argv[optind]);
    }
    struct cli_args args;
    if (cmd->own != NULL) {
        memset(&args, 0, sizeof(args));
        args.fd = -1;
    } else if (cli_parse(cmd, argc - optind, argv + optind, &args) != 0) {
        return CLI_USAGE;
    }
    if (sock != NULL) {
        /* a path without '/' would be taken for a host name */
        snprintf(addr, sizeof(addr), "unix:%s", sock);
    } else {
        const char *env = getenv("KVSTASH_ADDR");
        snprintf(addr, sizeof(addr), "%s",
                 host ? host : (env && env[0] ? env : CLI_DEFAULT_ADDR));
    }

    struct kvstash *c = NULL;
    if (tls.ca_file == NULL && (tls.cert_file != NULL || tls.key_file != NULL)) {
        return cli_usage(NULL, "--tls-cert and --tls-key need --tls-ca", NULL);
    }
    if (cmd->file && cli_open_input(&args) != 0) {
        return CLI_USAGE;
    }
    int rc = kvstash_connect_tls(addr, tls.ca_file != NULL ? &tls : NULL, timeout_ms, &c);
    if (rc != 0) {
        rc = cli_connect_failed(rc, addr, sock ? "-S" : host ? "-H" : "KVSTASH_ADDR");
    } else {
        rc = cmd->own != NULL ? cmd->own(c, argc - optind, argv + optind) : cmd->fn(c, &args);
        kvstash_close(c);
    }
    if (args.fd > STDIN_FILENO) {
        close(args.fd);
    }
    if (fflush(stdout) != 0 && rc == CLI_OK) {
        fprintf(stderr, "kvstash: writing stdout: %s\n", strerror(errno));
        rc = CLI_MISS;
    }
    return rc;
}

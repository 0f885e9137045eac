/*
 * main: the kvstashd command line. Builds the config (defaults, then the
 * file, then --key=value flags in order), validates it, and runs the server.
 * Owns nothing after server_create; must not hold any policy of its own.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"
#include "server.h"
#include "version.h"

/* The flag's name ("--memory_size") for error messages; valid until the next call. */
static const char *
flag_name(const char *arg, const char *eq)
{
    static char name[160];

    snprintf(name, sizeof(name), "%.*s", (int)(eq - arg), arg);
    return name;
}

/*
 * dump_options: the option table, one tab-separated line a key: name, type, default, range,
 * "reload" or "restart". packaging/gen_conf_man.py renders kvstashd.conf(5) from it.
 */
static int
dump_options(void)
{
    struct conf_option_info info;

    printf("# name\ttype\tdefault\trange\treload\n");
    for (size_t i = 0; conf_option_describe(i, &info) == 0; i++) {
        printf("%s\t%s\t%s\t%s\t%s\n", info.name, info.type, info.def, info.range,
               info.reloadable ? "reload" : "restart");
    }
    return fflush(stdout) == 0 ? 0 : 1;
}

static void
usage(FILE *f)
{
    fprintf(f,
            "usage: kvstashd [--config FILE] [--key=value ...] [--check-config] [--version] "
            "[--help]\n"
            "\n"
            "  --config FILE    read settings from FILE (see conf/kvstashd.conf)\n"
            "  --key=value      set any config key, overriding the file (e.g. "
            "--memory_size=4g)\n"
            "  --check-config   validate the configuration and exit\n"
            "  --dump-options   print the option table (name, type, default, range,\n"
            "                   reload) tab-separated and exit\n"
            "  --version        print the version and exit\n"
            "\n"
            "signals: SIGHUP reloads FILE and reopens log_file, SIGUSR1 reopens log_file,\n"
            "         SIGTERM/SIGINT drain "
            "and exit\n");
}

int
main(int argc, char **argv)
{
    struct kv_config conf;
    const char *config_path = NULL;
    bool check_only = false;
    char err[1024];
    char **overrides = calloc((size_t)argc + 1, sizeof(*overrides));
    int noverrides = 0;
    struct server *srv = NULL;

    if (overrides == NULL) {
        fprintf(stderr, "kvstashd: out of memory\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            free(overrides);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("kvstashd %s (protocol %d)\n", KVSTASH_VERSION, KVSTASH_PROTOCOL_VERSION);
            free(overrides);
            return 0;
        } else if (strcmp(a, "--dump-options") == 0) {
            free(overrides);
            return dump_options();
        } else if (strcmp(a, "--check-config") == 0) {
            check_only = true;
        } else if (strcmp(a, "--config") == 0 || strcmp(a, "-c") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kvstashd: %s needs a file name\n", a);
                free(overrides);
                return 2;
            }
            config_path = argv[++i];
        } else if (strncmp(a, "--config=", 9) == 0) {
            config_path = a + 9;
        } else if (strncmp(a, "--", 2) == 0 && strchr(a, '=') != NULL) {
            overrides[noverrides++] = argv[i];
        } else {
            fprintf(stderr, "kvstashd: '%s': not an option (use --key=value; see --help)\n", a);
            free(overrides);
            return 2;
        }
    }

    conf_init(&conf);
    if (config_path != NULL && conf_load_file(&conf, config_path, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvstashd: %s\n", err);
        free(overrides);
        return 1;
    }
    for (int i = 0; i < noverrides; i++) {
        char key[128];
        const char *arg = overrides[i] + 2;
        const char *eq = strchr(arg, '=');
        if ((size_t)(eq - arg) >= sizeof(key)) {
            fprintf(stderr, "kvstashd: %s: key too long\n", overrides[i]);
            free(overrides);
            return 1;
        }
        snprintf(key, sizeof(key), "%.*s", (int)(eq - arg), arg);
        if (conf_set(&conf, key, eq + 1, flag_name(overrides[i], eq), err, sizeof(err)) != 0) {
            fprintf(stderr, "kvstashd: %s\n", err);
            free(overrides);
            return 1;
        }
    }
    if (conf_finalize(&conf, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvstashd: %s\n", err);
        free(overrides);
        return 1;
    }
    if (check_only) {
        printf("kvstashd: configuration OK%s%s\n", config_path ? ": " : "",
               config_path ? config_path : "");
        free(overrides);
        return 0;
    }

    signal(SIGPIPE, SIG_IGN);
    log_set_format(conf.log_format);
    int lrc = log_open(conf.log_file, conf.log_level);
    if (lrc != 0) {
        fprintf(stderr, "kvstashd: log_file '%s': cannot open: %s\n", conf.log_file,
                strerror(-lrc));
        free(overrides);
        return 1;
    }
    if (server_create(&conf, config_path, noverrides, overrides, &srv) != 0) {
        log_close();
        free(overrides);
        return 1;
    }
    int rc = server_run(srv);
    server_destroy(srv);
    log_info("kvstashd: exit");
    log_close();
    free(overrides);
    return rc;
}

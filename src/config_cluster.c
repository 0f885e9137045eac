/*
 * config_cluster: the pool's keys of the option table (cluster_name, etcd_endpoints,
 * etcd_prefix, etcd_tls_*, etcd_user, etcd_lease_ttl, peer_advertise and the rest; docs/cluster.md): their string
 * checks and the rules between them that conf_finalize applies. Pure, like config.c: no
 * I/O, no logging, no state. Shared with config.c through config_int.h only.
 */
#include "config.h"
#include "config_int.h"

#include <stdio.h>
#include <string.h>

#include "kverr.h"

#define CONF_CLUSTER_NAME_MAX 64
#define CONF_ID_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

const char *
conf_check_cluster_name(const char *v)
{
    size_t n = strlen(v);

    if (n > CONF_CLUSTER_NAME_MAX || strspn(v, CONF_ID_CHARS) != n) {
        return "bad cluster_name (use up to 64 letters, digits, '.', '_' or '-'; \"\" = one "
               "node, no pool)";
    }
    return NULL;
}

/* One endpoint, e[0..n): http://host:port or https://host:port. */
static const char *
conf_check_endpoint(const char *e, size_t n)
{
    char hostport[CONF_STR_MAX];
    size_t skip;

    if (n > 7 && strncmp(e, "http://", 7) == 0) {
        skip = 7;
    } else if (n > 8 && strncmp(e, "https://", 8) == 0) {
        skip = 8;
    } else {
        return "each endpoint is http://host:port or https://host:port";
    }
    if (n - skip >= sizeof(hostport)) {
        return "endpoint too long";
    }
    memcpy(hostport, e + skip, n - skip);
    hostport[n - skip] = '\0';
    if (strchr(hostport, '/') != NULL) {
        return "an endpoint has no path (use http://host:port)";
    }
    if (conf_check_listen(hostport) != NULL) {
        return "bad endpoint address (use http://host:port, e.g. http://127.0.0.1:2379)";
    }
    return NULL;
}

const char *
conf_check_etcd_endpoints(const char *v)
{
    const char *p = v;

    if (*v == '\0') {
        return NULL;
    }
    for (int count = 0;; count++) {
        const char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        const char *why;

        if (count == CONF_ETCD_ENDPOINTS_MAX) {
            return "too many endpoints (at most 8)";
        }
        why = conf_check_endpoint(p, n);
        if (why != NULL) {
            return why;
        }
        if (comma == NULL) {
            return NULL;
        }
        p = comma + 1;
    }
}

const char *
conf_check_etcd_prefix(const char *v)
{
    size_t n = strlen(v);

    if (strcmp(v, CONF_ETCD_PREFIX_DEFAULT) == 0) {
        return NULL;
    }
    if (n < 2 || v[0] != '/' || v[n - 1] == '/' ||
        strspn(v, CONF_ID_CHARS "/") != n || strstr(v, "//") != NULL) {
        return "bad etcd_prefix (a path such as /kvstash/pool1: '/' first, no trailing '/', "
               "letters, digits, '.', '_', '-')";
    }
    return NULL;
}

const char *
conf_check_peer_advertise(const char *v)
{
    const char *why = conf_check_listen(v);
    size_t n;

    if (why != NULL) {
        return why;
    }
    if (strncmp(v, "0.0.0.0:", 8) == 0 || strncmp(v, "[::]:", 5) == 0) {
        return "peers cannot dial a wildcard address (advertise this host's address)";
    }
    n = strlen(v);
    if (n > 2 && strcmp(v + n - 2, ":0") == 0) {
        return "peers cannot dial port 0 (advertise the port listen binds)";
    }
    return NULL;
}

int
conf_finalize_cluster(const struct kv_config *c, char *prefix, char *advertise, char *err,
                      size_t errlen)
{
    snprintf(prefix, CONF_STR_MAX, "%s", c->etcd_prefix);
    snprintf(advertise, CONF_STR_MAX, "%s", c->peer_advertise);
    if (c->cluster_name[0] == '\0') {
        return 0;
    }
    if (c->etcd_endpoints[0] == '\0') {
        kv_errorf(err, errlen, "cluster_name %s needs etcd_endpoints (e.g. "
                  "http://127.0.0.1:2379)", c->cluster_name);
        return -1;
    }
    if ((c->etcd_tls_cert_file[0] != '\0') != (c->etcd_tls_key_file[0] != '\0')) {
        kv_errorf(err, errlen, "etcd_tls_cert_file and etcd_tls_key_file go together (the "
                  "client certificate presented to etcd and its key)");
        return -1;
    }
    if ((c->etcd_tls_ca_file[0] != '\0' || c->etcd_tls_cert_file[0] != '\0') &&
        strstr(c->etcd_endpoints, "https://") == NULL) {
        kv_errorf(err, errlen, "etcd_tls_* files are set but etcd_endpoints %s has no "
                  "https:// endpoint to use them", c->etcd_endpoints);
        return -1;
    }
    if ((c->etcd_user[0] != '\0') != (c->etcd_password_file[0] != '\0')) {
        kv_errorf(err, errlen, "etcd_user and etcd_password_file go together (the etcd user "
                  "this node logs in as and the file holding its password)");
        return -1;
    }
    if (c->etcd_lease_ttl % 1000 != 0) {
        kv_errorf(err, errlen, "etcd_lease_ttl %llums: etcd leases are whole seconds",
                  (unsigned long long)c->etcd_lease_ttl);
        return -1;
    }
    if (strcmp(c->etcd_prefix, CONF_ETCD_PREFIX_DEFAULT) == 0) {
        snprintf(prefix, CONF_STR_MAX, "/kvstash/%.64s", c->cluster_name);
    }
    if (c->peer_advertise[0] == '\0') {
        if (c->listen[0] == '\0' || conf_check_peer_advertise(c->listen) != NULL) {
            kv_errorf(err, errlen, "cluster_name %s: peers dial peer_advertise, which defaults "
                      "to listen \"%s\": set peer_advertise to this host's host:port",
                      c->cluster_name, c->listen);
            return -1;
        }
        snprintf(advertise, CONF_STR_MAX, "%s", c->listen);
    }
    return 0;
}

/*
 * cli_cluster: `kvstash cluster [members | where KEY... | drain]`. Prints what
 * kvstash_cluster_info returns; computes nothing itself (placement is the daemon's, from its
 * own view, so the answer is what that daemon would do).
 */
#include "cli_cluster.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "kverr.h"
#include "kvstash.h"

#define CLI_CLUSTER_USAGE "cluster [members | where KEY... | drain]"

static int
cli_cluster_fail(struct kvstash *c, const char *what, int rc)
{
    const char *msg = kvstash_last_error(c);

    if (rc < 0) {
        fprintf(stderr, "kvstash: %s: %s\n", what, msg[0] ? msg : kvstash_strerror(rc));
        return 3;
    }
    fprintf(stderr, "kvstash: %s: %s%s%s\n", what, kv_errname(rc), msg[0] ? ": " : "", msg);
    return 1;
}

static void
cli_cluster_head(const struct kvstash_cluster *ci)
{
    printf("pool %s: view revision %" PRIu64 ", %zu members, replicas %u; etcd %s (%s)\n",
           ci->cluster, ci->revision, ci->nnodes, ci->replicas, ci->etcd_endpoint,
           ci->etcd_ok ? "answering" : "not answering");
    printf("this node: %s, %s, %s\n", ci->node_id, ci->state,
           ci->registered ? "registered" : "not registered");
}

static int
cli_cluster_members(struct kvstash *c)
{
    struct kvstash_cluster *ci;
    int rc = kvstash_cluster_info(c, NULL, NULL, 0, &ci);

    if (rc != 0) {
        return cli_cluster_fail(c, "cluster_info", rc);
    }
    if (ci->cluster[0] == '\0') {
        printf("%s is a single node (cluster_name is empty): no pool\n", ci->node_id);
        kvstash_cluster_free(ci);
        return 0;
    }
    cli_cluster_head(ci);
    printf("%-24s %-28s %8s  %s\n", "NODE", "ADDRESS", "WEIGHT", "STATE");
    for (size_t i = 0; i < ci->nnodes; i++) {
        const struct kvstash_cluster_node *n = &ci->nodes[i];

        printf("%-24s %-28s %8g  %s%s\n", n->id, n->addr, n->weight, n->state,
               (int)i == ci->self ? "  (this node)" : "");
    }
    kvstash_cluster_free(ci);
    return 0;
}

static int
cli_cluster_where(struct kvstash *c, int nkeys, char **keys)
{
    const void *kp[256];
    size_t kl[256];
    struct kvstash_cluster *ci;
    int rc;

    if (nkeys > 256) {
        fprintf(stderr, "kvstash: cluster where: at most 256 keys at once\n");
        return 2;
    }
    for (int i = 0; i < nkeys; i++) {
        kp[i] = keys[i];
        kl[i] = strlen(keys[i]);
    }
    rc = kvstash_cluster_info(c, kp, kl, (size_t)nkeys, &ci);
    if (rc != 0) {
        return cli_cluster_fail(c, "cluster_info", rc);
    }
    if (ci->cluster[0] == '\0') {
        printf("%s is a single node (cluster_name is empty): every key lives there\n",
               ci->node_id);
        kvstash_cluster_free(ci);
        return 0;
    }
    if (ci->nkeys != (size_t)nkeys) {
        fprintf(stderr, "kvstash: cluster where: %zu answers for %d keys\n", ci->nkeys, nkeys);
        kvstash_cluster_free(ci);
        return 3;
    }
    printf("view revision %" PRIu64 ", replicas %u\n", ci->revision, ci->replicas);
    for (int k = 0; k < nkeys; k++) {
        printf("%s:", keys[k]);
        if (ci->nowners[k] == 0) {
            printf(" no active member owns it");
        }
        for (unsigned j = 0; j < ci->nowners[k]; j++) {
            uint32_t at = ci->owners[k][j];

            if (at < ci->nnodes) {
                printf("%s %s (%s)", j ? "," : "", ci->nodes[at].id, ci->nodes[at].addr);
            }
        }
        printf("\n");
    }
    kvstash_cluster_free(ci);
    return 0;
}

int
cli_cluster(struct kvstash *c, int argc, char **argv)
{
    const char *sub = argc > 1 ? argv[1] : "members";
    int rc;

    if (strcmp(sub, "members") == 0 && argc <= 2) {
        return cli_cluster_members(c);
    }
    if (strcmp(sub, "where") == 0 && argc > 2) {
        return cli_cluster_where(c, argc - 2, argv + 2);
    }
    if (strcmp(sub, "drain") == 0 && argc == 2) {
        rc = kvstash_cluster_drain(c);
        if (rc != 0) {
            return cli_cluster_fail(c, "cluster drain", rc);
        }
        printf("draining: the node hands its keys off, then leaves the pool\n");
        return 0;
    }
    fprintf(stderr, "usage: kvstash [-H host:port | -S socket] [-t timeout_ms] %s\n",
            CLI_CLUSTER_USAGE);
    return 2;
}

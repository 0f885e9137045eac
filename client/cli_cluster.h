/*
 * cli_cluster: `kvstash cluster`, the pool as the daemon sees it (docs/cluster.md):
 * members, their states and the view's revision; `cluster where KEY...`, the nodes that own
 * each key (placement computed by the daemon from its view); `cluster drain`. Takes a
 * connected client and the command's arguments (argv[0] is "cluster"), returns the CLI's
 * exit status (0 ok, 1 refused, 2 usage, 3 transport). Everything goes through kvstash.h.
 */
#ifndef CLI_CLUSTER_H
#define CLI_CLUSTER_H

struct kvstash;

int cli_cluster(struct kvstash *c, int argc, char **argv);

#endif

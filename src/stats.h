/*
 * stats: the one place where the daemon's counters are named and summed.
 * Counters themselves live where they are written (per worker, in the
 * server, in the store); stats_collect reads them all, so exporting them
 * elsewhere later (Prometheus) means one more caller, nothing else.
 */
#ifndef STATS_H
#define STATS_H

#include <stdint.h>

/*
 * stats_collect: an rpc_stats_fn. arg is the struct server. Fills up to max
 * name/value pairs and returns the count. Names are static strings.
 */
int stats_collect(void *arg, const char **names, uint64_t *values, int max);

#endif

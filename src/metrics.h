/*
 * metrics: the daemon's counters as text for machines: the Prometheus text
 * exposition format 0.0.4 (/metrics) and the stats map as one JSON object
 * (/stats). It reads what stats.c and the workers, the store and the SSD
 * tier count, with relaxed loads, from the calling thread (the HTTP thread,
 * admin.c); it never stops a worker, takes no lock of theirs and writes no
 * counter. It knows nothing of HTTP or sockets.
 *
 * Every metric it writes is listed in docs/operations.md.
 */
#ifndef METRICS_H
#define METRICS_H

#include <stddef.h>

struct server;

#define METRICS_MAX_BYTES (8u * 1024u * 1024u) /* a rendering never grows past this */

/* A growing text buffer: p (malloc'd, owned) holds len bytes. */
struct metrics_buf {
    char *p;
    size_t len;
    size_t cap;
    int failed;                 /* out of memory or past METRICS_MAX_BYTES: p is cut */
};

/*
 * metrics_render: append every metric of server s to out, Prometheus text
 * format 0.0.4. Call only once s serves (server_stats' phase at least
 * SERVER_PHASE_SERVING). Returns 0, or -ENOMEM (out->failed: the text is
 * incomplete and must not be served). Any thread.
 */
int metrics_render(struct server *s, struct metrics_buf *out);

/*
 * metrics_stats_json: append the stats map (exactly what the `stats`
 * method answers the admin tenant, stats.h) to out as one JSON object of
 * integers, then a newline. Same conditions and returns as metrics_render.
 */
int metrics_stats_json(struct server *s, struct metrics_buf *out);

/* metrics_buf_free: free out->p and empty out. */
void metrics_buf_free(struct metrics_buf *out);

#endif

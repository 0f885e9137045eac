/*
 * repl_static: a fixed view for tests and benchmarks that run the data paths without etcd
 * (repl.h, repl_static_view). Not a way to run a pool: nothing watches it, nothing changes it.
 */
#include "repl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "view.h"

int
repl_static_view(const char *spec, const char *self_id)
{
    struct cluster_view *v;
    size_t n = 1;
    char *copy, *save = NULL;
    int rc;

    for (const char *p = spec; *p != '\0'; p++) {
        n += *p == ',';
    }
    rc = view_create(n, &v);
    if (rc != 0) {
        return rc;
    }
    copy = strdup(spec);
    if (copy == NULL) {
        view_release(v);
        return -ENOMEM;
    }
    n = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        char *at = strchr(tok, '@');

        if (at == NULL || at == tok || at[1] == '\0' || (size_t)(at - tok) >= sizeof(v->nodes[0].id)
            || strlen(at + 1) >= sizeof(v->nodes[0].addr)) {
            log_error("KVSTASH_TEST_VIEW: '%s' is not id@host:port", tok);
            free(copy);
            view_release(v);
            return -EINVAL;
        }
        char *star = strchr(at + 1, '*');
        double w = 1;

        if (star != NULL) {
            char *end;
            *star = '\0';
            w = strtod(star + 1, &end);
            if (end == star + 1 || *end != '\0' || !(w >= 0)) {
                log_error("KVSTASH_TEST_VIEW: bad weight in '%s'", tok);
                free(copy);
                view_release(v);
                return -EINVAL;
            }
        }
        *at = '\0';
        snprintf(v->nodes[n].id, sizeof(v->nodes[n].id), "%s", tok);
        snprintf(v->nodes[n].addr, sizeof(v->nodes[n].addr), "%s", at + 1);
        v->nodes[n].weight = w;
        v->nodes[n].state = VIEW_ACTIVE;
        n++;
    }
    free(copy);
    v->n = n;
    v->revision = 1;
    view_seal(v, self_id);
    log_warn("cluster: a fixed test view of %zu nodes (KVSTASH_TEST_VIEW), this node %d", n,
             v->self);
    view_publish(v);
    return 0;
}

/*
 * view: the current membership view, one pointer under a mutex, and placement over a view's
 * ACTIVE members. A view is allocated with a hidden tail after nodes[n]: the cached
 * placement hash of each node id and a sealed flag, filled by view_seal before the view is
 * shared, so view_owners hashes only the key. This module makes no I/O and never logs.
 */
#include "view.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "place.h"

/* What follows nodes[n] in the allocation. */
struct view_tail {
    int sealed;
    uint64_t hash[];       /* place_hash of nodes[i].id */
};

_Static_assert(sizeof(struct cluster_view) % 8 == 0 && sizeof(struct view_node) % 8 == 0,
               "the hidden tail after nodes[n] must be 8-byte aligned");

static pthread_mutex_t view_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cluster_view *view_current;
static uint64_t view_gen;          /* bumped under view_lock, read without it */

static struct view_tail *
view_tail_of(const struct cluster_view *v)
{
    /* sizeof(struct view_node) is a multiple of 8 (it holds a double), and so is the head. */
    return (struct view_tail *)(void *)((char *)(uintptr_t)v + sizeof(*v) +
                                        v->n * sizeof(struct view_node));
}

int
view_create(size_t n, struct cluster_view **out)
{
    struct cluster_view *v;
    size_t size;

    if (n > VIEW_NODES_MAX) {
        return -EINVAL;
    }
    size = sizeof(*v) + n * sizeof(struct view_node) + sizeof(struct view_tail) +
           n * sizeof(uint64_t);
    v = calloc(1, size);
    if (v == NULL) {
        return -ENOMEM;
    }
    v->refs = 1;
    v->self = -1;
    v->n = n;
    for (size_t i = 0; i < n; i++) {
        v->nodes[i].state = VIEW_JOINING;
    }
    *out = v;
    return 0;
}

static int
view_node_cmp(const void *a, const void *b)
{
    return strcmp(((const struct view_node *)a)->id, ((const struct view_node *)b)->id);
}

void
view_seal(struct cluster_view *v, const char *self_id)
{
    struct view_tail *t = view_tail_of(v);

    qsort(v->nodes, v->n, sizeof(v->nodes[0]), view_node_cmp);
    for (size_t i = 0; i < v->n; i++) {
        v->nodes[i].id[sizeof(v->nodes[i].id) - 1] = '\0';
        v->nodes[i].addr[sizeof(v->nodes[i].addr) - 1] = '\0';
        t->hash[i] = place_hash(v->nodes[i].id, strlen(v->nodes[i].id));
    }
    t->sealed = 1;
    if (self_id != NULL) {
        v->self = view_find(v, self_id);
    }
}

void
view_publish(struct cluster_view *v)
{
    struct cluster_view *old;

    if (v != NULL && !view_tail_of(v)->sealed) {
        char self[sizeof(v->nodes[0].id)] = "";

        if (v->self >= 0 && (size_t)v->self < v->n) {
            memcpy(self, v->nodes[v->self].id, sizeof(self));
        }
        view_seal(v, self[0] != '\0' ? self : NULL);
    }
    pthread_mutex_lock(&view_lock);
    old = view_current;
    view_current = v;
    __atomic_add_fetch(&view_gen, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&view_lock);
    view_release(old);
}

uint64_t
view_generation(void)
{
    return __atomic_load_n(&view_gen, __ATOMIC_ACQUIRE);
}

struct cluster_view *
view_acquire(void)
{
    struct cluster_view *v;

    pthread_mutex_lock(&view_lock);
    v = view_current;
    if (v != NULL) {
        __atomic_add_fetch(&v->refs, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&view_lock);
    return v;
}

void
view_release(struct cluster_view *v)
{
    unsigned left;

    if (v == NULL) {
        return;
    }
    left = __atomic_sub_fetch(&v->refs, 1, __ATOMIC_ACQ_REL);
    if (left == 0) {
        free(v);
    } else if (left == (unsigned)-1) {
        fprintf(stderr, "view_release: reference count underflow on view %p\n", (void *)v);
        abort();
    }
}

size_t
view_owners(const struct cluster_view *v, const void *key, size_t klen, unsigned r,
            size_t *out)
{
    const struct view_tail *t = view_tail_of(v);
    uint64_t hk = place_hash(key, klen);
    struct place_top top;

    place_top_init(&top, r);
    for (size_t i = 0; i < v->n && top.r > 0; i++) {
        const struct view_node *nd = &v->nodes[i];
        uint64_t hn;

        if (nd->state != VIEW_ACTIVE) {
            continue;
        }
        hn = t->sealed ? t->hash[i] : place_hash(nd->id, strlen(nd->id));
        place_top_offer(&top, i, nd->id, place_score(place_pair(hn, hk), nd->weight));
    }
    for (unsigned i = 0; i < top.n; i++) {
        out[i] = top.idx[i];
    }
    return top.n;
}

static const char *const view_state_names[] = {
    [VIEW_JOINING] = "joining",
    [VIEW_ACTIVE] = "active",
    [VIEW_DRAINING] = "draining",
};

const char *
view_state_name(enum view_state s)
{
    if ((unsigned)s < sizeof(view_state_names) / sizeof(view_state_names[0])) {
        return view_state_names[s];
    }
    return "?";
}

int
view_state_parse(const char *s, enum view_state *out)
{
    for (unsigned i = 0; i < sizeof(view_state_names) / sizeof(view_state_names[0]); i++) {
        if (strcmp(s, view_state_names[i]) == 0) {
            *out = (enum view_state)i;
            return 0;
        }
    }
    return -1;
}

int
view_find(const struct cluster_view *v, const char *id)
{
    size_t lo = 0, hi = v->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(v->nodes[mid].id, id);

        if (c == 0) {
            return (int)mid;
        }
        if (c < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return -1;
}

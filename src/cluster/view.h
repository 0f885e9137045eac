/*
 * view: the membership view the workers read. A struct cluster_view is one immutable
 * snapshot of the pool's members (from etcd, made by member.c); the current one is
 * published with view_publish and read with view_acquire/view_release from any thread.
 *
 * Threads and lifetime: the current view is one global pointer under a mutex held for a
 * pointer copy and a reference increment (view_acquire is cheap enough per request; a
 * worker may also keep one reference per loop turn and compare `revision`). References are
 * atomic; the view is freed by whichever view_release drops the last one. The publisher
 * holds one reference on behalf of "current" until the next view_publish. Nothing in a
 * published view changes: readers never lock to read it.
 *
 * A single-node daemon (cluster_name "") never publishes: view_acquire returns NULL, and
 * callers go on as one node.
 */
#ifndef VIEW_H
#define VIEW_H

#include <stddef.h>
#include <stdint.h>

/* A member's state, as registered in etcd ("joining", "active", "draining"). */
enum view_state { VIEW_JOINING, VIEW_ACTIVE, VIEW_DRAINING };

/* One member. Only ACTIVE members own keys (view_owners). */
struct view_node {
    char id[65];           /* node_id, NUL-terminated */
    char addr[256];        /* peer_advertise host:port, NUL-terminated */
    char tls[256];         /* its TLS listener as peers dial it (host:port), "" = none */
    double weight;         /* node_weight, > 0 */
    enum view_state state;
};

/*
 * One snapshot of the pool, nodes sorted by id (bytes as unsigned). revision: the etcd
 * revision it was read at (increases from view to view). self: this daemon's index in
 * nodes, or -1 when it is not (yet, or no longer) registered. refs: see view_acquire.
 */
struct cluster_view {
    uint64_t revision;
    unsigned refs;
    int self;
    size_t n;
    struct view_node nodes[];
};

/*
 * view_create: a new view of n nodes, zeroed (revision 0, self -1, every node JOINING with
 * id ""), holding one reference for the caller, into *out. The caller fills it in, then
 * publishes it (view_publish) or drops it (view_release). Returns 0, -ENOMEM, or -EINVAL
 * when n is above VIEW_NODES_MAX.
 */
#define VIEW_NODES_MAX 4096
int view_create(size_t n, struct cluster_view **out);

/*
 * view_seal: sort v's nodes by id, recompute self for self_id (-1 when absent; self_id may
 * be NULL), and cache each node's placement hash, so that view_owners is O(n * r) with no
 * hashing of ids. view_publish seals; a view used unpublished (tests, a staging view) should
 * be sealed after it is filled. v must not be shared yet.
 */
void view_seal(struct cluster_view *v, const char *self_id);

/*
 * view_publish: make v (sealed or not: it is sealed here, self as already set) the current
 * view. Takes over the caller's reference. The previous view is released; it is freed when
 * its last reader releases it. A v whose revision is below the current one's is still
 * published (member.c decides order; a full re-read may legitimately restart). Any thread.
 * v NULL: the daemon leaves the pool; view_acquire returns NULL from then on.
 */
void view_publish(struct cluster_view *v);

/* view_acquire: the current view with one more reference, or NULL (single node, or not
 * published yet). Any thread; release it with view_release. */
struct cluster_view *view_acquire(void);

/*
 * view_generation: a number that changes on every view_publish (a relaxed atomic load, no
 * lock). A worker that keeps a view across requests re-acquires only when it changed:
 *     if (view_generation() != my_gen) { view_release(my); my_gen = view_generation();
 *                                        my = view_acquire(); }
 * (reading the generation before acquiring: at worst one needless re-acquire later).
 */
uint64_t view_generation(void);

/* view_release: drop one reference; the last frees v. NULL is ignored. Underflow aborts. */
void view_release(struct cluster_view *v);

/*
 * view_owners: the owners of key[0..klen) in v: indices into v->nodes of the min(r,
 * PLACE_R_MAX, ACTIVE nodes) highest-scoring ACTIVE nodes, best first (place.h's function
 * over the ACTIVE members, so place_owners over the same ids and weights gives the same
 * nodes). out has room for min(r, PLACE_R_MAX). Returns the count (0 when no node is
 * ACTIVE). Reads v only; any thread.
 */
size_t view_owners(const struct cluster_view *v, const void *key, size_t klen, unsigned r,
                   size_t *out);

/* view_state_name: "joining", "active", "draining" ("?" for anything else). */
const char *view_state_name(enum view_state s);

/* view_state_parse: the state named s into *out; 0, or -1 for an unknown name. */
int view_state_parse(const char *s, enum view_state *out);

/* view_find: the index of the node called id in v (sorted: binary search), or -1. */
int view_find(const struct cluster_view *v, const char *id);

#endif

/*
 * place: which nodes own a key. Weighted rendezvous hashing (highest random weight): every
 * node scores every key, and the r highest scores own it. Pure: no I/O, no state, no
 * allocation, no locks; safe from any thread. A node's score depends only on its own id,
 * weight and the key, so adding or removing a node moves only the keys it wins or held
 * (about r/n of them), and a node restarted under the same id owns the same keys again.
 *
 * The function, fully specified so that another implementation reproduces it bit for bit
 * (tests/cluster/place_ref.py is one; tests/unit/test_place.c pins golden vectors). All
 * arithmetic is on unsigned 64-bit integers modulo 2^64, over bytes, so it does not depend
 * on the host's byte order:
 *
 *   fnv1a64(b[0..n)):  h = 0xcbf29ce484222325; for each byte c: h = (h ^ c) * 0x100000001b3
 *   fmix64(k):         k ^= k >> 33; k *= 0xff51afd7ed558ccd; k ^= k >> 33;
 *                      k *= 0xc4ceb9fe1a85ec53; k ^= k >> 33            (MurmurHash3's)
 *   place_hash(b):     fmix64(fnv1a64(b))          node hash hn = place_hash(node id bytes,
 *                                                  no NUL); key hash hk = place_hash(key)
 *   place_pair(hn,hk): fmix64(hn ^ (hk * 0x9e3779b97f4a7c15))
 *   u:                 ((x >> 11) + 0.5) / 2^53    in (0, 1), exact in a double
 *   score:             -weight / ln(u)             IEEE-754 double, ln = C's log()
 *
 * A node with weight > 0 (and finite) competes; others (0, negative, NaN, inf) never own a
 * key. Higher score ranks first; equal scores rank the node whose id is smaller first (bytes
 * compared as unsigned, a proper prefix first). With equal weights the order is the order
 * of x alone. Expected share of keys: weight / sum of weights (r = 1), for every r the
 * simulator (tests/cluster/place_sim.c, make cluster-sim) measures it.
 */
#ifndef PLACE_H
#define PLACE_H

#include <stddef.h>
#include <stdint.h>

/* The most owners one call returns: r above it is taken as PLACE_R_MAX. */
#define PLACE_R_MAX 16

/* One candidate node. id: borrowed, NUL-terminated, any bytes; weight: see above. */
struct place_node {
    const char *id;
    double weight;
};

/*
 * place_owners: the owners of key[0..klen) among nodes[0..n): the indices (into nodes) of
 * the min(r, PLACE_R_MAX, number of nodes with a usable weight) highest-scoring nodes, best
 * first, into out (room for min(r, PLACE_R_MAX) entries). Returns how many were written; 0
 * when n or r is 0. key may be NULL when klen is 0. O(n * r) time, no allocation.
 */
size_t place_owners(const struct place_node *nodes, size_t n, const void *key, size_t klen,
                    unsigned r, size_t *out);

/* place_hash: the 64-bit hash of b[0..n) defined above (fmix64 of FNV-1a 64). */
uint64_t place_hash(const void *b, size_t n);

/* place_fmix64: MurmurHash3's 64-bit finalizer, defined above. */
static inline uint64_t
place_fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= UINT64_C(0xff51afd7ed558ccd);
    k ^= k >> 33;
    k *= UINT64_C(0xc4ceb9fe1a85ec53);
    k ^= k >> 33;
    return k;
}

/* place_pair: the 64-bit pair hash x of a node hash and a key hash, defined above. Inline:
 * it runs once per node per key. */
static inline uint64_t
place_pair(uint64_t node_hash, uint64_t key_hash)
{
    return place_fmix64(node_hash ^ (key_hash * UINT64_C(0x9e3779b97f4a7c15)));
}

/* place_score: -weight / ln(u) for the pair hash x; -1 for a weight that never owns. */
double place_score(uint64_t x, double weight);

/*
 * The running top r of a placement: what place_owners and view_owners (view.h) fill. Feed
 * every candidate with place_top_offer in any order; idx[0..n) is then best first. Plain
 * value on the caller's stack.
 */
struct place_top {
    unsigned r;                    /* how many are kept, 1..PLACE_R_MAX */
    unsigned n;                    /* how many are held so far */
    size_t idx[PLACE_R_MAX];       /* the caller's index of each, best first */
    double score[PLACE_R_MAX];
    const char *id[PLACE_R_MAX];   /* borrowed, for ties */
};

/* place_top_init: an empty top r (r clamped to 1..PLACE_R_MAX; r = 0 keeps nothing). */
void place_top_init(struct place_top *t, unsigned r);

/* place_top_offer: candidate idx with node id (borrowed until the top is read) and score
 * (place_score; a negative score is never kept). */
void place_top_offer(struct place_top *t, size_t idx, const char *id, double score);

#endif

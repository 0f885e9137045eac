/*
 * place: weighted rendezvous hashing, exactly as place.h specifies it (the constants here
 * and in place.h's inline place_pair are part of the interface: changing one moves every
 * key of every pool). No I/O, no state, no allocation. The header is the specification;
 * this file only computes it.
 */
#include "place.h"

#include <math.h>
#include <string.h>

#define PLACE_FNV_OFFSET UINT64_C(0xcbf29ce484222325)
#define PLACE_FNV_PRIME UINT64_C(0x100000001b3)

uint64_t
place_hash(const void *b, size_t n)
{
    const unsigned char *p = b;
    uint64_t h = PLACE_FNV_OFFSET;

    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * PLACE_FNV_PRIME;
    }
    return place_fmix64(h);
}

double
place_score(uint64_t x, double weight)
{
    /* (x >> 11) has 53 bits, so u is exact and 0 < u < 1: ln(u) < 0, the score > 0. */
    double u = ((double)(x >> 11) + 0.5) / 9007199254740992.0;

    if (!(weight > 0.0) || isinf(weight)) {
        return -1.0;
    }
    return -weight / log(u);
}

/* Does (sa, ida) rank before (sb, idb)? Higher score first, then the smaller id. */
static int
place_before(double sa, const char *ida, double sb, const char *idb)
{
    if (sa != sb) {
        return sa > sb;
    }
    return strcmp(ida, idb) < 0;    /* strcmp compares as unsigned char */
}

void
place_top_init(struct place_top *t, unsigned r)
{
    t->r = r > PLACE_R_MAX ? PLACE_R_MAX : r;
    t->n = 0;
}

void
place_top_offer(struct place_top *t, size_t idx, const char *id, double score)
{
    unsigned at;

    if (score < 0.0 || t->r == 0) {
        return;
    }
    if (t->n == t->r && !place_before(score, id, t->score[t->n - 1], t->id[t->n - 1])) {
        return;
    }
    at = t->n < t->r ? t->n++ : t->n - 1;   /* full: the last one drops out */
    while (at > 0 && place_before(score, id, t->score[at - 1], t->id[at - 1])) {
        t->idx[at] = t->idx[at - 1];
        t->score[at] = t->score[at - 1];
        t->id[at] = t->id[at - 1];
        at--;
    }
    t->idx[at] = idx;
    t->score[at] = score;
    t->id[at] = id;
}

size_t
place_owners(const struct place_node *nodes, size_t n, const void *key, size_t klen,
             unsigned r, size_t *out)
{
    struct place_top top;
    uint64_t hk = place_hash(key, klen);

    place_top_init(&top, r);
    for (size_t i = 0; i < n && top.r > 0; i++) {
        const char *id = nodes[i].id;
        uint64_t x = place_pair(place_hash(id, strlen(id)), hk);

        place_top_offer(&top, i, id, place_score(x, nodes[i].weight));
    }
    for (unsigned i = 0; i < top.n; i++) {
        out[i] = top.idx[i];
    }
    return top.n;
}

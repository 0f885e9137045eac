/*
 * Unit tests for place (weighted rendezvous hashing) and view (the published membership
 * view). The golden vectors pin the placement function: tests/cluster/place_ref.py, written
 * from place.h's specification alone, prints the same table (test_place_ref.py checks it
 * against this file). Changing a vector means every pool's keys move: don't, unless the
 * function's specification changes on purpose. No network.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "place.h"
#include "view.h"

static const struct place_node golden_equal[] = {
    {"node-0", 1.0}, {"node-1", 1.0}, {"node-2", 1.0}, {"node-3", 1.0}, {"node-4", 1.0},
};
static const struct place_node golden_weighted[] = {
    {"a", 1.0}, {"b", 2.0}, {"c", 0.5}, {"d", 4.0}, {"e", 1.0}, {"f", 0.0},
};
#define EQUAL golden_equal, 5
#define WEIGHTED golden_weighted, 6

struct golden {
    const struct place_node *nodes;
    size_t n;
    const char *key;
    size_t klen;
    unsigned r;
    size_t count;
    size_t owners[3];
};

/* GOLDEN-BEGIN (test_place_ref.py reads the rows between the markers) */
static const struct golden golden[] = {
    {EQUAL,    "", 0, 1, 1, {0, 0, 0}},
    {EQUAL,    "", 0, 2, 2, {0, 2, 0}},
    {EQUAL,    "", 0, 3, 3, {0, 2, 4}},
    {EQUAL,    "\x6b", 1, 1, 1, {4, 0, 0}},
    {EQUAL,    "\x6b", 1, 2, 2, {4, 2, 0}},
    {EQUAL,    "\x6b", 1, 3, 3, {4, 2, 3}},
    {EQUAL,    "\x6b\x65\x79\x2d\x31", 5, 1, 1, {4, 0, 0}},
    {EQUAL,    "\x6b\x65\x79\x2d\x31", 5, 2, 2, {4, 0, 0}},
    {EQUAL,    "\x6b\x65\x79\x2d\x31", 5, 3, 3, {4, 0, 2}},
    {EQUAL,    "\x6b\x65\x79\x2d\x32", 5, 1, 1, {3, 0, 0}},
    {EQUAL,    "\x6b\x65\x79\x2d\x32", 5, 2, 2, {3, 4, 0}},
    {EQUAL,    "\x6b\x65\x79\x2d\x32", 5, 3, 3, {3, 4, 0}},
    {EQUAL,    "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"
        "\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f", 32, 1, 1, {2, 0, 0}},
    {EQUAL,    "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"
        "\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f", 32, 2, 2, {2, 1, 0}},
    {EQUAL,    "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"
        "\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f", 32, 3, 3, {2, 1, 3}},
    {EQUAL,    "\xff\xff\xff\xff\xff\xff\xff", 7, 1, 1, {3, 0, 0}},
    {EQUAL,    "\xff\xff\xff\xff\xff\xff\xff", 7, 2, 2, {3, 4, 0}},
    {EQUAL,    "\xff\xff\xff\xff\xff\xff\xff", 7, 3, 3, {3, 4, 1}},
    {EQUAL,    "\x70\x72\x65\x66\x69\x78\x2f\x30\x2f\x31\x2f\x32", 12, 1, 1, {0, 0, 0}},
    {EQUAL,    "\x70\x72\x65\x66\x69\x78\x2f\x30\x2f\x31\x2f\x32", 12, 2, 2, {0, 3, 0}},
    {EQUAL,    "\x70\x72\x65\x66\x69\x78\x2f\x30\x2f\x31\x2f\x32", 12, 3, 3, {0, 3, 2}},
    {WEIGHTED, "", 0, 1, 1, {3, 0, 0}},
    {WEIGHTED, "", 0, 2, 2, {3, 1, 0}},
    {WEIGHTED, "", 0, 3, 3, {3, 1, 4}},
    {WEIGHTED, "\x6b", 1, 1, 1, {3, 0, 0}},
    {WEIGHTED, "\x6b", 1, 2, 2, {3, 1, 0}},
    {WEIGHTED, "\x6b", 1, 3, 3, {3, 1, 4}},
    {WEIGHTED, "\x6b\x65\x79\x2d\x31", 5, 1, 1, {3, 0, 0}},
    {WEIGHTED, "\x6b\x65\x79\x2d\x31", 5, 2, 2, {3, 0, 0}},
    {WEIGHTED, "\x6b\x65\x79\x2d\x31", 5, 3, 3, {3, 0, 1}},
    {WEIGHTED, "\x6b\x65\x79\x2d\x32", 5, 1, 1, {3, 0, 0}},
    {WEIGHTED, "\x6b\x65\x79\x2d\x32", 5, 2, 2, {3, 1, 0}},
    {WEIGHTED, "\x6b\x65\x79\x2d\x32", 5, 3, 3, {3, 1, 4}},
    {WEIGHTED, "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"
        "\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f", 32, 1, 1, {3, 0, 0}},
    {WEIGHTED, "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"
        "\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f", 32, 2, 2, {3, 0, 0}},
    {WEIGHTED, "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"
        "\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f", 32, 3, 3, {3, 0, 1}},
    {WEIGHTED, "\xff\xff\xff\xff\xff\xff\xff", 7, 1, 1, {3, 0, 0}},
    {WEIGHTED, "\xff\xff\xff\xff\xff\xff\xff", 7, 2, 2, {3, 4, 0}},
    {WEIGHTED, "\xff\xff\xff\xff\xff\xff\xff", 7, 3, 3, {3, 4, 1}},
    {WEIGHTED, "\x70\x72\x65\x66\x69\x78\x2f\x30\x2f\x31\x2f\x32", 12, 1, 1, {3, 0, 0}},
    {WEIGHTED, "\x70\x72\x65\x66\x69\x78\x2f\x30\x2f\x31\x2f\x32", 12, 2, 2, {3, 0, 0}},
    {WEIGHTED, "\x70\x72\x65\x66\x69\x78\x2f\x30\x2f\x31\x2f\x32", 12, 3, 3, {3, 0, 1}},
};
/* GOLDEN-END */

Test(place, golden_vectors)
{
    for (size_t g = 0; g < sizeof(golden) / sizeof(golden[0]); g++) {
        size_t out[PLACE_R_MAX];
        size_t got = place_owners(golden[g].nodes, golden[g].n, golden[g].key, golden[g].klen,
                                  golden[g].r, out);

        cr_assert_eq(got, golden[g].count, "row %zu: %zu owners, want %zu", g, got,
                     golden[g].count);
        for (size_t i = 0; i < got; i++) {
            cr_assert_eq(out[i], golden[g].owners[i], "row %zu owner %zu: %zu, want %zu", g, i,
                         out[i], golden[g].owners[i]);
        }
    }
}

Test(place, hash_values)
{
    cr_assert_eq(place_hash("", 0), UINT64_C(0xefd01f60ba992926));
    cr_assert_eq(place_hash("node-0", 6), UINT64_C(0x74bd04f6e09fed6d));
    cr_assert_eq(place_pair(place_hash("node-0", 6), place_hash("key-1", 5)),
                 UINT64_C(0xf62fcae87b6b7a78));
}

Test(place, unusable_weights_never_own)
{
    struct place_node nodes[] = {{"a", 0.0}, {"b", -1.0}, {"c", 1.0 / 0.0}, {"d", 0.0 / 0.0}};
    size_t out[PLACE_R_MAX];

    cr_assert_eq(place_owners(nodes, 4, "k", 1, 3, out), 0);
    nodes[0].weight = 1.0;
    cr_assert_eq(place_owners(nodes, 4, "k", 1, 3, out), 1);
    cr_assert_eq(out[0], 0);
    cr_assert_eq(place_owners(nodes, 4, "k", 1, 0, out), 0, "r = 0 owns nothing");
    cr_assert_eq(place_owners(nodes, 0, NULL, 0, 2, out), 0, "no nodes, no owners");
}

Test(place, r_is_capped_and_owners_distinct)
{
    struct place_node nodes[40];
    char ids[40][16];
    size_t out[PLACE_R_MAX];
    size_t got;

    for (int i = 0; i < 40; i++) {
        snprintf(ids[i], sizeof(ids[i]), "n%d", i);
        nodes[i] = (struct place_node){ids[i], 1.0};
    }
    got = place_owners(nodes, 40, "key", 3, 100, out);
    cr_assert_eq(got, PLACE_R_MAX);
    for (size_t i = 0; i < got; i++) {
        for (size_t j = i + 1; j < got; j++) {
            cr_assert_neq(out[i], out[j]);
        }
    }
    /* a prefix: the best 2 of r = 16 are the owners of r = 2 */
    size_t two[PLACE_R_MAX];
    cr_assert_eq(place_owners(nodes, 40, "key", 3, 2, two), 2);
    cr_assert_eq(two[0], out[0]);
    cr_assert_eq(two[1], out[1]);
}

Test(place, ties_go_to_the_smaller_id)
{
    struct place_top t;

    place_top_init(&t, 2);
    place_top_offer(&t, 0, "b", 1.0);
    place_top_offer(&t, 1, "a", 1.0);
    place_top_offer(&t, 2, "c", 1.0);
    cr_assert_eq(t.n, 2);
    cr_assert_eq(t.idx[0], 1);
    cr_assert_eq(t.idx[1], 0);
}

/* A node added takes keys only for itself; a node removed gives only its own keys away. */
Test(place, join_and_leave_move_only_what_they_must)
{
    struct place_node nodes[11];
    char ids[11][16], key[16];
    size_t before[2], after[2], moved = 0;

    for (int i = 0; i < 11; i++) {
        snprintf(ids[i], sizeof(ids[i]), "n%d", i);
        nodes[i] = (struct place_node){ids[i], 1.0};
    }
    for (int k = 0; k < 20000; k++) {
        int len = snprintf(key, sizeof(key), "k%d", k);

        cr_assert_eq(place_owners(nodes, 10, key, (size_t)len, 2, before), 2);
        cr_assert_eq(place_owners(nodes, 11, key, (size_t)len, 2, after), 2);
        for (int i = 0; i < 2; i++) {
            if (after[i] != 10) {
                cr_assert(after[i] == before[0] || after[i] == before[1],
                          "key %s: owner %zu is neither old owner nor the new node", key,
                          after[i]);
            }
        }
        moved += after[0] == 10 || after[1] == 10;
    }
    /* the new node takes 2/11 of the keys: 3,636 of 20,000 expected, sigma about 55 */
    cr_assert(moved > 3300 && moved < 3950, "moved %zu of 20000 keys", moved);
}

static struct cluster_view *
make_view(size_t n, const char *const *ids, const double *w, const enum view_state *st)
{
    struct cluster_view *v;

    cr_assert_eq(view_create(n, &v), 0);
    for (size_t i = 0; i < n; i++) {
        snprintf(v->nodes[i].id, sizeof(v->nodes[i].id), "%s", ids[i]);
        snprintf(v->nodes[i].addr, sizeof(v->nodes[i].addr), "127.0.0.%zu:7431", i + 2);
        v->nodes[i].weight = w[i];
        v->nodes[i].state = st[i];
    }
    return v;
}

Test(view, owners_are_place_over_active_nodes)
{
    const char *ids[] = {"e", "a", "d", "c", "b"};
    const double w[] = {1.0, 2.0, 1.0, 0.5, 1.0};
    const enum view_state st[] = {VIEW_ACTIVE, VIEW_ACTIVE, VIEW_DRAINING, VIEW_ACTIVE,
                                  VIEW_JOINING};
    struct cluster_view *v = make_view(5, ids, w, st);
    struct place_node act[3];
    char key[16];

    view_seal(v, "c");
    cr_assert_str_eq(v->nodes[0].id, "a", "sealed views are sorted by id");
    cr_assert_eq(v->self, 2);
    cr_assert_eq(view_find(v, "e"), 4);
    cr_assert_eq(view_find(v, "zz"), -1);
    /* the active ones, in sorted order: a (2.0), c (0.5), e (1.0) */
    act[0] = (struct place_node){"a", 2.0};
    act[1] = (struct place_node){"c", 0.5};
    act[2] = (struct place_node){"e", 1.0};
    for (int k = 0; k < 2000; k++) {
        int len = snprintf(key, sizeof(key), "key%d", k);
        size_t vo[PLACE_R_MAX], po[PLACE_R_MAX];
        size_t nv = view_owners(v, key, (size_t)len, 2, vo);
        size_t np = place_owners(act, 3, key, (size_t)len, 2, po);

        cr_assert_eq(nv, np);
        for (size_t i = 0; i < nv; i++) {
            cr_assert_str_eq(v->nodes[vo[i]].id, act[po[i]].id);
            cr_assert_eq(v->nodes[vo[i]].state, VIEW_ACTIVE);
        }
    }
    view_release(v);
}

Test(view, none_active_owns_nothing)
{
    const char *ids[] = {"a", "b"};
    const double w[] = {1.0, 1.0};
    const enum view_state st[] = {VIEW_JOINING, VIEW_DRAINING};
    struct cluster_view *v = make_view(2, ids, w, st);
    size_t out[PLACE_R_MAX];

    view_seal(v, NULL);
    cr_assert_eq(v->self, -1);
    cr_assert_eq(view_owners(v, "k", 1, 2, out), 0);
    view_release(v);
}

Test(view, states_by_name)
{
    enum view_state s;

    cr_assert_eq(view_state_parse("draining", &s), 0);
    cr_assert_eq(s, VIEW_DRAINING);
    cr_assert_str_eq(view_state_name(VIEW_JOINING), "joining");
    cr_assert_eq(view_state_parse("Active", &s), -1);
    cr_assert_eq(view_create(VIEW_NODES_MAX + 1, &(struct cluster_view *){NULL}), -EINVAL);
}

/* Readers acquire and release while views are published: every view a reader holds stays
 * whole (its revision matches its nodes), and the last one published is current. */
static void *
reader_main(void *arg)
{
    long *bad = arg;

    for (int i = 0; i < 200000; i++) {
        struct cluster_view *v = view_acquire();

        if (v != NULL) {
            char want[32];

            snprintf(want, sizeof(want), "rev%llu", (unsigned long long)v->revision);
            if (v->n != 1 || strcmp(v->nodes[0].id, want) != 0) {
                (*bad)++;
            }
            view_release(v);
        }
    }
    return NULL;
}

Test(view, publish_while_readers_acquire)
{
    pthread_t th[2];
    long bad[2] = {0, 0};

    for (int i = 0; i < 2; i++) {
        cr_assert_eq(pthread_create(&th[i], NULL, reader_main, &bad[i]), 0);
    }
    for (uint64_t rev = 1; rev <= 5000; rev++) {
        struct cluster_view *v;

        cr_assert_eq(view_create(1, &v), 0);
        v->revision = rev;
        snprintf(v->nodes[0].id, sizeof(v->nodes[0].id), "rev%llu", (unsigned long long)rev);
        v->nodes[0].weight = 1.0;
        v->nodes[0].state = VIEW_ACTIVE;
        view_publish(v);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(bad[i], 0, "reader %d saw %ld torn views", i, bad[i]);
    }
    struct cluster_view *cur = view_acquire();
    cr_assert_not_null(cur);
    cr_assert_eq(cur->revision, 5000);
    cr_assert_eq(cur->refs, 2, "the current reference and ours");
    view_release(cur);
    uint64_t gen = view_generation();
    view_publish(NULL);
    cr_assert_neq(view_generation(), gen, "every publish changes the generation");
    cr_assert_null(view_acquire(), "after leaving the pool there is no view");
}

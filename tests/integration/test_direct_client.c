/*
 * Integration: direct access to the daemon's memory through libkvstash
 * (SPEC.md, "Direct access"). An object written in place between
 * kvstash_put_start and kvstash_batch_put_end reads back byte-exact with
 * kvstash_get and in place with kvstash_get_replica; a revoked one never
 * appears; the calls are refused over TCP without a word to the server.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../lib/harness.h"
#include "kvstash.h"

static struct harness h;

static void
teardown(void)
{
    harness_destroy(&h);
}

TestSuite(direct_client, .fini = teardown, .timeout = 60);

#define MIB (1024u * 1024u)

static void
fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (uint8_t)(seed >> 16);
    }
}

/* write src into the places in order; returns the bytes they hold */
static size_t
scatter(const struct kvstash_place *pl, size_t n, const uint8_t *src)
{
    size_t off = 0;

    for (size_t i = 0; i < n; i++) {
        memcpy(pl[i].ptr, src + off, pl[i].length);
        off += pl[i].length;
    }
    return off;
}

static size_t
gather(const struct kvstash_place *pl, size_t n, uint8_t *dst)
{
    size_t off = 0;

    for (size_t i = 0; i < n; i++) {
        memcpy(dst + off, pl[i].ptr, pl[i].length);
        off += pl[i].length;
    }
    return off;
}

Test(direct_client, put_in_place_then_read_in_place)
{
    struct kvstash *c = NULL;
    struct kvstash_place pl[KVSTASH_MAX_PLACES];
    static uint8_t want[3 * MIB + 77], got[3 * MIB + 77];
    size_t np = 0, vlen = 0;
    uint64_t size = 0, lease = 0;
    const void *keys[] = {"in-place"};
    size_t klens[] = {8};
    int codes[1] = {-1};
    void *base = NULL;
    size_t asize = 0;

    cr_assert_eq(harness_start(&h, NULL, HARNESS_ARGS("--memory_size=64m", "--ssd_dir=")), 0);
    cr_assert_eq(harness_client(h.unix_addr, 2000, &c), 0);
    cr_assert_eq(kvstash_map_arena(c, &base, &asize), 0, "%s", kvstash_last_error(c));
    cr_assert_not_null(base);
    cr_assert_eq(asize, 64 * MIB);

    fill(want, sizeof(want), 7);
    cr_assert_eq(kvstash_put_start(c, "in-place", 8, sizeof(want), pl, &np), 0, "%s",
                 kvstash_last_error(c));
    cr_assert_gt(np, 0);
    for (size_t i = 0; i < np; i++) {
        cr_assert((uint8_t *)pl[i].ptr >= (uint8_t *)base
                  && (uint8_t *)pl[i].ptr + pl[i].length <= (uint8_t *)base + asize);
    }
    cr_assert_eq(scatter(pl, np, want), sizeof(want));
    /* not visible before put_end; a second reservation of the key is BUSY */
    cr_assert_eq(kvstash_get(c, "in-place", 8, got, sizeof(got), &vlen), KVSTASH_ENOTFOUND);
    cr_assert_eq(kvstash_put_start(c, "in-place", 8, 10, pl, &np), KVSTASH_EBUSY);
    cr_assert_eq(kvstash_batch_put_end(c, 1, keys, klens, codes), 0);
    cr_assert_eq(codes[0], 0);
    cr_assert_eq(kvstash_get(c, "in-place", 8, got, sizeof(got), &vlen), 0);
    cr_assert_eq(vlen, sizeof(want));
    cr_assert_eq(memcmp(got, want, sizeof(want)), 0, "get returned other bytes");

    memset(got, 0, sizeof(got));
    cr_assert_eq(kvstash_get_replica(c, "in-place", 8, pl, &np, &size, &lease), 0, "%s",
                 kvstash_last_error(c));
    cr_assert_eq(size, sizeof(want));
    cr_assert_eq(lease, 10000);
    cr_assert_eq(gather(pl, np, got), sizeof(want));
    cr_assert_eq(memcmp(got, want, sizeof(want)), 0, "the replica holds other bytes");
    cr_assert_eq(kvstash_get_replica(c, "absent", 6, pl, &np, NULL, NULL), KVSTASH_ENOTFOUND);
    kvstash_close(c);
}

Test(direct_client, revoke_and_tcp)
{
    struct kvstash *c = NULL, *t = NULL;
    struct kvstash_place pl[KVSTASH_MAX_PLACES];
    const void *keys[] = {"gone", "never"};
    size_t klens[] = {4, 5};
    int codes[2] = {-1, -1};
    size_t np = 0;
    bool exists = true;

    cr_assert_eq(harness_start(&h, NULL, HARNESS_ARGS("--memory_size=16m", "--ssd_dir=")), 0);
    cr_assert_eq(harness_client(h.unix_addr, 2000, &c), 0);
    cr_assert_eq(kvstash_put_start(c, "gone", 4, MIB, pl, &np), 0);
    memset(pl[0].ptr, 1, pl[0].length);
    cr_assert_eq(kvstash_batch_put_revoke(c, 2, keys, klens, codes), 0);
    cr_assert_eq(codes[0], 0);
    cr_assert_eq(codes[1], KVSTASH_ENOTFOUND);
    cr_assert_eq(kvstash_is_exist(c, "gone", 4, &exists), 0);
    cr_assert_not(exists, "a revoked put became visible");
    cr_assert_eq(kvstash_batch_put_end(c, 1, keys, klens, codes), 0);
    cr_assert_eq(codes[0], KVSTASH_ENOTFOUND);
    /* too big for the arena */
    cr_assert_eq(kvstash_put_start(c, "huge", 4, 64 * MIB, pl, &np), KVSTASH_ENOSPACE);

    cr_assert_eq(harness_client(h.addr, 2000, &t), 0);
    cr_assert_eq(kvstash_put_start(t, "k", 1, 1, pl, &np), KVSTASH_EUNSUPPORTED);
    cr_assert_eq(kvstash_get_replica(t, "k", 1, pl, &np, NULL, NULL), KVSTASH_EUNSUPPORTED);
    cr_assert_eq(kvstash_ping(t), 0, "the refusal broke the connection");
    kvstash_close(t);
    kvstash_close(c);
}

/*
 * store_keys: keys and values the store's unit tests build in place, so that
 * every value read back can be checked byte by byte (test_store.c,
 * test_store_tier.c). Header-only; no Criterion, no store calls.
 */
#ifndef STORE_KEYS_H
#define STORE_KEYS_H

#include <stdint.h>
#include <stdio.h>

#include "store.h"

/* A key built in place: "key-<id>" in tenant `tenant`. */
struct t_key {
    struct kv_key k;
    char buf[48];
};

static inline const struct kv_key *
t_key(struct t_key *tk, uint32_t tenant, uint64_t id)
{
    int n = snprintf(tk->buf, sizeof(tk->buf), "key-%llu", (unsigned long long)id);

    tk->k.tenant = tenant;
    tk->k.len = (uint32_t)n;
    tk->k.ptr = (const uint8_t *)tk->buf;
    return &tk->k;
}

/* t_byte: the value byte at offset i of object id, so any read can be checked. */
static inline uint8_t
t_byte(uint64_t id, uint64_t i)
{
    return (uint8_t)(id * 131u + i * 7u + (i >> 12) * 13u);
}

static inline void
t_fill(uint8_t *buf, uint64_t id, uint64_t len)
{
    for (uint64_t i = 0; i < len; i++) {
        buf[i] = t_byte(id, i);
    }
}

#endif

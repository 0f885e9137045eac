/*
 * store_hash: the key hash of the store's table (store_hash64 in store.h),
 * kept apart from the table code because nothing else in it depends on the
 * table. Its one piece of state is a per-process secret mixed into every
 * hash, so that a client cannot pick keys that all land in one chain
 * (hash flooding); nothing hashed is ever stored, so the secret may change
 * with every start.
 */
#include "store.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* ---- hash ---- */

#define STORE_K0 0xa0761d6478bd642full
#define STORE_K1 0xe7037ed1a0b428dbull
#define STORE_K2 0x8ebc6af09c88c6e3ull
#define STORE_K3 0x589965cc75374cc3ull

__extension__ typedef unsigned __int128 store_u128;

static uint64_t store_secret;  /* written once, before the first store exists */
static pthread_once_t store_secret_once = PTHREAD_ONCE_INIT;

static void
store_secret_make(void)
{
    uint64_t v = 0;

    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v)) {
        struct timespec ts;

        /* No entropy yet (early boot): still differs per process and start. */
        clock_gettime(CLOCK_MONOTONIC, &ts);
        v = ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 16);
    }
    store_secret = v;
}

void
store_hash_init(void)
{
    pthread_once(&store_secret_once, store_secret_make);
}

/* store_mum: the 64x64->128 multiply folded to 64 bits, the whole mixing step. */
static inline uint64_t
store_mum(uint64_t a, uint64_t b)
{
    store_u128 r = (store_u128)a * b;

    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

static inline uint64_t
store_load64(const uint8_t *p)
{
    uint64_t v;

    memcpy(&v, p, sizeof(v));
    return v;
}

static inline uint64_t
store_load32(const uint8_t *p)
{
    uint32_t v;

    memcpy(&v, p, sizeof(v));
    return v;
}

/*
 * A multiply-fold hash in the wyhash style: 16 bytes per step, each step one
 * 128-bit multiply of the two input words keyed with constants and the
 * running state; three independent lanes above 48 bytes; the last 16 bytes
 * read as two (possibly overlapping) words, so no byte loop. The tenant
 * seeds the state and the length goes into the final fold, so overlapping
 * tails cannot collide across lengths. About 20 cycles for a 40-byte key.
 * Loads are native-endian: stable on one machine, which is all sharding needs.
 */
uint64_t
store_hash64(const struct kv_key *key)
{
    const uint8_t *p = key->ptr;
    size_t len = key->len;
    uint64_t seed = store_mum((uint64_t)key->tenant ^ STORE_K0 ^ store_secret, STORE_K1);
    uint64_t a;
    uint64_t b;

    if (len <= 16) {
        if (len >= 8) {
            a = store_load64(p);
            b = store_load64(p + len - 8);
        } else if (len >= 4) {
            a = store_load32(p);
            b = store_load32(p + len - 4);
        } else if (len > 0) {
            a = ((uint64_t)p[0] << 16) | ((uint64_t)p[len >> 1] << 8) | p[len - 1];
            b = 0;
        } else {
            a = 0;
            b = 0;
        }
    } else {
        size_t left = len;

        if (left > 48) {
            uint64_t s1 = seed;
            uint64_t s2 = seed;

            do {
                seed = store_mum(store_load64(p) ^ STORE_K1, store_load64(p + 8) ^ seed);
                s1 = store_mum(store_load64(p + 16) ^ STORE_K2, store_load64(p + 24) ^ s1);
                s2 = store_mum(store_load64(p + 32) ^ STORE_K3, store_load64(p + 40) ^ s2);
                p += 48;
                left -= 48;
            } while (left > 48);
            seed ^= s1 ^ s2;
        }
        while (left > 16) {
            seed = store_mum(store_load64(p) ^ STORE_K1, store_load64(p + 8) ^ seed);
            p += 16;
            left -= 16;
        }
        a = store_load64(p + left - 16);
        b = store_load64(p + left - 8);
    }
    return store_mum(STORE_K1 ^ len, store_mum(a ^ STORE_K1, b ^ seed));
}

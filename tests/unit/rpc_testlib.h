/*
 * rpc_testlib: what the Criterion tests of the method handlers share
 * (test_rpc.c: src/rpc/rpc.c; test_rpc_put.c: src/rpc/rpc_put.c). T is the
 * environment of one test: a real in-process store (32 MiB arena), an rpc_ctx
 * with the limits below, an outq. Requests are packed with msgpack-c and handed
 * to rpc_dispatch as exact-size heap copies; the reply bytes are drained from
 * the outq and decoded with msgpack-c's unpacker (decoded objects stay valid
 * until the test ends). Every check fails the calling test with cr_assert.
 *
 * The suite `rpc` (TestSuite in rpc_testlib.c) sets T up before and tears it
 * down after every test of both files; each test runs in its own process.
 */
#ifndef RPC_TESTLIB_H
#define RPC_TESTLIB_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "outq.h"
#include "rpc.h"
#include "store.h"

struct mp_hole;

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

#define T_KEY_MAX 64u              /* max_key_size in force */
#define T_VALUE_MAX (256u * 1024u) /* max_value_size in force */
#define T_BATCH_MAX 8u             /* max_batch in force */
#define T_MAX_REPLIES 64

/* the environment of one test (each Criterion test runs in its own process) */
struct t_env {
    struct store *s;
    struct rpc_server srv;
    struct rpc_limits lim;
    struct rpc_counters ctr;
    struct rpc_ctx ctx;
    struct outq out;
    msgpack_sbuffer sb; /* the request being built */
    msgpack_packer pk;
    uint64_t next_id;
    uint64_t msgid;               /* msgid of the last request begun */
    uint8_t *bufs[T_MAX_REPLIES]; /* drained reply bytes (decoded objects point into them) */
    msgpack_unpacked ups[T_MAX_REPLIES];
    int nbufs, nups;
    int stats_calls;
    void *stats_arg_seen;
};

extern struct t_env T;

/* ---- building requests ---- */

/* t_raw: start a new message from scratch (nothing packed yet). */
msgpack_packer *t_raw(void);
/* t_req: start [0, msgid, method, [<nparams params follow>]]; msgid is fresh. */
msgpack_packer *t_req(const char *method, uint32_t nparams);
void t_bin(msgpack_packer *pk, const void *p, size_t n);
/* t_k: a C string packed as a bin key. */
void t_k(msgpack_packer *pk, const char *s);
void t_s(msgpack_packer *pk, const char *s);
/* t_keys: an array of C-string bin keys. */
void t_keys(msgpack_packer *pk, const char *const *ks, uint32_t n);
uint8_t *t_dup(const void *p, size_t n);
/* t_pattern: len bytes that differ with seed and position. */
uint8_t *t_pattern(size_t len, uint32_t seed);

/* ---- dispatching and decoding ---- */

/* t_dispatch_holes: dispatch the built message (an exact-size copy) with holes. */
int t_dispatch_holes(const struct mp_hole *holes, size_t nholes);
/* t_drain: every queued reply byte, in order; the outq is empty afterwards. */
uint8_t *t_drain(size_t *len);
/* t_replies: decode every drained message into out[0..max); asserts nothing is left over. */
int t_replies(msgpack_object *out, int max);
/* t_call: dispatch the built request; exactly one reply message comes back. */
msgpack_object t_call_holes(const struct mp_hole *holes, size_t nholes);
msgpack_object t_call(void);
bool t_str_is(const msgpack_object *o, const char *s);
void t_is_uint(const msgpack_object *o, uint64_t v);
void t_is_nil(const msgpack_object *o);
void t_is_bin(const msgpack_object *o, const void *p, size_t n);
/* t_response: check [1, msgid, error, result] and return the 4 elements. */
const msgpack_object *t_response(const msgpack_object *o, uint64_t msgid);
/* t_ok: a success response to msgid; returns its result. */
const msgpack_object *t_ok_id(msgpack_object o, uint64_t msgid);
const msgpack_object *t_ok(msgpack_object o);
/* t_err: a request-level error [code, name, message] for msgid; result nil. */
void t_err_id(msgpack_object o, uint64_t msgid, int code, const char *name);
void t_err(msgpack_object o, int code, const char *name);
/* t_codes: result is an array of exactly these per-key codes. */
void t_codes(const msgpack_object *r, const int *codes, uint32_t n);

/* ---- client-style shortcuts ---- */

/* t_put: put key -> value (inline); returns the per-key code. */
uint64_t t_put(const char *key, const void *v, size_t n);
void t_put_str(const char *key, const char *v);
/* t_get: the decoded result of get key (bin or nil). */
const msgpack_object *t_get(const char *key);
struct store_stats t_stats(void);

#endif

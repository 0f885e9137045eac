/*
 * rpc_spill: the decision made while a put's value is still on the wire:
 * receive it straight into a store reservation, discard it, or buffer it
 * (protocol/frame.h calls such values holes). The connection asks it per
 * value as bytes arrive (rpc_spill_take); the put path reads the outcome
 * from the hole's tag when the message is dispatched (rpc_put.c), and
 * rpc_dispatch aborts what no handler committed. It reads the message
 * prefix only; it never answers, never touches sockets or the event loop,
 * and reaches objects only through storage/store.h.
 */
#ifndef RPC_SPILL_H
#define RPC_SPILL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct mp_hole;
struct rpc_ctx;
struct store_obj;

/*
 * A put value received straight into the store: its reservation, or why none.
 * rpc_dispatch may abort the reservation itself (a batch_put key repeated
 * after an inline copy: the first copy is the one stored) and set code to a
 * value of its own; the caller keeps the struct unchanged across -EAGAIN.
 */
struct rpc_spill {
    struct store_obj *obj;   /* RESERVED object holding the value, or NULL */
    int code;                /* when obj is NULL: the key's outcome (EXISTS, BUSY, ...) */
    bool sum;                /* in a pool: the connection computes the value's CRC-32C as */
    uint32_t crc;            /* its bytes land (crc so far) and records it on obj at the end */
};

/* Where the spill decision has got to within one message (reset per message). */
struct rpc_spill_cursor {
    int state;               /* 0 = not parsed yet, 1 = put, 2 = batch_put, 3 = peer_put,
                                -1 = decline all */
    uint32_t tenant;         /* peer_put: the tenant its keys belong to (its first param) */
    uint32_t nkeys;
    uint32_t key_idx;        /* index of the key at key_off */
    size_t key_off;          /* message offset of key number key_idx */
};

/* rpc_spill_reset: start a new message. */
void rpc_spill_reset(struct rpc_spill_cursor *cur);

/*
 * rpc_spill_take: a str/bin (is_bin) of vlen bytes at path[0..depth) of the
 * message whose first len bytes are msg (with the holes spilled so far) is
 * about to arrive. Returns 1 and fills *sp when its bytes must not go to the
 * connection buffer:
 *   - the value of a put or batch_put: sp->obj is a reservation to receive
 *     it into, or NULL with sp->code saying why the key cannot be stored
 *     (the bytes are then discarded); sp->sum is set in a pool (the value
 *     goes to other nodes with its CRC-32C, or came from one with it: summed
 *     while its bytes are in cache); sp->code -EAGAIN means the key must
 *     wait for DRAM room the SSD tier is freeing: the caller leaves the
 *     value on the wire and asks again later with the same arguments;
 *   - anything else longer than max_key_size: sp->obj is NULL and the bytes
 *     are discarded; a key there reads as one over max_key_size (answered
 *     per key as usual), anything else as a bad parameter. Memory stays flat
 *     whatever a client declares.
 * Otherwise returns 0: buffer it like any other bytes.
 */
int rpc_spill_take(struct rpc_ctx *ctx, struct rpc_spill_cursor *cur, const uint8_t *msg,
                   size_t len, const struct mp_hole *holes, size_t nholes, const uint32_t *path,
                   int depth, uint64_t vlen, int is_bin, struct rpc_spill *sp);
#endif

/*
 * resp_cmd: the Redis-protocol (RESP2) commands of the resp_listen port, as
 * the connection code sees them: a command scanned by protocol/resp.c goes
 * to resp_dispatch, which answers it with exactly one RESP2 reply appended
 * to the connection's outq (values by reference from the store, as the
 * msgpack get does); the bulk values of SET and MSET big enough to matter
 * are received straight into store reservations while still on the wire
 * (resp_spill_take, the RESP side of rpc_spill.h). docs/resp.md lists the
 * commands and what differs from Redis (SET is write-once, no TTLs).
 *
 * It shares the msgpack port's request layer: the same struct rpc_ctx
 * (tenant, login, limits, counters), rpc_login for AUTH, the store facade
 * for keys. It never touches sockets or the event loop. Nothing in src/rpc
 * includes this header; the connection's protocol table (src/conn_proto.c)
 * does.
 *
 * Threads: event-loop thread only, as all of the request layer.
 */
#ifndef RESP_CMD_H
#define RESP_CMD_H

#include <stddef.h>
#include <stdint.h>

struct mp_hole;
struct outq;
struct rpc_ctx;
struct rpc_spill;

#define RESP_CMD_QUIT 1             /* resp_dispatch: answered; close once it is sent */
#define RESP_CMD_NAME_MAX 64        /* CLIENT SETNAME's longest name, with its NUL */

/* What one RESP connection keeps besides its rpc_ctx. */
struct resp_client {
    uint64_t id;                    /* CLIENT ID (the connection's id); set by the caller */
    char name[RESP_CMD_NAME_MAX];   /* CLIENT SETNAME; "" when none */
    uint32_t mget_next;             /* an MGET waiting for SSD loads: 1 + the index of the
                                       value it waits for, those before it (and the array
                                       header) queued already; 0: none waits */
};

/*
 * resp_spill_take: bulk number arg (vlen bytes) of the command whose first
 * len bytes are msg (its spilled bodies so far: holes[0..nholes)) is about
 * to arrive. Returns 1 and fills *sp when its bytes must not go to the
 * connection buffer:
 *   - the value of SET (argument 2) or MSET (arguments 2, 4, ...): sp->obj
 *     is a reservation under the key to receive it into, or NULL with
 *     sp->code saying why it cannot be stored (EXISTS, BUSY, TOO_LARGE,
 *     NO_SPACE, ...: the bytes are then discarded); sp->code -EAGAIN: the
 *     key waits for DRAM room the SSD tier is freeing, ask again later;
 *   - anything else longer than max_key_size: sp->obj NULL, discarded (the
 *     command answers an error for it). Memory stays flat.
 * Otherwise returns 0: buffer it.
 */
int resp_spill_take(struct rpc_ctx *ctx, const uint8_t *msg, size_t len,
                    const struct mp_hole *holes, size_t nholes, uint32_t arg, uint64_t vlen,
                    struct rpc_spill *sp);

/*
 * resp_dispatch: answer the complete command msg[0..len) (argc arguments;
 * is_inline: an inline command, whose quoted words are unescaped in place)
 * whose spilled bulks are holes[0..nholes) (tags: struct rpc_spill *).
 * Returns 0 (answered, or an empty command that needs no answer),
 * RESP_CMD_QUIT (answered; the connection closes once the reply is sent),
 * -ENOMEM, or -EAGAIN when it must wait (values being loaded from the SSD
 * tier, DRAM room being freed): the holes are kept, and the caller
 * dispatches the same command again later (ctx->final_try set once it has
 * waited long enough). Nothing was answered, but for an MGET, which queues
 * the values it has (cl->mget_next) and goes on from there: a reply bigger
 * than DRAM streams out as its values are loaded. On every other return each reservation
 * of the holes has been committed or aborted.
 */
int resp_dispatch(struct rpc_ctx *ctx, struct resp_client *cl, uint8_t *msg, size_t len,
                  int is_inline, uint32_t argc, const struct mp_hole *holes, size_t nholes,
                  struct outq *out);

/*
 * resp_notify_error: queue the error reply that precedes closing the
 * connection: "-ERR Protocol error: why" for KV_PROTOCOL_ERROR (as Redis
 * words it); Redis's "-WRONGPASS invalid username-password pair or user is
 * disabled." for KV_UNAUTHORIZED (too many failed AUTHs, a login a reload
 * withdrew; why is for the log); else "-ERR why". Returns 0 or -ENOMEM.
 */
int resp_notify_error(struct outq *out, int status, const char *why);

#endif

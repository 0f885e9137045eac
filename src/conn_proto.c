/*
 * conn_proto: the two protocols a connection may speak, as tables of the
 * calls conn.c makes at its fixed points (conn_int.h, struct conn_proto):
 * msgpack-rpc (protocol/frame.c scans, src/rpc/rpc.c answers) on the
 * listen, unix_socket and tls_listen ports, and RESP2 (protocol/resp.c
 * scans, src/rpc/resp_cmd.c answers) on the resp_* ports. A connection's
 * protocol is chosen once, at adoption, by the port it came in on.
 *
 * It only translates: the scanners' results into c->scan's outputs and
 * FRAME_* terms, the connection's buffer and holes into the request layers'
 * arguments. It reads and writes no socket, arms no event, and frees no
 * connection; all of that stays in conn.c, the same for both protocols.
 */
#include "conn_int.h"
#include "conn.h"

#include <errno.h>
#include <stdlib.h>

#include "frame.h"
#include "resp.h"
#include "resp_cmd.h"
#include "rpc.h"

/* ---- msgpack-rpc ---- */

static void
conn_mp_reset(struct conn *c)
{
    frame_scan_init(&c->scan);
    rpc_spill_reset(&c->sc);
}

static int
conn_mp_scan(struct conn *c)
{
    return frame_scan(&c->scan, c->ibuf + c->rpos, c->ilen - c->rpos, &c->flim);
}

static int
conn_mp_take(struct conn *c, struct rpc_spill *sp)
{
    return rpc_spill_take(&c->ctx, &c->sc, c->ibuf + c->rpos, c->scan.pos, c->holes, c->nholes,
                          c->scan.path, c->scan.depth, c->scan.spill_len, c->scan.spill_bin, sp);
}

static void
conn_mp_spilled(struct conn *c)
{
    frame_scan_spilled(&c->scan);
}

static void
conn_mp_decline(struct conn *c)
{
    frame_scan_decline(&c->scan);
}

static int
conn_mp_dispatch(struct conn *c)
{
    return rpc_dispatch(&c->ctx, c->ibuf + c->rpos, c->scan.pos, c->holes, c->nholes, &c->out);
}

const struct conn_proto conn_proto_msgpack = {
    .name = "msgpack",
    .prefetch = true,
    .reset = conn_mp_reset,
    .scan = conn_mp_scan,
    .take = conn_mp_take,
    .spilled = conn_mp_spilled,
    .decline = conn_mp_decline,
    .dispatch = conn_mp_dispatch,
    .notify = rpc_notify_error,
};

/* ---- RESP2 ---- */

struct conn_resp {
    struct resp_scan scan;
    struct resp_client cl;
};

static int
conn_resp_open(struct conn *c)
{
    struct conn_resp *r = calloc(1, sizeof(*r));

    if (r == NULL) {
        return -ENOMEM;
    }
    resp_scan_init(&r->scan);
    r->cl.id = c->id;
    c->proto_data = r;
    return 0;
}

static void
conn_resp_close(struct conn *c)
{
    free(c->proto_data);
    c->proto_data = NULL;
}

static void
conn_resp_reset(struct conn *c)
{
    struct conn_resp *r = c->proto_data;

    resp_scan_init(&r->scan);
    frame_scan_init(&c->scan);
}

/* conn_resp_out: the RESP scan's results as c->scan's outputs and a FRAME_* status. */
static int
conn_resp_out(struct conn *c, int st)
{
    struct conn_resp *r = c->proto_data;

    c->scan.pos = r->scan.pos;
    c->scan.wire_bytes = r->scan.wire_bytes;
    c->scan.spill_len = r->scan.spill_len;
    c->scan.spill_have = r->scan.spill_have;
    c->scan.error = r->scan.error;
    switch (st) {
    case RESP_DONE:
        return FRAME_DONE;
    case RESP_SPILL:
        return FRAME_SPILL;
    case RESP_NEED_MORE:
        return FRAME_NEED_MORE;
    default:
        return FRAME_ERROR;
    }
}

static int
conn_resp_scan(struct conn *c)
{
    struct conn_resp *r = c->proto_data;
    struct resp_limits lim = {.max_message_size = c->flim.max_message_size,
                              .max_bulk = c->w->lim.max_value_size,
                              .spill_min = c->flim.spill_min,
                              .unauthenticated = c->w->lim.require_auth && !c->ctx.authed};

    return conn_resp_out(c, resp_scan(&r->scan, c->ibuf + c->rpos, c->ilen - c->rpos, &lim));
}

static int
conn_resp_take(struct conn *c, struct rpc_spill *sp)
{
    struct conn_resp *r = c->proto_data;

    return resp_spill_take(&c->ctx, c->ibuf + c->rpos, c->scan.pos, c->holes, c->nholes,
                           r->scan.arg, r->scan.spill_len, sp);
}

static void
conn_resp_spilled(struct conn *c)
{
    struct conn_resp *r = c->proto_data;

    resp_scan_spilled(&r->scan);
}

static void
conn_resp_decline(struct conn *c)
{
    struct conn_resp *r = c->proto_data;

    resp_scan_decline(&r->scan);
}

static int
conn_resp_dispatch(struct conn *c)
{
    struct conn_resp *r = c->proto_data;
    uint32_t before = r->cl.mget_next;
    int rc = resp_dispatch(&c->ctx, &r->cl, c->ibuf + c->rpos, c->scan.pos, r->scan.is_inline,
                           r->scan.argc, c->holes, c->nholes, &c->out);

    if (rc == -EAGAIN && r->cl.mget_next != before) {
        c->wait_since = 0;          /* an MGET moved on: its next value gets the whole wait */
    }
    return rc == RESP_CMD_QUIT ? CONN_PROTO_QUIT : rc;
}

const struct conn_proto conn_proto_resp = {
    .name = "resp",
    .prefetch = false,
    .open = conn_resp_open,
    .close = conn_resp_close,
    .reset = conn_resp_reset,
    .scan = conn_resp_scan,
    .take = conn_resp_take,
    .spilled = conn_resp_spilled,
    .decline = conn_resp_decline,
    .dispatch = conn_resp_dispatch,
    .notify = resp_notify_error,
};

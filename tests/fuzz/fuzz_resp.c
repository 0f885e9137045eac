/*
 * fuzz_resp: RESP2 bytes in, replies out, against a real in-process store,
 * as a resp_listen connection drives them: the input is fed to the scanner
 * (protocol/resp.c) in pieces whose size the first byte picks; a big bulk
 * offered for spilling is, when that byte's top bit is set, received into a
 * store reservation (resp_spill_take, then the body copied in and cut out of
 * the buffer) or declined; each complete command is answered by
 * resp_dispatch (src/rpc/resp_cmd.c). The store (16 MiB) lives across
 * inputs. Nothing may crash, leak, read past the input, allocate from a
 * declared size, or answer anything but one well-formed RESP2 reply per
 * command; a refused input must say why.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "fuzz_env.h"
#include "kverr.h"
#include "mp.h"
#include "outq.h"
#include "resp.h"
#include "resp_cmd.h"
#include "rpc.h"
#include "store.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_MAX_HOLES 64

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_env_init();
    return 0;
}

/* fz_line: the length of the line at p[0..n) up to its CRLF, or abort. */
static size_t
fz_line(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++) {
        if (p[i] == '\r' && p[i + 1] == '\n') {
            return i;
        }
    }
    abort();
}

/* fz_value: one RESP2 reply value at *p; moves past it or aborts. */
static void
fz_value(const uint8_t **p, const uint8_t *end, int depth)
{
    size_t n = (size_t)(end - *p), k;
    long long v;

    if (n == 0 || depth > 8) {
        abort();
    }
    k = fz_line(*p, n);
    switch ((*p)[0]) {
    case '+':
    case '-':
    case ':':
        *p += k + 2;
        return;
    case '$':
        v = strtoll((const char *)*p + 1, NULL, 10);
        *p += k + 2;
        if (v == -1) {
            return;
        }
        if (v < 0 || (size_t)v + 2 > (size_t)(end - *p) || (*p)[v] != '\r' || (*p)[v + 1] != '\n') {
            abort();
        }
        *p += v + 2;
        return;
    case '*':
        v = strtoll((const char *)*p + 1, NULL, 10);
        *p += k + 2;
        for (long long i = 0; i < v; i++) {
            fz_value(p, end, depth + 1);
        }
        return;
    default:
        abort();
    }
}

/* fz_drain: what the socket would send: exactly `replies` whole RESP2 values. */
static void
fz_drain(struct outq *out, size_t replies)
{
    struct iovec iov[64];
    size_t total = outq_pending(out), at = 0;
    uint8_t *flat = malloc(total ? total : 1);

    if (flat == NULL) {
        abort();
    }
    while (outq_pending(out) > 0) {
        int n = outq_peek(out, iov, 64);
        size_t got = 0;

        for (int i = 0; i < n; i++) {
            memcpy(flat + at, iov[i].iov_base, iov[i].iov_len);
            at += iov[i].iov_len;
            got += iov[i].iov_len;
        }
        outq_consume(out, got);
    }
    const uint8_t *p = flat;
    for (size_t i = 0; i < replies; i++) {
        fz_value(&p, flat + at, 0);
    }
    if (p != flat + at) {
        abort();                    /* more than one reply for a command */
    }
    free(flat);
}

static void
fz_abort_holes(struct rpc_spill *spills, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        store_abort(fz_store, spills[i].obj);
        spills[i].obj = NULL;
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t steps[] = {1, 2, 3, 7, 64, 4096, SIZE_MAX};
    struct resp_limits lim = {.max_message_size = fz_lim.max_message_size,
                              .max_bulk = fz_lim.max_value_size, .spill_min = 0};
    struct mp_hole holes[FZ_MAX_HOLES];
    struct rpc_spill spills[FZ_MAX_HOLES];
    struct resp_client cl = {.id = 1};
    struct rpc_ctx ctx;
    struct outq out;
    struct resp_scan st;
    size_t step, in = 0, mlen = 0, nh = 0, replies = 0;
    bool take;
    uint8_t *buf;

    if (size == 0) {
        return 0;
    }
    step = steps[data[0] % (sizeof(steps) / sizeof(steps[0]))];
    take = (data[0] & 0x80) != 0;
    if (data[0] & 0x40) {
        lim.spill_min = 16;         /* big bulks are offered for spilling */
    }
    data++;
    size--;
    buf = malloc(size ? size : 1);  /* a command's bytes never outgrow the input */
    if (buf == NULL) {
        abort();
    }
    memset(&ctx, 0, sizeof(ctx));
    ctx.srv = &fz_srv;
    ctx.lim = &fz_lim;
    ctx.ctr = &fz_ctr;
    outq_init(&out, fz_store);
    resp_scan_init(&st);
    for (;;) {
        int rc = resp_scan(&st, buf, mlen, &lim);

        if (rc == RESP_ERROR) {
            if (st.error == NULL) {
                abort();            /* an error must say why */
            }
            break;
        }
        if (rc == RESP_NEED_MORE) {
            if (in == size) {
                break;              /* cut short by the end of the input */
            }
            size_t k = size - in < step ? size - in : step;
            memcpy(buf + mlen, data + in, k);
            mlen += k;
            in += k;
            continue;
        }
        if (rc == RESP_SPILL) {
            struct rpc_spill sp;

            if (st.pos > mlen || st.spill_have > mlen - st.pos || st.spill_len < lim.spill_min
                || st.spill_have >= st.spill_len) {
                abort();            /* a body buffered whole is not offered (resp.h) */
            }
            if (!take || nh == FZ_MAX_HOLES
                || !resp_spill_take(&ctx, buf, st.pos, holes, nh, st.arg, st.spill_len, &sp)) {
                resp_scan_decline(&st);
                continue;
            }
            if (sp.obj == NULL && sp.code == -EAGAIN) {
                abort();            /* no SSD tier: nothing waits */
            }
            spills[nh] = sp;
            holes[nh] = (struct mp_hole){.off = st.pos, .len = st.spill_len, .tag = &spills[nh]};
            nh++;
            /* the body: what is buffered, then the rest straight from the input */
            uint64_t left = st.spill_len - st.spill_have;
            if (left > size - in) {
                break;              /* cut short: a connection aborts the reservation */
            }
            if (sp.obj != NULL) {
                store_obj_write(sp.obj, 0, buf + st.pos, st.spill_have);
                store_obj_write(sp.obj, st.spill_have, data + in, left);
            }
            memmove(buf + st.pos, buf + st.pos + st.spill_have, mlen - st.pos - st.spill_have);
            mlen -= st.spill_have;
            in += left;
            resp_scan_spilled(&st);
            continue;
        }
        /* RESP_DONE */
        if (st.pos == 0 || st.pos > mlen) {
            abort();
        }
        rc = resp_dispatch(&ctx, &cl, buf, st.pos, st.is_inline, st.argc, holes, nh, &out);
        if (rc != 0 && rc != RESP_CMD_QUIT) {
            abort();                /* nothing here can wait or run out of memory */
        }
        for (size_t i = 0; i < nh; i++) {
            if (spills[i].obj != NULL) {
                abort();            /* a reservation neither committed nor aborted */
            }
        }
        replies += st.argc > 0;
        nh = 0;
        memmove(buf, buf + st.pos, mlen - st.pos);
        mlen -= st.pos;
        resp_scan_init(&st);
        if (rc == RESP_CMD_QUIT) {
            break;
        }
    }
    fz_abort_holes(spills, nh);
    fz_drain(&out, replies);
    rpc_ctx_release(&ctx);
    outq_deinit(&out);
    free(buf);
    return 0;
}

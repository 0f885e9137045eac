/*
 * fuzz_rpc: bytes in, replies out, against a real in-process store: the
 * input is split into messages by the frame validator, as a connection does,
 * and each one is decoded and dispatched (src/rpc/rpc.c and the methods
 * behind it); the replies are drained. The store (16 MiB) lives across
 * inputs, so a put of one input can be read by another. Nothing may crash,
 * leak, or answer anything but one well-formed reply per request.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "frame.h"
#include "fuzz_env.h"
#include "kverr.h"
#include "mp.h"
#include "outq.h"
#include "rpc.h"
#include "store.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_env_init();
    return 0;
}

/* fz_drain: what the socket would send: every reply must be a whole msgpack object. */
static void
fz_drain(struct outq *out)
{
    struct iovec iov[64];
    size_t total = outq_pending(out);
    uint8_t *flat = malloc(total ? total : 1);
    size_t at = 0;

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
        outq_fd_sent(out);
        outq_consume(out, got);
    }
    struct mp_reader rd;

    mp_reader_init(&rd, flat, at);
    while (rd.p < rd.end) {
        uint32_t n;

        if (mp_read_array(&rd, &n) != 0 || (n != 4 && n != 3) || mp_skip(&rd) != 0
            || mp_skip(&rd) != 0 || mp_skip(&rd) != 0 || (n == 4 && mp_skip(&rd) != 0)) {
            abort();                /* not a reply or notification */
        }
    }
    free(flat);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct frame_limits lim = {.max_message_size = fz_lim.max_message_size,
                               .max_depth = FRAME_MAX_DEPTH, .spill_min = 0};
    struct rpc_ctx ctx;
    struct outq out;
    struct frame_scan st;
    size_t start = 0;

    memset(&ctx, 0, sizeof(ctx));
    ctx.srv = &fz_srv;
    ctx.lim = &fz_lim;
    ctx.ctr = &fz_ctr;
    outq_init(&out, fz_store);
    while (start < size) {
        int rc;

        frame_scan_init(&st);
        if (frame_scan(&st, data + start, size - start, &lim) != FRAME_DONE) {
            break;                  /* malformed or cut short: a connection would close */
        }
        rc = rpc_dispatch(&ctx, data + start, st.pos, NULL, 0, &out);
        if (rc == KV_PROTOCOL_ERROR) {
            break;                  /* not a request: a connection would close */
        }
        if (rc != 0 || (rpc_pending(&ctx) && rpc_deferred_poll(&ctx, &out) != 0)) {
            abort();                /* nothing here can wait: no SSD tier, no copy threads */
        }
        start += st.pos;
    }
    fz_drain(&out);
    rpc_ctx_release(&ctx);
    outq_deinit(&out);
    return 0;
}

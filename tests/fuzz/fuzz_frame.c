/*
 * fuzz_frame: the frame validator every message passes before it is decoded
 * (protocol/frame.c). The input is fed in pieces whose sizes the first byte
 * picks (1 byte at a time up to all at once), as a socket would deliver it;
 * every message the scanner accepts is then decoded by the bounded cursor
 * (protocol/mp.c) to its end. Nothing may crash, read past the buffer, leak
 * or allocate from a declared size; an accepted message must lie within the
 * bytes given and within the limits.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "frame.h"
#include "mp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_MESSAGE (1u << 20)

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t steps[] = {1, 2, 3, 7, 64, 4096, SIZE_MAX};
    struct frame_limits lim = {.max_message_size = FUZZ_MAX_MESSAGE,
                               .max_depth = FRAME_MAX_DEPTH, .spill_min = 0};
    struct frame_scan st;
    size_t step, start = 0, have;

    if (size == 0) {
        return 0;
    }
    step = steps[data[0] % (sizeof(steps) / sizeof(steps[0]))];
    if (data[0] & 0x80) {
        lim.spill_min = 16;         /* big bins are offered for spilling, then declined */
    }
    data++;
    size--;
    frame_scan_init(&st);
    have = step < size ? step : size;
    while (start < size) {
        int rc = frame_scan(&st, data + start, have, &lim);

        if (rc == FRAME_ERROR) {
            if (st.error == NULL) {
                abort();            /* an error must say why */
            }
            return 0;
        }
        if (rc == FRAME_SPILL) {
            frame_scan_decline(&st);
            continue;
        }
        if (rc == FRAME_DONE) {
            struct mp_reader rd;

            if (st.pos == 0 || st.pos > have || st.pos > FUZZ_MAX_MESSAGE) {
                abort();
            }
            mp_reader_init(&rd, data + start, st.pos);
            if (mp_skip(&rd) != 0) {
                abort();            /* the scanner accepted what the cursor cannot read */
            }
            start += st.pos;
            frame_scan_init(&st);
            have = step < size - start ? step : size - start;
            continue;
        }
        if (have == size - start) {
            return 0;               /* a message cut short by the end of the input */
        }
        have = size - start - have < step ? size - start : have + step;
    }
    return 0;
}

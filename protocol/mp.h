/*
 * mp: a bounded msgpack cursor for decoding requests and responses in place.
 *
 * The reader walks bytes that frame_scan has already validated (or any bytes:
 * every read checks bounds and fails cleanly on truncation or a wrong type).
 * Nothing is allocated and str/bin results point into the buffer.
 *
 * Holes: a message whose big bin bodies were received straight into the
 * store (see frame.h) is kept in the buffer without those bodies. A hole
 * records where such a body would have started; mp_read_bin_ref reports the
 * hole instead of reading past the buffer. Other reads never see holes
 * because holes only stand where a bin body stood.
 *
 * Encoding uses msgpack-c's packer (msgpack/pack.h); mp_pack_* below only
 * add the few shapes the protocol repeats.
 */
#ifndef MP_H
#define MP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct msgpack_packer;

enum mp_type {
    MP_END = 0,   /* no bytes left */
    MP_INVALID,   /* reserved or truncated header */
    MP_NIL, MP_BOOL, MP_UINT, MP_INT, MP_FLOAT, MP_STR, MP_BIN, MP_ARRAY, MP_MAP, MP_EXT
};

struct mp_hole {
    size_t off;      /* buffer offset where the bin body would start */
    uint64_t len;    /* body length on the wire */
    void *tag;       /* caller data (e.g. the store object that received it) */
};

struct mp_reader {
    const uint8_t *base;
    const uint8_t *p;
    const uint8_t *end;
    const struct mp_hole *holes;  /* sorted by off; may be NULL */
    size_t nholes;
};

/* mp_reader_init: read buf[0..len) with no holes. */
void mp_reader_init(struct mp_reader *r, const void *buf, size_t len);

/*
 * mp_reader_holes: attach holes (borrowed; sorted by off). As reads move
 * forward, r->holes/r->nholes advance past the holes left behind.
 */
void mp_reader_holes(struct mp_reader *r, const struct mp_hole *holes, size_t n);

/* mp_peek: the type of the next object without consuming it. */
enum mp_type mp_peek(const struct mp_reader *r);

/*
 * Readers: each consumes one object of the named type and returns 0, or
 * returns -1 and leaves the cursor where it was (wrong type or truncated).
 * mp_read_uint accepts non-negative ints of any width; mp_read_int any int
 * that fits in int64_t. mp_read_key accepts bin or str (keys are binary-safe).
 * mp_read_array/mp_read_map count as truncated a count larger than the bytes
 * left could hold (one byte per element at least, holes included).
 */
int mp_read_nil(struct mp_reader *r);
int mp_read_bool(struct mp_reader *r, bool *v);
int mp_read_uint(struct mp_reader *r, uint64_t *v);
int mp_read_int(struct mp_reader *r, int64_t *v);
int mp_read_array(struct mp_reader *r, uint32_t *n);
int mp_read_map(struct mp_reader *r, uint32_t *n);
int mp_read_str(struct mp_reader *r, const char **s, uint32_t *len);
int mp_read_bin(struct mp_reader *r, const uint8_t **p, uint32_t *len);
int mp_read_key(struct mp_reader *r, const uint8_t **p, uint32_t *len);

/*
 * mp_read_bin_ref: read a bin that may be a hole. On a hole, *p is NULL,
 * *len is the wire length and *hole points at the hole; otherwise *hole is
 * NULL and *p and *len are the bytes in the buffer.
 */
int mp_read_bin_ref(struct mp_reader *r, const uint8_t **p, uint64_t *len,
                    const struct mp_hole **hole);

/*
 * mp_read_key_ref: read a key (bin or str) that may be a hole, as
 * mp_read_bin_ref does for bins. The daemon spills keys no valid request can
 * hold (longer than max_key_size) so they never fill its buffer; a hole here
 * means such a key.
 */
int mp_read_key_ref(struct mp_reader *r, const uint8_t **p, uint64_t *len,
                    const struct mp_hole **hole);

/* mp_skip: consume one whole object (nested up to 32 levels). 0 or -1. */
int mp_skip(struct mp_reader *r);

/* mp_str_eq: does the str/bin at p/len equal the C string s? */
bool mp_str_eq(const char *p, uint32_t len, const char *s);

/* mp_pack_error: pack the error triple [code, name, message] of a status. */
void mp_pack_error(struct msgpack_packer *pk, int status, const char *message);

/* mp_pack_cstr: pack a NUL-terminated string as str. */
void mp_pack_cstr(struct msgpack_packer *pk, const char *s);

#endif

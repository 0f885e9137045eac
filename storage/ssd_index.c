/*
 * ssd_index: the SSD tier's persistent index, kept in one LMDB environment
 * with four named databases (objects, bkeys, buckets, meta). This module owns
 * the environment, the on-disk encoding of every key and value, the growth of
 * the map on MDB_MAP_FULL, and the invariant that objects and bkeys describe
 * the same set of entries: every object entry (tenant, key) -> loc has exactly
 * one bkeys row (loc.bucket, loc.offset) -> (tenant, key), and every bkeys row
 * names an object entry at that location. It is the only file that includes
 * lmdb.h; no LMDB type, handle or pointer leaves it, and no transaction
 * outlives the call that began it. It must not read or write bucket files,
 * know the record format beyond the fields of struct idx_loc, or detect a
 * second daemon (the caller holds its own lock on the SSD directory).
 *
 * Encodings (integers in keys are big-endian so memcmp order is numeric order;
 * integers in values are little-endian with a version byte in front, so the
 * value formats can evolve):
 *
 *   objects  key    tenant u32 BE, key bytes                 (key_len <= 507)
 *                   tenant u32 BE, 0xFF, SHA-256(key bytes)  (key_len >  507)
 *            value   0 u8 version (1)
 *                    1 u8 form: 0 = the key is in the LMDB key,
 *                               1 = digest form, the full key follows at 40
 *                    2 u16 reserved 0
 *                    4 u32 crc
 *                    8 u64 bucket
 *                   16 u64 offset
 *                   24 u64 length
 *                   32 u32 flags
 *                   36 u32 reserved 0
 *                   40 key bytes (digest form only)
 *   bkeys    key    bucket u64 BE, offset u64 BE
 *            value  tenant u32 BE, key bytes
 *   buckets  key    id u64 BE
 *            value   0 u8 version (1), 1 u8[3] reserved 0, 4 u32 flags,
 *                    8 u64 created_ms, 16 u64 last_read_ms, 24 u64 live_bytes,
 *                   32 u64 total_bytes, 40 u32 owner (0: shared),
 *                   44 u32 reserved 0
 *   meta     key    name bytes (no NUL)
 *            value   0 u8 version (1), 1 u8[7] reserved 0, 8 u64 value
 *
 * The direct/digest threshold is a constant of the format, not the library's
 * mdb_env_get_maxkeysize(), so an index stays readable by an LMDB built with a
 * different key limit (idx_open refuses a library whose limit is below 511).
 * An entry matches a lookup only when its full key (from the LMDB key or, in
 * digest form, from the value) equals the key looked up; a slot held by a
 * different key (a SHA-256 collision, or a 33-byte short key spelling
 * 0xFF + digest) reads as absent and is replaced by a put of the new key.
 */
#include "ssd_index.h"

#include "kverr.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define IDX_FORMAT_VERSION 1u
#define IDX_DIRECT_KEY_MAX 507u                /* longest key stored in the LMDB key itself */
#define IDX_MKEY_MAX (4u + IDX_DIRECT_KEY_MAX) /* 511: LMDB's default key limit */
#define IDX_DIGEST_MARK 0xFFu
#define IDX_DIGEST_MKEY (4u + 1u + SHA256_DIGEST_LENGTH)
#define IDX_OBJ_VAL_SIZE 40u
#define IDX_OBJ_FORM_DIRECT 0u
#define IDX_OBJ_FORM_DIGEST 1u
#define IDX_BUCKET_VAL_SIZE 48u
#define IDX_META_VAL_SIZE 16u
#define IDX_BKEY_SIZE 16u
#define IDX_MIN_MAP (1ull << 20)

struct idx {
    MDB_env *env;
    MDB_dbi objects;
    MDB_dbi bkeys;
    MDB_dbi buckets;
    MDB_dbi meta;
    uint64_t map_size; /* the environment's current map */
    uint64_t max_map;  /* the map never grows past this */
    uint8_t *scratch;  /* a bkeys value copied out before the write txn changes */
    size_t scratch_cap;
    int failed; /* the map could not be remapped: the env is unusable */
};

/* Where a lookup key lands in "objects", and what it found there. */
struct idx_slot {
    uint8_t kbuf[IDX_MKEY_MAX];
    MDB_val mkey;       /* points into kbuf */
    int occupied;       /* the slot holds an entry, possibly of another key */
    int match;          /* the entry is exactly this (tenant, key) */
    struct idx_loc loc; /* the occupant's location (when occupied) */
};

/* A decoded objects value. key points into the LMDB value (digest form only). */
struct idx_objval {
    unsigned form;
    struct idx_loc loc;
    const uint8_t *key;
    size_t key_len;
};

/* ---- byte order ---- */

static void
idx_put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t
idx_get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void
idx_put_be64(uint8_t *p, uint64_t v)
{
    idx_put_be32(p, (uint32_t)(v >> 32));
    idx_put_be32(p + 4, (uint32_t)v);
}

static uint64_t
idx_get_be64(const uint8_t *p)
{
    return (uint64_t)idx_get_be32(p) << 32 | idx_get_be32(p + 4);
}

static void
idx_put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t
idx_get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void
idx_put_le64(uint8_t *p, uint64_t v)
{
    idx_put_le32(p, (uint32_t)v);
    idx_put_le32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t
idx_get_le64(const uint8_t *p)
{
    return (uint64_t)idx_get_le32(p) | (uint64_t)idx_get_le32(p + 4) << 32;
}

/* ---- status ---- */

/*
 * idx_status: an LMDB result as a kverr status. LMDB returns positive errno
 * values for system failures and its own negative MDB_* codes otherwise.
 */
static int
idx_status(int rc)
{
    switch (rc) {
    case 0:
        return 0;
    case MDB_NOTFOUND:
        return KV_NOT_FOUND;
    case MDB_MAP_FULL:
    case ENOSPC:
    case EDQUOT:
        return KV_NO_SPACE;
    case MDB_TXN_FULL:
        return -E2BIG; /* one batch dirtied more pages than a txn can hold */
    case MDB_BAD_VALSIZE:
        return -EINVAL;
    case MDB_READERS_FULL:
        return -EAGAIN;
    default:
        return rc > 0 ? -rc : KV_INTERNAL;
    }
}

static void
idx_errf(char *err, size_t errlen, const char *call, const char *path, const char *why)
{
    if (err != NULL && errlen > 0) {
        snprintf(err, errlen, "%s(%s): %s", call, path, why);
    }
}

/* ---- encodings ---- */

/* idx_mkey: the objects key of (tenant, key) in buf (IDX_MKEY_MAX bytes). */
static void
idx_mkey(uint32_t tenant, const uint8_t *key, uint32_t key_len, uint8_t *buf, MDB_val *out)
{
    idx_put_be32(buf, tenant);
    if (key_len <= IDX_DIRECT_KEY_MAX) {
        if (key_len > 0) {
            memcpy(buf + 4, key, key_len);
        }
        out->mv_size = 4u + key_len;
    } else {
        buf[4] = IDX_DIGEST_MARK;
        SHA256(key, key_len, buf + 5);
        out->mv_size = IDX_DIGEST_MKEY;
    }
    out->mv_data = buf;
}

static void
idx_bkey(uint64_t bucket, uint64_t offset, uint8_t *buf, MDB_val *out)
{
    idx_put_be64(buf, bucket);
    idx_put_be64(buf + 8, offset);
    out->mv_data = buf;
    out->mv_size = IDX_BKEY_SIZE;
}

static void
idx_objval_encode(uint8_t *p, const struct idx_loc *loc, const uint8_t *key, uint32_t key_len)
{
    int digest = key_len > IDX_DIRECT_KEY_MAX;

    memset(p, 0, IDX_OBJ_VAL_SIZE);
    p[0] = IDX_FORMAT_VERSION;
    p[1] = digest ? IDX_OBJ_FORM_DIGEST : IDX_OBJ_FORM_DIRECT;
    idx_put_le32(p + 4, loc->crc);
    idx_put_le64(p + 8, loc->bucket);
    idx_put_le64(p + 16, loc->offset);
    idx_put_le64(p + 24, loc->length);
    idx_put_le32(p + 32, loc->flags);
    if (digest) {
        memcpy(p + IDX_OBJ_VAL_SIZE, key, key_len);
    }
}

/* idx_objval_decode: returns 0, or MDB_CORRUPTED for a value this version cannot read. */
static int
idx_objval_decode(const MDB_val *v, struct idx_objval *o)
{
    const uint8_t *p = v->mv_data;

    if (v->mv_size < IDX_OBJ_VAL_SIZE || p[0] != IDX_FORMAT_VERSION) {
        return MDB_CORRUPTED;
    }
    o->form = p[1];
    o->loc.crc = idx_get_le32(p + 4);
    o->loc.bucket = idx_get_le64(p + 8);
    o->loc.offset = idx_get_le64(p + 16);
    o->loc.length = idx_get_le64(p + 24);
    o->loc.flags = idx_get_le32(p + 32);
    o->key = NULL;
    o->key_len = 0;
    if (o->form == IDX_OBJ_FORM_DIRECT) {
        return v->mv_size == IDX_OBJ_VAL_SIZE ? 0 : MDB_CORRUPTED;
    }
    if (o->form != IDX_OBJ_FORM_DIGEST || v->mv_size - IDX_OBJ_VAL_SIZE <= IDX_DIRECT_KEY_MAX ||
        v->mv_size - IDX_OBJ_VAL_SIZE > UINT32_MAX) {
        return MDB_CORRUPTED;
    }
    o->key = p + IDX_OBJ_VAL_SIZE;
    o->key_len = v->mv_size - IDX_OBJ_VAL_SIZE;
    return 0;
}

static void
idx_bucket_encode(uint8_t *p, const struct idx_bucket *b)
{
    memset(p, 0, IDX_BUCKET_VAL_SIZE);
    p[0] = IDX_FORMAT_VERSION;
    idx_put_le32(p + 4, b->flags);
    idx_put_le64(p + 8, b->created_ms);
    idx_put_le64(p + 16, b->last_read_ms);
    idx_put_le64(p + 24, b->live_bytes);
    idx_put_le64(p + 32, b->total_bytes);
    idx_put_le32(p + 40, b->owner);
}

static int
idx_bucket_decode(const MDB_val *k, const MDB_val *v, struct idx_bucket *b)
{
    const uint8_t *p = v->mv_data;

    if (k->mv_size != 8 || v->mv_size != IDX_BUCKET_VAL_SIZE || p[0] != IDX_FORMAT_VERSION) {
        return MDB_CORRUPTED;
    }
    b->id = idx_get_be64(k->mv_data);
    b->flags = idx_get_le32(p + 4);
    b->created_ms = idx_get_le64(p + 8);
    b->last_read_ms = idx_get_le64(p + 16);
    b->live_bytes = idx_get_le64(p + 24);
    b->total_bytes = idx_get_le64(p + 32);
    b->owner = idx_get_le32(p + 40);
    return 0;
}

/* ---- operations inside a transaction (LMDB status codes) ---- */

/*
 * idx_slot_find: look (tenant, key) up in objects. A slot occupied by another
 * key (same digest, or a short key equal to 0xFF + digest) is occupied but
 * not a match, so it never answers for this key.
 */
static int
idx_slot_find(struct idx *x, MDB_txn *txn, uint32_t tenant, const uint8_t *key, uint32_t key_len,
              struct idx_slot *s)
{
    struct idx_objval o;
    MDB_val v;
    int rc;

    idx_mkey(tenant, key, key_len, s->kbuf, &s->mkey);
    s->occupied = 0;
    s->match = 0;
    rc = mdb_get(txn, x->objects, &s->mkey, &v);
    if (rc == MDB_NOTFOUND) {
        return 0;
    }
    if (rc != 0) {
        return rc;
    }
    rc = idx_objval_decode(&v, &o);
    if (rc != 0) {
        return rc;
    }
    s->occupied = 1;
    s->loc = o.loc;
    if (o.form == IDX_OBJ_FORM_DIRECT) {
        s->match = key_len <= IDX_DIRECT_KEY_MAX;
    } else {
        s->match = o.key_len == key_len && memcmp(o.key, key, key_len) == 0;
    }
    return 0;
}

static int
idx_bkey_del(struct idx *x, MDB_txn *txn, uint64_t bucket, uint64_t offset)
{
    uint8_t buf[IDX_BKEY_SIZE];
    MDB_val k;
    int rc;

    idx_bkey(bucket, offset, buf, &k);
    rc = mdb_del(txn, x->bkeys, &k, NULL);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* idx_obj_del_at: delete the objects entry of (tenant, key) if it is at bucket/offset. */
static int
idx_obj_del_at(struct idx *x, MDB_txn *txn, uint32_t tenant, const uint8_t *key, uint32_t key_len,
               uint64_t bucket, uint64_t offset, int *deleted)
{
    struct idx_slot s;
    int rc;

    *deleted = 0;
    rc = idx_slot_find(x, txn, tenant, key, key_len, &s);
    if (rc != 0 || !s.match || s.loc.bucket != bucket || s.loc.offset != offset) {
        return rc;
    }
    rc = mdb_del(txn, x->objects, &s.mkey, NULL);
    if (rc == 0) {
        *deleted = 1;
    }
    return rc;
}

/*
 * idx_scratch_copy: copy a bkeys value out of the map. LMDB values are valid
 * only until the next update of the transaction, and the callers update.
 */
static int
idx_scratch_copy(struct idx *x, const MDB_val *v)
{
    if (v->mv_size > x->scratch_cap) {
        uint8_t *p = realloc(x->scratch, v->mv_size);

        if (p == NULL) {
            return ENOMEM;
        }
        x->scratch = p;
        x->scratch_cap = v->mv_size;
    }
    memcpy(x->scratch, v->mv_data, v->mv_size);
    return 0;
}

/*
 * idx_bkey_evict: the record at (bucket, offset) now belongs to op's key; if
 * the bkeys row names another key, that key's entry at this location goes.
 * Never happens with a well-behaved caller (offsets are not reused within a
 * bucket) but keeps the objects/bkeys invariant whatever the caller does.
 */
static int
idx_bkey_evict(struct idx *x, MDB_txn *txn, const struct idx_op *op)
{
    uint8_t buf[IDX_BKEY_SIZE];
    MDB_val k, v;
    int deleted;
    int rc;

    idx_bkey(op->loc.bucket, op->loc.offset, buf, &k);
    rc = mdb_get(txn, x->bkeys, &k, &v);
    if (rc == MDB_NOTFOUND) {
        return 0;
    }
    if (rc != 0) {
        return rc;
    }
    if (v.mv_size < 4 || v.mv_size - 4 > UINT32_MAX) {
        return MDB_CORRUPTED;
    }
    if (idx_get_be32(v.mv_data) == op->tenant && v.mv_size - 4 == op->key_len &&
        (op->key_len == 0 || memcmp((const uint8_t *)v.mv_data + 4, op->key, op->key_len) == 0)) {
        return 0;
    }
    rc = idx_scratch_copy(x, &v);
    if (rc != 0) {
        return rc;
    }
    return idx_obj_del_at(x, txn, idx_get_be32(x->scratch), x->scratch + 4,
                          (uint32_t)(v.mv_size - 4), op->loc.bucket, op->loc.offset, &deleted);
}

/*
 * idx_obj_row_put: op's objects row under mkey, encoded straight into the page (MDB_RESERVE,
 * before any other update of this txn), with the extra MDB_ flags. 0 or LMDB's code
 * (MDB_KEYEXIST under MDB_NOOVERWRITE: nothing written).
 */
static int
idx_obj_row_put(struct idx *x, MDB_txn *txn, MDB_val *mkey, const struct idx_op *op,
                unsigned flags)
{
    MDB_val v;
    int rc;

    v.mv_size = IDX_OBJ_VAL_SIZE + (op->key_len > IDX_DIRECT_KEY_MAX ? op->key_len : 0);
    v.mv_data = NULL;
    rc = mdb_put(txn, x->objects, mkey, &v, flags | MDB_RESERVE);
    if (rc != 0) {
        return rc;
    }
    idx_objval_encode(v.mv_data, &op->loc, op->key, op->key_len);
    return 0;
}

/*
 * idx_bkey_row_put: op's bkeys row (its location -> tenant and key), with the extra MDB_
 * flags. 0 or LMDB's code (MDB_KEYEXIST under MDB_APPEND for a row not past the last:
 * nothing written).
 */
static int
idx_bkey_row_put(struct idx *x, MDB_txn *txn, const struct idx_op *op, unsigned flags)
{
    uint8_t bbuf[IDX_BKEY_SIZE];
    MDB_val k, v;
    int rc;

    idx_bkey(op->loc.bucket, op->loc.offset, bbuf, &k);
    v.mv_size = 4u + (size_t)op->key_len;
    v.mv_data = NULL;
    rc = mdb_put(txn, x->bkeys, &k, &v, flags | MDB_RESERVE);
    if (rc != 0) {
        return rc;
    }
    idx_put_be32(v.mv_data, op->tenant);
    if (op->key_len > 0) {
        memcpy((uint8_t *)v.mv_data + 4, op->key, op->key_len);
    }
    return 0;
}

static int
idx_op_obj_put(struct idx *x, MDB_txn *txn, const struct idx_op *op)
{
    const struct idx_loc *loc = &op->loc;
    struct idx_slot s;
    int rc;

    rc = idx_slot_find(x, txn, op->tenant, op->key, op->key_len, &s);
    if (rc != 0) {
        return rc;
    }
    /* The slot's occupant (this key, or a colliding one) loses its bkeys row. */
    if (s.occupied && (s.loc.bucket != loc->bucket || s.loc.offset != loc->offset)) {
        rc = idx_bkey_del(x, txn, s.loc.bucket, s.loc.offset);
        if (rc != 0) {
            return rc;
        }
    }
    rc = idx_bkey_evict(x, txn, op);
    if (rc != 0) {
        return rc;
    }

    rc = idx_obj_row_put(x, txn, &s.mkey, op, 0);
    if (rc != 0) {
        return rc;
    }
    return idx_bkey_row_put(x, txn, op, 0);
}

/*
 * idx_op_obj_append: IDX_OBJ_APPEND. MDB_NOOVERWRITE finds a new key's slot and fills it in
 * one search (a key already there, or a digest-form key whose slot needs the full-key check,
 * goes the way of idx_op_obj_put); MDB_APPEND puts the bkeys row after the last without a
 * search, and refuses (MDB_KEYEXIST) a row that is not past it, which then takes the
 * checked way. The pages MDB_APPEND fills are full, not split in halves.
 */
static int
idx_op_obj_append(struct idx *x, MDB_txn *txn, const struct idx_op *op)
{
    uint8_t mbuf[IDX_MKEY_MAX];
    MDB_val mk;
    int rc;

    if (op->key_len > IDX_DIRECT_KEY_MAX) {
        return idx_op_obj_put(x, txn, op);
    }
    idx_mkey(op->tenant, op->key, op->key_len, mbuf, &mk);
    rc = idx_obj_row_put(x, txn, &mk, op, MDB_NOOVERWRITE);
    if (rc == MDB_KEYEXIST) {
        return idx_op_obj_put(x, txn, op);
    }
    if (rc != 0) {
        return rc;
    }
    rc = idx_bkey_row_put(x, txn, op, MDB_APPEND);
    if (rc == MDB_KEYEXIST) {
        /* Not past the last row: a row of another key may sit at this location. */
        rc = idx_bkey_evict(x, txn, op);
        if (rc == 0) {
            rc = idx_bkey_row_put(x, txn, op, 0);
        }
    }
    return rc;
}

static int
idx_op_obj_del(struct idx *x, MDB_txn *txn, const struct idx_op *op)
{
    int deleted;
    int rc;

    rc = idx_obj_del_at(x, txn, op->tenant, op->key, op->key_len, op->loc.bucket, op->loc.offset,
                        &deleted);
    if (rc != 0 || !deleted) {
        return rc;
    }
    return idx_bkey_del(x, txn, op->loc.bucket, op->loc.offset);
}

static int
idx_op_bucket_put(struct idx *x, MDB_txn *txn, const struct idx_op *op)
{
    uint8_t kbuf[8];
    uint8_t vbuf[IDX_BUCKET_VAL_SIZE];
    MDB_val k = {sizeof(kbuf), kbuf};
    MDB_val v = {sizeof(vbuf), vbuf};

    idx_put_be64(kbuf, op->bucket.id);
    idx_bucket_encode(vbuf, &op->bucket);
    return mdb_put(txn, x->buckets, &k, &v, 0);
}

/*
 * idx_op_bucket_drop: every bkeys row of the bucket goes, with the object
 * entry it names when that entry still points at the row's location. The
 * cursor is re-seeked after each delete rather than stepped, so no cursor
 * position is trusted across updates of another database.
 */
static int
idx_op_bucket_drop(struct idx *x, MDB_txn *txn, const struct idx_op *op)
{
    uint64_t id = op->bucket.id;
    uint8_t start[IDX_BKEY_SIZE];
    uint8_t kbuf[8];
    MDB_cursor *cur = NULL;
    MDB_val k, v;
    int deleted;
    int rc;

    rc = mdb_cursor_open(txn, x->bkeys, &cur);
    if (rc != 0) {
        return rc;
    }
    for (;;) {
        uint64_t offset;
        size_t key_len;

        idx_bkey(id, 0, start, &k);
        rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
        if (rc == MDB_NOTFOUND) {
            break;
        }
        if (rc != 0) {
            goto fail;
        }
        if (k.mv_size != IDX_BKEY_SIZE || idx_get_be64(k.mv_data) != id) {
            break;
        }
        if (v.mv_size < 4 || v.mv_size - 4 > UINT32_MAX) {
            rc = MDB_CORRUPTED;
            goto fail;
        }
        offset = idx_get_be64((const uint8_t *)k.mv_data + 8);
        key_len = v.mv_size - 4;
        rc = idx_scratch_copy(x, &v);
        if (rc != 0) {
            goto fail;
        }
        rc = mdb_cursor_del(cur, 0);
        if (rc != 0) {
            goto fail;
        }
        rc = idx_obj_del_at(x, txn, idx_get_be32(x->scratch), x->scratch + 4, (uint32_t)key_len, id,
                            offset, &deleted);
        if (rc != 0) {
            goto fail;
        }
    }
    mdb_cursor_close(cur);
    cur = NULL;

    idx_put_be64(kbuf, id);
    k.mv_data = kbuf;
    k.mv_size = sizeof(kbuf);
    rc = mdb_del(txn, x->buckets, &k, NULL);
    return rc == MDB_NOTFOUND ? 0 : rc;

fail:
    mdb_cursor_close(cur);
    return rc;
}

static int
idx_op_meta_put(struct idx *x, MDB_txn *txn, const struct idx_op *op)
{
    uint8_t vbuf[IDX_META_VAL_SIZE];
    MDB_val k = {strlen(op->name), (void *)op->name};
    MDB_val v = {sizeof(vbuf), vbuf};

    memset(vbuf, 0, sizeof(vbuf));
    vbuf[0] = IDX_FORMAT_VERSION;
    idx_put_le64(vbuf + 8, op->value);
    return mdb_put(txn, x->meta, &k, &v, 0);
}

static int
idx_op_valid(const struct idx_op *op)
{
    size_t len;

    switch (op->kind) {
    case IDX_OBJ_PUT:
    case IDX_OBJ_APPEND:
    case IDX_OBJ_DEL:
        return op->key != NULL || op->key_len == 0;
    case IDX_BUCKET_PUT:
    case IDX_BUCKET_DROP:
        return 1;
    case IDX_META_PUT:
        if (op->name == NULL) {
            return 0;
        }
        len = strlen(op->name);
        return len > 0 && len <= IDX_MKEY_MAX;
    default:
        return 0;
    }
}

/* idx_apply_once: one attempt at the batch in a fresh write txn; never leaves it open. */
static int
idx_apply_once(struct idx *x, const struct idx_op *ops, size_t n)
{
    MDB_txn *txn = NULL;
    int rc;

    rc = mdb_txn_begin(x->env, NULL, 0, &txn);
    if (rc != 0) {
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        const struct idx_op *op = &ops[i];

        switch (op->kind) {
        case IDX_OBJ_PUT:
            rc = idx_op_obj_put(x, txn, op);
            break;
        case IDX_OBJ_APPEND:
            rc = idx_op_obj_append(x, txn, op);
            break;
        case IDX_OBJ_DEL:
            rc = idx_op_obj_del(x, txn, op);
            break;
        case IDX_BUCKET_PUT:
            rc = idx_op_bucket_put(x, txn, op);
            break;
        case IDX_BUCKET_DROP:
            rc = idx_op_bucket_drop(x, txn, op);
            break;
        default:
            rc = idx_op_meta_put(x, txn, op);
            break;
        }
        if (rc != 0) {
            goto fail;
        }
    }
    /* mdb_txn_commit frees the txn whether it succeeds or not. */
    return mdb_txn_commit(txn);

fail:
    mdb_txn_abort(txn);
    return rc;
}

/*
 * idx_grow: double the map (up to max_map). Only legal with no transaction
 * active in this process, which holds: idx is single-threaded and no call
 * keeps a transaction past its return.
 */
static int
idx_grow(struct idx *x)
{
    uint64_t want;
    MDB_envinfo info;
    int rc;

    if (x->map_size >= x->max_map) {
        return KV_NO_SPACE;
    }
    want = x->map_size > x->max_map / 2 ? x->max_map : x->map_size * 2;
    rc = mdb_env_set_mapsize(x->env, (size_t)want);
    if (rc != 0) {
        /* The old mapping is gone and the new one failed: the env cannot be used. */
        x->failed = 1;
        return idx_status(rc);
    }
    if (mdb_env_info(x->env, &info) == 0) {
        x->map_size = info.me_mapsize;
    } else {
        x->map_size = want;
    }
    return 0;
}

/*
 * idx_check_size: data.mdb holds every page its meta page names. A file cut
 * short (a bad restore, a copy that stopped) would otherwise open, and the
 * first access to a page past its end would be a SIGBUS in the map.
 */
static int
idx_check_size(struct idx *x, const char *dir, char *err, size_t errlen)
{
    MDB_envinfo info;
    MDB_stat st;
    struct stat fst;
    int fd;
    int rc;

    rc = mdb_env_info(x->env, &info);
    if (rc == 0) {
        rc = mdb_env_stat(x->env, &st);
    }
    if (rc == 0) {
        rc = mdb_env_get_fd(x->env, &fd);
    }
    if (rc != 0) {
        idx_errf(err, errlen, "mdb_env_info", dir, mdb_strerror(rc));
        return rc;
    }
    if (fstat(fd, &fst) != 0) {
        rc = errno;
        idx_errf(err, errlen, "fstat", dir, strerror(rc));
        return rc;
    }
    if ((uint64_t)fst.st_size < ((uint64_t)info.me_last_pgno + 1) * st.ms_psize) {
        char why[160];

        snprintf(why, sizeof(why), "data.mdb is %llu bytes but names pages up to %llu (%llu bytes)",
                 (unsigned long long)fst.st_size, (unsigned long long)info.me_last_pgno,
                 ((unsigned long long)info.me_last_pgno + 1) * st.ms_psize);
        idx_errf(err, errlen, "idx_open", dir, why);
        return MDB_CORRUPTED;
    }
    return 0;
}

/* ---- public ---- */

int
idx_open(const char *dir, uint64_t map_size, uint64_t max_map, int *stale_readers, struct idx **out,
         char *err, size_t errlen)
{
    struct idx *x = NULL;
    MDB_txn *txn = NULL;
    MDB_envinfo info;
    uint64_t page;
    long ps;
    int dead = 0;
    int rc;

    if (stale_readers != NULL) {
        *stale_readers = 0;
    }
    if (out == NULL || dir == NULL) {
        idx_errf(err, errlen, "idx_open", dir != NULL ? dir : "(null)", "invalid argument");
        return -EINVAL;
    }
    *out = NULL;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        rc = errno;
        idx_errf(err, errlen, "mkdir", dir, strerror(rc));
        return -rc;
    }

    x = calloc(1, sizeof(*x));
    if (x == NULL) {
        idx_errf(err, errlen, "idx_open", dir, strerror(ENOMEM));
        return -ENOMEM;
    }
    rc = mdb_env_create(&x->env);
    if (rc != 0) {
        idx_errf(err, errlen, "mdb_env_create", dir, mdb_strerror(rc));
        goto fail;
    }
    rc = mdb_env_set_maxdbs(x->env, 4);
    if (rc != 0) {
        idx_errf(err, errlen, "mdb_env_set_maxdbs", dir, mdb_strerror(rc));
        goto fail;
    }

    ps = sysconf(_SC_PAGESIZE);
    page = ps > 0 ? (uint64_t)ps : 4096u;
    if (map_size < IDX_MIN_MAP) {
        map_size = IDX_MIN_MAP;
    }
    map_size = (map_size + page - 1) / page * page;
    max_map = max_map / page * page;
    if (max_map < map_size) {
        max_map = map_size;
    }
    rc = mdb_env_set_mapsize(x->env, (size_t)map_size);
    if (rc != 0) {
        idx_errf(err, errlen, "mdb_env_set_mapsize", dir, mdb_strerror(rc));
        goto fail;
    }

    /*
     * No MDB_WRITEMAP: with it, pages are written through the shared map and
     * a full disk surfaces as SIGBUS on a store; without it, LMDB writes with
     * pwrite at commit and a full disk is ENOSPC from mdb_txn_commit. The
     * default sync-on-commit stays (no MDB_NOSYNC/MDB_NOMETASYNC): a batch
     * idx_apply reported applied survives a crash. MDB_NOTLS ties reader
     * slots to transactions, not threads; MDB_NORDAHEAD suits random lookups.
     */
    rc = mdb_env_open(x->env, dir, MDB_NOTLS | MDB_NORDAHEAD, 0600);
    if (rc != 0) {
        idx_errf(err, errlen, "mdb_env_open", dir, mdb_strerror(rc));
        goto fail;
    }
    rc = idx_check_size(x, dir, err, errlen);
    if (rc != 0) {
        goto fail;
    }
    if (mdb_env_get_maxkeysize(x->env) < (int)IDX_MKEY_MAX) {
        rc = MDB_INCOMPATIBLE;
        idx_errf(err, errlen, "mdb_env_get_maxkeysize", dir,
                 "liblmdb built with a key limit below 511 bytes");
        goto fail;
    }
    rc = mdb_reader_check(x->env, &dead);
    if (rc != 0) {
        idx_errf(err, errlen, "mdb_reader_check", dir, mdb_strerror(rc));
        goto fail;
    }

    rc = mdb_txn_begin(x->env, NULL, 0, &txn);
    if (rc != 0) {
        idx_errf(err, errlen, "mdb_txn_begin", dir, mdb_strerror(rc));
        goto fail;
    }
    rc = mdb_dbi_open(txn, "objects", MDB_CREATE, &x->objects);
    if (rc == 0) {
        rc = mdb_dbi_open(txn, "bkeys", MDB_CREATE, &x->bkeys);
    }
    if (rc == 0) {
        rc = mdb_dbi_open(txn, "buckets", MDB_CREATE, &x->buckets);
    }
    if (rc == 0) {
        rc = mdb_dbi_open(txn, "meta", MDB_CREATE, &x->meta);
    }
    if (rc != 0) {
        idx_errf(err, errlen, "mdb_dbi_open", dir, mdb_strerror(rc));
        goto fail;
    }
    rc = mdb_txn_commit(txn);
    txn = NULL;
    if (rc != 0) {
        idx_errf(err, errlen, "mdb_txn_commit", dir, mdb_strerror(rc));
        goto fail;
    }

    /* An existing environment keeps its own (possibly larger) map. */
    x->map_size = map_size;
    if (mdb_env_info(x->env, &info) == 0) {
        x->map_size = info.me_mapsize;
    }
    x->max_map = max_map > x->map_size ? max_map : x->map_size;
    if (stale_readers != NULL) {
        *stale_readers = dead;
    }
    *out = x;
    return 0;

fail:
    if (txn != NULL) {
        mdb_txn_abort(txn);
    }
    idx_close(x);
    return rc > 0 ? -rc : KV_INTERNAL;
}

void
idx_close(struct idx *x)
{
    if (x == NULL) {
        return;
    }
    if (x->env != NULL) {
        mdb_env_close(x->env);
    }
    free(x->scratch);
    free(x);
}

int
idx_apply(struct idx *x, const struct idx_op *ops, size_t n)
{
    int rc;

    if (x->failed) {
        return -EIO;
    }
    if (n == 0) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (!idx_op_valid(&ops[i])) {
            return -EINVAL;
        }
    }
    for (;;) {
        rc = idx_apply_once(x, ops, n);
        if (rc != MDB_MAP_FULL) {
            return idx_status(rc);
        }
        /* The failed txn is gone; grow and retry the whole batch in a new one. */
        rc = idx_grow(x);
        if (rc != 0) {
            return rc;
        }
    }
}

int
idx_get(struct idx *x, uint32_t tenant, const uint8_t *key, uint32_t key_len, struct idx_loc *loc)
{
    struct idx_slot s;
    MDB_txn *txn = NULL;
    int rc;

    if (x->failed) {
        return -EIO;
    }
    if (key == NULL && key_len > 0) {
        return -EINVAL;
    }
    rc = mdb_txn_begin(x->env, NULL, MDB_RDONLY, &txn);
    if (rc != 0) {
        return idx_status(rc);
    }
    rc = idx_slot_find(x, txn, tenant, key, key_len, &s);
    mdb_txn_abort(txn);
    if (rc != 0) {
        return idx_status(rc);
    }
    if (!s.match) {
        return KV_NOT_FOUND;
    }
    *loc = s.loc;
    return 0;
}

int
idx_bucket_get(struct idx *x, uint64_t id, struct idx_bucket *b)
{
    uint8_t kbuf[8];
    MDB_val k = {sizeof(kbuf), kbuf};
    MDB_val v;
    MDB_txn *txn = NULL;
    int rc;

    if (x->failed) {
        return -EIO;
    }
    idx_put_be64(kbuf, id);
    rc = mdb_txn_begin(x->env, NULL, MDB_RDONLY, &txn);
    if (rc != 0) {
        return idx_status(rc);
    }
    rc = mdb_get(txn, x->buckets, &k, &v);
    if (rc == 0) {
        rc = idx_bucket_decode(&k, &v, b);
    }
    mdb_txn_abort(txn);
    return idx_status(rc);
}

int
idx_meta_get(struct idx *x, const char *name, uint64_t *value)
{
    MDB_val k, v;
    MDB_txn *txn = NULL;
    size_t len;
    int rc;

    if (x->failed) {
        return -EIO;
    }
    len = name != NULL ? strlen(name) : 0;
    if (len == 0 || len > IDX_MKEY_MAX) {
        return -EINVAL;
    }
    k.mv_size = len;
    k.mv_data = (void *)name;
    rc = mdb_txn_begin(x->env, NULL, MDB_RDONLY, &txn);
    if (rc != 0) {
        return idx_status(rc);
    }
    rc = mdb_get(txn, x->meta, &k, &v);
    if (rc == 0) {
        const uint8_t *p = v.mv_data;

        if (v.mv_size != IDX_META_VAL_SIZE || p[0] != IDX_FORMAT_VERSION) {
            rc = MDB_CORRUPTED;
        } else {
            *value = idx_get_le64(p + 8);
        }
    }
    mdb_txn_abort(txn);
    return idx_status(rc);
}

void
idx_warm(struct idx *x)
{
    size_t len = 1 << 20;
    uint8_t *buf;
    struct stat st;
    off_t off = 0;
    int fd;

    if (mdb_env_get_fd(x->env, &fd) != 0 || fstat(fd, &st) != 0) {
        return;
    }
    buf = malloc(len);
    if (buf == NULL) {
        return;
    }
    (void)posix_fadvise(fd, 0, st.st_size, POSIX_FADV_SEQUENTIAL);
    while (off < st.st_size) {
        ssize_t n = pread(fd, buf, len, off);

        if (n <= 0) {
            if (n < 0 && errno == EINTR) {
                continue;
            }
            break;
        }
        off += n;
    }
    free(buf);
}

/* idx_scan_begin: a read transaction and a cursor on dbi for a scan. 0 or a status. */
static int
idx_scan_begin(struct idx *x, MDB_dbi dbi, MDB_txn **txn, MDB_cursor **cur)
{
    int rc;

    *txn = NULL;
    *cur = NULL;
    if (x->failed) {
        return -EIO;
    }
    rc = mdb_txn_begin(x->env, NULL, MDB_RDONLY, txn);
    if (rc == 0) {
        rc = mdb_cursor_open(*txn, dbi, cur);
        if (rc != 0) {
            mdb_txn_abort(*txn);
        }
    }
    return idx_status(rc);
}

/*
 * idx_scan_end: close a scan's cursor and transaction; the callback's
 * result ret wins over the cursor's rc, and running off the end is success.
 */
static int
idx_scan_end(MDB_txn *txn, MDB_cursor *cur, int rc, int ret)
{
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    if (ret != 0) {
        return ret;
    }
    return rc == MDB_NOTFOUND ? 0 : idx_status(rc);
}

/*
 * The scans hand fn pointers into the read transaction's snapshot; they are
 * valid for the call only, which is what the header promises. A scan's own
 * failure and fn's result share the return value; fn is expected to use
 * values outside the kverr space (or kverr codes it means).
 */
int
idx_scan_objects(struct idx *x, idx_obj_fn *fn, void *arg)
{
    MDB_txn *txn;
    MDB_cursor *cur;
    MDB_val k, v;
    int ret = 0;
    int rc = idx_scan_begin(x, x->objects, &txn, &cur);

    if (rc != 0) {
        return rc;
    }
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        struct idx_objval o;
        const uint8_t *kp = k.mv_data;

        rc = idx_objval_decode(&v, &o);
        if (rc == 0 && k.mv_size < 4) {
            rc = MDB_CORRUPTED;
        }
        if (rc != 0) {
            break;
        }
        if (o.form == IDX_OBJ_FORM_DIRECT) {
            ret = fn(arg, idx_get_be32(kp), kp + 4, (uint32_t)(k.mv_size - 4), &o.loc);
        } else {
            ret = fn(arg, idx_get_be32(kp), o.key, (uint32_t)o.key_len, &o.loc);
        }
        if (ret != 0) {
            break;
        }
    }
    return idx_scan_end(txn, cur, rc, ret);
}

int
idx_scan_bucket_objects(struct idx *x, uint64_t id, idx_obj_fn *fn, void *arg)
{
    uint8_t start[IDX_BKEY_SIZE];
    MDB_txn *txn;
    MDB_cursor *cur;
    MDB_val k, v;
    int ret = 0;
    int rc = idx_scan_begin(x, x->bkeys, &txn, &cur);

    if (rc != 0) {
        return rc;
    }
    idx_bkey(id, 0, start, &k);
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        const uint8_t *vp = v.mv_data;
        struct idx_slot s;
        uint64_t offset;
        uint32_t tenant;

        if (k.mv_size != IDX_BKEY_SIZE || idx_get_be64(k.mv_data) != id) {
            rc = MDB_NOTFOUND;
            break;
        }
        if (v.mv_size < 4 || v.mv_size - 4 > UINT32_MAX) {
            rc = MDB_CORRUPTED;
            break;
        }
        offset = idx_get_be64((const uint8_t *)k.mv_data + 8);
        tenant = idx_get_be32(vp);
        rc = idx_slot_find(x, txn, tenant, vp + 4, (uint32_t)(v.mv_size - 4), &s);
        if (rc != 0) {
            break;
        }
        /* The invariant says this always holds; a row that disagrees is not reported. */
        if (!s.match || s.loc.bucket != id || s.loc.offset != offset) {
            continue;
        }
        ret = fn(arg, tenant, vp + 4, (uint32_t)(v.mv_size - 4), &s.loc);
        if (ret != 0) {
            break;
        }
    }
    return idx_scan_end(txn, cur, rc, ret);
}

int
idx_scan_buckets(struct idx *x, idx_bucket_fn *fn, void *arg)
{
    MDB_txn *txn;
    MDB_cursor *cur;
    MDB_val k, v;
    int ret = 0;
    int rc = idx_scan_begin(x, x->buckets, &txn, &cur);

    if (rc != 0) {
        return rc;
    }
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        struct idx_bucket b;

        rc = idx_bucket_decode(&k, &v, &b);
        if (rc != 0) {
            break;
        }
        ret = fn(arg, &b);
        if (ret != 0) {
            break;
        }
    }
    return idx_scan_end(txn, cur, rc, ret);
}

uint64_t
idx_map_size(const struct idx *x)
{
    return x->map_size;
}

int
idx_set_sync(struct idx *x, int sync)
{
    int rc;

    if (x->failed) {
        return -EIO;
    }
    rc = mdb_env_set_flags(x->env, MDB_NOSYNC, sync ? 0 : 1);
    if (rc == 0 && sync) {
        rc = mdb_env_sync(x->env, 1);
    }
    return idx_status(rc);
}

static volatile uint8_t idx_verify_sink;

/* idx_verify_touch: read every byte of val (in the child: a fault kills the child only). */
static void
idx_verify_touch(const MDB_val *val)
{
    const uint8_t *p = val->mv_data;
    uint8_t x = 0;

    for (size_t i = 0; i < val->mv_size; i++) {
        x ^= p[i];
    }
    idx_verify_sink = x;
}

/* idx_verify_db: walk one database of an open read txn to its end, decoding every value. */
static int
idx_verify_db(MDB_txn *txn, const char *name, int kind)
{
    MDB_dbi dbi;
    MDB_cursor *cur;
    MDB_val k, v;
    int rc = mdb_dbi_open(txn, name, 0, &dbi);

    if (rc == MDB_NOTFOUND) {
        return 0;
    }
    if (rc == 0) {
        rc = mdb_cursor_open(txn, dbi, &cur);
    }
    if (rc != 0) {
        return rc;
    }
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        struct idx_objval o;
        struct idx_bucket b;

        /* Every byte the daemon may copy, read here: a damaged node can claim a value
         * larger than the file (overflow pages past its end) that only a full read
         * faults on. */
        idx_verify_touch(&k);
        idx_verify_touch(&v);

        if (kind == 0 && (k.mv_size < 4 || idx_objval_decode(&v, &o) != 0)) {
            rc = MDB_CORRUPTED;
        } else if (kind == 1 && (k.mv_size != IDX_BKEY_SIZE || v.mv_size < 4)) {
            rc = MDB_CORRUPTED;
        } else if (kind == 2 && idx_bucket_decode(&k, &v, &b) != 0) {
            rc = MDB_CORRUPTED;
        } else if (kind == 3 && v.mv_size != IDX_META_VAL_SIZE) {
            rc = MDB_CORRUPTED;
        }
        if (rc != 0) {
            break;
        }
    }
    mdb_cursor_close(cur);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* idx_verify_core: walk LMDB's own free list (dbi 0) and main tree (dbi 1), which the named
 * databases' walk does not read but every write transaction does. */
static int
idx_verify_core(MDB_txn *txn)
{
    MDB_cursor *cur;
    MDB_val k, v;
    int rc = 0;

    for (MDB_dbi dbi = 0; rc == 0 && dbi < 2; dbi++) {
        rc = mdb_cursor_open(txn, dbi, &cur);
        if (rc != 0) {
            break;
        }
        for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
             rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
            idx_verify_touch(&k);
            idx_verify_touch(&v);
        }
        mdb_cursor_close(cur);
        rc = rc == MDB_NOTFOUND ? 0 : rc;
    }
    return rc;
}

/*
 * idx_verify_write: what idx_open writes (it creates the databases that are missing), in a
 * transaction that is aborted, never committed: a damaged free list or main tree that only
 * a write reaches strikes here, in the child, not in the daemon.
 */
static int
idx_verify_write(MDB_env *env, const char *const *names)
{
    static const uint8_t probe[IDX_META_VAL_SIZE];
    MDB_txn *txn;
    MDB_dbi dbi = 0;
    MDB_val k = {.mv_size = 12, .mv_data = (void *)"verify-probe"};
    MDB_val v = {.mv_size = sizeof(probe), .mv_data = (void *)probe};
    int rc = mdb_txn_begin(env, NULL, 0, &txn);

    for (int i = 0; rc == 0 && i < 4; i++) {
        rc = mdb_dbi_open(txn, names[i], MDB_CREATE, &dbi);
    }
    if (rc == 0) {
        rc = mdb_put(txn, dbi, &k, &v, 0);      /* dbi: "meta", the last opened */
    }
    if (txn != NULL) {
        mdb_txn_abort(txn);
    }
    return rc;
}

/* idx_verify_child: the whole walk, in the child; its exit status. */
static int
idx_verify_child(const char *dir)
{
    static const char *const names[] = {"objects", "bkeys", "buckets", "meta"};
    char path[4096];
    struct stat st;
    MDB_env *env;
    MDB_txn *txn;
    int rc;

    snprintf(path, sizeof(path), "%s/data.mdb", dir);
    if (stat(path, &st) != 0) {
        return 0;                       /* nothing to verify: idx_open creates it */
    }
    if (mdb_env_create(&env) != 0 || mdb_env_set_maxdbs(env, 4) != 0
        || mdb_env_set_mapsize(env, (size_t)st.st_size + (1u << 20)) != 0) {
        return 3;
    }
    /* Not MDB_RDONLY: idx_verify_write needs a write transaction (it never commits). */
    rc = mdb_env_open(env, dir, MDB_NOLOCK | MDB_NOTLS, 0600);
    if (rc == 0) {
        MDB_envinfo info;
        MDB_stat ms;

        if (mdb_env_info(env, &info) != 0 || mdb_env_stat(env, &ms) != 0
            || (uint64_t)st.st_size < ((uint64_t)info.me_last_pgno + 1) * ms.ms_psize) {
            return 1;
        }
        rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn);
    }
    if (rc == 0) {
        rc = idx_verify_core(txn);
    }
    for (int i = 0; rc == 0 && i < 4; i++) {
        rc = idx_verify_db(txn, names[i], i);
    }
    if (rc == 0) {
        mdb_txn_abort(txn);
        rc = idx_verify_write(env, names);
    }
    return rc == 0 ? 0 : 1;
}

int
idx_verify(const char *dir, unsigned timeout_s, char *err, size_t errlen)
{
    struct timespec ts = {0, 10 * 1000 * 1000};
    unsigned waited_ms = 0;
    int status = 0;
    pid_t pid;

    pid = fork();
    if (pid < 0) {
        return 0;       /* cannot check apart: the open goes on as before */
    }
    if (pid == 0) {
        _exit(idx_verify_child(dir));
    }
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);

        if (r == pid) {
            break;
        }
        if (r < 0 && errno != EINTR) {
            return 0;
        }
        if (waited_ms / 1000 >= timeout_s) {
            kill(pid, SIGKILL);
            (void)waitpid(pid, &status, 0);
            idx_errf(err, errlen, "idx_verify", dir, "the walk did not finish (a loop in the tree?)");
            return KV_INTERNAL;
        }
        nanosleep(&ts, NULL);
        waited_ms += 10;
    }
    if (WIFSIGNALED(status)) {
        char why[96];

        snprintf(why, sizeof(why), "walking it crashed a separate process (signal %d)",
                 WTERMSIG(status));
        idx_errf(err, errlen, "idx_verify", dir, why);
        return KV_INTERNAL;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 1) {
        idx_errf(err, errlen, "idx_verify", dir, "LMDB reports it corrupt or it holds values "
                 "this version cannot read");
        return KV_INTERNAL;
    }
    return 0;
}

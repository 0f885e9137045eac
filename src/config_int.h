/*
 * config_int: what src/config.c (the option table and everything that walks it) takes from
 * src/config_value.c (the text form of single values): the value parsers and formatters.
 * Private to those two files; everyone else uses config.h.
 *
 * Every function here is pure: no state, no allocation, safe from any thread. Text in is
 * borrowed for the call; an output buffer is the caller's, written like snprintf (at most
 * len bytes, NUL-terminated when len > 0).
 */
#ifndef CONFIG_INT_H
#define CONFIG_INT_H

#include <stddef.h>
#include <stdint.h>

/* An hour in milliseconds: the option table's duration bound and the "h" unit. */
#define HOUR_MS (UINT64_C(3600) * 1000)

/*
 * conf_size_parse: s, all of it, as a size in bytes into *out: decimal digits, then
 * nothing, "b", or k/m/g/t (binary units) optionally followed by "b" or "ib", any case
 * ("4096", "64k", "1m", "4GiB"). Returns 0, -EINVAL for bad syntax, or -ERANGE when the
 * value does not fit in 64 bits; *out is set only on success. conf_parse_size (config.h)
 * is the public form.
 */
int conf_size_parse(const char *s, uint64_t *out);

/*
 * conf_duration_parse: s, all of it, as milliseconds into *out: decimal digits, then
 * nothing or "ms" (milliseconds), "s", "m" or "h", any case. Returns 0, -EINVAL or -ERANGE
 * as conf_size_parse. conf_parse_duration_ms (config.h) is the public form.
 */
int conf_duration_parse(const char *s, uint64_t *out);

/*
 * conf_uint_parse: s, all of it, as plain decimal digits into *out. Returns 0, -EINVAL
 * (no digit, or anything after them) or -ERANGE (more than 64 bits); *out may be written
 * on -EINVAL.
 */
int conf_uint_parse(const char *s, uint64_t *out);

/*
 * conf_double_parse: s, all of it, as a plain decimal number ("0.85", "85e-2"; no hex,
 * inf, nan, or surrounding space) into *out. Returns 0, or -EINVAL for bad syntax and for
 * a value strtod reports out of range; *out is set only on success.
 */
int conf_double_parse(const char *s, double *out);

/*
 * conf_hex: exactly 2n hex digits (either case) at s, whose length is slen, as n bytes
 * into out. Returns 0, or -1 for a wrong length or a non-hex digit (out may then be
 * partly written).
 */
int conf_hex(const char *s, size_t slen, uint8_t *out, size_t n);

/*
 * conf_format_double: the shortest "%g" text of d (1 to 17 significant digits) that
 * strtod, and so conf_double_parse, reads back as exactly d, into buf.
 */
void conf_format_double(double d, char *buf, size_t len);

/*
 * conf_format_size: v in the largest binary unit that divides it exactly ("64k", "4g"),
 * plain digits otherwise and for 0, into buf; conf_size_parse reads it back as v.
 */
void conf_format_size(uint64_t v, char *buf, size_t len);

/*
 * conf_format_duration: ms in the largest unit that divides it exactly ("10s", "5m",
 * "1h", else "250ms"; 0 is "0"), into buf; conf_duration_parse reads it back as ms.
 */
void conf_format_duration(uint64_t ms, char *buf, size_t len);

/*
 * conf_check_listen: the check of listen and tls_listen (a conf_check_fn in config.c).
 * NULL when v is "" (no listener), host:port with an IPv4 address or a host name (letters,
 * digits, '.', '-', '_'; at most 253 bytes), or [ipv6]:port, with a port of 0-65535;
 * otherwise the reason, a static string. Nothing is resolved. v must be shorter than
 * CONF_STR_MAX bytes (conf_store checks the length first).
 */
const char *conf_check_listen(const char *v);

/*
 * The pool's keys (config_cluster.c). The checks are conf_check_fn's of the option table:
 * NULL when v is acceptable, else the reason (a static string).
 */
#define CONF_ETCD_PREFIX_DEFAULT "/kvstash/<cluster_name>"
const char *conf_check_cluster_name(const char *v);
const char *conf_check_etcd_endpoints(const char *v);
const char *conf_check_etcd_prefix(const char *v);
const char *conf_check_peer_advertise(const char *v);

/*
 * conf_finalize_cluster: the pool's rules between keys, for conf_finalize. With cluster_name
 * set: etcd_endpoints given, etcd_lease_ttl whole seconds, peer_advertise (or listen, its
 * default) dialable. Writes the derived etcd_prefix (the default is /kvstash/<cluster_name>)
 * and peer_advertise (listen when "") to prefix and advertise (CONF_STR_MAX each; c's own
 * values when there is nothing to derive). Returns 0, or -1 with err filled; c unchanged.
 */
struct kv_config;
int conf_finalize_cluster(const struct kv_config *c, char *prefix, char *advertise, char *err,
                          size_t errlen);

#endif

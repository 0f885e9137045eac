/*
 * cluster_token: the token a pool member logs in to its peers with when
 * require_auth is on (docs/cluster.md, "Peer authentication"). Peers log in
 * as the admin tenant (the peer methods are the admin tenant's), with the
 * admin token kept in plain text in <data_dir>/cluster_token: tenants are
 * configured by the SHA-256 of their tokens only, so the token itself has to
 * come from a file of its own. No config key: the file's place is fixed.
 *
 * Thread: the main thread, at start and on SIGHUP (the reload hands the token to
 * the peer pool for its new connections: peer_pool_reload).
 */
#ifndef CLUSTER_TOKEN_H
#define CLUSTER_TOKEN_H

#include <stddef.h>

struct kv_config;

#define CLUSTER_TOKEN_MAX 255       /* a hello token's largest size (bin 8) */

/*
 * cluster_token_load: the token for c (a finalized config: its tenants hold
 * token_file's) into out[0..outlen) (outlen > CLUSTER_TOKEN_MAX). With
 * require_auth off, out is "" and nothing is read. With it on the file must
 * be a regular file of mode 0600 or stricter, hold 1 to 255 bytes (one
 * trailing newline dropped), and its SHA-256 must be the admin tenant's
 * token_sha256 (so a member whose file and tenant lines disagree is stopped
 * at start, not refused by every peer later). Returns 0, or -EINVAL /
 * -ENOENT / -EACCES / -errno with the reason in err[0..errlen).
 */
int cluster_token_load(const struct kv_config *c, char *out, size_t outlen, char *err,
                       size_t errlen);

#endif

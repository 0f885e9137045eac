/*
 * cluster_token: <data_dir>/cluster_token read and checked (cluster_token.h).
 * Must not: keep the token anywhere but the caller's buffer, or log it.
 */
#include "cluster_token.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "kverr.h"

int
cluster_token_load(const struct kv_config *c, char *out, size_t outlen, char *err, size_t errlen)
{
    char path[CONF_STR_MAX + 32];
    char buf[CLUSTER_TOKEN_MAX + 2];
    uint8_t digest[SHA256_DIGEST_LENGTH];
    const struct conf_tenant *admin;
    struct stat st;
    ssize_t n;
    int fd, rc;

    out[0] = '\0';
    if (!c->require_auth) {
        return 0;
    }
    admin = conf_tenant_find(c, CONF_ADMIN_TENANT, strlen(CONF_ADMIN_TENANT));
    if (admin == NULL) {
        kv_errorf(err, errlen, "a pool with require_auth yes needs an admin tenant: members "
                  "log in to each other as admin (tenant admin token_sha256=...)");
        return -EINVAL;
    }
    snprintf(path, sizeof(path), "%s/cluster_token", c->data_dir);
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        rc = -errno;
        kv_errorf(err, errlen, "%s: %s (with require_auth yes a pool member logs in to its "
                  "peers with the admin tenant's token, kept there, mode 0600)", path,
                  strerror(-rc));
        return rc;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 077) != 0) {
        close(fd);
        kv_errorf(err, errlen, "%s: must be a regular file of mode 0600 or stricter", path);
        return -EACCES;
    }
    n = read(fd, buf, sizeof(buf));
    rc = n < 0 ? -errno : 0;
    close(fd);
    if (rc != 0) {
        kv_errorf(err, errlen, "%s: %s", path, strerror(-rc));
        return rc;
    }
    if (n > 0 && buf[n - 1] == '\n') {
        n--;
    }
    if (n < 1 || n > CLUSTER_TOKEN_MAX || outlen <= (size_t)n || memchr(buf, '\0', (size_t)n)
        || memchr(buf, '\n', (size_t)n)) {
        kv_errorf(err, errlen, "%s: must hold one token of 1 to %d bytes (one line)", path,
                  CLUSTER_TOKEN_MAX);
        return -EINVAL;
    }
    SHA256((const uint8_t *)buf, (size_t)n, digest);
    if (CRYPTO_memcmp(digest, admin->token_sha256, sizeof(digest)) != 0) {
        OPENSSL_cleanse(buf, sizeof(buf));
        kv_errorf(err, errlen, "%s: its SHA-256 is not the admin tenant's token_sha256 (peers "
                  "would refuse this node's logins)", path);
        return -EINVAL;
    }
    memcpy(out, buf, (size_t)n);
    out[n] = '\0';
    OPENSSL_cleanse(buf, sizeof(buf));
    return 0;
}

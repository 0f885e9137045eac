/*
 * fuzz_env: the request fuzzers' shared environment (fuzz_env.h). Linked into every
 * fuzz target; only fuzz_rpc and fuzz_resp call it.
 */
#include "fuzz_env.h"

#include <stdlib.h>

#include "store.h"

struct store *fz_store;
struct rpc_server fz_srv;
struct rpc_limits fz_lim = {
    .max_key_size = 1024, .max_value_size = 4u << 20, .max_batch = 256,
    .max_message_size = 8u << 20, .lease_ttl_ms = 1000, .put_timeout_ms = 1000,
};
struct rpc_counters fz_ctr;

static const char *const fz_transports[] = {"tcp"};

void
fz_env_init(void)
{
    struct store_config cfg = {
        .memory_size = 16u << 20, .max_key_size = 1024, .max_value_size = 4u << 20,
        .high_watermark = 0.9, .low_watermark = 0.8,
    };

    if (store_create(&cfg, &fz_store) != 0) {
        abort();
    }
    fz_srv.store = fz_store;
    fz_srv.version = "fuzz";
    fz_srv.node_id = "fuzz";
    fz_srv.transports = fz_transports;
    fz_srv.ntransports = 1;
}

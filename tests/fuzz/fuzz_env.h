/*
 * fuzz_env: what the two request fuzzers (fuzz_rpc.c, fuzz_resp.c) share: one store
 * and the request layer's server-wide state, limits and counters, made once by
 * fz_env_init from LLVMFuzzerInitialize. Single-threaded, as libFuzzer runs them.
 */
#ifndef FUZZ_ENV_H
#define FUZZ_ENV_H

#include "rpc.h"

struct store;

extern struct store *fz_store;
extern struct rpc_server fz_srv;
extern struct rpc_limits fz_lim;
extern struct rpc_counters fz_ctr;

/* fz_env_init: make the store (16 MiB) and fill fz_srv; aborts when it cannot. */
void fz_env_init(void);

#endif

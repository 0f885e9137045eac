/*
 * peer_rdma: the RDMA side of one peer connection (peer.c's): the reliable-connected queue
 * pair this node sets up towards a peer over that msgpack connection, with the peer's
 * rdma_connect method (the exchange a client does, protocol/SPEC.md "RDMA"), so that the
 * peer can RDMA-WRITE values straight into this node's registered arena (peer_get_into)
 * and RDMA-READ replicas out of it (peer_put_from; the arena is registered with remote
 * READ and WRITE). This node only exposes memory through it: it posts nothing on the queue
 * pair, so no completion ever arrives on its completion queue.
 *
 * Must not: outlive the completion queue it was made on, or keep a queue pair of a
 * connection that failed: a peer whose writes or reads could still arrive after this node
 * gave up on them must find the queue pair gone (they then fail there, nothing lands here
 * and nothing of reused pages is read).
 * The pool's thread only.
 */
#ifndef PEER_RDMA_H
#define PEER_RDMA_H

#include <stddef.h>
#include <stdint.h>

#include "rdma_port.h"

struct mp_reader;

/* NONE -> PENDING (rdma_connect sent) -> READY, or OFF (refused, failed: TCP only) */
enum peer_rdma_state { PEER_RDMA_NONE, PEER_RDMA_PENDING, PEER_RDMA_READY, PEER_RDMA_OFF };

struct peer_rdma {
    struct rdma_qp *qp;
    enum peer_rdma_state state;
};

/*
 * peer_rdma_start: make the queue pair on cq (state PENDING) and encode what the peer needs
 * to connect to it into info (rdma_connect's one param). Returns 0, or the KV_* code /
 * -errno of rdma_qp_create (then state OFF).
 */
int peer_rdma_start(struct peer_rdma *r, struct rdma_cq *cq, uint8_t info[RDMA_QP_INFO_LEN]);

/*
 * peer_rdma_answer: the peer's answer to rdma_connect: status 0 and res its queue-pair info
 * (a bin), or its error. Connects the queue pair: 0 (state READY), or a KV_* code (state
 * OFF, the queue pair destroyed) with the reason in why[0..len).
 */
int peer_rdma_answer(struct peer_rdma *r, int status, struct mp_reader *res, char *why,
                     size_t len);

/* peer_rdma_stop: destroy the queue pair (if any) and set state `to`. */
void peer_rdma_stop(struct peer_rdma *r, enum peer_rdma_state to);

#endif

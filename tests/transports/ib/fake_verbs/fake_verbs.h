// libloom-fakeverbs.so: an emulated RDMA device for the IB transport's tests. TEST ONLY: nothing
// outside tests/ may load it. It exports, with rdma-core 44's signatures, the ibv_* entry points
// the transport's loader resolves (transports/ib/verbs_api.h) and fills ibv_context::ops
// (post_send, post_recv, poll_cq, req_notify_cq), so the transport runs on it unmodified when
// LOOM_IBVERBS_LIB names it. It never links libibverbs. Tests reach the controls below with dlsym
// on the same library (dlopen of its path returns the handle the loader already holds).
//
// Devices: LOOMTEST_FAKEVERBS_DEVICES, read at every ibv_get_device_list (unset: "mlx5_0", one
// active InfiniBand port, HDR 4x; "none" or empty: no device):
//   devices := device { ";" device }
//   device  := NAME [ "(" port { "," port } ")" ]        ports are numbered from 1
//   port    := ("ib" | "roce") { "/" attr }
//   attr    := "down"                                     port state DOWN (default ACTIVE)
//            | "speed=" (sdr|ddr|qdr|fdr10|fdr|edr|hdr|ndr)    default hdr (ib), edr (roce)
//            | "width=" (1x|2x|4x|8x|12x)                 default 4x
//            | "gids=" gid { "+" gid }                    roce only; the GID table in order
//   gid     := ("ll" | "v4" | "v6") ("v1" | "v2")         link-local fe80::, IPv4-mapped
//                                                         ::ffff:10.99.x.y, ULA fd00:: ; RoCE v1/v2
// The default RoCE table is llv1+llv2+v4v1+v4v2 (what mlx5 shows with an IPv4 address).
// Example: "mlx5_0;mlx5_1(ib,ib/down);mlx5_2(roce/speed=ndr/gids=llv2+v4v1+v4v2)".
// A device keeps its identity while its spec text is unchanged; changing the variable makes new
// devices (objects of the old ones keep working).
//
// Addressing: each port gets a 16-bit address, unique among the live processes of the machine
// (network namespace): it binds the abstract AF_UNIX socket "\0loomtest-fakeverbs/<addr hex>".
// IB ports report it as their LID; every GID (IB: fe80::<port GUID>; RoCE: the table above)
// ends with it. ibv_modify_qp to RTR with the peer's dlid (IB) or dgid (RoCE, is_global
// required) and dest_qp_num connects the QP to that peer QP, in whatever process it lives. Each
// process runs an engine (threads) that moves the data over those sockets.
//
// Semantics kept (each tested in tests/transports/ib/fake_verbs_test.cc):
// - RC: a QP's requests execute at the responder in posting order; requester completions come in
//   posting order, and only after the responder executed (acknowledged) the request.
// - Opcodes RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ, SEND, SEND_WITH_IMM (others: EINVAL);
//   sge lists; IBV_SEND_INLINE (copied at post time); IBV_SEND_SIGNALED / sq_sig_all. The local
//   data of a send or write is gathered at post time (stronger than hardware, harmless). Data is
//   placed at the responder in ascending address order, its last 64 bytes last (what pollers of
//   a flag at the end of an entry rely on with real adapters); writes up to 4 KiB entirely with
//   atomic stores (pollers using atomic loads stay clean under TSan). Limits: 32768 requests per
//   queue, 32 sges, 1024 bytes inline, messages up to 2 GiB (max_msg_sz; larger: LOC_LEN_ERR).
// - WRITE_WITH_IMM and SEND consume the next posted receive (IBV_WC_RECV_RDMA_WITH_IMM /
//   IBV_WC_RECV, imm_data in network order as posted, IBV_WC_WITH_IMM); RDMA_WRITE consumes none.
// - Receiver not ready: the request waits at the responder until a receive is posted; with
//   rnr_retry 7 forever, else rnr_retry x 2 ms, then IBV_WC_RNR_RETRY_EXC_ERR at the requester.
//   The data of a WRITE_WITH_IMM that ends so may already be written (undefined on hardware too).
// - Remote key, bounds or access flags (MR's and the responder QP's qp_access_flags) wrong:
//   IBV_WC_REM_ACCESS_ERR, nothing written (a zero-length request checks no key, as the IB
//   spec says). READ with max_dest_rd_atomic 0: REM_INV_REQ_ERR. A
//   SEND larger than the receive: IBV_WC_LOC_LEN_ERR at the responder, REM_INV_REQ_ERR at the
//   requester. Wrong lkey (or lkey of another PD, or out of bounds): IBV_WC_LOC_PROT_ERR.
// - Any error completion puts the QP in IBV_QPS_ERR: every outstanding and later work request,
//   send and receive, completes with IBV_WC_WR_FLUSH_ERR (error completions are generated for
//   unsignaled requests too). ibv_modify_qp to ERR does the same; to RESET drops them silently.
//   As with libibverbs, ibv_qp::state shows the state last set by ibv_modify_qp only.
// - A peer that is gone (process exited, QP destroyed or not in RTR/RTS, port down, or a QP that
//   is connected to another QP): the request is retried retry_cnt times, every
//   4.096 us x 2^timeout / 100 within [20 ms, 200 ms] (a compressed timeout), then
//   IBV_WC_RETRY_EXC_ERR.
// - QP states RESET -> INIT -> RTR -> RTS with the IB spec's required attribute masks for each
//   transition (missing: EINVAL); any state -> RESET or ERR. post_send before RTS: EINVAL;
//   post_recv in RESET: EINVAL. Send queue slots are freed when the completion of the request
//   (or of a later one of the same QP) is polled, as on mlx5: all-unsignaled posting fills it.
// - ibv_reg_dmabuf_mr mmaps the fd (a memfd works) at offset; iova addresses the region. With
//   LOOMTEST_FAKEVERBS_DMABUF=0 it fails with EOPNOTSUPP (a NIC without dma-buf support).
// - GPU memory's visibility: with LOOMTEST_FAKEVERBS_GPU_WRITE_DELAY_MS=N (N > 0), an RDMA write
//   into a dma-buf registration completes at once but lands N ms later, unless a read through a
//   dma-buf registration of the same process (the flush of NCCL's plugins, iflush) lands every
//   such write first: a NIC's PCIe writes to a GPU are not ordered with the completion the CPU
//   polls, and a consumer that does not flush may read the old bytes.
// - Completion channels: ibv_req_notify_cq (solicited_only 0; 1 is EOPNOTSUPP, not emulated) arms
//   a CQ once: the next completion added to it queues one event on its channel, whose fd is
//   readable while an event is queued (O_NONBLOCK: ibv_get_cq_event returns -1/EAGAIN instead of
//   blocking). Completions already queued when it is armed raise none (poll after arming, as on
//   hardware). ibv_destroy_cq drops its unread events; with events returned by ibv_get_cq_event
//   and not acknowledged it prints why and aborts (libibverbs would wait forever).
//   ibv_destroy_comp_channel with CQs on it: EBUSY. A CQ and its channel must share a context.
//   With LOOMTEST_FAKEVERBS_CHANNELS=0, ibv_create_comp_channel fails with EMFILE (a process out
//   of file descriptors).
// - CQ overflow is not detected. Atomics, SRQ, UD and memory windows are not emulated.
//   ibv_dealloc_pd with live MRs or QPs, and ibv_destroy_cq with QPs attached: EBUSY.
// - ctx->async_fd is a pipe, readable while an event is queued (set it O_NONBLOCK for
//   ibv_get_async_event to return -1/EAGAIN instead of blocking).
// - Thread safety as real verbs. After fork() the child starts afresh (new addresses); objects
//   made before the fork are not usable in the child.
// - Queries after IBV_EVENT_DEVICE_FATAL fail with EIO; the next ibv_get_device_list gives a
//   fresh device of the same name.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// Sets port `port` (from 1) of every device named `dev` ACTIVE (active != 0) or DOWN. Down: QPs
// of the port go to the error state (the oldest outstanding send fails with
// IBV_WC_RETRY_EXC_ERR, the rest flush), requests to it from peers fail as to a dead peer, and
// IBV_EVENT_PORT_ERR is queued on every open context of the device; up: IBV_EVENT_PORT_ACTIVE.
// Returns 0, or -1 when no such device or port exists.
int loomtest_fakeverbs_set_port_state(const char* dev, int port, int active);

// Makes every device named `dev` fail: IBV_EVENT_DEVICE_FATAL on its open contexts, all its QPs
// to the error state (flushed), its ports down. Returns 0, or -1 when no such device exists.
int loomtest_fakeverbs_device_fatal(const char* dev);

// How many objects of a kind are alive in this process: "context", "pd", "mr", "cq", "qp",
// "channel" (completion channels); or,
// for "reg_mr_calls", how many times ibv_reg_mr was called in this process (failed calls
// included; never decreases): tests check with it that registered memory is not registered
// again per message. Returns -1 for an unknown kind. For leak checks in tests.
int loomtest_fakeverbs_count(const char* kind);

typedef int (*loomtest_fakeverbs_set_port_state_fn)(const char*, int, int);
typedef int (*loomtest_fakeverbs_device_fatal_fn)(const char*);
typedef int (*loomtest_fakeverbs_count_fn)(const char*);

#ifdef __cplusplus
}
#endif

// The C reference: two RC QPs on one device connected to each other, then
// for each operation (8-byte READ, WRITE, FETCH_ADD, CMP_SWAP): a warm-up,
// then N times ibv_post_send + ibv_poll_cq until the completion, between two
// icount markers. Prints one line per operation:
//   verbs-loop <op> <n> <µs per op, the N ops timed as a whole>
//   gcc -O2 -o verbs-loop verbs-loop.c -libverbs
//   verbs-loop DEVICE GID_INDEX N [OPS (read,write,fadd,cas)]
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "marker.h"

static void die(const char *what) {
  perror(what);
  exit(1);
}

struct side {
  struct ibv_cq *cq;
  struct ibv_qp *qp;
};

static struct side make_side(struct ibv_context *ctx, struct ibv_pd *pd) {
  struct side s;
  s.cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
  if (!s.cq) die("ibv_create_cq");
  struct ibv_qp_init_attr attr = {.send_cq = s.cq, .recv_cq = s.cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 128, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
  s.qp = ibv_create_qp(pd, &attr);
  if (!s.qp) die("ibv_create_qp");
  return s;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest_qpn, union ibv_gid gid, int gid_index) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                          .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC};
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) die("INIT");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest_qpn;
  a.max_dest_rd_atomic = 16;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.sgid_index = gid_index;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) die("RTR");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 16;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                IBV_QP_MAX_QP_RD_ATOMIC)) die("RTS");
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void loop(struct side *c, struct ibv_send_wr *wr, int n) {
  struct ibv_wc wc;
  for (int i = 0; i < n; i++) {
    struct ibv_send_wr *bad;
    wr->wr_id = i;
    if (ibv_post_send(c->qp, wr, &bad)) die("ibv_post_send");
    int got;
    while ((got = ibv_poll_cq(c->cq, 1, &wc)) == 0) {}
    if (got < 0 || wc.status != IBV_WC_SUCCESS) {
      fprintf(stderr, "completion failed: %s\n", ibv_wc_status_str(wc.status));
      exit(1);
    }
  }
}

int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: verbs-loop DEVICE GID_INDEX N [OPS]\n"); return 2; }
  const char *name = argv[1];
  int gid_index = atoi(argv[2]), n = atoi(argv[3]);
  const char *ops = argc > 4 ? argv[4] : "read,write,fadd,cas";
  int count;
  struct ibv_device **list = ibv_get_device_list(&count);
  struct ibv_context *ctx = NULL;
  for (int i = 0; list && i < count && !ctx; i++) {
    if (!strcmp(ibv_get_device_name(list[i]), name)) ctx = ibv_open_device(list[i]);
  }
  if (!ctx) die("ibv_open_device");
  struct ibv_pd *pd = ibv_alloc_pd(ctx);
  if (!pd) die("ibv_alloc_pd");
  static uint64_t local[8], remote[8];
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
  struct ibv_mr *lmr = ibv_reg_mr(pd, local, sizeof local, access), *rmr = ibv_reg_mr(pd, remote, sizeof remote, access);
  if (!lmr || !rmr) die("ibv_reg_mr");
  struct side c = make_side(ctx, pd), s = make_side(ctx, pd);
  union ibv_gid gid;
  if (ibv_query_gid(ctx, 1, gid_index, &gid)) die("ibv_query_gid");
  connect_qp(c.qp, s.qp->qp_num, gid, gid_index);
  connect_qp(s.qp, c.qp->qp_num, gid, gid_index);

  struct ibv_sge sge = {.addr = (uintptr_t)local, .length = 8, .lkey = lmr->lkey};
  const struct { const char *name; enum ibv_wr_opcode opcode; } kinds[] = {
      {"read", IBV_WR_RDMA_READ}, {"write", IBV_WR_RDMA_WRITE},
      {"fadd", IBV_WR_ATOMIC_FETCH_AND_ADD}, {"cas", IBV_WR_ATOMIC_CMP_AND_SWP}};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    if (!strstr(ops, kinds[k].name)) continue;
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = kinds[k].opcode, .send_flags = IBV_SEND_SIGNALED};
    if (kinds[k].opcode == IBV_WR_ATOMIC_FETCH_AND_ADD || kinds[k].opcode == IBV_WR_ATOMIC_CMP_AND_SWP) {
      wr.wr.atomic.remote_addr = (uintptr_t)remote;
      wr.wr.atomic.rkey = rmr->rkey;
      wr.wr.atomic.compare_add = 1;
    } else {
      wr.wr.rdma.remote_addr = (uintptr_t)remote;
      wr.wr.rdma.rkey = rmr->rkey;
    }
    loop(&c, &wr, n / 4 + 10);  // warm-up
    double t0 = now_us();
    icount_mark(1);
    loop(&c, &wr, n);
    icount_mark(2);
    double us = (now_us() - t0) / n;
    printf("verbs-loop %s %d %.3f\n", kinds[k].name, n, us);
    fflush(stdout);
  }
  ibv_destroy_qp(c.qp);
  ibv_destroy_qp(s.qp);
  ibv_destroy_cq(c.cq);
  ibv_destroy_cq(s.cq);
  ibv_dereg_mr(lmr);
  ibv_dereg_mr(rmr);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return 0;
}

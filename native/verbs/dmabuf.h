// dma-buf memory regions (ibv_reg_dmabuf_mr, rdma-core 34, IBVERBS_1.12):
// looked up at run time so the prebuilds still load on rdma-core 28.
#pragma once

#include <infiniband/verbs.h>
#include <napi.h>

#include <cstdint>

namespace ibv {

// ibv_reg_dmabuf_mr, or a thrown EOPNOTSUPP that says why: this libibverbs
// lacks the symbol (rdma-core older than 34), or the device/provider
// refused (errno as the call set it).
ibv_mr* RegisterDmabufMr(Napi::Env env, ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                         int access);

// Test hooks: whether the symbol was found, and hiding it (as rdma-core < 34 would).
bool HasRegDmabufMr();
void HideRegDmabufMrForTest();

}  // namespace ibv

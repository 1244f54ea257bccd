#include "dmabuf.h"

#include <uv.h>

#include <cerrno>
#include <string>

#include "common.h"

namespace ibv {

namespace {

using RegDmabufMr = ibv_mr* (*)(ibv_pd*, uint64_t, size_t, uint64_t, int, int);

bool hidden_for_test = false;

// See gid_entry.cc for why libuv's dlopen/dlsym and not a (weak) reference.
RegDmabufMr FindRegDmabufMr() {
  static const RegDmabufMr fn = []() -> RegDmabufMr {
    static uv_lib_t lib;  // never closed: the addon keeps libibverbs loaded anyway
    if (uv_dlopen("libibverbs.so.1", &lib) != 0) {
      uv_dlclose(&lib);
      return nullptr;
    }
    void* symbol = nullptr;
    if (uv_dlsym(&lib, "ibv_reg_dmabuf_mr", &symbol) != 0) return nullptr;
    return reinterpret_cast<RegDmabufMr>(symbol);
  }();
  return hidden_for_test ? nullptr : fn;
}

}  // namespace

bool HasRegDmabufMr() { return FindRegDmabufMr() != nullptr; }

void HideRegDmabufMrForTest() { hidden_for_test = true; }

ibv_mr* RegisterDmabufMr(Napi::Env env, ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                         int access) {
  RegDmabufMr reg = FindRegDmabufMr();
  if (!reg) {
    Napi::Error error = ErrnoError(env, EOPNOTSUPP, "ibv_reg_dmabuf_mr");
    error.Set("message", "ibv_reg_dmabuf_mr: this libibverbs has no dma-buf registration (rdma-core too old: "
                         "it arrived in rdma-core 34)");
    throw error;
  }
  errno = 0;
  ibv_mr* mr = reg(pd, offset, length, iova, fd, access);
  if (!mr) ThrowErrno(env, errno ? errno : EOPNOTSUPP, "ibv_reg_dmabuf_mr");
  return mr;
}

}  // namespace ibv

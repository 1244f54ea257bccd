// fork() and registered memory: what libibverbs says about it
// (ibv_is_fork_initialized) and its opt-in protection (ibv_fork_init).
// Kernels from 5.13 copy pinned pages into the child at fork, so the parent
// keeps its registered pages and rdma-core reports IBV_FORK_UNNEEDED.
#include <errno.h>
#include <infiniband/verbs.h>
#include <uv.h>

#include "common.h"

namespace ibv {

namespace {

using IsForkInitialized = int (*)();

// ibv_is_fork_initialized arrived in rdma-core 35 (IBVERBS_1.13): looked up at
// run time so the addon still loads on rdma-core 28 (the prebuilds' floor;
// see gid_entry.cc for why libuv's dlsym).
IsForkInitialized FindIsForkInitialized() {
  static const IsForkInitialized fn = []() -> IsForkInitialized {
    static uv_lib_t lib;  // never closed: the addon keeps libibverbs loaded anyway
    if (uv_dlopen("libibverbs.so.1", &lib) != 0) {
      uv_dlclose(&lib);
      return nullptr;
    }
    void* symbol = nullptr;
    if (uv_dlsym(&lib, "ibv_is_fork_initialized", &symbol) != 0) return nullptr;
    return reinterpret_cast<IsForkInitialized>(symbol);
  }();
  return fn;
}

// Without ibv_is_fork_initialized (rdma-core < 35) all that is known is
// whether this addon's own ibv_fork_init call succeeded.
bool forkInitDone = false;  // process-wide, as libibverbs' own fork state is

int ForkStatus() {
  IsForkInitialized isForkInitialized = FindIsForkInitialized();
  if (isForkInitialized) return isForkInitialized();
  return forkInitDone ? IBV_FORK_ENABLED : IBV_FORK_DISABLED;
}

}  // namespace

void InitFork(Napi::Env env, Napi::Object exports) {
  exports.Set("forkStatus", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
                switch (ForkStatus()) {
                  case IBV_FORK_ENABLED: return Napi::String::New(info.Env(), "enabled");
                  case IBV_FORK_UNNEEDED: return Napi::String::New(info.Env(), "unneeded");
                  default: return Napi::String::New(info.Env(), "disabled");
                }
              }));
  exports.Set("forkInit", Napi::Function::New(env, [](const Napi::CallbackInfo& info) {
                int err = ibv_fork_init();
                if (err) ThrowErrno(info.Env(), err < 0 ? -err : err, "ibv_fork_init");
                forkInitDone = true;
              }));
}

}  // namespace ibv

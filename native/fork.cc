// fork() and registered memory: what libibverbs says about it
// (ibv_is_fork_initialized) and its opt-in protection (ibv_fork_init).
// Kernels from 5.13 copy pinned pages into the child at fork, so the parent
// keeps its registered pages and rdma-core reports IBV_FORK_UNNEEDED.
#include <errno.h>
#include <infiniband/verbs.h>

#include "common.h"

namespace ibv {

void InitFork(Napi::Env env, Napi::Object exports) {
  exports.Set("forkStatus", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
                switch (ibv_is_fork_initialized()) {
                  case IBV_FORK_ENABLED: return Napi::String::New(info.Env(), "enabled");
                  case IBV_FORK_UNNEEDED: return Napi::String::New(info.Env(), "unneeded");
                  default: return Napi::String::New(info.Env(), "disabled");
                }
              }));
  exports.Set("forkInit", Napi::Function::New(env, [](const Napi::CallbackInfo& info) {
                int err = ibv_fork_init();
                if (err) ThrowErrno(info.Env(), err < 0 ? -err : err, "ibv_fork_init");
              }));
}

}  // namespace ibv

// Addon entry point: per-instance data, class registration, and the cleanup
// hook that closes every resource still open when the environment ends
// (process exit or worker termination).
#include "addon.h"

#include "resources.h"

namespace ibv {

void InitTestHooks(Napi::Env env, Napi::Object exports);  // native/test_hooks.cc

namespace {

void CloseAll(void* arg) {
  auto* data = static_cast<AddonData*>(arg);
  data->tearing_down = true;
  for (auto& weak : data->roots) {
    if (auto root = weak.lock()) root->Close();
  }
  data->roots.clear();
  data->address_handles.clear();
  data->async_watchers.clear();
}

}  // namespace

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  auto* data = new AddonData();
  env.SetInstanceData<AddonData>(data);
  napi_add_env_cleanup_hook(env, CloseAll, data);
  InitContext(env, exports, data);
  InitProtectionDomain(env, exports, data);
  InitMemory(env, exports, data);
  InitCompletionQueue(env, exports, data);
  InitQueuePair(env, exports, data);
  InitSharedReceiveQueue(env, exports, data);
  InitAddressHandle(env, exports, data);
  InitMemoryWindow(env, exports, data);
  InitCm(env, exports, data);
  InitTestHooks(env, exports);
  exports.Set("completionWords", Napi::Number::New(env, kCompletionWords));
  exports.Set("sendHeaderWords", Napi::Number::New(env, kSendHeaderWords));
  exports.Set("recvHeaderWords", Napi::Number::New(env, kRecvHeaderWords));
  return exports;
}

}  // namespace ibv

static Napi::Object InitAddon(Napi::Env env, Napi::Object exports) { return ibv::Init(env, exports); }

NODE_API_MODULE(node_ibverbs, InitAddon)

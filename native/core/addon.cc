// Addon entry point: per-instance data, class registration, and the cleanup
// hook that closes every resource still open when the environment ends
// (process exit or worker termination).
#include "addon.h"

#include <cstdlib>
#include <cstring>

#include "async_events.h"
#include "resources.h"

namespace ibv {

void InitTestHooks(Napi::Env env, Napi::Object exports);  // native/test_hooks.cc
void InitFork(Napi::Env env, Napi::Object exports);       // native/fork.cc

namespace {

void CloseAll(void* arg) {
  auto* data = static_cast<AddonData*>(arg);
  data->tearing_down = true;
  for (auto& weak : data->roots) {
    if (auto root = weak.lock()) root->Close();
  }
  data->roots.clear();
  data->address_handles.clear();
  UnsubscribeAllAsyncEvents(data);
  for (auto& context : data->loop_contexts) {
    if (context) napi_async_destroy(data->env, context);
    context = nullptr;
  }
}

void CreateLoopContexts(Napi::Env env, AddonData* data) {
  const char* names[] = {"node-ibverbs:completions", "node-ibverbs:async-event", "node-ibverbs:cm-event"};
  for (int i = 0; i < static_cast<int>(LoopCallback::Count); i++) {
    napi_status status = napi_async_init(env, nullptr, Napi::String::New(env, names[i]), &data->loop_contexts[i]);
    NAPI_THROW_IF_FAILED_VOID(env, status);
  }
}

}  // namespace

napi_async_context AsyncContextOf(Napi::Env env, LoopCallback kind) {
  return AddonData::Get(env)->loop_contexts[static_cast<int>(kind)];
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  auto* data = new AddonData();
  data->env = env;
  env.SetInstanceData<AddonData>(data);
  CreateLoopContexts(env, data);
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
  // Test-only entry points exist only when the process asks for them (the
  // test configs set NODE_IBVERBS_TEST_HOOKS=1): a service never has them.
  const char* hooks = std::getenv("NODE_IBVERBS_TEST_HOOKS");
  if (hooks != nullptr && std::strcmp(hooks, "1") == 0) InitTestHooks(env, exports);
  InitFork(env, exports);
  // For tests: how many top-level resources the cleanup hook tracks.
  exports.Set("rootCount", Napi::Function::New(env, [](const Napi::CallbackInfo& info) {
                return Napi::Number::New(info.Env(), static_cast<double>(AddonData::Get(info.Env())->RootCount()));
              }));
  exports.Set("completionWords", Napi::Number::New(env, kCompletionWords));
  exports.Set("sendHeaderWords", Napi::Number::New(env, kSendHeaderWords));
  exports.Set("recvHeaderWords", Napi::Number::New(env, kRecvHeaderWords));
  return exports;
}

}  // namespace ibv

static Napi::Object InitAddon(Napi::Env env, Napi::Object exports) { return ibv::Init(env, exports); }

NODE_API_MODULE(node_ibverbs, InitAddon)

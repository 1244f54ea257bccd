// Per-addon-instance state: constructors and the roots of the resource tree,
// closed by the environment cleanup hook. Nothing lives in C++ statics, so the
// addon works in worker threads.
#pragma once

#include <napi.h>

#include <algorithm>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "fd_watcher.h"
#include "work_request.h"

namespace ibv {

struct AddonData {
  napi_env env = nullptr;
  // Constructors of wrappers that native code creates itself.
  Napi::FunctionReference queue_pair;  // QPs made by rdma_create_qp
  Napi::FunctionReference cm_id;       // ids that arrive with connection requests
  // Top-level resources (device contexts, rdma_cm channels); closing them
  // closes everything below.
  std::vector<std::weak_ptr<Resource>> roots;
  bool tearing_down = false;
  WorkRequestScratch scratch;
  // UD work requests name their address handle by id.
  std::unordered_map<uint32_t, std::weak_ptr<Resource>> address_handles;
  uint32_t next_address_handle_id = 1;
  // Device async events: the contexts this instance subscribed to (a
  // process-wide reader per context delivers to each subscriber; see
  // async_events.h), and the JS handler.
  std::vector<ibv_context*> async_subscriptions;
  Napi::FunctionReference on_async_event;
  napi_async_context loop_contexts[static_cast<int>(LoopCallback::Count)] = {};
  uint32_t next_cm_id_key = 1;

  static AddonData* Get(Napi::Env env) { return env.GetInstanceData<AddonData>(); }
  // Prunes roots that are gone or closed first, so that opening and dropping devices
  // and channels in a loop does not grow the list without bound.
  void AddRoot(const std::shared_ptr<Resource>& root) {
    roots.erase(std::remove_if(roots.begin(), roots.end(),
                               [](const std::weak_ptr<Resource>& weak) {
                                 auto root = weak.lock();
                                 return !root || root->closed();
                               }),
                roots.end());
    roots.push_back(root);
  }
  size_t RootCount() const { return roots.size(); }
};

// Class registration functions, one per file.
void InitContext(Napi::Env env, Napi::Object exports, AddonData* data);
void InitProtectionDomain(Napi::Env env, Napi::Object exports, AddonData* data);
void InitMemory(Napi::Env env, Napi::Object exports, AddonData* data);
void InitCompletionQueue(Napi::Env env, Napi::Object exports, AddonData* data);
void InitQueuePair(Napi::Env env, Napi::Object exports, AddonData* data);
void InitSharedReceiveQueue(Napi::Env env, Napi::Object exports, AddonData* data);
void InitAddressHandle(Napi::Env env, Napi::Object exports, AddonData* data);
void InitMemoryWindow(Napi::Env env, Napi::Object exports, AddonData* data);
void InitCm(Napi::Env env, Napi::Object exports, AddonData* data);

}  // namespace ibv

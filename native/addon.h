// Per-addon-instance state: constructors and the roots of the resource tree,
// closed by the environment cleanup hook. Nothing lives in C++ statics, so the
// addon works in worker threads.
#pragma once

#include <napi.h>

#include <memory>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "fd_watcher.h"
#include "work_request.h"

namespace ibv {

struct AddonData {
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
  // Device async events: one fd watcher per context, one JS handler.
  std::unordered_map<ibv_context*, std::unique_ptr<FdWatcher>> async_watchers;
  Napi::FunctionReference on_async_event;
  uint32_t next_cm_id_key = 1;

  static AddonData* Get(Napi::Env env) { return env.GetInstanceData<AddonData>(); }
  void AddRoot(const std::shared_ptr<Resource>& root) { roots.push_back(root); }
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

// The C handles behind each wrapped class, as reference-counted resources.
// A child resource holds its parents through Resource::AdoptParent (common.h).
#pragma once

#include <sys/mman.h>

#include <infiniband/verbs.h>
#include <napi.h>
#include <rdma/rdma_cma.h>

#include <cstdlib>
#include <memory>
#include <unordered_set>
#include <vector>

#include "common.h"
#include "fd_watcher.h"

namespace ibv {

struct AddonData;

struct CqResource;

// One completion channel per device context, shared by its CQs: one fd and
// one watcher on the loop however many CQs (thousands of connections) there
// are. Each CQ is created with itself as cq_context, so an event names its
// CQ. Held by the CQs; the last one to go closes it (before the context).
struct CompChannel : std::enable_shared_from_this<CompChannel> {
  ibv_comp_channel* channel = nullptr;
  FdWatcher watcher;
  std::unordered_set<CqResource*> cqs;  // attached and not destroyed
  int waiting = 0;                       // CQs that keep the loop alive
  ~CompChannel() {
    watcher.Stop();  // before the fd closes
    if (channel) ibv_destroy_comp_channel(channel);
  }
};

struct ContextResource : Resource {
  const char* kind() const override { return "Device"; }
  const char* destroy_call() const override { return "ibv_close_device"; }
  ibv_context* ctx = nullptr;
  bool owned = true;  // false for librdmacm's contexts (shared, never closed here)
  // A one-entry rdma_get_devices() list held while this Device is open: librdmacm
  // counts it, so it closes a removed device's context only after this Device closed.
  ibv_context** rdmacm_ref = nullptr;
  AddonData* addon = nullptr;
  std::weak_ptr<CompChannel> comp_channel;  // made by the first CQ
  ~ContextResource() override { Close(); }
  int DestroyHandle() override;
};

struct PdResource : Resource {
  const char* kind() const override { return "ProtectionDomain"; }
  const char* destroy_call() const override { return "ibv_dealloc_pd"; }
  ibv_pd* pd = nullptr;
  ~PdResource() override { Close(); }
  int DestroyHandle() override;
};

// Page-aligned memory owned by the library. Shared by the NativeBuffer
// wrapper, the ArrayBuffer views handed to JS, and memory regions over it: it
// is freed when the last of them is gone.
// Anonymous pages from mmap: page-aligned and zero-filled by the kernel, so a
// large buffer costs nothing until it is touched (or registered).
struct BufferMemory {
  void* data = nullptr;
  size_t size = 0;    // what the user asked for
  size_t mapped = 0;  // size rounded up to whole pages
  ~BufferMemory() {
    if (data) munmap(data, mapped);
  }
};

struct MrResource : Resource {
  const char* kind() const override { return "MemoryRegion"; }
  const char* destroy_call() const override { return "ibv_dereg_mr"; }
  bool close_last() const override { return true; }
  ibv_mr* mr = nullptr;
  std::shared_ptr<BufferMemory> native_memory;  // or:
  Napi::Reference<Napi::ArrayBuffer> js_memory;  // keeps a JS buffer alive while registered
  ~MrResource() override { Close(); }
  int DestroyHandle() override;
};

struct CqResource : Resource {
  const char* kind() const override { return "CompletionQueue"; }
  const char* destroy_call() const override { return "ibv_destroy_cq"; }
  ibv_cq* cq = nullptr;
  std::shared_ptr<CompChannel> channel;  // the context's, shared with its other CQs
  bool waiting = false;                  // counted in channel->waiting
  bool failed = false;                   // its channel failed for it: no event is handled any more
  Napi::FunctionReference on_completions;
  Napi::Reference<Napi::ArrayBuffer> output;  // completions are written here
  uint32_t* output_words = nullptr;
  uint32_t output_capacity = 0;  // completions that fit
  // The output's last word: the count of the last poll, for the hot-path
  // functions that return nothing (making a number costs ~50 instructions).
  uint32_t* count_word = nullptr;
  std::vector<ibv_wc> wcs;
  bool rearm = true;  // false for busy polling: the loop polls, no wakeups needed
  ~CqResource() override;
  int DestroyHandle() override;
};

struct SrqResource : Resource {
  const char* kind() const override { return "SharedReceiveQueue"; }
  const char* destroy_call() const override { return "ibv_destroy_srq"; }
  ibv_srq* srq = nullptr;
  ~SrqResource() override { Close(); }
  int DestroyHandle() override;
};

struct QpResource : Resource {
  const char* kind() const override { return "QueuePair"; }
  const char* destroy_call() const override { return "ibv_destroy_qp"; }
  ibv_qp* qp = nullptr;
  rdma_cm_id* cm_id = nullptr;  // set when rdma_create_qp made it: destroyed with rdma_destroy_qp
  ~QpResource() override { Close(); }
  int DestroyHandle() override;
};

struct AhResource : Resource {
  const char* kind() const override { return "AddressHandle"; }
  const char* destroy_call() const override { return "ibv_destroy_ah"; }
  ibv_ah* ah = nullptr;
  ~AhResource() override { Close(); }
  int DestroyHandle() override;
};

struct MwResource : Resource {
  const char* kind() const override { return "MemoryWindow"; }
  const char* destroy_call() const override { return "ibv_dealloc_mw"; }
  ibv_mw* mw = nullptr;
  ~MwResource() override { Close(); }
  int DestroyHandle() override;
};

// Words per completion in a CQ's output buffer (see lib/native-types.ts).
constexpr uint32_t kCompletionWords = 16;

// Wrapper accessors used across files.
// Each throws ERR_INVALID_ARG_TYPE for another kind of value and ERR_CLOSED
// for a closed object.
std::shared_ptr<ContextResource> ContextOf(Napi::Env env, Napi::Value value);
std::shared_ptr<PdResource> PdOf(Napi::Env env, Napi::Value value);
std::shared_ptr<CqResource> CqOf(Napi::Env env, Napi::Value value);
std::shared_ptr<SrqResource> SrqOf(Napi::Env env, Napi::Value value);
std::shared_ptr<MrResource> MrOf(Napi::Env env, Napi::Value value);
std::shared_ptr<MwResource> MwOf(Napi::Env env, Napi::Value value);
// The address handle registered under an id (UD work requests carry ids).
ibv_ah* AddressHandleById(Napi::Env env, uint32_t id);
// Fills an ibv_ah_attr from {dlid, sl, srcPathBits, staticRate, portNum,
// grh?: {dgid: string, flowLabel, sgidIndex, hopLimit, trafficClass}}.
void FillAhAttr(Napi::Env env, Napi::Object source, ibv_ah_attr* attr);

// Builds a QueuePair wrapper for a QP another object made (rdma_cm's rdma_create_qp).
Napi::Object WrapQp(Napi::Env env, std::shared_ptr<QpResource> resource, const ibv_qp_cap& caps);
// Reads {type, sendCq, recvCq, srq?, maxSendWr, ...} into init attributes;
// the CQ/SRQ resources are returned so the QP can adopt them as parents.
void ReadQpInitAttr(Napi::Env env, Napi::Object options, ibv_qp_init_attr* attr,
                    std::vector<std::shared_ptr<Resource>>* parents);

// Closes a resource from a JS close() call; throws if the handle could not be
// destroyed (e.g. EBUSY).
void CloseOrThrow(Napi::Env env, Resource* resource, const char* syscall);

}  // namespace ibv

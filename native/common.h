// Shared pieces of the addon: the resource base class (lifetimes), errors that
// carry errno, argument readers, and type-tagged unwrapping.
#pragma once

#include <napi.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace ibv {

// A verbs object with a C handle. Children hold their parents with shared_ptr,
// so a parent's handle can never be destroyed before a child's, whatever order
// the GC finalizes wrappers in. A parent keeps weak links to its children so
// that Close() on it closes them first.
class Resource : public std::enable_shared_from_this<Resource> {
 public:
  virtual ~Resource() = default;
  Resource() = default;
  Resource(const Resource&) = delete;
  Resource& operator=(const Resource&) = delete;

  bool closed() const { return closed_; }

  // Closes children, then this handle. Returns 0 or the errno of the first
  // destroy call that failed. Idempotent.
  int Close() {
    if (closed_) return 0;
    int first_error = 0;
    for (auto& weak : children_) {
      if (auto child = weak.lock()) {
        int err = child->Close();
        if (err && !first_error) first_error = err;
      }
    }
    children_.clear();
    int err = DestroyHandle();
    if (err) return first_error ? first_error : err;
    closed_ = true;
    for (auto& parent : parents_) parent->ForgetClosedChildren();
    parents_.clear();
    return first_error;
  }

  void AdoptParent(const std::shared_ptr<Resource>& parent) {
    parents_.push_back(parent);
    parent->children_.push_back(weak_from_this());
  }

 protected:
  // Destroys the C handle; returns 0 or an errno. Called at most once with
  // success; may be called again if it failed (e.g. EBUSY).
  virtual int DestroyHandle() = 0;

 private:
  void ForgetClosedChildren() {
    std::vector<std::weak_ptr<Resource>> live;
    for (auto& weak : children_) {
      auto child = weak.lock();
      if (child && !child->closed()) live.push_back(weak);
    }
    children_.swap(live);
  }

  bool closed_ = false;
  std::vector<std::shared_ptr<Resource>> parents_;
  std::vector<std::weak_ptr<Resource>> children_;
};

// Throws a JS Error with code (errno name), errno and syscall.
[[noreturn]] void ThrowErrno(Napi::Env env, int err, const char* syscall);
Napi::Error ErrnoError(Napi::Env env, int err, const char* syscall);
[[noreturn]] void ThrowCode(Napi::Env env, const char* code, const std::string& message);

// Argument readers: the TypeScript layer validates options; these only stop a
// wrong call from the outside from crashing the process.
uint32_t ArgU32(const Napi::CallbackInfo& info, size_t index, const char* name);
std::string ArgString(const Napi::CallbackInfo& info, size_t index, const char* name);
Napi::Function ArgFunction(const Napi::CallbackInfo& info, size_t index, const char* name);
// Pointer and length of an ArrayBuffer or ArrayBufferView argument.
void ArgBytes(const Napi::CallbackInfo& info, size_t index, const char* name, uint8_t** data,
              size_t* length, Napi::ArrayBuffer* backing);

Napi::Value BigU64(Napi::Env env, uint64_t value);

// Type tags, one per wrapped class: an object of one kind can never be
// unwrapped as another.
enum class Kind : uint32_t {
  Context = 1,
  ProtectionDomain,
  MemoryRegion,
  NativeBuffer,
  CompletionQueue,
  QueuePair,
  SharedReceiveQueue,
  AddressHandle,
  MemoryWindow,
  CmEventChannel,
  CmId,
};
void TagObject(Napi::Env env, Napi::Object object, Kind kind);
bool HasTag(Napi::Env env, Napi::Value value, Kind kind);

template <typename T>
T* UnwrapKind(Napi::Env env, Napi::Value value, Kind kind, const char* name) {
  if (!HasTag(env, value, kind)) {
    ThrowCode(env, "ERR_INVALID_ARG_TYPE", std::string("Expected a ") + name);
  }
  return Napi::ObjectWrap<T>::Unwrap(value.As<Napi::Object>());
}

// Throws ERR_CLOSED when a wrapper's resource has been closed.
template <typename R>
R* Live(Napi::Env env, const std::shared_ptr<R>& resource, const char* what) {
  if (!resource || resource->closed()) {
    ThrowCode(env, "ERR_CLOSED", std::string(what) + " is closed");
  }
  return resource.get();
}

}  // namespace ibv

namespace ibv {
// Calls a JS callback from a libuv callback: with a handle scope, draining
// microtasks afterwards, and reporting a thrown exception as uncaught instead
// of letting it cross into libuv.
void CallFromLoop(Napi::Env env, Napi::FunctionReference& callback,
                  const std::initializer_list<napi_value>& args);
}  // namespace ibv

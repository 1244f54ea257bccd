// Shared pieces of the addon: the resource base class (lifetimes), errors that
// carry errno, argument readers, and type-tagged unwrapping.
#pragma once

#include <napi.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
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

  // Closes the children, newest first (the reverse of creation) and memory
  // regions after their siblings (queue pairs may still name them in work
  // requests), as lib/core/resource.ts does; then this handle. Transactional: at the first
  // child or handle that fails to close it stops, and that child and every
  // resource above it stay open (and usable); the error says which object
  // refused and why. Returns 0 or the errno of the refusal. Idempotent.
  int Close() {
    failed_ = nullptr;
    if (closed_) return 0;
    // A snapshot: a child that closes removes itself from children_.
    std::vector<std::shared_ptr<Resource>> live;
    for (int last = 0; last < 2; last++) {
      for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
        auto child = it->lock();
        if (child && child->close_last() == (last == 1)) live.push_back(std::move(child));
      }
    }
    for (auto& child : live) {
      int err = child->Close();
      if (err) {
        failed_ = child->failed_;
        return err;
      }
    }
    int err = DestroyHandle();
    if (err) {
      failed_ = this;
      return err;
    }
    closed_ = true;
    children_.clear();
    for (auto& parent : parents_) parent->ForgetClosedChildren();
    parents_.clear();
    return 0;
  }

  // After a failed Close(): the resource whose handle refused (this one or a
  // descendant); valid until the next Close().
  const Resource* failed() const { return failed_; }
  // What the resource is and the call that destroys its handle, for errors.
  virtual const char* kind() const = 0;
  // Closed after its siblings (memory regions).
  virtual bool close_last() const { return false; }
  virtual const char* destroy_call() const = 0;

  void AdoptParent(const std::shared_ptr<Resource>& parent) {
    parents_.push_back(parent);
    parent->children_.push_back(weak_from_this());
  }

 protected:
  // Destroys the C handle; returns 0 or the errno the destroy call returned
  // (never the global errno: verbs destroy calls return their error). Called
  // at most once with success; called again after a failure (e.g. EBUSY), so a
  // failure must leave the handle and everything it needs intact.
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
  const Resource* failed_ = nullptr;
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
// Runs the body of a callback that libuv (or a thread-safe function) calls:
// in a handle scope and inside try, so that no C++ exception ever unwinds into
// libuv (that would std::terminate the process). An exception thrown by JS or
// while building arguments is reported as uncaught ('uncaughtException').
void GuardFromLoop(Napi::Env env, const std::function<void()>& body);

// Calls a JS callback from such a body in a callback scope with `context`
// (async hooks and AsyncLocalStorage see a proper async resource; microtasks
// drain afterwards). Rethrows what the callback threw, for GuardFromLoop.
// Returns false if the (weakly held) callback was collected.
bool CallFromLoop(Napi::Env env, napi_async_context context, Napi::FunctionReference& callback,
                  const std::initializer_list<napi_value>& args);

// Whether this environment still runs JS. False while a Worker is being
// terminated: its loop may still dispatch a callback, and node-addon-api
// aborts the process when a call that needs JS fails there. Loop callbacks
// that build objects (setters, constructors) check it first; it costs an
// object and a property set, so the completion path (which only passes
// numbers to CallFromLoop) does not.
bool CanRunJs(napi_env env);

// Async contexts of the addon's loop callbacks, one per kind; created at
// load, destroyed by the environment cleanup hook.
enum class LoopCallback { Completions, AsyncEvents, CmEvents, Count };
napi_async_context AsyncContextOf(Napi::Env env, LoopCallback kind);
}  // namespace ibv

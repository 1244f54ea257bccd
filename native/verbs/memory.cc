// Library-owned native buffers and memory regions (over native buffers or JS
// ArrayBuffers / views, zero copy).
#include <unistd.h>

#include "addon.h"
#include "dmabuf.h"
#include "resources.h"

namespace ibv {

int MrResource::DestroyHandle() {
  if (mr) {
    int rc = ibv_dereg_mr(mr);
    if (rc != 0) return rc;
  }
  mr = nullptr;
  native_memory.reset();
  js_memory.Reset();
  return 0;
}

namespace {

class NativeBufferWrap : public Napi::ObjectWrap<NativeBufferWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "NativeBuffer",
                       {InstanceMethod("view", &NativeBufferWrap::View),
                        InstanceMethod("release", &NativeBufferWrap::Release),
                        InstanceAccessor("address", &NativeBufferWrap::Address, nullptr),
                        InstanceAccessor("size", &NativeBufferWrap::Size, nullptr)});
  }

  // new NativeBuffer(size): page-aligned, zero-filled memory.
  explicit NativeBufferWrap(const Napi::CallbackInfo& info)
      : Napi::ObjectWrap<NativeBufferWrap>(info) {
    Napi::Env env = info.Env();
    TagObject(env, info.This().As<Napi::Object>(), Kind::NativeBuffer);
    double size = info.Length() > 0 && info[0].IsNumber() ? info[0].As<Napi::Number>().DoubleValue() : -1;
    if (!(size >= 1 && size <= 9007199254740991.0 && size == static_cast<double>(static_cast<size_t>(size)))) {
      ThrowCode(env, "ERR_OUT_OF_RANGE", "Expected a size of at least 1 byte");
    }
    size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    size_t rounded = (static_cast<size_t>(size) + page - 1) / page * page;
    void* data = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) ThrowErrno(env, errno ? errno : ENOMEM, "mmap");
    memory = std::make_shared<BufferMemory>();
    memory->data = data;
    memory->size = static_cast<size_t>(size);
    memory->mapped = rounded;
  }

  std::shared_ptr<BufferMemory> memory;

 private:
  BufferMemory* Memory(Napi::Env env) {
    if (!memory) ThrowCode(env, "ERR_CLOSED", "NativeBuffer is released");
    return memory.get();
  }

  // view(offset = 0, length = size - offset): an ArrayBuffer over a window of
  // the memory, which stays alive as long as any view does. A view holds at
  // most kMaxViewBytes (what a Node 20 ArrayBuffer made from external memory
  // can hold): larger memory is seen through several windows.
  Napi::Value View(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    BufferMemory* mem = Memory(env);
    size_t offset = OptionalSize(info, 0, "offset", 0);
    if (offset > mem->size) ThrowCode(env, "ERR_OUT_OF_RANGE", "Expected an offset inside the buffer");
    size_t length = OptionalSize(info, 1, "length", mem->size - offset);
    if (length > mem->size - offset) ThrowCode(env, "ERR_OUT_OF_RANGE", "Expected a window inside the buffer");
    if (length > kMaxViewBytes) {
      ThrowCode(env, "ERR_VIEW_TOO_LARGE",
                "A view holds at most 4 GiB (4294967296 bytes): view a window of the memory instead");
    }
    // Node may run the finalizer itself when it refuses to make the buffer
    // (node::Buffer::New does for too large a length), so node-addon-api's
    // ArrayBuffer::New, which then deletes its finalizer data a second time,
    // is not used. On failure the holder is leaked rather than freed twice.
    auto* hold = new std::shared_ptr<BufferMemory>(memory);
    napi_value result;
    napi_status status = napi_create_external_arraybuffer(
        env, static_cast<uint8_t*>(mem->data) + offset, length,
        [](napi_env, void*, void* hint) { delete static_cast<std::shared_ptr<BufferMemory>*>(hint); }, hold,
        &result);
    if (status != napi_ok) {
      bool pending = false;
      napi_is_exception_pending(env, &pending);
      if (pending) throw env.GetAndClearPendingException();
      ThrowCode(env, "ERR_VIEW_FAILED", "napi_create_external_arraybuffer failed");
    }
    return Napi::Value(env, result);
  }

  static constexpr size_t kMaxViewBytes = size_t{1} << 32;

  static size_t OptionalSize(const Napi::CallbackInfo& info, size_t index, const char* name, size_t fallback) {
    if (info.Length() <= index || info[index].IsUndefined()) return fallback;
    double value = info[index].IsNumber() ? info[index].As<Napi::Number>().DoubleValue() : -1;
    if (!(value >= 0 && value <= 9007199254740991.0 && value == static_cast<double>(static_cast<size_t>(value)))) {
      ThrowCode(info.Env(), "ERR_OUT_OF_RANGE", std::string("Expected a non-negative integer for ") + name);
    }
    return static_cast<size_t>(value);
  }

  Napi::Value Release(const Napi::CallbackInfo& info) {
    memory.reset();
    return info.Env().Undefined();
  }

  Napi::Value Address(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(),
                             static_cast<double>(reinterpret_cast<uintptr_t>(Memory(info.Env())->data)));
  }

  Napi::Value Size(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(Memory(info.Env())->size));
  }
};

class MemoryRegionWrap : public Napi::ObjectWrap<MemoryRegionWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "MemoryRegion",
                       {InstanceMethod("close", &MemoryRegionWrap::CloseMethod),
                        InstanceMethod("info", &MemoryRegionWrap::Info),
                        InstanceMethod("isDetached", &MemoryRegionWrap::IsDetached)});
  }

  // new MemoryRegion(pd, nativeBuffer | ArrayBuffer | view, access), or
  // new MemoryRegion(pd, dmabufFd, access, offset, length, iova): memory the
  // dma-buf owns (the kernel holds its own reference while registered).
  explicit MemoryRegionWrap(const Napi::CallbackInfo& info)
      : Napi::ObjectWrap<MemoryRegionWrap>(info) {
    Napi::Env env = info.Env();
    TagObject(env, info.This().As<Napi::Object>(), Kind::MemoryRegion);
    auto pd = PdOf(env, info[0]);
    uint32_t access = ArgU32(info, 2, "access");
    auto res = std::make_shared<MrResource>();
    if (info[1].IsNumber()) {
      uint32_t fd = ArgU32(info, 1, "fd");
      double offset = ArgSafeInteger(info, 3, "offset");
      double length = ArgSafeInteger(info, 4, "length");
      double iova = ArgSafeInteger(info, 5, "iova");
      if (fd > INT32_MAX || length == 0) ThrowCode(env, "ERR_OUT_OF_RANGE", "Expected an fd and at least 1 byte");
      res->mr = RegisterDmabufMr(env, pd->pd, static_cast<uint64_t>(offset), static_cast<size_t>(length),
                                 static_cast<uint64_t>(iova), static_cast<int>(fd), static_cast<int>(access));
      res->AdoptParent(pd);
      resource = res;
      return;
    }
    uint8_t* data = nullptr;
    size_t length = 0;
    if (HasTag(env, info[1], Kind::NativeBuffer)) {
      auto* buffer = Napi::ObjectWrap<NativeBufferWrap>::Unwrap(info[1].As<Napi::Object>());
      if (!buffer->memory) ThrowCode(env, "ERR_CLOSED", "NativeBuffer is released");
      res->native_memory = buffer->memory;
      data = static_cast<uint8_t*>(buffer->memory->data);
      length = buffer->memory->size;
    } else {
      Napi::ArrayBuffer backing;
      ArgBytes(info, 1, "buffer", &data, &length, &backing);
      bool detached = false;
      napi_is_detached_arraybuffer(env, backing, &detached);
      if (detached) ThrowCode(env, "ERR_DETACHED", "Cannot register a detached ArrayBuffer");
      res->js_memory = Napi::Persistent(backing);
    }
    if (length == 0) ThrowCode(env, "ERR_OUT_OF_RANGE", "Cannot register zero bytes");
    ibv_mr* mr = ibv_reg_mr(pd->pd, data, length, static_cast<int>(access));
    if (!mr) ThrowErrno(env, errno ? errno : EINVAL, "ibv_reg_mr");
    res->mr = mr;
    res->AdoptParent(pd);
    resource = res;
  }

  std::shared_ptr<MrResource> resource;

 private:
  // The TypeScript layer checks ranges; this only stops a crash.
  static double ArgSafeInteger(const Napi::CallbackInfo& info, size_t index, const char* name) {
    double value = info.Length() > index && info[index].IsNumber() ? info[index].As<Napi::Number>().DoubleValue() : -1;
    if (!(value >= 0 && value <= 9007199254740991.0 && value == static_cast<double>(static_cast<uint64_t>(value)))) {
      ThrowCode(info.Env(), "ERR_OUT_OF_RANGE", std::string("Expected a non-negative integer for ") + name);
    }
    return value;
  }

  Napi::Value Info(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ibv_mr* mr = Live(env, resource, "MemoryRegion")->mr;
    Napi::Object o = Napi::Object::New(env);
    o.Set("address", static_cast<double>(reinterpret_cast<uintptr_t>(mr->addr)));
    o.Set("length", static_cast<double>(mr->length));
    o.Set("lkey", mr->lkey);
    o.Set("rkey", mr->rkey);
    return o;
  }

  Napi::Value IsDetached(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    MrResource* res = Live(env, resource, "MemoryRegion");
    bool detached = false;
    if (!res->js_memory.IsEmpty()) napi_is_detached_arraybuffer(env, res->js_memory.Value(), &detached);
    return Napi::Boolean::New(env, detached);
  }

  Napi::Value CloseMethod(const Napi::CallbackInfo& info) {
    if (resource) CloseOrThrow(info.Env(), resource.get(), "ibv_dereg_mr");
    return info.Env().Undefined();
  }
};

}  // namespace

std::shared_ptr<MrResource> MrOf(Napi::Env env, Napi::Value value) {
  auto* wrap = UnwrapKind<MemoryRegionWrap>(env, value, Kind::MemoryRegion, "MemoryRegion");
  Live(env, wrap->resource, "MemoryRegion");
  return wrap->resource;
}

void InitMemory(Napi::Env env, Napi::Object exports, AddonData* data) {
  // For the dma-buf checks (iova and offset must share their page offset).
  exports.Set("pageSize", static_cast<double>(sysconf(_SC_PAGESIZE)));
  Napi::Function buffer = NativeBufferWrap::Define(env);
  exports.Set("NativeBuffer", buffer);
  Napi::Function region = MemoryRegionWrap::Define(env);
  exports.Set("MemoryRegion", region);
}

}  // namespace ibv

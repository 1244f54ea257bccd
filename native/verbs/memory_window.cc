// Memory windows: revocable remote access to part of a memory region.
#include "addon.h"
#include "resources.h"

namespace ibv {

int MwResource::DestroyHandle() {
  if (mw) {
    int rc = ibv_dealloc_mw(mw);
    if (rc != 0) return rc;
  }
  mw = nullptr;
  return 0;
}

namespace {

class MemoryWindowWrap : public Napi::ObjectWrap<MemoryWindowWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "MemoryWindow",
                       {InstanceMethod("close", &MemoryWindowWrap::CloseMethod),
                        InstanceMethod("setRkey", &MemoryWindowWrap::SetRkey),
                        InstanceAccessor("rkey", &MemoryWindowWrap::Rkey, nullptr),
                        InstanceAccessor("type", &MemoryWindowWrap::Type, nullptr)});
  }

  // new MemoryWindow(pd, type: 1 | 2)
  explicit MemoryWindowWrap(const Napi::CallbackInfo& info)
      : Napi::ObjectWrap<MemoryWindowWrap>(info) {
    Napi::Env env = info.Env();
    TagObject(env, info.This().As<Napi::Object>(), Kind::MemoryWindow);
    auto pd = PdOf(env, info[0]);
    uint32_t type = ArgU32(info, 1, "type");
    if (type != 1 && type != 2) ThrowCode(env, "ERR_OUT_OF_RANGE", "Expected memory window type 1 or 2");
    ibv_mw* mw = ibv_alloc_mw(pd->pd, type == 1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2);
    if (!mw) ThrowErrno(env, errno ? errno : EOPNOTSUPP, "ibv_alloc_mw");
    auto res = std::make_shared<MwResource>();
    res->mw = mw;
    res->AdoptParent(pd);
    resource = res;
  }

  std::shared_ptr<MwResource> resource;

 private:
  Napi::Value Rkey(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), Live(info.Env(), resource, "MemoryWindow")->mw->rkey);
  }
  // setRkey(rkey): the rkey the device now holds for the window. A type 2 bind
  // (a BIND_MW work request) names the current rkey and a new one; only its
  // completion tells whether the device took the new one, so the library sets
  // it here then (or puts back the old one after a failed bind).
  Napi::Value SetRkey(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    MwResource* res = Live(env, resource, "MemoryWindow");
    res->mw->rkey = ArgU32(info, 0, "rkey");
    return env.Undefined();
  }
  Napi::Value Type(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(),
                             Live(info.Env(), resource, "MemoryWindow")->mw->type == IBV_MW_TYPE_1 ? 1 : 2);
  }
  Napi::Value CloseMethod(const Napi::CallbackInfo& info) {
    if (resource) CloseOrThrow(info.Env(), resource.get(), "ibv_dealloc_mw");
    return info.Env().Undefined();
  }
};

}  // namespace

std::shared_ptr<MwResource> MwOf(Napi::Env env, Napi::Value value) {
  auto* wrap = UnwrapKind<MemoryWindowWrap>(env, value, Kind::MemoryWindow, "MemoryWindow");
  Live(env, wrap->resource, "MemoryWindow");
  return wrap->resource;
}

void InitMemoryWindow(Napi::Env env, Napi::Object exports, AddonData* data) {
  Napi::Function ctor = MemoryWindowWrap::Define(env);
  exports.Set("MemoryWindow", ctor);
}

}  // namespace ibv

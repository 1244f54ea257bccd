// Protection domain.
#include "addon.h"
#include "resources.h"

namespace ibv {

int PdResource::DestroyHandle() {
  if (pd) {
    int rc = ibv_dealloc_pd(pd);
    if (rc != 0) return rc;
  }
  pd = nullptr;
  return 0;
}

namespace {

class PdWrap : public Napi::ObjectWrap<PdWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "ProtectionDomain",
                       {InstanceMethod("close", &PdWrap::CloseMethod),
                        InstanceAccessor("handle", &PdWrap::Handle, nullptr)});
  }

  explicit PdWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<PdWrap>(info) {
    Napi::Env env = info.Env();
    TagObject(env, info.This().As<Napi::Object>(), Kind::ProtectionDomain);
    auto context = ContextOf(env, info[0]);
    ibv_pd* pd = ibv_alloc_pd(context->ctx);
    if (!pd) ThrowErrno(env, errno ? errno : ENOMEM, "ibv_alloc_pd");
    resource = std::make_shared<PdResource>();
    resource->pd = pd;
    resource->AdoptParent(context);
  }

  std::shared_ptr<PdResource> resource;

 private:
  Napi::Value Handle(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), Live(info.Env(), resource, "ProtectionDomain")->pd->handle);
  }
  Napi::Value CloseMethod(const Napi::CallbackInfo& info) {
    if (resource) CloseOrThrow(info.Env(), resource.get(), "ibv_dealloc_pd");
    return info.Env().Undefined();
  }
};

}  // namespace

std::shared_ptr<PdResource> PdOf(Napi::Env env, Napi::Value value) {
  auto* wrap = UnwrapKind<PdWrap>(env, value, Kind::ProtectionDomain, "ProtectionDomain");
  Live(env, wrap->resource, "ProtectionDomain");
  return wrap->resource;
}

void InitProtectionDomain(Napi::Env env, Napi::Object exports, AddonData* data) {
  Napi::Function ctor = PdWrap::Define(env);
  exports.Set("ProtectionDomain", ctor);
}

}  // namespace ibv

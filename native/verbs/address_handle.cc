// Address handles (UD destinations) and the ah_attr reader shared with QP
// modify (RC/UC paths).
#include <arpa/inet.h>

#include "addon.h"
#include "resources.h"

namespace ibv {

int AhResource::DestroyHandle() {
  if (ah) {
    int rc = ibv_destroy_ah(ah);
    if (rc != 0) return rc;
  }
  ah = nullptr;
  return 0;
}

namespace {
uint32_t Field(Napi::Env env, Napi::Object o, const char* key, uint32_t fallback) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) return fallback;
  if (!v.IsNumber()) ThrowCode(env, "ERR_INVALID_ARG_TYPE", std::string("Expected a number for ") + key);
  return v.As<Napi::Number>().Uint32Value();
}
}  // namespace

void FillAhAttr(Napi::Env env, Napi::Object o, ibv_ah_attr* attr) {
  attr->dlid = static_cast<uint16_t>(Field(env, o, "dlid", 0));
  attr->sl = static_cast<uint8_t>(Field(env, o, "sl", 0));
  attr->src_path_bits = static_cast<uint8_t>(Field(env, o, "srcPathBits", 0));
  attr->static_rate = static_cast<uint8_t>(Field(env, o, "staticRate", 0));
  attr->port_num = static_cast<uint8_t>(Field(env, o, "portNum", 1));
  Napi::Value grh = o.Get("grh");
  if (grh.IsObject()) {
    Napi::Object g = grh.As<Napi::Object>();
    Napi::Value dgid = g.Get("dgid");
    if (!dgid.IsString() ||
        inet_pton(AF_INET6, dgid.As<Napi::String>().Utf8Value().c_str(), attr->grh.dgid.raw) != 1) {
      ThrowCode(env, "ERR_INVALID_ARG_VALUE", "Expected a GID string (IPv6 form) for grh.dgid");
    }
    attr->is_global = 1;
    attr->grh.flow_label = Field(env, g, "flowLabel", 0);
    attr->grh.sgid_index = static_cast<uint8_t>(Field(env, g, "sgidIndex", 0));
    attr->grh.hop_limit = static_cast<uint8_t>(Field(env, g, "hopLimit", 64));
    attr->grh.traffic_class = static_cast<uint8_t>(Field(env, g, "trafficClass", 0));
  }
}

ibv_ah* AddressHandleById(Napi::Env env, uint32_t id) {
  AddonData* data = AddonData::Get(env);
  auto it = data->address_handles.find(id);
  std::shared_ptr<Resource> found = it == data->address_handles.end() ? nullptr : it->second.lock();
  if (!found || found->closed()) ThrowCode(env, "ERR_CLOSED", "AddressHandle is closed");
  return static_cast<AhResource*>(found.get())->ah;
}

namespace {

class AddressHandleWrap : public Napi::ObjectWrap<AddressHandleWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "AddressHandle",
                       {InstanceMethod("close", &AddressHandleWrap::CloseMethod),
                        InstanceAccessor("id", &AddressHandleWrap::Id, nullptr)});
  }

  // new AddressHandle(pd, ahAttr)
  explicit AddressHandleWrap(const Napi::CallbackInfo& info)
      : Napi::ObjectWrap<AddressHandleWrap>(info) {
    Napi::Env env = info.Env();
    TagObject(env, info.This().As<Napi::Object>(), Kind::AddressHandle);
    auto pd = PdOf(env, info[0]);
    if (!info[1].IsObject()) ThrowCode(env, "ERR_INVALID_ARG_TYPE", "Expected an address object");
    ibv_ah_attr attr{};
    FillAhAttr(env, info[1].As<Napi::Object>(), &attr);
    ibv_ah* ah = ibv_create_ah(pd->pd, &attr);
    if (!ah) ThrowErrno(env, errno ? errno : EINVAL, "ibv_create_ah");
    auto res = std::make_shared<AhResource>();
    res->ah = ah;
    res->AdoptParent(pd);
    AddonData* data = AddonData::Get(env);
    id_ = data->next_address_handle_id++;
    data->address_handles[id_] = res;
    resource = res;
    env_ = env;
  }

  ~AddressHandleWrap() override {
    // The table is per instance; at teardown it may already be gone.
    AddonData* data = AddonData::Get(env_);
    if (data && !data->tearing_down) data->address_handles.erase(id_);
  }

  std::shared_ptr<AhResource> resource;

 private:
  Napi::Value Id(const Napi::CallbackInfo& info) {
    Live(info.Env(), resource, "AddressHandle");
    return Napi::Number::New(info.Env(), id_);
  }
  Napi::Value CloseMethod(const Napi::CallbackInfo& info) {
    if (resource) CloseOrThrow(info.Env(), resource.get(), "ibv_destroy_ah");
    return info.Env().Undefined();
  }
  uint32_t id_ = 0;
  Napi::Env env_ = nullptr;
};

}  // namespace

void InitAddressHandle(Napi::Env env, Napi::Object exports, AddonData* data) {
  Napi::Function ctor = AddressHandleWrap::Define(env);
  exports.Set("AddressHandle", ctor);
}

}  // namespace ibv

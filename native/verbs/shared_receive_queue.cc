// Shared receive queue.
#include "addon.h"
#include "resources.h"
#include "work_request.h"

namespace ibv {

int SrqResource::DestroyHandle() {
  if (srq) {
    int rc = ibv_destroy_srq(srq);
    if (rc != 0) return rc;
  }
  srq = nullptr;
  return 0;
}

namespace {

class SrqWrap : public Napi::ObjectWrap<SrqWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "SharedReceiveQueue",
                       {InstanceMethod("postRecv", &SrqWrap::PostRecv),
                        InstanceMethod("arm", &SrqWrap::Arm),
                        InstanceMethod("query", &SrqWrap::Query),
                        InstanceMethod("close", &SrqWrap::CloseMethod),
                        InstanceAccessor("handle", &SrqWrap::Handle, nullptr)});
  }

  // new SharedReceiveQueue(pd, maxWr, maxSge, limit)
  explicit SrqWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<SrqWrap>(info) {
    Napi::Env env = info.Env();
    TagObject(env, info.This().As<Napi::Object>(), Kind::SharedReceiveQueue);
    auto pd = PdOf(env, info[0]);
    ibv_srq_init_attr attr{};
    attr.attr.max_wr = ArgU32(info, 1, "maxWr");
    attr.attr.max_sge = ArgU32(info, 2, "maxSge");
    attr.attr.srq_limit = ArgU32(info, 3, "limit");
    ibv_srq* srq = ibv_create_srq(pd->pd, &attr);
    if (!srq) ThrowErrno(env, errno ? errno : EINVAL, "ibv_create_srq");
    auto res = std::make_shared<SrqResource>();
    res->srq = srq;
    res->AdoptParent(pd);
    resource = res;
  }

  std::shared_ptr<SrqResource> resource;

 private:
  ibv_srq* Srq(Napi::Env env) { return Live(env, resource, "SharedReceiveQueue")->srq; }

  Napi::Value Handle(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), Srq(info.Env())->handle);
  }

  Napi::Value PostRecv(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ibv_srq* srq = Srq(env);
    const uint32_t* words;
    size_t length;
    Uint32Words(env, info[0], &words, &length);
    uint32_t count = ArgU32(info, 1, "count");
    ibv_recv_wr* first = DecodeRecvBatch(env, words, length, count, &AddonData::Get(env)->scratch);
    ibv_recv_wr* bad = nullptr;
    int rc = ibv_post_srq_recv(srq, first, &bad);
    if (rc) ThrowPostError(env, rc, "ibv_post_srq_recv", bad ? static_cast<uint32_t>(bad - first) : 0);
    return env.Undefined();
  }

  // arm(limit): raise SRQ_LIMIT_REACHED when fewer than `limit` WRs remain.
  Napi::Value Arm(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ibv_srq_attr attr{};
    attr.srq_limit = ArgU32(info, 0, "limit");
    int rc = ibv_modify_srq(Srq(env), &attr, IBV_SRQ_LIMIT);
    if (rc) ThrowErrno(env, rc, "ibv_modify_srq");
    return env.Undefined();
  }

  Napi::Value Query(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ibv_srq_attr attr{};
    int rc = ibv_query_srq(Srq(env), &attr);
    if (rc) ThrowErrno(env, rc, "ibv_query_srq");
    Napi::Object o = Napi::Object::New(env);
    o.Set("maxWr", attr.max_wr);
    o.Set("maxSge", attr.max_sge);
    o.Set("limit", attr.srq_limit);
    return o;
  }

  Napi::Value CloseMethod(const Napi::CallbackInfo& info) {
    if (resource) CloseOrThrow(info.Env(), resource.get(), "ibv_destroy_srq");
    return info.Env().Undefined();
  }
};

}  // namespace

std::shared_ptr<SrqResource> SrqOf(Napi::Env env, Napi::Value value) {
  auto* wrap = UnwrapKind<SrqWrap>(env, value, Kind::SharedReceiveQueue, "SharedReceiveQueue");
  Live(env, wrap->resource, "SharedReceiveQueue");
  return wrap->resource;
}

void InitSharedReceiveQueue(Napi::Env env, Napi::Object exports, AddonData* data) {
  Napi::Function ctor = SrqWrap::Define(env);
  exports.Set("SharedReceiveQueue", ctor);
}

}  // namespace ibv

// Queue pair: create, modify (state transitions), query, post send/recv
// batches, bind memory windows.
#include <arpa/inet.h>

#include "addon.h"
#include "hot_path.h"
#include "resources.h"
#include "work_request.h"

namespace ibv {

int QpResource::DestroyHandle() {
  if (qp && cm_id) {
    rdma_destroy_qp(cm_id);
  } else if (qp) {
    int rc = ibv_destroy_qp(qp);
    if (rc != 0) return rc;
  }
  qp = nullptr;
  return 0;
}

namespace {

uint32_t OptU32(Napi::Env env, Napi::Object o, const char* key, uint32_t fallback) {
  Napi::Value v = o.Get(key);
  if (v.IsUndefined()) return fallback;
  if (!v.IsNumber()) ThrowCode(env, "ERR_INVALID_ARG_TYPE", std::string("Expected a number for ") + key);
  double d = v.As<Napi::Number>().DoubleValue();
  if (!(d >= 0 && d <= 4294967295.0 && d == static_cast<uint32_t>(d))) {
    ThrowCode(env, "ERR_OUT_OF_RANGE", std::string("Expected an unsigned integer for ") + key);
  }
  return static_cast<uint32_t>(d);
}

bool Has(Napi::Object o, const char* key) { return !o.Get(key).IsUndefined(); }

Napi::Object CapsObject(Napi::Env env, const ibv_qp_cap& cap) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("maxSendWr", cap.max_send_wr);
  o.Set("maxRecvWr", cap.max_recv_wr);
  o.Set("maxSendSge", cap.max_send_sge);
  o.Set("maxRecvSge", cap.max_recv_sge);
  o.Set("maxInlineData", cap.max_inline_data);
  return o;
}

}  // namespace

void ReadQpInitAttr(Napi::Env env, Napi::Object o, ibv_qp_init_attr* attr,
                    std::vector<std::shared_ptr<Resource>>* parents) {
  auto send_cq = CqOf(env, o.Get("sendCq"));
  auto recv_cq = CqOf(env, o.Get("recvCq"));
  std::shared_ptr<SrqResource> srq;
  if (Has(o, "srq")) srq = SrqOf(env, o.Get("srq"));
  attr->qp_type = static_cast<ibv_qp_type>(OptU32(env, o, "type", IBV_QPT_RC));
  attr->send_cq = send_cq->cq;
  attr->recv_cq = recv_cq->cq;
  attr->srq = srq ? srq->srq : nullptr;
  attr->cap.max_send_wr = OptU32(env, o, "maxSendWr", 128);
  attr->cap.max_recv_wr = srq ? 0 : OptU32(env, o, "maxRecvWr", 128);
  attr->cap.max_send_sge = OptU32(env, o, "maxSendSge", 1);
  attr->cap.max_recv_sge = srq ? 0 : OptU32(env, o, "maxRecvSge", 1);
  attr->cap.max_inline_data = OptU32(env, o, "maxInlineData", 0);
  attr->sq_sig_all = OptU32(env, o, "sqSigAll", 0) ? 1 : 0;
  parents->push_back(send_cq);
  if (recv_cq != send_cq) parents->push_back(recv_cq);
  if (srq) parents->push_back(srq);
}

namespace {

class QueuePairWrap : public Napi::ObjectWrap<QueuePairWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "QueuePair",
                       {InstanceMethod("modify", &QueuePairWrap::Modify),
                        InstanceMethod("query", &QueuePairWrap::Query),
                        InstanceMethod("postSend", &QueuePairWrap::PostSend),
                        InstanceMethod("sendPoster", &QueuePairWrap::SendPoster),
                        InstanceMethod("postRecv", &QueuePairWrap::PostRecv),
                        InstanceMethod("bindMemoryWindow", &QueuePairWrap::BindMemoryWindow),
                        InstanceMethod("close", &QueuePairWrap::CloseMethod),
                        InstanceAccessor("qpn", &QueuePairWrap::Qpn, nullptr),
                        InstanceAccessor("caps", &QueuePairWrap::Caps, nullptr)});
  }

  // new QueuePair(pd, {type, sendCq, recvCq, srq?, maxSendWr, maxRecvWr,
  //   maxSendSge, maxRecvSge, maxInlineData, sqSigAll})
  explicit QueuePairWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<QueuePairWrap>(info) {
    Napi::Env env = info.Env();
    TagObject(env, info.This().As<Napi::Object>(), Kind::QueuePair);
    if (info.Length() == 0 || info[0].IsUndefined()) return;
    auto pd = PdOf(env, info[0]);
    if (!info[1].IsObject()) ThrowCode(env, "ERR_INVALID_ARG_TYPE", "Expected an options object");
    ibv_qp_init_attr attr{};
    std::vector<std::shared_ptr<Resource>> parents;
    ReadQpInitAttr(env, info[1].As<Napi::Object>(), &attr, &parents);
    ibv_qp* qp = ibv_create_qp(pd->pd, &attr);
    if (!qp) ThrowErrno(env, errno ? errno : EINVAL, "ibv_create_qp");
    auto res = std::make_shared<QpResource>();
    res->qp = qp;
    caps_ = attr.cap;  // ibv_create_qp writes the actual caps back
    res->AdoptParent(pd);
    for (auto& parent : parents) res->AdoptParent(parent);
    resource = res;
  }

  std::shared_ptr<QpResource> resource;
  ibv_qp_cap caps_{};

 private:
  ibv_qp* Qp(Napi::Env env) { return Live(env, resource, "QueuePair")->qp; }

  Napi::Value Qpn(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), Qp(info.Env())->qp_num);
  }

  Napi::Value Caps(const Napi::CallbackInfo& info) { return CapsObject(info.Env(), caps_); }

  // modify(attrs): every attribute present in the object is set and its mask
  // bit raised; the verbs layer checks the combination for the transition.
  Napi::Value Modify(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ibv_qp* qp = Qp(env);
    if (!info[0].IsObject()) ThrowCode(env, "ERR_INVALID_ARG_TYPE", "Expected an attributes object");
    Napi::Object o = info[0].As<Napi::Object>();
    ibv_qp_attr attr{};
    int mask = 0;
    auto set = [&](const char* key, int bit, auto assign) {
      if (!Has(o, key)) return;
      assign(OptU32(env, o, key, 0));
      mask |= bit;
    };
    set("qpState", IBV_QP_STATE, [&](uint32_t v) { attr.qp_state = static_cast<ibv_qp_state>(v); });
    set("pathMtu", IBV_QP_PATH_MTU, [&](uint32_t v) { attr.path_mtu = static_cast<ibv_mtu>(v); });
    set("qkey", IBV_QP_QKEY, [&](uint32_t v) { attr.qkey = v; });
    set("rqPsn", IBV_QP_RQ_PSN, [&](uint32_t v) { attr.rq_psn = v; });
    set("sqPsn", IBV_QP_SQ_PSN, [&](uint32_t v) { attr.sq_psn = v; });
    set("destQpNum", IBV_QP_DEST_QPN, [&](uint32_t v) { attr.dest_qp_num = v; });
    set("accessFlags", IBV_QP_ACCESS_FLAGS, [&](uint32_t v) { attr.qp_access_flags = v; });
    set("pkeyIndex", IBV_QP_PKEY_INDEX, [&](uint32_t v) { attr.pkey_index = static_cast<uint16_t>(v); });
    set("portNum", IBV_QP_PORT, [&](uint32_t v) { attr.port_num = static_cast<uint8_t>(v); });
    set("timeout", IBV_QP_TIMEOUT, [&](uint32_t v) { attr.timeout = static_cast<uint8_t>(v); });
    set("retryCount", IBV_QP_RETRY_CNT, [&](uint32_t v) { attr.retry_cnt = static_cast<uint8_t>(v); });
    set("rnrRetry", IBV_QP_RNR_RETRY, [&](uint32_t v) { attr.rnr_retry = static_cast<uint8_t>(v); });
    set("minRnrTimer", IBV_QP_MIN_RNR_TIMER,
        [&](uint32_t v) { attr.min_rnr_timer = static_cast<uint8_t>(v); });
    set("maxRdAtomic", IBV_QP_MAX_QP_RD_ATOMIC,
        [&](uint32_t v) { attr.max_rd_atomic = static_cast<uint8_t>(v); });
    set("maxDestRdAtomic", IBV_QP_MAX_DEST_RD_ATOMIC,
        [&](uint32_t v) { attr.max_dest_rd_atomic = static_cast<uint8_t>(v); });
    if (Has(o, "ahAttr")) {
      if (!o.Get("ahAttr").IsObject()) ThrowCode(env, "ERR_INVALID_ARG_TYPE", "Expected an object for ahAttr");
      FillAhAttr(env, o.Get("ahAttr").As<Napi::Object>(), &attr.ah_attr);
      mask |= IBV_QP_AV;
    }
    int rc = ibv_modify_qp(qp, &attr, mask);
    if (rc) ThrowErrno(env, rc, "ibv_modify_qp");
    return env.Undefined();
  }

  Napi::Value Query(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ibv_qp* qp = Qp(env);
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    int mask = IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_QKEY | IBV_QP_RQ_PSN | IBV_QP_SQ_PSN |
               IBV_QP_DEST_QPN | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT | IBV_QP_TIMEOUT |
               IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MIN_RNR_TIMER |
               IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_CAP;
    int rc = ibv_query_qp(qp, &attr, mask, &init);
    if (rc) ThrowErrno(env, rc, "ibv_query_qp");
    Napi::Object o = Napi::Object::New(env);
    o.Set("qpState", static_cast<uint32_t>(attr.qp_state));
    o.Set("pathMtu", static_cast<uint32_t>(attr.path_mtu));
    o.Set("qkey", attr.qkey);
    o.Set("rqPsn", attr.rq_psn);
    o.Set("sqPsn", attr.sq_psn);
    o.Set("destQpNum", attr.dest_qp_num);
    o.Set("accessFlags", static_cast<uint32_t>(attr.qp_access_flags));
    o.Set("portNum", attr.port_num);
    o.Set("timeout", attr.timeout);
    o.Set("retryCount", attr.retry_cnt);
    o.Set("rnrRetry", attr.rnr_retry);
    o.Set("minRnrTimer", attr.min_rnr_timer);
    o.Set("maxRdAtomic", attr.max_rd_atomic);
    o.Set("maxDestRdAtomic", attr.max_dest_rd_atomic);
    o.Set("caps", CapsObject(env, attr.cap));
    return o;
  }

  // postSend(words: Uint32Array, count) posts `count` encoded WRs at once.
  Napi::Value PostSend(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ibv_qp* qp = Qp(env);
    const uint32_t* words;
    size_t length;
    Uint32Words(env, info[0], &words, &length);
    uint32_t count = ArgU32(info, 1, "count");
    AddonData* data = AddonData::Get(env);
    ibv_send_wr* first = DecodeSendBatch(env, words, length, count, qp->qp_type, &data->scratch);
    ibv_send_wr* bad = nullptr;
    int rc = ibv_post_send(qp, first, &bad);
    if (rc) ThrowPostError(env, rc, "ibv_post_send", bad ? static_cast<uint32_t>(bad - first) : 0);
    return env.Undefined();
  }

  // sendPoster(words: Uint32Array, cq?, kind?) -> post(wordStart, count, poll)
  // (kind 0), or for the request at word 0 postOneNoPoll() (1) or postOne()
  // (2): a plain function bound to this QP, the buffer and the CQ it polls.
  Napi::Value SendPoster(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Live(env, resource, "QueuePair");
    std::shared_ptr<CqResource> cq;
    if (info.Length() > 1 && !info[1].IsUndefined()) cq = CqOf(env, info[1]);
    uint32_t kind = info.Length() > 2 && !info[2].IsUndefined() ? ArgU32(info, 2, "kind") : 0;
    if (kind > static_cast<uint32_t>(SendPosterKind::kOnePoll)) ThrowCode(env, "ERR_OUT_OF_RANGE", "sendPoster: kind is 0, 1 or 2");
    return MakeSendPoster(env, resource, info[0], cq, static_cast<SendPosterKind>(kind));
  }

  Napi::Value PostRecv(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ibv_qp* qp = Qp(env);
    const uint32_t* words;
    size_t length;
    Uint32Words(env, info[0], &words, &length);
    uint32_t count = ArgU32(info, 1, "count");
    AddonData* data = AddonData::Get(env);
    ibv_recv_wr* first = DecodeRecvBatch(env, words, length, count, &data->scratch);
    ibv_recv_wr* bad = nullptr;
    int rc = ibv_post_recv(qp, first, &bad);
    if (rc) ThrowPostError(env, rc, "ibv_post_recv", bad ? static_cast<uint32_t>(bad - first) : 0);
    return env.Undefined();
  }

  // bindMemoryWindow(mw, mr, address, length, access, wrIdLo, wrIdHi, sendFlags)
  // -> the window's new rkey. Type 1 windows use ibv_bind_mw; type 2 windows a
  // BIND_MW work request from the current rkey (mw->rkey, which the library
  // updates with setRkey() once a bind completes) to the next one. Either way
  // a completion follows on the send CQ.
  Napi::Value BindMemoryWindow(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ibv_qp* qp = Qp(env);
    auto mw = MwOf(env, info[0]);
    auto mr = MrOf(env, info[1]);
    double address = info[2].IsNumber() ? info[2].As<Napi::Number>().DoubleValue() : -1;
    if (address < 0) ThrowCode(env, "ERR_INVALID_ARG_TYPE", "Expected a number for address");
    double length = info[3].IsNumber() ? info[3].As<Napi::Number>().DoubleValue() : -1;
    if (length < 0) ThrowCode(env, "ERR_INVALID_ARG_TYPE", "Expected a number for length");
    uint32_t access = ArgU32(info, 4, "access");
    uint64_t wr_id = ArgU32(info, 5, "wrIdLo") | (static_cast<uint64_t>(ArgU32(info, 6, "wrIdHi")) << 32);
    uint32_t flags = ArgU32(info, 7, "sendFlags");
    CheckSendOpcode(env, qp->qp_type, IBV_WR_BIND_MW, false);
    ibv_mw_bind_info bind_info{};
    bind_info.mr = mr->mr;
    bind_info.addr = static_cast<uint64_t>(address);
    bind_info.length = static_cast<uint64_t>(length);
    bind_info.mw_access_flags = access;
    if (mw->mw->type == IBV_MW_TYPE_1) {
      ibv_mw_bind bind{};
      bind.wr_id = wr_id;
      bind.send_flags = flags;
      bind.bind_info = bind_info;
      int rc = ibv_bind_mw(qp, mw->mw, &bind);
      if (rc) ThrowErrno(env, rc, "ibv_bind_mw");
      return Napi::Number::New(env, mw->mw->rkey);
    }
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = flags;
    wr.bind_mw.mw = mw->mw;
    wr.bind_mw.rkey = ibv_inc_rkey(mw->mw->rkey);
    wr.bind_mw.bind_info = bind_info;
    ibv_send_wr* bad = nullptr;
    int rc = ibv_post_send(qp, &wr, &bad);
    if (rc) ThrowPostError(env, rc, "ibv_post_send", 0);
    return Napi::Number::New(env, wr.bind_mw.rkey);
  }

  Napi::Value CloseMethod(const Napi::CallbackInfo& info) {
    if (resource) CloseOrThrow(info.Env(), resource.get(), "ibv_destroy_qp");
    return info.Env().Undefined();
  }
};

}  // namespace

Napi::Object WrapQp(Napi::Env env, std::shared_ptr<QpResource> resource, const ibv_qp_cap& caps) {
  Napi::Object object = AddonData::Get(env)->queue_pair.New({});
  auto* wrap = Napi::ObjectWrap<QueuePairWrap>::Unwrap(object);
  wrap->resource = std::move(resource);
  wrap->caps_ = caps;
  return object;
}

void InitQueuePair(Napi::Env env, Napi::Object exports, AddonData* data) {
  Napi::Function ctor = QueuePairWrap::Define(env);
  data->queue_pair = Napi::Persistent(ctor);
  exports.Set("QueuePair", ctor);
}

}  // namespace ibv

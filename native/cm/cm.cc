// rdma_cm: an event channel watched on the event loop, and connection ids
// (resolve, listen, connect, accept, reject, disconnect). Each id carries a
// numeric key in id->context; events name ids by key.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>

#include "addon.h"
#include "resources.h"

namespace ibv {

namespace {

struct CmChannelResource : Resource {
  const char* kind() const override { return "CmEventChannel"; }
  const char* destroy_call() const override { return "rdma_destroy_event_channel"; }
  rdma_event_channel* channel = nullptr;
  FdWatcher watcher;
  Napi::FunctionReference on_event;  // weak: the JS channel holds it
  ~CmChannelResource() override { Close(); }
  int DestroyHandle() override {
    watcher.Stop();
    if (channel) rdma_destroy_event_channel(channel);
    channel = nullptr;
    on_event.Reset();
    return 0;
  }
};

struct CmIdResource : Resource {
  const char* kind() const override { return "CmId"; }
  const char* destroy_call() const override { return "rdma_destroy_id"; }
  rdma_cm_id* id = nullptr;
  uint32_t key = 0;
  ~CmIdResource() override { Close(); }
  int DestroyHandle() override {
    // librdmacm returns -1 and sets errno.
    if (id && rdma_destroy_id(id) != 0) return errno ? errno : EBUSY;
    id = nullptr;
    return 0;
  }
};

uint32_t KeyOf(rdma_cm_id* id) {
  return id ? static_cast<uint32_t>(reinterpret_cast<uintptr_t>(id->context)) : 0;
}

// Parses a numeric IPv4/IPv6 address (names are resolved in JS first).
void ParseAddress(Napi::Env env, const std::string& host, uint32_t port, sockaddr_storage* out) {
  memset(out, 0, sizeof *out);
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
  } else {
    ThrowCode(env, "ERR_INVALID_ARG_VALUE", "Expected a numeric IP address but received '" + host + "'");
  }
}

Napi::Value AddressObject(Napi::Env env, const sockaddr* addr) {
  if (!addr) return env.Null();
  char text[INET6_ADDRSTRLEN] = "";
  uint16_t port = 0;
  if (addr->sa_family == AF_INET) {
    auto* v4 = reinterpret_cast<const sockaddr_in*>(addr);
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
    port = ntohs(v4->sin_port);
  } else if (addr->sa_family == AF_INET6) {
    auto* v6 = reinterpret_cast<const sockaddr_in6*>(addr);
    inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
    port = ntohs(v6->sin6_port);
  } else {
    return env.Null();
  }
  Napi::Object o = Napi::Object::New(env);
  o.Set("address", text);
  o.Set("port", port);
  o.Set("family", addr->sa_family == AF_INET ? "IPv4" : "IPv6");
  return o;
}

// Optional Buffer/Uint8Array of private data at info[index].
void PrivateData(const Napi::CallbackInfo& info, size_t index, rdma_conn_param* param) {
  if (index >= info.Length() || info[index].IsUndefined() || info[index].IsNull()) return;
  uint8_t* data;
  size_t length;
  Napi::ArrayBuffer backing;
  ArgBytes(info, index, "privateData", &data, &length, &backing);
  if (length > 255) ThrowCode(info.Env(), "ERR_OUT_OF_RANGE", "privateData is longer than 255 bytes");
  param->private_data = data;
  param->private_data_len = static_cast<uint8_t>(length);
}

class CmIdWrap;

class CmEventChannelWrap : public Napi::ObjectWrap<CmEventChannelWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "CmEventChannel",
                       {InstanceMethod("setWaiting", &CmEventChannelWrap::SetWaiting),
                        InstanceMethod("close", &CmEventChannelWrap::CloseMethod)});
  }

  // new CmEventChannel(onEvent(event))
  explicit CmEventChannelWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<CmEventChannelWrap>(info) {
    Napi::Env env = info.Env();
    TagObject(env, info.This().As<Napi::Object>(), Kind::CmEventChannel);
    Napi::Function callback = ArgFunction(info, 0, "onEvent");
    auto res = std::make_shared<CmChannelResource>();
    res->channel = rdma_create_event_channel();
    if (!res->channel) ThrowErrno(env, errno ? errno : ENODEV, "rdma_create_event_channel");
    int err = SetNonBlocking(res->channel->fd);
    if (err) ThrowErrno(env, err, "fcntl");
    res->on_event = Napi::Weak(callback);
    CmChannelResource* raw = res.get();
    int rc = res->watcher.Start(env, res->channel->fd, [env, raw](int status) { OnReadable(env, raw, status); });
    if (rc) ThrowCode(env, "ERR_UV", uv_strerror(rc));
    AddonData::Get(env)->AddRoot(res);
    resource = res;
  }

  std::shared_ptr<CmChannelResource> resource;

 private:
  static void OnReadable(Napi::Env env, CmChannelResource* res, int status);

  Napi::Value SetWaiting(const Napi::CallbackInfo& info) {
    CmChannelResource* res = Live(info.Env(), resource, "CmEventChannel");
    if (info[0].ToBoolean()) res->watcher.Ref(); else res->watcher.Unref();
    return info.Env().Undefined();
  }

  Napi::Value CloseMethod(const Napi::CallbackInfo& info) {
    if (resource) CloseOrThrow(info.Env(), resource.get(), "rdma_destroy_event_channel");
    return info.Env().Undefined();
  }
};

class CmIdWrap : public Napi::ObjectWrap<CmIdWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "CmId",
                       {InstanceMethod("bind", &CmIdWrap::Bind),
                        InstanceMethod("listen", &CmIdWrap::Listen),
                        InstanceMethod("resolveAddr", &CmIdWrap::ResolveAddr),
                        InstanceMethod("resolveRoute", &CmIdWrap::ResolveRoute),
                        InstanceMethod("createQp", &CmIdWrap::CreateQp),
                        InstanceMethod("setAckTimeout", &CmIdWrap::SetAckTimeout),
                        InstanceMethod("connect", &CmIdWrap::Connect),
                        InstanceMethod("accept", &CmIdWrap::Accept),
                        InstanceMethod("reject", &CmIdWrap::Reject),
                        InstanceMethod("disconnect", &CmIdWrap::Disconnect),
                        InstanceMethod("deviceName", &CmIdWrap::DeviceName),
                        InstanceMethod("portActive", &CmIdWrap::PortActive),
                        InstanceMethod("localAddress", &CmIdWrap::LocalAddress),
                        InstanceMethod("peerAddress", &CmIdWrap::PeerAddress),
                        InstanceMethod("close", &CmIdWrap::CloseMethod),
                        InstanceAccessor("key", &CmIdWrap::Key, nullptr)});
  }

  // new CmId(channel) creates an RC (RDMA_PS_TCP) id; new CmId() is an empty
  // wrapper for ids that arrive with connection requests.
  explicit CmIdWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<CmIdWrap>(info) {
    Napi::Env env = info.Env();
    TagObject(env, info.This().As<Napi::Object>(), Kind::CmId);
    if (info.Length() == 0 || info[0].IsUndefined()) return;
    auto* channel_wrap = UnwrapKind<CmEventChannelWrap>(env, info[0], Kind::CmEventChannel, "CmEventChannel");
    auto channel = channel_wrap->resource;
    Live(env, channel, "CmEventChannel");
    auto res = std::make_shared<CmIdResource>();
    res->key = AddonData::Get(env)->next_cm_id_key++;
    if (rdma_create_id(channel->channel, &res->id, reinterpret_cast<void*>(uintptr_t{res->key}), RDMA_PS_TCP) != 0) {
      res->id = nullptr;
      ThrowErrno(env, errno, "rdma_create_id");
    }
    res->AdoptParent(channel);
    resource = res;
  }

  std::shared_ptr<CmIdResource> resource;

 private:
  rdma_cm_id* Id(Napi::Env env) { return Live(env, resource, "CmId")->id; }

  Napi::Value Key(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), Live(info.Env(), resource, "CmId")->key); }

  Napi::Value Bind(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    sockaddr_storage addr;
    ParseAddress(env, ArgString(info, 0, "host"), ArgU32(info, 1, "port"), &addr);
    if (rdma_bind_addr(Id(env), reinterpret_cast<sockaddr*>(&addr)) != 0) ThrowErrno(env, errno, "rdma_bind_addr");
    return env.Undefined();
  }

  Napi::Value Listen(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (rdma_listen(Id(env), static_cast<int>(ArgU32(info, 0, "backlog"))) != 0) ThrowErrno(env, errno, "rdma_listen");
    return env.Undefined();
  }

  // resolveAddr(host, port, timeoutMs) -> ADDR_RESOLVED / ADDR_ERROR event
  Napi::Value ResolveAddr(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    sockaddr_storage dst;
    ParseAddress(env, ArgString(info, 0, "host"), ArgU32(info, 1, "port"), &dst);
    int timeout = static_cast<int>(ArgU32(info, 2, "timeoutMs"));
    if (rdma_resolve_addr(Id(env), nullptr, reinterpret_cast<sockaddr*>(&dst), timeout) != 0) {
      ThrowErrno(env, errno, "rdma_resolve_addr");
    }
    return env.Undefined();
  }

  Napi::Value ResolveRoute(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (rdma_resolve_route(Id(env), static_cast<int>(ArgU32(info, 0, "timeoutMs"))) != 0) {
      ThrowErrno(env, errno, "rdma_resolve_route");
    }
    return env.Undefined();
  }

  // createQp(pd, options) -> a QueuePair wrapper; rdma_cm drives its states.
  Napi::Value CreateQp(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    rdma_cm_id* id = Id(env);
    auto pd = PdOf(env, info[0]);
    if (!info[1].IsObject()) ThrowCode(env, "ERR_INVALID_ARG_TYPE", "Expected an options object");
    if (!id->verbs || pd->pd->context != id->verbs) {
      ThrowCode(env, "ERR_WRONG_DEVICE", "The protection domain belongs to another device than the connection");
    }
    ibv_qp_init_attr attr{};
    std::vector<std::shared_ptr<Resource>> parents;
    ReadQpInitAttr(env, info[1].As<Napi::Object>(), &attr, &parents);
    if (rdma_create_qp(id, pd->pd, &attr) != 0) ThrowErrno(env, errno, "rdma_create_qp");
    auto qp = std::make_shared<QpResource>();
    qp->qp = id->qp;
    qp->cm_id = id;
    qp->AdoptParent(resource);  // destroyed before the id
    qp->AdoptParent(pd);
    for (auto& parent : parents) qp->AdoptParent(parent);
    return WrapQp(env, qp, attr.cap);
  }

  static void ConnParam(const Napi::CallbackInfo& info, size_t first, rdma_conn_param* param) {
    PrivateData(info, first, param);
    param->responder_resources = static_cast<uint8_t>(ArgU32(info, first + 1, "responderResources"));
    param->initiator_depth = static_cast<uint8_t>(ArgU32(info, first + 2, "initiatorDepth"));
    param->retry_count = static_cast<uint8_t>(ArgU32(info, first + 3, "retryCount"));
    param->rnr_retry_count = static_cast<uint8_t>(ArgU32(info, first + 4, "rnrRetryCount"));
  }

  // setAckTimeout(exponent): the QP's local ACK timeout (4.096 us * 2^exponent) that rdma_cm
  // gives the QP when it moves it to RTS, instead of the one it derives from the path (on
  // RoCE, Linux's packet lifetime 18 + 1 = 19: 2.1 s per retransmission). Before connect/accept.
  Napi::Value SetAckTimeout(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint8_t timeout = static_cast<uint8_t>(ArgU32(info, 0, "ackTimeout"));
    if (rdma_set_option(Id(env), RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, sizeof timeout) != 0) {
      ThrowErrno(env, errno, "rdma_set_option");
    }
    return env.Undefined();
  }

  // connect(privateData?, responderResources, initiatorDepth, retryCount, rnrRetryCount)
  Napi::Value Connect(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    rdma_conn_param param{};
    ConnParam(info, 0, &param);
    if (rdma_connect(Id(env), &param) != 0) ThrowErrno(env, errno, "rdma_connect");
    return env.Undefined();
  }

  Napi::Value Accept(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    rdma_conn_param param{};
    ConnParam(info, 0, &param);
    if (rdma_accept(Id(env), &param) != 0) ThrowErrno(env, errno, "rdma_accept");
    return env.Undefined();
  }

  Napi::Value Reject(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    rdma_conn_param param{};
    PrivateData(info, 0, &param);
    if (rdma_reject(Id(env), param.private_data, param.private_data_len) != 0) ThrowErrno(env, errno, "rdma_reject");
    return env.Undefined();
  }

  Napi::Value Disconnect(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (rdma_disconnect(Id(env)) != 0) ThrowErrno(env, errno, "rdma_disconnect");
    return env.Undefined();
  }

  Napi::Value DeviceName(const Napi::CallbackInfo& info) {
    rdma_cm_id* id = Id(info.Env());
    if (!id->verbs) return info.Env().Null();
    return Napi::String::New(info.Env(), ibv_get_device_name(id->verbs->device));
  }

  // portActive() -> false while the port the id is bound to is not ACTIVE (true when the id
  // is bound to none, or the query fails: nothing to wait for then).
  Napi::Value PortActive(const Napi::CallbackInfo& info) {
    rdma_cm_id* id = Id(info.Env());
    ibv_port_attr attr{};
    if (!id->verbs || id->port_num == 0 || ibv_query_port(id->verbs, id->port_num, &attr) != 0) {
      return Napi::Boolean::New(info.Env(), true);
    }
    return Napi::Boolean::New(info.Env(), attr.state == IBV_PORT_ACTIVE);
  }

  Napi::Value LocalAddress(const Napi::CallbackInfo& info) {
    return AddressObject(info.Env(), rdma_get_local_addr(Id(info.Env())));
  }

  Napi::Value PeerAddress(const Napi::CallbackInfo& info) {
    return AddressObject(info.Env(), rdma_get_peer_addr(Id(info.Env())));
  }

  Napi::Value CloseMethod(const Napi::CallbackInfo& info) {
    if (resource) CloseOrThrow(info.Env(), resource.get(), "rdma_destroy_id");
    return info.Env().Undefined();
  }

  friend class CmEventChannelWrap;
};

namespace {
// What JS needs of an rdma_cm event, copied so that the event can be acked
// before any JS runs (an unacked event makes rdma_destroy_id block forever).
struct CmEventCopy {
  rdma_cm_event_type type;
  int status;
  uint32_t key;
  uint32_t listen_key;
  std::vector<uint8_t> private_data;
  uint8_t responder_resources;
  uint8_t initiator_depth;
  rdma_cm_id* new_id;  // CONNECT_REQUEST: the id of the incoming connection
};

CmEventCopy CopyAndAck(rdma_cm_event* event) {
  const rdma_conn_param& conn = event->param.conn;
  CmEventCopy copy{event->event, event->status, KeyOf(event->id), KeyOf(event->listen_id), {},
                   conn.responder_resources, conn.initiator_depth, nullptr};
  if (conn.private_data && conn.private_data_len) {
    auto* bytes = static_cast<const uint8_t*>(conn.private_data);
    copy.private_data.assign(bytes, bytes + conn.private_data_len);
  }
  if (event->event == RDMA_CM_EVENT_CONNECT_REQUEST) copy.new_id = event->id;
  rdma_ack_cm_event(event);
  return copy;
}
}  // namespace

// Reads each event, copies what JS needs, acks it, then calls JS with
// {type, status, key, listenKey, privateData?, id? (new id of a request)}.
// Each event is handled inside GuardFromLoop: an exception while building the
// event object is reported as uncaught, never unwinds into libuv. After every
// call into JS the channel is checked again (JS may have closed it). A failure
// of the fd stops the watcher and is delivered as {type: 'CHANNEL_ERROR',
// status: -errno, key: 0}.
void CmEventChannelWrap::OnReadable(Napi::Env env, CmChannelResource* res, int status) {
  std::shared_ptr<Resource> keep = res->shared_from_this();  // JS may close and drop the channel
  napi_async_context async = AsyncContextOf(env, LoopCallback::CmEvents);
  for (;;) {
    if (res->closed() || !res->channel) return;
    int err = status < 0 ? EIO : 0;
    rdma_cm_event* event = nullptr;
    if (!err && rdma_get_cm_event(res->channel, &event) != 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;  // drained
      err = errno ? errno : EIO;
    }
    if (err) {
      res->watcher.Stop();
      GuardFromLoop(env, [&] {
        if (!CanRunJs(env)) return;
        Napi::Object o = Napi::Object::New(env);
        o.Set("type", "CHANNEL_ERROR");
        o.Set("status", -err);
        o.Set("key", 0);
        o.Set("listenKey", 0);
        CallFromLoop(env, async, res->on_event, {o});
      });
      return;
    }
    CmEventCopy copy = CopyAndAck(event);
    // The new id is owned from here on: if building the event fails, it is
    // destroyed with this shared_ptr (which rejects the connection).
    std::shared_ptr<CmIdResource> id;
    if (copy.new_id) {
      id = std::make_shared<CmIdResource>();
      id->id = copy.new_id;
      id->key = AddonData::Get(env)->next_cm_id_key++;
      copy.new_id->context = reinterpret_cast<void*>(uintptr_t{id->key});
      copy.key = id->key;
      id->AdoptParent(keep);
    }
    GuardFromLoop(env, [&] {
      if (!CanRunJs(env)) return;  // a terminating Worker: the new id (if any) is destroyed with `id`
      Napi::Object o = Napi::Object::New(env);
      o.Set("type", rdma_event_str(copy.type));
      o.Set("status", copy.status);
      o.Set("listenKey", copy.listen_key);
      if (!copy.private_data.empty()) {
        o.Set("privateData", Napi::Buffer<uint8_t>::Copy(env, copy.private_data.data(), copy.private_data.size()));
      }
      o.Set("responderResources", copy.responder_resources);
      o.Set("initiatorDepth", copy.initiator_depth);
      if (id) {
        Napi::Object wrapper = AddonData::Get(env)->cm_id.New({});
        Napi::ObjectWrap<CmIdWrap>::Unwrap(wrapper)->resource = id;
        o.Set("id", wrapper);
      }
      o.Set("key", copy.key);
      CallFromLoop(env, async, res->on_event, {o});
    });
  }
}

}  // namespace

void InitCm(Napi::Env env, Napi::Object exports, AddonData* data) {
  Napi::Function channel = CmEventChannelWrap::Define(env);
  exports.Set("CmEventChannel", channel);
  Napi::Function id = CmIdWrap::Define(env);
  data->cm_id = Napi::Persistent(id);
  exports.Set("CmId", id);
}

}  // namespace ibv

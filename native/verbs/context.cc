// Device list and device context: open, query, ports, GID table, async events.
#include <arpa/inet.h>
#include <net/if.h>

#include <cstring>

#include <rdma/rdma_cma.h>

#include "addon.h"
#include "async_events.h"
#include "gid_entry.h"
#include "resources.h"

namespace ibv {

namespace {
// Whether another open Device of this addon shares librdmacm's context `ctx`.
bool SharedByAnother(AddonData* addon, const ContextResource* self, ibv_context* ctx) {
  for (auto& weak : addon->roots) {
    auto resource = weak.lock();
    // No RTTI: the kind names the class (only ContextResource is a "Device").
    if (!resource || resource.get() == self || resource->closed() || std::strcmp(resource->kind(), "Device") != 0) continue;
    if (std::static_pointer_cast<ContextResource>(resource)->ctx == ctx) return true;
  }
  return false;
}
}  // namespace

int ContextResource::DestroyHandle() {
  if (ctx && owned) {
    if (addon) UnsubscribeAsyncEvents(addon, ctx);  // stop its reader before the fd closes
    int rc = ibv_close_device(ctx);
    if (rc != 0) return rc > 0 ? rc : (errno ? errno : EIO);
  }
  if (ctx && rdmacm_ref) {
    // Releasing the reference may close the context (its device was removed):
    // the async-event reader stops first, unless another Device still uses it.
    if (addon && !SharedByAnother(addon, this, ctx)) UnsubscribeAsyncEvents(addon, ctx);
    rdma_free_devices(rdmacm_ref);
    rdmacm_ref = nullptr;
  }
  ctx = nullptr;
  return 0;
}

// librdmacm closes the context of a removed device only once nothing holds it
// and it has looked at the device list again: after the ids and Devices on a
// removed device are destroyed, this lets the removal (rdma link delete) finish.
Napi::Value ReleaseRemovedDevices(const Napi::CallbackInfo& info) {
  ibv_context** list = rdma_get_devices(nullptr);
  if (list) rdma_free_devices(list);
  return info.Env().Undefined();
}

void CloseOrThrow(Napi::Env env, Resource* resource, const char* /*syscall*/) {
  int err = resource->Close();
  if (!err) return;
  // Name the object that refused: this one, or a child that stays open (and
  // keeps this one open with it).
  const Resource* failed = resource->failed() ? resource->failed() : resource;
  Napi::Error error = ErrnoError(env, err, failed->destroy_call());
  if (failed != resource) {
    std::string message = std::string(resource->kind()) + " stays open: its " + failed->kind() +
                          " could not be closed (" + error.Message() + ")";
    error.Set("message", message);
  }
  throw error;
}

namespace {

std::string GuidString(__be64 guid_be) {
  uint64_t guid = be64toh(guid_be);
  char text[20];
  snprintf(text, sizeof text, "%04x:%04x:%04x:%04x", unsigned(guid >> 48) & 0xffff,
           unsigned(guid >> 32) & 0xffff, unsigned(guid >> 16) & 0xffff, unsigned(guid) & 0xffff);
  return text;
}

std::string GidString(const ibv_gid& gid) {
  char text[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, gid.raw, text, sizeof text);
  return text;
}

const char* GidTypeName(uint32_t type) {
  switch (type) {
    case IBV_GID_TYPE_IB: return "IB";
    case IBV_GID_TYPE_ROCE_V1: return "RoCEv1";
    case IBV_GID_TYPE_ROCE_V2: return "RoCEv2";
    default: return "unknown";
  }
}

Napi::Value ListDevices(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (!list) {
    // No uverbs support in the kernel at all reads as "no devices".
    if (errno == ENOSYS) return Napi::Array::New(env, 0);
    ThrowErrno(env, errno, "ibv_get_device_list");
  }
  Napi::Array result = Napi::Array::New(env, count);
  for (int i = 0; i < count; i++) {
    Napi::Object entry = Napi::Object::New(env);
    entry.Set("name", ibv_get_device_name(list[i]));
    entry.Set("guid", GuidString(ibv_get_device_guid(list[i])));
    entry.Set("nodeType", ibv_node_type_str(list[i]->node_type));
    entry.Set("transport", list[i]->transport_type == IBV_TRANSPORT_IB ? "IB" : "other");
    result.Set(i, entry);
  }
  ibv_free_device_list(list);
  return result;
}

ibv_context* OpenOwned(Napi::Env env, const std::string& name) {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (!list) ThrowErrno(env, errno == ENOSYS ? ENODEV : errno, "ibv_get_device_list");
  ibv_device* device = nullptr;
  for (int i = 0; i < count; i++) {
    if (name == ibv_get_device_name(list[i])) device = list[i];
  }
  if (!device) {
    ibv_free_device_list(list);
    ThrowErrno(env, ENODEV, "ibv_open_device");
  }
  ibv_context* ctx = ibv_open_device(device);
  int err = errno;
  ibv_free_device_list(list);
  if (!ctx) ThrowErrno(env, err ? err : ENODEV, "ibv_open_device");
  return ctx;
}

Napi::Value SetAsyncEventHandler(const Napi::CallbackInfo& info) {
  AddonData::Get(info.Env())->on_async_event = Napi::Persistent(ArgFunction(info, 0, "handler"));
  return info.Env().Undefined();
}

class ContextWrap : public Napi::ObjectWrap<ContextWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Context",
                       {
                           InstanceMethod("query", &ContextWrap::Query),
                           InstanceMethod("queryPort", &ContextWrap::QueryPort),
                           InstanceMethod("gids", &ContextWrap::Gids),
                           InstanceMethod("watchAsyncEvents", &ContextWrap::WatchAsyncEvents),
                           InstanceMethod("close", &ContextWrap::CloseMethod),
                           InstanceAccessor("name", &ContextWrap::Name, nullptr),
                       });
  }

  // new Context(name) opens a device.
  explicit ContextWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ContextWrap>(info) {
    Napi::Env env = info.Env();
    TagObject(env, info.This().As<Napi::Object>(), Kind::Context);
    std::string name = ArgString(info, 0, "name");
    resource = std::make_shared<ContextResource>();
    resource->addon = AddonData::Get(env);
    // Prefer librdmacm's context for the device: then protection domains,
    // CQs and memory from this Device also work with rdma_cm connections.
    // librdmacm owns it (never closed here); it is shared by every Device
    // opened on the same name.
    int count = 0;
    ibv_context** shared = rdma_get_devices(&count);
    if (shared) {
      // rdma_free_devices() releases each entry of a list it frees: the other
      // devices now, this one (a list of its own) when the Device closes.
      auto** others = static_cast<ibv_context**>(calloc(count + 1, sizeof(ibv_context*)));
      auto** mine = static_cast<ibv_context**>(calloc(2, sizeof(ibv_context*)));
      if (!others || !mine) {
        free(others);
        free(mine);
        rdma_free_devices(shared);
        ThrowErrno(env, ENOMEM, "rdma_get_devices");
      }
      int n = 0;
      for (int i = 0; i < count; i++) {
        if (!resource->ctx && name == ibv_get_device_name(shared[i]->device)) resource->ctx = mine[0] = shared[i];
        else others[n++] = shared[i];
      }
      free(shared);  // its entries are now in `others` and `mine`
      rdma_free_devices(others);
      if (resource->ctx) resource->rdmacm_ref = mine;
      else free(mine);
    }
    if (resource->ctx) {
      resource->owned = false;
    } else {
      resource->ctx = OpenOwned(env, name);  // librdmacm unavailable (no rdma_ucm)
    }
    AddonData::Get(env)->AddRoot(resource);
  }

  std::shared_ptr<ContextResource> resource;

 private:
  ibv_context* Ctx(Napi::Env env) { return Live(env, resource, "Device")->ctx; }

  Napi::Value Query(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ibv_device_attr attr{};
    int rc = ibv_query_device(Ctx(env), &attr);
    if (rc) ThrowErrno(env, rc, "ibv_query_device");
    Napi::Object o = Napi::Object::New(env);
    o.Set("name", ibv_get_device_name(Ctx(env)->device));
    o.Set("firmwareVersion", attr.fw_ver);
    o.Set("nodeGuid", GuidString(attr.node_guid));
    o.Set("sysImageGuid", GuidString(attr.sys_image_guid));
    o.Set("maxMrSize", BigU64(env, attr.max_mr_size));
    o.Set("pageSizeCap", BigU64(env, attr.page_size_cap));
    o.Set("vendorId", attr.vendor_id);
    o.Set("vendorPartId", attr.vendor_part_id);
    o.Set("hardwareVersion", attr.hw_ver);
    o.Set("maxQp", attr.max_qp);
    o.Set("maxQpWr", attr.max_qp_wr);
    o.Set("deviceCapFlags", attr.device_cap_flags);
    o.Set("maxSge", attr.max_sge);
    o.Set("maxSgeRd", attr.max_sge_rd);
    o.Set("maxCq", attr.max_cq);
    o.Set("maxCqe", attr.max_cqe);
    o.Set("maxMr", attr.max_mr);
    o.Set("maxPd", attr.max_pd);
    o.Set("maxQpRdAtom", attr.max_qp_rd_atom);
    o.Set("maxQpInitRdAtom", attr.max_qp_init_rd_atom);
    o.Set("atomicCap", attr.atomic_cap == IBV_ATOMIC_NONE  ? "none"
                       : attr.atomic_cap == IBV_ATOMIC_HCA ? "hca"
                                                           : "global");
    o.Set("maxMw", attr.max_mw);
    o.Set("maxAh", attr.max_ah);
    o.Set("maxSrq", attr.max_srq);
    o.Set("maxSrqWr", attr.max_srq_wr);
    o.Set("maxSrqSge", attr.max_srq_sge);
    o.Set("maxPkeys", attr.max_pkeys);
    o.Set("localCaAckDelay", attr.local_ca_ack_delay);
    o.Set("physPortCount", attr.phys_port_cnt);
    return o;
  }

  Napi::Value QueryPort(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint32_t port = ArgU32(info, 0, "port");
    ibv_port_attr attr{};
    int rc = ibv_query_port(Ctx(env), static_cast<uint8_t>(port), &attr);
    if (rc) ThrowErrno(env, rc, "ibv_query_port");
    Napi::Object o = Napi::Object::New(env);
    o.Set("port", port);
    o.Set("state", ibv_port_state_str(attr.state));
    o.Set("stateCode", static_cast<uint32_t>(attr.state));
    o.Set("maxMtu", 128u << attr.max_mtu);
    o.Set("activeMtu", 128u << attr.active_mtu);
    o.Set("gidTableLength", attr.gid_tbl_len);
    o.Set("portCapFlags", attr.port_cap_flags);
    o.Set("maxMessageSize", attr.max_msg_sz);
    o.Set("lid", attr.lid);
    o.Set("smLid", attr.sm_lid);
    o.Set("lmc", attr.lmc);
    o.Set("linkLayer", attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet"
                       : attr.link_layer == IBV_LINK_LAYER_INFINIBAND ? "InfiniBand"
                                                                      : "unspecified");
    o.Set("activeWidth", attr.active_width);
    o.Set("activeSpeed", attr.active_speed);
    o.Set("physState", attr.phys_state);
    return o;
  }

  Napi::Value Gids(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint32_t port = ArgU32(info, 0, "port");
    ibv_context* ctx = Ctx(env);
    ibv_port_attr attr{};
    int rc = ibv_query_port(ctx, static_cast<uint8_t>(port), &attr);
    if (rc) ThrowErrno(env, rc, "ibv_query_port");
    Napi::Array result = Napi::Array::New(env);
    uint32_t n = 0;
    for (int index = 0; index < attr.gid_tbl_len; index++) {
      ibv_gid_entry entry{};
      rc = QueryGidEntry(ctx, port, static_cast<uint32_t>(index), &entry);
      if (rc == ENODATA || rc == EINVAL) continue;  // empty slot
      if (rc) ThrowErrno(env, rc, "ibv_query_gid");
      Napi::Object o = Napi::Object::New(env);
      o.Set("index", index);
      o.Set("gid", GidString(entry.gid));
      o.Set("type", GidTypeName(entry.gid_type));
      char name[IF_NAMESIZE] = "";
      if (entry.ndev_ifindex && if_indextoname(entry.ndev_ifindex, name)) {
        o.Set("netdev", name);
      } else {
        o.Set("netdev", env.Null());
      }
      result.Set(n++, o);
    }
    return result;
  }

  // watchAsyncEvents(): deliver this device's async events to the handler
  // set with setAsyncEventHandler (see async_events.h). Idempotent.
  Napi::Value WatchAsyncEvents(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    SubscribeAsyncEvents(env, AddonData::Get(env), Ctx(env));
    return env.Undefined();
  }

  Napi::Value Name(const Napi::CallbackInfo& info) {
    return Napi::String::New(info.Env(), ibv_get_device_name(Ctx(info.Env())->device));
  }

  Napi::Value CloseMethod(const Napi::CallbackInfo& info) {
    if (resource) CloseOrThrow(info.Env(), resource.get(), "ibv_close_device");
    return info.Env().Undefined();
  }
};

}  // namespace

std::shared_ptr<ContextResource> ContextOf(Napi::Env env, Napi::Value value) {
  auto* wrap = UnwrapKind<ContextWrap>(env, value, Kind::Context, "Context");
  Live(env, wrap->resource, "Device");
  return wrap->resource;
}

void InitContext(Napi::Env env, Napi::Object exports, AddonData* data) {
  Napi::Function ctor = ContextWrap::Define(env);
  exports.Set("Context", ctor);
  exports.Set("listDevices", Napi::Function::New(env, ListDevices, "listDevices"));
  exports.Set("releaseRemovedDevices", Napi::Function::New(env, ReleaseRemovedDevices, "releaseRemovedDevices"));
  exports.Set("setAsyncEventHandler", Napi::Function::New(env, SetAsyncEventHandler, "setAsyncEventHandler"));
}

}  // namespace ibv

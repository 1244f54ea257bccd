#include "gid_entry.h"

#include <net/if.h>
#include <uv.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace ibv {

namespace {

using QueryGidEx = int (*)(ibv_context*, uint32_t, uint32_t, ibv_gid_entry*, uint32_t, size_t);

// _ibv_query_gid_ex of the libibverbs the addon already loaded, or null when
// it is older than rdma-core 31. Looked up at run time, so the binary does
// not need IBVERBS_1.11: a direct (even weak) reference would make the loader
// refuse the addon on rdma-core 28. libuv's dlopen/dlsym (exported by Node)
// rather than glibc's, whose GLIBC_2.34 versions would raise the glibc floor.
QueryGidEx FindQueryGidEx() {
  static const QueryGidEx fn = []() -> QueryGidEx {
    const char* forced = getenv("NODE_IBVERBS_GID_FALLBACK");
    if (forced && strcmp(forced, "1") == 0) return nullptr;
    static uv_lib_t lib;  // never closed: the addon keeps libibverbs loaded anyway
    if (uv_dlopen("libibverbs.so.1", &lib) != 0) {
      uv_dlclose(&lib);  // frees the error message
      return nullptr;
    }
    void* symbol = nullptr;
    if (uv_dlsym(&lib, "_ibv_query_gid_ex", &symbol) != 0) return nullptr;
    return reinterpret_cast<QueryGidEx>(symbol);
  }();
  return fn;
}

bool ReadLine(const std::string& path, std::string* line) {
  std::ifstream file(path);
  return static_cast<bool>(std::getline(file, *line));
}

// What rdma-core itself does without netlink: the GID from ibv_query_gid,
// its type and netdev from the device's sysfs gid_attrs.
int QueryGidFromSysfs(ibv_context* ctx, uint32_t port, uint32_t index, ibv_gid_entry* entry) {
  ibv_gid gid{};
  if (ibv_query_gid(ctx, static_cast<uint8_t>(port), static_cast<int>(index), &gid)) return errno ? errno : EINVAL;
  static const ibv_gid zero{};
  if (memcmp(&gid, &zero, sizeof gid) == 0) return ENODATA;
  const std::string attrs = std::string("/sys/class/infiniband/") + ibv_get_device_name(ctx->device) +
                            "/ports/" + std::to_string(port) + "/gid_attrs/";
  std::string type;
  if (!ReadLine(attrs + "types/" + std::to_string(index), &type)) return ENODATA;  // unused slot
  ibv_port_attr port_attr{};
  if (ibv_query_port(ctx, static_cast<uint8_t>(port), &port_attr)) return errno ? errno : EINVAL;
  entry->gid = gid;
  entry->gid_index = index;
  entry->port_num = port;
  if (type == "RoCE v2") {
    entry->gid_type = IBV_GID_TYPE_ROCE_V2;
  } else {
    entry->gid_type = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_IB;
  }
  std::string netdev;
  entry->ndev_ifindex = ReadLine(attrs + "ndevs/" + std::to_string(index), &netdev) ? if_nametoindex(netdev.c_str()) : 0;
  return 0;
}

}  // namespace

bool UsesQueryGidEx() { return FindQueryGidEx() != nullptr; }

int QueryGidEntry(ibv_context* ctx, uint32_t port, uint32_t index, ibv_gid_entry* entry) {
  if (QueryGidEx query = FindQueryGidEx()) return query(ctx, port, index, entry, 0, sizeof *entry);
  return QueryGidFromSysfs(ctx, port, index, entry);
}

}  // namespace ibv

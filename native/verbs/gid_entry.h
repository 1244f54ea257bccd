#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace ibv {

// One GID table entry with its type and netdev, like ibv_query_gid_ex.
// Returns 0, ENODATA for an empty slot, or an errno.
//
// ibv_query_gid_ex is IBVERBS_1.11 (rdma-core 31). The prebuilt binaries must
// load with rdma-core 28 (RHEL 8, Ubuntu 20.04), so it is looked up at run
// time; without it the entry is read the way rdma-core itself reads it without
// the kernel's GID query: ibv_query_gid plus the device's sysfs gid_attrs.
// NODE_IBVERBS_GID_FALLBACK=1 forces that path (tests compare both).
int QueryGidEntry(ibv_context* ctx, uint32_t port, uint32_t index, ibv_gid_entry* entry);

// Whether QueryGidEntry found and uses ibv_query_gid_ex (for a test hook).
bool UsesQueryGidEx();

}  // namespace ibv

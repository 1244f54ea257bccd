// Test-only entry points: let the host's unit tests (no RDMA device) run
// native code that is otherwise reached only through a real queue pair.
// Not part of the API: lib/ never calls these and lib/index.ts does not export
// them; the exported name says so.
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "addon.h"
#include "common.h"
#include "dmabuf.h"
#include "gid_entry.h"
#include "resources.h"
#include "work_request.h"

namespace ibv {

namespace {

Napi::BigInt Big(Napi::Env env, uint64_t value) { return Napi::BigInt::New(env, value); }

Napi::Array Sges(Napi::Env env, const ibv_sge* sges, int count) {
  Napi::Array out = Napi::Array::New(env, count);
  for (int i = 0; i < count; i++) {
    Napi::Object sge = Napi::Object::New(env);
    sge.Set("addr", Big(env, sges[i].addr));
    sge.Set("length", Napi::Number::New(env, sges[i].length));
    sge.Set("lkey", Napi::Number::New(env, sges[i].lkey));
    out.Set(i, sge);
  }
  return out;
}

// The fields of an ibv_send_wr that its opcode makes meaningful (wr.wr is a union).
Napi::Object SendFields(Napi::Env env, const ibv_send_wr& wr) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("wrId", Big(env, wr.wr_id));
  o.Set("opcode", Napi::Number::New(env, wr.opcode));
  o.Set("sendFlags", Napi::Number::New(env, wr.send_flags));
  o.Set("sges", Sges(env, wr.sg_list, wr.num_sge));
  if (wr.opcode == IBV_WR_LOCAL_INV || wr.opcode == IBV_WR_SEND_WITH_INV) {
    o.Set("invalidateRkey", Napi::Number::New(env, wr.invalidate_rkey));
  } else {
    o.Set("immData", Napi::Number::New(env, ntohl(wr.imm_data)));
  }
  switch (wr.opcode) {
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      o.Set("remoteAddr", Big(env, wr.wr.atomic.remote_addr));
      o.Set("rkey", Napi::Number::New(env, wr.wr.atomic.rkey));
      o.Set("compareAdd", Big(env, wr.wr.atomic.compare_add));
      o.Set("swap", Big(env, wr.wr.atomic.swap));
      break;
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
      o.Set("remoteAddr", Big(env, wr.wr.rdma.remote_addr));
      o.Set("rkey", Napi::Number::New(env, wr.wr.rdma.rkey));
      break;
    default:
      o.Set("hasAh", Napi::Boolean::New(env, wr.wr.ud.ah != nullptr));
      o.Set("remoteQpn", Napi::Number::New(env, wr.wr.ud.remote_qpn));
      o.Set("remoteQkey", Napi::Number::New(env, wr.wr.ud.remote_qkey));
      break;
  }
  return o;
}

Napi::Object RecvFields(Napi::Env env, const ibv_recv_wr& wr) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("wrId", Big(env, wr.wr_id));
  o.Set("sges", Sges(env, wr.sg_list, wr.num_sge));
  return o;
}

// __testOnlyDecodeWorkRequests('send' | 'recv' | 'one', words: Uint32Array, count):
// runs DecodeSendBatch / DecodeRecvBatch exactly as postSend/postRecv do (or,
// for 'one', DecodeOneSend as the single-request posts do) and returns the
// decoded list, walked through its `next` links.
Napi::Value DecodeWorkRequestsForTest(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string kind = info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "";
  if (kind != "send" && kind != "recv" && kind != "one") ThrowCode(env, "ERR_INVALID_ARG_VALUE", "kind must be 'send', 'recv' or 'one'");
  const uint32_t* words = nullptr;
  size_t length = 0;
  Uint32Words(env, info[1], &words, &length);
  uint32_t count = ArgU32(info, 2, "count");
  WorkRequestScratch scratch;
  Napi::Array out = Napi::Array::New(env);
  uint32_t n = 0;
  if (kind == "one") {
    OneSend one;
    DecodeOneSend(env, words, length, IBV_QPT_RC, &one);
    out.Set(n++, SendFields(env, one.wr));
  } else if (kind == "send") {
    for (ibv_send_wr* wr = DecodeSendBatch(env, words, length, count, IBV_QPT_RC, &scratch); wr; wr = wr->next) {
      out.Set(n++, SendFields(env, *wr));
    }
  } else {
    for (ibv_recv_wr* wr = DecodeRecvBatch(env, words, length, count, &scratch); wr; wr = wr->next) {
      out.Set(n++, RecvFields(env, *wr));
    }
  }
  return out;
}

// What __testOnlyFailPolls() replaced: one context at a time.
int g_poll_errno = 0;
ibv_context* g_failing_context = nullptr;
int (*g_provider_poll)(ibv_cq*, int, ibv_wc*) = nullptr;

int FailingPoll(ibv_cq*, int, ibv_wc*) { return -g_poll_errno; }

// __testOnlyFailPolls(cq, errno): from now on ibv_poll_cq returns -errno on
// every CQ of `cq`'s device context; errno 0 puts the provider's poll back.
// rxe's poll never fails (it copies entries out of the mapped queue and
// returns their count), so this is the only way to reach the paths that
// handle a failed poll. ibv_poll_cq calls the context's ops.poll_cq: the
// failure comes through libibverbs' own dispatch, nothing else changes, and
// the hot path carries no test branch.
Napi::Value FailPollsForTest(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::shared_ptr<CqResource> cq = CqOf(env, info[0]);
  uint32_t err = ArgU32(info, 1, "errno");
  ibv_context* context = cq->cq->context;
  if (err != 0) {
    if (g_failing_context != nullptr && g_failing_context != context) {
      ThrowCode(env, "ERR_BUSY", "polls already fail on another device context: restore it first (errno 0)");
    }
    if (g_failing_context == nullptr) {
      g_provider_poll = context->ops.poll_cq;
      g_failing_context = context;
    }
    g_poll_errno = static_cast<int>(err);
    context->ops.poll_cq = FailingPoll;
  } else if (g_failing_context == context) {
    context->ops.poll_cq = g_provider_poll;
    g_failing_context = nullptr;
    g_provider_poll = nullptr;
    g_poll_errno = 0;
  }
  return env.Undefined();
}

// The two DRM ioctls it needs (kernel uapi drm.h / drm_mode.h, stable ABI),
// spelled out: the build needs no libdrm headers.
struct DrmCreateDumb {
  uint32_t height, width, bpp, flags, handle, pitch;
  uint64_t size;
};
struct DrmPrimeHandle {
  uint32_t handle, flags;
  int32_t fd;
};
constexpr unsigned long kDrmCreateDumb = _IOWR('d', 0xB2, DrmCreateDumb);
constexpr unsigned long kDrmPrimeHandleToFd = _IOWR('d', 0x2d, DrmPrimeHandle);

// __testOnlyVgemDmabuf(cardPath, size): a dumb buffer on the vgem card
// (modprobe vgem), exported as a dma-buf fd (the card fd is closed: the
// dma-buf keeps the buffer). The kernel's udmabuf would do too, but Debian's
// 6.1 kernel is built without it (CONFIG_UDMABUF is not set).
Napi::Value VgemDmabufForTest(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = ArgString(info, 0, "cardPath");
  uint32_t size = ArgU32(info, 1, "size");
  if (size == 0 || size % 4096 != 0) ThrowCode(env, "ERR_OUT_OF_RANGE", "size must be whole 4 KiB pages");
  int card = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (card < 0) ThrowErrno(env, errno, "open");
  DrmCreateDumb create{};
  create.width = 1024;  // 4 KiB rows at 32 bits per pixel
  create.height = size / 4096;
  create.bpp = 32;
  if (ioctl(card, kDrmCreateDumb, &create) != 0) {
    int err = errno;
    close(card);
    ThrowErrno(env, err, "DRM_IOCTL_MODE_CREATE_DUMB");
  }
  DrmPrimeHandle prime{};
  prime.handle = create.handle;
  prime.flags = O_CLOEXEC | O_RDWR;  // DRM_CLOEXEC | DRM_RDWR
  int rc = ioctl(card, kDrmPrimeHandleToFd, &prime);
  int err = errno;
  close(card);
  if (rc != 0) ThrowErrno(env, err, "DRM_IOCTL_PRIME_HANDLE_TO_FD");
  Napi::Object out = Napi::Object::New(env);
  out.Set("fd", prime.fd);
  out.Set("size", static_cast<double>(create.size));
  return out;
}

}  // namespace

void InitTestHooks(Napi::Env env, Napi::Object exports) {
  exports.Set("__testOnlyDecodeWorkRequests", Napi::Function::New(env, DecodeWorkRequestsForTest));
  exports.Set("__testOnlyFailPolls", Napi::Function::New(env, FailPollsForTest));
  // Which way device.gids() reads GID entries: "ibv_query_gid_ex" (found at
  // run time) or "sysfs" (the fallback for rdma-core < 31).
  // Whether ibv_reg_dmabuf_mr was found at run time; hide: true makes it
  // missing from now on, as in a libibverbs older than rdma-core 34.
  exports.Set("__testOnlyDmabufSymbol", Napi::Function::New(env, [](const Napi::CallbackInfo& info) {
    if (info.Length() > 0 && info[0].IsBoolean() && info[0].As<Napi::Boolean>().Value()) HideRegDmabufMrForTest();
    return Napi::String::New(info.Env(), HasRegDmabufMr() ? "ibv_reg_dmabuf_mr" : "missing");
  }));
  // A real dma-buf for the tests: a vgem (virtual GEM, no hardware) buffer
  // of `size` bytes exported through PRIME; returns its fd.
  exports.Set("__testOnlyVgemDmabuf", Napi::Function::New(env, VgemDmabufForTest));
  exports.Set("__testOnlyGidQuery", Napi::Function::New(env, [](const Napi::CallbackInfo& info) {
    return Napi::String::New(info.Env(), UsesQueryGidEx() ? "ibv_query_gid_ex" : "sysfs");
  }));
}

}  // namespace ibv

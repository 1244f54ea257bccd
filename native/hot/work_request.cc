#include "work_request.h"

#include "addon.h"
#include "common.h"
#include "resources.h"

namespace ibv {

namespace {
inline uint64_t U64(const uint32_t* w) { return w[0] | (static_cast<uint64_t>(w[1]) << 32); }

[[noreturn]] void Malformed(Napi::Env env, const char* what) {
  ThrowCode(env, "ERR_INVALID_ARG_VALUE", std::string("Malformed work request batch: ") + what);
}

void DecodeSges(const uint32_t* w, uint32_t n, ibv_sge* out) {
  for (uint32_t i = 0; i < n; i++, w += kSgeWords) {
    out[i].addr = U64(w);
    out[i].length = w[2];
    out[i].lkey = w[3];
  }
}
}  // namespace

void Uint32Words(Napi::Env env, Napi::Value value, const uint32_t** words, size_t* length) {
  if (!value.IsTypedArray() || value.As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array) {
    ThrowCode(env, "ERR_INVALID_ARG_TYPE", "Expected a Uint32Array of work requests");
  }
  Napi::Uint32Array array = value.As<Napi::Uint32Array>();
  *words = array.Data();
  *length = array.ElementLength();
}

void CheckSendOpcode(Napi::Env env, ibv_qp_type qp_type, ibv_wr_opcode opcode, bool has_ah) {
  if (qp_type != IBV_QPT_UD) return;
  if (opcode != IBV_WR_SEND && opcode != IBV_WR_SEND_WITH_IMM) {
    ThrowCode(env, "ERR_QP_TYPE", "A UD queue pair carries only SEND and SEND_WITH_IMM work requests");
  }
  if (!has_ah) ThrowCode(env, "ERR_QP_TYPE", "A send on a UD queue pair needs an address handle");
}

// One send WR of the layout at `w`, its SGEs into `sges` (room for w[4] of them).
static void DecodeSendWr(Napi::Env env, const uint32_t* w, ibv_qp_type qp_type, ibv_send_wr* wr, ibv_sge* sges) {
  wr->wr_id = U64(w);
  wr->opcode = static_cast<ibv_wr_opcode>(w[2]);
  CheckSendOpcode(env, qp_type, wr->opcode, w[13] != 0);
  wr->send_flags = w[3];
  wr->num_sge = static_cast<int>(w[4]);
  wr->sg_list = wr->num_sge ? sges : nullptr;
  if (wr->opcode == IBV_WR_LOCAL_INV || wr->opcode == IBV_WR_SEND_WITH_INV) {
    wr->invalidate_rkey = w[5];
  } else {
    wr->imm_data = htonl(w[5]);
  }
  switch (wr->opcode) {
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      wr->wr.atomic.remote_addr = U64(w + 6);
      wr->wr.atomic.rkey = w[8];
      wr->wr.atomic.compare_add = U64(w + 9);
      wr->wr.atomic.swap = U64(w + 11);
      break;
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
      wr->wr.rdma.remote_addr = U64(w + 6);
      wr->wr.rdma.rkey = w[8];
      break;
    default:
      break;
  }
  if (w[13] != 0) {  // UD destination
    wr->wr.ud.ah = AddressHandleById(env, w[13]);
    wr->wr.ud.remote_qpn = w[14];
    wr->wr.ud.remote_qkey = w[15];
  }
  DecodeSges(w + kSendHeaderWords, static_cast<uint32_t>(wr->num_sge), sges);
}

ibv_send_wr* DecodeSendBatch(Napi::Env env, const uint32_t* words, size_t length, uint32_t count,
                             ibv_qp_type qp_type, WorkRequestScratch* scratch) {
  return DecodeSendPrefix(env, words, length, count, qp_type, scratch, nullptr);
}

ibv_send_wr* DecodeSendPrefix(Napi::Env env, const uint32_t* words, size_t length, uint32_t count,
                              ibv_qp_type qp_type, WorkRequestScratch* scratch, DecodeFailure* failure) {
  if (count == 0) Malformed(env, "no work requests");
  // First pass: sizes, so the vectors are not reallocated while linking.
  size_t offset = 0, total_sges = 0;
  for (uint32_t i = 0; i < count; i++) {
    if (offset + kSendHeaderWords > length) Malformed(env, "truncated header");
    uint32_t num_sge = words[offset + 4];
    if (num_sge > kMaxSgePerWr) Malformed(env, "too many SGEs");
    offset += kSendHeaderWords + num_sge * kSgeWords;
    if (offset > length) Malformed(env, "truncated SGE list");
    total_sges += num_sge;
  }
  scratch->send.assign(count, ibv_send_wr{});
  scratch->sges.resize(total_sges);
  offset = 0;
  size_t sge_index = 0;
  for (uint32_t i = 0; i < count; i++) {
    ibv_send_wr& wr = scratch->send[i];
    if (failure == nullptr) {
      DecodeSendWr(env, words + offset, qp_type, &wr, scratch->sges.data() + sge_index);
    } else {
      try {
        DecodeSendWr(env, words + offset, qp_type, &wr, scratch->sges.data() + sge_index);
      } catch (const Napi::Error& error) {
        failure->index = i;
        failure->error = error;
        if (i == 0) return nullptr;
        scratch->send[i - 1].next = nullptr;
        return scratch->send.data();
      }
    }
    sge_index += wr.num_sge;
    wr.next = i + 1 < count ? &scratch->send[i + 1] : nullptr;
    offset += kSendHeaderWords + wr.num_sge * kSgeWords;
  }
  return scratch->send.data();
}

void DecodeOneSend(Napi::Env env, const uint32_t* words, size_t length, ibv_qp_type qp_type, OneSend* out) {
  if (length < kSendHeaderWords) Malformed(env, "truncated header");
  uint32_t num_sge = words[4];
  if (num_sge > kOneSendMaxSge) Malformed(env, "too many SGEs for a single request");
  if (kSendHeaderWords + num_sge * kSgeWords > length) Malformed(env, "truncated SGE list");
  out->wr = ibv_send_wr{};
  DecodeSendWr(env, words, qp_type, &out->wr, out->sges);
}

ibv_recv_wr* DecodeRecvBatch(Napi::Env env, const uint32_t* words, size_t length, uint32_t count,
                             WorkRequestScratch* scratch) {
  if (count == 0) Malformed(env, "no work requests");
  size_t offset = 0, total_sges = 0;
  for (uint32_t i = 0; i < count; i++) {
    if (offset + kRecvHeaderWords > length) Malformed(env, "truncated header");
    uint32_t num_sge = words[offset + 2];
    if (num_sge > kMaxSgePerWr) Malformed(env, "too many SGEs");
    offset += kRecvHeaderWords + num_sge * kSgeWords;
    if (offset > length) Malformed(env, "truncated SGE list");
    total_sges += num_sge;
  }
  scratch->recv.assign(count, ibv_recv_wr{});
  scratch->sges.resize(total_sges);
  offset = 0;
  size_t sge_index = 0;
  for (uint32_t i = 0; i < count; i++) {
    const uint32_t* w = words + offset;
    ibv_recv_wr& wr = scratch->recv[i];
    wr.wr_id = U64(w);
    wr.num_sge = static_cast<int>(w[2]);
    wr.sg_list = wr.num_sge ? &scratch->sges[sge_index] : nullptr;
    DecodeSges(w + kRecvHeaderWords, static_cast<uint32_t>(wr.num_sge), wr.sg_list);
    sge_index += wr.num_sge;
    wr.next = i + 1 < count ? &scratch->recv[i + 1] : nullptr;
    offset += kRecvHeaderWords + wr.num_sge * kSgeWords;
  }
  return scratch->recv.data();
}

void ThrowPostError(Napi::Env env, int err, const char* syscall, uint32_t posted) {
  Napi::Error error = ErrnoError(env, err, syscall);
  error.Set("posted", Napi::Number::New(env, posted));
  throw error;
}

}  // namespace ibv

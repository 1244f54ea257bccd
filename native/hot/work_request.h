// Decoding of work requests that JS encodes into a Uint32Array: one native
// call posts a whole batch with one doorbell. Layout (words; 64-bit values as
// lo, hi) must match lib/work-request-encoding.ts.
#pragma once

#include <optional>
#include <infiniband/verbs.h>
#include <napi.h>

#include <vector>

namespace ibv {

constexpr uint32_t kSendHeaderWords = 16;  // see EncodeSend in the TS layer
constexpr uint32_t kRecvHeaderWords = 4;
constexpr uint32_t kSgeWords = 4;  // addr lo, addr hi, length, lkey
constexpr uint32_t kMaxSgePerWr = 64;

// Reusable arrays for decoding, one set per addon instance.
struct WorkRequestScratch {
  std::vector<ibv_send_wr> send;
  std::vector<ibv_recv_wr> recv;
  std::vector<ibv_sge> sges;
};

// Decode `count` send WRs from words[0..length) into scratch, linked, for a
// QP of `qp_type`. Throws ERR_INVALID_ARG_VALUE on a malformed buffer and
// ERR_QP_TYPE on a request the QP type cannot carry (CheckSendOpcode).
ibv_send_wr* DecodeSendBatch(Napi::Env env, const uint32_t* words, size_t length, uint32_t count,
                             ibv_qp_type qp_type, WorkRequestScratch* scratch);

// A request of a well-formed batch that cannot be decoded (its address handle
// was closed after it was encoded): the requests before it can still be posted.
struct DecodeFailure {
  uint32_t index = 0;  // the requests [0, index) decoded and linked
  std::optional<Napi::Error> error;
};

// As DecodeSendBatch(), but a request that fails to decode ends the list
// there instead of throwing: `failure` says which and why (nullptr when the
// first fails). The caller posts the prefix, then throws the error with
// `posted` = index, so the library blames that request alone.
ibv_send_wr* DecodeSendPrefix(Napi::Env env, const uint32_t* words, size_t length, uint32_t count,
                              ibv_qp_type qp_type, WorkRequestScratch* scratch, DecodeFailure* failure);

// The one request at the start of `words`, decoded into storage of the
// caller's (its stack): the single-request posts (tagged, and the promises'
// fast path) carry one SGE, so they skip the batch's two passes and vectors.
constexpr uint32_t kOneSendMaxSge = 4;
struct OneSend {
  ibv_send_wr wr;
  ibv_sge sges[kOneSendMaxSge];
};
void DecodeOneSend(Napi::Env env, const uint32_t* words, size_t length, ibv_qp_type qp_type, OneSend* out);

// Refuses, before anything is posted, a send WR that the QP type cannot carry.
// Providers trust the opcode: rxe dereferences wr.ud.ah for every request on
// a UD QP, so a LOCAL_INV or BIND_MW there (no address handle) crashed the
// process (fuzz seed 2108783432).
void CheckSendOpcode(Napi::Env env, ibv_qp_type qp_type, ibv_wr_opcode opcode, bool has_ah);
ibv_recv_wr* DecodeRecvBatch(Napi::Env env, const uint32_t* words, size_t length, uint32_t count,
                             WorkRequestScratch* scratch);

// Reads (words, length) of a Uint32Array argument.
void Uint32Words(Napi::Env env, Napi::Value value, const uint32_t** words, size_t* length);

// Throws the error of a failed ibv_post_send/recv, with `posted`: how many
// of the batch reached the queue before the failing one.
[[noreturn]] void ThrowPostError(Napi::Env env, int err, const char* syscall, uint32_t posted);

}  // namespace ibv

// The hot paths as plain Node-API functions: each carries its native state as
// the function's data, so a call costs no ObjectWrap unwrap (a private-property
// lookup), no typed-array inspection (the send buffer is bound once) and no
// CallbackInfo setup. lib/queue-pair.ts and lib/completion-queue.ts call
// these for every operation; the ObjectWrap methods stay for everything else.
#include "hot_path.h"

#include "addon.h"
#include "resources.h"
#include "work_request.h"

namespace ibv {

namespace {

// What a send poster holds: the QP, the CQ it polls after posting, and the
// bound buffer of encoded work requests (a strong reference keeps it alive).
struct SendPoster {
  std::shared_ptr<QpResource> qp;
  std::shared_ptr<CqResource> cq;
  napi_ref words_ref = nullptr;
  const uint32_t* words = nullptr;
  size_t length = 0;
};

struct Poller {
  std::shared_ptr<CqResource> cq;
  bool to_count_word = false;  // return nothing: the count is in the CQ's count word
};

template <typename T>
void DeleteData(napi_env env, void* data, void*) {
  T* state = static_cast<T*>(data);
  if constexpr (std::is_same_v<T, SendPoster>) {
    if (state->words_ref) napi_delete_reference(env, state->words_ref);
  }
  delete state;
}

// Reads up to `max` uint32 arguments (a missing or wrong one reads as 0) and the function's data.
template <size_t max>
void* Args(napi_env env, napi_callback_info info, uint32_t (&out)[max]) {
  size_t argc = max;
  napi_value argv[max];
  void* data = nullptr;
  napi_get_cb_info(env, info, &argc, argv, nullptr, &data);
  for (size_t i = 0; i < max; i++) {
    out[i] = 0;
    if (i < argc) napi_get_value_uint32(env, argv[i], &out[i]);
  }
  return data;
}

// Posts `count` work requests of the poster's buffer from word `start`; with
// `poll`, polls the CQ once. Returns the completions polled (0 when poll is 0,
// the CQ is closed, or polling failed: the regular path reports that), or
// throws what ibv_post_send refused, with `posted`.
napi_value PostFrom(napi_env env, SendPoster* poster, uint32_t start, uint32_t count, uint32_t poll) {
  int polled = 0;
  try {
    Napi::Env e(env);
    QpResource* qp = Live(e, poster->qp, "QueuePair");
    if (start > poster->length) ThrowCode(e, "ERR_INVALID_ARG_VALUE", "Malformed work request batch: start past the end");
    DecodeFailure failure;
    ibv_send_wr* first = DecodeSendPrefix(e, poster->words + start, poster->length - start, count, qp->qp->qp_type,
                                          &AddonData::Get(e)->scratch, &failure);
    if (first != nullptr) {
      ibv_send_wr* bad = nullptr;
      int rc = ibv_post_send(qp->qp, first, &bad);
      if (rc) ThrowPostError(e, rc, "ibv_post_send", bad ? static_cast<uint32_t>(bad - first) : 0);
    }
    if (failure.error) {  // the requests before the culprit are posted; it and the rest are not
      failure.error->Set("posted", Napi::Number::New(e, failure.index));
      throw *failure.error;
    }
    CqResource* cq = poster->cq.get();
    if (poll && cq && !cq->closed() && cq->cq) polled = PollInto(cq);
  } catch (const Napi::Error& error) {
    error.ThrowAsJavaScriptException();
    return nullptr;
  }
  napi_value result;
  napi_create_int32(env, polled > 0 ? polled : 0, &result);
  return result;
}

// post(wordStart, count, poll): PostFrom().
napi_value Post(napi_env env, napi_callback_info info) {
  uint32_t a[3];
  auto* poster = static_cast<SendPoster*>(Args(env, info, a));
  return PostFrom(env, poster, a[0], a[1], a[2]);
}

// Posts the one request at word 0 (decoded on the stack: no batch vectors);
// with `poll`, polls the CQ once, and the count of that poll is in the CQ's
// count word (JS zeroes it first: no poll happens when the CQ is closed).
// Returns nothing: making a number costs ~50 instructions.
napi_value PostOneFrom(napi_env env, SendPoster* poster, bool poll) {
  try {
    Napi::Env e(env);
    QpResource* qp = Live(e, poster->qp, "QueuePair");
    OneSend one;
    DecodeOneSend(e, poster->words, poster->length, qp->qp->qp_type, &one);
    ibv_send_wr* bad = nullptr;
    int rc = ibv_post_send(qp->qp, &one.wr, &bad);
    if (rc) ThrowPostError(e, rc, "ibv_post_send", 0);
    CqResource* cq = poster->cq.get();
    if (poll && cq && !cq->closed() && cq->cq) PollInto(cq);
  } catch (const Napi::Error& error) {
    error.ThrowAsJavaScriptException();
  }
  return nullptr;
}

// The data of a function made by Make(): no argument is read (each costs
// ~35 instructions in napi_get_value_uint32, plus the IsUint32 check).
void* DataOf(napi_env env, napi_callback_info info) {
  void* data = nullptr;
  size_t argc = 0;
  napi_get_cb_info(env, info, &argc, nullptr, nullptr, &data);
  return data;
}

// postOne(): the one request at word 0 (the buffer of the lower-level and
// fast promise paths), then one poll of the CQ; postOneNoPoll(): the same
// without the poll (from inside a dispatch: polls do not nest).
napi_value PostOnePoll(napi_env env, napi_callback_info info) {
  return PostOneFrom(env, static_cast<SendPoster*>(DataOf(env, info)), true);
}
napi_value PostOneNoPoll(napi_env env, napi_callback_info info) {
  return PostOneFrom(env, static_cast<SendPoster*>(DataOf(env, info)), false);
}

// poll() -> completions written to the output (returned, or left in the count
// word); throws when ibv_poll_cq fails.
napi_value Poll(napi_env env, napi_callback_info info) {
  auto* poller = static_cast<Poller*>(DataOf(env, info));
  CqResource* cq = poller->cq.get();
  int n;
  try {
    Napi::Env e(env);
    if (cq->closed() || !cq->cq) ThrowCode(e, "ERR_CLOSED", "CompletionQueue is closed");
    n = PollInto(cq);
    if (n < 0) ThrowErrno(e, -n, "ibv_poll_cq");
  } catch (const Napi::Error& error) {
    error.ThrowAsJavaScriptException();
    return nullptr;
  }
  if (poller->to_count_word) return nullptr;
  napi_value result;
  napi_create_int32(env, n, &result);
  return result;
}

template <typename T>
Napi::Function Make(Napi::Env env, const char* name, napi_callback callback, T* state) {
  napi_value fn;
  napi_status status = napi_create_function(env, name, NAPI_AUTO_LENGTH, callback, state, &fn);
  if (status == napi_ok) status = napi_add_finalizer(env, fn, state, DeleteData<T>, nullptr, nullptr);
  if (status != napi_ok) {
    DeleteData<T>(env, state, nullptr);
    NAPI_THROW_IF_FAILED(env, status, Napi::Function());
  }
  return Napi::Function(env, fn);
}

}  // namespace

Napi::Function MakeSendPoster(Napi::Env env, std::shared_ptr<QpResource> qp, Napi::Value words,
                              std::shared_ptr<CqResource> cq, SendPosterKind kind) {
  const uint32_t* data;
  size_t length;
  Uint32Words(env, words, &data, &length);
  auto* poster = new SendPoster{std::move(qp), std::move(cq), nullptr, data, length};
  if (napi_create_reference(env, words, 1, &poster->words_ref) != napi_ok) {
    delete poster;
    ThrowCode(env, "ERR_NAPI", "napi_create_reference failed");
  }
  switch (kind) {
    case SendPosterKind::kOnePoll: return Make(env, "postOne", PostOnePoll, poster);
    case SendPosterKind::kOne: return Make(env, "postOneNoPoll", PostOneNoPoll, poster);
    default: return Make(env, "post", Post, poster);
  }
}

Napi::Function MakePoller(Napi::Env env, std::shared_ptr<CqResource> cq, bool to_count_word) {
  return Make(env, "poll", Poll, new Poller{std::move(cq), to_count_word});
}

}  // namespace ibv

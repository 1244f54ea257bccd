// Completion queue, announced through its device context's completion channel
// (one per context, watched on the event loop).
// Completions are written into a JS-owned Uint32Array (kCompletionWords words
// each) and announced with one callback per batch, so that many completions
// cost one crossing into JS.
#include "addon.h"
#include "hot_path.h"
#include "resources.h"

namespace ibv {

void SetCqWaiting(CqResource* res, bool waiting);

int CqResource::DestroyHandle() {
  // A CQ that refuses (EBUSY) stays fully working, its channel too. Once it
  // is destroyed the kernel drops its unread events: the channel can name it
  // no more. The last CQ of a context closes the channel.
  if (cq) {
    int rc = ibv_destroy_cq(cq);
    if (rc != 0) return rc;
    cq = nullptr;
  }
  if (channel) {
    channel->cqs.erase(this);
    SetCqWaiting(this, false);
    channel.reset();
  }
  on_completions.Reset();
  output.Reset();
  output_words = nullptr;
  count_word = nullptr;
  return 0;
}

// Collected (or freed with its wrapper): a CQ the kernel still refuses to
// destroy (a QP it knows of still uses it) stays with the kernel, but its
// channel must never name this object again: its events are then acked and
// ignored instead of handled through a freed pointer.
CqResource::~CqResource() {
  Close();
  if (channel) {
    channel->cqs.erase(this);
    SetCqWaiting(this, false);
    channel.reset();
  }
}

// Whether the CQ keeps the loop alive: its channel's watcher is referenced
// while any of its CQs waits.
void SetCqWaiting(CqResource* res, bool waiting) {
  if (!res->channel || res->waiting == waiting) return;
  res->waiting = waiting;
  CompChannel& ch = *res->channel;
  ch.waiting += waiting ? 1 : -1;
  if (waiting && ch.waiting == 1) ch.watcher.Ref();
  if (!waiting && ch.waiting == 0) ch.watcher.Unref();
}

// Polls up to the output capacity; returns the count or -errno, and writes
// the count (0 on an error) to the output's count word.
int PollInto(CqResource* res) {
  int n = ibv_poll_cq(res->cq, static_cast<int>(res->output_capacity), res->wcs.data());
  if (res->count_word) *res->count_word = n > 0 ? static_cast<uint32_t>(n) : 0;
  if (n <= 0) return n;
  uint32_t* out = res->output_words;
  for (int i = 0; i < n; i++, out += kCompletionWords) {
    const ibv_wc& wc = res->wcs[i];
    out[0] = static_cast<uint32_t>(wc.wr_id);
    out[1] = static_cast<uint32_t>(wc.wr_id >> 32);
    out[2] = wc.status;
    out[3] = wc.opcode;
    out[4] = wc.byte_len;
    out[5] = (wc.wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc.imm_data) : wc.invalidated_rkey;
    out[6] = wc.qp_num;
    out[7] = wc.src_qp;
    out[8] = wc.wc_flags;
    out[9] = wc.pkey_index;
    out[10] = wc.slid;
    out[11] = wc.sl;
    out[12] = wc.dlid_path_bits;
    out[13] = wc.vendor_err;
  }
  return n;
}

namespace {

void OnChannelReadable(Napi::Env env, CompChannel* ch, int status);

// The context's channel, made (and watched) by its first CQ.
std::shared_ptr<CompChannel> ChannelOf(Napi::Env env, ContextResource* context) {
  if (auto ch = context->comp_channel.lock()) return ch;
  auto ch = std::make_shared<CompChannel>();
  ch->channel = ibv_create_comp_channel(context->ctx);
  if (!ch->channel) ThrowErrno(env, errno ? errno : ENOMEM, "ibv_create_comp_channel");
  int err = SetNonBlocking(ch->channel->fd);
  if (err) ThrowErrno(env, err, "fcntl");
  CompChannel* raw = ch.get();
  int rc = ch->watcher.Start(env, ch->channel->fd, [raw, env](int st) { OnChannelReadable(env, raw, st); });
  if (rc) ThrowCode(env, "ERR_UV", uv_strerror(rc));
  context->comp_channel = ch;
  return ch;
}

// No completion will be announced on this CQ any more: JS fails what waits
// on it (onCompletions(-errno, syscall)).
void FailCq(Napi::Env env, CqResource* res, int err, const char* syscall) {
  res->failed = true;
  SetCqWaiting(res, false);
  CallFromLoop(env, AsyncContextOf(env, LoopCallback::Completions), res->on_completions,
               {Napi::Number::New(env, -err), Napi::String::New(env, syscall)});
}

// An event for one CQ (acked already): re-arm, then poll one batch. Polling
// after re-arming means no completion can slip between the two. If the batch
// was full, JS drains the rest from setImmediate, so a busy CQ never starves
// timers and I/O.
void OnCqEvent(Napi::Env env, CqResource* res) {
  std::shared_ptr<Resource> keep = res->shared_from_this();  // JS may close and drop the CQ
  if (res->closed() || !res->cq || res->failed) return;
  if (res->rearm) {
    int rc = ibv_req_notify_cq(res->cq, 0);
    if (rc != 0) return FailCq(env, res, rc > 0 ? rc : EIO, "ibv_req_notify_cq");
  }
  int n = PollInto(res);
  if (n != 0) CallFromLoop(env, AsyncContextOf(env, LoopCallback::Completions), res->on_completions, {Napi::Number::New(env, n)});
}

// The channel fired: read one event, and handle it (its handler may close
// CQs, whose unread events the kernel then drops). One read per wakeup, as a
// channel of one CQ needs: should more events be queued, the fd stays
// readable and the (level-triggered) watcher comes back for them, with timers
// and I/O run in between. A failed fd or read fails every CQ on it.
void OnChannelReadable(Napi::Env env, CompChannel* ch, int status) {
  GuardFromLoop(env, [&] {
    std::shared_ptr<CompChannel> keep = ch->shared_from_this();  // its last CQ may close meanwhile
    int err = status < 0 ? EIO : 0;  // libuv reports POLLERR as an error status and stops polling
    if (!err) {
      ibv_cq* cq = nullptr;
      void* cq_context = nullptr;
      if (ibv_get_cq_event(ch->channel, &cq, &cq_context) == 0) {
        ibv_ack_cq_events(cq, 1);
        auto* res = static_cast<CqResource*>(cq_context);
        if (ch->cqs.count(res)) OnCqEvent(env, res);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        err = errno ? errno : EIO;
      }
    }
    if (!err) return;
    ch->watcher.Stop();
    std::vector<std::shared_ptr<Resource>> cqs;
    for (CqResource* res : ch->cqs) cqs.push_back(res->shared_from_this());
    for (auto& r : cqs) {
      auto* res = static_cast<CqResource*>(r.get());
      if (!res->closed() && res->cq && !res->failed) FailCq(env, res, err, "ibv_get_cq_event");
    }
  });
}

class CompletionQueueWrap : public Napi::ObjectWrap<CompletionQueueWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "CompletionQueue",
                       {InstanceMethod("poll", &CompletionQueueWrap::Poll),
                        InstanceMethod("poller", &CompletionQueueWrap::Poller),
                        InstanceMethod("setWaiting", &CompletionQueueWrap::SetWaiting),
                        InstanceMethod("setRearm", &CompletionQueueWrap::SetRearm),
                        InstanceMethod("close", &CompletionQueueWrap::CloseMethod),
                        InstanceMethod("simulateFdError", &CompletionQueueWrap::SimulateFdError),
                        InstanceAccessor("handle", &CompletionQueueWrap::Handle, nullptr),
                        InstanceAccessor("entries", &CompletionQueueWrap::Entries, nullptr)});
  }

  // new CompletionQueue(context, entries, output: Uint32Array, onCompletions(count), compVector)
  explicit CompletionQueueWrap(const Napi::CallbackInfo& info)
      : Napi::ObjectWrap<CompletionQueueWrap>(info) {
    Napi::Env env = info.Env();
    TagObject(env, info.This().As<Napi::Object>(), Kind::CompletionQueue);
    auto context = ContextOf(env, info[0]);
    uint32_t entries = ArgU32(info, 1, "entries");
    if (info.Length() < 3 || !info[2].IsTypedArray() ||
        info[2].As<Napi::TypedArray>().TypedArrayType() != napi_uint32_array) {
      ThrowCode(env, "ERR_INVALID_ARG_TYPE", "Expected a Uint32Array for output");
    }
    Napi::Uint32Array output = info[2].As<Napi::Uint32Array>();
    Napi::Function callback = ArgFunction(info, 3, "onCompletions");
    uint32_t comp_vector = ArgU32(info, 4, "compVector");
    // N completions, then one word for the count of the last poll.
    size_t length = output.ElementLength();
    uint32_t capacity = length == 0 ? 0 : static_cast<uint32_t>((length - 1) / kCompletionWords);
    if (capacity == 0 || length != capacity * kCompletionWords + 1) {
      ThrowCode(env, "ERR_OUT_OF_RANGE", "output must hold N completions of 16 words and one count word (N >= 1)");
    }

    auto res = std::make_shared<CqResource>();
    res->channel = ChannelOf(env, context.get());
    res->cq = ibv_create_cq(context->ctx, static_cast<int>(entries), res.get(), res->channel->channel,
                            static_cast<int>(comp_vector));
    if (!res->cq) {
      int err = errno ? errno : EINVAL;
      res->Close();
      ThrowErrno(env, err, "ibv_create_cq");
    }
    res->channel->cqs.insert(res.get());
    int rc = ibv_req_notify_cq(res->cq, 0);
    if (rc != 0) {
      res->Close();
      ThrowErrno(env, rc > 0 ? rc : EIO, "ibv_req_notify_cq");
    }
    res->output = Napi::Persistent(output.ArrayBuffer());
    res->output_words = output.Data();
    res->output_capacity = capacity;
    res->count_word = output.Data() + length - 1;
    res->wcs.resize(capacity);
    // Weak: the JS CompletionQueue holds the callback, so an unreferenced CQ
    // can be collected (a strong reference here would keep it alive forever).
    res->on_completions = Napi::Weak(callback);
    res->AdoptParent(context);
    resource = res;
  }

  std::shared_ptr<CqResource> resource;

 private:
  // simulateFdError(): test hook, fails this CQ as a failed poll of the
  // channel's fd does (POLLERR after the device went away; then every CQ of
  // the context fails). rxe blocks device removal until the process closes
  // the device, so the real case cannot be provoked with Soft-RoCE.
  Napi::Value SimulateFdError(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CqResource* res = Live(env, resource, "CompletionQueue");
    if (!res->failed) FailCq(env, res, EIO, "ibv_get_cq_event");
    return env.Undefined();
  }

  // poll() -> count written to the output (busy polling and explicit drains).
  Napi::Value Poll(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CqResource* res = Live(env, resource, "CompletionQueue");
    int n = PollInto(res);
    if (n < 0) ThrowErrno(env, -n, "ibv_poll_cq");
    return Napi::Number::New(env, n);
  }

  // poller(toCountWord?) -> a plain function poll() bound to this CQ (no
  // unwrap per call): it returns the count, or with toCountWord returns
  // nothing and leaves the count in the output's count word.
  Napi::Value Poller(const Napi::CallbackInfo& info) {
    Live(info.Env(), resource, "CompletionQueue");
    return MakePoller(info.Env(), resource, info.Length() > 0 && info[0].ToBoolean().Value());
  }

  // setWaiting(true) keeps the event loop alive while requests are pending.
  Napi::Value SetWaiting(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CqResource* res = Live(env, resource, "CompletionQueue");
    SetCqWaiting(res, info.Length() > 0 && info[0].ToBoolean() && !res->failed);
    return env.Undefined();
  }

  // setRearm(false): busy polling finds every completion from the loop, so the
  // channel is not re-armed after its next event (no wakeups, no syscalls).
  // setRearm(true) arms it again.
  Napi::Value SetRearm(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CqResource* res = Live(env, resource, "CompletionQueue");
    bool rearm = info.Length() > 0 && info[0].ToBoolean();
    if (rearm && !res->rearm) {
      int rc = ibv_req_notify_cq(res->cq, 0);
      if (rc != 0) ThrowErrno(env, rc > 0 ? rc : EIO, "ibv_req_notify_cq");
    }
    res->rearm = rearm;
    return env.Undefined();
  }

  // The kernel handle: CQ_ERR async events name the CQ by it.
  Napi::Value Handle(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), Live(info.Env(), resource, "CompletionQueue")->cq->handle);
  }

  Napi::Value Entries(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), Live(info.Env(), resource, "CompletionQueue")->cq->cqe);
  }

  Napi::Value CloseMethod(const Napi::CallbackInfo& info) {
    if (resource) CloseOrThrow(info.Env(), resource.get(), "ibv_destroy_cq");
    return info.Env().Undefined();
  }
};

}  // namespace

std::shared_ptr<CqResource> CqOf(Napi::Env env, Napi::Value value) {
  auto* wrap = UnwrapKind<CompletionQueueWrap>(env, value, Kind::CompletionQueue, "CompletionQueue");
  Live(env, wrap->resource, "CompletionQueue");
  return wrap->resource;
}

void InitCompletionQueue(Napi::Env env, Napi::Object exports, AddonData* data) {
  Napi::Function ctor = CompletionQueueWrap::Define(env);
  exports.Set("CompletionQueue", ctor);
}

}  // namespace ibv

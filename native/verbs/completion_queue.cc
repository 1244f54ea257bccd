// Completion queue with a completion channel watched on the event loop.
// Completions are written into a JS-owned Uint32Array (kCompletionWords words
// each) and announced with one callback per batch, so that many completions
// cost one crossing into JS.
#include "addon.h"
#include "hot_path.h"
#include "resources.h"

namespace ibv {

int CqResource::DestroyHandle() {
  // The watcher stays until the CQ is gone: a CQ that refuses (EBUSY) stays
  // fully working. It must stop before the channel's fd is closed.
  if (cq) {
    int rc = ibv_destroy_cq(cq);
    if (rc != 0) return rc;
    cq = nullptr;
  }
  watcher.Stop();
  if (channel) {
    int rc = ibv_destroy_comp_channel(channel);
    if (rc != 0) return rc;
    channel = nullptr;
  }
  on_completions.Reset();
  output.Reset();
  output_words = nullptr;
  count_word = nullptr;
  return 0;
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
    res->channel = ibv_create_comp_channel(context->ctx);
    if (!res->channel) ThrowErrno(env, errno ? errno : ENOMEM, "ibv_create_comp_channel");
    res->cq = ibv_create_cq(context->ctx, static_cast<int>(entries), nullptr, res->channel,
                            static_cast<int>(comp_vector));
    if (!res->cq) {
      int err = errno ? errno : EINVAL;
      res->Close();
      ThrowErrno(env, err, "ibv_create_cq");
    }
    int err = SetNonBlocking(res->channel->fd);
    if (!err) {
      int rc = ibv_req_notify_cq(res->cq, 0);
      if (rc != 0) err = rc > 0 ? rc : EIO;
    }
    if (err) {
      res->Close();
      ThrowErrno(env, err, "ibv_req_notify_cq");
    }
    res->output = Napi::Persistent(output.ArrayBuffer());
    res->output_words = output.Data();
    res->output_capacity = capacity;
    res->count_word = output.Data() + length - 1;
    res->wcs.resize(capacity);
    // Weak: the JS CompletionQueue holds the callback, so an unreferenced CQ
    // can be collected (a strong reference here would keep it alive forever).
    res->on_completions = Napi::Weak(callback);
    CqResource* raw = res.get();
    int rc = res->watcher.Start(env, res->channel->fd, [raw, env](int status) { OnChannelReadable(env, raw, status); });
    if (rc) {
      res->Close();
      ThrowCode(env, "ERR_UV", uv_strerror(rc));
    }
    res->AdoptParent(context);
    resource = res;
  }

  std::shared_ptr<CqResource> resource;

 private:
  // The channel fired: collect and ack its event, re-arm, then poll one
  // batch. Polling after re-arming means no completion can slip between the
  // two. If the batch was full, JS drains the rest from setImmediate, so a
  // busy CQ never starves timers and I/O. A failure of the fd, the read or the
  // re-arm means no completion will be announced any more: the watcher stops
  // and JS fails what waits on this CQ (onCompletions(-errno, syscall)).
  static void OnChannelReadable(Napi::Env env, CqResource* res, int status) {
    GuardFromLoop(env, [&] {
      std::shared_ptr<Resource> keep = res->shared_from_this();  // JS may close and drop the CQ
      if (res->closed() || !res->cq) return;
      int err = 0;
      const char* syscall = "ibv_get_cq_event";
      if (status < 0) {
        err = EIO;  // libuv reports POLLERR as an error status and stops polling
      } else {
        // One event at most per arming (this channel serves this CQ only, and
        // it is re-armed below), so one read suffices. Should another event be
        // queued, the fd stays readable and the (level-triggered) watcher
        // comes back for it.
        ibv_cq* cq = nullptr;
        void* cq_context = nullptr;
        if (ibv_get_cq_event(res->channel, &cq, &cq_context) == 0) {
          ibv_ack_cq_events(res->cq, 1);
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          err = errno ? errno : EIO;
        }
        if (!err && res->rearm) {
          int rc = ibv_req_notify_cq(res->cq, 0);
          if (rc != 0) {
            err = rc > 0 ? rc : EIO;
            syscall = "ibv_req_notify_cq";
          }
        }
      }
      napi_async_context async = AsyncContextOf(env, LoopCallback::Completions);
      if (err) {
        res->watcher.Stop();
        CallFromLoop(env, async, res->on_completions,
                     {Napi::Number::New(env, -err), Napi::String::New(env, syscall)});
        return;
      }
      int n = PollInto(res);
      if (n != 0) CallFromLoop(env, async, res->on_completions, {Napi::Number::New(env, n)});
    });
  }

  // simulateFdError(): test hook, runs the handler as libuv does when polling
  // the channel's fd fails (POLLERR after the device went away). rxe blocks
  // device removal until the process closes the device, so the real case
  // cannot be provoked with Soft-RoCE.
  Napi::Value SimulateFdError(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CqResource* res = Live(env, resource, "CompletionQueue");
    res->watcher.Stop();
    OnChannelReadable(env, res, UV_EBADF);
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
    if (info.Length() > 0 && info[0].ToBoolean()) {
      res->watcher.Ref();
    } else {
      res->watcher.Unref();
    }
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

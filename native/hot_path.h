// Plain Node-API functions for the hot paths (see hot_path.cc).
#pragma once

#include <napi.h>

#include <memory>

namespace ibv {

struct QpResource;
struct CqResource;

// What MakeSendPoster() makes (the numbers lib/native.ts passes).
enum class SendPosterKind : uint32_t {
  kBatch = 0,    // post(wordStart, count, poll)
  kOne = 1,      // postOneNoPoll(): the single request at word 0
  kOnePoll = 2,  // postOne(): the same, then one poll of `cq`
};

// A function that posts send work requests encoded in `words` (a Uint32Array,
// bound here once): with kBatch, post(wordStart, count, poll) posts `count`
// from wordStart, then, if poll is non-zero, polls `cq` once. Each returns the
// completions it polled.
Napi::Function MakeSendPoster(Napi::Env env, std::shared_ptr<QpResource> qp, Napi::Value words,
                              std::shared_ptr<CqResource> cq, SendPosterKind kind);
// A function poll() that polls `cq` into its output; returns the count.
Napi::Function MakePoller(Napi::Env env, std::shared_ptr<CqResource> cq);

// Polls up to the output capacity into the CQ's output words; returns the count or -errno.
int PollInto(CqResource* cq);

}  // namespace ibv

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
// from wordStart, then, if poll is non-zero, polls `cq` once, and returns the
// completions it polled. The single-request functions return nothing: the
// count of postOne()'s poll is in `cq`'s count word.
Napi::Function MakeSendPoster(Napi::Env env, std::shared_ptr<QpResource> qp, Napi::Value words,
                              std::shared_ptr<CqResource> cq, SendPosterKind kind);
// A function poll() that polls `cq` into its output; returns the count, or
// with `to_count_word` returns nothing (the count is in the output's last word).
Napi::Function MakePoller(Napi::Env env, std::shared_ptr<CqResource> cq, bool to_count_word);

// Polls up to the output capacity into the CQ's output words; returns the count or -errno.
int PollInto(CqResource* cq);

}  // namespace ibv

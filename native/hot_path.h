// Plain Node-API functions for the hot paths (see hot_path.cc).
#pragma once

#include <napi.h>

#include <memory>

namespace ibv {

struct QpResource;
struct CqResource;

// A function post(wordStart, count, poll) that posts `count` send work requests
// encoded in `words` (a Uint32Array, bound here once) from wordStart, then, if
// poll is non-zero, polls `cq` once; returns the completions it polled. With
// `one`: postOne(poll), the single request at word 0.
Napi::Function MakeSendPoster(Napi::Env env, std::shared_ptr<QpResource> qp, Napi::Value words,
                              std::shared_ptr<CqResource> cq, bool one);
// A function poll() that polls `cq` into its output; returns the count.
Napi::Function MakePoller(Napi::Env env, std::shared_ptr<CqResource> cq);

// Polls up to the output capacity into the CQ's output words; returns the count or -errno.
int PollInto(CqResource* cq);

}  // namespace ibv

// Device async events (ibv_get_async_event). librdmacm shares one
// ibv_context per device with the whole process, so every worker thread's
// addon instance sees the same async fd, and each event can be read only
// once. One reader per context, process-wide: a thread that reads and acks
// each event once and hands a copy to every addon instance that subscribed
// (through a thread-safe function per instance, so the event reaches JS on
// that instance's own thread). Each instance matches the event against its
// own QPs/SRQs/CQs in JS.
#pragma once

#include <infiniband/verbs.h>
#include <napi.h>

namespace ibv {

struct AddonData;

// Delivers ctx's events to this instance's handler (data->on_async_event) as
// (deviceName, type, detail), or (deviceName, -1, errno, errnoName) once the
// async fd failed (the device went away): no event follows that one.
// Idempotent per (instance, context). Throws on failure.
void SubscribeAsyncEvents(Napi::Env env, AddonData* data, ibv_context* ctx);
// Stops delivering ctx's events to this instance; when it was the last
// subscriber, stops the reader (before an owned context is closed).
void UnsubscribeAsyncEvents(AddonData* data, ibv_context* ctx);
// At environment cleanup.
void UnsubscribeAllAsyncEvents(AddonData* data);

}  // namespace ibv

#include "async_events.h"
#include "errno_names.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "addon.h"

namespace ibv {

namespace {

// One event as handed to a subscriber: a copy, so that no instance ever
// touches the ibv_async_event (it is acked at once) or the context.
struct EventCopy {
  std::string device;
  int32_t type = 0;  // ibv_event_type, or -1: the async fd failed
  uint32_t detail = 0;  // port, QP number, CQ/SRQ kernel handle, or errno (type -1)
};

struct Subscriber {
  AddonData* data;
  napi_threadsafe_function tsfn;
};

struct Reader {
  ibv_context* ctx = nullptr;
  std::string device;
  int wake_fd = -1;  // written to stop the thread
  std::thread thread;
  std::vector<Subscriber> subscribers;  // guarded by Mutex()
};

// Process-wide by necessity (the contexts are); leaked on purpose so that no
// static destructor runs while a worker is still cleaning up.
std::mutex& Mutex() {
  static auto* mutex = new std::mutex();
  return *mutex;
}
std::unordered_map<ibv_context*, std::unique_ptr<Reader>>& Readers() {
  static auto* readers = new std::unordered_map<ibv_context*, std::unique_ptr<Reader>>();
  return *readers;
}

void Deliver(Reader* reader, const EventCopy& event) {
  std::lock_guard<std::mutex> lock(Mutex());
  for (auto& subscriber : reader->subscribers) {
    auto* copy = new EventCopy(event);
    if (napi_call_threadsafe_function(subscriber.tsfn, copy, napi_tsfn_nonblocking) != napi_ok) delete copy;
  }
}

uint32_t DetailOf(const ibv_async_event& event) {
  switch (event.event_type) {
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_GID_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
      return event.element.port_num;
    case IBV_EVENT_CQ_ERR:
      return event.element.cq->handle;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      return event.element.srq->handle;
    case IBV_EVENT_DEVICE_FATAL:
      return 0;
    default:
      return event.element.qp ? event.element.qp->qp_num : 0;
  }
}

// The reader thread: waits on the async fd (non-blocking) and the wake fd;
// reads and acks every event; on an error of the fd, delivers it and stops.
void ReadLoop(Reader* reader) {
  pollfd fds[2] = {{reader->ctx->async_fd, POLLIN, 0}, {reader->wake_fd, POLLIN, 0}};
  EventCopy failure{reader->device, -1, 0};
  for (;;) {
    int rc = poll(fds, 2, -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      failure.detail = errno;
      break;
    }
    if (fds[1].revents) return;  // unsubscribed: stop
    short revents = fds[0].revents;
    if ((revents & (POLLERR | POLLHUP | POLLNVAL)) && !(revents & POLLIN)) {
      failure.detail = revents & POLLNVAL ? EBADF : EIO;
      break;
    }
    for (;;) {
      ibv_async_event event;
      if (ibv_get_async_event(reader->ctx, &event) != 0) {
        int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) break;
        failure.detail = err ? err : EIO;
        Deliver(reader, failure);
        return;
      }
      EventCopy copy{reader->device, static_cast<int32_t>(event.event_type), DetailOf(event)};
      ibv_ack_async_event(&event);
      Deliver(reader, copy);
    }
  }
  Deliver(reader, failure);
}

// On the subscriber's JS thread.
void CallJs(napi_env raw_env, napi_value /*callback*/, void* context, void* payload) {
  std::unique_ptr<EventCopy> event(static_cast<EventCopy*>(payload));
  if (!raw_env) return;  // the function is being torn down
  auto* data = static_cast<AddonData*>(context);
  Napi::Env env(raw_env);
  GuardFromLoop(env, [&] {
    if (data->tearing_down || !CanRunJs(env)) return;
    napi_async_context async = AsyncContextOf(env, LoopCallback::AsyncEvents);
    if (event->type < 0) {
      int err = static_cast<int>(event->detail);
      const char* name = ErrnoNameOrNull(err);
      CallFromLoop(env, async, data->on_async_event,
                   {Napi::String::New(env, event->device), Napi::Number::New(env, -1), Napi::Number::New(env, err),
                    Napi::String::New(env, name ? name : "EIO")});
    } else {
      CallFromLoop(env, async, data->on_async_event,
                   {Napi::String::New(env, event->device), Napi::Number::New(env, event->type),
                    Napi::Number::New(env, event->detail)});
    }
  });
}

// Removes this instance from a reader; returns the reader to stop if it was
// the last subscriber (already out of the table). Call with Mutex() held.
std::unique_ptr<Reader> RemoveSubscriber(AddonData* data, ibv_context* ctx) {
  auto& readers = Readers();
  auto found = readers.find(ctx);
  if (found == readers.end()) return nullptr;
  auto& subscribers = found->second->subscribers;
  for (auto it = subscribers.begin(); it != subscribers.end(); ++it) {
    if (it->data != data) continue;
    napi_release_threadsafe_function(it->tsfn, napi_tsfn_abort);
    subscribers.erase(it);
    break;
  }
  if (!subscribers.empty()) return nullptr;
  std::unique_ptr<Reader> reader = std::move(found->second);
  readers.erase(found);
  return reader;
}

void StopReader(std::unique_ptr<Reader> reader) {
  if (!reader) return;
  uint64_t one = 1;
  if (write(reader->wake_fd, &one, sizeof one) < 0) { /* the thread also stops at an fd error */ }
  if (reader->thread.joinable()) reader->thread.join();
  close(reader->wake_fd);
}

}  // namespace

void SubscribeAsyncEvents(Napi::Env env, AddonData* data, ibv_context* ctx) {
  auto& mine = data->async_subscriptions;
  if (std::find(mine.begin(), mine.end(), ctx) != mine.end()) return;
  napi_threadsafe_function tsfn = nullptr;
  napi_status status = napi_create_threadsafe_function(env, nullptr, nullptr,
                                                       Napi::String::New(env, "node-ibverbs:async-events"), 0, 1,
                                                       nullptr, nullptr, data, CallJs, &tsfn);
  NAPI_THROW_IF_FAILED_VOID(env, status);
  napi_unref_threadsafe_function(env, tsfn);  // events never keep the process alive
  std::lock_guard<std::mutex> lock(Mutex());
  auto& reader = Readers()[ctx];
  if (!reader) {
    int err = SetNonBlocking(ctx->async_fd);
    int wake_fd = err ? -1 : eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!err && wake_fd < 0) err = errno;
    if (err) {
      Readers().erase(ctx);
      napi_release_threadsafe_function(tsfn, napi_tsfn_abort);
      ThrowErrno(env, err, "eventfd");
    }
    reader = std::make_unique<Reader>();
    reader->ctx = ctx;
    reader->device = ibv_get_device_name(ctx->device);
    reader->wake_fd = wake_fd;
    reader->subscribers.push_back({data, tsfn});
    Reader* raw = reader.get();
    try {
      reader->thread = std::thread(ReadLoop, raw);
    } catch (const std::system_error& error) {
      close(wake_fd);
      Readers().erase(ctx);
      napi_release_threadsafe_function(tsfn, napi_tsfn_abort);
      ThrowErrno(env, error.code().value(), "pthread_create");
    }
  } else {
    reader->subscribers.push_back({data, tsfn});
  }
  mine.push_back(ctx);
}

void UnsubscribeAsyncEvents(AddonData* data, ibv_context* ctx) {
  auto& mine = data->async_subscriptions;
  auto it = std::find(mine.begin(), mine.end(), ctx);
  if (it == mine.end()) return;
  mine.erase(it);
  std::unique_ptr<Reader> reader;
  {
    std::lock_guard<std::mutex> lock(Mutex());
    reader = RemoveSubscriber(data, ctx);
  }
  StopReader(std::move(reader));  // outside the lock: the thread may be delivering
}

void UnsubscribeAllAsyncEvents(AddonData* data) {
  while (!data->async_subscriptions.empty()) UnsubscribeAsyncEvents(data, data->async_subscriptions.back());
}

}  // namespace ibv

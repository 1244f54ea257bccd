// Watches a non-blocking file descriptor on the environment's libuv loop and
// calls a C++ handler when it is readable, or with a negative libuv status
// when polling the fd failed (libuv has then stopped polling it: e.g. POLLERR
// after the device went away). The handle keeps the loop alive only while
// referenced (something waits on it).
#pragma once

#include <napi.h>
#include <uv.h>

#include <functional>

namespace ibv {

class FdWatcher {
 public:
  // status: 0, or a negative libuv error (the watcher is then stopped).
  using Handler = std::function<void(int status)>;

  FdWatcher() = default;
  FdWatcher(const FdWatcher&) = delete;
  FdWatcher& operator=(const FdWatcher&) = delete;
  ~FdWatcher() { Stop(); }

  // Returns 0 or a negative libuv error.
  int Start(Napi::Env env, int fd, Handler handler);
  void Ref();
  void Unref();
  // Stops watching and closes the handle; safe to call repeatedly and on a
  // watcher that never started.
  void Stop();
  bool active() const { return handle_ != nullptr; }

 private:
  static void OnReadable(uv_poll_t* handle, int status, int events);
  uv_poll_t* handle_ = nullptr;
  Handler handler_;
};

// Sets O_NONBLOCK; returns 0 or errno.
int SetNonBlocking(int fd);

}  // namespace ibv

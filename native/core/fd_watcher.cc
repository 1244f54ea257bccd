#include "fd_watcher.h"

#include <fcntl.h>

#include <cerrno>

namespace ibv {

int SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return errno;
  return 0;
}

int FdWatcher::Start(Napi::Env env, int fd, Handler handler) {
  uv_loop_t* loop = nullptr;
  if (napi_get_uv_event_loop(env, &loop) != napi_ok) return UV_EINVAL;
  auto* handle = new uv_poll_t;
  int rc = uv_poll_init(loop, handle, fd);
  if (rc != 0) {
    delete handle;  // never initialised: must not be uv_close()d
    return rc;
  }
  handle->data = this;
  rc = uv_poll_start(handle, UV_READABLE, OnReadable);
  if (rc != 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(handle),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_poll_t*>(h); });
    return rc;
  }
  uv_unref(reinterpret_cast<uv_handle_t*>(handle));
  handle_ = handle;
  handler_ = std::move(handler);
  return 0;
}

void FdWatcher::Ref() {
  if (handle_) uv_ref(reinterpret_cast<uv_handle_t*>(handle_));
}

void FdWatcher::Unref() {
  if (handle_) uv_unref(reinterpret_cast<uv_handle_t*>(handle_));
}

void FdWatcher::Stop() {
  if (!handle_) return;
  uv_poll_stop(handle_);
  handle_->data = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(handle_),
           [](uv_handle_t* h) { delete reinterpret_cast<uv_poll_t*>(h); });
  handle_ = nullptr;
  handler_ = nullptr;
}

void FdWatcher::OnReadable(uv_poll_t* handle, int status, int events) {
  auto* self = static_cast<FdWatcher*>(handle->data);
  if (!self || !self->handler_) return;
  Handler handler = self->handler_;  // the handler may Stop() this watcher
  // libuv stops polling an fd that reported an error and will not call again:
  // release the handle now so that it no longer keeps the loop alive, then
  // let the handler fail what waits on the fd.
  if (status < 0) self->Stop();
  handler(status);
}

}  // namespace ibv

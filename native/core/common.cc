#include "common.h"
#include "errno_names.h"

#include <string.h>

namespace ibv {

namespace {
const napi_type_tag kTags[] = {
    {0x6e6f6465ULL, 0x69627600ULL}, {0x6e6f6465ULL, 0x69627601ULL}, {0x6e6f6465ULL, 0x69627602ULL},
    {0x6e6f6465ULL, 0x69627603ULL}, {0x6e6f6465ULL, 0x69627604ULL}, {0x6e6f6465ULL, 0x69627605ULL},
    {0x6e6f6465ULL, 0x69627606ULL}, {0x6e6f6465ULL, 0x69627607ULL}, {0x6e6f6465ULL, 0x69627608ULL},
    {0x6e6f6465ULL, 0x69627609ULL}, {0x6e6f6465ULL, 0x6962760aULL}, {0x6e6f6465ULL, 0x6962760bULL},
};

std::string ErrnoName(int err) {
  const char* name = ErrnoNameOrNull(err);
  return name ? name : "E" + std::to_string(err);
}
}  // namespace

Napi::Error ErrnoError(Napi::Env env, int err, const char* syscall) {
  std::string message = std::string(syscall) + ": " + strerror(err);
  Napi::Error error = Napi::Error::New(env, message);
  error.Set("code", ErrnoName(err));
  error.Set("errno", Napi::Number::New(env, err));
  error.Set("syscall", syscall);
  return error;
}

void ThrowErrno(Napi::Env env, int err, const char* syscall) {
  throw ErrnoError(env, err, syscall);
}

void ThrowCode(Napi::Env env, const char* code, const std::string& message) {
  Napi::Error error = Napi::Error::New(env, message);
  error.Set("code", code);
  throw error;
}

static void RequireArg(const Napi::CallbackInfo& info, size_t index, const char* name, bool ok,
                       const char* expected) {
  if (!ok) {
    ThrowCode(info.Env(), "ERR_INVALID_ARG_TYPE",
              std::string("Expected ") + expected + " for " + name);
  }
}

uint32_t ArgU32(const Napi::CallbackInfo& info, size_t index, const char* name) {
  RequireArg(info, index, name, index < info.Length() && info[index].IsNumber(), "a number");
  double value = info[index].As<Napi::Number>().DoubleValue();
  RequireArg(info, index, name, value >= 0 && value <= 4294967295.0 && value == (uint32_t)value,
             "an integer from 0 to 2^32-1");
  return static_cast<uint32_t>(value);
}

std::string ArgString(const Napi::CallbackInfo& info, size_t index, const char* name) {
  RequireArg(info, index, name, index < info.Length() && info[index].IsString(), "a string");
  return info[index].As<Napi::String>().Utf8Value();
}

Napi::Function ArgFunction(const Napi::CallbackInfo& info, size_t index, const char* name) {
  RequireArg(info, index, name, index < info.Length() && info[index].IsFunction(), "a function");
  return info[index].As<Napi::Function>();
}

void ArgBytes(const Napi::CallbackInfo& info, size_t index, const char* name, uint8_t** data,
              size_t* length, Napi::ArrayBuffer* backing) {
  RequireArg(info, index, name, index < info.Length(), "an ArrayBuffer or view");
  Napi::Value value = info[index];
  if (value.IsArrayBuffer()) {
    Napi::ArrayBuffer ab = value.As<Napi::ArrayBuffer>();
    *data = static_cast<uint8_t*>(ab.Data());
    *length = ab.ByteLength();
    *backing = ab;
    return;
  }
  if (value.IsTypedArray()) {
    Napi::TypedArray view = value.As<Napi::TypedArray>();
    Napi::ArrayBuffer ab = view.ArrayBuffer();
    *data = static_cast<uint8_t*>(ab.Data()) + view.ByteOffset();
    *length = view.ByteLength();
    *backing = ab;
    return;
  }
  if (value.IsDataView()) {
    Napi::DataView view = value.As<Napi::DataView>();
    Napi::ArrayBuffer ab = view.ArrayBuffer();
    *data = static_cast<uint8_t*>(ab.Data()) + view.ByteOffset();
    *length = view.ByteLength();
    *backing = ab;
    return;
  }
  RequireArg(info, index, name, false, "an ArrayBuffer or view");
}

Napi::Value BigU64(Napi::Env env, uint64_t value) { return Napi::BigInt::New(env, value); }

void TagObject(Napi::Env env, Napi::Object object, Kind kind) {
  napi_status status = napi_type_tag_object(env, object, &kTags[static_cast<uint32_t>(kind)]);
  NAPI_THROW_IF_FAILED_VOID(env, status);
}

bool HasTag(Napi::Env env, Napi::Value value, Kind kind) {
  if (!value.IsObject()) return false;
  bool result = false;
  napi_status status =
      napi_check_object_type_tag(env, value, &kTags[static_cast<uint32_t>(kind)], &result);
  return status == napi_ok && result;
}

}  // namespace ibv

namespace ibv {
namespace {
void ReportUncaught(Napi::Env env, napi_value error) {
  // Only fails if the environment is going away: nothing left to report to.
  napi_fatal_exception(env, error);
}

napi_value NewError(Napi::Env env, const char* message) {
  napi_value text = nullptr;
  napi_value error = nullptr;
  if (napi_create_string_utf8(env, message, NAPI_AUTO_LENGTH, &text) != napi_ok) return nullptr;
  if (napi_create_error(env, nullptr, text, &error) != napi_ok) return nullptr;
  return error;
}
}  // namespace

void GuardFromLoop(Napi::Env env, const std::function<void()>& body) {
  napi_handle_scope scope = nullptr;
  if (napi_open_handle_scope(env, &scope) != napi_ok) return;
  try {
    body();
  } catch (const Napi::Error& error) {
    ReportUncaught(env, error.Value());
  } catch (const std::exception& error) {
    if (napi_value e = NewError(env, error.what())) ReportUncaught(env, e);
  } catch (...) {
    if (napi_value e = NewError(env, "node-ibverbs: unknown C++ exception in a loop callback")) ReportUncaught(env, e);
  }
  napi_close_handle_scope(env, scope);
}

bool CallFromLoop(Napi::Env env, napi_async_context context, Napi::FunctionReference& callback,
                  const std::initializer_list<napi_value>& args) {
  if (callback.IsEmpty() || callback.Value().IsEmpty()) return false;  // weak and collected
  // The C call, not Napi's MakeCallback: once the environment has stopped
  // running JS (a Worker being terminated while its loop still dispatches),
  // the call fails with no exception pending, and node-addon-api would build
  // an Error from that status, which fails there too and aborts the whole
  // process ("FATAL ERROR: Error::Error napi_define_properties").
  napi_value result = nullptr;
  napi_status status = napi_make_callback(env, context, env.Global(), callback.Value(), args.size(), args.begin(), &result);
  if (status == napi_ok) return true;
  bool pending = false;
  napi_value error = nullptr;
  napi_valuetype type = napi_undefined;
  if (napi_is_exception_pending(env, &pending) == napi_ok && pending &&
      napi_get_and_clear_last_exception(env, &error) == napi_ok && napi_typeof(env, error, &type) == napi_ok &&
      (type == napi_object || type == napi_function)) {
    throw Napi::Error(env, error);  // the callback threw: GuardFromLoop reports it
  }
  // No exception, or one that is not an object: V8's termination of a Worker
  // (our callbacks never throw primitives). Napi::Error would wrap it in a new
  // object with napi_define_properties, which fails there and aborts.
  return false;  // nothing can run here any more
}

bool CanRunJs(napi_env env) {
  // The very call that node-addon-api's error path makes and that fails once
  // the environment is terminating (napi_define_properties).
  napi_value probe = nullptr;
  napi_value value = nullptr;
  if (napi_create_object(env, &probe) != napi_ok || napi_get_boolean(env, true, &value) != napi_ok) return false;
  napi_property_descriptor property = {"probe", nullptr, nullptr, nullptr, nullptr, value, napi_default, nullptr};
  return napi_define_properties(env, probe, 1, &property) == napi_ok;
}
}  // namespace ibv

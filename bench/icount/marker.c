// A bench-only Node-API module with one function, mark(id): executes the
// marker instruction id (1 start, 2 end) so that a region can be placed
// around a loop inside a Node process. Plain C against the system's
// node_api.h (no node-gyp):
//   gcc -O2 -shared -fPIC -I<node include dir> -o marker.node marker.c
#include <node_api.h>

#include "marker.h"

static napi_value Mark(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value arg;
  int32_t id = 0;
  napi_get_cb_info(env, info, &argc, &arg, NULL, NULL);
  if (argc > 0) napi_get_value_int32(env, arg, &id);
  icount_mark(id == 1 ? 1 : 2);
  return NULL;
}

static napi_value Init(napi_env env, napi_value exports) {
  napi_value fn;
  napi_create_function(env, "mark", NAPI_AUTO_LENGTH, Mark, NULL, &fn);
  napi_set_named_property(env, exports, "mark", fn);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)

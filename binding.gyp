{
  "targets": [
    {
      "target_name": "node_ibverbs",
      "sources": [
        "native/core/addon.cc",
        "native/core/common.cc",
        "native/core/fd_watcher.cc",
        "native/verbs/context.cc",
        "native/core/async_events.cc",
        "native/verbs/pd.cc",
        "native/verbs/memory.cc",
        "native/verbs/dmabuf.cc",
        "native/verbs/completion_queue.cc",
        "native/hot/work_request.cc",
        "native/verbs/queue_pair.cc",
        "native/hot/hot_path.cc",
        "native/verbs/shared_receive_queue.cc",
        "native/verbs/address_handle.cc",
        "native/verbs/memory_window.cc",
        "native/cm/cm.cc",
        "native/test/test_hooks.cc",
        "native/core/errno_names.cc",
        "native/verbs/gid_entry.cc",
        "native/core/glibc_floor.cc",
        "native/verbs/fork.cc"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")", "native/core", "native/verbs", "native/hot", "native/cm"],
      "defines": ["NAPI_VERSION=9", "NAPI_CPP_EXCEPTIONS", "NODE_ADDON_API_DISABLE_DEPRECATED",
                  "__libc_single_threaded=node_ibverbs_libc_single_threaded"],
      "cflags_cc": ["-std=c++17", "-fexceptions", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
      "cflags_cc!": ["-fno-exceptions"],
      "cflags": ["<!@(pkg-config --cflags libibverbs librdmacm)"],
      "libraries": ["<!@(pkg-config --libs libibverbs librdmacm)"]
    }
  ]
}

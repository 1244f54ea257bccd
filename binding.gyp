{
  "targets": [
    {
      "target_name": "node_ibverbs",
      "sources": [
        "native/addon.cc",
        "native/common.cc",
        "native/fd_watcher.cc",
        "native/context.cc",
        "native/async_events.cc",
        "native/pd.cc",
        "native/memory.cc",
        "native/completion_queue.cc",
        "native/work_request.cc",
        "native/queue_pair.cc",
        "native/hot_path.cc",
        "native/shared_receive_queue.cc",
        "native/address_handle.cc",
        "native/memory_window.cc",
        "native/cm.cc",
        "native/test_hooks.cc",
        "native/errno_names.cc",
        "native/gid_entry.cc",
        "native/glibc_floor.cc",
        "native/fork.cc"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=9", "NAPI_CPP_EXCEPTIONS", "NODE_ADDON_API_DISABLE_DEPRECATED",
                  "__libc_single_threaded=node_ibverbs_libc_single_threaded"],
      "cflags_cc": ["-std=c++17", "-fexceptions", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
      "cflags_cc!": ["-fno-exceptions"],
      "cflags": ["<!@(pkg-config --cflags libibverbs librdmacm)"],
      "libraries": ["<!@(pkg-config --libs libibverbs librdmacm)"]
    }
  ]
}

// The prebuilt binaries must load on glibc 2.28 with GCC 8's libstdc++
// (RHEL 8, Debian 10, Ubuntu 20.04) although they are built with newer ones.
// scripts/prebuilds/floor.mjs checks that no newer symbol version is needed;
// these definitions remove the ones that newer headers pull in.
#include <memory>
#include <new>
#include <typeinfo>

#if __has_include(<sys/single_threaded.h>)
#include <sys/single_threaded.h>
#endif

// libstdc++'s headers read glibc's __libc_single_threaded (GLIBC_2.32) to
// skip atomic reference counts in single-threaded processes. binding.gyp
// renames it to this variable, which says "maybe threaded" forever, so the
// counts are always atomic (the addon has threads anyway).
extern "C" {
__attribute__((visibility("hidden"))) char node_ibverbs_libc_single_threaded = 0;
}

namespace std {

// GLIBCXX_3.4.29 (GCC 11): new_allocator throws it for an impossible size.
// Defined here, the reference never reaches libstdc++.
void __throw_bad_array_new_length() { throw bad_array_new_length(); }

// GLIBCXX_3.4.26 (GCC 9): without RTTI (node-gyp builds with -fno-rtti),
// make_shared's control block asks it whether a type_info is make_shared's
// tag, after comparing addresses itself. libstdc++ built without RTTI
// answers with the same address comparison.
bool _Sp_make_shared_tag::_S_eq(const type_info& ti) noexcept { return &ti == &_S_ti(); }

}  // namespace std

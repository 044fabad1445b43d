// Symbol visibility of the public API.
//
// libtributary is compiled with -fvisibility=hidden and -fvisibility-inlines-hidden, so only the
// public API is exported:
// - every declaration of include/tributary/ lies between TRIBUTARY_BEGIN_PUBLIC_API and
//   TRIBUTARY_END_PUBLIC_API, which give it default visibility (classes included: their vtables
//   and type_info, which subclasses of CrossDeviceOps or Store in other binaries need);
// - the C API marks each function with TRIBUTARY_C_API.
// Everything else (the backends, the algorithms, and the Boost, Asio and nlohmann code compiled
// into the library) stays private to it, so that a trainer that links its own copies of those
// libraries cannot meet ours at run time. Code that needs the internals (the library's own tests
// and micro-benchmarks) links the static, unexported target tributary_internal instead.
#ifndef TRIBUTARY_EXPORT_H_
#define TRIBUTARY_EXPORT_H_

#if defined(__GNUC__) || defined(__clang__)
#define TRIBUTARY_API __attribute__((visibility("default")))
#define TRIBUTARY_BEGIN_PUBLIC_API _Pragma("GCC visibility push(default)")
#define TRIBUTARY_END_PUBLIC_API _Pragma("GCC visibility pop")
#else
#define TRIBUTARY_API
#define TRIBUTARY_BEGIN_PUBLIC_API
#define TRIBUTARY_END_PUBLIC_API
#endif

#define TRIBUTARY_C_API TRIBUTARY_API

#endif  // TRIBUTARY_EXPORT_H_

// Which sanitizer a test binary runs under, for the tests that must skip there (saying why).
// TRIBUTARY_UNDER_TSAN: ThreadSanitizer (GCC defines __SANITIZE_THREAD__, clang has the feature).
#pragma once

#if defined(__SANITIZE_THREAD__)
#define TRIBUTARY_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TRIBUTARY_UNDER_TSAN 1
#endif
#endif

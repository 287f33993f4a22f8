// OUTRUN_THREAD_SCRATCH(T, name, args...): a per-thread object of type T, built on a thread's
// first use (a scratch buffer, a builder). On POSIX a thread_local. With MinGW (Windows), a
// thread_local object that has a destructor is destroyed after emulated TLS has already freed its
// storage when the thread exits: a use-after-free that corrupts the heap (GCC PR 80816,
// mingw-w64 bug 527; seen here as crashes and bad_alloc in outrun.exe under Wine). There the
// object is on the heap, held by a trivially destructible thread_local pointer, and never freed:
// one per thread that used it (design/windows.md "thread_local on MinGW").
#pragma once

#ifdef _WIN32
#define OUTRUN_THREAD_SCRATCH(T, name, ...)                   \
  thread_local T* name##_scratch_ = nullptr;                  \
  if (!name##_scratch_) name##_scratch_ = new T{__VA_ARGS__}; \
  T& name = *name##_scratch_
#else
#define OUTRUN_THREAD_SCRATCH(T, name, ...) \
  thread_local T name {                     \
    __VA_ARGS__                             \
  }
#endif

// Clang thread-safety annotations (-Wthread-safety), as LevelDB's port/thread_annotations.h and
// Abseil's do: which mutex guards which member, and which functions need it held. Under any other
// compiler the macros are empty. libstdc++'s std::mutex carries no annotations, so guarded state
// uses outrun::Mutex and outrun::MutexLock, thin annotated wrappers over std::mutex.
//
// The checked build is `scripts/check-threads` (clang, -Wthread-safety -Werror), run by CI.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#if defined(__clang__)
#define OUTRUN_TSA(x) __attribute__((x))
#else
#define OUTRUN_TSA(x)
#endif

#define CAPABILITY(x) OUTRUN_TSA(capability(x))
#define SCOPED_CAPABILITY OUTRUN_TSA(scoped_lockable)
#define GUARDED_BY(x) OUTRUN_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) OUTRUN_TSA(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) OUTRUN_TSA(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) OUTRUN_TSA(acquired_after(__VA_ARGS__))
#define REQUIRES(...) OUTRUN_TSA(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) OUTRUN_TSA(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) OUTRUN_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) OUTRUN_TSA(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) OUTRUN_TSA(try_acquire_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) OUTRUN_TSA(assert_capability(x))
#define RETURN_CAPABILITY(x) OUTRUN_TSA(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS OUTRUN_TSA(no_thread_safety_analysis)

namespace outrun {

// std::mutex, annotated as a capability.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds it (where it cannot see that, e.g. in a callback).
  void assert_held() const ASSERT_CAPABILITY(this) {}

  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

// std::unique_lock for Mutex: locks in the constructor, unlocks in the destructor unless
// unlock() was called last. unlock() and lock() let a scope let go of the mutex around a call
// (a callback, a submission) and take it back; the analysis follows both.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void unlock() RELEASE() {
    held_ = false;
    mu_.unlock();
  }
  void lock() ACQUIRE() {
    mu_.lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// A condition variable over Mutex. Every wait needs the mutex held (checked: REQUIRES), and
// holds it again when it returns. A predicate that reads guarded state is a lambda annotated
// with the same capability: `cv.wait(mu_, [&]() REQUIRES(mu_) { return !queue_.empty(); })`.
class CondVar {
 public:
  void wait(Mutex& mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> native(mu.native(), std::adopt_lock);
    cv_.wait(native);
    native.release();  // still held: the caller's lock unlocks it
  }
  template <class Pred>
  void wait(Mutex& mu, Pred pred) REQUIRES(mu) {
    std::unique_lock<std::mutex> native(mu.native(), std::adopt_lock);
    cv_.wait(native, std::move(pred));
    native.release();
  }
  // False: timed out (the predicate still false).
  template <class Clock, class Duration, class Pred>
  bool wait_until(Mutex& mu, const std::chrono::time_point<Clock, Duration>& t, Pred pred)
      REQUIRES(mu) {
    std::unique_lock<std::mutex> native(mu.native(), std::adopt_lock);
    const bool ok = cv_.wait_until(native, t, std::move(pred));
    native.release();
    return ok;
  }
  template <class Clock, class Duration>
  std::cv_status wait_until(Mutex& mu, const std::chrono::time_point<Clock, Duration>& t)
      REQUIRES(mu) {
    std::unique_lock<std::mutex> native(mu.native(), std::adopt_lock);
    const std::cv_status st = cv_.wait_until(native, t);
    native.release();
    return st;
  }
  template <class Rep, class Period, class Pred>
  bool wait_for(Mutex& mu, const std::chrono::duration<Rep, Period>& d, Pred pred) REQUIRES(mu) {
    std::unique_lock<std::mutex> native(mu.native(), std::adopt_lock);
    const bool ok = cv_.wait_for(native, d, std::move(pred));
    native.release();
    return ok;
  }
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// Ownership that is handed over by protocol rather than by a lock: a flag claimed under a
// mutex, a hand-off to the loop thread (FrameWriter's write pass). No run-time state and no
// cost: acquire() and release() mark where the ownership begins and ends, so the analysis checks
// that the state it guards is touched only in between, and that functions needing it
// (REQUIRES) are called only there.
class CAPABILITY("baton") Baton {
 public:
  void acquire() ACQUIRE() {}
  void release() RELEASE() {}
};

// The one thread a piece of state belongs to (the libuv loop thread, a dispatcher). Held as a
// capability by code that runs there: `REQUIRES(loop_role)` on a loop-only function, and
// `loop_role.assert_here()` at the entry points libuv calls. assert_here() checks the thread id
// in every build (one comparison of a thread-local against a member: cheap next to a callback).
class CAPABILITY("role") ThreadRole {
 public:
  // Before the thread runs anything that asserts the role (e.g. before uv_run).
  void bind_to_current_thread() { owner_ = std::this_thread::get_id(); }
  bool here() const { return std::this_thread::get_id() == owner_; }
  void assert_here() const ASSERT_CAPABILITY(this);

 private:
  std::thread::id owner_;
};

[[noreturn]] void thread_role_violation();
inline void ThreadRole::assert_here() const {
  if (!here()) [[unlikely]]
    thread_role_violation();
}

}  // namespace outrun

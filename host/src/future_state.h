// The states behind outrun::Future (runner.h) that a runner's own thread fulfils: InProcess and
// Client. The Host's own, which its waiting caller may fulfil itself, is HostFuture (shard.h).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "outrun/runner.h"
#include "outrun/thread_annotations.h"

namespace outrun::detail {

class PromiseState final : public FutureState {
 public:
  // Once.
  void set(Result&& r) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    result_ = std::move(r);
    done_ = true;
    cv_.notify_all();
  }
  void wait() override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    cv_.wait(mu_, [&]() REQUIRES(mu_) { return done_; });
  }
  bool wait_for(std::chrono::nanoseconds d) override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return cv_.wait_for(mu_, d, [&]() REQUIRES(mu_) { return done_; });
  }
  Result take() override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return std::move(result_);
  }

 private:
  Mutex mu_;
  CondVar cv_;  // done_
  bool done_ GUARDED_BY(mu_) = false;
  Result result_ GUARDED_BY(mu_);
};

// The fulfilling side of a PromiseState. Dropped unfulfilled (a runner's bug, or a callback
// object destroyed without being called), it ends the future `cancelled` instead of leaving its
// caller waiting for ever.
class Promise {
 public:
  Promise() : s_(std::make_shared<PromiseState>()) {}
  Promise(Promise&&) noexcept = default;
  Promise& operator=(Promise&&) = delete;
  Promise(const Promise&) = delete;
  Promise& operator=(const Promise&) = delete;
  ~Promise() {
    if (s_) s_->set(Result{Status::cancelled, {}, "the evaluation was dropped unanswered", -1});
  }

  Future future() const { return Future(s_); }
  void set(Result&& r) {
    if (!s_) return;  // set once: a second result is dropped
    s_->set(std::move(r));
    s_.reset();
  }

 private:
  std::shared_ptr<PromiseState> s_;
};

}  // namespace outrun::detail

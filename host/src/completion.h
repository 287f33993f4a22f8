// How an evaluation reports its result, and the dispatcher threads that run callbacks.
#pragma once

#include <memory>
#include <thread>
#include <variant>
#include <vector>

#include "log.h"
#include "outrun/runner.h"
#include "outrun/thread_annotations.h"

namespace outrun::detail {

struct BatchTarget {
  std::shared_ptr<BatchCallback> callback;  // shared by every request of one batch
  std::size_t index = 0;
};

// A caller blocked in Host::evaluate_sync (read_token.h; leader.cpp).
struct SyncWaiter;
// Hands `r` to the waiter and wakes it (leader.cpp). Runs no caller code.
void fulfil(SyncWaiter& w, Result&& r);
// The state behind a Host's outrun::Future (host_impl.h).
struct HostFuture;
void fulfil(HostFuture& f, Result&& r);

// Exactly one of: a callback, a Host future, a batch callback with the request's index, or a caller
// waiting in evaluate_sync.
class Completion {
 public:
  Completion() = default;
  explicit Completion(Callback cb) : v_(std::move(cb)) {}
  explicit Completion(std::shared_ptr<HostFuture> f) : v_(std::move(f)) {}
  explicit Completion(BatchTarget b) : v_(std::move(b)) {}
  explicit Completion(SyncWaiter* w) : v_(w) {}

  // True when delivering runs caller code (a callback), i.e. must happen on a dispatcher.
  bool runs_caller_code() const {
    return std::holds_alternative<Callback>(v_) || std::holds_alternative<BatchTarget>(v_);
  }
  // True for a caller blocked in evaluate_sync: delivered where the result is read, always.
  bool wakes_waiter() const { return std::holds_alternative<SyncWaiter*>(v_); }
  bool empty() const { return std::holds_alternative<std::monostate>(v_); }
  // The Host future it fulfils, or null.
  HostFuture* host_future() const {
    auto* f = std::get_if<std::shared_ptr<HostFuture>>(&v_);
    return f ? f->get() : nullptr;
  }
  // A callback that throws is logged to `log` and otherwise ignored.
  void deliver(Result&& r, const Log& log);

 private:
  std::variant<std::monostate, Callback, std::shared_ptr<HostFuture>, BatchTarget, SyncWaiter*> v_;
};

struct Delivery {
  Completion done;
  Result result;
};

// A thread that runs deliveries in order, blocking (never spinning) while there are none.
class Dispatcher {
 public:
  explicit Dispatcher(const Log& log);
  ~Dispatcher();  // stop_and_join()

  // Runs what is queued, then joins. Deliveries posted after that run inline on the poster's
  // thread (during ~Host, a callback of one shard may submit to another whose thread is gone).
  void stop_and_join() EXCLUDES(mu_);
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Moves every delivery out of `batch` (leaving it empty) and wakes the thread at most once.
  void post(std::vector<Delivery>& batch) EXCLUDES(mu_);
  void post(Delivery&& d) EXCLUDES(mu_);

 private:
  void run() EXCLUDES(mu_);
  const Log& log_;  // the host's, which outlives its dispatchers
  Mutex mu_;
  CondVar cv_;  // queue_ became non-empty, or stop_
  std::vector<Delivery> queue_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  bool exited_ GUARDED_BY(mu_) = false;  // run() returned: post() delivers inline
  std::thread thread_;
};

}  // namespace outrun::detail

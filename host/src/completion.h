// How an evaluation reports its result, and the dispatcher threads that run callbacks.
#pragma once

#include <atomic>
#include <future>
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

// A caller blocked in Host::evaluate_sync (shard.h; follower.cpp).
struct SyncWaiter;
// Hands `r` to the waiter and wakes it (follower.cpp). Runs no caller code.
void fulfil(SyncWaiter& w, Result&& r);

// Exactly one of: a callback, a promise, a batch callback with the request's index, or a caller
// waiting in evaluate_sync.
class Completion {
 public:
  Completion() = default;
  explicit Completion(Callback cb) : v_(std::move(cb)) {}
  explicit Completion(std::promise<Result> p) : v_(std::move(p)) {}
  explicit Completion(BatchTarget b) : v_(std::move(b)) {}
  explicit Completion(SyncWaiter* w) : v_(w) {}

  // True when delivering runs caller code (a callback), i.e. must happen on a dispatcher.
  bool runs_caller_code() const {
    return std::holds_alternative<Callback>(v_) || std::holds_alternative<BatchTarget>(v_);
  }
  // True for a caller blocked in evaluate_sync: delivered where the result is read, always.
  bool wakes_waiter() const { return std::holds_alternative<SyncWaiter*>(v_); }
  bool empty() const { return std::holds_alternative<std::monostate>(v_); }
  // A callback that throws is logged to `log` and otherwise ignored.
  void deliver(Result&& r, const Log& log);

 private:
  std::variant<std::monostate, Callback, std::promise<Result>, BatchTarget, SyncWaiter*> v_;
};

struct Delivery {
  Completion done;
  Result result;
};

// What a dispatcher thread may do instead of sleeping while its queue is empty: the Host's
// dispatchers read their own shard's results (design/threading.md "Reading dispatchers").
class IdleReader {
 public:
  virtual ~IdleReader() = default;
  // Reads results, leaving the deliveries that run caller code in `*out` (to run next, on this
  // thread). False when it could not read now (someone else reads): the dispatcher then sleeps
  // until something is posted. Returns soon after `stop` is set (and interrupt() called).
  virtual bool read(std::vector<Delivery>* out, const std::atomic<bool>& stop) = 0;
  // Makes a read() in progress look at `stop` (wakes it where it waits for input).
  virtual void interrupt() = 0;
};

// A thread that runs deliveries in order, blocking (never spinning) while there are none. With
// an IdleReader it reads results itself while it has nothing to run.
class Dispatcher {
 public:
  explicit Dispatcher(const Log& log, IdleReader* reader = nullptr);
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
  // After a post or stop: wakes the thread, in its condition variable or in its reader.
  void wake(bool was_empty, bool reading);
  const Log& log_;            // the host's, which outlives its dispatchers
  IdleReader* const reader_;  // null: none; outlives the thread
  Mutex mu_;
  CondVar cv_;  // queue_ became non-empty, or stop_
  std::vector<Delivery> queue_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  bool exited_ GUARDED_BY(mu_) = false;   // run() returned: post() delivers inline
  bool reading_ GUARDED_BY(mu_) = false;  // in reader_->read(): a post interrupts it
  std::atomic<bool> interrupted_{false};  // what reader_->read() watches; reset before each read
  std::thread thread_;
};

}  // namespace outrun::detail

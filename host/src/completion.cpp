#include "completion.h"

namespace outrun::detail {

void Completion::deliver(Result&& r, const Log& log) {
  try {
    if (auto* cb = std::get_if<Callback>(&v_)) {
      (*cb)(std::move(r));
    } else if (auto* p = std::get_if<std::promise<Result>>(&v_)) {
      p->set_value(std::move(r));
    } else if (auto* b = std::get_if<BatchTarget>(&v_)) {
      (*b->callback)(b->index, std::move(r));
    } else if (auto* w = std::get_if<SyncWaiter*>(&v_)) {
      fulfil(**w, std::move(r));
    }
  } catch (const std::exception& e) {
    log(LogLevel::error, "outrun: a result callback threw: {}", e.what());
  } catch (...) {
    log(LogLevel::error, "outrun: a result callback threw");
  }
  v_ = std::monostate{};  // release captures now, not when the slot is reused
}

Dispatcher::Dispatcher(const Log& log, IdleReader* reader)
    : log_(log), reader_(reader), thread_([this] { run(); }) {}

Dispatcher::~Dispatcher() {
  stop_and_join();
}

void Dispatcher::wake(bool was_empty, bool reading) {
  // A non-empty queue means a wake-up is already pending: the thread only waits on an empty one.
  if (!was_empty) return;
  cv_.notify_one();
  if (reading) reader_->interrupt();
}

void Dispatcher::stop_and_join() {
  bool reading;
  {
    MutexLock lock(mu_);
    stop_ = true;
    reading = reading_;
    if (reading) interrupted_.store(true, std::memory_order_relaxed);
  }
  wake(true, reading);
  if (thread_.joinable()) thread_.join();
}

void Dispatcher::post(std::vector<Delivery>& batch) {
  if (batch.empty()) return;
  bool was_empty, reading;
  {
    MutexLock lock(mu_);
    if (exited_) {
      lock.unlock();
      for (auto& d : batch) d.done.deliver(std::move(d.result), log_);
      batch.clear();
      return;
    }
    was_empty = queue_.empty();
    reading = reading_;
    if (reading) interrupted_.store(true, std::memory_order_relaxed);
    if (was_empty) {
      queue_.swap(batch);
    } else {
      for (auto& d : batch) queue_.push_back(std::move(d));
    }
  }
  batch.clear();
  wake(was_empty, reading);
}

void Dispatcher::post(Delivery&& d) {
  bool was_empty, reading;
  {
    MutexLock lock(mu_);
    if (exited_) {
      lock.unlock();
      d.done.deliver(std::move(d.result), log_);
      return;
    }
    was_empty = queue_.empty();
    reading = reading_;
    if (reading) interrupted_.store(true, std::memory_order_relaxed);
    queue_.push_back(std::move(d));
  }
  wake(was_empty, reading);
}

void Dispatcher::run() {
  std::vector<Delivery> local;
  // It reads only after it ran a callback: with callbacks to run it saves the loop's wake-up; a
  // shard whose results are futures or evaluate_sync callers' stays with the loop and the
  // callers (a caller that reads its own result wakes nobody else).
  bool may_read = false;
  for (;;) {
    bool read = false;
    {
      MutexLock lock(mu_);
      if (may_read && queue_.empty() && !stop_) {
        // Set under the lock a post reads it under: a post from here on interrupts the read.
        reading_ = read = true;
        interrupted_.store(false, std::memory_order_relaxed);
      } else {
        cv_.wait(mu_, [&]() REQUIRES(mu_) { return !queue_.empty() || stop_; });
        if (queue_.empty()) {  // stop_ and nothing left; decided under the lock, so no post is lost
          exited_ = true;
          return;
        }
        local.swap(queue_);
      }
    }
    if (read) {
      std::vector<Delivery> got;
      // false: another thread reads; sleep until something is posted, then try again.
      reader_->read(&got, interrupted_);
      MutexLock lock(mu_);
      reading_ = false;
      // What was posted while it read was read before what it read (the token passed from that
      // reader to this one): it runs first.
      local.swap(queue_);
      for (auto& d : got) local.push_back(std::move(d));
    }
    may_read = false;
    if (reader_)
      for (const Delivery& d : local)
        if (d.done.runs_caller_code()) {
          may_read = true;
          break;
        }
    for (auto& d : local) d.done.deliver(std::move(d.result), log_);
    local.clear();
  }
}

}  // namespace outrun::detail

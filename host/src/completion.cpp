#include "completion.h"

namespace outrun::detail {

void Completion::deliver(Result&& r, const Log& log) {
  try {
    if (auto* cb = std::get_if<Callback>(&v_)) {
      (*cb)(std::move(r));
    } else if (auto* f = std::get_if<std::shared_ptr<HostFuture>>(&v_)) {
      fulfil(**f, std::move(r));
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

Dispatcher::Dispatcher(const Log& log) : log_(log), thread_([this] { run(); }) {}

Dispatcher::~Dispatcher() {
  stop_and_join();
}

void Dispatcher::stop_and_join() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Dispatcher::post(std::vector<Delivery>& batch) {
  if (batch.empty()) return;
  bool was_empty;
  {
    MutexLock lock(mu_);
    if (exited_) {
      lock.unlock();
      for (auto& d : batch) d.done.deliver(std::move(d.result), log_);
      batch.clear();
      return;
    }
    was_empty = queue_.empty();
    if (was_empty) {
      queue_.swap(batch);
    } else {
      for (auto& d : batch) queue_.push_back(std::move(d));
    }
  }
  batch.clear();
  // A non-empty queue means a wake-up is already pending: the thread only waits on an empty one.
  if (was_empty) cv_.notify_one();
}

void Dispatcher::post(Delivery&& d) {
  bool was_empty;
  {
    MutexLock lock(mu_);
    if (exited_) {
      lock.unlock();
      d.done.deliver(std::move(d.result), log_);
      return;
    }
    was_empty = queue_.empty();
    queue_.push_back(std::move(d));
  }
  if (was_empty) cv_.notify_one();
}

void Dispatcher::run() {
  std::vector<Delivery> local;
  for (;;) {
    {
      MutexLock lock(mu_);
      cv_.wait(mu_, [&]() REQUIRES(mu_) { return !queue_.empty() || stop_; });
      if (queue_.empty()) {  // stop_ and nothing left; decided under the lock, so no post is lost
        exited_ = true;
        return;
      }
      local.swap(queue_);
    }
    for (auto& d : local) d.done.deliver(std::move(d.result), log_);
    local.clear();
  }
}

}  // namespace outrun::detail

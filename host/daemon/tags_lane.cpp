#include "tags_lane.h"

#include <memory>
#include <utility>

#include "outrun/thread_annotations.h"

namespace outrun::daemon {

namespace {
// A Future of the lane: fulfilled by the lane's callback (the Host's loop thread, or a
// dispatcher), waited on by the tags threads.
class LaneFuture final : public detail::FutureState {
 public:
  void set(Result r) EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      result_ = std::move(r);
      ready_ = true;
    }
    cv_.notify_all();
  }
  void wait() override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    cv_.wait(mu_, [&]() REQUIRES(mu_) { return ready_; });
  }
  bool wait_for(std::chrono::nanoseconds d) override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return cv_.wait_for(mu_, d, [&]() REQUIRES(mu_) { return ready_; });
  }
  Result take() override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return std::move(result_);
  }

 private:
  Mutex mu_;  // guards result_, ready_
  CondVar cv_;
  Result result_ GUARDED_BY(mu_);
  bool ready_ GUARDED_BY(mu_) = false;
};
}  // namespace

void TagsLane::evaluate(const Script& script, Inputs inputs, Callback done) {
  submit_(Request{script, std::move(inputs)}, std::move(done));
}

Future TagsLane::evaluate(const Script& script, Inputs inputs) {
  auto state = std::make_shared<LaneFuture>();
  evaluate(script, std::move(inputs), [state](Result r) { state->set(std::move(r)); });
  return Future(state);
}

void TagsLane::evaluate_batch(std::vector<Request> requests, BatchCallback done) {
  auto shared = std::make_shared<BatchCallback>(std::move(done));
  for (std::size_t i = 0; i < requests.size(); ++i)
    submit_(std::move(requests[i]), [shared, i](Result r) { (*shared)(i, std::move(r)); });
}

}  // namespace outrun::daemon

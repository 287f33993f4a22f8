// The tags engine's runner in outrund (design/daemon.md "Tags lane", decision D-tags-lane): the
// Host for registering the tags' scripts, the daemon's fair scheduler for evaluating them. Every
// tag evaluation -- a wave's, a definition's check, a ReadTags' on_read -- waits in one lane of
// each shard's ring, which takes its turn with the clients (kQuantum evaluations a turn), so a
// flood of waves gets one client's share of a shard, not all of it.
#pragma once

#include <functional>
#include <string_view>
#include <vector>

#include "outrun/runner.h"

namespace outrun::daemon {

class TagsLane final : public Runner {
 public:
  // Queues one evaluation in the lane (Server::submit_tag_evaluation: Scheduler::submit_lane).
  using Submit = std::function<void(Request, Callback)>;
  // `host` and what `submit` reaches outlive the lane (the engine over it is destroyed first).
  TagsLane(Submit submit, Runner& host) : submit_(std::move(submit)), host_(host) {}

  Error register_script(std::string_view key, std::string_view source, Script* out) override {
    return host_.register_script(key, source, out);
  }
  Error unregister_script(std::string_view key) override { return host_.unregister_script(key); }
  void evaluate(const Script& script, Inputs inputs, Callback done) override;
  Future evaluate(const Script& script, Inputs inputs) override;
  void evaluate_batch(std::vector<Request> requests, BatchCallback done) override;

 private:
  const Submit submit_;
  Runner& host_;
};

}  // namespace outrun::daemon

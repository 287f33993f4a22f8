// Evaluate frames: each evaluation checked (handle, draining, max_inflight_per_client, its inputs
// decoded within the frame's budget) and refused at once or queued for its shard's window
// (design/daemon.md "Scheduler").
#include <string>

#include "conn.h"
#include "outrun/protocol/frame.h"
#include "server.h"
#include "wire_codec.h"

namespace outrun::daemon {

bool Server::evaluate_items(const std::shared_ptr<Conn>& c, const EvaluationItems* items,
                            uint32_t start) {
  if (!items) return true;
  if (frames_now_us_ == 0) frames_now_us_ = now_us();
  const uint64_t t0 = frames_now_us_;
  // What the inputs of this frame may decode to, shared subtrees counted per use: without it,
  // one small frame of shared subtrees could keep the loop decoding millions of values. Kept
  // across a pause, so a frame resumed in parts has one budget.
  if (start == 0) c->paused_budget = c->paused_copy_budget = protocol::kMaxFrameSize;
  std::size_t& decode_budget = c->paused_budget;
  std::size_t& copy_budget = c->paused_copy_budget;
  // A uid in its crash cool-down (D-crash-budget) has every evaluation refused: asked once per
  // frame (lock-free while nobody cools down).
  const std::string cooling =
      crash_budget_.refusal(c->uid, CrashBudget::Clock::time_point(std::chrono::microseconds(t0)));
  uint64_t cooling_refused = 0;
  uint32_t admitted = 0;
  bool paused = false;
  const uint32_t n = items->size();
  for (uint32_t k = start; k < n; ++k) {
    const wire::Evaluation* e = items->Get(k);
    // What the frame's budgets held before this evaluation: a pause at it gives back what its
    // inputs took, since the resumed frame checks them again.
    const std::size_t decode_before = decode_budget, copy_before = copy_budget;
    Result refused;
    refused.status = Status::ok;
    // Protocol 3's 64-bit handle, else the 32-bit one of protocols 1 and 2 (the first
    // kLegacyHandleGens generations of an id; handle64 0 is not written, and its 32-bit form is
    // 0 too). Either names one record, ever: an older generation than the id's entry is a
    // record that was freed (server.h ScriptEntry).
    const uint64_t handle = e->handle64() ? e->handle64() : e->script_id();
    const uint32_t idx = static_cast<uint32_t>(handle & kHandleIdMask);
    const uint64_t gen = handle >> kHandleIdBits;
    const ScriptEntry* entry = scripts_.at(idx).get();
    if (!entry || gen > entry->gen) {
      refused = Result{
          Status::invalid_argument, {}, "unknown script handle " + std::to_string(handle), -1};
    } else if (gen < entry->gen) {
      refused = Result{Status::invalid_argument,
                       {},
                       "script handle " + std::to_string(handle) +
                           ": handle no longer registered (its script was unregistered or "
                           "replaced and its record freed; register it again)",
                       -1};
    } else if (!entry->script.valid()) {
      refused = Result{
          Status::invalid_argument,
          {},
          "script '" + entry->key + "' was " +
              (entry->replaced ? "replaced by another source; register it again" : "unregistered"),
          -1};
    } else if (!life_.admitting()) {
      refused = Result{Status::unavailable, {}, "outrund is stopping", -1};
    } else if (!cooling.empty()) {
      refused = Result{Status::busy, {}, cooling, -1};
    } else if (c->inflight.load(std::memory_order_relaxed) + admitted >=
               cfg_.max_inflight_per_client) {
      refused = Result{Status::busy,
                       {},
                       "too many evaluations in flight for this client (max_inflight_per_client)",
                       -1};
    }
    Inputs inputs;
    EncodedInputs encoded;
    if (const auto* b = e->inputs_buffer(); refused.status == Status::ok && b) {
      // Protocol 2: verified and checked in place, each use paid for (input_list.h), and passed
      // to the worker as it is, never decoded here (D-encoded-inputs). Its bytes are copied
      // once per evaluation that uses them: what a frame copies is bounded by its size too, or
      // many evaluations of one large buffer would each copy it.
      std::string why;
      if (b->size() > copy_budget) {
        copy_budget = 0;
        refused = Result{Status::invalid_argument,
                         {},
                         "the inputs_buffers of this frame add up to more than " +
                             std::to_string(protocol::kMaxFrameSize) +
                             " bytes (a shared one counts each time it is used)",
                         -1};
      } else if (!detail::check_encoded_inputs({b->data(), b->size()}, &decode_budget, &why)) {
        refused = Result{Status::invalid_argument, {}, std::move(why), -1};
      } else {
        copy_budget -= b->size();
        encoded = detail::EncodedInputsAccess::make({b->data(), b->size()});
      }
    } else if (std::string why;
               refused.status == Status::ok && e->inputs() &&
               !detail::decode_inputs(e->inputs(), &inputs, &decode_budget, &why)) {
      // Protocol 1: decoded here, names and values paid for at each use.
      refused = Result{Status::invalid_argument, {}, std::move(why), -1};
    }
    if (refused.status != Status::ok) {
      // An answer is written now: not while the client is over its budget (a frame of a million
      // refused evaluations would otherwise queue a million answers).
      if (sched_->over_budget(*c)) {
        decode_budget = decode_before;
        copy_budget = copy_before;
        c->paused_frame = items;
        c->paused_item = k;
        paused = true;
        break;
      }
      counters_.by_status[static_cast<int>(refused.status)].fetch_add(1, std::memory_order_relaxed);
      if (!cooling.empty() && refused.status == Status::busy) ++cooling_refused;
      send_result(*c, e->id(), refused);
      continue;
    }
    // Its home shard, or the slow lane while it is there (D-slow-lane): its own window.
    const auto shard = static_cast<uint32_t>(host_->shard_of(entry->script));
    sched_->admit(shard, Queued{Request{entry->script, std::move(inputs), std::move(encoded)},
                                scripts_.at(idx), e->id(), t0, c->uid});
    ++admitted;
  }
  if (cooling_refused > 0) crash_budget_.count_refusals(cooling_refused);
  if (admitted > 0) {
    c->inflight.fetch_add(admitted, std::memory_order_relaxed);
    counters_.inflight.fetch_add(admitted, std::memory_order_relaxed);
    sched_->queue_admitted(*c);  // refilled in the loop's check phase (on_refill_check)
  }
  if (paused) hold(c.get());
  return !paused;
}

}  // namespace outrun::daemon

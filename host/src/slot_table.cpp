#include "slot_table.h"

#include <algorithm>
#include <cassert>

namespace outrun::detail {

uint32_t SlotTable::alloc() {
  uint32_t idx;
  if (!free_.empty()) {
    idx = free_.back();
    free_.pop_back();
  } else {
    idx = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  slots_[idx].retries = 0;
  slots_[idx].source = SourceState::kUnasked;
  live_.store(live_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return idx;
}

void SlotTable::free(uint32_t idx) {
  Slot& s = slots_[idx];
  s.place = SlotPlace::kFree;
  if (++s.generation == 0) s.generation = 1;
  s.script = Script();
  s.inputs.clear();
  if (!s.encoded.empty()) s.encoded = EncodedInputs();
  free_.push_back(idx);
  live_.store(live_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
}

void SlotTable::ensure_key(uint32_t key_id) {
  if (key_id >= flight_.size()) {
    const std::size_t n = std::max<std::size_t>(key_id + 1, flight_.size() * 2);
    flight_.resize(n, 0);
    pending_.resize(n, 0);
  }
}

uint32_t SlotTable::admit(Script script, Inputs&& inputs, Completion&& done, SlotPlace place,
                          bool single_flight, EncodedInputs&& encoded) {
  assert(place == SlotPlace::kSending || place == SlotPlace::kQueued);
  const uint32_t idx = alloc();
  Slot& slot = slots_[idx];
  const uint32_t kid = detail::record_of(script)->key_id;
  slot.script = std::move(script);
  slot.inputs = std::move(inputs);
  if (!encoded.empty()) slot.encoded = std::move(encoded);
  slot.done = std::move(done);
  slot.place = place;
  if (single_flight) {
    ensure_key(kid);
    flight_[kid] = idx + 1;
  }
  if (place == SlotPlace::kQueued) waiting_.push_back(idx);
  return idx;
}

uint32_t SlotTable::admit_pending(const Script& script, Inputs&& inputs, Completion&& done,
                                  Completion* replaced, EncodedInputs&& encoded) {
  const uint32_t kid = detail::record_of(script)->key_id;
  ensure_key(kid);
  if (const uint32_t old = pending_[kid]) {
    std::vector<uint32_t> none;  // a pending evaluation has no successor to promote
    *replaced = release(old - 1, &none);
  }
  const uint32_t idx = alloc();
  Slot& slot = slots_[idx];
  slot.place = SlotPlace::kPending;
  slot.script = script;
  slot.inputs = std::move(inputs);
  if (!encoded.empty()) slot.encoded = std::move(encoded);
  slot.done = std::move(done);
  pending_[kid] = idx + 1;
  return idx;
}

Completion SlotTable::release(uint32_t idx, std::vector<uint32_t>* promoted) {
  Slot& s = slots_[idx];
  const uint32_t kid = detail::record_of(s.script)->key_id;
  if (kid < flight_.size()) {
    if (s.place == SlotPlace::kPending) {
      if (pending_[kid] == idx + 1) pending_[kid] = 0;
    } else if (flight_[kid] == idx + 1) {
      flight_[kid] = 0;
      if (const uint32_t next = pending_[kid]) {  // the coalesced one takes the flight
        pending_[kid] = 0;
        flight_[kid] = next;
        slots_[next - 1].place = SlotPlace::kSending;
        promoted->push_back(next - 1);
      }
    }
  }
  Completion done = std::move(s.done);
  free(idx);
  return done;
}

const Slot* SlotTable::sent(uint64_t id) const {
  const uint32_t idx = static_cast<uint32_t>(id);
  if (idx >= slots_.size()) return nullptr;
  const Slot& s = slots_[idx];
  if (s.place != SlotPlace::kSent || id_of(s, idx) != id) return nullptr;
  return &s;
}

void SlotTable::mark_sent(uint32_t idx, SentWith with) {
  Slot& s = slots_[idx];
  assert(s.place == SlotPlace::kSending);
  s.place = SlotPlace::kSent;
  // Only a send that carried the script says what a NeedSource about it means (none per
  // evaluation otherwise).
  if (with == SentWith::kId) return;
  const bool bytecode = with == SentWith::kBytecode;
  assert(!bytecode || s.may_send_bytecode());
  switch (s.source) {
    case SourceState::kUnasked:
    case SourceState::kBytecodeSent:
      s.source = bytecode ? SourceState::kBytecodeSent : SourceState::kUnasked;
      break;
    case SourceState::kAsked:
    case SourceState::kAskedBytecodeSent:
      s.source = bytecode ? SourceState::kAskedBytecodeSent : SourceState::kAsked;
      break;
    case SourceState::kBytecodeRefused:
    case SourceState::kSpent:
      break;  // the source text only, from now on
  }
}

bool SlotTable::need_source(uint32_t idx) {
  Slot& s = slots_[idx];
  assert(s.place == SlotPlace::kSent);
  // After bytecode: it did not load (the source text follows, once). Otherwise: the worker does
  // not hold the script, which it may say once per evaluation.
  switch (s.source) {
    case SourceState::kUnasked:
      s.source = SourceState::kAsked;
      break;
    case SourceState::kBytecodeSent:
      s.source = SourceState::kBytecodeRefused;
      break;
    case SourceState::kBytecodeRefused:
    case SourceState::kAskedBytecodeSent:
      s.source = SourceState::kSpent;
      break;
    case SourceState::kAsked:
    case SourceState::kSpent:
      return false;
  }
  s.place = SlotPlace::kSending;
  return true;
}

void SlotTable::keep_with_worker(uint32_t idx) {
  assert(slots_[idx].place == SlotPlace::kSending);
  slots_[idx].place = SlotPlace::kSent;
}

void SlotTable::park(uint32_t idx) {
  assert(slots_[idx].place == SlotPlace::kSending);
  slots_[idx].place = SlotPlace::kQueued;
  waiting_.push_back(idx);
}

std::vector<uint32_t> SlotTable::take_waiting() {
  for (uint32_t idx : waiting_) slots_[idx].place = SlotPlace::kSending;
  return std::exchange(waiting_, {});
}

void SlotTable::end_waiting_if(const std::function<std::optional<Result>(const Slot&)>& verdict,
                               Ended* out, std::vector<uint32_t>* promoted) {
  // Taken first: ending one may promote a coalesced successor, which the caller places.
  std::vector<uint32_t> queue = std::exchange(waiting_, {});
  std::vector<uint32_t> kept;
  for (uint32_t idx : queue) {
    if (std::optional<Result> r = verdict(slots_[idx]))
      end(idx, std::move(*r), out, promoted);
    else
      kept.push_back(idx);
  }
  // Nothing joined the queue meanwhile (release never queues): the kept ones are all of it.
  waiting_ = std::move(kept);
}

std::vector<uint32_t> SlotTable::settle(
    const std::function<std::optional<Result>(uint64_t id, const Slot&)>& fate, Ended* out,
    std::vector<uint32_t>* promoted) {
  std::vector<uint32_t> retried;
  for (uint32_t idx = 0; idx < slots_.size(); ++idx) {
    Slot& s = slots_[idx];
    if (s.place != SlotPlace::kSent) continue;
    if (std::optional<Result> r = fate(id_of(s, idx), s)) {
      end(idx, std::move(*r), out, promoted);
    } else {
      ++s.retries;
      s.place = SlotPlace::kSending;
      retried.push_back(idx);
    }
  }
  return retried;
}

void SlotTable::requeue_retries(const std::vector<uint32_t>& retried) {
  for (uint32_t idx : retried) {
    assert(slots_[idx].place == SlotPlace::kSending);
    slots_[idx].place = SlotPlace::kQueued;
  }
  waiting_.insert(waiting_.begin(), retried.begin(), retried.end());
}

}  // namespace outrun::detail

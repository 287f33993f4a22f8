#include "slot_table.h"

#include <algorithm>

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
  slots_[idx].source_resent = false;
  slots_[idx].sent_bytecode = false;
  slots_[idx].bytecode_failed = false;
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
  const uint32_t idx = alloc();
  Slot& slot = slots_[idx];
  const uint32_t kid = script.record()->key_id;
  slot.script = std::move(script);
  slot.inputs = std::move(inputs);
  if (!encoded.empty()) slot.encoded = std::move(encoded);
  slot.done = std::move(done);
  slot.place = place;
  if (single_flight) {
    ensure_key(kid);
    flight_[kid] = idx + 1;
  }
  if (place == SlotPlace::kWaiting) waiting_.push_back(idx);
  return idx;
}

uint32_t SlotTable::admit_pending(const Script& script, Inputs&& inputs, Completion&& done,
                                  Completion* replaced, EncodedInputs&& encoded) {
  const uint32_t kid = script.record()->key_id;
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
  const uint32_t kid = s.script.record()->key_id;
  if (kid < flight_.size()) {
    if (s.place == SlotPlace::kPending) {
      if (pending_[kid] == idx + 1) pending_[kid] = 0;
    } else if (flight_[kid] == idx + 1) {
      flight_[kid] = 0;
      if (const uint32_t next = pending_[kid]) {  // the coalesced one takes the flight
        pending_[kid] = 0;
        flight_[kid] = next;
        slots_[next - 1].place = SlotPlace::kWaiting;
        promoted->push_back(next - 1);
      }
    }
  }
  Completion done = std::move(s.done);
  free(idx);
  return done;
}

Slot* SlotTable::sent(uint64_t id) {
  const uint32_t idx = static_cast<uint32_t>(id);
  if (idx >= slots_.size()) return nullptr;
  Slot& s = slots_[idx];
  if (s.place != SlotPlace::kSent || id_of(s, idx) != id) return nullptr;
  return &s;
}

std::vector<uint32_t> SlotTable::take_sent() const {
  std::vector<uint32_t> out;
  for (uint32_t idx = 0; idx < slots_.size(); ++idx)
    if (slots_[idx].place == SlotPlace::kSent) out.push_back(idx);
  return out;
}

}  // namespace outrun::detail

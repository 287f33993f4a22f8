// A shard's evaluations between submission and their end: the slots, their free list, the queue
// of those waiting for a worker, and the single-flight maps (design/architecture.md "Shard").
// A plain value: the shard's mutex guards it (Shard::table is GUARDED_BY(Shard::mu)); the unit
// tests use it alone (tests/host/slot_table_test.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "completion.h"
#include "outrun/runner.h"
#include "script_record.h"

namespace outrun::detail {

// Where an evaluation is between submission and its end.
enum class SlotPlace : uint8_t {
  kFree,
  kPending,  // coalesce-latest: waits behind the evaluation of its key that is in flight
  kWaiting,  // in the waiting queue (the shard is down, or it is a retry), or about to be sent
  kSent,     // written to the current worker
};

// One evaluation between submission and its result. The evaluation id on the wire is
// (generation << 32 | index), generation >= 1, so no id is 0 (0 means "nothing" on the status
// page) and a stale or forged id never matches a reused slot.
struct Slot {
  uint32_t generation = 1;
  SlotPlace place = SlotPlace::kFree;
  uint8_t retries = 0;
  bool source_resent = false;    // NeedSource answered once for it (a second is a violation)
  bool sent_bytecode = false;    // its last send carried the compile-only process's bytecode
  bool bytecode_failed = false;  // a NeedSource answered that: it gets the source from now on
  Script script;
  Inputs inputs;          // kept to re-send after NeedSource or a restart
  EncodedInputs encoded;  // or these, when not empty (outrund's: sent as they are)
  Completion done;
};

// Evaluations that ended, with their results, to be delivered once the lock is released.
using Ended = std::vector<std::pair<Completion, Result>>;

class SlotTable {
 public:
  static uint64_t id_of(const Slot& s, uint32_t idx) {
    return (uint64_t{s.generation} << 32) | idx;
  }
  uint64_t id(uint32_t idx) const { return id_of(slots_[idx], idx); }

  Slot& operator[](uint32_t idx) { return slots_[idx]; }
  const Slot& operator[](uint32_t idx) const { return slots_[idx]; }
  uint32_t size() const { return static_cast<uint32_t>(slots_.size()); }
  // Evaluations not yet ended (sent, waiting or pending). Also readable without the shard's
  // mutex, as a hint (the loop's busy polling, D-busy-poll), never to decide about a slot.
  std::size_t in_use() const { return live_.load(std::memory_order_relaxed); }

  // Single flight: whether `key_id` has an evaluation in flight (sent, waiting or about to be).
  bool in_flight(uint32_t key_id) const { return key_id < flight_.size() && flight_[key_id] != 0; }

  // Admits an evaluation at `place` (kSent: the caller writes it now; kWaiting: it joins the
  // waiting queue). With `single_flight` it takes its key's flight, which must be free.
  // `script` by value: a caller done with its handle moves it in (no reference count taken).
  uint32_t admit(Script script, Inputs&& inputs, Completion&& done, SlotPlace place,
                 bool single_flight, EncodedInputs&& encoded = {});
  // Coalesce-latest: admits it behind its key's evaluation in flight, replacing the one that
  // waited there before, whose completion is moved to `replaced` (else left empty).
  uint32_t admit_pending(const Script& script, Inputs&& inputs, Completion&& done,
                         Completion* replaced, EncodedInputs&& encoded = {});

  // The one way a slot ends: frees it, releases its key's flight (the coalesced successor, if
  // any, takes the flight and is appended to `promoted`) and hands back its completion.
  Completion release(uint32_t idx, std::vector<uint32_t>* promoted);
  void end(uint32_t idx, Result&& r, Ended* out, std::vector<uint32_t>* promoted) {
    out->emplace_back(release(idx, promoted), std::move(r));
  }

  // The slot the worker means by `id` if it was sent to it, else null (a stale, forged or
  // never-sent id: the worker is untrusted).
  Slot* sent(uint64_t id);

  // The waiting queue, in order: evaluations accepted while the shard was down, and retries.
  void park(uint32_t idx) {
    slots_[idx].place = SlotPlace::kWaiting;
    waiting_.push_back(idx);
  }
  std::vector<uint32_t>& waiting() { return waiting_; }
  std::size_t waiting_count() const { return waiting_.size(); }
  std::vector<uint32_t> take_waiting() { return std::exchange(waiting_, {}); }

  // What was sent to the worker that just died, in slot order (each is then retried or ended).
  std::vector<uint32_t> take_sent() const;

 private:
  uint32_t alloc();
  void free(uint32_t idx);
  void ensure_key(uint32_t key_id);

  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  std::vector<uint32_t> waiting_;
  std::vector<uint32_t> flight_;   // by key id: slot index + 1 of the key's evaluation in flight
  std::vector<uint32_t> pending_;  // by key id: slot index + 1 of the coalesced one behind it
  std::atomic<uint32_t> live_{0};  // in_use(): written under the shard's mutex
};

}  // namespace outrun::detail

// A shard's evaluations between submission and their end: the slots, their free list, the queue
// of those waiting for a worker, and the single-flight maps (design/architecture.md "Shard").
// A plain value: the shard's mutex guards it (Shard::table is GUARDED_BY(Shard::mu)); the unit
// tests use it alone (tests/host/slot_table_test.cpp). Its operations are the only way a slot
// changes: callers read slots (operator[] is const) and ask for transitions.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "completion.h"
#include "outrun/runner.h"
#include "script_record.h"

namespace outrun::detail {

// Where an evaluation is between submission and its end. Each place has one meaning:
//   admit ──► kSending ──mark_sent──► kSent ──need_source / settle (retry)──► kSending
//   admit ──► kQueued ──take_waiting──► kSending ──park──► kQueued
//   admit_pending ──► kPending ──release of the one in flight (promotion)──► kSending
// and any place but kFree ──release / end──► kFree.
enum class SlotPlace : uint8_t {
  kFree,
  kPending,  // coalesce-latest: waits behind the evaluation of its key that is in flight
  kQueued,   // in the waiting queue: for the next worker (the shard is down), or a retry
  kSending,  // in the hands of the caller that holds the shard's mutex, which sends it
             // (mark_sent), queues it (park) or ends it before it lets the mutex go: just
             // admitted, promoted, asked for its source, retried, or taken from the queue
  kSent,     // written to the current worker
};

// What the worker may still ask of an evaluation's script with NeedSource (design/protocol.md):
// once because it does not hold it (its budget dropped it, or it was never sent), and once more
// if the bytecode of the compile-only process it was sent did not load (the source text follows
// from then on). Any NeedSource beyond those is a protocol violation.
enum class SourceState : uint8_t {
  kUnasked,            // no NeedSource yet; its last send with the script carried no bytecode
  kBytecodeSent,       // no NeedSource yet; its last send carried the bytecode
  kBytecodeRefused,    // the bytecode did not load: the source text from now on; one ask left
  kAsked,              // asked once for the script; its last send carried no bytecode
  kAskedBytecodeSent,  // asked once for the script; its last send carried the bytecode
  kSpent,              // asked for the script and refused the bytecode: no ask left
};

// What a send to the worker carried of the slot's script.
enum class SentWith : uint8_t {
  kId,        // only the script's id: the worker holds it
  kSource,    // the source text
  kBytecode,  // the compile-only process's bytecode
};

// One evaluation between submission and its result. The evaluation id on the wire is
// (generation << 32 | index), generation >= 1, so no id is 0 (0 means "nothing" on the status
// page) and a stale or forged id never matches a reused slot.
struct Slot {
  uint32_t generation = 1;
  SlotPlace place = SlotPlace::kFree;
  SourceState source = SourceState::kUnasked;
  uint8_t retries = 0;  // how often a worker's death sent it again
  Script script;
  Inputs inputs;          // kept to re-send after NeedSource or a restart
  EncodedInputs encoded;  // or these, when not empty (outrund's: sent as they are)
  Completion done;

  // Whether a send with the script may carry bytecode (else the source text).
  bool may_send_bytecode() const {
    return source != SourceState::kBytecodeRefused && source != SourceState::kSpent;
  }
};

// Evaluations that ended, with their results, to be delivered once the lock is released.
using Ended = std::vector<std::pair<Completion, Result>>;

class SlotTable {
 public:
  static uint64_t id_of(const Slot& s, uint32_t idx) {
    return (uint64_t{s.generation} << 32) | idx;
  }
  uint64_t id(uint32_t idx) const { return id_of(slots_[idx], idx); }

  const Slot& operator[](uint32_t idx) const { return slots_[idx]; }
  uint32_t size() const { return static_cast<uint32_t>(slots_.size()); }
  // Evaluations not yet ended (sent, waiting or pending). Also readable without the shard's
  // mutex, as a hint (the loop's busy polling, D-busy-poll), never to decide about a slot.
  std::size_t in_use() const { return live_.load(std::memory_order_relaxed); }

  // Single flight: whether `key_id` has an evaluation in flight (sent, waiting or about to be).
  bool in_flight(uint32_t key_id) const { return key_id < flight_.size() && flight_[key_id] != 0; }

  // Admits an evaluation at `place`: kSending (the caller sends it now: mark_sent) or kQueued
  // (it joins the waiting queue). With `single_flight` it takes its key's flight, which must be
  // free. `script` by value: a caller done with its handle moves it in (no reference taken).
  uint32_t admit(Script script, Inputs&& inputs, Completion&& done, SlotPlace place,
                 bool single_flight, EncodedInputs&& encoded = {});
  // Coalesce-latest: admits it behind its key's evaluation in flight, replacing the one that
  // waited there before, whose completion is moved to `replaced` (else left empty).
  uint32_t admit_pending(const Script& script, Inputs&& inputs, Completion&& done,
                         Completion* replaced, EncodedInputs&& encoded = {});

  // The one way a slot ends: frees it, releases its key's flight (the coalesced successor, if
  // any, takes the flight, kSending, and is appended to `promoted`: the caller sends, queues or
  // ends it) and hands back its completion.
  Completion release(uint32_t idx, std::vector<uint32_t>* promoted);
  void end(uint32_t idx, Result&& r, Ended* out, std::vector<uint32_t>* promoted) {
    out->emplace_back(release(idx, promoted), std::move(r));
  }

  // The slot the worker means by `id` if it was sent to it, else null (a stale, forged or
  // never-sent id: the worker is untrusted).
  const Slot* sent(uint64_t id) const;

  // kSending -> kSent: written to the worker, carrying `with` of its script.
  void mark_sent(uint32_t idx, SentWith with);
  // The worker answered NeedSource for this sent evaluation: kSent -> kSending (the caller sends
  // it again, with the script). False, and nothing changes, if it had no ask left (a violation).
  bool need_source(uint32_t idx);
  // kSending -> kSent without a send: the re-send need_source asked for will not happen (the
  // frame that asked broke the protocol), and the dying worker's death settles it with the rest.
  void keep_with_worker(uint32_t idx);

  // The waiting queue, in order: evaluations accepted while the shard was down, and retries.
  // kSending -> kQueued, at the back.
  void park(uint32_t idx);
  std::size_t waiting_count() const { return waiting_.size(); }
  const std::vector<uint32_t>& waiting() const { return waiting_; }
  // The whole queue, in order, each kQueued -> kSending (to be sent to a new worker).
  std::vector<uint32_t> take_waiting();
  // Ends every queued evaluation `verdict` gives a result (in queue order); keeps the others
  // in order. What ending promotes is appended to `promoted`.
  void end_waiting_if(const std::function<std::optional<Result>(const Slot&)>& verdict, Ended* out,
                      std::vector<uint32_t>* promoted);
  // Ends every queued evaluation with `r` (shutdown, crash loop).
  void end_waiting(const Result& r, Ended* out, std::vector<uint32_t>* promoted) {
    end_waiting_if([&](const Slot&) { return std::optional<Result>(r); }, out, promoted);
  }

  // The worker they were sent to died: each evaluation sent to it, in slot order, ends with the
  // result `fate` gives (given its id and slot), or, when that is none, is retried: its retry
  // count goes up and it is returned, kSending, in slot order (the caller hands them to
  // requeue_retries, after ending those it must). What ending promotes goes to `promoted`.
  std::vector<uint32_t> settle(
      const std::function<std::optional<Result>(uint64_t id, const Slot&)>& fate, Ended* out,
      std::vector<uint32_t>* promoted);
  // Retries join the front of the waiting queue, in order, kSending -> kQueued: they were
  // submitted before anything that waits already.
  void requeue_retries(const std::vector<uint32_t>& retried);

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

// The per-shard status page: a small shared-memory block the worker writes and the host reads,
// with no pipe traffic. Lock-free atomics only, so a worker killed at any instruction can never
// leave anything locked or half-written in a way the host would wait on.
//
// Layout (version 1), one page (4096 bytes) per worker process, created by the host with
// Boost.Interprocess (`shared_memory_object`, name passed on the worker's command line, removed
// by the host once the worker said hello):
//
//   offset  field               writer   meaning
//   0       magic               host     kStatusPageMagic
//   8       version             host     kStatusPageVersion
//   64      heartbeat_ns        worker   CLOCK_MONOTONIC of the last heartbeat (heartbeat thread)
//   72      running_id          worker   id of the evaluation running now; 0 = none
//   80      running_since_ns    worker   CLOCK_MONOTONIC when it started (T counts from here)
//   128     evaluations ...     worker   counters, see below
//   184     peak_rss_bytes      worker   peak resident set, written with each heartbeat
//   192     evictions           worker   script states closed for the worker's script budget
//   200     script_bytes        worker   bytes all script states and kept bytecode hold (after each
//   evaluation) 208     reloads             worker   evicted scripts' states built again from their
//   bytecode
//   216     bytecode_loads      worker   scripts whose first state here was loaded from bytecode
//   the host's compile-only process made (instead of compiling their source)
//
// Each field sits in its own 8 bytes; the worker's evaluation fields are on a cache line apart
// from the heartbeat so the heartbeat thread and the main thread do not share a line.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace outrun::protocol {

inline constexpr uint64_t kStatusPageMagic = 0x6f757472756e5350ull;  // "outrunSP"
inline constexpr uint64_t kStatusPageVersion = 1;
inline constexpr std::size_t kStatusPageSize = 4096;

struct StatusPage {
  std::atomic<uint64_t> magic;
  std::atomic<uint64_t> version;
  uint8_t pad0_[48];

  std::atomic<int64_t> heartbeat_ns;
  // Published in this order by the worker: running_id = 0 when an evaluation ends; then, for the
  // next one, running_since_ns, then running_id (release). A reader takes running_id (acquire),
  // running_since_ns, running_id again, and trusts the pair only when both ids agree.
  std::atomic<uint64_t> running_id;
  std::atomic<int64_t> running_since_ns;
  uint8_t pad1_[40];

  std::atomic<uint64_t> evaluations;        // finished, any status
  std::atomic<uint64_t> compiles;           // scripts compiled (successfully or not)
  std::atomic<uint64_t> errors;             // evaluations that did not end ok
  std::atomic<uint64_t> timeouts;           // soft timeouts
  std::atomic<uint64_t> memory_limits;      // evaluations that hit the per-script cap
  std::atomic<uint64_t> scripts;            // script states held now (not the evicted)
  std::atomic<uint64_t> peak_script_bytes;  // largest single script state seen
  std::atomic<uint64_t>
      peak_rss_bytes;  // the process's peak resident set (getrusage), per heartbeat
  // Appended (the layout above is unchanged): the worker's script memory budget.
  std::atomic<uint64_t> evictions;     // idle script states closed to stay within the budget
  std::atomic<uint64_t> script_bytes;  // bytes all script states hold, after each evaluation
  // Evicted scripts whose state was built again from the bytecode the worker kept of their chunk
  // (no NeedSource, no compile).
  std::atomic<uint64_t> reloads;
  // Scripts whose state was built from the bytecode an Evaluation carried (made by the host's
  // compile-only process), instead of compiling a source (design/sandbox.md "The compiler").
  std::atomic<uint64_t> bytecode_loads;
};

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<int64_t>::is_always_lock_free,
              "the status page needs lock-free 64-bit atomics");
static_assert(sizeof(StatusPage) <= kStatusPageSize);
static_assert(offsetof(StatusPage, heartbeat_ns) == 64 &&
                  offsetof(StatusPage, evaluations) == 128 &&
                  offsetof(StatusPage, peak_rss_bytes) == 184 &&
                  offsetof(StatusPage, script_bytes) == 200 &&
                  offsetof(StatusPage, reloads) == 208 &&
                  offsetof(StatusPage, bytecode_loads) == 216,
              "layout is part of the protocol");

// Reads the running evaluation consistently. Returns false when it changed under the reader
// (the caller just looks again later).
inline bool read_running(const StatusPage& p, uint64_t* id, int64_t* since_ns) {
  const uint64_t a = p.running_id.load(std::memory_order_acquire);
  const int64_t s = p.running_since_ns.load(std::memory_order_acquire);
  const uint64_t b = p.running_id.load(std::memory_order_acquire);
  if (a != b) return false;
  *id = a;
  *since_ns = s;
  return true;
}

}  // namespace outrun::protocol

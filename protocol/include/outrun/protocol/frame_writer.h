// Batched frame writer for one stream socket (POSIX) or one non-blocking named pipe (Windows).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "outrun/thread_annotations.h"

namespace outrun::protocol {

// The thread that produces a frame writes it itself: write() appends the frame and, unless
// another thread is already in a write pass, runs passes that each take every frame queued so
// far and hand them to the kernel in one send(2). A thread that finds a pass already running
// just appends and returns; the running pass picks its frame up.
//
// The socket must be non-blocking. When the kernel buffer is full (EAGAIN) the rest is handed
// to the owner's event loop: `on_blocked` runs once (on the producing thread), and the loop then
// calls flush_from_loop() whenever the fd is writable until it returns kDone. Frames appended
// meanwhile are queued behind the rest, so order is kept.
//
// send(2) uses MSG_NOSIGNAL: a peer that went away is reported as kClosed (never SIGPIPE), and
// everything queued is dropped. A send that fails on a producing thread also runs `on_blocked`,
// so the loop learns of it (its flush_from_loop() then returns kClosed) even when the peer is
// still alive and the read side sees nothing.
//
// On Windows the sink is a named pipe's HANDLE in non-blocking mode (PIPE_NOWAIT): WriteFile
// returns at once, having written nothing when the pipe has no room (kAgain), and fails with
// ERROR_NO_DATA once the reader has closed (kClosed). Each WriteFile takes at most kWinChunk
// bytes: Wine writes a non-blocking pipe all or nothing, so a batch larger than the pipe's free
// space would never be written whole (design/windows.md "Frames to the worker").
//
// Thread-safe: write() from any thread; flush_from_loop() from the loop thread only.
class FrameWriter {
 public:
#ifdef _WIN32
  using Sink = void*;  // HANDLE
  static constexpr std::size_t kWinChunk = 32u << 10;
#else
  using Sink = int;  // fd
#endif

  enum class State : uint8_t {
    kWritten,    // everything queued so far reached the kernel, or another pass is writing it
    kHandedOff,  // the socket is full; the loop finishes (on_blocked was called)
    kClosed,     // the peer is gone or the writer was closed; frames are dropped
  };

  explicit FrameWriter(Sink fd, std::function<void()> on_blocked = {});
  FrameWriter(const FrameWriter&) = delete;
  FrameWriter& operator=(const FrameWriter&) = delete;

  // Appends complete, length-prefixed frames and writes what the socket takes.
  State write(std::span<const uint8_t> frames) EXCLUDES(mu_);

  // Appends without writing, and tells whether the caller must run write_pending() (no pass is
  // running). Lets a caller append while it holds a lock that orders frames, then write after
  // releasing it.
  bool enqueue(std::span<const uint8_t> frames) EXCLUDES(mu_);
  // Runs write passes until the queue is empty or the socket is full. Call only after enqueue()
  // returned true.
  State write_pending() EXCLUDES(mu_);

  enum class Flush : uint8_t { kDone, kMore, kClosed };
  // Loop thread, after on_blocked: writes as much as the socket takes. kMore: keep polling for
  // writability; kDone: the queue is empty and producers write directly again.
  Flush flush_from_loop() EXCLUDES(mu_);

  // Drops everything queued; later writes return kClosed. Does not close the fd.
  void close() EXCLUDES(mu_);

  // Bytes appended behind the send pass in progress (the frames a full socket holds back); for
  // per-connection budgets (outrund's clients and tags subscribers). No lock (outrund reads it
  // before every frame of a client): the size as of the last change, exact on the thread that
  // made it.
  std::size_t queued_bytes() const;

  // Counters for tests and the perf harness (approximate when read concurrently).
  uint64_t syscalls() const {
    return syscalls_.load(std::memory_order_relaxed);
  }
  uint64_t bytes_written() const {
    return bytes_written_.load(std::memory_order_relaxed);
  }

 private:
  enum class Io : uint8_t { kAll, kAgain, kClosed };
  // Sends inflight_[offset_..]; updates offset_. Called by the one thread that owns the pass.
  Io send_inflight() REQUIRES(pass_);
  // Runs passes until the queue is empty, the socket is full (the pass goes to the loop) or
  // the stream failed; gives up the pass either way.
  State run_passes() RELEASE(pass_) EXCLUDES(mu_);
  // After every change of pending_: the copy queued_bytes() reads without the lock.
  void pending_changed() REQUIRES(mu_) {
    pending_bytes_.store(pending_.size(), std::memory_order_relaxed);
  }

  const Sink fd_;
  const std::function<void()> on_blocked_;

  Mutex mu_;
  std::vector<uint8_t> pending_ GUARDED_BY(mu_);  // appended while a pass runs
  bool busy_ GUARDED_BY(mu_) = false;             // a pass (producer or loop) owns inflight_
  bool loop_owned_ GUARDED_BY(mu_) = false;       // the loop finishes the current backlog
  bool closed_ GUARDED_BY(mu_) = false;

  // The write pass: taken by whoever sets busy_ (a producer in write()/enqueue(), or close()
  // while busy_ is clear, under mu_), handed to the loop with loop_owned_ (flush_from_loop()).
  Baton pass_;
  std::vector<uint8_t> inflight_ GUARDED_BY(pass_);
  std::size_t offset_ GUARDED_BY(pass_) = 0;
  std::atomic<std::size_t> pending_bytes_{0};  // pending_.size(), stored under mu_
  std::atomic<uint64_t> syscalls_{0};
  std::atomic<uint64_t> bytes_written_{0};
};

}  // namespace outrun::protocol

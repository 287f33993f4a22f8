// Reading a shard's results (design/architecture.md "Shard reader", design/threading.md
// "Leader/follower"): the frames of the shard's current worker, read by the loop thread or by a
// leader (a caller waiting for its result that holds the shard's read token); each Results frame
// checked against the shard's slot table (an id it was not sent, a second answer, a NeedSource
// beyond what the slot allows: a violation), its slots released under the shard's mutex, its
// results decoded and delivered: futures and waiters now, callbacks to the shard's dispatcher (or
// on the loop, with callbacks_on_loop). What the loop must do about a read -- the stream ended, a
// violation -- it returns to its caller (the host's worker events), which does it: a reader never
// kills and never handles a death.
//
// One per host. Its dependencies are fixed at construction: the loop's role, the log, how results
// are delivered (HostOptions), the slow lane (a result may move its script), where start-up waits
// for hellos, and the router, Host::Impl, for one call: re-sends and promoted evaluations are
// placed like submissions (Host::Impl::place_promoted).
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cassert>
#include <functional>
#include <string>
#include <vector>

#include "completion.h"
#include "log.h"
#include "outrun/host.h"
#include "outrun/protocol/messages.h"
#include "outrun/thread_annotations.h"
#include "shard.h"
#include "slow_lane.h"

namespace outrun::detail {

// Start-up waits here for every shard's hello, or the first failure (Host::Impl::start); the
// reader counts hellos, the supervisor reports a worker that died before its hello.
struct StartReport {
  Mutex mu;
  CondVar cv;  // hellos or error changed
  int hellos GUARDED_BY(mu) = 0;
  std::string error GUARDED_BY(mu);
};

// How results are delivered (HostOptions: callbacks_on_loop, fulfill_futures_on_loop,
// after_loop_callbacks; D-inline, D-cork).
struct DeliveryOptions {
  bool callbacks_on_loop = false;
  bool fulfill_futures_on_loop = false;
  std::function<void()> after_loop_callbacks;
};

class ShardReader {
 public:
  ShardReader(const ThreadRole& loop, const Log& log, DeliveryOptions delivery, SlowLane& lane,
              StartReport& start, Host::Impl& router)
      : loop_role_(loop),
        log_(log),
        delivery_(std::move(delivery)),
        lane_(lane),
        start_(start),
        router_(router) {}
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  // What the loop's read left it to do: nothing, the stream's end (`ended`: what the worker wrote
  // before is drained with its death), or a violation (the worker is killed for it).
  struct LoopRead {
    bool ended = false;
    std::string violation;
  };

  // ---- The loop thread (REQUIRES(sh.loop_role): the host's role, which is this reader's).

  // The loop's read of `w`'s result socket when it is readable or a leader handed it over: takes
  // the read token and reads, or stops polling while a leader holds it. Gives the token up again
  // (to a waiting caller, else to nobody; `w` stops being the source when it ended or broke).
  LoopRead loop_read(Shard& sh, WorkerProcess* w) REQUIRES(sh.loop_role);
  // Hand-offs and resume requests of leaders (on the loop's wake-up): reads what a leader handed
  // over, or polls again.
  LoopRead attend(Shard& sh) REQUIRES(sh.loop_role);
  // A dead worker's last words: what a leader put back, then whatever is still in its socket.
  void drain(Shard& sh, WorkerProcess* w) REQUIRES(sh.loop_role, sh.reading.token);
  // Delivers evaluations the loop ended (a death, a crash loop, shutdown).
  void deliver_all(Shard& sh, Ended& ended) REQUIRES(sh.loop_role);

  // ---- A caller waiting for its result (`me`), handed `sh`'s token by ReadToken::wait_to_lead:
  // reads `w` (null: nothing to read) until its result is in or it must stop, then gives the
  // token up (ReadToken::leader_release). True: the loop must be woken (a hand-off, or it must
  // poll again).
  bool lead(Shard& sh, WorkerProcess* w, SyncWaiter& me) RELEASE(sh.reading.token);

  // ---- The loop or a leader, holding the token.

  // The items of a Results frame (null: none): each must be an evaluation `sh` sent and has not
  // had an answer for; else `*violation` is set and the rest of the frame is not handled.
  // Delivers what ended: futures and waiters now, callbacks into `to_dispatch` (the caller posts
  // them to the shard's dispatcher).
  void handle_results(Shard& sh,
                      const flatbuffers::Vector<flatbuffers::Offset<wire::Result>>* items,
                      std::string* violation, std::vector<Delivery>* to_dispatch)
      REQUIRES(sh.reading.token);
  // Where a reader delivers one result: futures and waiters now, callbacks into `to_dispatch`
  // (posted to the shard's dispatcher by the reader), or on the loop (callbacks_on_loop).
  void deliver_read(Completion&& done, Result&& r, std::vector<Delivery>* to_dispatch);

 private:
  void release(Shard& sh, WorkerProcess* w, bool poison) REQUIRES(sh.loop_role)
      RELEASE(sh.reading.token);
  void process_frames(Shard& sh, WorkerProcess* w, std::string* violation)
      REQUIRES(sh.loop_role, sh.reading.token);
  // A leader's reads and frames (Results only: any other frame is put back for the loop).
  Handoff read_as_leader(Shard& sh, WorkerProcess* w, SyncWaiter& me) REQUIRES(sh.reading.token);
  void lead_frames(Shard& sh, WorkerProcess* w, Handoff* h, std::vector<Delivery>* to_dispatch)
      REQUIRES(sh.reading.token);
  // The loop's role is `sh`'s (the same object; checked in debug builds).
  void mine([[maybe_unused]] const Shard& sh) const REQUIRES(sh.loop_role)
      ASSERT_CAPABILITY(loop_role_) {
    assert(&sh.loop_role == &loop_role_);
  }
  // A callback ran on the loop since the last end_loop_callbacks(), which then runs
  // after_loop_callbacks (once per run of callbacks, D-cork).
  void end_loop_callbacks() REQUIRES(loop_role_) {
    if (!loop_callbacks_ran_) return;
    loop_callbacks_ran_ = false;
    if (delivery_.after_loop_callbacks) delivery_.after_loop_callbacks();
  }

  const ThreadRole& loop_role_;
  const Log& log_;
  const DeliveryOptions delivery_;
  SlowLane& lane_;
  StartReport& start_;
  Host::Impl& router_;

  bool loop_callbacks_ran_ GUARDED_BY(loop_role_) = false;
  // The loop's scratch: the callbacks of one read or one death, posted to the shard's dispatcher
  // before the loop does anything else (a leader has its own, thread_local).
  std::vector<Delivery> to_dispatch_ GUARDED_BY(loop_role_);
};

}  // namespace outrun::detail

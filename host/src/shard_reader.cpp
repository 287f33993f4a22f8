// Reading a shard's results, by the loop thread or a leader (shard_reader.h).
//
// A leader (a caller in evaluate_sync, or waiting on a future) polls the socket and the token's
// kick eventfd and handles Results frames exactly as the loop does (slots released under the
// shard's mutex, futures and waiters fulfilled, callbacks posted to the dispatcher: no caller
// code runs there) until its own result is in, then hands the token on. Everything else (a
// hello, an end of stream, a read error, a protocol violation) is left to the loop, which also
// keeps every timer, every kill and every death.
#include "shard_reader.h"

#ifndef _WIN32
#include <poll.h>
#endif

#include <cerrno>

#include "host_impl.h"
#include "thread_scratch.h"

namespace outrun::detail {

ShardReader::LoopRead ShardReader::loop_read(Shard& sh, WorkerProcess* w) {
  mine(sh);
  LoopRead out;
  // What a leader left: a frame put back or an end of stream (`read`), a violation it found.
  Handoff left;
  bool pause = false;
  if (!sh.reading.loop_acquire(&pause, &left)) {
    // A leader reads: stop polling a level-triggered fd it reads, until the token is given up
    // with evaluations still in flight.
    if (pause) w->pause_reading();
    return out;
  }
  out.violation = std::move(left.violation);
  if (out.violation.empty() && left.read) process_frames(sh, w, &out.violation);
  if (out.violation.empty()) {
    const long n = w->read_results();
    if (n > 0) {
      sh.reads.fetch_add(1, std::memory_order_relaxed);
      process_frames(sh, w, &out.violation);
    } else if (n != -EAGAIN) {
      out.ended = true;  // EOF or ECONNRESET: what it wrote before is drained with its death
    }
  }
  release(sh, w, out.ended || !out.violation.empty());
  return out;
}

void ShardReader::release(Shard& sh, WorkerProcess* w, bool poison) {
  MutexLock lock(sh.mu);  // in_use() and the release together (ReadToken: lock order)
  if (sh.reading.loop_release(w, poison, sh.table.in_use() > 0)) w->resume_reading();
}

ShardReader::LoopRead ShardReader::attend(Shard& sh) {
  WorkerProcess* w = sh.worker;
  if (!w ||
      (w->life() != WorkerProcess::Life::kStarting && w->life() != WorkerProcess::Life::kServing))
    return {};
  switch (sh.reading.loop_attend()) {
    case ReadToken::Attend::kRead:
      return loop_read(sh, w);  // its release polls again if evaluations are in flight
    case ReadToken::Attend::kPoll:
      w->resume_reading();
      return {};
    case ReadToken::Attend::kNothing:
      return {};
  }
  return {};
}

// Handles every complete frame in the worker's reader; stops at the first violation.
void ShardReader::process_frames(Shard& sh, WorkerProcess* w, std::string* violation) {
  mine(sh);
  protocol::FrameView fv;
  while (violation->empty() && w->reader().next(fv)) {
    sh.frames.fetch_add(1, std::memory_order_relaxed);
    protocol::WorkerMessage m;
    if (!protocol::decode_worker_frame(fv.frame, &m, violation)) break;
    switch (fv.frame->body_type()) {
      case wire::Body::Hello: {
        if (w->greeted()) {
          *violation = "sent a second hello";
        } else {
          w->greet();
          MutexLock lock(start_.mu);
          ++start_.hellos;
          start_.cv.notify_all();
        }
        break;
      }
      case wire::Body::Results:
        if (!w->greeted())
          *violation = "sent results before its hello";
        else
          handle_results(sh, std::get<protocol::ResultsMsg>(m).items, violation, &to_dispatch_);
        break;
      default:
        break;  // decode_worker_frame took it for a violation
    }
  }
  if (violation->empty() && w->reader().error() != protocol::FrameError::kNone)
    *violation = protocol::to_string(w->reader().error());
  if (!to_dispatch_.empty()) sh.dispatcher->post(to_dispatch_);
  end_loop_callbacks();
}

void ShardReader::handle_results(
    Shard& sh, const flatbuffers::Vector<flatbuffers::Offset<wire::Result>>* items,
    std::string* violation, std::vector<Delivery>* to_dispatch) {
  if (!items) return;
  // Check and release the slots under the lock; decode and deliver after it.
  // Per reading thread (the loop, a leader): no allocation per frame.
  using Done = std::vector<std::pair<Completion, protocol::ResultView>>;
  OUTRUN_THREAD_SCRATCH(Done, done);
  OUTRUN_THREAD_SCRATCH(Ended, ended);
  done.clear();
  std::vector<uint32_t> resend, promoted;
  {
    MutexLock lock(sh.mu);
    for (const wire::Result* item : *items) {
      const uint64_t id = item->id();
      const uint32_t idx = static_cast<uint32_t>(id);
      const Slot* found = sh.table.sent(id);
      if (!found) {
        *violation = "answered an evaluation it was not running (id " + std::to_string(id) + ")";
        break;
      }
      const Slot& slot = *found;
      protocol::ResultView r;
      if (!protocol::decode_worker_result(item, &r, violation)) break;
      if (r.status == wire::Status::NeedSource) {
        // The worker does not hold the script (dropped for its budget, or never sent), or the
        // bytecode it was sent did not load: the script follows (as bytecode when the host has
        // it and it did not fail), as often as the slot's SourceState allows.
        if (!sh.table.need_source(idx)) {
          *violation = "asked twice for the source of evaluation " + std::to_string(id);
          break;
        }
        const uint32_t sid = record_of(slot.script)->id;
        if (sid < sh.known.size()) sh.known[sid] = 0;
        resend.push_back(idx);
        continue;
      }
      // The slow lane (D-slow-lane): a timeout moves the script there; in the lane, one that
      // behaved counts towards its way back. One compare of a status already decoded elsewhere.
      if (r.status == wire::Status::Timeout) [[unlikely]]
        lane_.misbehaved(*record_of(slot.script));
      else if (sh.index == lane_.index()) [[unlikely]]
        lane_.behaved(*record_of(slot.script));
      // Release the slot (and the key's flight) now: a caller that awaited this result and
      // submits again must never be refused by its own finished evaluation.
      done.emplace_back(sh.table.release(idx, &promoted), r);
    }
    if (violation->empty()) {
      // Re-sends go where promotions go: to the worker if the shard runs, else they wait for
      // the next one (restart_shard window, a dying worker being drained).
      promoted.insert(promoted.begin(), resend.begin(), resend.end());
      router_.place_promoted(sh, promoted, &ended);
    } else {
      for (uint32_t idx : resend) sh.table.keep_with_worker(idx);  // settled with its death
      for (uint32_t idx : promoted) sh.table.park(idx);            // run after the restart
    }
  }
  // What this frame's values and messages may decode to, a shared part counted per use
  // (D-result-budget). Once it is spent, the frame's other results end worker_lost and the
  // worker is killed for the violation.
  std::size_t budget = kMaxResultsDecodeBytes;
  const auto lost = [&](Result& res, bool spent) {
    res.value = Value{};
    res.status = Status::worker_lost;
    res.error = spent ? "its worker sent results past the decode budget (more than " +
                            std::to_string(kMaxResultsDecodeBytes) + " bytes in one frame)"
                      : "its worker sent an invalid value";
    if (violation->empty())
      *violation = spent ? "sent results past the decode budget" : "sent an invalid value";
  };
  for (auto& [completion, r] : done) {
    Result res;
    res.status = static_cast<Status>(r.status);
    res.shard = sh.index;
    const ResultDecode d =
        decode_result(res.status == Status::ok, r.value, r.error, &res.value, &res.error, &budget);
    if (d != ResultDecode::ok) lost(res, d == ResultDecode::spent);
    if (r.logs || r.logs_dropped) [[unlikely]] {  // the script printed or logged
      res.logs_dropped = r.logs_dropped;
      decode_logs(r.logs, &res.logs, &res.logs_dropped, &budget);
    }
    deliver_read(std::move(completion), std::move(res), to_dispatch);
  }
  done.clear();
  for (auto& [c, r] : ended) deliver_read(std::move(c), std::move(r), to_dispatch);
  ended.clear();
}

void ShardReader::drain(Shard& sh, WorkerProcess* w) {
  std::string violation;
  // What a leader put back comes first.
  process_frames(sh, w, &violation);
  // Bounded only as a guard: a killed or exited process cannot keep writing.
  for (int i = 0; i < 100000 && violation.empty(); ++i) {
    if (w->read_results() <= 0) break;
    sh.reads.fetch_add(1, std::memory_order_relaxed);
    process_frames(sh, w, &violation);
  }
}

void ShardReader::deliver_read(Completion&& done, Result&& r, std::vector<Delivery>* to_dispatch) {
  // Waiters and futures (no caller code) and, when the application promised they never block
  // and this is the loop thread, callbacks are delivered here: no dispatcher hop. A leader never
  // runs a callback, and fulfils futures itself whatever fulfill_futures_on_loop says (that
  // option is the loop's).
  if (done.wakes_waiter()) {
    done.deliver(std::move(r), log_);
  } else if (done.runs_caller_code()) {
    if (delivery_.callbacks_on_loop && loop_role_.here()) {
      loop_role_.assert_here();  // for the analysis: the condition checked it
      loop_callbacks_ran_ = true;
      done.deliver(std::move(r), log_);
    } else {
      to_dispatch->push_back(Delivery{std::move(done), std::move(r)});
    }
  } else if (delivery_.fulfill_futures_on_loop || !loop_role_.here()) {
    done.deliver(std::move(r), log_);
  } else {
    to_dispatch->push_back(Delivery{std::move(done), std::move(r)});
  }
}

void ShardReader::deliver_all(Shard& sh, Ended& ended) {
  mine(sh);
  for (auto& [c, r] : ended) deliver_read(std::move(c), std::move(r), &to_dispatch_);
  ended.clear();
  if (!to_dispatch_.empty()) sh.dispatcher->post(to_dispatch_);
  end_loop_callbacks();
}

bool ShardReader::lead(Shard& sh, WorkerProcess* w, SyncWaiter& me) {
  Handoff h;
  if (w) h = read_as_leader(sh, w, me);
  // Shard::mu for in_use(): it and loop_paused are read together, under both mutexes, so an
  // evaluation sent while the loop does not poll is either counted here or sees loop_paused
  // (Host::Impl::submit) and asks for the resume itself.
  MutexLock lock(sh.mu);
  return sh.reading.leader_release(me, std::move(h), sh.table.in_use() > 0);
}

Handoff ShardReader::read_as_leader(Shard& sh, WorkerProcess* w, SyncWaiter& me) {
  Handoff h;
#ifdef _WIN32
  // Never reached: on Windows the loop alone reads (ReadToken::attach, design/windows.md).
  (void)sh, (void)w, (void)me;
  h.read = true;
#else
  thread_local std::vector<Delivery> to_dispatch;
  pollfd fds[2] = {{w->result_channel(), POLLIN, 0}, {sh.reading.kick_fd(), POLLIN, 0}};
  for (;;) {
    if (sh.reading.leader_must_stop(me, w)) break;
    const long n = w->read_results();
    if (n == -EAGAIN) {
      fds[0].revents = fds[1].revents = 0;
      if (poll(fds, 2, -1) > 0 && (fds[1].revents & POLLIN)) sh.reading.clear_kick();
      continue;
    }
    if (n <= 0) {  // end of stream or an error: the loop's to handle (it reads again)
      h.read = true;
      break;
    }
    sh.reads.fetch_add(1, std::memory_order_relaxed);
    lead_frames(sh, w, &h, &to_dispatch);
    if (h.read || !h.violation.empty()) break;
  }
#endif
  return h;
}

// Like process_frames, for Results frames only: any other frame is put back for the loop.
void ShardReader::lead_frames(Shard& sh, WorkerProcess* w, Handoff* h,
                              std::vector<Delivery>* to_dispatch) {
  protocol::FrameView fv;
  while (w->reader().next(fv)) {
    // greeted(): written by the loop only while it holds the token.
    if (fv.frame->body_type() != wire::Body::Results || !w->greeted()) {
      w->reader().put_back();
      h->read = true;
      break;
    }
    sh.frames.fetch_add(1, std::memory_order_relaxed);
    protocol::WorkerMessage m;
    if (!protocol::decode_worker_frame(fv.frame, &m, &h->violation)) break;
    handle_results(sh, std::get<protocol::ResultsMsg>(m).items, &h->violation, to_dispatch);
    if (!h->violation.empty()) break;
  }
  // A broken stream: the loop reads its error from the reader and kills the worker.
  if (!h->read && h->violation.empty() && w->reader().error() != protocol::FrameError::kNone)
    h->read = true;
  if (!to_dispatch->empty()) sh.dispatcher->post(*to_dispatch);  // per read, never batched up
}

}  // namespace outrun::detail

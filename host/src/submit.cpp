// Submission (caller threads) and the slot bookkeeping shared with the loop thread.
#include <cassert>

#include "host_impl.h"
#include "outrun/protocol/messages.h"

namespace outrun {

using detail::Completion;
using detail::Delivery;
using detail::Shard;
using detail::ShardState;
using detail::Slot;
using detail::SlotPlace;
using protocol::FrameWriter;

namespace {

// An evaluation was just sent, and the loop may not be polling the shard's result socket (it
// stopped while a leader held the token: loop_paused). A leader that holds the token now reads it,
// or sees it in flight when it gives the token up and has the loop poll again (leader_release);
// with nobody holding it, the loop must be asked now (design/threading.md "Leader/follower").
bool must_resume(Shard& sh) REQUIRES(sh.mu) {
  return sh.reading.submitter_must_resume();
}

std::string busy_message(const detail::ScriptRecord* r) {
  return "an evaluation of '" + r->chunk_name + "' is already in flight (single flight: refuse)";
}

std::string unregistered_message(const detail::ScriptRecord* r) {
  return "script '" + r->chunk_name + "' was unregistered";
}

}  // namespace

flatbuffers::Offset<wire::Evaluation> Host::Impl::build_evaluation(
    flatbuffers::FlatBufferBuilder& f, Shard& sh, uint32_t idx, detail::InputsOffset inputs,
    detail::InputBufferOffset buffer) {
  const Slot& slot = sh.table[idx];
  const detail::ScriptRecord* r = detail::record_of(slot.script);
  if (r->id >= sh.known.size())
    sh.known.resize(std::max<std::size_t>(r->id + 1, sh.known.size() * 2), 0);
  protocol::ScriptSource source;
  const bool with_source = !sh.known[r->id];
  if (with_source) {
    sh.known[r->id] = 1;
    source = {r->sha256, r->source, r->chunk_name, {}};
    // The compile-only process's bytecode instead, unless the worker could not load it.
    if (const detail::CompiledChunk* c = r->compiled.load(std::memory_order_acquire);
        c && slot.may_send_bytecode()) {
      source.bytecode = {reinterpret_cast<const uint8_t*>(c->bytes.data()), c->bytes.size()};
    }
  }
  sh.table.mark_sent(idx, !with_source              ? detail::SentWith::kId
                          : source.bytecode.empty() ? detail::SentWith::kSource
                                                    : detail::SentWith::kBytecode);
  return protocol::build_evaluation(f, detail::SlotTable::id_of(slot, idx), r->id, timeout_us,
                                    inputs, with_source ? &source : nullptr, buffer);
}

std::span<const uint8_t> Host::Impl::finish_evaluate(
    flatbuffers::FlatBufferBuilder& f, const flatbuffers::Offset<wire::Evaluation>* items,
    std::size_t n) {
  return protocol::finish_evaluate(f, {items, n});
}

void Host::Impl::deliver_now(Shard& sh, Completion&& done, Result&& r) {
  if (done.runs_caller_code())
    sh.dispatcher->post(Delivery{std::move(done), std::move(r)});
  else
    done.deliver(std::move(r), log);
}

bool Host::Impl::admissible(const detail::ScriptRecord* r, Shard* to, Shard** sh, Result* refusal) {
  if (!r || r->owner != this) {
    *sh = shards[0].get();
    *refusal = Result{Status::invalid_argument, {}, "script handle is not from this host", -1};
    return false;
  }
  *sh = to ? to : &route(*r);
  if (r->unregistered.load(std::memory_order_relaxed)) [[unlikely]] {
    *refusal = Result{Status::invalid_argument, {}, unregistered_message(r), (*sh)->index};
    return false;
  }
  if (in_quarantine(*r)) [[unlikely]] {
    (*sh)->quarantine_refusals.fetch_add(1, std::memory_order_relaxed);
    *refusal = Result{Status::runtime_error, {}, detail::Quarantine::message(*r), (*sh)->index};
    return false;
  }
  return true;
}

void Host::Impl::submit(const Script& script, Inputs&& inputs, Completion&& done,
                        EncodedInputs&& encoded, Shard* to) {
  const detail::ScriptRecord* r = detail::record_of(script);
  Shard* routed = nullptr;
  if (Result refused; !admissible(r, to, &routed, &refused)) [[unlikely]] {
    deliver_now(*routed, std::move(done), std::move(refused));
    return;
  }
  Shard& sh = *routed;
  if (stopping.load(std::memory_order_relaxed)) {
    deliver_now(sh, std::move(done),
                Result{Status::cancelled, {}, "the host is shutting down", sh.index});
    return;
  }
  auto& f = thread_builder();
  f.Clear();
  detail::InputsOffset in;
  detail::InputBufferOffset buffer;
  std::string err;
  if (!encoded.empty()) {
    buffer = protocol::add_input_list(f, detail::bytes_of(encoded));
  } else if (!detail::encode_inputs(f, inputs, &in, &err)) {
    deliver_now(sh, std::move(done),
                Result{Status::invalid_argument, {}, std::move(err), sh.index});
    return;
  }
  std::shared_ptr<FrameWriter> writer;
  Result refusal;       // status ok: accepted
  Completion replaced;  // coalesce-latest: the waiting one this one replaces
  const bool waiter = done.wakes_waiter();
  detail::HostFuture* const future = done.host_future();
  bool resume = false;  // the loop stopped reading for a leader: it must read this one
  {
    MutexLock lock(sh.mu);
    const bool single = opts.single_flight != SingleFlight::off;
    if (sh.state == ShardState::kStopping || sh.state == ShardState::kStopped) {
      refusal = {Status::cancelled, {}, "the host is shutting down", sh.index};
    } else if (sh.state == ShardState::kCrashLoop) {
      refusal = {Status::unavailable, {}, sh.unavailable_reason, sh.index};
    } else if (single && sh.table.in_flight(r->key_id)) {
      // The one in flight may be a future left to its caller (HostFuture::owes_resume): have
      // its result read now, or this key would stay busy until that caller waits.
      if (opts.single_flight == SingleFlight::refuse) {
        refusal = {Status::busy, {}, busy_message(r), sh.index};
        resume = must_resume(sh);
      } else {  // coalesce-latest: wait behind the one in flight, replacing any that waits
        sh.table.admit_pending(script, std::move(inputs), std::move(done), &replaced,
                               std::move(encoded));
        resume = !waiter && must_resume(sh);
      }
    } else if (sh.index == lane && slow.refuse(sh.table.in_use())) [[unlikely]] {
      refusal = {Status::busy, {}, slow.full_message(), sh.index};
    } else if (sh.state == ShardState::kDown &&
               sh.table.waiting_count() >= opts.max_queued_while_down) {
      refusal = {Status::unavailable,
                 {},
                 "shard " + std::to_string(sh.index) + " is restarting and its queue is full",
                 sh.index};
    } else if (sh.state == ShardState::kRunning) {
      const uint32_t idx = sh.table.admit(script, std::move(inputs), std::move(done),
                                          SlotPlace::kSending, single, std::move(encoded));
      auto ev = build_evaluation(f, sh, idx, in, buffer);
      if (sh.writer->enqueue(finish_evaluate(f, &ev, 1))) writer = sh.writer;
      // A caller in evaluate_sync reads its own result or is handed it. Anything else sent while
      // the loop does not poll would go unread unless the loop polls again (design/threading.md
      // "Leader/follower": loop_paused is written under the token's mutex, read here under
      // Shard::mu; a leader giving the token up reads both under both).
      // A future that is the shard's only evaluation is left to its caller, who is likely to
      // wait on it now (HostFuture::owes_resume).
      if (future && sh.table.in_use() == 1 && sh.reading.submitter_would_resume()) {
        future->owes_resume.store(true, std::memory_order_relaxed);
        sh.futures_left_to_caller.fetch_add(1, std::memory_order_relaxed);
      } else
        resume = !waiter && must_resume(sh);
    } else {
      sh.table.admit(script, std::move(inputs), std::move(done), SlotPlace::kQueued, single,
                     std::move(encoded));
    }
  }
  if (refusal.status != Status::ok) {
    if (resume) wake();
    deliver_now(sh, std::move(done), std::move(refusal));
    return;
  }
  sh.evaluations.fetch_add(1, std::memory_order_relaxed);
  if (writer) writer->write_pending();
  if (resume) wake();
  if (!replaced.empty())
    deliver_now(
        sh, std::move(replaced),
        Result{Status::busy,
               {},
               "replaced by a newer evaluation of '" + r->chunk_name + "' (coalesce-latest)",
               sh.index});
}

void Host::Impl::resume_if_paused(Shard& sh) {
  bool resume;
  {
    MutexLock lock(sh.mu);
    resume = sh.table.in_use() > 0 && must_resume(sh);
  }
  if (resume) wake();
}

void Host::Impl::submit_batch(std::vector<Request>&& requests, BatchCallback&& cb) {
  auto shared_cb = std::make_shared<BatchCallback>(std::move(cb));
  // Group by shard, keeping each shard's requests in order. Requests that cannot be sent now
  // (single flight, shard down or stopping) go through submit() one by one.
  std::vector<std::vector<std::size_t>> by_shard(shards.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    Shard* sh = nullptr;
    if (Result refused; !admissible(detail::record_of(requests[i].script), nullptr, &sh, &refused))
        [[unlikely]] {
      deliver_now(*sh, Completion(detail::BatchTarget{shared_cb, i}), std::move(refused));
      continue;
    }
    by_shard[static_cast<std::size_t>(sh->index)].push_back(i);
  }
  auto& f = thread_builder();
  std::vector<detail::InputsOffset> inputs;
  std::vector<detail::InputBufferOffset> buffers;  // encoded inputs, copied as they are
  std::vector<std::size_t> chunk;
  std::vector<std::size_t> one_by_one;
  std::vector<flatbuffers::Offset<wire::Evaluation>> evs;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    Shard& sh = *shards[s];
    const auto& list = by_shard[s];
    std::size_t pos = 0;
    while (pos < list.size()) {
      // Encode inputs outside the lock, up to one frame's worth.
      f.Clear();
      inputs.clear();
      buffers.clear();
      chunk.clear();
      for (; pos < list.size() && chunk.size() < kFrameCutItems && f.GetSize() < kFrameCutBytes;
           ++pos) {
        const std::size_t i = list[pos];
        if (const EncodedInputs& enc = requests[i].encoded; !enc.empty()) {
          inputs.push_back(0);
          buffers.push_back(protocol::add_input_list(f, detail::bytes_of(enc)));
          chunk.push_back(i);
          continue;
        }
        detail::InputsOffset in;
        std::string err;
        if (!detail::encode_inputs(f, requests[i].inputs, &in, &err)) {
          deliver_now(sh, Completion(detail::BatchTarget{shared_cb, i}),
                      Result{Status::invalid_argument, {}, std::move(err), sh.index});
          continue;
        }
        inputs.push_back(in);
        buffers.push_back(0);
        chunk.push_back(i);
      }
      if (chunk.empty()) continue;
      std::shared_ptr<FrameWriter> writer;
      std::size_t accepted = 0;
      bool resume = false;
      {
        MutexLock lock(sh.mu);
        evs.clear();
        const bool single = opts.single_flight != SingleFlight::off;
        // The slow lane's bound is submit()'s to check.
        const bool direct = sh.state == ShardState::kRunning &&
                            !stopping.load(std::memory_order_relaxed) && sh.index != lane;
        bool full = false;  // sources filled the frame: the rest go one by one, in order
        for (std::size_t k = 0; k < chunk.size(); ++k) {
          Request& req = requests[chunk[k]];
          // The chunk was cut on its inputs; the sources and bytecode build_evaluation adds for
          // scripts the worker lacks (up to 1 MiB each) are not in that count, and a frame over
          // kMaxFrameSize would end the worker (and re-send everything it had).
          full = full || f.GetSize() > kMaxBatchFrameBytes;
          if (!direct || full ||
              (single && sh.table.in_flight(detail::record_of(req.script)->key_id))) {
            one_by_one.push_back(chunk[k]);
            continue;
          }
          const uint32_t idx = sh.table.admit(std::move(req.script), std::move(req.inputs),
                                              Completion(detail::BatchTarget{shared_cb, chunk[k]}),
                                              SlotPlace::kSending, single, std::move(req.encoded));
          evs.push_back(build_evaluation(f, sh, idx, inputs[k], buffers[k]));
          ++accepted;
        }
        if (!evs.empty() && sh.writer->enqueue(finish_evaluate(f, evs.data(), evs.size())))
          writer = sh.writer;
        resume = !evs.empty() && must_resume(sh);  // as in submit()
      }
      sh.evaluations.fetch_add(accepted, std::memory_order_relaxed);
      if (writer) writer->write_pending();
      if (resume) wake();
      for (std::size_t i : one_by_one) {  // single flight, a shard not running, a full frame
        Request& req = requests[i];
        submit(req.script, std::move(req.inputs), Completion(detail::BatchTarget{shared_cb, i}),
               std::move(req.encoded));
      }
      one_by_one.clear();
    }
  }
}

// Sends (or parks) evaluations that just took their key's flight. sh.mu held; the loop thread
// or a leader.
void Host::Impl::place_promoted(Shard& sh, std::vector<uint32_t>& promoted, Ended* out) {
  while (!promoted.empty()) {
    std::vector<uint32_t> batch;
    batch.swap(promoted);
    // One was charged with the crash just handled.
    detail::Quarantine::end_quarantined(sh.table, sh.index, sh.quarantine_refusals, &batch, out,
                                        &promoted);
    switch (sh.state) {
      case ShardState::kRunning:
        send_slots(sh, batch);
        break;
      case ShardState::kDown:
        for (uint32_t idx : batch) sh.table.park(idx);
        break;
      default: {
        const bool stop = sh.state != ShardState::kCrashLoop;
        for (uint32_t idx : batch)
          sh.table.end(idx,
                       Result{stop ? Status::cancelled : Status::unavailable,
                              {},
                              stop ? "the host shut down before it ran" : sh.unavailable_reason,
                              sh.index},
                       out, &promoted);
      }
    }
  }
}

// Encodes the slots `idxs` (used, not sent) for the current worker and writes them at once.
// sh.mu held (the loop thread, or a leader): this path is rare (restarts, retries, NeedSource,
// coalescing).
void Host::Impl::send_slots(Shard& sh, const std::vector<uint32_t>& idxs) {
  auto& f = thread_builder();
  std::vector<flatbuffers::Offset<wire::Evaluation>> evs;
  std::size_t k = 0;
  while (k < idxs.size()) {
    f.Clear();
    evs.clear();
    for (; k < idxs.size() && evs.size() < kFrameCutItems && f.GetSize() < kFrameCutBytes; ++k) {
      const Slot& slot = sh.table[idxs[k]];
      detail::InputsOffset in;
      detail::InputBufferOffset buffer;
      if (!slot.encoded.empty()) {
        buffer = protocol::add_input_list(f, detail::bytes_of(slot.encoded));
      } else {
        std::string err;
        detail::encode_inputs(f, slot.inputs, &in, &err);  // validated at submission
      }
      evs.push_back(build_evaluation(f, sh, idxs[k], in, buffer));  // marks it sent
    }
    // Nobody else is writing when this returns true: write now so the builder can be reused.
    if (sh.writer->enqueue(finish_evaluate(f, evs.data(), evs.size()))) sh.writer->write_pending();
  }
}

}  // namespace outrun

// outrun::Host. Threads and what they own (design/threading.md):
//  - caller threads: submit; encode under the shard's mutex; write frames themselves
//    (FrameWriter), never block on a full pipe.
//  - the loop thread (libuv): worker processes, their sockets (reads, writes handed off),
//    restart timers, child exits. Completes evaluations: releases the slot, then fulfils futures
//    or hands callbacks to the shard's dispatcher.
//  - one dispatcher thread per shard: runs callbacks.
#include "outrun/host.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cassert>
#include <climits>
#include <condition_variable>
#include <filesystem>
#include <thread>

#include <flatbuffers/flatbuffers.h>
#include <spdlog/spdlog.h>

#include "completion.h"
#include "script_registry.h"
#include "shard.h"
#include "wire_codec.h"

#ifndef OUTRUN_INSTALLED_WORKER
#define OUTRUN_INSTALLED_WORKER "/usr/local/libexec/outrun/outrun-worker"
#endif

namespace outrun {

using detail::Completion;
using detail::Delivery;
using detail::Shard;
using detail::ShardState;
using detail::Slot;
using detail::WorkerProcess;
using protocol::FrameWriter;

static_assert(static_cast<int>(Status::invalid_argument) == static_cast<int>(wire::Status::InvalidArgument));
static_assert(static_cast<int>(Status::ok) == static_cast<int>(wire::Status::Ok));
static_assert(static_cast<int>(Status::killed) == static_cast<int>(wire::Status::Killed));

namespace {

// Frames of evaluations are cut at this size so a large batch never nears kMaxFrameSize.
constexpr std::size_t kFrameCutBytes = 1u << 20;
constexpr std::size_t kFrameCutItems = 4096;
// Backoff of restarts after quick deaths: restart_delay * 2^n, at most this.
constexpr auto kMaxRestartDelay = std::chrono::milliseconds(5000);
// After a worker's stream ends, how long we wait for its exit status before killing it (a
// worker that closes its pipe but keeps running).
constexpr uint64_t kLingerMs = 1000;
// A worker that lived this long resets the backoff.
constexpr auto kHealthyUptime = std::chrono::milliseconds(1000);

flatbuffers::FlatBufferBuilder& producer_builder() {
  thread_local flatbuffers::FlatBufferBuilder fbb(4096);
  return fbb;
}

std::string find_worker(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (const char* env = std::getenv("OUTRUN_WORKER"); env && *env) return env;
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto next_to = self.parent_path() / "outrun-worker";
    if (access(next_to.c_str(), X_OK) == 0) return next_to.string();
  }
  return OUTRUN_INSTALLED_WORKER;
}

std::string describe_exit(int64_t status, int signal) {
  if (signal != 0) return "was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  switch (status) {
    case 0: return "exited";
    case 74: return "exited: its pipe to the host failed (code 74)";
    case 76: return "exited: the host sent a frame it could not verify (code 76)";
    case 77: return "exited: the host was gone at start (code 77)";
    default: return "exited with code " + std::to_string(status);
  }
}

}  // namespace

struct Host::Impl {
  explicit Impl(const HostOptions& o) : opts(o), registry(this, static_cast<uint32_t>(o.shards)) {}

  HostOptions opts;
  detail::ScriptRegistry registry;
  std::string worker_path;
  uint64_t timeout_us = 0;

  uv_loop_t loop{};
  uv_async_t wakeup{};
  uv_timer_t shutdown_timer{};
  std::thread loop_thread;
  std::thread::id loop_thread_id;
  std::vector<std::unique_ptr<Shard>> shards;
  flatbuffers::FlatBufferBuilder loop_fbb{4096};  // loop thread only

  std::atomic<bool> stopping{false};
  bool shutdown_started = false;  // loop thread only
  int live_workers = 0;           // loop thread only: WorkerProcess objects not yet freed

  // Start-up: the loop thread reports hellos and early deaths here.
  std::mutex start_mu;  // guards hellos, start_error
  std::condition_variable start_cv;
  int hellos = 0;
  std::string start_error;

  bool on_loop_thread() const { return std::this_thread::get_id() == loop_thread_id; }

  // ---- submission (any thread) ------------------------------------------------------------

  uint32_t alloc_slot(Shard& sh) {  // sh.mu held
    uint32_t idx;
    if (!sh.free_slots.empty()) {
      idx = sh.free_slots.back();
      sh.free_slots.pop_back();
    } else {
      idx = static_cast<uint32_t>(sh.slots.size());
      sh.slots.emplace_back();
    }
    Slot& s = sh.slots[idx];
    s.used = true;
    s.sent = false;
    ++sh.in_flight;
    return idx;
  }

  void free_slot(Shard& sh, uint32_t idx) {  // sh.mu held
    Slot& s = sh.slots[idx];
    s.used = false;
    s.sent = false;
    ++s.generation;
    s.script = Script();
    s.inputs.clear();
    sh.free_slots.push_back(idx);
    --sh.in_flight;
  }

  // Builds one Evaluation into `f`. Sends the source when the current worker lacks it.
  flatbuffers::Offset<wire::Evaluation> build_evaluation(flatbuffers::FlatBufferBuilder& f, Shard& sh, uint32_t idx,
                                                         detail::InputsOffset inputs) {  // sh.mu held
    const Slot& slot = sh.slots[idx];
    const detail::ScriptRecord* r = slot.script.record();
    if (r->id >= sh.known.size()) sh.known.resize(std::max<std::size_t>(r->id + 1, sh.known.size() * 2), 0);
    flatbuffers::Offset<flatbuffers::Vector<uint8_t>> sha;
    flatbuffers::Offset<flatbuffers::String> src, name;
    if (!sh.known[r->id]) {
      sh.known[r->id] = 1;
      sha = f.CreateVector(r->sha256.data(), r->sha256.size());
      src = f.CreateString(r->source);
      name = f.CreateString(r->chunk_name);
    }
    wire::EvaluationBuilder eb(f);
    eb.add_id((uint64_t{slot.generation} << 32) | idx);
    eb.add_script_id(r->id);
    eb.add_timeout_us(timeout_us);
    eb.add_inputs(inputs);
    if (!src.IsNull()) {
      eb.add_sha256(sha);
      eb.add_source(src);
      eb.add_chunk_name(name);
    }
    return eb.Finish();
  }

  static std::span<const uint8_t> finish_evaluate(flatbuffers::FlatBufferBuilder& f,
                                                  const flatbuffers::Offset<wire::Evaluation>* items, std::size_t n) {
    auto vec = f.CreateVector(items, n);
    auto body = wire::CreateEvaluate(f, vec);
    f.FinishSizePrefixed(wire::CreateFrame(f, wire::Body::Evaluate, body.Union()));
    return {f.GetBufferPointer(), f.GetSize()};
  }

  // Delivers a result produced on the calling thread (refusals): futures at once, callbacks via
  // the dispatcher, so callback code never runs inside evaluate().
  void deliver_now(Shard& sh, Completion&& done, Result&& r) {
    if (done.runs_caller_code()) sh.dispatcher->post(Delivery{std::move(done), std::move(r)});
    else done.deliver(std::move(r));
  }

  void submit(const Script& script, Inputs&& inputs, Completion&& done) {
    const detail::ScriptRecord* r = script.record();
    if (!r || r->owner != this) {
      deliver_now(*shards[0], std::move(done), Result{Status::invalid_argument, {}, "script handle is not from this host", -1});
      return;
    }
    Shard& sh = *shards[r->shard];
    if (stopping.load(std::memory_order_relaxed)) {
      deliver_now(sh, std::move(done), Result{Status::cancelled, {}, "the host is shutting down", sh.index});
      return;
    }
    auto& f = producer_builder();
    f.Clear();
    detail::InputsOffset in;
    std::string err;
    if (!detail::encode_inputs(f, inputs, &in, &err)) {
      deliver_now(sh, std::move(done), Result{Status::invalid_argument, {}, std::move(err), sh.index});
      return;
    }
    std::shared_ptr<FrameWriter> writer;
    Status refused = Status::ok;
    {
      std::lock_guard lock(sh.mu);
      if (sh.state == ShardState::kStopping || sh.state == ShardState::kStopped) {
        refused = Status::cancelled;
      } else if (sh.state == ShardState::kDown && sh.waiting.size() >= opts.max_queued_while_down) {
        refused = Status::unavailable;
      } else {
        const uint32_t idx = alloc_slot(sh);
        Slot& slot = sh.slots[idx];
        slot.script = script;
        slot.inputs = std::move(inputs);
        slot.done = std::move(done);
        if (sh.state == ShardState::kRunning) {
          auto ev = build_evaluation(f, sh, idx, in);
          slot.sent = true;
          if (sh.writer->enqueue(finish_evaluate(f, &ev, 1))) writer = sh.writer;
        } else {
          sh.waiting.push_back(idx);
        }
      }
    }
    if (refused != Status::ok) {
      deliver_now(sh, std::move(done),
                  Result{refused, {},
                         refused == Status::cancelled ? "the host is shutting down"
                                                      : "shard " + std::to_string(sh.index) +
                                                            " is restarting and its queue is full",
                         sh.index});
      return;
    }
    sh.evaluations.fetch_add(1, std::memory_order_relaxed);
    if (writer) writer->write_pending();
  }

  void submit_batch(std::vector<Request>&& requests, BatchCallback&& cb) {
    auto shared_cb = std::make_shared<BatchCallback>(std::move(cb));
    // Group by shard, keeping each shard's requests in order.
    std::vector<std::vector<std::size_t>> by_shard(shards.size());
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const detail::ScriptRecord* r = requests[i].script.record();
      if (!r || r->owner != this) {
        deliver_now(*shards[0], Completion(detail::BatchTarget{shared_cb, i}),
                    Result{Status::invalid_argument, {}, "script handle is not from this host", -1});
        continue;
      }
      by_shard[r->shard].push_back(i);
    }
    auto& f = producer_builder();
    std::vector<detail::InputsOffset> inputs;
    std::vector<std::size_t> chunk;
    std::vector<flatbuffers::Offset<wire::Evaluation>> evs;
    for (std::size_t s = 0; s < shards.size(); ++s) {
      Shard& sh = *shards[s];
      const auto& list = by_shard[s];
      std::size_t pos = 0;
      while (pos < list.size()) {
        // Encode inputs outside the lock, up to one frame's worth.
        f.Clear();
        inputs.clear();
        chunk.clear();
        for (; pos < list.size() && chunk.size() < kFrameCutItems && f.GetSize() < kFrameCutBytes; ++pos) {
          const std::size_t i = list[pos];
          detail::InputsOffset in;
          std::string err;
          if (!detail::encode_inputs(f, requests[i].inputs, &in, &err)) {
            deliver_now(sh, Completion(detail::BatchTarget{shared_cb, i}),
                        Result{Status::invalid_argument, {}, std::move(err), sh.index});
            continue;
          }
          inputs.push_back(in);
          chunk.push_back(i);
        }
        if (chunk.empty()) continue;
        std::shared_ptr<FrameWriter> writer;
        std::size_t refused_from = chunk.size();
        Status refused = Status::ok;
        {
          std::lock_guard lock(sh.mu);
          evs.clear();
          for (std::size_t k = 0; k < chunk.size(); ++k) {
            const bool stop = stopping.load(std::memory_order_relaxed) || sh.state == ShardState::kStopping ||
                              sh.state == ShardState::kStopped;
            const bool full = sh.state == ShardState::kDown && sh.waiting.size() >= opts.max_queued_while_down;
            if (stop || full) {
              refused = stop ? Status::cancelled : Status::unavailable;
              refused_from = k;
              break;
            }
            const uint32_t idx = alloc_slot(sh);
            Slot& slot = sh.slots[idx];
            slot.script = requests[chunk[k]].script;
            slot.inputs = std::move(requests[chunk[k]].inputs);
            slot.done = Completion(detail::BatchTarget{shared_cb, chunk[k]});
            if (sh.state == ShardState::kRunning) {
              evs.push_back(build_evaluation(f, sh, idx, inputs[k]));
              slot.sent = true;
            } else {
              sh.waiting.push_back(idx);
            }
          }
          if (!evs.empty() && sh.writer->enqueue(finish_evaluate(f, evs.data(), evs.size()))) writer = sh.writer;
        }
        sh.evaluations.fetch_add(refused_from, std::memory_order_relaxed);
        if (writer) writer->write_pending();
        for (std::size_t k = refused_from; k < chunk.size(); ++k) {
          deliver_now(sh, Completion(detail::BatchTarget{shared_cb, chunk[k]}),
                      Result{refused, {}, refused == Status::cancelled ? "the host is shutting down" : "shard queue is full",
                             sh.index});
        }
      }
    }
  }

  // Encodes the slots `idxs` (all used, not sent) for the current worker and queues them.
  // sh.mu held (loop thread); writes at once: this path is rare (restarts, NeedSource).
  void send_slots(Shard& sh, const std::vector<uint32_t>& idxs) {
    assert(on_loop_thread());
    auto& f = loop_fbb;
    std::vector<flatbuffers::Offset<wire::Evaluation>> evs;
    std::size_t k = 0;
    while (k < idxs.size()) {
      f.Clear();
      evs.clear();
      for (; k < idxs.size() && evs.size() < kFrameCutItems && f.GetSize() < kFrameCutBytes; ++k) {
        Slot& slot = sh.slots[idxs[k]];
        detail::InputsOffset in;
        std::string err;
        detail::encode_inputs(f, slot.inputs, &in, &err);  // validated at submission
        evs.push_back(build_evaluation(f, sh, idxs[k], in));
        slot.sent = true;
      }
      if (sh.writer->enqueue(finish_evaluate(f, evs.data(), evs.size()))) {
        // Nobody else is writing: write now so the next chunk can reuse the builder.
        sh.writer->write_pending();
      }
    }
  }

  // ---- loop thread ------------------------------------------------------------------------

  void deliver_from_loop(Shard& sh, Completion&& done, Result&& r) {
    if (!done.runs_caller_code() && opts.fulfill_futures_on_loop) done.deliver(std::move(r));
    else sh.to_dispatch.push_back(Delivery{std::move(done), std::move(r)});
  }

  Error spawn(Shard& sh) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      return {Status::unavailable, std::string("socketpair failed: ") + strerror(errno)};
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);

    auto* w = new WorkerProcess();
    w->shard = &sh;
    w->fd = sv[0];
    const std::string host_pid = std::to_string(getpid());
    const std::string mem = std::to_string(opts.memory_limit);
    const char* args[] = {worker_path.c_str(), "--fd", "3", "--host-pid", host_pid.c_str(), "--memory-limit", mem.c_str(),
                          nullptr};
    uv_stdio_container_t stdio[4];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_IGNORE;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = 2;
    stdio[3].flags = UV_INHERIT_FD;
    stdio[3].data.fd = sv[1];
    uv_process_options_t o{};
    o.file = worker_path.c_str();
    o.args = const_cast<char**>(args);
    o.exit_cb = &Impl::on_exit;
    o.flags = UV_PROCESS_DETACHED;  // setsid(): its own session and process group
    o.stdio_count = 4;
    o.stdio = stdio;
    w->process.data = w;
    const int rc = uv_spawn(&loop, &w->process, &o);
    close(sv[1]);
    ++live_workers;
    if (rc != 0) {
      close(sv[0]);
      w->dead = w->exited = true;
      w->open_handles = 1;
      uv_close(reinterpret_cast<uv_handle_t*>(&w->process), &Impl::on_handle_closed);
      return {Status::unavailable, "cannot start worker '" + worker_path + "': " + uv_strerror(rc)};
    }
    w->pid = w->process.pid;
    w->open_handles = 3;
    uv_timer_init(&loop, &w->linger);
    w->linger.data = w;
    uv_poll_init(&loop, &w->poll, w->fd);
    w->poll.data = w;
    uv_poll_start(&w->poll, UV_READABLE, &Impl::on_poll);
    w->poll_started = true;
    const int fd = w->fd;
    Impl* self = this;
    Shard* shp = &sh;
    w->writer = std::shared_ptr<FrameWriter>(
        new FrameWriter(fd,
                        [self, shp] {
                          shp->write_blocked.store(true, std::memory_order_release);
                          uv_async_send(&self->wakeup);
                        }),
        [fd](FrameWriter* p) {
          delete p;
          close(fd);  // only when no producer can still be writing to it
        });
    sh.worker = w;
    sh.pid.store(w->pid, std::memory_order_relaxed);
    sh.starts.fetch_add(1, std::memory_order_relaxed);
    sh.started_at = std::chrono::steady_clock::now();
    std::vector<uint32_t> waiting;
    {
      std::lock_guard lock(sh.mu);
      sh.writer = w->writer;
      sh.state = ShardState::kRunning;
      std::fill(sh.known.begin(), sh.known.end(), 0);
      waiting.swap(sh.waiting);
      if (!waiting.empty()) send_slots(sh, waiting);
    }
    return {};
  }

  static void on_handle_closed(uv_handle_t* h) {
    auto* w = static_cast<WorkerProcess*>(h->data);
    Impl* self = static_cast<Impl*>(h->loop->data);
    if (h == reinterpret_cast<uv_handle_t*>(&w->poll)) w->writer.reset();  // fd closes with the last ref
    if (--w->open_handles == 0) {
      delete w;
      --self->live_workers;
      self->maybe_finish_shutdown();
    }
  }

  static void on_exit(uv_process_t* p, int64_t status, int term_signal) {
    auto* w = static_cast<WorkerProcess*>(p->data);
    Impl* self = static_cast<Impl*>(p->loop->data);
    w->exited = true;  // reaped: its pid may be reused from now on, never signal it again
    self->worker_died(w, describe_exit(status, term_signal));
    uv_close(reinterpret_cast<uv_handle_t*>(p), &Impl::on_handle_closed);
  }

  // The worker's stream ended (EOF, or a reset when it died with unread input). Usually the
  // process is exiting and its exit status, which names the cause, arrives within
  // milliseconds: stop reading and wait for it. A worker still running after kLingerMs closed
  // its pipe on purpose and is killed.
  void stream_ended(WorkerProcess* w) {
    if (w->dead || w->stream_ended) return;
    w->stream_ended = true;
    uv_poll_stop(&w->poll);
    uv_timer_start(&w->linger, &Impl::on_linger_expired, kLingerMs, 0);
  }

  static void on_linger_expired(uv_timer_t* t) {
    auto* w = static_cast<WorkerProcess*>(t->data);
    Impl* self = static_cast<Impl*>(t->loop->data);
    self->worker_died(w, "closed its pipe but kept running, and was killed");
  }

  static void on_poll(uv_poll_t* h, int status, int events) {
    auto* w = static_cast<WorkerProcess*>(h->data);
    Impl* self = static_cast<Impl*>(h->loop->data);
    if (w->dead) return;
    if (status < 0) {  // libuv reports EPOLLERR (e.g. ECONNRESET) as UV_EBADF
      self->stream_ended(w);
      return;
    }
    if (events & UV_WRITABLE) self->flush_writer(w);
    if (events & UV_READABLE) self->read_worker(w);
  }

  void flush_writer(WorkerProcess* w) {
    switch (w->writer->flush_from_loop()) {
      case FrameWriter::Flush::kMore: return;
      case FrameWriter::Flush::kDone:
      case FrameWriter::Flush::kClosed:
        if (w->poll_writable && !w->dead) {
          w->poll_writable = false;
          uv_poll_start(&w->poll, UV_READABLE, &Impl::on_poll);
        }
        return;
    }
  }

  static void on_wakeup(uv_async_t* a) {
    Impl* self = static_cast<Impl*>(a->data);
    for (auto& sh : self->shards) {
      if (sh->write_blocked.exchange(false, std::memory_order_acq_rel) && sh->worker && !sh->worker->dead &&
          !sh->worker->poll_writable) {
        sh->worker->poll_writable = true;
        uv_poll_start(&sh->worker->poll, UV_READABLE | UV_WRITABLE, &Impl::on_poll);
      }
    }
    if (self->stopping.load() && !self->shutdown_started) self->begin_shutdown();
  }

  void read_worker(WorkerProcess* w) {
    const long n = w->reader.read_from(w->fd);
    if (n == -EAGAIN) return;
    if (n <= 0) {  // EOF or ECONNRESET: what it wrote before is drained in worker_died
      stream_ended(w);
      return;
    }
    std::string violation;
    process_frames(w, &violation);
    if (!violation.empty()) worker_died(w, "violated the protocol: " + violation, false);
  }

  // Handles every complete frame in the worker's reader; stops at the first violation.
  void process_frames(WorkerProcess* w, std::string* violation) {
    Shard& sh = *w->shard;
    sh.reads.fetch_add(1, std::memory_order_relaxed);
    protocol::FrameView fv;
    while (violation->empty() && w->reader.next(fv)) {
      sh.frames.fetch_add(1, std::memory_order_relaxed);
      switch (fv.frame->body_type()) {
        case wire::Body::Hello: {
          const auto* h = fv.frame->body_as_Hello();
          if (w->hello) *violation = "sent a second hello";
          else if (h->protocol_version() != protocol::kProtocolVersion)
            *violation = "speaks protocol version " + std::to_string(h->protocol_version()) + ", host speaks " +
                         std::to_string(protocol::kProtocolVersion);
          else {
            w->hello = true;
            std::lock_guard lock(start_mu);
            ++hellos;
            start_cv.notify_all();
          }
          break;
        }
        case wire::Body::Results:
          if (!w->hello) *violation = "sent results before its hello";
          else handle_results(w, fv.frame->body_as_Results(), violation);
          break;
        default:
          *violation = "sent an unexpected frame type";
      }
    }
    if (violation->empty() && w->reader.error() != protocol::FrameError::kNone)
      *violation = protocol::to_string(w->reader.error());
    if (!sh.to_dispatch.empty()) sh.dispatcher->post(sh.to_dispatch);
  }

  // A dead worker's last words: results it wrote before it exited are still in the socket.
  void drain(WorkerProcess* w) {
    std::string violation;
    for (int i = 0; i < 64 && violation.empty(); ++i) {
      if (w->reader.read_from(w->fd) <= 0) break;
      process_frames(w, &violation);
    }
  }

  void handle_results(WorkerProcess* w, const wire::Results* results, std::string* violation) {
    Shard& sh = *w->shard;
    const auto* items = results->items();
    if (!items) return;
    // Release the slots first (under the lock), decode and deliver after.
    std::vector<std::pair<Completion, const wire::Result*>>& done = finished_scratch;
    done.clear();
    std::vector<uint32_t> resend;
    {
      std::lock_guard lock(sh.mu);
      for (const wire::Result* r : *items) {
        const uint64_t id = r->id();
        const uint32_t idx = static_cast<uint32_t>(id);
        const uint32_t gen = static_cast<uint32_t>(id >> 32);
        if (idx >= sh.slots.size() || !sh.slots[idx].used || !sh.slots[idx].sent || sh.slots[idx].generation != gen) {
          *violation = "answered an evaluation it was not running (id " + std::to_string(id) + ")";
          break;
        }
        Slot& slot = sh.slots[idx];
        if (r->status() == wire::Status::NeedSource) {
          const uint32_t sid = slot.script.record()->id;
          if (sid < sh.known.size() && !sh.known[sid]) {
            *violation = "asked twice for the source of script " + std::to_string(sid);
            break;
          }
          if (sid < sh.known.size()) sh.known[sid] = 0;
          slot.sent = false;
          resend.push_back(idx);
          continue;
        }
        if (r->status() > wire::Status::InvalidArgument) {
          *violation = "sent an unknown status " + std::to_string(static_cast<int>(r->status()));
          break;
        }
        done.emplace_back(std::move(slot.done), r);
        free_slot(sh, idx);
      }
      if (!resend.empty() && violation->empty()) send_slots(sh, resend);
    }
    for (auto& [completion, r] : done) {
      Result res;
      res.status = static_cast<Status>(r->status());
      res.shard = sh.index;
      if (res.status == Status::ok) {
        if (!detail::decode_value(r->value(), &res.value)) {
          res.status = Status::worker_lost;
          res.error = "worker sent an invalid value";
          if (violation->empty()) *violation = "sent an invalid value";
        }
      } else if (const auto* e = r->error()) {
        res.error = e->str();
      }
      deliver_from_loop(sh, std::move(completion), std::move(res));
    }
    done.clear();
  }
  std::vector<std::pair<Completion, const wire::Result*>> finished_scratch;  // loop thread only

  // First sign of a worker's death (exit, EOF, read error, protocol violation): kill its group,
  // end what it was running, schedule the restart. Idempotent per worker.
  void worker_died(WorkerProcess* w, const std::string& cause, bool read_last_words = true) {
    Shard& sh = *w->shard;
    if (w->dead) return;
    w->dead = true;
    const bool stop = stopping.load();
    if (!w->exited) kill(-w->pid, SIGKILL);  // not yet reaped, so the group id is still ours
    if (read_last_words && w->poll_started && w->reader.error() == protocol::FrameError::kNone) drain(w);
    if (w->poll_started) {
      uv_poll_stop(&w->poll);
      uv_close(reinterpret_cast<uv_handle_t*>(&w->poll), &Impl::on_handle_closed);
      uv_close(reinterpret_cast<uv_handle_t*>(&w->linger), &Impl::on_handle_closed);
      w->poll_started = false;
    }
    if (!stop) spdlog::warn("outrun: shard {} worker {} {}", sh.index, w->pid, cause);
    std::vector<std::pair<Completion, Result>> ended;
    {
      std::lock_guard lock(sh.mu);
      if (sh.writer) sh.writer->close();
      sh.writer.reset();
      for (uint32_t idx = 0; idx < sh.slots.size(); ++idx) {
        Slot& slot = sh.slots[idx];
        if (!slot.used || !slot.sent) continue;
        Result r{stop ? Status::cancelled : Status::worker_lost, {},
                 stop ? "the host shut down before it finished" : "its worker " + cause, sh.index};
        ended.emplace_back(std::move(slot.done), std::move(r));
        free_slot(sh, idx);
      }
      if (stop) {
        for (uint32_t idx : sh.waiting) {
          ended.emplace_back(std::move(sh.slots[idx].done),
                             Result{Status::cancelled, {}, "the host shut down before it ran", sh.index});
          free_slot(sh, idx);
        }
        sh.waiting.clear();
      }
      sh.state = stop ? ShardState::kStopped : ShardState::kDown;
    }
    if (sh.worker == w) sh.worker = nullptr;
    sh.pid.store(0, std::memory_order_relaxed);
    sh.deaths.fetch_add(1, std::memory_order_relaxed);
    for (auto& [c, r] : ended) deliver_from_loop(sh, std::move(c), std::move(r));
    if (!sh.to_dispatch.empty()) sh.dispatcher->post(sh.to_dispatch);
    if (!w->hello) {
      std::lock_guard lock(start_mu);
      if (start_error.empty()) start_error = "worker " + std::to_string(w->pid) + " " + cause + " before its hello";
      start_cv.notify_all();
    }
    if (!stop) schedule_restart(sh);
  }

  void schedule_restart(Shard& sh) {
    const auto uptime = std::chrono::steady_clock::now() - sh.started_at;
    if (uptime >= kHealthyUptime) sh.quick_deaths = 0;
    auto delay = opts.restart_delay * (1 << std::min(sh.quick_deaths, 12));
    if (delay > kMaxRestartDelay) delay = kMaxRestartDelay;
    ++sh.quick_deaths;
    sh.restart_timer.data = &sh;
    uv_timer_start(&sh.restart_timer, &Impl::on_restart, static_cast<uint64_t>(delay.count()), 0);
  }

  static void on_restart(uv_timer_t* t) {
    auto* sh = static_cast<Shard*>(t->data);
    Impl* self = static_cast<Impl*>(t->loop->data);
    if (self->stopping.load()) return;
    if (Error err = self->spawn(*sh)) {
      spdlog::error("outrun: shard {}: {}", sh->index, err.message);
      // Nothing can run here until a start succeeds: answer what waits, then try again.
      std::vector<std::pair<Completion, Result>> ended;
      {
        std::lock_guard lock(sh->mu);
        for (uint32_t idx : sh->waiting) {
          ended.emplace_back(std::move(sh->slots[idx].done), Result{Status::unavailable, {}, err.message, sh->index});
          self->free_slot(*sh, idx);
        }
        sh->waiting.clear();
      }
      for (auto& [c, r] : ended) self->deliver_from_loop(*sh, std::move(c), std::move(r));
      if (!sh->to_dispatch.empty()) sh->dispatcher->post(sh->to_dispatch);
      self->schedule_restart(*sh);
    }
  }

  void begin_shutdown() {
    assert(on_loop_thread());
    shutdown_started = true;
    flatbuffers::FlatBufferBuilder f(64);
    f.FinishSizePrefixed(wire::CreateFrame(f, wire::Body::Shutdown, wire::CreateShutdown(f).Union()));
    for (auto& shp : shards) {
      Shard& sh = *shp;
      uv_timer_stop(&sh.restart_timer);
      std::shared_ptr<FrameWriter> writer;
      std::vector<std::pair<Completion, Result>> ended;
      {
        std::lock_guard lock(sh.mu);
        sh.state = sh.worker ? ShardState::kStopping : ShardState::kStopped;
        if (sh.writer && sh.writer->enqueue({f.GetBufferPointer(), f.GetSize()})) writer = sh.writer;
        for (uint32_t idx : sh.waiting) {
          ended.emplace_back(std::move(sh.slots[idx].done),
                             Result{Status::cancelled, {}, "the host shut down before it ran", sh.index});
          free_slot(sh, idx);
        }
        sh.waiting.clear();
      }
      if (writer) writer->write_pending();
      for (auto& [c, r] : ended) deliver_from_loop(sh, std::move(c), std::move(r));
      if (!sh.to_dispatch.empty()) sh.dispatcher->post(sh.to_dispatch);
    }
    uv_timer_start(&shutdown_timer, &Impl::on_shutdown_timeout, static_cast<uint64_t>(opts.shutdown_timeout.count()), 0);
    maybe_finish_shutdown();
  }

  static void on_shutdown_timeout(uv_timer_t* t) {
    Impl* self = static_cast<Impl*>(t->loop->data);
    for (auto& sh : self->shards)
      if (sh->worker) self->worker_died(sh->worker, "did not stop in time and was killed");
  }

  void maybe_finish_shutdown() {
    if (!shutdown_started || live_workers > 0) return;
    uv_timer_stop(&shutdown_timer);
    uv_close(reinterpret_cast<uv_handle_t*>(&shutdown_timer), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&wakeup), nullptr);
    for (auto& sh : shards) uv_close(reinterpret_cast<uv_handle_t*>(&sh->restart_timer), nullptr);
    // uv_run returns once these close callbacks have run: nothing is left on the loop.
  }

  // ---- life cycle ---------------------------------------------------------------------------

  Error start() {
    worker_path = find_worker(opts.worker_path);
    if (access(worker_path.c_str(), X_OK) != 0)
      return {Status::invalid_argument, "worker executable '" + worker_path + "' is not executable: " + strerror(errno)};
    timeout_us = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(opts.timeout).count());
    uv_loop_init(&loop);
    loop.data = this;
    uv_async_init(&loop, &wakeup, &Impl::on_wakeup);
    wakeup.data = this;
    uv_timer_init(&loop, &shutdown_timer);
    for (int i = 0; i < opts.shards; ++i) {
      auto sh = std::make_unique<Shard>();
      sh->index = i;
      sh->dispatcher = std::make_unique<detail::Dispatcher>();
      uv_timer_init(&loop, &sh->restart_timer);
      shards.push_back(std::move(sh));
    }
    // Workers are spawned by the loop thread, always: PR_SET_PDEATHSIG follows the thread that
    // forked, and the loop thread lives exactly as long as the host.
    loop_thread = std::thread([this] {
      loop_thread_id = std::this_thread::get_id();
      for (auto& sh : shards) {
        if (Error e = spawn(*sh)) {
          std::lock_guard lock(start_mu);
          start_error = e.message;
          start_cv.notify_all();
          break;
        }
      }
      uv_run(&loop, UV_RUN_DEFAULT);
    });
    std::unique_lock lock(start_mu);
    const bool ready = start_cv.wait_for(lock, opts.start_timeout,
                                         [&] { return hellos >= opts.shards || !start_error.empty(); });
    if (!start_error.empty()) return {Status::unavailable, start_error};
    if (!ready) return {Status::unavailable, "workers did not say hello within the start timeout"};
    return {};
  }

  void shutdown() {
    if (!loop_thread.joinable()) {  // start() failed before the loop ran
      if (loop.data) uv_loop_close(&loop);
      return;
    }
    stopping.store(true);
    uv_async_send(&wakeup);
    loop_thread.join();
    if (int rc = uv_loop_close(&loop); rc != 0) spdlog::error("outrun: loop closed with handles open: {}", uv_strerror(rc));
    shards.clear();  // dispatchers run what is queued, then join
  }
};

Error Host::create(const HostOptions& options, std::unique_ptr<Host>* out) {
  out->reset();
  if (options.shards < 1 || options.shards > 64) return {Status::invalid_argument, "shards must be 1..64"};
  if (options.timeout.count() <= 0) return {Status::invalid_argument, "timeout must be positive"};
  if (options.grace.count() < 0) return {Status::invalid_argument, "grace must not be negative"};
  if (options.memory_limit < (256u << 10))
    return {Status::invalid_argument, "memory_limit must be at least 256 KiB (the sandbox's libraries need it)"};
  auto impl = std::make_unique<Impl>(options);
  if (Error err = impl->start()) {
    impl->shutdown();
    return err;
  }
  out->reset(new Host(std::move(impl)));
  return {};
}

Host::Host(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Host::~Host() { impl_->shutdown(); }

Error Host::register_script(std::string_view key, std::string_view source, Script* out) {
  return impl_->registry.add(key, source, out);
}

void Host::evaluate(const Script& script, Inputs inputs, Callback done) {
  impl_->submit(script, std::move(inputs), Completion(std::move(done)));
}

std::future<Result> Host::evaluate(const Script& script, Inputs inputs) {
  std::promise<Result> p;
  auto f = p.get_future();
  impl_->submit(script, std::move(inputs), Completion(std::move(p)));
  return f;
}

void Host::evaluate_batch(std::vector<Request> requests, BatchCallback done) {
  impl_->submit_batch(std::move(requests), std::move(done));
}

int Host::shards() const { return static_cast<int>(impl_->shards.size()); }

ShardStats Host::shard_stats(int i) const {
  ShardStats s;
  if (i < 0 || i >= shards()) return s;
  const Shard& sh = *impl_->shards[static_cast<std::size_t>(i)];
  s.index = i;
  s.pid = sh.pid.load(std::memory_order_relaxed);
  s.starts = sh.starts.load(std::memory_order_relaxed);
  s.deaths = sh.deaths.load(std::memory_order_relaxed);
  s.evaluations = sh.evaluations.load(std::memory_order_relaxed);
  s.read_syscalls = sh.reads.load(std::memory_order_relaxed);
  s.frames_read = sh.frames.load(std::memory_order_relaxed);
  return s;
}

std::vector<int> Host::worker_pids() const {
  std::vector<int> pids;
  for (auto& sh : impl_->shards) pids.push_back(sh->pid.load(std::memory_order_relaxed));
  return pids;
}

}  // namespace outrun

// Worker processes (loop thread): spawn, read, results, death.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/interprocess/shared_memory_object.hpp>
#include <cassert>
#include <cstring>
#include <random>

#include "host_impl.h"
#include "outrun/protocol/messages.h"
#include "outrun/protocol/worker_exit.h"

namespace outrun {

using detail::Completion;
using detail::DeathCause;
using detail::Shard;
using detail::ShardState;
using detail::Slot;
using detail::SlotPlace;
using detail::WorkerProcess;
using protocol::FrameWriter;
namespace bip = boost::interprocess;

std::string describe_exit(int64_t status, int signal) {
  if (signal == SIGSYS)
    return "was killed by signal " + std::to_string(signal) +
           " (Bad system call): it made a system call its seccomp filter forbids";
  if (signal != 0)
    return "was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return protocol::describe_worker_exit(status);
}

namespace {

// A per-process unique name; /dev/shm entries are removed as soon as the worker has mapped it.
std::string page_name(int shard) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return "/outrun-" + std::to_string(getpid()) + "-" + std::to_string(shard) + "-" +
         std::to_string(counter.fetch_add(1)) + "-" + std::to_string(rng() & 0xffffff);
}

}  // namespace

Error Host::Impl::spawn(Shard& sh) {
  assert(on_loop_thread());
  // The status page first: the worker maps it before it says hello.
  auto* w = new WorkerProcess();
  w->shard = &sh;
  w->page_name = page_name(sh.index);
  try {
    bip::shared_memory_object shm(bip::create_only, w->page_name.c_str(), bip::read_write,
                                  bip::permissions(0600));
    shm.truncate(protocol::kStatusPageSize);
    w->page_region =
        std::make_shared<bip::mapped_region>(shm, bip::read_write, 0, protocol::kStatusPageSize);
  } catch (const std::exception& e) {
    bip::shared_memory_object::remove(w->page_name.c_str());
    delete w;
    return {Status::unavailable, std::string("cannot create a status page: ") + e.what()};
  }
  w->page = new (w->page_region->get_address()) protocol::StatusPage();
  w->page->version.store(protocol::kStatusPageVersion);
  w->page->magic.store(protocol::kStatusPageMagic, std::memory_order_release);

  // Frames to the worker go through one socketpair, results back through another.
  int to_worker[2], from_worker[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, to_worker) != 0) {
    bip::shared_memory_object::remove(w->page_name.c_str());
    delete w;
    return {Status::unavailable, std::string("socketpair failed: ") + strerror(errno)};
  }
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, from_worker) != 0) {
    close(to_worker[0]);
    close(to_worker[1]);
    bip::shared_memory_object::remove(w->page_name.c_str());
    delete w;
    return {Status::unavailable, std::string("socketpair failed: ") + strerror(errno)};
  }
  fcntl(to_worker[0], F_SETFL, fcntl(to_worker[0], F_GETFL) | O_NONBLOCK);
  fcntl(from_worker[0], F_SETFL, fcntl(from_worker[0], F_GETFL) | O_NONBLOCK);
  w->wfd = to_worker[0];
  w->fd = from_worker[0];
  const std::string host_pid = std::to_string(getpid());
  const std::string mem = std::to_string(opts.memory_limit);
  const std::string budget = std::to_string(opts.worker_script_budget);
  const std::string hb = std::to_string(opts.heartbeat_interval.count());
  const std::string as_limit = std::to_string(opts.worker_address_space_limit);
  std::vector<const char*> args = {worker_path.c_str(),
                                   "--fd",
                                   "3",
                                   "--out-fd",
                                   "4",
                                   "--host-pid",
                                   host_pid.c_str(),
                                   "--memory-limit",
                                   mem.c_str(),
                                   "--script-budget",
                                   budget.c_str(),
                                   "--status-page",
                                   w->page_name.c_str(),
                                   "--heartbeat-ms",
                                   hb.c_str(),
                                   "--address-space-limit",
                                   as_limit.c_str()};
  std::string profile;
  if (!opts.worker_profile_prefix.empty()) {
    // The pid is not known before the spawn: the worker appends it (see worker/main.cpp).
    profile = opts.worker_profile_prefix;
    args.push_back("--profile");
    args.push_back(profile.c_str());
  }
  args.push_back(nullptr);
  // The worker's stderr is a pipe the host reads and logs (bounded), never a file it could grow.
  uv_pipe_init(&loop, &w->err_pipe, 0);
  w->err_pipe.data = w;
  uv_stdio_container_t stdio[5];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_IGNORE;
  stdio[2].flags = static_cast<uv_stdio_flags>(UV_CREATE_PIPE | UV_WRITABLE_PIPE);
  stdio[2].data.stream = reinterpret_cast<uv_stream_t*>(&w->err_pipe);
  stdio[3].flags = UV_INHERIT_FD;
  stdio[3].data.fd = to_worker[1];
  stdio[4].flags = UV_INHERIT_FD;
  stdio[4].data.fd = from_worker[1];
  uv_process_options_t o{};
  o.file = worker_path.c_str();
  o.args = const_cast<char**>(args.data());
  o.exit_cb = &Impl::on_exit;
  o.flags = UV_PROCESS_DETACHED;  // setsid(): its own session and process group
  o.stdio_count = 5;
  o.stdio = stdio;
  if (!worker_env.empty()) o.env = worker_env.data();  // else the host's own environment
  w->process.data = w;
  const int rc = uv_spawn(&loop, &w->process, &o);
  close(to_worker[1]);
  close(from_worker[1]);
  ++live_workers;
  w->started_at = std::chrono::steady_clock::now();
  w->started_ns = monotonic_ns();
  if (rc != 0) {
    close(w->fd);
    close(w->wfd);
    bip::shared_memory_object::remove(w->page_name.c_str());
    w->dead = w->exited = true;
    w->open_handles = 2;
    uv_close(reinterpret_cast<uv_handle_t*>(&w->process), &Impl::on_handle_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&w->err_pipe), &Impl::on_handle_closed);
    return {Status::unavailable, "cannot start worker '" + worker_path + "': " + uv_strerror(rc)};
  }
  w->pid = w->process.pid;
  w->open_handles = 5;
  uv_read_start(reinterpret_cast<uv_stream_t*>(&w->err_pipe), &Impl::on_err_alloc,
                &Impl::on_err_read);
  uv_timer_init(&loop, &w->linger);
  w->linger.data = w;
  uv_poll_init(&loop, &w->poll, w->fd);
  w->poll.data = w;
  uv_poll_start(&w->poll, UV_READABLE, &Impl::on_poll);
  uv_poll_init(&loop, &w->wpoll, w->wfd);
  w->wpoll.data = w;
  w->poll_started = true;
  const int fd = w->wfd;
  Impl* self = this;
  Shard* shp = &sh;
  w->writer = std::shared_ptr<FrameWriter>(
      new FrameWriter(fd,
                      [self, shp] {
                        shp->write_blocked.store(true, std::memory_order_release);
                        self->wake();
                      }),
      [fd](FrameWriter* p) {
        delete p;
        close(fd);  // only when no producer can still be writing to it
      });
  sh.worker = w;
  sh.pid.store(w->pid, std::memory_order_relaxed);
  sh.worker_started_ns.store(w->started_ns, std::memory_order_relaxed);
  sh.starts.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(sh.stats_mu);
    sh.stats_page = w->page_region;
  }
  std::vector<uint32_t> waiting;
  {
    std::lock_guard lock(sh.mu);
    sh.writer = w->writer;
    set_state(sh, ShardState::kRunning);
    std::fill(sh.known.begin(), sh.known.end(), 0);
    waiting.swap(sh.waiting);
    if (!waiting.empty()) send_slots(sh, waiting);
  }
  arm_watchdog(sh, w->started_ns);
  return {};
}

void Host::Impl::on_handle_closed(uv_handle_t* h) {
  auto* w = static_cast<WorkerProcess*>(h->data);
  Impl* self = static_cast<Impl*>(h->loop->data);
  if (h == reinterpret_cast<uv_handle_t*>(&w->poll)) close(w->fd);
  if (h == reinterpret_cast<uv_handle_t*>(&w->wpoll))
    w->writer.reset();  // wfd closes with the last ref
  if (--w->open_handles == 0) {
    delete w;
    --self->live_workers;
    self->maybe_finish_shutdown();
  }
}

void Host::Impl::on_exit(uv_process_t* p, int64_t status, int term_signal) {
  auto* w = static_cast<WorkerProcess*>(p->data);
  Impl* self = static_cast<Impl*>(p->loop->data);
  w->exited = true;  // reaped: its pid may be reused from now on, never signal it again
  w->exited_cleanly = status == 0 && term_signal == 0;
  w->exit_status = status;
  w->term_signal = term_signal;
  const DeathCause cause = term_signal != 0 ? DeathCause::kCrash : DeathCause::kExit;
  self->worker_died(w, cause, describe_exit(status, term_signal));
  uv_close(reinterpret_cast<uv_handle_t*>(p), &Impl::on_handle_closed);
}

// The worker's stream ended (EOF, or a reset when it died with unread input). Usually the
// process is exiting and its exit status, which names the cause, arrives within milliseconds:
// stop reading and wait for it. A worker still running after kLingerMs closed its pipe on
// purpose and is killed.
void Host::Impl::stream_ended(WorkerProcess* w) {
  if (w->dead || w->stream_ended) return;
  w->stream_ended = true;
  uv_poll_stop(&w->poll);
  uv_poll_stop(&w->wpoll);
  uv_timer_start(&w->linger, &Impl::on_linger_expired, kLingerMs, 0);
}

void Host::Impl::on_linger_expired(uv_timer_t* t) {
  auto* w = static_cast<WorkerProcess*>(t->data);
  Impl* self = static_cast<Impl*>(t->loop->data);
  self->kill_worker(w, DeathCause::kProtocol, "closed its pipe but kept running");
}

// A worker's stderr: its log lines, forwarded to the host's log with the shard's name. Bounded
// per worker process, so a worker that floods its stderr cannot flood the host's log.
void Host::Impl::on_err_alloc(uv_handle_t*, size_t, uv_buf_t* buf) {
  static thread_local char storage[4096];  // loop thread only; consumed before the next alloc
  *buf = uv_buf_init(storage, sizeof storage);
}

void Host::Impl::on_err_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
  auto* w = static_cast<WorkerProcess*>(s->data);
  const detail::Log& log = static_cast<Impl*>(s->loop->data)->log;
  const int shard = w->shard->index;
  auto log_line = [&](std::string_view line) {
    if (line.empty()) return;
    if (w->err_logged < kMaxWorkerLogBytes) {
      log(LogLevel::warn, "outrun: shard {} | {}", shard, line.substr(0, 1000));
      w->err_logged += line.size();
      if (w->err_logged >= kMaxWorkerLogBytes)
        log(LogLevel::warn, "outrun: shard {} worker {} logged over {} bytes; the rest is dropped", shard,
                     w->pid, kMaxWorkerLogBytes);
    }
  };
  if (nread > 0) {
    w->err_line.append(buf->base, static_cast<std::size_t>(nread));
    std::size_t start = 0;
    for (std::size_t nl; (nl = w->err_line.find('\n', start)) != std::string::npos; start = nl + 1)
      log_line(std::string_view(w->err_line).substr(start, nl - start));
    w->err_line.erase(0, start);
    if (w->err_line.size() > 4096) {  // no newline in sight: log what there is
      log_line(w->err_line);
      w->err_line.clear();
    }
  } else if (nread < 0) {  // EOF (the process is gone) or an error: either way, done
    log_line(w->err_line);
    w->err_line.clear();
    uv_read_stop(s);
    uv_close(reinterpret_cast<uv_handle_t*>(s), &Impl::on_handle_closed);
  }
}

void Host::Impl::on_poll(uv_poll_t* h, int status, int events) {
  auto* w = static_cast<WorkerProcess*>(h->data);
  Impl* self = static_cast<Impl*>(h->loop->data);
  if (w->dead) return;
  if (status < 0) {  // libuv reports EPOLLERR (e.g. ECONNRESET) as UV_EBADF
    self->stream_ended(w);
    return;
  }
  if (events & UV_READABLE) self->read_worker(w);
}

void Host::Impl::on_wpoll(uv_poll_t* h, int status, int events) {
  auto* w = static_cast<WorkerProcess*>(h->data);
  Impl* self = static_cast<Impl*>(h->loop->data);
  if (w->dead) return;
  if (status < 0) {  // the worker's end is gone
    self->stream_ended(w);
    return;
  }
  if (events & UV_WRITABLE) self->flush_writer(w);
}

void Host::Impl::flush_writer(WorkerProcess* w) {
  switch (w->writer->flush_from_loop()) {
    case FrameWriter::Flush::kMore:
      return;
    case FrameWriter::Flush::kClosed:
      // A send failed (EPIPE, ECONNRESET, ...): the worker is dying or broke its socket. Wait
      // for its exit status like at end-of-stream; a worker still running after that is killed.
      stream_ended(w);
      return;
    case FrameWriter::Flush::kDone:
      if (w->poll_writable && !w->dead && !w->stream_ended) {
        w->poll_writable = false;
        uv_poll_stop(&w->wpoll);
      }
      return;
  }
}

void Host::Impl::read_worker(WorkerProcess* w) {
  const long n = w->reader.read_from(w->fd);
  if (n == -EAGAIN) return;
  if (n <= 0) {  // EOF or ECONNRESET: what it wrote before is drained in worker_died
    stream_ended(w);
    return;
  }
  std::string violation;
  process_frames(w, &violation);
  if (!violation.empty())
    kill_worker(w, DeathCause::kProtocol, "violated the protocol: " + violation);
}

// Handles every complete frame in the worker's reader; stops at the first violation.
void Host::Impl::process_frames(WorkerProcess* w, std::string* violation) {
  Shard& sh = *w->shard;
  sh.reads.fetch_add(1, std::memory_order_relaxed);
  protocol::FrameView fv;
  while (violation->empty() && w->reader.next(fv)) {
    sh.frames.fetch_add(1, std::memory_order_relaxed);
    protocol::WorkerMessage m;
    if (!protocol::decode_worker_frame(fv.frame, &m, violation)) break;
    switch (fv.frame->body_type()) {
      case wire::Body::Hello: {
        if (w->hello) {
          *violation = "sent a second hello";
        } else {
          w->hello = true;
          // The worker has mapped its page: the name is no longer needed.
          bip::shared_memory_object::remove(w->page_name.c_str());
          std::lock_guard lock(start_mu);
          ++hellos;
          start_cv.notify_all();
        }
        break;
      }
      case wire::Body::Results:
        if (!w->hello)
          *violation = "sent results before its hello";
        else
          handle_results(w, std::get<protocol::ResultsMsg>(m).items, violation);
        break;
      default:
        break;  // decode_worker_frame took it for a violation
    }
  }
  if (violation->empty() && w->reader.error() != protocol::FrameError::kNone)
    *violation = protocol::to_string(w->reader.error());
  if (!sh.to_dispatch.empty()) sh.dispatcher->post(sh.to_dispatch);
}

void Host::Impl::handle_results(WorkerProcess* w,
                                const flatbuffers::Vector<flatbuffers::Offset<wire::Result>>* items,
                                std::string* violation) {
  Shard& sh = *w->shard;
  if (!items) return;
  // Check and release the slots under the lock; decode and deliver after it.
  thread_local std::vector<std::pair<Completion, protocol::ResultView>> done;
  thread_local Ended ended;
  done.clear();
  std::vector<uint32_t> resend, promoted;
  {
    std::lock_guard lock(sh.mu);
    for (const wire::Result* item : *items) {
      const uint64_t id = item->id();
      const uint32_t idx = static_cast<uint32_t>(id);
      if (idx >= sh.slots.size() || sh.slots[idx].place != SlotPlace::kSent ||
          detail::slot_id(sh.slots[idx], idx) != id) {
        *violation = "answered an evaluation it was not running (id " + std::to_string(id) + ")";
        break;
      }
      Slot& slot = sh.slots[idx];
      protocol::ResultView r;
      if (!protocol::decode_worker_result(item, &r, violation)) break;
      if (r.status == wire::Status::NeedSource) {
        if (slot.source_resent) {
          *violation = "asked twice for the source of evaluation " + std::to_string(id);
          break;
        }
        slot.source_resent = true;
        const uint32_t sid = slot.script.record()->id;
        if (sid < sh.known.size()) sh.known[sid] = 0;
        slot.place = SlotPlace::kWaiting;
        resend.push_back(idx);
        continue;
      }
      // Release the slot (and the key's flight) now: a caller that awaited this result and
      // submits again must never be refused by its own finished evaluation.
      done.emplace_back(release_slot(sh, idx, &promoted), r);
    }
    if (violation->empty()) {
      // Re-sends go where promotions go: to the worker if the shard runs, else they wait for
      // the next one (restart_shard window, a dying worker being drained).
      promoted.insert(promoted.begin(), resend.begin(), resend.end());
      place_promoted(sh, promoted, &ended);
    } else {
      for (uint32_t idx : resend) sh.slots[idx].place = SlotPlace::kSent;  // ended with the worker
      for (uint32_t idx : promoted) {  // taken care of as waiting evaluations after the restart
        sh.slots[idx].place = SlotPlace::kWaiting;
        sh.waiting.push_back(idx);
      }
    }
  }
  for (auto& [completion, r] : done) {
    Result res;
    res.status = static_cast<Status>(r.status);
    res.shard = sh.index;
    if (res.status == Status::ok) {
      if (!detail::decode_value(r.value, &res.value)) {
        res.status = Status::worker_lost;
        res.error = "its worker sent an invalid value";
        if (violation->empty()) *violation = "sent an invalid value";
      }
    } else {
      res.error = r.error;
    }
    deliver_from_loop(sh, std::move(completion), std::move(res));
  }
  done.clear();
  for (auto& [c, r] : ended) deliver_from_loop(sh, std::move(c), std::move(r));
  ended.clear();
}

// A dead worker's last words: results it wrote before it exited are still in the socket.
void Host::Impl::drain(WorkerProcess* w) {
  std::string violation;
  // Bounded only as a guard: a killed or exited process cannot keep writing.
  for (int i = 0; i < 100000 && violation.empty(); ++i) {
    if (w->reader.read_from(w->fd) <= 0) break;
    process_frames(w, &violation);
  }
}

// The host decided this worker must go: record why (it decides the statuses), kill its group.
void Host::Impl::kill_worker(WorkerProcess* w, DeathCause cause, const std::string& why) {
  if (w->dead) return;
  w->kill_cause = cause;
  worker_died(w, cause, why);
}

// First sign of a worker's death (exit, kill decision, end of stream + exit status): kill its
// group, drain what it wrote, end or retry what it was running, schedule the restart.
// Idempotent per worker.
void Host::Impl::worker_died(WorkerProcess* w, DeathCause cause, const std::string& why) {
  Shard& sh = *w->shard;
  if (w->dead) return;
  w->dead = true;
  if (w->kill_cause != DeathCause::kExit) cause = w->kill_cause;  // the host's decision names it
  const bool stop = stopping.load();
  // Which evaluation was running (a crash's suspect), before anything else changes the page.
  uint64_t running = 0;
  int64_t since = 0;
  if (w->page) protocol::read_running(*w->page, &running, &since);
  if (!w->exited) kill(-w->pid, SIGKILL);  // not yet reaped, so the group id is still ours
  {
    // Nothing more goes to this worker: what draining promotes or re-sends waits for the next.
    std::lock_guard lock(sh.mu);
    if (sh.writer) sh.writer->close();
    sh.writer.reset();
    set_state(sh, stop ? ShardState::kStopped : ShardState::kDown);
  }
  if (cause != DeathCause::kProtocol && w->poll_started &&
      w->reader.error() == protocol::FrameError::kNone)
    drain(w);
  if (w->poll_started) {
    uv_poll_stop(&w->poll);
    uv_poll_stop(&w->wpoll);
    uv_close(reinterpret_cast<uv_handle_t*>(&w->poll), &Impl::on_handle_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&w->wpoll), &Impl::on_handle_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&w->linger), &Impl::on_handle_closed);
    w->poll_started = false;
  }
  if (!w->hello) bip::shared_memory_object::remove(w->page_name.c_str());
  uv_timer_stop(&sh.watchdog);

  const bool clean_exit = cause == DeathCause::kExit && w->exited_cleanly;
  if (!stop && !clean_exit) log(LogLevel::warn, "outrun: shard {} worker {} {}", sh.index, w->pid, why);
  sh.deaths.fetch_add(1, std::memory_order_relaxed);
  if (!clean_exit) sh.by_cause[static_cast<int>(cause)].fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(sh.stats_mu);
    sh.last_death = why;
    sh.stats_page.reset();
  }

  // A crash (signal, error exit, protocol violation) may have been caused by what it was
  // running: that one is not retried. Kills for another evaluation's overrun, for silence or on
  // request have no suspect.
  const bool has_suspect =
      cause == DeathCause::kCrash || cause == DeathCause::kExit || cause == DeathCause::kProtocol;
  Ended ended;
  std::vector<uint32_t> promoted;
  bool charged = false;  // to a script: not the shard's crash (schedule_restart)
  {
    std::lock_guard lock(sh.mu);
    if (sh.writer) sh.writer->close();
    sh.writer.reset();
    // Charged before anything ends: a script this quarantines has its other evaluations (the
    // retries and what waits) ended below instead of sent to the next worker.
    if (const detail::ScriptRecord* suspect =
            stop ? nullptr : crash_suspect(sh, *w, cause, running)) {
      charge_crash(sh, *suspect, *w);
      charged = true;
    }
    std::vector<uint32_t> retry;
    for (uint32_t idx = 0; idx < sh.slots.size(); ++idx) {
      Slot& slot = sh.slots[idx];
      if (slot.place != SlotPlace::kSent) continue;
      const uint64_t id = detail::slot_id(slot, idx);
      if (stop) {
        end_slot(sh, idx,
                 Result{Status::cancelled, {}, "the host shut down before it finished", sh.index},
                 &ended, &promoted);
      } else if (cause == DeathCause::kOverrun && id == w->overrun_id) {
        end_slot(sh, idx,
                 Result{Status::killed,
                        {},
                        "script ran past its timeout of " + std::to_string(opts.timeout.count()) +
                            " ms and grace of " + std::to_string(opts.grace.count()) +
                            " ms; its worker was killed",
                        sh.index},
                 &ended, &promoted);
      } else if ((has_suspect && id == running) || slot.retries >= opts.retries) {
        end_slot(sh, idx, Result{Status::worker_lost, {}, "its worker " + why, sh.index}, &ended,
                 &promoted);
      } else {
        ++slot.retries;
        slot.place = SlotPlace::kWaiting;
        retry.push_back(idx);
      }
    }
    end_quarantined(sh, &retry, &ended, &promoted);
    end_quarantined(sh, &sh.waiting, &ended, &promoted);
    // Retries go first: they were submitted before anything that waits already.
    if (!retry.empty()) {
      sh.retried.fetch_add(retry.size(), std::memory_order_relaxed);
      retry.insert(retry.end(), sh.waiting.begin(), sh.waiting.end());
      sh.waiting.swap(retry);
    }
    if (stop) {
      for (uint32_t idx : sh.waiting)
        end_slot(sh, idx,
                 Result{Status::cancelled, {}, "the host shut down before it ran", sh.index},
                 &ended, &promoted);
      sh.waiting.clear();
    }
    set_state(sh, stop ? ShardState::kStopped : ShardState::kDown);
    place_promoted(sh, promoted, &ended);
  }
  if (sh.worker == w) sh.worker = nullptr;
  sh.pid.store(0, std::memory_order_relaxed);
  sh.worker_started_ns.store(0, std::memory_order_relaxed);
  deliver_all(sh, ended);
  if (!w->hello) {
    std::lock_guard lock(start_mu);
    if (start_error.empty())
      start_error = "worker " + std::to_string(w->pid) + " " + why + " before its hello";
    start_cv.notify_all();
  }
  if (!stop)
    schedule_restart(sh, cause, w->restart_requested, charged,
                     std::chrono::steady_clock::now() - w->started_at);
}

}  // namespace outrun

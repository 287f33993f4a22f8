// The host's compile-only process (compiler.h): queue, Compile frames, checks, restarts.
#include "compiler.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "outrun/protocol/frame.h"
#include "outrun/protocol/messages.h"
#include "script_record.h"

namespace outrun::detail {

namespace {

// What every Lua 5.4 binary chunk starts with (lundump.h: LUA_SIGNATURE, then the version byte).
constexpr char kLuaChunkStart[] = "\x1bLua\x54";

// The protocol layer cannot see the API's source limit; the two must stay one size.
static_assert(protocol::kMaxBytecodeSize == kMaxSourceSize);

}  // namespace

Compiler::Compiler(uv_loop_t* loop, const ThreadRole& loop_role, const Log* log,
                   const ScriptRegistry* registry, CompilerOptions opts, std::function<void()> wake,
                   std::function<void()> freed)
    : loop_(loop),
      loop_role_(loop_role),
      log_(log),
      registry_(registry),
      opts_(std::move(opts)),
      wake_(std::move(wake)),
      freed_(std::move(freed)),
      policy_(-1, opts_.restart),
      account_(std::make_shared<std::atomic<int64_t>>(0)) {
  uv_timer_init(loop_, &deadline_);
  deadline_.data = this;
  uv_timer_init(loop_, &restart_);
  restart_.data = this;
}

Compiler::~Compiler() = default;

void Compiler::enqueue(const ScriptRecord& r) {
  bool first;
  {
    MutexLock lock(mu_);
    first = incoming_.empty();
    incoming_.push_back({r.id, r.serial, false, nullptr});
    idle_pub_.store(false, std::memory_order_release);
  }
  if (first) wake_();
}

void Compiler::check(std::string source, std::string chunk_name, CheckDone done) {
  Pending p;
  p.check =
      std::make_shared<Check>(Check{std::move(source), std::move(chunk_name), std::move(done)});
  bool first;
  {
    MutexLock lock(mu_);
    first = incoming_.empty();
    incoming_.push_back(std::move(p));
    idle_pub_.store(false, std::memory_order_release);
  }
  if (first) wake_();
}

void Compiler::run_verdicts() {
  // Their `done` may call into the host (register, check again): nothing of ours is in use.
  auto v = std::move(verdicts_);
  verdicts_.clear();
  for (auto& [c, e] : v) c->done(std::move(e));
}

void Compiler::answer_queued_checks(const std::string& why) {
  auto answer = [&](auto& pendings) {
    loop_role_.assert_here();  // run here (the analysis does not carry the role into a lambda)
    for (auto it = pendings.begin(); it != pendings.end();)
      if (it->check) {
        verdict(*it, Error{ErrorCode::unavailable, why});
        it = pendings.erase(it);
      } else {
        ++it;
      }
  };
  answer(queue_);
  answer(singles_);
}

Error Compiler::start() {
  SpawnSpec spec = opts_.spawn;
  spec.args.push_back("--compile-only");
  spec.args.push_back("1");
  WorkerProcess* w = nullptr;
  // Only the loop writes to it: a full socket is finished by the loop's writable poll.
  if (Error e = WorkerProcess::spawn(
          loop_, nullptr, this, log_, spec,
          [this] {
            loop_role_.assert_here();
            if (process_) process_->watch_writable();
          },
          &w))
    return e;
  process_ = w;
  if (phase_ != Phase::kCrashLoop) phase_ = Phase::kStarting;  // a crash loop ends at a hello
  pid_pub_.store(w->pid(), std::memory_order_relaxed);
  // Its hello has the deadline of a Compile frame: a process stuck before it is killed too.
  uv_timer_start(&deadline_, &Compiler::on_deadline, static_cast<uint64_t>(opts_.deadline.count()),
                 0);
  if (starts_++ > 0) counters_.restarts.fetch_add(1, std::memory_order_relaxed);
  return {};
}

void Compiler::pump() {
  loop_role_.assert_here();
  {
    MutexLock lock(mu_);
    queue_.insert(queue_.end(), incoming_.begin(), incoming_.end());
    incoming_.clear();
  }
  if (phase_ == Phase::kStopped)
    answer_queued_checks("cannot check the source: the host is shutting down");
  else if (phase_ == Phase::kCrashLoop)
    answer_queued_checks(
        "cannot check the source: the compile-only process keeps failing (crash loop)");
  send_next();
  publish();
  run_verdicts();
}

void Compiler::publish() {
  pid_pub_.store(process_ ? process_->pid() : 0, std::memory_order_relaxed);
  MutexLock lock(mu_);
  idle_pub_.store(incoming_.empty() && in_flight_.empty() && singles_.empty() && queue_.empty(),
                  std::memory_order_release);
}

std::size_t Compiler::cached_bytes() const {
  return static_cast<std::size_t>(std::max<int64_t>(0, account_->load()));
}

// Copies what the Compile frame needs of `p`'s record, if it is alive, registered, without
// bytecode, and the cache has room; the reference taken for that is dropped at once.
void Compiler::take(const Pending& p, std::size_t* bytes) {
  if (p.check) {  // checked whatever the cache holds: nothing of it is kept
    *bytes += p.check->source.size();
    in_flight_.push_back({p, p.check->source, p.check->chunk_name});
    return;
  }
  const Script s = registry_->acquire(p.id, p.serial);
  if (!s.valid()) return;
  const ScriptRecord* r = detail::record_of(s);
  if (r->unregistered.load(std::memory_order_relaxed) ||
      r->compiled.load(std::memory_order_relaxed))
    return;
  if (cached_bytes() >= opts_.cache_bytes) {
    counters_.refused.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  *bytes += r->source.size();
  in_flight_.push_back({p, r->source, r->chunk_name});
}

void Compiler::send_next() {
  if (phase_ != Phase::kReady || !in_flight_.empty()) return;
  std::size_t bytes = 0;
  // One at a time after a failure, so that a script that breaks the process is found alone.
  while (in_flight_.empty() && !singles_.empty()) {
    const Pending p = singles_.back();
    singles_.pop_back();
    take(p, &bytes);
  }
  if (in_flight_.empty())
    while (!queue_.empty() && in_flight_.size() < kBatchItems && bytes < kBatchBytes) {
      take(queue_.front(), &bytes);
      queue_.pop_front();
    }
  if (in_flight_.empty()) return;
  std::vector<protocol::CompileRequest> reqs;
  reqs.reserve(in_flight_.size());
  for (std::size_t i = 0; i < in_flight_.size(); ++i)
    reqs.push_back({static_cast<uint32_t>(i), in_flight_[i].source, in_flight_[i].chunk_name});
  flatbuffers::FlatBufferBuilder fbb(bytes + 1024 * in_flight_.size() + 1024);
  const auto frame = protocol::encode_compile(fbb, reqs);
  if (process_->writer()->write(frame) == protocol::FrameWriter::State::kClosed) {
    fail("its socket is closed", DeathCause::kProtocol);
    return;
  }
  const auto ms = static_cast<uint64_t>(opts_.deadline.count() +
                                        kPerItemMs * static_cast<int64_t>(in_flight_.size()));
  uv_timer_start(&deadline_, &Compiler::on_deadline, ms, 0);
}

void Compiler::on_worker_created(WorkerProcess*) {
  loop_role_.assert_here();
  ++live_;
}

void Compiler::on_worker_freed(WorkerProcess*) {
  loop_role_.assert_here();
  if (--live_ == 0 && phase_ == Phase::kStopped && freed_) freed_();
}

void Compiler::on_worker_exit(WorkerProcess* w) {
  loop_role_.assert_here();
  if (w != process_) return;  // an earlier process, already given up
  const auto& x = *w->exit_status();
  fail(platform::describe_exit(x.code, x.signal), x.cause());
}

void Compiler::on_worker_stream_error(WorkerProcess* w) {
  loop_role_.assert_here();
  if (w == process_) w->end_stream(kLingerMs);  // its exit status names the cause
}

void Compiler::on_worker_linger_expired(WorkerProcess* w) {
  loop_role_.assert_here();
  if (w == process_) {
    fail("closed its stream and did not exit", DeathCause::kProtocol);
  } else {
    w->mark_dead();
    w->close_io();
  }
}

void Compiler::on_worker_writable(WorkerProcess* w) {
  loop_role_.assert_here();
  if (w != process_) return;
  switch (w->writer()->flush_from_loop()) {
    case protocol::FrameWriter::Flush::kMore:
      return;
    case protocol::FrameWriter::Flush::kClosed:
      w->end_stream(kLingerMs);
      return;
    case protocol::FrameWriter::Flush::kDone:
      w->unwatch_writable();
      return;
  }
}

void Compiler::on_worker_readable(WorkerProcess* w) {
  loop_role_.assert_here();
  if (w != process_) return;
  const long n = w->read_results();
  if (n == 0) {
    w->end_stream(kLingerMs);
    return;
  }
  if (n < 0) {
    if (n == -EAGAIN || n == -EWOULDBLOCK || n == -EINTR) return;
    fail(std::string("read failed: ") + std::strerror(static_cast<int>(-n)), DeathCause::kProtocol);
    return;
  }
  handle_frames();
  run_verdicts();
}

void Compiler::handle_frames() {
  protocol::FrameView fv;
  while (process_ && process_->reader().next(fv)) {
    std::string why;
    switch (fv.frame->body_type()) {
      case wire::Body::Hello: {
        protocol::WorkerMessage m;
        if (phase_ == Phase::kReady) {
          why = "said hello twice";
        } else if (protocol::decode_worker_frame(fv.frame, &m, &why)) {
          phase_ = Phase::kReady;  // out of a crash loop, too
          uv_timer_stop(&deadline_);
          process_->greet();
          send_next();
          continue;
        }
        break;
      }
      case wire::Body::Compiled:
        if (phase_ != Phase::kReady) {
          why = "answered before its hello";
        } else if (accept(fv.frame->body_as_Compiled(), &why)) {
          uv_timer_stop(&deadline_);
          in_flight_.clear();
          send_next();
          continue;
        }
        break;
      default:
        why = std::string("sent a frame it may not send (") +
              wire::EnumNameBody(fv.frame->body_type()) + ")";
        break;
    }
    fail("broke the protocol: " + why, DeathCause::kProtocol);
    return;
  }
  if (process_ && process_->reader().error() != protocol::FrameError::kNone)
    fail(std::string("broke the protocol: ") + protocol::to_string(process_->reader().error()),
         DeathCause::kProtocol);
  publish();
}

// Every item is checked before any is kept: a frame that breaks a rule anywhere comes from a
// process that is not doing what it should, and none of its bytecode is used.
bool Compiler::accept(const wire::Compiled* c, std::string* why) {
  const auto* items = c->items();
  const std::size_t n = items ? items->size() : 0;
  if (in_flight_.empty()) {
    *why = "answered a Compile frame it was not sent";
    return false;
  }
  if (n != in_flight_.size()) {
    *why =
        "answered " + std::to_string(n) + " of " + std::to_string(in_flight_.size()) + " sources";
    return false;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const wire::CompiledItem* item = items->Get(static_cast<flatbuffers::uoffset_t>(i));
    if (item->ticket() != i) {
      *why = "answered out of order (ticket " + std::to_string(item->ticket()) + " at " +
             std::to_string(i) + ")";
      return false;
    }
    switch (item->status()) {
      case wire::Status::Ok: {
        const auto* code = item->bytecode();
        if (!code || code->size() < sizeof kLuaChunkStart ||
            std::memcmp(code->data(), kLuaChunkStart, sizeof kLuaChunkStart - 1) != 0) {
          *why = "sent something that is not a Lua 5.4 binary chunk";
          return false;
        }
        break;
      }
      case wire::Status::CompileError:
      case wire::Status::MemoryLimit:
        break;
      default:
        *why = "sent status " + std::to_string(static_cast<int>(item->status()));
        return false;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    const wire::CompiledItem* item = items->Get(static_cast<flatbuffers::uoffset_t>(i));
    if (in_flight_[i].name.check) {
      // Only a CompileError is a verdict against it; MemoryLimit is this process's own limit.
      Error e;
      if (item->status() == wire::Status::CompileError)
        e = Error{ErrorCode::compile_error,
                  item->error() ? item->error()->str() : std::string("does not compile")};
      verdict(in_flight_[i].name, std::move(e));
      continue;
    }
    if (item->status() != wire::Status::Ok ||
        item->bytecode()->size() > protocol::kMaxBytecodeSize ||
        cached_bytes() + item->bytecode()->size() > opts_.cache_bytes) {
      // A source that does not compile is sent as it is: the worker gives its error, as always.
      counters_.refused.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const Script s = registry_->acquire(in_flight_[i].name.id, in_flight_[i].name.serial);
    if (!s.valid()) continue;  // freed while it compiled
    const ScriptRecord* r = detail::record_of(s);
    auto* chunk =
        new CompiledChunk(std::string(reinterpret_cast<const char*>(item->bytecode()->data()),
                                      item->bytecode()->size()),
                          account_);
    const CompiledChunk* none = nullptr;
    if (r->compiled.compare_exchange_strong(none, chunk, std::memory_order_release,
                                            std::memory_order_relaxed))
      counters_.compiled.fetch_add(1, std::memory_order_relaxed);
    else
      delete chunk;
  }
  return true;
}

void Compiler::fail(const std::string& why, DeathCause cause) {
  WorkerProcess* w = process_;
  if (!w) return;  // none, or shut down (shutdown() lets the process go itself)
  process_ = nullptr;
  if (phase_ != Phase::kCrashLoop) phase_ = Phase::kDown;
  uv_timer_stop(&deadline_);
  const Death death = w->death(cause, why, Clock::now());
  w->mark_dead();  // SIGKILL to its group unless it was reaped
  if (cause == DeathCause::kProtocol) counters_.kills.fetch_add(1, std::memory_order_relaxed);
  w->close_io();
  (*log_)(LogLevel::warn, "outrun: the compile-only process {} {}", w->pid(), why);
  // Its frame again, one script at a time; a script in two failed frames keeps its source path
  // (a frame of one can fail for reasons of its own: a deadline under load, a kill from outside).
  const bool alone = in_flight_.size() == 1;
  for (auto it = in_flight_.rbegin(); it != in_flight_.rend(); ++it) {
    if (alone && it->name.retry && it->name.check) {
      verdict(it->name, Error{ErrorCode::unavailable,
                              "cannot check the source: the compile-only process failed on it "
                              "twice"});
      continue;
    }
    if (alone && it->name.retry) {
      counters_.refused.fetch_add(1, std::memory_order_relaxed);
      (*log_)(LogLevel::warn,
              "outrun: script '{}' is not compiled ahead (the compile-only process failed on "
              "it twice); its workers compile its source",
              it->chunk_name);
      continue;
    }
    Pending again = it->name;
    again.retry = true;
    singles_.push_back(std::move(again));
  }
  in_flight_.clear();
  publish();
  run_verdicts();
  schedule_restart(policy_.on_death(death, Clock::now()));
}

// The shards' restart policy: backoff after quick crashes, and a crash loop (a cool-down, then a
// new try) for a process that keeps failing or cannot run at all (an outrun-worker that does not
// know --compile-only exits with the usage code). Until then new scripts wait in the queue, and
// the workers compile every source they are sent.
void Compiler::schedule_restart(const RestartDecision& d) {
  apply_restart(&restart_, &Compiler::on_restart, d, [&](const std::string&) {
    loop_role_.assert_here();  // run here (the analysis does not carry the role into a lambda)
    (*log_)(LogLevel::error,
            "outrun: the compile-only process keeps failing; the next one starts in {} ms "
            "(meanwhile the workers compile every source)",
            d.delay.count());
    // A check does not wait for the cool-down: it is answered `unavailable` until a hello.
    phase_ = Phase::kCrashLoop;
    answer_queued_checks(
        "cannot check the source: the compile-only process keeps failing (crash loop)");
    run_verdicts();
  });
}

void Compiler::start_or_retry() {
  if (phase_ == Phase::kStopped || process_) return;
  if (Error e = start()) {
    (*log_)(LogLevel::warn, "outrun: cannot start the compile-only process: {}", e.message);
    if (phase_ != Phase::kCrashLoop) phase_ = Phase::kDown;
    schedule_restart(policy_.on_start_failure(e.message, Clock::now()));
  }
}

void Compiler::on_deadline(uv_timer_t* t) {
  auto* self = static_cast<Compiler*>(t->data);
  self->loop_role_.assert_here();
  self->fail("did not answer in time and was killed", DeathCause::kProtocol);
}

void Compiler::on_restart(uv_timer_t* t) {
  auto* self = static_cast<Compiler*>(t->data);
  self->loop_role_.assert_here();
  self->start_or_retry();
}

void Compiler::shutdown() {
  loop_role_.assert_here();
  if (phase_ == Phase::kStopped) return;
  phase_ = Phase::kStopped;
  uv_timer_stop(&deadline_);
  uv_timer_stop(&restart_);
  uv_close(reinterpret_cast<uv_handle_t*>(&deadline_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&restart_), nullptr);
  // It runs nobody's code and holds nothing worth finishing: killed, like a worker past its
  // shutdown timeout. Its handles close as it exits.
  if (WorkerProcess* w = process_) {
    process_ = nullptr;
    w->mark_dead();
    w->close_io();
  }
  {
    MutexLock lock(mu_);
    queue_.insert(queue_.end(), incoming_.begin(), incoming_.end());
    incoming_.clear();
  }
  for (const auto& f : in_flight_)
    if (f.name.check) verdict(f.name, Error{ErrorCode::unavailable, "the host is shutting down"});
  answer_queued_checks("cannot check the source: the host is shutting down");
  in_flight_.clear();
  singles_.clear();
  queue_.clear();
  run_verdicts();
}

}  // namespace outrun::detail

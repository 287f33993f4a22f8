// outrun::Host: life cycle and the public API. See host_impl.h for the threads.
#include "outrun/host.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>

#include "host_impl.h"

#ifndef OUTRUN_INSTALLED_WORKER
#define OUTRUN_INSTALLED_WORKER "/usr/local/libexec/outrun/outrun-worker"
#endif

namespace outrun {

using detail::Completion;
using detail::Shard;

static_assert(static_cast<int>(Status::invalid_argument) ==
              static_cast<int>(wire::Status::InvalidArgument));
static_assert(static_cast<int>(Status::ok) == static_cast<int>(wire::Status::Ok));
static_assert(static_cast<int>(Status::killed) == static_cast<int>(wire::Status::Killed));

}  // namespace outrun

// Defined in programs built against an installed package (find_package(outrun) compiles the
// package's package_worker.cpp into them): that package's worker. Absent (null) otherwise.
#ifndef _WIN32
extern "C" __attribute__((weak)) const char* outrun_package_worker();
#endif

namespace outrun {
namespace {

// The worker: HostOptions::worker_path, else $OUTRUN_WORKER, else next to the executable, else
// the installed package's, else the build's install prefix.
std::string find_worker(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (const char* env = std::getenv("OUTRUN_WORKER"); env && *env) return env;
  if (const std::string self = platform::executable_path(); !self.empty()) {
    auto next_to = std::filesystem::path(self).parent_path() / platform::worker_file_name();
    if (platform::check_executable(next_to.string()).empty()) return next_to.string();
  }
#ifndef _WIN32
  if (outrun_package_worker) return outrun_package_worker();
#endif
  return OUTRUN_INSTALLED_WORKER;
}

}  // namespace

Error Host::Impl::start() {
  worker_path = find_worker(opts.worker_path);
  if (std::string why = platform::check_executable(worker_path); !why.empty())
    return {ErrorCode::invalid_argument,
            "worker executable '" + worker_path + "' is not executable: " + why};
  if (opts.worker_large_pages) {
    // mimalloc reads its options once, when the worker process loads it: only the environment
    // it starts with can switch large OS pages on.
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "MIMALLOC_LARGE_OS_PAGES=", 24) != 0)
        worker_env_strings.emplace_back(*e);
    worker_env_strings.emplace_back("MIMALLOC_LARGE_OS_PAGES=1");
    for (auto& s : worker_env_strings) worker_env.push_back(s.data());
    worker_env.push_back(nullptr);
  }
  timeout_us = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(opts.timeout).count());
  uv_loop_init(&loop);
  loop.data = this;
  uv_async_init(&loop, &wakeup, &Impl::on_wakeup);
  wakeup.data = this;
  {
    MutexLock lock(wakeup_mu);
    wakeup_open = true;
  }
  uv_timer_init(&loop, &shutdown_timer);
  registry.set_on_retire([this] { wake(); });  // the loop sends Forget (flush_forgets)
  detail::RestartConfig restart;
  restart.restart_delay = opts.restart_delay;
  restart.max_restart_delay = kMaxRestartDelay;
  restart.healthy_uptime = kHealthyUptime;
  restart.crash_loop_limit = opts.crash_loop_limit;
  restart.crash_loop_window = opts.crash_loop_window;
  restart.crash_loop_cooldown = opts.crash_loop_cooldown;
  restart.retries = opts.retries;
  restart.timeout = opts.timeout;
  restart.grace = opts.grace;
  for (int i = 0; i < opts.shards + (lane >= 0 ? 1 : 0); ++i) {
    auto sh = std::make_unique<Shard>(i, loop_role);
    sh->dispatcher = std::make_unique<detail::Dispatcher>(log);
    shards.push_back(std::move(sh));
  }
  // Its timers are initialised here, before the loop thread runs, and closed by it at the end.
  supervisor = std::make_unique<detail::Supervisor>(
      &loop, loop_role, log,
      detail::Supervisor::Config{opts.timeout, opts.grace, opts.silence_limit, restart}, shards,
      stopping, reader, quarantine, slow, started, *this);
  if (opts.bytecode_cache_bytes > 0) {
    detail::CompilerOptions co;
    co.spawn = worker_spec(-1);
    co.cache_bytes = opts.bytecode_cache_bytes;
    co.deadline = std::chrono::milliseconds(2000);
    co.restart = restart;
    compiler = std::make_unique<detail::Compiler>(
        &loop, loop_role, &log, &registry, std::move(co), [this] { wake(); },
        [this] {
          loop_role.assert_here();
          maybe_finish_shutdown();
        });
  }
  // Workers are spawned by the loop thread, always: PR_SET_PDEATHSIG follows the thread that
  // forked, and the loop thread lives exactly as long as the host.
  loop_thread = std::thread([this] {
    loop_role.bind_to_current_thread();
    loop_role.assert_here();
    for (auto& sh : shards) {
      if (Error e = spawn(*sh)) {
        MutexLock lock(started.mu);
        started.error = e.message;
        started.cv.notify_all();
        break;
      }
    }
    // Not waited for: until its hello, new scripts go to the workers with their source.
    if (compiler) compiler->start_first();
    run_loop();
  });
  MutexLock lock(started.mu);
  const bool ready = started.cv.wait_until(
      started.mu, std::chrono::steady_clock::now() + opts.start_timeout,
      [&]() REQUIRES(started.mu) {
        return started.hellos >= static_cast<int>(shards.size()) || !started.error.empty();
      });
  if (!started.error.empty()) return {ErrorCode::unavailable, started.error};
  if (!ready) return {ErrorCode::unavailable, "workers did not say hello within the start timeout"};
  return {};
}

void Host::Impl::shutdown() {
  // Records freed from now on (handles that outlive the host included) wake nothing.
  registry.set_on_retire({});
  if (!loop_thread.joinable()) {  // start() failed before the loop ran
    if (loop.data) uv_loop_close(&loop);
    return;
  }
  {
    // Under the mutex post() checks it with: a function posted after this is refused, one posted
    // before runs on the loop before the shutdown begins (on_wakeup).
    MutexLock lock(commands_mu);
    stopping.store(true);
  }
  wake();
  loop_thread.join();
  if (int rc = uv_loop_close(&loop); rc != 0)
    log(LogLevel::error, "outrun: loop closed with handles open: {}", uv_strerror(rc));
  // Every dispatcher runs what is queued and joins before any shard is destroyed: a last
  // callback may still submit (it gets `cancelled`) to any shard.
  for (auto& sh : shards) sh->dispatcher->stop_and_join();
  // Every evaluation has ended: wait for the threads still inside a future's wait to leave.
  future_gate->close();
  supervisor.reset();  // its per-shard state names the shards
  shards.clear();
  compiler.reset();
}

Error validate(const HostOptions& options) {
  if (options.shards < 1 || options.shards > 64)
    return {ErrorCode::invalid_argument, "shards must be 1..64"};
  if (options.timeout.count() <= 0)
    return {ErrorCode::invalid_argument, "timeout must be positive"};
  if (options.grace.count() < 0) return {ErrorCode::invalid_argument, "grace must not be negative"};
  if (options.memory_limit < (256u << 10))
    return {ErrorCode::invalid_argument,
            "memory_limit must be at least 256 KiB (the sandbox's libraries need it)"};
  if (options.worker_script_budget < (1u << 20))
    return {ErrorCode::invalid_argument,
            "worker_script_budget must be at least 1 MiB (a bare script state costs ~29 KB)"};
  if (options.heartbeat_interval.count() <= 0 ||
      options.silence_limit <= options.heartbeat_interval)
    return {ErrorCode::invalid_argument,
            "heartbeat_interval must be positive and below silence_limit"};
  if (options.retries < 0 || options.retries > 10)
    return {ErrorCode::invalid_argument, "retries must be 0..10"};
  if (options.crash_loop_limit < 1)
    return {ErrorCode::invalid_argument, "crash_loop_limit must be at least 1"};
  if (options.quarantine_after < 1 || options.quarantine_after > 1000)
    return {ErrorCode::invalid_argument, "quarantine_after must be 1..1000"};
  if (options.quarantine_cooldown.count() <= 0)
    return {ErrorCode::invalid_argument, "quarantine_cooldown must be positive"};
  if (options.worker_address_space_limit != 0 && options.worker_address_space_limit < (64u << 20))
    return {ErrorCode::invalid_argument,
            "worker_address_space_limit must be 0 (none) or at least 64 MiB"};
  if (options.max_script_bytes == 0)
    return {ErrorCode::invalid_argument, "max_script_bytes must be positive"};
  if (options.busy_poll.count() < 0 || options.busy_poll > std::chrono::milliseconds(10))
    return {ErrorCode::invalid_argument, "busy_poll must be 0..10 ms"};
  if (options.slow_lane_release_after < 1 || options.slow_lane_release_after > 10000)
    return {ErrorCode::invalid_argument, "slow_lane_release_after must be 1..10000"};
  if (options.slow_lane_max_in_flight < 1 || options.slow_lane_max_in_flight > 100000)
    return {ErrorCode::invalid_argument, "slow_lane_max_in_flight must be 1..100000"};
  return {};
}

Error Host::create(const HostOptions& options, std::unique_ptr<Host>* out) {
  out->reset();
  if (Error err = validate(options)) return err;
  auto impl = std::make_unique<Impl>(options);
  if (Error err = impl->start()) {
    impl->shutdown();
    return err;
  }
  out->reset(new Host(std::move(impl)));
  return {};
}

Host::Host(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Host::~Host() {
  impl_->shutdown();
}

Error Host::register_script(std::string_view key, std::string_view source, Script* out) {
  return register_script(key, source, out, AdmitFn{});
}

Error Host::register_script(std::string_view key, std::string_view source, Script* out,
                            const RegisterOptions& options) {
  *out = Script();
  if (options.check) {
    if (on_loop_thread())
      return Error{ErrorCode::invalid_argument,
                   "register_script with check waits for the compile-only process: not on the "
                   "loop thread (check_source does not wait)"};
    auto verdict = std::make_shared<std::promise<Error>>();
    std::future<Error> f = verdict->get_future();
    check_source(key, source, [verdict](Error e) { verdict->set_value(std::move(e)); });
    // The compiler answers every check (its deadline kills a process that does not); this bound
    // only keeps a caller from waiting on a host that went away.
    if (f.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
      return Error{ErrorCode::unavailable, "cannot check the source: no verdict in 30 s"};
    Error e;
    try {
      e = f.get();
    } catch (const std::future_error&) {  // dropped uncalled: shutting down
      e = Error{ErrorCode::unavailable, "cannot check the source: the host is shutting down"};
    }
    if (e) return e;
  }
  return register_script(key, source, out, AdmitFn{});
}

void Host::check_source(std::string_view key, std::string_view source,
                        std::function<void(Error)> done) {
  detail::Compiler* compiler = impl_->compiler.get();
  Error e;  // ok: a bad key or source is the registration's to refuse, not the check's
  const bool checkable =
      !key.empty() && key.size() <= kMaxKeySize && source.size() <= kMaxSourceSize;
  if (checkable && compiler) {
    compiler->check(std::string(source), std::string(chunk_name_of(key)), std::move(done));
    return;
  }
  if (checkable)
    e = Error{ErrorCode::unavailable,
              "cannot check the source: no compile-only process "
              "(HostOptions::bytecode_cache_bytes is 0)"};
  post_to_loop(
      [done = std::move(done), e = std::move(e)](uv_loop_s*) mutable { done(std::move(e)); });
}

Error Host::register_script(std::string_view key, std::string_view source, Script* out,
                            const AdmitFn& admit) {
  detail::Compiler* compiler = impl_->compiler.get();
  return impl_->registry.add(
      key, source, out,
      [compiler](detail::ScriptRecord& r) {
        if (compiler) compiler->enqueue(r);  // its own lock, after the registry's
      },
      admit);
}

CompilerStats Host::compiler_stats() const {
  CompilerStats s;
  const detail::Compiler* c = impl_->compiler.get();
  s.idle = c == nullptr || c->idle();
  if (!c) return s;
  s.pid = c->pid();
  s.compiled = c->counters().compiled.load(std::memory_order_relaxed);
  s.refused = c->counters().refused.load(std::memory_order_relaxed);
  s.restarts = c->counters().restarts.load(std::memory_order_relaxed);
  s.kills = c->counters().kills.load(std::memory_order_relaxed);
  s.cached_bytes = c->cached_bytes();
  return s;
}

Error Host::unregister_script(std::string_view key) {
  return impl_->registry.remove(key);
}

RegistryStats Host::registry_stats() const {
  return impl_->registry.stats();
}

ScriptCrashStats Host::script_crashes(const Script& script) const {
  ScriptCrashStats s;
  const detail::ScriptRecord* r = detail::record_of(script);
  if (!r || r->owner != impl_.get()) return s;
  s.crashes = r->crashes.load(std::memory_order_relaxed);
  s.slow_lane = r->slow.load(std::memory_order_relaxed);
  if (in_quarantine(*r)) {
    s.quarantined = true;
    s.quarantine_left_ms = std::max<int64_t>(
        0, (r->quarantined_until_ns.load(std::memory_order_relaxed) - monotonic_ns()) / 1'000'000);
  }
  return s;
}

void Host::evaluate(const Script& script, Inputs inputs, Callback done) {
  impl_->submit(script, std::move(inputs), Completion(std::move(done)));
}

Future Host::evaluate(const Script& script, Inputs inputs) {
  const detail::ScriptRecord* r = detail::record_of(script);
  Shard& sh = r && r->owner == impl_.get() ? impl_->route(*r) : *impl_->shards[0];
  auto state = std::make_shared<detail::HostFuture>(*impl_, sh);
  impl_->submit(script, std::move(inputs), Completion(state), {}, &sh);  // waits on that shard
  return Future(std::move(state));
}

Result Host::evaluate_sync(const Script& script, Inputs inputs) {
  return impl_->evaluate_sync(script, std::move(inputs));
}

void Host::evaluate_batch(std::vector<Request> requests, BatchCallback done) {
  impl_->submit_batch(std::move(requests), std::move(done));
}

int Host::shards() const {
  return static_cast<int>(impl_->shards.size());
}

int Host::slow_lane_shard() const {
  return impl_->lane;
}

int Host::shard_of(const Script& script) const {
  const detail::ScriptRecord* r = detail::record_of(script);
  return r && r->owner == impl_.get() ? impl_->route(*r).index : 0;
}

SlowLaneStats Host::slow_lane_stats() const {
  SlowLaneStats s;
  const Impl& h = *impl_;
  if (h.lane < 0) return s;
  s.shard = h.lane;
  s.moves_in = h.slow.moves_in();
  s.moves_out = h.slow.moves_out();
  // Each move is counted once, by the exchange that made it; read apart, they may cross.
  const uint64_t left = s.moves_out + h.registry.freed_slow();  // moved out, or freed there
  s.scripts = s.moves_in > left ? s.moves_in - left : 0;
  s.evaluations =
      h.shards[static_cast<std::size_t>(h.lane)]->evaluations.load(std::memory_order_relaxed);
  s.refused_full = h.slow.refused();
  return s;
}

bool Host::on_loop_thread() const {
  return impl_->on_loop_thread();
}

bool Host::post_to_loop(std::function<void(uv_loop_s*)> fn) {
  return impl_->post(std::move(fn));
}

ShardStats Host::shard_stats(int i) const {
  ShardStats s;
  if (i < 0 || i >= shards()) return s;
  Shard& sh = *impl_->shards[static_cast<std::size_t>(i)];
  auto rd = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  s.index = i;
  s.slow_lane = i == impl_->lane;
  s.state = detail::to_string(
      static_cast<detail::ShardState>(sh.public_state.load(std::memory_order_relaxed)));
  s.pid = sh.pid.load(std::memory_order_relaxed);
  if (const int64_t t = sh.worker_started_ns.load(std::memory_order_relaxed); s.pid > 0 && t > 0)
    s.uptime_ms = (monotonic_ns() - t) / 1'000'000;
  s.starts = rd(sh.starts);
  s.deaths = rd(sh.deaths);
  s.killed_overrun = rd(sh.by_cause[static_cast<int>(detail::DeathCause::kOverrun)]);
  s.killed_silence = rd(sh.by_cause[static_cast<int>(detail::DeathCause::kSilence)]);
  s.killed_requested = rd(sh.by_cause[static_cast<int>(detail::DeathCause::kRequested)]);
  s.crashed = rd(sh.by_cause[static_cast<int>(detail::DeathCause::kCrash)]);
  s.exited = rd(sh.by_cause[static_cast<int>(detail::DeathCause::kExit)]);
  s.protocol_violations = rd(sh.by_cause[static_cast<int>(detail::DeathCause::kProtocol)]);
  s.crashes_charged = rd(sh.crashes_charged);
  s.quarantine_refusals = rd(sh.quarantine_refusals);
  s.evaluations = rd(sh.evaluations);
  s.retried = rd(sh.retried);
  s.read_syscalls = rd(sh.reads);
  s.frames_read = rd(sh.frames);
  {
    MutexLock table_lock(sh.mu);
    s.in_flight = sh.table.in_use();
  }
  s.futures_left_to_caller = rd(sh.futures_left_to_caller);
  MutexLock lock(sh.stats_mu);
  s.last_death = sh.last_death;
  if (sh.stats_page) {
    const auto* p = static_cast<const protocol::StatusPage*>(sh.stats_page->get_address());
    s.worker_evaluations = rd(p->evaluations);
    s.worker_compiles = rd(p->compiles);
    s.worker_scripts = rd(p->scripts);
    s.worker_peak_script_bytes = rd(p->peak_script_bytes);
    s.worker_script_bytes = rd(p->script_bytes);
    s.worker_evictions = rd(p->evictions);
    s.worker_reloads = rd(p->reloads);
    s.worker_bytecode_loads = rd(p->bytecode_loads);
    s.worker_peak_rss_bytes = rd(p->peak_rss_bytes);
    if (s.pid > 0) s.worker_rss_bytes = platform::resident_bytes(s.pid);
    const int64_t beat = p->heartbeat_ns.load(std::memory_order_relaxed);
    if (beat > 0) s.heartbeat_age_ms = (monotonic_ns() - beat) / 1'000'000;
  }
  return s;
}

void Host::Impl::wake() {
  MutexLock lock(wakeup_mu);
  if (wakeup_open) uv_async_send(&wakeup);
}

namespace {
Error post_command(Host::Impl& impl, int shards, Host::Impl::CommandKind kind, int shard) {
  if (shard < 0 || shard >= shards)
    return {ErrorCode::invalid_argument, "no shard " + std::to_string(shard)};
  if (impl.stopping.load()) return {ErrorCode::unavailable, "the host is shutting down"};
  {
    MutexLock lock(impl.commands_mu);
    impl.commands.emplace_back(kind, shard);
  }
  impl.wake();
  return {};
}
}  // namespace

Error Host::kill_shard(int shard) {
  return post_command(*impl_, shards(), Impl::CommandKind::kKill, shard);
}

Error Host::restart_shard(int shard) {
  return post_command(*impl_, shards(), Impl::CommandKind::kRestart, shard);
}

std::vector<int> Host::worker_pids() const {
  std::vector<int> pids;
  for (auto& sh : impl_->shards) pids.push_back(sh->pid.load(std::memory_order_relaxed));
  return pids;
}

}  // namespace outrun

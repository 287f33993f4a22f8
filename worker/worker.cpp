#include "worker.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <lua.hpp>
#include <new>

#include "lua_values.h"
#include "outrun/protocol/messages.h"
#include "wire_values.h"

namespace outrun::worker {

namespace {
// Relaxed counters: the host reads them as statistics, never to decide anything.
void bump(std::atomic<uint64_t>* c) {
  if (c) c->fetch_add(1, std::memory_order_relaxed);
}
// TestFault::kEscape: what a script that broke out of Lua would try next. Each attempt must be
// stopped by confinement; if one ever returns, the worker says so loudly and exits 70, which no
// test accepts.
void attempt_escape(const wire::Evaluation* e) {
  const auto* inputs = e->inputs();
  if (!inputs) return;
  for (const wire::Input* in : *inputs) {
    if (in->name()->string_view() != "escape" || !in->value() || !in->value()->string_value())
      continue;
    const std::string_view what = in->value()->string_value()->string_view();
    spdlog::warn("test fault: trying '{}'", what);
    if (what == "open") {
      const int fd = ::open("/etc/hostname", O_RDONLY);
      spdlog::error("test fault: open returned {}", fd);
    } else if (what == "socket") {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      spdlog::error("test fault: socket returned {}", fd);
    } else if (what == "fork") {
      const pid_t pid = ::fork();
      if (pid == 0) _exit(0);
      spdlog::error("test fault: fork returned {}", pid);
    } else if (what == "exec") {
      char* const argv[] = {const_cast<char*>("/bin/true"), nullptr};
      ::execve("/bin/true", argv, nullptr);
      spdlog::error("test fault: execve returned");
    } else if (what == "mmap-exec") {
      void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      spdlog::error("test fault: mmap(PROT_EXEC) returned {}", p);
    } else if (what == "kill-host") {
      const int rc = ::kill(getppid(), SIGKILL);
      spdlog::error("test fault: kill returned {}", rc);
    } else if (what == "blow-up") {
      // Memory no script's account sees, touched so it is really used: the address-space
      // backstop makes an allocation fail, and operator new's bad_alloc ends the process.
      for (;;) {
        auto* p = new char[8u << 20];
        std::memset(p, 1, 8u << 20);
      }
    } else {
      continue;
    }
    std::fflush(stderr);
    _exit(exit_code(WorkerExit::kTestFault));
  }
}

// The value of the string input `name`, or "" (test faults only: a linear scan).
std::string_view string_input(const wire::Evaluation* e, std::string_view name) {
  if (!e->inputs()) return {};
  for (const wire::Input* in : *e->inputs())
    if (in->name()->string_view() == name && in->value() && in->value()->string_value())
      return in->value()->string_value()->string_view();
  return {};
}

// The soft timeout in nanoseconds. timeout_us comes from the host's frame and may be any u64:
// past 2^40 us (12.7 days) it is saturated, so that neither `* 1000` nor the deadline
// (start + timeout) can overflow int64 -- undefined behaviour that in practice put the
// deadline in the past (found with tests/fuzz; tests/protocol/fuzz_regressions_test.cpp).
int64_t timeout_ns(uint64_t timeout_us) {
  constexpr uint64_t kMaxTimeoutUs = uint64_t{1} << 40;
  return static_cast<int64_t>(std::min(timeout_us, kMaxTimeoutUs) * 1000);
}

}  // namespace

bool parse_test_faults(std::string_view list, uint32_t* faults, std::string* crash_on_source,
                       std::string* crash_at_start, std::string* err) {
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    const std::string_view name = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    constexpr std::string_view kCrash = "crash-at-start=";
    constexpr std::string_view kCrashOnSource = "crash-on-source=";
    if (name == "forget-scripts") {
      *faults |= kFaultForgetScripts;
    } else if (name == "need-source-loop") {
      *faults |= kFaultNeedSourceLoop;
    } else if (name == "escape") {
      *faults |= kFaultEscape;
    } else if (name == "garbage") {
      *faults |= kFaultGarbage;
    } else if (name.starts_with(kCrashOnSource) && name.size() > kCrashOnSource.size()) {
      *faults |= kFaultCrashOnSource;
      *crash_on_source = name.substr(kCrashOnSource.size());
    } else if (name.starts_with(kCrash) && name.size() > kCrash.size()) {
      *crash_at_start = name.substr(kCrash.size());
    } else {
      *err = "unknown test fault '" + std::string(name) +
             "' (forget-scripts, need-source-loop, escape, garbage, crash-on-source=MARKER, "
             "crash-at-start=PATH)";
      return false;
    }
  }
  return true;
}

Worker::Worker(const WorkerOptions& options) : opts_(options) {
  if (opts_.out_fd < 0) opts_.out_fd = opts_.fd;
  budget_.limit = opts_.script_budget;
  budget_.reclaim = &Worker::reclaim;
  budget_.reclaim_ctx = this;
  // Headroom: before an evaluation the idle states are brought down to budget - headroom, so
  // the running script can usually reach its own cap without the allocator evicting anything.
  // Half the budget at most, so that a cap near the budget does not evict everything each time.
  const std::size_t headroom = std::min(opts_.memory_limit, opts_.script_budget / 2);
  evict_above_ = opts_.script_budget - headroom;
}

void Worker::touch(Script* s) {
  if (lru_.next == s) return;
  s->prev->next = s->next;  // a new script links to itself: unlinking it changes nothing
  s->next->prev = s->prev;
  s->next = lru_.next;
  s->prev = &lru_;
  lru_.next->prev = s;
  lru_.next = s;
}

void Worker::drop_script(uint32_t id) {
  std::unique_ptr<Script>& slot = scripts_[id];
  slot->prev->next = slot->next;
  slot->next->prev = slot->prev;
  slot.reset();  // lua_close: no script code runs (a __gc is refused by setmetatable)
  if (opts_.page) opts_.page->scripts.fetch_sub(1, std::memory_order_relaxed);
}

bool Worker::evict_down_to(std::size_t target, const sandbox::MemoryAccount* keep) {
  LruLink* l = lru_.prev;
  while (budget_.used > target && l != &lru_) {
    auto* s = static_cast<Script*>(l);
    l = l->prev;
    if (s->state && &s->state->memory() == keep) continue;
    drop_script(s->id);
    bump(opts_.page ? &opts_.page->evictions : nullptr);
  }
  return budget_.used <= target;
}

// ScriptBudget::reclaim: the allocator of the state being built or run needs `bytes` more.
bool Worker::reclaim(void* self, const sandbox::MemoryAccount* asking, std::size_t bytes) {
  auto* w = static_cast<Worker*>(self);
  if (bytes > w->budget_.limit) return false;
  return w->evict_down_to(w->budget_.limit - bytes, asking);
}

bool Worker::write_all(const uint8_t* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(opts_.out_fd, data, size, MSG_NOSIGNAL);
    if (n > 0) {
      data += n;
      size -= static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      io_failed_ = true;
      return false;
    }
  }
  return true;
}

bool Worker::send_hello() {
  flatbuffers::FlatBufferBuilder fbb(128);
  const auto hello = protocol::encode_hello(fbb, static_cast<int32_t>(getpid()));
  return write_all(hello.data(), hello.size());
}

int Worker::run() {
  if (!send_hello()) return exit_code(WorkerExit::kIo);
  for (;;) {
    const long n = reader_.read_from(opts_.fd);
    if (n == 0) return exit_code(WorkerExit::kOk);  // the host closed its end
    if (n < 0) {
      spdlog::error("read from host failed: {}", std::strerror(static_cast<int>(-n)));
      return exit_code(WorkerExit::kIo);
    }
    protocol::FrameView fv;
    while (reader_.next(fv)) {
      handle(fv.frame);
      if (io_failed_) return exit_code(WorkerExit::kIo);
    }
    if (reader_.error() != protocol::FrameError::kNone) {
      spdlog::error("protocol violation from host: {}", protocol::to_string(reader_.error()));
      flush();
      return exit_code(WorkerExit::kProtocol);
    }
    if (!flush()) return exit_code(WorkerExit::kIo);
    if (shutdown_) return exit_code(WorkerExit::kOk);
    if (opts_.faults & kFaultForgetScripts) {
      for (uint32_t id = 0; id < scripts_.size(); ++id)
        if (scripts_[id]) drop_script(id);
    }
  }
}

void Worker::handle(const wire::Frame* frame) {
  protocol::HostMessage m;
  std::string why;
  // Hello/Results are not for a worker; ignore rather than die (forward compatibility).
  if (!protocol::decode_host_frame(frame, &m, &why)) return;
  switch (frame->body_type()) {
    case wire::Body::Evaluate: {
      const auto* items = std::get<protocol::EvaluateMsg>(m).items;
      if (!items) return;
      for (const wire::Evaluation* e : *items) {
        // One clock read per evaluation serves the batch-hold check, its start time (T counts
        // from it) and the status page. Checking before the next evaluation bounds a frame at
        // kFlushBytes + one result (< kMaxFrameSize); the batch's last results go out below.
        now_ns_ = sandbox::monotonic_ns();
        if (!results_.empty() &&
            (out_.GetSize() > kFlushBytes || now_ns_ - first_result_ns_ > kMaxResultHoldNs))
          flush();
        evaluate(e);
      }
      return;
    }
    case wire::Body::Shutdown:
      shutdown_ = true;
      return;
    case wire::Body::Forget: {
      // The host freed these scripts: drop their states. Ids it does not hold are ignored (a
      // state never compiled here, or one already dropped); any id may come back later with
      // other source, always behind this frame.
      const auto* ids = std::get<protocol::ForgetMsg>(m).script_ids;
      if (!ids) return;
      for (const uint32_t id : *ids)
        if (id < scripts_.size() && scripts_[id]) drop_script(id);
      if (opts_.page) opts_.page->script_bytes.store(budget_.used, std::memory_order_relaxed);
      return;
    }
    default:
      return;
  }
}

Worker::Script* Worker::script_for(const wire::Evaluation* e) {
  const uint32_t id = e->script_id();
  if (id >= kMaxScriptId) return nullptr;
  if (id >= scripts_.size()) scripts_.resize(id + 1);
  protocol::ScriptSource src;
  if (protocol::evaluation_source(e, &src)) {
    if (scripts_[id] && std::memcmp(scripts_[id]->sha256.data(), src.sha256.data(), 32) == 0)
      return scripts_[id].get();
    if (scripts_[id]) drop_script(id);  // other source: its old state makes room for the new one
    auto s = std::make_unique<Script>();
    s->id = id;
    std::memcpy(s->sha256.data(), src.sha256.data(), 32);
    std::string err;
    // Not linked yet: the budget's reclaim, which may run while it is built, cannot drop it.
    s->state = sandbox::ScriptState::create(opts_.memory_limit, &err, &budget_);
    if (!s->state) {
      s->compile_outcome = {wire::Status::MemoryLimit, err};
    } else {
      const std::string name =
          src.chunk_name ? "=" + std::string(*src.chunk_name) : std::string("=script");
      s->compile_outcome = s->state->compile(src.source, name);
    }
    if (opts_.page) {
      bump(&opts_.page->compiles);
      bump(&opts_.page->scripts);
    }
    scripts_[id] = std::move(s);
  }
  return scripts_[id].get();
}

void Worker::add_result(uint64_t id, wire::Status status, flatbuffers::Offset<wire::Value> value,
                        std::string_view error) {
  if (results_.empty()) first_result_ns_ = now_ns_;
  results_.push_back(protocol::build_result(out_, id, status, value, error));
}

void Worker::mark_running(uint64_t id) {
  if (protocol::StatusPage* page = opts_.page) {
    page->running_since_ns.store(now_ns_, std::memory_order_relaxed);
    page->running_id.store(id, std::memory_order_release);
  }
}

bool Worker::test_fault(const wire::Evaluation* e) {
  if (opts_.faults & kFaultNeedSourceLoop) {
    add_result(e->id(), wire::Status::NeedSource, 0, {});
    return true;
  }
  if (opts_.faults & kFaultEscape) {
    mark_running(e->id());  // so the host knows which evaluation was running when it died
    attempt_escape(e);
  }
  if (opts_.faults & kFaultGarbage) {
    if (const std::string_view what = string_input(e, "garbage"); !what.empty())
      return write_garbage(e, what);
  }
  if ((opts_.faults & kFaultCrashOnSource) && e->source() &&
      e->source()->string_view().find(opts_.crash_on_source) != std::string_view::npos) {
    flush();                // what came before is delivered: only `e` is the crash's suspect
    mark_running(e->id());  // so the host knows which evaluation was running when it died
    spdlog::warn("test fault: crashing on the source of evaluation {}", e->id());
    std::fflush(stderr);
    ::raise(SIGSEGV);
  }
  return false;
}

void Worker::evaluate(const wire::Evaluation* e) {
  protocol::StatusPage* page = opts_.page;
  if (opts_.faults != 0 && test_fault(e)) [[unlikely]]  // one compare when no fault is set
    return;
  Script* s = script_for(e);
  if (!s) {
    add_result(
        e->id(),
        e->script_id() >= kMaxScriptId ? wire::Status::InvalidArgument : wire::Status::NeedSource,
        0, e->script_id() >= kMaxScriptId ? "script id out of range" : "");
    return;
  }
  touch(s);
  if (s->compile_outcome.status != wire::Status::Ok) {
    if (page) {
      bump(&page->evaluations);
      bump(&page->errors);
    }
    add_result(e->id(), s->compile_outcome.status, 0, s->compile_outcome.error);
    return;
  }
  // The budget: idle states give way before the evaluation rather than inside its allocations.
  if (budget_.used > evict_above_) [[unlikely]]
    evict_down_to(evict_above_, &s->state->memory());
  mark_running(e->id());  // T counts from here, for the worker's soft deadline and the host's
  const auto outcome =
      s->state->run(sandbox::push_wire_inputs, e->inputs(), timeout_ns(e->timeout_us()), now_ns_);
  if (page) {
    page->running_id.store(0, std::memory_order_release);
    page->evaluations.fetch_add(1, std::memory_order_relaxed);
    page->script_bytes.store(budget_.used, std::memory_order_relaxed);
    const auto& mem = s->state->memory();
    if (mem.peak > page->peak_script_bytes.load(std::memory_order_relaxed))
      page->peak_script_bytes.store(mem.peak, std::memory_order_relaxed);
  }
  if (outcome.status != wire::Status::Ok) {
    if (page) {
      bump(&page->errors);
      if (outcome.status == wire::Status::Timeout) bump(&page->timeouts);
      if (outcome.status == wire::Status::MemoryLimit) bump(&page->memory_limits);
    }
    add_result(e->id(), outcome.status, 0, outcome.error);
    return;
  }
  lua_State* L = s->state->L();
  sandbox::WireValueBuilder builder(out_);
  sandbox::ResultConverter conv(L, builder);
  flatbuffers::Offset<wire::Value> value;
  const bool ok = conv.convert(lua_gettop(L), &value);
  lua_settop(L, 1);
  if (!ok) {
    if (page) bump(&page->errors);
    add_result(e->id(), wire::Status::RuntimeError, 0, conv.error());
    return;
  }
  add_result(e->id(), wire::Status::Ok, value, {});
}

// TestFault kFaultGarbage: writes the garbage, then stops serving and waits to be killed, so
// that when the host reads the garbage, `e` is still the evaluation its page says is running.
// Returns only for a kind it does not know (false: `e` is evaluated as usual).
bool Worker::write_garbage(const wire::Evaluation* e, std::string_view what) {
  const bool raw = what == "bad-length" || what == "bad-flatbuffer";
  if (!raw && what != "unknown-id" && what != "bad-status" && what != "unknown-status" &&
      what != "duplicate")
    return false;
  flush();  // what came before is delivered; the stream breaks after it
  mark_running(e->id());
  spdlog::warn("test fault: writing '{}' to the host", what);
  if (raw) {
    uint8_t bytes[4 + 24];
    std::memset(bytes, 0xAB, sizeof bytes);
    const uint32_t size = what == "bad-length" ? 0xFFFFFFF0u : 24u;  // little-endian prefix
    for (int i = 0; i < 4; ++i) bytes[i] = static_cast<uint8_t>(size >> (8 * i));
    write_all(bytes, sizeof bytes);
  } else {
    if (what == "unknown-id") {
      add_result(e->id() + (uint64_t{1} << 40), wire::Status::Ok, 0, {});
    } else if (what == "bad-status") {
      add_result(e->id(), wire::Status::Cancelled, 0, {});
    } else if (what == "unknown-status") {
      add_result(e->id(), static_cast<wire::Status>(200), 0, {});
    } else {
      add_result(e->id(), wire::Status::RuntimeError, 0, "test fault: the first of two answers");
      results_.push_back(results_.back());
    }
    flush();
  }
  std::fflush(stderr);
  for (;;) ::usleep(100'000);  // the host kills it for what it read
}

bool Worker::flush() {
  if (results_.empty()) return true;
  const auto frame = protocol::finish_results(out_, results_);
  const bool ok = write_all(frame.data(), frame.size());
  out_.Clear();
  results_.clear();
  return ok;
}

}  // namespace outrun::worker

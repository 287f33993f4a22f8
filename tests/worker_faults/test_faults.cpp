// outrun-test-worker's hooks (worker/hooks.h): the test faults. This file, linked with the
// worker's own sources, makes outrun-test-worker, built in bin/ next to outrun-worker and never
// installed; outrun-worker links worker/no_hooks.cpp instead and has none of this code.
//
// OUTRUN_TEST_FAULT in the worker's environment (inherited from the host or daemon; never set by
// outrun itself) is a comma-separated list of these names. They let the tests and `outrun drill`
// drive the host's recovery paths with a real worker (design/drills.md):
//
// - "forget-scripts": drop every compiled script after each batch -> NeedSource.
// - "need-source-loop": answer NeedSource to every evaluation, even with source.
// - "escape": an evaluation with a string input named "escape" first tries what it names, after
//   confinement: "open", "socket", "fork", "exec", "mmap-exec", "kill-host" (each must be killed
//   by the seccomp filter), or "blow-up" (allocates outside every script's account until the
//   address-space backstop makes it fail).
// - "garbage": an evaluation with a string input named "garbage" makes the worker write what it
//   names to the host, then stop serving until it is killed: "bad-length" (a size prefix past the
//   frame limit), "bad-flatbuffer" (a well-sized frame that fails verification), "unknown-id" (a
//   result for an evaluation it was never sent), "duplicate" (two answers to it, the first a
//   RuntimeError), "bad-status" (a status only the host may give), "unknown-status" (a status no
//   build of outrun knows), "shared-string" (a result that is an array of 512 items, each the
//   same 1 MiB string: 512 MiB to decode from a 1 MiB frame), "shared-keys" (a map of 512
//   entries whose keys are each that one string). The host must take each for a protocol
//   violation.
// - "crash-on-source=MARKER": an evaluation that carries a source containing MARKER (or bytecode
//   from the host's compile-only process containing it: a string constant of the script) makes
//   the worker raise SIGSEGV as it starts running it (the evaluation is on the status page), like
//   an interpreter bug the script reaches: the crash-attribution path. Every worker sees a source
//   it does not hold, so the crash repeats on each new worker.
// - "pool-stats": an evaluation with a string input named "pool" is answered, RuntimeError, with
//   the worker's spare and deferred-close counts ("pool spares=N closing=N made=N taken=N"),
//   touching no script: how tests/host/budget_test.cpp sees what idle time did.
// - "compiler-garbage": run as the host's compile-only process (--compile-only), it answers
//   every source that compiled with bytes that are no Lua chunk.
// - "crash-at-start=PATH": while PATH exists, the worker exits 70 before it says hello (a worker
//   that cannot start: the crash-loop path).
//
// An unknown name makes the worker exit 64 at start (a typo must not silently test nothing).
// Without OUTRUN_TEST_FAULT, outrun-test-worker behaves as outrun-worker does.
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "hooks.h"
#include "outrun/protocol/messages.h"
#include "outrun/protocol/worker_exit.h"
#include "worker.h"

namespace outrun::worker {

namespace {

enum Fault : uint32_t {
  kForgetScripts = 1u << 0,
  kNeedSourceLoop = 1u << 1,
  kEscape = 1u << 2,
  kGarbage = 1u << 3,
  kCrashOnSource = 1u << 4,
  kPoolStats = 1u << 5,
  kCompilerGarbage = 1u << 6,
};

// What OUTRUN_TEST_FAULT asked for; written once by start_hooks(), before any evaluation.
uint32_t g_faults = 0;
std::string g_crash_on_source;  // kCrashOnSource: the marker

// Parses OUTRUN_TEST_FAULT's list; false (with the offending name in *err) for a name it does
// not know.
bool parse(std::string_view list, std::string* crash_at_start, std::string* err) {
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    const std::string_view name = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    constexpr std::string_view kCrash = "crash-at-start=";
    constexpr std::string_view kCrashOnSourceName = "crash-on-source=";
    if (name == "forget-scripts") {
      g_faults |= kForgetScripts;
    } else if (name == "need-source-loop") {
      g_faults |= kNeedSourceLoop;
    } else if (name == "escape") {
      g_faults |= kEscape;
    } else if (name == "garbage") {
      g_faults |= kGarbage;
    } else if (name == "pool-stats") {
      g_faults |= kPoolStats;
    } else if (name == "compiler-garbage") {
      g_faults |= kCompilerGarbage;
    } else if (name.starts_with(kCrashOnSourceName) && name.size() > kCrashOnSourceName.size()) {
      g_faults |= kCrashOnSource;
      g_crash_on_source = name.substr(kCrashOnSourceName.size());
    } else if (name.starts_with(kCrash) && name.size() > kCrash.size()) {
      *crash_at_start = name.substr(kCrash.size());
    } else {
      *err = "unknown test fault '" + std::string(name) +
             "' (forget-scripts, need-source-loop, escape, garbage, pool-stats, "
             "compiler-garbage, crash-on-source=MARKER, crash-at-start=PATH)";
      return false;
    }
  }
  return true;
}

// The evaluation's inputs, from its nested InputList (protocol 2) or `inputs`; null: none.
const flatbuffers::Vector<flatbuffers::Offset<wire::Input>>* inputs_of(const wire::Evaluation* e) {
  const wire::InputList* list = nullptr;
  if (!outrun::protocol::evaluation_input_list(e, &list)) return nullptr;
  return list ? list->inputs() : e->inputs();
}

// The value of the string input `name`, or "" (a linear scan).
std::string_view string_input(const wire::Evaluation* e, std::string_view name) {
  const auto* inputs = inputs_of(e);
  if (!inputs) return {};
  for (const wire::Input* in : *inputs)
    if (in->name()->string_view() == name && in->value() && in->value()->string_value())
      return in->value()->string_value()->string_view();
  return {};
}

// "escape": what a script that broke out of Lua would try next. Each attempt must be stopped by
// confinement; if one ever returns, the worker says so loudly and exits 70, which no test
// accepts.
void attempt_escape(const wire::Evaluation* e) {
  const auto* inputs = inputs_of(e);
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
    _exit(protocol::exit_code(protocol::WorkerExit::kTestFault));
  }
}

// "garbage": writes the garbage, then stops serving and waits to be killed, so that when the
// host reads the garbage, `e` is still the evaluation its page says is running. Returns only
// for a kind it does not know (false: `e` is evaluated as usual).
bool write_garbage(Worker& w, const wire::Evaluation* e, std::string_view what) {
  const bool raw = what == "bad-length" || what == "bad-flatbuffer";
  const bool shared = what == "shared-string" || what == "shared-keys";
  if (!raw && !shared && what != "unknown-id" && what != "bad-status" && what != "unknown-status" &&
      what != "duplicate")
    return false;
  w.flush();  // what came before is delivered; the stream breaks after it
  w.mark_running(e->id());
  spdlog::warn("test fault: writing '{}' to the host", what);
  if (raw) {
    uint8_t bytes[4 + 24];
    std::memset(bytes, 0xAB, sizeof bytes);
    const uint32_t size = what == "bad-length" ? 0xFFFFFFF0u : 24u;  // little-endian prefix
    for (int i = 0; i < 4; ++i) bytes[i] = static_cast<uint8_t>(size >> (8 * i));
    w.write_raw(bytes, sizeof bytes);
  } else if (shared) {
    // One string, used 512 times: the frame verifies (each use is one check), and only a
    // decode that counts every use refuses it (D-result-budget).
    flatbuffers::FlatBufferBuilder fbb;
    const auto big = fbb.CreateString(std::string(1u << 20, 'x'));
    std::vector<flatbuffers::Offset<wire::Value>> items;
    flatbuffers::Offset<wire::Value> value;
    if (what == "shared-string") {
      items.assign(512, wire::CreateValue(fbb, wire::ValueKind::String, false, 0, 0.0, big));
      value = wire::CreateValue(fbb, wire::ValueKind::Array, false, 0, 0.0, 0, 0,
                                fbb.CreateVector(items));
    } else {
      items.assign(512, wire::CreateValue(fbb, wire::ValueKind::Nil));
      const std::vector<flatbuffers::Offset<flatbuffers::String>> keys(512, big);
      value = wire::CreateValue(fbb, wire::ValueKind::Map, false, 0, 0.0, 0, 0,
                                fbb.CreateVector(items), fbb.CreateVector(keys));
    }
    const flatbuffers::Offset<wire::Result> result =
        protocol::build_result(fbb, e->id(), wire::Status::Ok, value, {});
    const auto frame = protocol::finish_results(fbb, {&result, 1});
    w.write_raw(frame.data(), frame.size());
  } else {
    if (what == "unknown-id") {
      w.answer(e->id() + (uint64_t{1} << 40), wire::Status::Ok, {});
    } else if (what == "bad-status") {
      w.answer(e->id(), wire::Status::Cancelled, {});
    } else if (what == "unknown-status") {
      w.answer(e->id(), static_cast<wire::Status>(200), {});
    } else {
      w.answer(e->id(), wire::Status::RuntimeError, "test fault: the first of two answers");
      w.answer(e->id(), wire::Status::RuntimeError, "test fault: the first of two answers");
    }
    w.flush();
  }
  std::fflush(stderr);
  for (;;) ::usleep(100'000);  // the host kills it for what it read
}

bool on_evaluation(Worker& w, const wire::Evaluation* e) {
  if (g_faults & kNeedSourceLoop) {
    w.answer(e->id(), wire::Status::NeedSource, {});
    return true;
  }
  if (g_faults & kEscape) {
    w.mark_running(e->id());  // so the host knows which evaluation was running when it died
    attempt_escape(e);
  }
  if (g_faults & kGarbage) {
    if (const std::string_view what = string_input(e, "garbage"); !what.empty())
      return write_garbage(w, e, what);
  }
  if ((g_faults & kPoolStats) && !string_input(e, "pool").empty()) {
    const Worker::PoolCounts c = w.pool_counts();
    w.answer(e->id(), wire::Status::RuntimeError,
             "pool spares=" + std::to_string(c.spares) + " closing=" + std::to_string(c.closing) +
                 " made=" + std::to_string(c.made) + " taken=" + std::to_string(c.taken));
    return true;
  }
  const auto carries_marker = [e] {
    if (e->source())
      return e->source()->string_view().find(g_crash_on_source) != std::string_view::npos;
    if (!e->bytecode()) return false;
    const std::string_view code(reinterpret_cast<const char*>(e->bytecode()->data()),
                                e->bytecode()->size());
    return code.find(g_crash_on_source) != std::string_view::npos;
  };
  if ((g_faults & kCrashOnSource) && carries_marker()) {
    w.flush();                // what came before is delivered: only `e` is the crash's suspect
    w.mark_running(e->id());  // so the host knows which evaluation was running when it died
    spdlog::warn("test fault: crashing on the source of evaluation {}", e->id());
    std::fflush(stderr);
    ::raise(SIGSEGV);
  }
  return false;
}

void on_batch_done(Worker& w) {
  if (g_faults & kForgetScripts) w.drop_all_scripts();
}

// "compiler-garbage": the compile-only process sends bytes that are no Lua chunk for every
// source it compiled (a broken or subverted compiler): the host must refuse them all.
void on_compiled(std::string* bytecode) {
  if (g_faults & kCompilerGarbage) *bytecode = "garbage, not bytecode";
}

const Hooks kHooks{&on_evaluation, &on_batch_done, &on_compiled};

}  // namespace

const Hooks* start_hooks() {
  const char* fault = std::getenv("OUTRUN_TEST_FAULT");
  if (!fault || !*fault) return nullptr;
  std::string crash_at_start, err;
  if (!parse(fault, &crash_at_start, &err)) {
    spdlog::error("OUTRUN_TEST_FAULT: {}", err);
    std::fflush(stderr);
    _exit(protocol::exit_code(protocol::WorkerExit::kUsage));
  }
  spdlog::warn("test faults '{}' are enabled", fault);
  if (!crash_at_start.empty() && ::access(crash_at_start.c_str(), F_OK) == 0) {
    spdlog::warn("test fault: '{}' exists, so this worker dies at start", crash_at_start);
    std::fflush(stderr);
    _exit(protocol::exit_code(protocol::WorkerExit::kTestFault));
  }
  return g_faults != 0 ? &kHooks : nullptr;
}

}  // namespace outrun::worker

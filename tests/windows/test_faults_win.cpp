// outrun-test-worker.exe's hooks (worker/hooks.h) on Windows: the one test fault the Windows tests
// need, "crash-on-source=MARKER" (tests/worker_faults/test_faults.cpp has every fault, on POSIX).
// An evaluation whose source (or bytecode) contains MARKER makes the worker fault as an
// interpreter bug would: a write through a null pointer, an access violation the process dies of
// with STATUS_ACCESS_VIOLATION, which the host must charge to that script (quarantine). Another
// fault name makes the worker exit 64 at start.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "hooks.h"
#include "outrun/protocol/messages.h"
#include "outrun/protocol/worker_exit.h"
#include "worker.h"

namespace outrun::worker {

namespace {

std::string g_marker;

bool on_evaluation(Worker& w, const wire::Evaluation* e) {
  bool carries = false;
  if (e->source()) {
    carries = e->source()->string_view().find(g_marker) != std::string_view::npos;
  } else if (e->bytecode()) {
    const std::string_view code(reinterpret_cast<const char*>(e->bytecode()->data()),
                                e->bytecode()->size());
    carries = code.find(g_marker) != std::string_view::npos;
  }
  if (!carries) return false;
  w.flush();                // what came before is delivered: only `e` is the crash's suspect
  w.mark_running(e->id());  // the host reads which evaluation ran when it died
  spdlog::warn("test fault: crashing on the source of evaluation {}", e->id());
  std::fflush(stderr);
  *static_cast<volatile int*>(nullptr) = 1;  // STATUS_ACCESS_VIOLATION
  return true;
}

const Hooks kHooks{&on_evaluation, nullptr, nullptr};

}  // namespace

const Hooks* start_hooks() {
  const char* fault = std::getenv("OUTRUN_TEST_FAULT");
  if (!fault || !*fault) return nullptr;
  constexpr std::string_view kName = "crash-on-source=";
  const std::string_view f(fault);
  if (!f.starts_with(kName) || f.size() == kName.size()) {
    spdlog::error("OUTRUN_TEST_FAULT: unknown test fault '{}' (crash-on-source=MARKER)", f);
    std::fflush(stderr);
    std::_Exit(protocol::exit_code(protocol::WorkerExit::kUsage));
  }
  g_marker = f.substr(kName.size());
  spdlog::warn("test faults '{}' are enabled", f);
  return &kHooks;
}

}  // namespace outrun::worker

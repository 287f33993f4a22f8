// The exit codes of outrun-worker (design/protocol.md "Worker exit codes"): the worker exits with
// them, the host reads them to tell causes apart and to name them in its log.
#pragma once

#include <cstdint>
#include <string>

namespace outrun::protocol {

enum class WorkerExit : uint8_t {
  kOk = 0,           // the host closed the pipe or sent Shutdown
  kUsage = 64,       // bad command line (or OUTRUN_TEST_FAULT)
  kTestFault = 70,   // test faults only: an escape attempt returned, or crash-at-start
  kIo = 74,          // the pipe failed
  kProtocol = 76,    // the host sent a frame that failed verification
  kOrphan = 77,      // the host was already gone at start
  kStatusPage = 78,  // the status page could not be mapped
  kConfine = 79,     // it could not confine itself (rlimits, no_new_privs, seccomp)
};

constexpr int exit_code(WorkerExit e) {
  return static_cast<int>(e);
}

// How the host words a worker's exit with `code` (no signal): "exited", "exited: its pipe to
// the host failed (code 74)", ..., "exited with code N" for a code with no name of its own.
std::string describe_worker_exit(int64_t code);

// Whether an exit with `code` while a script runs may be the script's doing (design/supervision.md
// "Crash attribution"; a sanitizer's report after a fault exits 1): any error code but those that
// name the host's side, kIo (its pipe failed) and kProtocol (it sent a frame the worker could not
// verify).
bool script_may_cause_exit(int64_t code);

}  // namespace outrun::protocol

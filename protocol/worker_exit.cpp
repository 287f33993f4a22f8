#include "outrun/protocol/worker_exit.h"

namespace outrun::protocol {

std::string describe_worker_exit(int64_t code) {
  switch (code) {
    case exit_code(WorkerExit::kOk):
      return "exited";
    case exit_code(WorkerExit::kIo):
      return "exited: its pipe to the host failed (code 74)";
    case exit_code(WorkerExit::kProtocol):
      return "exited: the host sent a frame it could not verify (code 76)";
    case exit_code(WorkerExit::kOrphan):
      return "exited: the host was gone at start (code 77)";
    case exit_code(WorkerExit::kStatusPage):
      return "exited: it could not map its status page (code 78)";
    case exit_code(WorkerExit::kConfine):
      return "exited: it could not confine itself (rlimits, no_new_privs, seccomp) (code 79)";
    default:  // kUsage and kTestFault too: the number says it
      return "exited with code " + std::to_string(code);
  }
}

bool script_may_cause_exit(int64_t code) {
  return code != exit_code(WorkerExit::kOk) && code != exit_code(WorkerExit::kIo) &&
         code != exit_code(WorkerExit::kProtocol);
}

}  // namespace outrun::protocol

// How a Windows process ended, read from its exit code (worker_os.h): pure, built on both
// platforms so that its unit test runs on both.
#include <cstdio>
#include <iterator>

#include "outrun/platform/worker_os.h"
#include "outrun/protocol/worker_exit.h"

namespace outrun::platform {

namespace {

// The exceptions a process raises itself -- its faults, its abort (__fastfail) -- which end it
// when unhandled (the job's DIE_ON_UNHANDLED_EXCEPTION: no error dialog, no debugger): the
// Windows forms of SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT and SIGTRAP.
struct NtFault {
  uint32_t code;
  const char* name;
  const char* text;
};
constexpr NtFault kFaults[] = {
    {0xC0000005u, "STATUS_ACCESS_VIOLATION", "access violation"},
    {0xC0000006u, "STATUS_IN_PAGE_ERROR", "in-page error"},
    {0xC00000FDu, "STATUS_STACK_OVERFLOW", "stack overflow"},
    {0xC000001Du, "STATUS_ILLEGAL_INSTRUCTION", "illegal instruction"},
    {0xC0000096u, "STATUS_PRIVILEGED_INSTRUCTION", "privileged instruction"},
    {0xC0000094u, "STATUS_INTEGER_DIVIDE_BY_ZERO", "integer division by zero"},
    {0xC0000095u, "STATUS_INTEGER_OVERFLOW", "integer overflow"},
    {0xC000008Cu, "STATUS_ARRAY_BOUNDS_EXCEEDED", "array bounds exceeded"},
    {0xC000008Eu, "STATUS_FLOAT_DIVIDE_BY_ZERO", "floating-point division by zero"},
    {0xC0000090u, "STATUS_FLOAT_INVALID_OPERATION", "invalid floating-point operation"},
    {0xC0000409u, "STATUS_STACK_BUFFER_OVERRUN", "fail-fast abort (stack buffer overrun)"},
    {0xC0000374u, "STATUS_HEAP_CORRUPTION", "heap corruption"},
    {0x80000002u, "STATUS_DATATYPE_MISALIGNMENT", "misaligned data access"},
    {0x80000003u, "STATUS_BREAKPOINT", "breakpoint"},
};

const NtFault* fault_of(uint32_t code) {
  for (const NtFault& f : kFaults)
    if (f.code == code) return &f;
  return nullptr;
}

std::string hex(uint32_t code) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", static_cast<unsigned>(code));
  return buf;
}

}  // namespace

ExitKind windows_exit_kind(uint32_t code) {
  if (fault_of(code)) return ExitKind::kFault;
  // The host's TerminateJobObject, and any other NTSTATUS error the process did not raise as one
  // of its faults (STATUS_CONTROL_C_EXIT, a loader failure such as STATUS_DLL_NOT_FOUND): they
  // come from outside the script, as a signal other than the fault signals does on POSIX.
  if (code == kKilledExitCode || (code & 0xC0000000u) == 0xC0000000u) return ExitKind::kKilled;
  return ExitKind::kExited;
}

std::string describe_windows_exit(uint32_t code) {
  if (const NtFault* f = fault_of(code))
    return std::string("crashed: ") + f->text + " (" + f->name + ", " + hex(code) + ")";
  if (code == kKilledExitCode) return "was killed (its Job Object was terminated)";
  if ((code & 0xC0000000u) == 0xC0000000u) return "ended with status " + hex(code);
  return protocol::describe_worker_exit(code);
}

}  // namespace outrun::platform

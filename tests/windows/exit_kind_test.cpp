// The reading of a worker's exit (outrun/platform/worker_os.h): the Windows classification, pure,
// on both platforms; this platform's exit_kind() and describe_exit().
#include <doctest/doctest.h>

#ifndef _WIN32
#include <csignal>
#endif

#include "outrun/platform/worker_os.h"
#include "outrun/protocol/worker_exit.h"

using outrun::platform::ExitKind;
using outrun::platform::windows_exit_kind;

TEST_CASE("Windows exit codes: faults, the host's kill, exit codes") {
  // The faults a script's interpreter bug ends in are charged like the fault signals.
  for (uint32_t fault :
       {0xC0000005u /* STATUS_ACCESS_VIOLATION */, 0xC00000FDu /* STATUS_STACK_OVERFLOW */,
        0xC000001Du /* STATUS_ILLEGAL_INSTRUCTION */,
        0xC0000094u /* STATUS_INTEGER_DIVIDE_BY_ZERO */,
        0xC0000409u /* STATUS_STACK_BUFFER_OVERRUN: __fastfail, abort */}) {
    CAPTURE(fault);
    CHECK(windows_exit_kind(fault) == ExitKind::kFault);
  }
  // The host's TerminateJobObject, and NTSTATUS errors it did not raise itself: not charged.
  CHECK(windows_exit_kind(outrun::platform::kKilledExitCode) == ExitKind::kKilled);
  CHECK(windows_exit_kind(0xC000013Au /* STATUS_CONTROL_C_EXIT */) == ExitKind::kKilled);
  CHECK(windows_exit_kind(0xC0000135u /* STATUS_DLL_NOT_FOUND */) == ExitKind::kKilled);
  // The worker's own exit codes.
  CHECK(windows_exit_kind(0) == ExitKind::kExited);
  CHECK(windows_exit_kind(76) == ExitKind::kExited);
  CHECK(windows_exit_kind(3) == ExitKind::kExited);  // the C runtime's abort(): a plain exit code

  CHECK(outrun::platform::describe_windows_exit(0xC0000005u) ==
        "crashed: access violation (STATUS_ACCESS_VIOLATION, 0xC0000005)");
  CHECK(outrun::platform::describe_windows_exit(0xC00000FDu) ==
        "crashed: stack overflow (STATUS_STACK_OVERFLOW, 0xC00000FD)");
  CHECK(outrun::platform::describe_windows_exit(outrun::platform::kKilledExitCode) ==
        "was killed (its Job Object was terminated)");
  CHECK(outrun::platform::describe_windows_exit(0xC0000135u) == "ended with status 0xC0000135");
  CHECK(outrun::platform::describe_windows_exit(76) == outrun::protocol::describe_worker_exit(76));
}

TEST_CASE("this platform's exit reading") {
#ifdef _WIN32
  CHECK(outrun::platform::exit_kind(0xC0000005u, 0) == ExitKind::kFault);
  CHECK(outrun::platform::exit_kind(outrun::platform::kKilledExitCode, 0) == ExitKind::kKilled);
  CHECK(outrun::platform::exit_kind(0, 0) == ExitKind::kExited);
  CHECK(outrun::platform::describe_exit(0xC0000005u, 0) ==
        "crashed: access violation (STATUS_ACCESS_VIOLATION, 0xC0000005)");
#else
  // A signal from its own fault or abort is a fault; any other signal comes from outside.
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP}) {
    CAPTURE(sig);
    CHECK(outrun::platform::exit_kind(0, sig) == ExitKind::kFault);
  }
  CHECK(outrun::platform::exit_kind(0, SIGKILL) == ExitKind::kKilled);
  CHECK(outrun::platform::exit_kind(0, SIGTERM) == ExitKind::kKilled);
  CHECK(outrun::platform::exit_kind(76, 0) == ExitKind::kExited);
  CHECK(outrun::platform::describe_exit(0, SIGSEGV) ==
        "was killed by signal 11 (Segmentation fault)");
  CHECK(outrun::platform::describe_exit(0, SIGSYS) ==
        "was killed by signal 31 (Bad system call): it made a system call its seccomp filter "
        "forbids");
  CHECK(outrun::platform::describe_exit(76, 0) ==
        "exited: the host sent a frame it could not verify (code 76)");
#endif
}

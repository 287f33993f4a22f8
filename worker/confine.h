// Process confinement of a worker: defense in depth behind the Lua sandbox. Once a worker has
// mapped its status page and started its heartbeat thread, and before it reads its first frame,
// it confines itself for the rest of its life:
//
//   - rlimits: no new file descriptors, no child processes, no file growth, no core dumps, and
//     (when configured) a cap on its address space;
//   - no_new_privs;
//   - a seccomp-bpf allow-list (libseccomp) of only the system calls a serving worker makes, on
//     every thread (TSYNC). Anything else kills the whole process with SIGSYS, which the host
//     reports as a crash with that cause and restarts the shard.
//
// design/sandbox.md lists the allowed calls and why each is needed.
#pragma once

#include <cstddef>
#include <string>

namespace outrun::worker {

struct ConfineOptions {
  int socket_fd = 3;                    // the highest fd the worker keeps (its sockets to the host)
  std::size_t address_space_limit = 0;  // RLIMIT_AS in bytes; 0 = none
  bool profiling = false;               // a gperftools profile is being written (SIGPROF, its fd)
};

// Returns an empty string on success, or why confinement failed (the worker must then exit:
// it never serves unconfined).
std::string confine(const ConfineOptions& options);

// True when this binary was built with a sanitizer whose runtime makes system calls the
// allow-list does not know (ASan/TSan reports, shadow memory). Such builds confine with the
// same rlimits and the same filter, except that RLIMIT_AS is not applied (sanitizer shadow
// memory reserves terabytes of address space).
bool built_with_sanitizer();

}  // namespace outrun::worker

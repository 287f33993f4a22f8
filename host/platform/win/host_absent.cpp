// The Windows build has outrun::InProcess but not yet outrun::Host (design/windows.md). The
// Host's futures are fulfilled in host/src/leader.cpp, whose read token (read_token.h) waits
// on an eventfd and poll(): its Windows form (an Event, WaitForMultipleObjects on the named
// pipe) comes with the platform seam. completion.cpp, which InProcess uses, also names the
// Host's two waiters; these stand-ins satisfy the linker and are never reached, since only a
// Host creates a SyncWaiter or a HostFuture.
#include <cstdio>
#include <cstdlib>

#include "completion.h"

namespace outrun::detail {

namespace {
[[noreturn]] void no_host(const char* what) {
  std::fprintf(stderr, "outrun: %s: the Windows build has no Host yet\n", what);
  std::abort();
}
}  // namespace

void fulfil(SyncWaiter&, Result&&) {
  no_host("fulfil(SyncWaiter)");
}
void fulfil(HostFuture&, Result&&) {
  no_host("fulfil(HostFuture)");
}

}  // namespace outrun::detail

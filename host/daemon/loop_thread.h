// outrund's loop thread as a capability (design/threading.md): the role every owner of the
// daemon's loop-only state (Server, Acceptor, Scheduler) guards it with.
#pragma once

#include "outrun/thread_annotations.h"

namespace outrun::daemon {

// outrund's loop thread (the Host's loop thread, which serves the clients too: design/daemon.md
// "One loop"; the fuzz target's own): it alone touches the state marked GUARDED_BY(loop_thread)
// (connections, the script table, the quotas, the listening socket, the scheduler's scratch);
// functions that need it are REQUIRES(loop_thread), and the entry points libuv calls assert it
// (a thread-id check in every build). One per process: one Server at a time.
inline ThreadRole loop_thread;

}  // namespace outrun::daemon

// The compile-only process: `outrun-worker --compile-only`, started by the host next to its
// shards' workers and confined the same way. It compiles sources into Lua bytecode (Compile ->
// Compiled frames) and never runs a chunk, so the bytecode a restarted worker loads comes from a
// process no script has run in (design/sandbox.md "The compiler").
#pragma once

#include <cstddef>

#include "hooks.h"
#include "outrun/platform/worker_os.h"
#include "outrun/protocol/status_page.h"

namespace outrun::worker {

struct CompileOnlyOptions {
  platform::Channel fd = platform::kNoChannel;      // Compile frames from the host
  platform::Channel out_fd = platform::kNoChannel;  // Compiled frames to the host
  std::size_t memory_limit = 16u << 20;             // one compile's Lua memory, as a script's state
  protocol::StatusPage* page = nullptr;             // counts compiles; may be null
  const Hooks* hooks = nullptr;                     // a test build's (hooks.h)
};

// Serves until the host closes its end (0) or sends Shutdown (0); an exit code otherwise.
int run_compile_only(const CompileOnlyOptions& opts);

}  // namespace outrun::worker

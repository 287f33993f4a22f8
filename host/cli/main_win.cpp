// outrun.exe: the command line on Windows.
//
//   outrun eval [--shards K] [--timeout MS] [--grace MS] [--memory-limit MB]
//               (-e SOURCE | -f FILE) [-i NAME=VALUE]... [--inputs-json JSON] [--json]
//               [--in-process]
//
// Only eval: the other commands (stats, shards, register, bench, drill, tags, logs, reload) talk
// to outrund, which does not run on Windows yet (design/windows.md "outrund on Windows").
#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "eval_cmd.h"

int main(int argc, char** argv) {
  using namespace outrun::cli;
  CLI::App app{"outrun: run untrusted Lua 5.4 scripts out of process (Windows: eval only)"};
  app.set_version_flag("--version", "outrun " OUTRUN_VERSION);
  app.require_subcommand(1);
  int rc = 0;
  std::string socket;  // no --socket: $OUTRUN_SOCKET, if set, is refused with a message
  add_eval_command(app, &rc, &socket);
  // The Linux CLI's other commands, named so that a user who types one learns why it is not here
  // (exit 3, as for an unavailable outrund) rather than reading "a subcommand is required".
  for (const char* name : {"stats", "shards", "scripts", "kill-shard", "restart-shard",
                           "unregister", "register", "bench", "drill", "reload", "tags", "logs"}) {
    auto* cmd = app.add_subcommand(name, "needs outrund (Linux only)");
    cmd->allow_extras();
    cmd->callback([name, &rc] {
      std::cerr << "unavailable: 'outrun " << name
                << "' needs outrund, which does not run on Windows yet (design/windows.md); "
                   "outrun.exe has eval\n";
      rc = kExitNoRunner;
    });
  }
  return run_app(app, argc, argv, &rc);
}

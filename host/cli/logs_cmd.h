// `outrun logs KEY` and `outrun tags log ID` (host/cli/logs_cmd.cpp): a script's or a tag's
// recent log lines from outrund, with --follow.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace outrun::cli {

// Adds `logs` to `app` and `log` to its `tags` subcommand (add_tags_commands first); through
// outrund at *socket (empty: $OUTRUN_SOCKET or the default). The exit code goes to *rc.
void add_logs_commands(CLI::App& app, int* rc, const std::string* socket);

}  // namespace outrun::cli

// `outrun tags ...` subcommands (host/cli/tags_cmd.cpp).
#pragma once

#include <CLI/CLI.hpp>

namespace outrun::cli {

// Adds `tags run` (offline) and the daemon's `tags define|list|update|watch|read` (through
// outrund at *socket, empty: $OUTRUN_SOCKET or the default); the exit code goes to *rc.
void add_tags_commands(CLI::App& app, int* rc, const std::string* socket);

// Adds `tags test` (host/cli/tags_test_cmd.cpp) to the `tags` subcommand.
void add_tags_test_command(CLI::App& tags_cmd, int* rc);

}  // namespace outrun::cli

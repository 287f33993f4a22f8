// `outrun tags ...` subcommands (host/cli/tags_cmd.cpp).
#pragma once

#include <CLI/CLI.hpp>

namespace outrun::cli {

// Adds `tags run` (offline); the command's exit code goes to *rc.
void add_tags_commands(CLI::App& app, int* rc);

}  // namespace outrun::cli

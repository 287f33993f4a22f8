// `outrun eval` (host/cli/eval_cmd.cpp): built on Linux and Windows (outrun.exe, whose other
// commands need outrund: design/windows.md).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace outrun::cli {

// Exit codes of `outrun eval` (README): 0 ok; 1 the evaluation ended with any other status;
// 2 bad usage (arguments, inputs, an unreadable file, a registration refused); 3 the script could
// not be run at all (the workers did not start, outrund is unavailable).
inline constexpr int kExitFailed = 1, kExitUsage = 2, kExitNoRunner = 3;

// Adds `eval` to `app`; its exit code goes to *rc. Through outrund when *socket (--socket, filled
// by the parse) or $OUTRUN_SOCKET names one.
void add_eval_command(CLI::App& app, int* rc, std::string* socket);

// Parses the command line and runs the chosen command; its exit code (*rc), or 0 for --help and
// --version, or kExitUsage for every usage error (CLI11's own codes are 100+). Both CLIs' main.
int run_app(CLI::App& app, int argc, char** argv, const int* rc);

// --socket given, or $OUTRUN_SOCKET set (then *socket is it).
bool socket_given(std::string* socket);

}  // namespace outrun::cli

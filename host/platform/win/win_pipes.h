// What the Windows side of the seam shares between its files (channels.cpp defines them); not
// part of worker_os.h.
#pragma once

#include <windows.h>

#include <string>

namespace outrun::platform::win {

// "what: <the system's text> (Windows error N)".
std::string win_error(const std::string& what, DWORD err = GetLastError());

// One pipe of a worker (one instance, local clients only) and its two ends: the host's
// (`host_reads`: inbound and overlapped, read by libuv; else outbound and non-blocking,
// PIPE_NOWAIT, written by FrameWriter) and the worker's, inheritable (only through a spawn's
// handle list). "" or what failed; on failure nothing is left open.
std::string make_pipe(bool host_reads, HANDLE* host, HANDLE* worker);

}  // namespace outrun::platform::win

// A worker started through the platform seam (outrun/platform/worker_os.h) and spoken to with the
// protocol's own encoders: what tests/windows/ and its spawn helper share. Windows only.
#pragma once

#include <windows.h>

#include <boost/interprocess/mapped_region.hpp>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "outrun/platform/worker_os.h"
#include "outrun/protocol/frame.h"
#include "outrun/protocol/messages.h"
#include "outrun/protocol/status_page.h"

namespace outrun::wintest {

// A file beside this program (outrun-worker.exe, the spawn helper are built there).
inline std::string beside_me(const char* file) {
  char path[MAX_PATH];
  const DWORD n = GetModuleFileNameA(nullptr, path, MAX_PATH);
  std::string dir(path, n);
  return dir.substr(0, dir.find_last_of("\\/") + 1) + file;
}

// Wine has ntdll's wine_get_version; Windows does not.
inline bool under_wine() {
  HMODULE ntdll = GetModuleHandleA("ntdll.dll");
  return ntdll && GetProcAddress(ntdll, "wine_get_version") != nullptr;
}

inline constexpr uint64_t kSecond = 1'000'000;     // us
inline constexpr uint64_t kHour = 3600 * kSecond;  // a soft deadline that never comes in a test

struct WorkerSession {
  platform::WorkerChannels ch;
  platform::HostStatusPage page;
  platform::WorkerChild child;
  protocol::FrameReader reader;
  protocol::StatusPage* status = nullptr;
  HANDLE err = nullptr;  // our stderr, duplicated inheritable for the worker

  WorkerSession() = default;
  WorkerSession(const WorkerSession&) = delete;
  WorkerSession& operator=(const WorkerSession&) = delete;
  ~WorkerSession() {
    platform::close_all(&ch);
    platform::release_worker(&child);  // the job's close kills it if it still runs
    if (err) CloseHandle(err);
  }

  // "" or what failed.
  std::string start(std::size_t memory_limit = 0, std::vector<std::string> extra = {}) {
    if (std::string e = page.create(0); !e.empty()) return "status page: " + e;
    status = new (page.region()->get_address()) protocol::StatusPage();
    status->version.store(protocol::kStatusPageVersion);
    status->magic.store(protocol::kStatusPageMagic, std::memory_order_release);
    if (std::string e = platform::open_worker_channels(&ch); !e.empty()) return e;
    DuplicateHandle(GetCurrentProcess(), GetStdHandle(STD_ERROR_HANDLE), GetCurrentProcess(), &err,
                    0, TRUE, DUPLICATE_SAME_ACCESS);
    platform::SpawnRequest req;
    req.path = beside_me("outrun-worker.exe");
    req.args = platform::worker_channel_args(ch, page.name());
    req.args.insert(req.args.end(), extra.begin(), extra.end());
    req.channels = &ch;
    req.memory_limit = memory_limit;
    if (std::string e = platform::spawn_worker(req, err, &child); !e.empty()) return e;
    platform::close_worker_ends(&ch);
    return {};
  }

  // The next frame from the worker; false at the end of its stream or on a broken one.
  bool next_frame(protocol::FrameView* out) {
    for (;;) {
      if (reader.next(*out)) return true;
      if (reader.error() != protocol::FrameError::kNone) return false;
      if (platform::read_frames(reader, ch.host_read) <= 0) return false;
    }
  }

  bool send(std::span<const uint8_t> frame) {
    return platform::channel_write_all(ch.host_write, frame);
  }

  // One Evaluation of `source` (its script id 1), sent with its source. `timeout_us` is the
  // worker's own soft deadline (0: at once, as the host never sends it).
  bool evaluate(uint64_t id, std::string_view source, uint64_t timeout_us = kSecond) {
    flatbuffers::FlatBufferBuilder f;
    static const uint8_t sha[32] = {1};  // the worker keys scripts by it; it does not check it
    const protocol::ScriptSource src{{sha, 32}, source, "test", {}};
    const auto e = protocol::build_evaluation(f, id, 1, timeout_us, 0, &src);
    return send(protocol::finish_evaluate(f, {&e, 1}));
  }

  // Waits until the status page names an evaluation as running (the worker is in it).
  bool wait_running(std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      uint64_t running = 0;
      int64_t since = 0;
      protocol::read_running(*status, &running, &since);
      if (running != 0) return true;
      Sleep(5);
    }
    return false;
  }
};

}  // namespace outrun::wintest

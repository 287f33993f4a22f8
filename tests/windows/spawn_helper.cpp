// outrun_win_spawn_helper.exe: starts a worker through the platform seam, keeps it busy in
// `while true do end`, prints its pid and waits to be terminated. worker_process_test.cpp
// terminates it and checks that the worker dies with it (JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE:
// the helper's job handle was the only one).
#include <cstdio>

#include "worker_session.h"

int main() {
  outrun::wintest::WorkerSession s;
  if (std::string e = s.start(); !e.empty()) {
    std::fprintf(stderr, "spawn helper: %s\n", e.c_str());
    return 2;
  }
  outrun::protocol::FrameView hello;
  if (!s.next_frame(&hello) || !s.evaluate(1, "while true do end", outrun::wintest::kHour) ||
      !s.wait_running(std::chrono::seconds(60))) {
    std::fprintf(stderr, "spawn helper: the worker did not start its evaluation\n");
    return 3;
  }
  std::printf("%d\n", s.child.pid);
  std::fflush(stdout);
  Sleep(INFINITE);
}

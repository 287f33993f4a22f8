// Chaos: a few thousand evaluations per second through a real Host while a chaos thread
// SIGKILLs, SIGSTOPs and SIGCONTs its workers at random and some of the load is runaway scripts
// (soft ones the worker interrupts at T, hard ones stuck in one C call that only the kill at T+G
// ends). Asserts that every evaluation ended exactly once, with a status consistent with what
// was done to it, that every `ok` carries the right value, that every shard serves again after
// the chaos, and that no worker outlives the host. Bounded: about 12 s of chaos.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "host/host_support.h"
#include "outrun/host.h"

using namespace outrun;
using namespace std::chrono_literals;

namespace {

enum class Kind : uint8_t { normal, soft_runaway, hard_runaway };

struct Outcome {
  std::atomic<int> calls{0};
  Kind kind = Kind::normal;
  int64_t x = 0;
  Status status = Status::ok;
  Value value;
  std::string error;
};

// /proc/PID/stat into `buf`, by raw syscalls only. libuv closes its fds with a raw
// syscall(SYS_close), which TSan does not see; an intercepted open() here that reuses such a
// number would look to TSan like a race with the loop thread's last read of the old fd. Raw
// syscalls keep this thread's fds out of TSan's fd model altogether (also the pidfd below).
std::size_t read_stat(int pid, char* buf, std::size_t size) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = static_cast<int>(syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC));
  if (fd < 0) return 0;
  const ssize_t n = syscall(SYS_read, fd, buf, size - 1);
  syscall(SYS_close, fd);
  buf[n > 0 ? n : 0] = '\0';
  return n > 0 ? static_cast<std::size_t>(n) : 0;
}

// Signals `pid` only if it is still one of this process's outrun-worker children: a pidfd pins
// the process, then /proc confirms what it is, so a recycled pid is never hit.
bool signal_worker(int pid, int sig) {
  if (pid <= 0) return false;
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return false;
  bool ok = false;
  char line[512];
  if (read_stat(pid, line, sizeof line) > 0) {
    // "pid (comm) state ppid ..."
    const char* close_paren = std::strrchr(line, ')');
    int ppid = 0;
    char state = 0;
    if (std::strstr(line, "(outrun-worker)") && close_paren &&
        std::sscanf(close_paren + 1, " %c %d", &state, &ppid) == 2 && ppid == getpid())
      ok = syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0) == 0;
  }
  syscall(SYS_close, pidfd);  // raw, like every fd of this thread (see read_stat)
  return ok;
}

}  // namespace

TEST_CASE(
    "Chaos: random kills, stops and runaways under load, every evaluation ends exactly once, "
    "consistently") {
  HostOptions o;
  o.worker_path = OUTRUN_TEST_WORKER;
  o.shards = 2;
  o.timeout = 20ms;
  o.grace = 50ms;
  o.heartbeat_interval = 50ms;
  o.silence_limit = 400ms;
  o.restart_delay = 5ms;
  o.single_flight = SingleFlight::off;
  o.crash_loop_limit = 1000;  // the test's own SIGKILLs count as crashes: keep the shards serving
  o.max_queued_while_down = 100000;
  auto host = test::start_host(o);

  Script normal[8];
  for (int i = 0; i < 8; ++i)
    normal[i] = test::reg(*host, "normal" + std::to_string(i),
                          "return inputs.x * 2 + " + std::to_string(i));
  auto soft = test::scripts_on_shards_0_and_1(*host, "soft", "while true do end");
  auto hard = test::scripts_on_shards_0_and_1(
      *host, "hard", "local s = string.rep('a', 200000) return s:find('.-.-.-.-.-.-.-.-.-b')");

  constexpr auto kChaos = std::chrono::seconds(12);
  constexpr int kRate = 3000;  // evaluations per second
  const std::size_t capacity = static_cast<std::size_t>(kRate) * 14;
  std::vector<Outcome> outcomes(capacity);
  std::atomic<std::size_t> submitted{0};
  std::atomic<std::size_t> done{0};
  std::atomic<bool> stop{false};
  std::atomic<int> kills{0}, stops{0};
  std::mutex pids_mu;
  std::set<int> pids_seen;
  auto note_pids = [&] {
    std::lock_guard lock(pids_mu);
    for (int p : host->worker_pids())
      if (p > 0) pids_seen.insert(p);
  };
  note_pids();

  std::thread chaos([&] {
    std::mt19937 rng(12345);
    std::vector<int> stopped;
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 300));
      note_pids();
      const auto pids = host->worker_pids();
      const int pid = pids[rng() % pids.size()];
      switch (rng() % 4) {
        case 0:
          if (signal_worker(pid, SIGKILL)) ++kills;
          break;
        case 1:
          if (signal_worker(pid, SIGSTOP)) {
            ++stops;
            stopped.push_back(pid);
          }
          break;
        case 2:  // resume what was stopped (after 100-400 ms: some past the silence limit)
          for (int p : stopped) signal_worker(p, SIGCONT);
          stopped.clear();
          break;
        default:
          break;
      }
    }
    for (int p : stopped) signal_worker(p, SIGCONT);
  });

  // The load: paced in slices of 10 ms; 0.5 % soft runaways (each holds its worker for T),
  // 0.05 % hard runaways (each costs its shard a kill at T+G and a restart), the rest normal.
  std::mt19937 rng(777);
  const auto start = std::chrono::steady_clock::now();
  auto next = start;
  while (std::chrono::steady_clock::now() - start < kChaos &&
         submitted.load() + kRate / 100 < capacity) {
    for (int k = 0; k < kRate / 100; ++k) {
      const std::size_t i = submitted.fetch_add(1);
      Outcome& out = outcomes[i];
      const auto dice = static_cast<unsigned>(rng() % 10000);
      Script s;
      if (dice < 9945) {
        out.kind = Kind::normal;
        out.x = static_cast<int64_t>(i);
        s = normal[i % 8];
      } else if (dice < 9995) {
        out.kind = Kind::soft_runaway;
        s = (i % 2) ? soft.first : soft.second;
      } else {
        out.kind = Kind::hard_runaway;
        s = (i % 2) ? hard.first : hard.second;
      }
      host->evaluate(s, Inputs{{"x", Value(out.x)}}, [&out, &done](Result r) {
        out.status = r.status;
        out.value = std::move(r.value);
        out.error = std::move(r.error);
        out.calls.fetch_add(1);  // release: the fields above are visible to whoever sees it
        done.fetch_add(1);
      });
    }
    next += 10ms;
    std::this_thread::sleep_until(next);
  }
  stop = true;
  chaos.join();

  // Everything ends: stopped workers were resumed; the slowest path is a kill at T+G plus a
  // restart, and evaluations queued behind it.
  const std::size_t n = submitted.load();
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (done.load() < n && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  REQUIRE_MESSAGE(done.load() == n, "ended " << done.load() << " of " << n);

  // Every shard serves again.
  std::set<int> shards_checked;
  for (const Script& s : normal) {
    shards_checked.insert(s.shard());
    Result r = host->evaluate(s, Inputs{{"x", Value(int64_t{5})}}).get();
    if (r.status == Status::worker_lost)
      r = host->evaluate(s, Inputs{{"x", Value(int64_t{5})}}).get();
    CHECK_MESSAGE(r.status == Status::ok, to_string(r.status) << ": " << r.error);
  }
  CHECK(shards_checked.size() == 2);

  std::size_t by_status[16] = {};
  int wrong = 0, twice = 0, inconsistent = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const Outcome& out = outcomes[i];
    const int calls = out.calls.load();
    if (calls != 1) {
      ++twice;
      continue;
    }
    ++by_status[static_cast<int>(out.status)];
    const Status st = out.status;
    // What each kind may end with, given what the chaos thread does (kills, stops long enough
    // to pass T+G or the silence limit, crash-loop refusals are off).
    bool ok = false;
    switch (out.kind) {
      case Kind::normal:
        ok = st == Status::ok || st == Status::worker_lost ||
             (st == Status::killed && stops.load() > 0);
        if (st == Status::ok && !(out.value == Value(out.x * 2 + static_cast<int64_t>(i % 8))))
          ++wrong;
        break;
      case Kind::soft_runaway:
        ok = st == Status::timeout || st == Status::worker_lost || st == Status::killed;
        break;
      case Kind::hard_runaway:
        ok = st == Status::killed || st == Status::worker_lost;
        break;
    }
    if (!ok) {
      ++inconsistent;
      if (inconsistent <= 5)
        MESSAGE("evaluation " << i << " (kind " << int(out.kind) << ") ended " << to_string(st)
                              << ": " << out.error);
    }
  }
  MESSAGE("submitted " << n << ", SIGKILLs " << kills.load() << ", SIGSTOPs " << stops.load()
                       << "; ok " << by_status[int(Status::ok)] << ", timeout "
                       << by_status[int(Status::timeout)] << ", killed "
                       << by_status[int(Status::killed)] << ", worker_lost "
                       << by_status[int(Status::worker_lost)]);
  CHECK(twice == 0);
  CHECK(wrong == 0);
  CHECK(inconsistent == 0);
  CHECK(kills.load() > 0);
  CHECK(stops.load() > 0);
  CHECK(by_status[int(Status::ok)] > n / 4);  // it kept serving (a loose bound: no timing)
  CHECK(by_status[int(Status::killed)] > 0);  // the hard runaways

  // No worker outlives the host.
  note_pids();
  host.reset();
  std::lock_guard lock(pids_mu);
  for (int p : pids_seen)
    CHECK_MESSAGE(test::process_gone(p), "worker " << p << " outlived the host");
}

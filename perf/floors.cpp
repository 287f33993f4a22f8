#include "floors.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "measure.h"

namespace outrun::perf {

LatencyFig latency_of(const LatencyHistogram& h) {
  return {us(h.quantile(0.5)), us(h.quantile(0.99)), us(h.quantile(0.999)), us(h.max()), h.count()};
}

namespace {

constexpr std::size_t kMsg = 64;

// Forks a child that echoes everything it reads on `fd` until EOF. Only async-signal-safe calls
// in the child: the parent may have threads.
// Forks a child that echoes what it reads on `in` to `out` until EOF, after closing `close_a` and
// `close_b` (the parent's ends; -1: none). Only async-signal-safe calls in the child: the parent
// may have threads.
pid_t fork_echo(int in, int out, int close_a, int close_b = -1) {
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (close_a >= 0) close(close_a);
    if (close_b >= 0) close(close_b);
    char buf[65536];
    for (;;) {
      const ssize_t n = read(in, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) _exit(0);
      ssize_t off = 0;
      while (off < n) {
        const ssize_t w = write(out, buf + off, static_cast<std::size_t>(n - off));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) _exit(1);
        off += w;
      }
    }
  }
  return pid;
}

void fill(char* m, int64_t i) {
  std::memcpy(m, &i, sizeof i);
  for (std::size_t k = sizeof i; k < kMsg; ++k)
    m[k] = static_cast<char>((i + static_cast<int64_t>(k)) & 0x7f);
}

bool check(const char* m, int64_t* i) {
  std::memcpy(i, m, sizeof *i);
  for (std::size_t k = sizeof *i; k < kMsg; ++k)
    if (m[k] != static_cast<char>((*i + static_cast<int64_t>(k)) & 0x7f)) return false;
  return true;
}

}  // namespace

PacedFig paced_fig(const Paced& p, const Window& w, bool drained) {
  PacedFig f;
  f.measured = p.measured();
  f.cpu_pct = w.cpu_pct();
  f.other_cpu_pct = w.others_pct();
  f.us_per_msg = us(w.cpu_ns) / static_cast<double>(f.measured);
  f.other_us_per_msg = us(w.others_ns) / static_cast<double>(f.measured);
  f.achieved_per_s = static_cast<double>(f.measured) / (static_cast<double>(w.wall_ns) / 1e9);
  f.wakeups_per_msg = static_cast<double>(w.wakeups) / static_cast<double>(f.measured);
  f.other_wakeups_per_msg = static_cast<double>(w.others_wakeups) / static_cast<double>(f.measured);
  f.threads = thread_figs(w, f.measured);
  f.lat = latency_of(p.histogram());
  f.wrong = p.wrong() + (drained ? 0 : p.total() - p.done());
  return f;
}

std::vector<ThreadFig> thread_figs(const Window& w, int64_t messages) {
  std::vector<ThreadFig> out;
  const int pid = getpid();
  for (const TaskStat& t : w.threads)
    out.push_back(
        {t.tid, t.tid == pid,
         100.0 * static_cast<double>(t.cpu_ns) /
             static_cast<double>(std::max<int64_t>(1, w.wall_ns)),
         static_cast<double>(t.wakeups) / static_cast<double>(std::max<int64_t>(1, messages))});
  std::sort(out.begin(), out.end(),
            [](const ThreadFig& a, const ThreadFig& b) { return a.cpu_pct > b.cpu_pct; });
  return out;
}

LatencyFig pipe_round_trip(int iterations) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return {};
  const pid_t pid = fork_echo(sv[1], sv[1], sv[0]);
  close(sv[1]);
  LatencyHistogram h;
  char buf[kMsg] = {};
  for (int i = 0; i < iterations + 200; ++i) {
    const int64_t t0 = mono_ns();
    if (write(sv[0], buf, sizeof buf) != static_cast<ssize_t>(sizeof buf)) break;
    std::size_t got = 0;
    while (got < sizeof buf) {
      const ssize_t n = read(sv[0], buf + got, sizeof buf - got);
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    if (i >= 200) h.record(mono_ns() - t0);  // the first ones warm up
  }
  close(sv[0]);
  waitpid(pid, nullptr, 0);
  return latency_of(h);
}

PacedFig pacing_only(double rate, double warmup_s, double duration_s) {
  Paced p(rate, warmup_s, duration_s);
  Window w;
  const bool drained = p.run([&](int64_t i) { p.complete(i, true); }, [&] { w.start(); });
  w.stop();
  return paced_fig(p, w, drained);
}

PacedFig bare_shape(double rate, double warmup_s, double duration_s, bool dispatcher_hop,
                    WindowHooks hooks, bool two_pipes) {
  // This process writes on `wfd` and reads the answers on `fd`: one socketpair end for both, or
  // two one-way pipes.
  int fd = -1, wfd = -1;
  pid_t child = -1;
  if (two_pipes) {
    int to[2], from[2];
    if (pipe2(to, O_CLOEXEC) != 0) return {};
    if (pipe2(from, O_CLOEXEC) != 0) {
      close(to[0]);
      close(to[1]);
      return {};
    }
    child = fork_echo(to[0], from[1], to[1], from[0]);
    close(to[0]);
    close(from[1]);
    fd = from[0];
    wfd = to[1];
  } else {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return {};
    child = fork_echo(sv[1], sv[1], sv[0]);
    close(sv[1]);
    fd = wfd = sv[0];
  }
  const int stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  ev.data.fd = stop_fd;
  epoll_ctl(ep, EPOLL_CTL_ADD, stop_fd, &ev);

  Paced p(rate, warmup_s, duration_s);

  // The dispatcher: a queue, a mutex and a condition variable, woken at most once per read.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<int64_t, bool>> queue;
  bool stop = false;
  std::thread dispatcher;
  if (dispatcher_hop)
    dispatcher = std::thread([&] {
      std::vector<std::pair<int64_t, bool>> batch;
      for (;;) {
        {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return stop || !queue.empty(); });
          if (queue.empty()) return;
          batch.swap(queue);
        }
        for (auto [i, ok] : batch) p.complete(i, ok);
        batch.clear();
      }
    });

  std::thread reader([&] {
    std::vector<char> buf(1 << 16);
    std::size_t have = 0;
    std::vector<std::pair<int64_t, bool>> got;
    for (;;) {
      epoll_event events[2];
      const int n = epoll_wait(ep, events, 2, -1);
      if (n < 0 && errno == EINTR) continue;
      bool readable = false;
      for (int k = 0; k < n; ++k) {
        if (events[k].data.fd == stop_fd) return;
        readable = true;
      }
      if (!readable) continue;
      const ssize_t r = read(fd, buf.data() + have, buf.size() - have);
      if (r <= 0) {
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        return;
      }
      have += static_cast<std::size_t>(r);
      std::size_t off = 0;
      for (; off + kMsg <= have; off += kMsg) {
        int64_t i = 0;
        const bool ok = check(buf.data() + off, &i);
        if (dispatcher_hop)
          got.emplace_back(i, ok);
        else
          p.complete(i, ok);
      }
      std::memmove(buf.data(), buf.data() + off, have - off);
      have -= off;
      if (dispatcher_hop && !got.empty()) {
        bool was_empty;
        {
          std::lock_guard lock(mu);
          was_empty = queue.empty();
          queue.insert(queue.end(), got.begin(), got.end());
        }
        got.clear();
        if (was_empty) cv.notify_one();
      }
    }
  });

  Window w;
  w.pids = {child};
  const bool drained = p.run(
      [&](int64_t i) {
        char m[kMsg];
        fill(m, i);
        // 64 bytes into a socket buffer that the echo keeps drained: never blocks in practice.
        std::size_t off = 0;
        while (off < kMsg) {
          const ssize_t n = write(wfd, m + off, kMsg - off);
          if (n > 0) {
            off += static_cast<std::size_t>(n);
          } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
            break;
          }
        }
      },
      [&] {
        hooks.start();
        w.start();
      });
  w.stop();
  hooks.stop();

  const uint64_t one = 1;
  (void)!write(stop_fd, &one, sizeof one);
  reader.join();
  if (dispatcher_hop) {
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    cv.notify_one();
    dispatcher.join();
  }
  if (two_pipes) {
    close(wfd);
  } else {
    shutdown(fd, SHUT_RDWR);
  }
  close(fd);
  close(ep);
  close(stop_fd);
  waitpid(child, nullptr, 0);
  return paced_fig(p, w, drained);
}

}  // namespace outrun::perf

// outrun-perf: measures outrun against the floors of this machine, in one run.
//
// This is the foundation's quick harness: idle round trip and closed-loop throughput, out of
// process vs InProcess, with on-CPU time per evaluation and worker RSS, beside a raw pipe
// round trip measured in the same run. The full budget table is a later issue (design/budgets.md).
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "histogram.h"
#include "outrun/host.h"
#include "outrun/in_process.h"

using namespace outrun;
using Clock = std::chrono::steady_clock;

namespace {

const char* kScript = "return (inputs.a + inputs.b) / 2";

int64_t ns_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

// CPU time of this whole process (every thread), in ns.
int64_t self_cpu_ns() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return (int64_t(ru.ru_utime.tv_sec) + ru.ru_stime.tv_sec) * 1'000'000'000 +
         (int64_t(ru.ru_utime.tv_usec) + ru.ru_stime.tv_usec) * 1000;
}

// CPU time of another process from /proc/PID/stat (utime + stime), in ns.
int64_t proc_cpu_ns(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), {});
  const auto close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(s.substr(close + 2));
  std::string field;
  long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stoll(field);
    if (i == 15) stime = std::stoll(field);
  }
  return (utime + stime) * (1'000'000'000 / sysconf(_SC_CLK_TCK));
}

int64_t workers_cpu_ns(const Host& h) {
  int64_t sum = 0;
  for (int pid : h.worker_pids()) sum += proc_cpu_ns(pid);
  return sum;
}

long rss_kb(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return 0;
}

struct LatencyRow {
  int64_t p50_ns = 0, p99_ns = 0, max_ns = 0;
  uint64_t n = 0;
};

// Blocking round trips of 64 bytes between this process and a forked echo process: the
// machine's floor for one request/response between processes.
LatencyRow pipe_round_trip(int iterations) {
  int sv[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  const pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    char buf[64];
    for (;;) {
      ssize_t n = read(sv[1], buf, sizeof buf);
      if (n <= 0) _exit(0);
      if (write(sv[1], buf, static_cast<size_t>(n)) != n) _exit(1);
    }
  }
  close(sv[1]);
  perf::Histogram h;
  char buf[64] = {};
  for (int i = 0; i < iterations + 200; ++i) {
    const auto t0 = Clock::now();
    if (write(sv[0], buf, sizeof buf) != sizeof buf) break;
    std::size_t got = 0;
    while (got < sizeof buf) {
      ssize_t n = read(sv[0], buf + got, sizeof buf - got);
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    if (i >= 200) h.record(ns_since(t0));  // the first ones warm up
  }
  close(sv[0]);
  waitpid(pid, nullptr, 0);
  return {h.quantile(0.5), h.quantile(0.99), h.max(), h.count()};
}

LatencyRow idle_latency(Runner& r, const Script& s, int iterations, int* wrong) {
  perf::Histogram h;
  for (int i = 0; i < iterations + 200; ++i) {
    const auto t0 = Clock::now();
    Result res = r.evaluate(s, {{"a", i}, {"b", i + 1}}).get();
    const int64_t dt = ns_since(t0);
    if (res.status != Status::ok || res.value != Value((2.0 * i + 1) / 2)) ++*wrong;
    if (i >= 200) h.record(dt);
  }
  return {h.quantile(0.5), h.quantile(0.99), h.max(), h.count()};
}

struct ThroughputRow {
  double evals_per_s = 0;
  uint64_t evaluations = 0;
  uint64_t wrong = 0;
  double host_cpu_us_per_eval = 0;
  double worker_cpu_us_per_eval = 0;
};

// Closed loop: keeps `depth` evaluations in flight in batches; checks every result.
ThroughputRow closed_loop(Runner& r, const Script& s, double seconds, const Host* host) {
  constexpr std::size_t kBatch = 512;
  constexpr std::size_t kDepth = 8 * kBatch;
  std::mutex mu;
  std::condition_variable cv;
  std::size_t in_flight = 0;
  std::atomic<uint64_t> completed{0}, wrong{0};
  uint64_t next = 0;
  auto submit = [&](uint64_t first) {
    std::vector<Request> reqs;
    reqs.reserve(kBatch);
    for (std::size_t k = 0; k < kBatch; ++k) {
      const int64_t i = static_cast<int64_t>((first + k) % 1'000'000);
      reqs.push_back({s, {{"a", i}, {"b", i + 1}}});
    }
    r.evaluate_batch(std::move(reqs), [&, first](std::size_t k, Result res) {
      const int64_t i = static_cast<int64_t>((first + k) % 1'000'000);
      if (res.status != Status::ok || res.value != Value((2.0 * static_cast<double>(i) + 1) / 2)) ++wrong;
      completed.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard lock(mu);
      if (--in_flight <= kDepth - kBatch) cv.notify_one();
    });
  };
  const int64_t cpu0 = self_cpu_ns();
  const int64_t wcpu0 = host ? workers_cpu_ns(*host) : 0;
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return in_flight <= kDepth - kBatch; });
      in_flight += kBatch;
    }
    submit(next);
    next += kBatch;
  }
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return in_flight == 0; });
  }
  const double elapsed = static_cast<double>(ns_since(t0)) / 1e9;
  ThroughputRow row;
  row.evaluations = completed.load();
  row.wrong = wrong.load() + (row.evaluations != next ? 1 : 0);
  row.evals_per_s = static_cast<double>(row.evaluations) / elapsed;
  row.host_cpu_us_per_eval = static_cast<double>(self_cpu_ns() - cpu0) / 1000.0 / static_cast<double>(row.evaluations);
  if (host)
    row.worker_cpu_us_per_eval =
        static_cast<double>(workers_cpu_ns(*host) - wcpu0) / 1000.0 / static_cast<double>(row.evaluations);
  return row;
}

struct SupervisionRows {
  perf::Histogram kill_after_deadline;   // result `killed` minus (submit + T + G)
  perf::Histogram shard_kill_to_ok;      // kill_shard(i) until an evaluation on it is ok
  double idle_host_cpu_pct = 0;          // host process CPU while idle, % of one core
  double idle_worker_cpu_pct = 0;        // all workers together
  int wrong = 0;
};

// Supervision figures: kill latency after T+G, recovery after a shard kill, idle cost.
SupervisionRows supervision(int shards, int rounds, double idle_seconds) {
  SupervisionRows out;
  HostOptions o;
  o.shards = shards;
  o.timeout = std::chrono::milliseconds(50);
  o.grace = std::chrono::milliseconds(50);
  std::unique_ptr<Host> host;
  if (Host::create(o, &host)) return out;
  Script stuck, ok;
  host->register_script("perf.stuck", "local s = string.rep('a', 200000) return s:find('.-.-.-.-.-.-.-.-.-b')", &stuck);
  host->register_script("perf.ok", "return inputs.x", &ok);
  const int64_t tg = std::chrono::duration_cast<std::chrono::nanoseconds>(o.timeout + o.grace).count();
  for (int i = 0; i < rounds; ++i) {
    host->evaluate(ok, {{"x", i}}).get();  // the shard is up and warm
    const auto t0 = Clock::now();
    Result r = host->evaluate(stuck, {}).get();
    if (r.status != Status::killed) {
      ++out.wrong;
      std::fprintf(stderr, "outrun-perf: runaway ended %s: %s\n", std::string(to_string(r.status)).c_str(), r.error.c_str());
    }
    out.kill_after_deadline.record(ns_since(t0) - tg);
  }
  const int shard = static_cast<int>(ok.shard());
  for (int i = 0; i < rounds; ++i) {
    host->evaluate(ok, {{"x", i}}).get();
    const uint64_t starts = host->shard_stats(shard).starts;
    const auto t0 = Clock::now();
    host->kill_shard(shard);
    // The next evaluation submitted once the old worker is gone (a new one has been started):
    // it goes to the new worker, with its source, as soon as that one is up.
    while (host->shard_stats(shard).starts == starts) std::this_thread::sleep_for(std::chrono::microseconds(50));
    Result r = host->evaluate(ok, {{"x", i}}).get();
    if (r.status != Status::ok) {
      ++out.wrong;
      std::fprintf(stderr, "outrun-perf: after kill_shard: %s: %s\n", std::string(to_string(r.status)).c_str(), r.error.c_str());
    }
    out.shard_kill_to_ok.record(ns_since(t0));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int64_t cpu0 = self_cpu_ns(), w0 = workers_cpu_ns(*host);
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(idle_seconds));
  const double wall = static_cast<double>(ns_since(t0));
  out.idle_host_cpu_pct = 100.0 * static_cast<double>(self_cpu_ns() - cpu0) / wall;
  out.idle_worker_cpu_pct = 100.0 * static_cast<double>(workers_cpu_ns(*host) - w0) / wall;
  return out;
}

struct ScriptsRows {
  long rss_after_kb = 0;       // largest worker after compiling its share of the scripts
  int64_t cold_all_ns = 0;     // first evaluation of every script (compiles)
  int64_t kill_all_ns = 0;     // kill every shard -> every script's next result ok
  int wrong = 0;
};

// Many scripts: RSS after compiling them, and recovery of all of them after every shard is
// killed (their sources go to the new workers with their next evaluations).
ScriptsRows many_scripts(int shards, int count) {
  ScriptsRows out;
  HostOptions o;
  o.shards = shards;
  std::unique_ptr<Host> host;
  if (Host::create(o, &host)) return out;
  std::vector<Script> scripts(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    // A 40-line script, as the brief's compile figure assumes.
    std::string src = "local a, b = inputs.a, inputs.b\n";
    for (int l = 0; l < 38; ++l) src += "if a > " + std::to_string(l * 7 + i) + " then b = b + " + std::to_string(l) + " end\n";
    src += "return b";
    host->register_script("tag." + std::to_string(i), src, &scripts[static_cast<std::size_t>(i)]);
  }
  auto run_all = [&](int round) {
    std::vector<Request> reqs;
    for (int i = 0; i < count; ++i) reqs.push_back({scripts[static_cast<std::size_t>(i)], {{"a", round}, {"b", 0}}});
    std::mutex mu;
    std::condition_variable cv;
    int left = count;
    host->evaluate_batch(std::move(reqs), [&](std::size_t, Result r) {
      std::lock_guard lock(mu);
      if (r.status != Status::ok) ++out.wrong;
      if (--left == 0) cv.notify_one();
    });
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return left == 0; });
  };
  auto t0 = Clock::now();
  run_all(1);
  out.cold_all_ns = ns_since(t0);
  for (int pid : host->worker_pids()) out.rss_after_kb = std::max(out.rss_after_kb, rss_kb(pid));
  std::vector<uint64_t> starts;
  for (int i = 0; i < shards; ++i) starts.push_back(host->shard_stats(i).starts);
  t0 = Clock::now();
  for (int i = 0; i < shards; ++i) host->kill_shard(i);
  for (int i = 0; i < shards; ++i)
    while (host->shard_stats(i).starts == starts[static_cast<std::size_t>(i)])
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  run_all(2);
  out.kill_all_ns = ns_since(t0);
  return out;
}

std::string us(int64_t ns) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f µs", static_cast<double>(ns) / 1000.0);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"outrun-perf: outrun's numbers beside this machine's floors, in one run"};
  bool quick = false;
  int shards = 2;
  double duration = 3.0;
  int iterations = 5000;
  std::string json_path;
  app.add_flag("--quick", quick, "short run (about 10 s)");
  app.add_option("--shards", shards, "worker processes")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--duration", duration, "seconds per closed-loop arm")->capture_default_str();
  app.add_option("--iterations", iterations, "round trips per latency row")->capture_default_str();
  app.add_option("--json", json_path, "also write every figure as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    duration = std::min(duration, 1.5);
    iterations = std::min(iterations, 2000);
  }

  HostOptions ho;
  ho.shards = shards;
  // The closed loop keeps thousands of evaluations of one script in flight: single flight off.
  ho.single_flight = SingleFlight::off;
  std::unique_ptr<Host> host;
  if (Error err = Host::create(ho, &host)) {
    std::cerr << "outrun-perf: " << err.message << "\n";
    return 1;
  }
  InProcess inproc;
  Script hs, is;
  host->register_script("perf.avg", kScript, &hs);
  inproc.register_script("perf.avg", kScript, &is);
  host->evaluate(hs, {{"a", 1}, {"b", 2}}).get();  // compile on its worker

  long idle_rss = 0;
  for (int pid : host->worker_pids()) idle_rss = std::max(idle_rss, rss_kb(pid));

  int wrong_latency = 0;
  const LatencyRow pipe = pipe_round_trip(iterations);
  const LatencyRow lat_out = idle_latency(*host, hs, iterations, &wrong_latency);
  // The same with futures fulfilled through the dispatcher thread (one more hop).
  LatencyRow lat_hop;
  {
    HostOptions o = ho;
    o.fulfill_futures_on_loop = false;
    std::unique_ptr<Host> h2;
    if (Error err = Host::create(o, &h2)) {
      std::cerr << "outrun-perf: " << err.message << "\n";
      return 1;
    }
    Script s2;
    h2->register_script("perf.avg", kScript, &s2);
    lat_hop = idle_latency(*h2, s2, iterations, &wrong_latency);
  }
  const LatencyRow lat_in = idle_latency(inproc, is, iterations, &wrong_latency);
  const ThroughputRow tp_out = closed_loop(*host, hs, duration, host.get());
  const ThroughputRow tp_in = closed_loop(inproc, is, duration, nullptr);
  host.reset();  // measure supervision on a host of its own, with nothing else running
  const SupervisionRows sup = supervision(shards, quick ? 5 : 20, quick ? 2.0 : 5.0);
  const ScriptsRows many = many_scripts(shards, 1000);

  std::printf("outrun-perf (%s run, K=%d, script: %s)\n\n", quick ? "quick" : "full", shards, kScript);
  std::printf("%-42s %16s %16s %16s\n", "row", "out-of-process", "InProcess", "floor / note");
  std::printf("%-42s %16s %16s %16s\n", "idle round trip p50", us(lat_out.p50_ns).c_str(), us(lat_in.p50_ns).c_str(),
              ("pipe " + us(pipe.p50_ns)).c_str());
  std::printf("%-42s %16s %16s %16s\n", "idle round trip p99", us(lat_out.p99_ns).c_str(), us(lat_in.p99_ns).c_str(),
              ("pipe " + us(pipe.p99_ns)).c_str());
  std::printf("%-42s %16s %16s %16s\n", "idle p50, futures via dispatcher", us(lat_hop.p50_ns).c_str(), "-",
              "one more hop");
  std::printf("%-42s %14.0f/s %14.0f/s %16s\n", "closed loop, every result checked", tp_out.evals_per_s,
              tp_in.evals_per_s, (std::to_string(tp_out.wrong + tp_in.wrong + static_cast<uint64_t>(wrong_latency)) + " wrong").c_str());
  std::printf("%-42s %13.2f µs %13.2f µs %16s\n", "host on-CPU per evaluation (closed loop)", tp_out.host_cpu_us_per_eval,
              tp_in.host_cpu_us_per_eval, "all threads");
  std::printf("%-42s %13.2f µs %16s %16s\n", "worker on-CPU per evaluation (closed loop)", tp_out.worker_cpu_us_per_eval,
              "-", "sum of workers");
  std::printf("%-42s %13ld KB %16s %16s\n", "worker RSS, idle (1 script)", idle_rss, "-", "largest worker");
  auto ms = [](int64_t ns) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f ms", static_cast<double>(ns) / 1e6);
    return std::string(b);
  };
  std::printf("%-42s %16s %16s %16s\n", "kill latency after T+G, p50 / max", ms(sup.kill_after_deadline.quantile(0.5)).c_str(),
              ms(sup.kill_after_deadline.max()).c_str(), "T=50, G=50 ms");
  std::printf("%-42s %16s %16s %16s\n", "kill_shard -> its next ok, p50 / max", ms(sup.shard_kill_to_ok.quantile(0.5)).c_str(),
              ms(sup.shard_kill_to_ok.max()).c_str(), "warm, 1 script");
  std::printf("%-42s %15.3f%% %15.3f%% %16s\n", "idle CPU, host / all workers (% of a core)", sup.idle_host_cpu_pct,
              sup.idle_worker_cpu_pct, "heartbeats");
  std::printf("%-42s %13ld KB %16s %16s\n", "worker RSS after compiling 1,000 scripts", many.rss_after_kb, "-",
              "largest worker");
  std::printf("%-42s %16s %16s %16s\n", "1,000 scripts: first run / after kill-all", ms(many.cold_all_ns).c_str(),
              ms(many.kill_all_ns).c_str(), "every result ok");

  if (!json_path.empty()) {
    nlohmann::json j{
        {"options", {{"shards", shards}, {"duration_s", duration}, {"iterations", iterations}, {"quick", quick}}},
        {"pipe_round_trip_ns", {{"p50", pipe.p50_ns}, {"p99", pipe.p99_ns}}},
        {"idle_latency_ns", {{"out_of_process", {{"p50", lat_out.p50_ns}, {"p99", lat_out.p99_ns}}},
                             {"in_process", {{"p50", lat_in.p50_ns}, {"p99", lat_in.p99_ns}}},
                             {"futures_via_dispatcher", {{"p50", lat_hop.p50_ns}, {"p99", lat_hop.p99_ns}}}}},
        {"closed_loop", {{"out_of_process", {{"evals_per_s", tp_out.evals_per_s},
                                             {"host_cpu_us_per_eval", tp_out.host_cpu_us_per_eval},
                                             {"worker_cpu_us_per_eval", tp_out.worker_cpu_us_per_eval},
                                             {"wrong", tp_out.wrong}}},
                         {"in_process", {{"evals_per_s", tp_in.evals_per_s},
                                         {"host_cpu_us_per_eval", tp_in.host_cpu_us_per_eval},
                                         {"wrong", tp_in.wrong}}}}},
        {"worker_rss_idle_kb", idle_rss},
        {"kill_latency_after_deadline_ns", {{"p50", sup.kill_after_deadline.quantile(0.5)}, {"max", sup.kill_after_deadline.max()}}},
        {"shard_kill_to_next_ok_ns", {{"p50", sup.shard_kill_to_ok.quantile(0.5)}, {"max", sup.shard_kill_to_ok.max()}}},
        {"idle_cpu_pct", {{"host", sup.idle_host_cpu_pct}, {"workers", sup.idle_worker_cpu_pct}}},
        {"worker_rss_after_1000_scripts_kb", many.rss_after_kb},
        {"scripts_1000_first_run_ns", many.cold_all_ns},
        {"kill_all_shards_to_every_next_ok_ns", many.kill_all_ns},
    };
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  const bool all_correct = tp_out.wrong == 0 && tp_in.wrong == 0 && wrong_latency == 0 && sup.wrong == 0 && many.wrong == 0;
  if (!all_correct) std::fprintf(stderr, "outrun-perf: some results were wrong\n");
  return all_correct ? 0 : 1;
}

#include "harness.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>

namespace outrun::perf {

int64_t input_a(int64_t i) {
  return i % 1'000'000;
}
Inputs inputs_for(int64_t i) {
  const int64_t a = input_a(i);
  return {{"a", a}, {"b", a + 1}};
}

bool setup_ok(const Error& e, const std::string& what) {
  if (!e) return true;
  std::fprintf(stderr, "outrun-perf: %s: %s: %s\n", what.c_str(),
               std::string(to_string(e.code)).c_str(), e.message.c_str());
  return false;
}

namespace {
std::atomic<bool> g_wrong_reported{false};
}  // namespace

bool first_wrong_report() {
  return !g_wrong_reported.exchange(true);
}

bool check(const Result& r, int64_t i) {
  if (r.status == Status::ok && r.value == Value(static_cast<double>(input_a(i)) + 0.5))
    return true;
  if (first_wrong_report())
    std::fprintf(stderr, "outrun-perf: wrong result for input %lld: %s %s\n",
                 static_cast<long long>(input_a(i)), std::string(to_string(r.status)).c_str(),
                 r.error.c_str());
  return false;
}

double max_rss_mb(const std::vector<int>& pids) {
  long kb = 0;
  for (int pid : pids) kb = std::max(kb, pid > 0 ? rss_kb(pid) : 0L);
  return static_cast<double>(kb) / 1024.0;
}

bool wait_restarted(const Host& h, int i, uint64_t starts) {
  const int64_t deadline = mono_ns() + 10'000'000'000;
  while (h.shard_stats(i).starts == starts) {
    if (mono_ns() > deadline) return false;
    sleep_ns(50'000);
  }
  return true;
}

bool wait_running(const Host& h, int i) {
  const int64_t deadline = mono_ns() + 10'000'000'000;
  while (h.shard_stats(i).state != "running") {
    if (mono_ns() > deadline) return false;
    sleep_ns(50'000);
  }
  return true;
}

int64_t run_all(Host& h, const std::vector<Script>& s, int64_t round, const Expect& expect,
                std::chrono::seconds wait) {
  std::vector<Request> reqs;
  reqs.reserve(s.size());
  for (const Script& sc : s) reqs.push_back({sc, {{"a", round}, {"b", 0}}});
  // Shared with the callbacks: should the wait below give up, the late ones still find it.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::size_t left = 0;
    int64_t bad = 0;
    Expect expect;
  };
  auto st = std::make_shared<State>();
  st->left = s.size();
  st->expect = expect;
  h.evaluate_batch(std::move(reqs), [st](std::size_t k, Result r) {
    const bool ok = r.status == Status::ok && (!st->expect || r.value == st->expect(k));
    std::lock_guard lock(st->mu);
    if (!ok) {
      if (first_wrong_report())
        std::fprintf(stderr, "outrun-perf: script evaluation ended %s: %s%s\n",
                     std::string(to_string(r.status)).c_str(), r.error.c_str(),
                     r.status == Status::ok ? "(a wrong value)" : "");
      ++st->bad;
    }
    if (--st->left == 0) st->cv.notify_one();
  });
  std::unique_lock lock(st->mu);
  if (!st->cv.wait_for(lock, wait, [&] { return st->left == 0; }))
    return st->bad + static_cast<int64_t>(st->left);
  return st->bad;
}

std::string tag_source(int i) {
  std::string src = "local a, b = inputs.a, inputs.b\n";
  for (int l = 0; l < 38; ++l)
    src += "if a > " + std::to_string(l * 7 + i) + " then b = b + " + std::to_string(l) + " end\n";
  return src + "return b";
}

int64_t tag_value(int i, int64_t a, int64_t b) {
  for (int l = 0; l < 38; ++l)
    if (a > int64_t{l} * 7 + i) b += l;
  return b;
}

}  // namespace outrun::perf

// The worker's script memory budget (HostOptions::worker_script_budget), through the public Host
// API with real workers: least recently used idle states are closed to stay under it, an evicted
// script is compiled again (its globals start again), a script that cannot fit by itself ends
// `memory_limit` naming the budget, and a worker full of hoarding scripts neither dies nor fails
// honest scripts.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "host/host_support.h"
#include "outrun/host.h"
#include "test_support.h"

using namespace std::chrono_literals;
using outrun::Error;
using outrun::ErrorCode;
using outrun::Host;
using outrun::HostOptions;
using outrun::Inputs;
using outrun::Result;
using outrun::Script;
using outrun::ShardStats;
using outrun::Status;
using outrun::Value;
using outrun::test::kSanitized;
using outrun::test::reg;
using outrun::test::start_host;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

HostOptions one_shard(std::size_t budget) {
  HostOptions o;
  o.shards = 1;
  o.worker_path = OUTRUN_TEST_WORKER;
  o.timeout = 5000ms;
  o.grace = 5000ms;
  o.worker_script_budget = budget;
  return o;
}

std::string describe(const Result& r) {
  return std::string(outrun::to_string(r.status)) + ": " + r.error;
}

// Keeps `mib` MiB in a global table of 1 MiB strings (built once per state: a cache).
std::string hoarder_source(int mib) {
  return "if not hoard then hoard = {} for i = 1, " + std::to_string(mib) +
         " do hoard[i] = string.rep('x', 1 << 20) end end return #hoard";
}

// Evaluates each hoarder once, in order; returns how many answered ok.
int run_hoarders(Host& host, const std::vector<Script>& hoarders) {
  int ok = 0;
  for (const Script& s : hoarders) {
    const Result r = host.evaluate(s, {}).get();
    ok += r.status == Status::ok;
  }
  return ok;
}

std::vector<Script> register_hoarders(Host& host, int n, int mib) {
  std::vector<Script> v;
  for (int i = 0; i < n; ++i)
    v.push_back(reg(host, "hoard" + std::to_string(i), hoarder_source(mib)));
  return v;
}

Result honest(Host& host, const Script& s) {
  return host.evaluate(s, Inputs{{"a", Value(int64_t{41})}}).get();
}

}  // namespace

TEST_CASE("budget: hoarding scripts are evicted, honest scripts answer and the worker lives") {
  auto host = start_host(one_shard(64 * kMiB));
  const std::vector<Script> hoarders = register_hoarders(*host, 40, 10);
  Script fine = reg(*host, "fine", "return inputs.a + 1");
  for (int round = 0; round < 2; ++round)
    CHECK(run_hoarders(*host, hoarders) == 40);  // each fits once the idle ones make room
  const Result r = honest(*host, fine);
  CHECK_MESSAGE(r.status == Status::ok, describe(r));
  CHECK(r.value == Value(int64_t{42}));
  const ShardStats st = host->shard_stats(0);
  CHECK(st.starts == 1);
  CHECK(st.deaths == 0);
  CHECK(st.worker_evictions > 0);
  CHECK(st.worker_script_bytes <= 64 * kMiB);
  CHECK(st.worker_scripts < 41);  // the evicted ones are not held
  MESSAGE("worker RSS " << st.worker_rss_bytes / kMiB << " MiB (peak "
                        << st.worker_peak_rss_bytes / kMiB << " MiB), " << st.worker_evictions
                        << " evictions, script bytes " << st.worker_script_bytes / kMiB << " MiB");
  if (kSanitized) {
    MESSAGE("RSS bound not checked under sanitizers (ASan keeps freed memory)");
  } else {
    // 80 rounds of 10 MiB went through; 64 MiB of budget, allocator slack and the worker itself.
    CHECK(st.worker_rss_bytes < 160 * kMiB);
  }
}

TEST_CASE("budget: an evicted script runs again from its bytecode: right result, fresh globals") {
  auto host = start_host(one_shard(32 * kMiB));
  Script counter = reg(*host, "counter", "n = (n or 0) + 1 return n + inputs.a");
  for (int i = 1; i <= 3; ++i) {
    const Result r = honest(*host, counter);
    REQUIRE_MESSAGE(r.status == Status::ok, describe(r));
    CHECK(r.value == Value(int64_t{41 + i}));
  }
  const ShardStats start = host->shard_stats(0);
  // States built from a source or from the compile-only process's bytecode (not from bytecode
  // the worker kept): both are first builds here.
  const uint64_t compiles = start.worker_compiles + start.worker_bytecode_loads;
  // Enough hoarding after it to close the counter's state: it is the least recently used.
  CHECK(run_hoarders(*host, register_hoarders(*host, 6, 8)) == 6);
  const ShardStats mid = host->shard_stats(0);
  REQUIRE(mid.worker_evictions > 0);
  const Result r = honest(*host, counter);
  REQUIRE_MESSAGE(r.status == Status::ok, describe(r));
  CHECK(r.value == Value(int64_t{42}));  // n started again: globals are a cache
  const ShardStats st = host->shard_stats(0);
  // The hoarders were compiled; the counter was not: its state was built from its bytecode.
  CHECK(st.worker_compiles + st.worker_bytecode_loads == compiles + 6);
  CHECK(st.worker_reloads >= 1);
  CHECK(st.deaths == 0);
  // A runtime error of a reloaded script still names its chunk and line.
  Script thrower = reg(*host, "thrower", "local x = inputs.a\nerror('no ' .. x)");
  CHECK(honest(*host, thrower).status == Status::runtime_error);
  CHECK(run_hoarders(*host, register_hoarders(*host, 6, 8)) == 6);
  const uint64_t reloads = host->shard_stats(0).worker_reloads;
  const Result e = honest(*host, thrower);
  CHECK(host->shard_stats(0).worker_reloads > reloads);
  CHECK(e.status == Status::runtime_error);
  CHECK_MESSAGE(e.error.find("thrower:2: no 41") != std::string::npos, describe(e));
}

TEST_CASE("budget: evicted scripts keep only their bytecode, within the budget") {
  // 3,000 scripts in a 16 MiB budget: ~1,300 states fit; the rest are bytecode.
  auto host = start_host(one_shard(16 * kMiB));
  std::vector<Script> scripts;
  for (int i = 0; i < 3000; ++i)
    scripts.push_back(reg(*host, "many." + std::to_string(i),
                          "local a = inputs.a\nreturn a + " + std::to_string(i)));
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 3000; ++i) {
      const Result r = honest(*host, scripts[static_cast<std::size_t>(i)]);
      REQUIRE_MESSAGE(r.status == Status::ok, describe(r));
      REQUIRE(r.value == Value(int64_t{41 + i}));
    }
  const ShardStats st = host->shard_stats(0);
  MESSAGE("states held " << st.worker_scripts << ", evictions " << st.worker_evictions
                         << ", reloads " << st.worker_reloads << ", compiles " << st.worker_compiles
                         << ", script bytes " << st.worker_script_bytes / 1024 << " KiB");
  CHECK(st.worker_script_bytes <= 16 * kMiB);
  CHECK(st.worker_scripts < 3000);
  CHECK(st.worker_evictions > 0);
  // The second round ran every evicted script from its bytecode: each built once from its source
  // or from the compile-only process's bytecode.
  CHECK(st.worker_compiles + st.worker_bytecode_loads == 3000);
  CHECK(st.worker_reloads >= 3000 - st.worker_scripts);
  CHECK(st.deaths == 0);
}

TEST_CASE("budget: bytecode keeps a quarter of the budget at most, past it the oldest goes") {
  // 1,000 scripts with a 24 KiB constant each: ~24 MiB of bytecode, 6 times a quarter of 16 MiB.
  auto host = start_host(one_shard(16 * kMiB));
  std::vector<Script> scripts;
  const std::string blob(24 * 1024, 'z');
  for (int i = 0; i < 1000; ++i)
    scripts.push_back(reg(*host, "blob." + std::to_string(i),
                          "local s = '" + blob + "'\nreturn #s + inputs.a + " + std::to_string(i)));
  for (int round = 0; round < 2; ++round)
    for (int k = 0; k < 1000; ++k) {
      const int i = round == 0 ? k : 999 - k;  // back again: the latest evicted come first
      const Result r = honest(*host, scripts[static_cast<std::size_t>(i)]);
      REQUIRE_MESSAGE(r.status == Status::ok, describe(r));
      REQUIRE(r.value == Value(int64_t{24 * 1024 + 41 + i}));
    }
  const ShardStats st = host->shard_stats(0);
  MESSAGE("states held " << st.worker_scripts << ", reloads " << st.worker_reloads << ", compiles "
                         << st.worker_compiles << ", script bytes " << st.worker_script_bytes / 1024
                         << " KiB");
  CHECK(st.worker_script_bytes <= 16 * kMiB);
  // Some bytecode was dropped: their source came again (a NeedSource is answered with the source).
  CHECK(st.worker_compiles + st.worker_bytecode_loads > 1000);
  CHECK(st.worker_reloads > 0);   // and some was kept
  CHECK(st.worker_scripts > 10);  // states are not crowded out by bytecode
  CHECK(st.deaths == 0);
  if (!kSanitized) CHECK(st.worker_rss_bytes < 80 * kMiB);
}

TEST_CASE("budget: a script that cannot fit by itself ends memory_limit naming the budget") {
  HostOptions o = one_shard(64 * kMiB);
  o.memory_limit = 256 * kMiB;  // its own cap would allow it; the worker's budget does not
  auto host = start_host(o);
  Script big = reg(*host, "big", hoarder_source(100));
  Script fine = reg(*host, "fine", "return inputs.a + 1");
  CHECK(honest(*host, fine).status == Status::ok);
  const int pid = host->worker_pids().at(0);
  const Result r = host->evaluate(big, {}).get();
  CHECK_MESSAGE(r.status == Status::memory_limit, describe(r));
  CHECK_MESSAGE(
      r.error.find("the worker's script memory budget (64 MiB) is full") != std::string::npos,
      describe(r));
  const Result next = honest(*host, fine);
  CHECK_MESSAGE(next.status == Status::ok, describe(next));
  CHECK(host->worker_pids().at(0) == pid);
  CHECK(host->shard_stats(0).deaths == 0);
}

TEST_CASE("budget: a script that fits once every idle state is closed runs ok") {
  HostOptions o = one_shard(64 * kMiB);
  o.memory_limit = 256 * kMiB;  // headroom = budget / 2: the allocator must evict the rest
  auto host = start_host(o);
  CHECK(run_hoarders(*host, register_hoarders(*host, 6, 8)) == 6);
  Script big = reg(*host, "big", hoarder_source(56));
  const Result r = host->evaluate(big, {}).get();
  CHECK_MESSAGE(r.status == Status::ok, describe(r));
  const ShardStats st = host->shard_stats(0);
  CHECK(st.worker_evictions >= 6);
  CHECK(st.deaths == 0);
}

// Spare states (design/sandbox.md, "The worker's script budget"): fresh states the worker makes
// while idle, charged to the budget and freed before any script's state. outrun-test-worker's
// "pool-stats" fault answers an evaluation with a "pool" input with its counts.
constexpr uint64_t kSpares = 16;  // worker/worker.h kSpareStates

struct PoolCounts {
  uint64_t spares = 0, closing = 0, made = 0, taken = 0;
};

PoolCounts pool_counts(Host& host, const Script& any) {
  const Result r = host.evaluate(any, Inputs{{"pool", Value(std::string("stats"))}}).get();
  PoolCounts c;
  unsigned long long v[4] = {};
  REQUIRE_MESSAGE(std::sscanf(r.error.c_str(), "pool spares=%llu closing=%llu made=%llu taken=%llu",
                              &v[0], &v[1], &v[2], &v[3]) == 4,
                  describe(r));
  c = {v[0], v[1], v[2], v[3]};
  return c;
}

// Asks until the worker's idle time has made `spares` spares and closed every deferred state.
PoolCounts wait_for_idle(Host& host, const Script& any, uint64_t spares) {
  PoolCounts c;
  for (int i = 0; i < 500; ++i) {
    c = pool_counts(host, any);
    if (c.spares >= spares && c.closing == 0) break;
    std::this_thread::sleep_for(10ms);
  }
  return c;
}

HostOptions spares_shard(std::size_t budget) {
  return outrun::test::with_test_faults(one_shard(budget));
}

// A 16 MiB budget, a 256 MiB cap per script (one script may hold nearly all of it), and the
// worker's spares all made.
struct SparesRig {
  outrun::test::FaultEnv env{"pool-stats"};
  std::unique_ptr<Host> host;
  Script probe;
  SparesRig() {
    HostOptions o = spares_shard(16 * kMiB);
    o.memory_limit = 256 * kMiB;
    host = start_host(o);
    probe = reg(*host, "pool", "return 0");
    REQUIRE(wait_for_idle(*host, probe, kSpares).spares == kSpares);
  }
};

// Names of the globals a state has, but `inputs`, sorted (what a fresh sandbox has).
const char* const kGlobalsProbe =
    "local names = {} for k in pairs(_G) do if k ~= 'inputs' then names[#names + 1] = tostring(k) "
    "end end table.sort(names) return table.concat(names, ' ')";

TEST_CASE("budget: spares are made while idle, charged, and taken by new scripts") {
  outrun::test::FaultEnv env("pool-stats");
  auto host = start_host(spares_shard(16 * kMiB));
  Script probe = reg(*host, "pool", "return 0");  // answered by the fault: never gets a state
  PoolCounts c = wait_for_idle(*host, probe, kSpares);
  CHECK(c.spares == kSpares);
  CHECK(c.taken == 0);
  ShardStats st = host->shard_stats(0);
  CHECK(st.worker_scripts == 0);  // spares are not script states
  // Charged: the bytes of 16 bare states (~10 KB each), written on the page after idle time.
  CHECK(st.worker_script_bytes >= kSpares * 8 * 1024);
  for (int i = 0; i < 5; ++i) {
    Script s = reg(*host, "new." + std::to_string(i), "return inputs.a + " + std::to_string(i));
    const Result r = honest(*host, s);
    REQUIRE_MESSAGE(r.status == Status::ok, describe(r));
    CHECK(r.value == Value(int64_t{41 + i}));
  }
  c = wait_for_idle(*host, probe, kSpares);
  CHECK(c.taken == 5);  // each new script's state was a spare
  CHECK(c.made == kSpares + 5);
  CHECK(c.spares == kSpares);  // and idle time made them again
  st = host->shard_stats(0);
  CHECK(st.worker_scripts == 5);
  CHECK(st.worker_compiles + st.worker_bytecode_loads == 5);
}

TEST_CASE("budget: spares count as room before an evaluation: no state gives way, none is lost") {
  // Headroom 8 MiB: states are brought under 8 MiB before each evaluation.
  SparesRig rig;
  Host* host = rig.host.get();
  const Script& probe = rig.probe;
  // A keeper holding 8 MiB - 64 KiB: with the 15 spares left, the states hold more than 8 MiB.
  Script keeper =
      reg(*host, "keeper",
          "if not keep then keep = {} local n = 0 while collectgarbage('count') * 1024 < "
          "inputs.bytes do n = n + 1 keep[n] = string.rep('k', 4000) .. n end end "
          "return #keep");
  const Inputs in{{"bytes", Value(int64_t{8 * 1024 * 1024 - 64 * 1024})}};
  const Result k1 = host->evaluate(keeper, in).get();
  REQUIRE_MESSAGE(k1.status == Status::ok, describe(k1));
  // Another script: the states are over 8 MiB only with the spares, which count as room (the
  // allocator's reclaim would free them): neither the keeper nor the spares give way.
  Script other = reg(*host, "other", "return inputs.a + 1");
  const Result r = honest(*host, other);
  CHECK_MESSAGE(r.status == Status::ok, describe(r));
  const PoolCounts c = wait_for_idle(*host, probe, 0);
  CHECK(c.spares >= kSpares - 2);  // one taken by `other`; none thrown away
  // (Idle time does not close the keeper for spares either: it is far bigger than they are.)
  CHECK(host->shard_stats(0).worker_evictions == 0);
  const Result k2 = host->evaluate(keeper, in).get();
  CHECK(k2.value == k1.value);  // its globals are still there: its state was kept
  const ShardStats st = host->shard_stats(0);
  CHECK(st.worker_reloads == 0);
  CHECK(st.worker_script_bytes <= 16 * kMiB);
}

TEST_CASE("budget: a script that needs nearly the whole budget runs: its allocator frees spares") {
  SparesRig rig;
  Host* host = rig.host.get();
  // 16 MiB - 96 KiB: more than the budget leaves beside the 15 spares (~150 KiB).
  Script big = reg(*host, "big",
                   "local t, n = {}, 0 while collectgarbage('count') * 1024 < inputs.bytes do n = "
                   "n + 1 t[n] = string.rep('b', 4000) .. n end return n > 0");
  const Result r =
      host->evaluate(big, Inputs{{"bytes", Value(int64_t{16 * 1024 * 1024 - 96 * 1024})}}).get();
  CHECK_MESSAGE(r.status == Status::ok, describe(r));
  CHECK(host->shard_stats(0).deaths == 0);
}

TEST_CASE("budget: states from spares start clean across many evictions and reloads") {
  // 2 MiB: ~90 bare states under budget - headroom (1 MiB); 300 scripts go round three times.
  outrun::test::FaultEnv env("pool-stats");
  auto host = start_host(spares_shard(2 * kMiB));
  Script probe = reg(*host, "pool", "return 0");
  wait_for_idle(*host, probe, kSpares);
  Script globals = reg(*host, "globals", kGlobalsProbe);
  const Result base = host->evaluate(globals, {}).get();
  REQUIRE_MESSAGE(base.status == Status::ok, describe(base));
  REQUIRE(base.value.is<std::string>());
  CHECK(base.value.as<std::string>().find("leak") == std::string::npos);
  std::vector<Script> leaky;
  for (int i = 0; i < 300; ++i)
    leaky.push_back(reg(*host, "leaky." + std::to_string(i),
                        "leak_" + std::to_string(i) + " = (leak_" + std::to_string(i) +
                            " or 0) + 1 return inputs.a + " + std::to_string(i)));
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < 300; ++i) {
      const Result r = honest(*host, leaky[static_cast<std::size_t>(i)]);
      REQUIRE_MESSAGE(r.status == Status::ok, describe(r));
      REQUIRE(r.value == Value(int64_t{41 + i}));
      if (i % 50 == 0) {
        // Reloaded (the budget evicted it meanwhile) or new: the same globals as the first.
        const Result g = host->evaluate(globals, {}).get();
        REQUIRE_MESSAGE(g.status == Status::ok, describe(g));
        CHECK(g.value == base.value);
        Script fresh =
            reg(*host, "globals." + std::to_string(round) + "." + std::to_string(i), kGlobalsProbe);
        const Result f = host->evaluate(fresh, {}).get();
        CHECK(f.value == base.value);
      }
    }
  const PoolCounts c = wait_for_idle(*host, probe, 1);
  const ShardStats st = host->shard_stats(0);
  MESSAGE("spares made " << c.made << ", taken " << c.taken << ", evictions " << st.worker_evictions
                         << ", reloads " << st.worker_reloads << ", compiles "
                         << st.worker_compiles);
  CHECK(st.worker_reloads > 300);
  CHECK(c.taken > 0);
  CHECK(c.closing == 0);  // every deferred close was done while idle
  CHECK(st.worker_script_bytes <= 2 * kMiB);
  CHECK(st.deaths == 0);
}

TEST_CASE("budget: worker_script_budget is validated") {
  HostOptions o = one_shard(kMiB - 1);
  std::unique_ptr<Host> host;
  const Error err = Host::create(o, &host);
  CHECK(err.code == ErrorCode::invalid_argument);
  CHECK(err.message.find("worker_script_budget") != std::string::npos);
  CHECK(!host);
}

// Figures for design/sandbox.md, not a check: `outrun_tests -tc='*budget: figures*' --no-skip`.
// The hoarding attack with and without a budget (a huge budget is the behaviour before it).
TEST_CASE("budget: figures: the hoarding attack with and without the budget" * doctest::skip()) {
  for (const std::size_t budget : {std::size_t{1} << 40, 64 * kMiB}) {
    HostOptions o = one_shard(budget);
    o.worker_address_space_limit = std::size_t{1} << 30;  // a 1 GiB backstop, reached quickly
    auto host = start_host(o);
    const std::vector<Script> hoarders = register_hoarders(*host, 120, 10);
    Script fine = reg(*host, "fine", "return inputs.a + 1");
    int ok = 0;
    std::string hoarder_failure = "none";
    for (const Script& h : hoarders) {
      const Result r = host->evaluate(h, {}).get();
      ok += r.status == Status::ok;
      if (r.status != Status::ok && hoarder_failure == "none") hoarder_failure = describe(r);
    }
    std::vector<Result> honest_results;
    int honest_ok = 0;
    for (int i = 0; i < 20; ++i) {
      // An honest script that needs a little memory (4 MiB while it runs), keeping nothing.
      Script s = reg(*host, "honest" + std::to_string(i),
                     "local s = string.rep('y', 2 << 20) return inputs.a + #s // (2 << 20) + " +
                         std::to_string(i));
      const Result r = honest(*host, s);
      honest_ok += r.status == Status::ok;
      if (r.status != Status::ok && honest_results.empty()) honest_results.push_back(r);
    }
    const Result f = honest(*host, fine);
    const ShardStats st = host->shard_stats(0);
    std::printf(
        "budget %zu MiB: hoarders ok %d/120 (first failure: %s), honest ok %d/20 (first "
        "failure: %s), 'fine' %s; worker RSS %llu MiB, peak %llu MiB, starts %llu deaths %llu, "
        "evictions %llu\n",
        budget / kMiB, ok, hoarder_failure.c_str(), honest_ok,
        honest_results.empty() ? "none" : describe(honest_results[0]).c_str(), describe(f).c_str(),
        static_cast<unsigned long long>(st.worker_rss_bytes / kMiB),
        static_cast<unsigned long long>(st.worker_peak_rss_bytes / kMiB),
        static_cast<unsigned long long>(st.starts), static_cast<unsigned long long>(st.deaths),
        static_cast<unsigned long long>(st.worker_evictions));
  }
}

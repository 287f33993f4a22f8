// outrun drill: puts an open-loop load on outrund, does one bad thing to it at a third of the
// run, and checks that every evaluation ended exactly once, with the right value when ok, and
// that every shard serves again. design/drills.md says what each drill does and how the figures
// are taken.
#include "drill.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "daemon_process.h"
#include "latency_histogram.h"
#include "outrun/client.h"

namespace outrun::cli {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

struct DrillInfo {
  const char* name;
  const char* what;
  const char* test_fault;  // OUTRUN_TEST_FAULT its workers need ("" none)
};

const DrillInfo kDrills[] = {
    {"kill-one", "SIGKILL one shard's worker under load", ""},
    {"kill-all", "SIGKILL every shard's worker at once under load", ""},
    {"hang", "SIGSTOP one shard's worker: only its missing heartbeat gives it away", ""},
    {"runaway", "a script stuck in one C call among the load: killed at T+G", ""},
    {"crash-loop", "one shard's workers die at start until the fault is lifted", "crash-at-start"},
    {"garbage", "one shard's worker writes a malformed frame", "garbage"},
    {"memory", "a script that allocates until the worker's memory backstop refuses", ""},
};

const DrillInfo* find_drill(const std::string& name) {
  for (const DrillInfo& d : kDrills)
    if (name == d.name) return &d;
  return nullptr;
}

// A stuck C call the count hook cannot interrupt (Lua's matcher backtracking).
constexpr const char* kStuckInC =
    "local s = string.rep('a', 200000) return s:find('.-.-.-.-.-.-.-.-.-b')";
// Doubles a string, keeping every step, until some limit refuses an allocation (fast: each step
// is one memcpy; the 2^40 bytes it asks for in the end are more than any limit).
constexpr const char* kMemoryBomb =
    "local t = {'x'} for i = 2, 41 do t[i] = t[i - 1] .. t[i - 1] end return #t[41]";

// One evaluation of the drill. Written by the client's reader thread (the callback), read by
// the drill's thread once `calls` says it is done.
struct Ev {
  int64_t submit_ns = 0;
  int64_t done_ns = 0;
  std::atomic<uint32_t> calls{0};
  Status status = Status::ok;
  bool right = false;  // ok with the value it must have
  uint16_t script = 0;
};

// The private outrund (daemon_process.h): a temporary directory with its config, socket and log.
class PrivateDaemon {
 public:
  // Its directory goes with it, unless keep() was called or it did not stop cleanly.
  ~PrivateDaemon() {
    stop();
    if (!dir_.empty() && !keep_ && clean_exit_) std::filesystem::remove_all(dir_);
  }

  // The temporary directory for its config, socket, log (and the drill's files).
  bool make_dir(std::string* err) {
    dir_ = make_temp_dir("outrun-drill", err);
    if (dir_.empty()) return false;
    socket_ = dir_ + "/outrund.sock";
    log_ = dir_ + "/outrund.log";
    return true;
  }

  // Starts `binary` with `toml` as its config, `fault` in OUTRUN_TEST_FAULT and, if not empty,
  // `worker` as its worker; waits until its socket accepts a client.
  bool start(const std::string& binary, const std::string& host_toml, const std::string& fault,
             const std::string& worker, std::string* err) {
    const std::string config = dir_ + "/outrund.toml";
    {
      std::ofstream f(config);
      f << "[daemon]\nsocket = \"" << socket_ << "\"\nlog_file = \"" << log_
        << "\"\nlog_level = \"info\"\n\n[host]\n"
        << host_toml;
      if (!f) {
        *err = "cannot write " + config;
        return false;
      }
    }
    DaemonLaunch launch;
    launch.binary = binary;
    launch.args = {"--config", config};
    if (!worker.empty()) launch.args.insert(launch.args.end(), {"--worker", worker});
    launch.socket = socket_;
    launch.env = {fault.empty() ? "OUTRUN_TEST_FAULT" : "OUTRUN_TEST_FAULT=" + fault};
    // A drill that is killed takes its daemon with it (SIGTERM: it drains and stops its workers).
    launch.death_signal = SIGTERM;
    if (!process_.start(launch, err)) {
      *err += "; its log: " + log_;
      keep_ = true;
      return false;
    }
    return true;
  }

  // SIGTERM, and its exit status ("exit 0" when it drained and stopped cleanly).
  std::string stop() {
    if (process_.pid() > 0) {
      const DaemonExit e = process_.stop(std::chrono::seconds(30));
      clean_exit_ = e.clean();
      exit_ = e.describe();
    }
    return exit_;
  }

  void keep() { keep_ = true; }
  bool clean_exit() const { return clean_exit_; }
  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_; }
  const std::string& log() const { return log_; }

 private:
  DaemonProcess process_;
  std::string dir_, socket_, log_, exit_ = "not started";
  bool keep_ = false;
  bool clean_exit_ = false;
};

std::string outrund_next_to_us() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto p = self.parent_path() / "outrund";
    if (access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "outrund";  // posix_spawn does not search PATH: resolved below
}

std::string resolve_in_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const std::size_t colon = std::min(dirs.find(':', start), dirs.size());
    const std::string p = dirs.substr(start, colon - start) + "/" + name;
    if (access(p.c_str(), X_OK) == 0) return p;
    start = colon + 1;
  }
  return name;
}

// outrun-test-worker, the worker with the test faults (tests/worker_faults/) that `garbage` and
// `crash-loop` need: a build tree has it in bin/ next to outrun-worker; an installed outrun has
// none (it is never installed). Looked for next to $OUTRUN_WORKER, next to the outrund the drill
// starts (whose worker is next to it) and next to this outrun; "" when in none (`looked` says
// where it looked).
std::string find_test_worker(const std::string& outrund, std::string* looked) {
  std::vector<std::filesystem::path> dirs;
  if (const char* w = std::getenv("OUTRUN_WORKER"); w && *w)
    dirs.push_back(std::filesystem::path(w).parent_path());
  std::error_code ec;
  dirs.push_back(std::filesystem::weakly_canonical(outrund, ec).parent_path());
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back(self.parent_path());
  std::vector<std::string> tried;
  for (const auto& d : dirs) {
    const std::string p = (d / "outrun-test-worker").string();
    if (std::find(tried.begin(), tried.end(), p) != tried.end()) continue;
    if (access(p.c_str(), X_OK) == 0) return p;
    *looked += (tried.empty() ? "" : ", ") + p;
    tried.push_back(p);
  }
  return {};
}

json shard_stats(Client& c) {
  std::string doc;
  if (c.shards_json(&doc)) return json::array();
  json j = json::parse(doc, nullptr, false);
  if (j.is_discarded() || !j.contains("shards")) return json::array();
  return j["shards"];
}

uint64_t cause_count(const json& shards, int shard, const char* cause) {
  if (!shards.is_array() || shard >= static_cast<int>(shards.size())) return 0;
  return shards[shard]["death_causes"].value(cause, uint64_t{0});
}

// Registers `key_prefix0`, `key_prefix1`, ... until one lands on `shard`.
Error register_on_shard(Client& c, const std::string& key_prefix, const char* source, int shard,
                        Script* out) {
  for (int i = 0; i < 10000; ++i) {
    Script s;
    if (Error e = c.register_script(key_prefix + std::to_string(i), source, &s)) return e;
    if (static_cast<int>(s.shard()) == shard) {
      *out = s;
      return {};
    }
  }
  return {ErrorCode::unavailable, "no key of 10000 landed on shard " + std::to_string(shard)};
}

class Drill {
 public:
  Drill(const DrillArgs& a, const DrillInfo& info) : a_(a), info_(info) {}

  int run() {
    std::string socket = a_.socket;
    std::string daemon_desc;
    if (socket.empty()) {
      std::string err;
      const std::string bin =
          resolve_in_path(a_.outrund.empty() ? outrund_next_to_us() : a_.outrund);
      if (access(bin.c_str(), X_OK) != 0) {
        std::cerr << "unavailable: cannot run outrund '" << bin << "': " << std::strerror(errno)
                  << " (--outrund PATH)\n";
        return 3;
      }
      std::string worker;
      if (*info_.test_fault) {
        std::string looked;
        worker = find_test_worker(bin, &looked);
        if (worker.empty()) {
          std::cerr << "unavailable: the " << a_.name
                    << " drill needs outrun-test-worker, the worker built with test faults, and "
                       "there is none at "
                    << looked
                    << ". It is built in a build tree's bin/ next to outrun-worker and is never "
                       "installed, so an installed outrun cannot run this drill: run it from a "
                       "build tree (build/bin/outrun drill "
                    << a_.name << ")\n";
          return 3;
        }
      }
      if (!daemon_.make_dir(&err) ||
          !daemon_.start(bin, private_host_toml(), private_fault(), worker, &err)) {
        std::cerr << "unavailable: " << err << "\n";
        return 3;
      }
      socket = daemon_.socket();
      daemon_desc = "private outrund (" + bin + "), " + std::to_string(a_.shards) + " shards, " +
                    (worker.empty() ? "" : "workers " + worker + ", ") + "in " + daemon_.dir();
    } else {
      daemon_desc = "outrund at " + socket;
    }
    ClientOptions o;
    o.socket = socket;
    o.name = std::string("outrun-drill ") + info_.name;
    if (Error e = Client::connect(o, &client_)) {
      std::cerr << to_string(e.code) << ": " << e.message << "\n";
      return 3;
    }
    shards_ = client_->shards();
    if (int rc = prepare(); rc != 0) return rc;
    const json before = shard_stats(*client_);
    // The load's scripts live on the home shards; the slow lane (D-slow-lane, the last shard)
    // serves none of them, so recovery is not waited for there.
    load_shards_ = 0;
    for (const auto& s : before) load_shards_ += s.value("slow_lane", false) ? 0 : 1;
    if (load_shards_ == 0) load_shards_ = shards_;  // no stats: every shard
    load_and_fault();
    settle();
    const json after = shard_stats(*client_);
    // What is still in flight now was lost: our disconnect would end it `cancelled`.
    closing_->store(true);
    client_.reset();
    std::string daemon_exit;
    if (a_.socket.empty()) daemon_exit = daemon_.stop();
    return report(daemon_desc, before, after, daemon_exit);
  }

 private:
  std::string private_host_toml() const {
    std::string t = "shards = " + std::to_string(a_.shards) + "\n";
    if (a_.name == "crash-loop") t += "crash_loop_cooldown_ms = 2000\n";
    if (a_.name == "memory")  // the per-script cap and the worker's script budget above the
      // process-wide backstop, and time
      // to fill what the backstop leaves (about 80 MiB past the worker's own 48 MiB of address
      // space; ~0.15 s when the machine is idle, seconds when it is not: the kernel zeroes every
      // page the bomb touches, and one `..` is one C call the soft timeout cannot interrupt)
      t += "memory_limit_mb = 1024\nworker_script_budget_mb = 4096\n"
           "worker_address_space_limit_mb = 128\ntimeout_ms = 5000\n";
    return t;
  }
  std::string private_fault() const {
    if (a_.name == "garbage") return "garbage";
    if (a_.name == "crash-loop") return "crash-at-start=" + crash_flag();
    return "";
  }
  std::string crash_flag() const { return daemon_.dir() + "/crash-at-start"; }

  int prepare() {
    constexpr int kScripts = 256;
    for (int i = 0; i < kScripts; ++i) {
      Script s;
      if (Error e = client_->register_script("drill.load." + std::to_string(i),
                                             "return inputs.x + 1", &s)) {
        std::cerr << to_string(e.code) << ": " << e.message << "\n";
        return 3;
      }
      load_.push_back(s);
    }
    busy_ = std::make_unique<std::atomic<bool>[]>(load_.size());
    const char* src = a_.name == "runaway"  ? kStuckInC
                      : a_.name == "memory" ? kMemoryBomb
                                            : "return 0";
    if (Error e = register_on_shard(*client_, "drill.fault.", src, 0, &fault_script_)) {
      std::cerr << to_string(e.code) << ": " << e.message << "\n";
      return 3;
    }
    // Every load script once, so the workers hold them compiled before the clock starts.
    for (const Script& s : load_)
      if (client_->evaluate(s, {{"x", 0}}).get().status != Status::ok) {
        std::cerr << "the warm-up evaluations did not succeed: is the daemon healthy?\n";
        return 3;
      }
    const std::size_t max_total =
        static_cast<std::size_t>(a_.rate * (a_.duration_s + kMaxExtension.count() + 1) * 1.05) +
        1024;
    evs_ = std::make_unique<Ev[]>(max_total);
    capacity_ = max_total;
    return 0;
  }

  void submit_load(std::size_t script_hint) {
    if (submitted_ >= capacity_) return;
    // The next script not in flight, so that single flight never refuses the drill's own load.
    std::size_t k = script_hint % load_.size();
    bool found = false;
    for (std::size_t tries = 0; tries < load_.size() && !found; ++tries) {
      bool expected = false;
      found = busy_[k].compare_exchange_strong(expected, true);
      if (!found) k = (k + 1) % load_.size();
    }
    if (!found) {
      ++skipped_;
      return;
    }
    const std::size_t i = submitted_++;
    Ev& ev = evs_[i];
    ev.script = static_cast<uint16_t>(k);
    ev.submit_ns = now_ns();
    const int64_t x = static_cast<int64_t>(i);
    client_->evaluate(load_[k], {{"x", x}}, [this, i, k, x](Result r) {
      if (closing_->load()) return;  // ended by our own disconnect: it was lost
      Ev& e = evs_[i];
      e.done_ns = now_ns();
      e.status = r.status;
      e.right = r.status == Status::ok && r.value == Value(x + 1);
      if (r.status == Status::ok)
        note_ok(static_cast<int>(load_[k].shard()), e.submit_ns, e.done_ns);
      busy_[k].store(false);
      e.calls.fetch_add(1, std::memory_order_release);
    });
  }

  // Recovery, as the load runs: per shard, the first ok of an evaluation submitted once the
  // fault was over.
  void note_ok(int shard, int64_t submit_ns, int64_t done_ns) {
    if (shard < 0 || shard >= kMaxShards) return;
    if (submit_ns < clear_ns_.load(std::memory_order_acquire)) return;
    int64_t cur = first_ok_[shard].load();
    while ((cur == 0 || done_ns < cur) && !first_ok_[shard].compare_exchange_weak(cur, done_ns)) {
    }
  }
  bool recovered() const {
    for (int s = 0; s < std::min(load_shards_, kMaxShards); ++s)
      if (first_ok_[s].load() == 0) return false;
    return true;
  }

  void fault_eval(Inputs in) {
    fault_ev_ = std::make_shared<Ev>();
    fault_ev_->submit_ns = now_ns();
    auto ev = fault_ev_;
    auto error = fault_error_;
    client_->evaluate(fault_script_, std::move(in), [ev, error, closing = closing_](Result r) {
      if (closing->load()) return;
      ev->done_ns = now_ns();
      ev->status = r.status;
      *error = r.error;
      ev->calls.fetch_add(1, std::memory_order_release);
    });
  }

  std::vector<int> worker_pids() {
    std::vector<int> pids;
    for (const auto& s : shard_stats(*client_)) pids.push_back(s.value("pid", 0));
    return pids;
  }

  // Signals shard `shard`'s worker. False (and why in fault_note_) when it cannot.
  bool signal_worker(int shard, int sig) {
    const auto pids = worker_pids();
    const int pid = shard < static_cast<int>(pids.size()) ? pids[shard] : 0;
    if (pid <= 0) {
      fault_note_ += "shard " + std::to_string(shard) + " had no worker to signal; ";
      return false;
    }
    if (kill(pid, sig) == 0) {
      if (sig == SIGSTOP) stopped_pid_ = pid;
      fault_note_ += std::string(sig == SIGKILL ? "SIGKILL" : "SIGSTOP") + " to shard " +
                     std::to_string(shard) + "'s worker (pid " + std::to_string(pid) + "); ";
      return true;
    }
    if (errno == EPERM && sig == SIGKILL && !client_->kill_shard(shard)) {
      fault_note_ += "shard " + std::to_string(shard) +
                     ": not allowed to signal its worker, so outrund's kill-shard; ";
      return true;
    }
    fault_note_ += "cannot signal pid " + std::to_string(pid) + ": " + std::strerror(errno) + "; ";
    return false;
  }

  // Does the drill's bad thing; returns when the fault is in place. Sets clear_ns_ when the
  // fault is over (for crash-loop, later, from lift_fault()).
  void inject() {
    fault_ns_ = now_ns();
    const std::string& n = a_.name;
    if (n == "kill-one") {
      fault_ok_ = signal_worker(0, SIGKILL);
    } else if (n == "kill-all") {
      fault_ok_ = true;
      for (int s = 0; s < shards_; ++s) fault_ok_ &= signal_worker(s, SIGKILL);
    } else if (n == "hang") {
      fault_ok_ = signal_worker(0, SIGSTOP);
    } else if (n == "runaway" || n == "memory") {
      fault_eval({});
      fault_ok_ = true;
    } else if (n == "garbage") {
      fault_eval({{"garbage", "bad-flatbuffer"}});
      fault_ok_ = true;
    } else if (n == "crash-loop") {
      std::ofstream(crash_flag()) << "drill\n";
      fault_ok_ = signal_worker(0, SIGKILL);
      return;  // clear_ns_ when lifted
    }
    clear_ns_.store(fault_ns_, std::memory_order_release);
  }
  // Whether shard 0 has been seen in its crash loop (asks outrund at most every 50 ms).
  bool in_crash_loop(int64_t t) {
    if (crash_loop_seen_) return true;
    if (t < last_state_poll_ + 50'000'000) return false;
    last_state_poll_ = t;
    const json shards = shard_stats(*client_);
    crash_loop_seen_ = !shards.empty() && shards[0].value("state", "") == "crash_loop";
    return crash_loop_seen_;
  }
  void lift_fault() {
    std::filesystem::remove(crash_flag());
    clear_ns_.store(now_ns(), std::memory_order_release);
  }

  void load_and_fault() {
    const int64_t start = now_ns();
    start_ns_ = start;
    const auto dur = static_cast<int64_t>(a_.duration_s * 1e9);
    const int64_t fault_at = start + dur / 3;
    const int64_t lift_at = start + 2 * dur / 3;  // crash-loop only
    const int64_t max_end = start + dur + kMaxExtension.count() * 1'000'000'000LL;
    bool injected = false, lifted = a_.name != "crash-loop";
    std::size_t hint = 0;
    for (;;) {
      const int64_t t = now_ns();
      if (t >= max_end || (t >= start + dur && !fault_ok_)) break;
      if (t >= start + dur && recovered()) {
        // ...and a third of the duration after recovery, so that "after" means something.
        if (recovered_seen_ == 0) recovered_seen_ = t;
        if (t >= recovered_seen_ + dur / 3) break;
      }
      if (!injected && t >= fault_at) {
        injected = true;
        inject();  // a few ms at most; the load catches up after
      }
      // crash-loop: the fault is lifted at two thirds of the run, but not before the shard is
      // in its crash loop (slow starts, e.g. under a sanitizer, take longer to get there).
      if (injected && !lifted && t >= lift_at && in_crash_loop(t)) {
        lifted = true;
        lift_fault();
      }
      const auto due = static_cast<std::size_t>(static_cast<double>(t - start) * a_.rate / 1e9);
      while (submitted_ + skipped_ < due && submitted_ < capacity_) submit_load(hint++);
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    end_ns_ = now_ns();
    if (!lifted) lift_fault();
    if (stopped_pid_ > 0) kill(stopped_pid_, SIGCONT);  // harmless when the host killed it
  }

  // Waits for every evaluation to end (or 60 s), then a little more, so that a late duplicate
  // would be seen.
  void settle() {
    const auto limit = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < limit) {
      bool all = !fault_ev_ || fault_ev_->calls.load(std::memory_order_acquire) > 0;
      for (std::size_t i = 0; all && i < submitted_; ++i)
        all = evs_[i].calls.load(std::memory_order_acquire) > 0;
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }

  bool fault_observed(const json& before, const json& after, std::string* what) const {
    const std::string& n = a_.name;
    auto delta = [&](int s, const char* cause) {
      return cause_count(after, s, cause) - cause_count(before, s, cause);
    };
    auto ended = [&](Status st) {
      return fault_ev_ && fault_ev_->calls.load() > 0 && fault_ev_->status == st;
    };
    if (n == "kill-one" || n == "kill-all") {
      const int last = n == "kill-one" ? 1 : shards_;
      for (int s = 0; s < last; ++s)
        if (delta(s, "crashed") + delta(s, "killed_requested") == 0) {
          *what = "shard " + std::to_string(s) + " had no death";
          return false;
        }
      *what = "shard(s) restarted";
      return true;
    }
    if (n == "hang") {
      *what = delta(0, "killed_silence") > 0 ? "shard 0 killed for silence and restarted"
                                             : "shard 0 was never killed for silence";
      return delta(0, "killed_silence") > 0;
    }
    if (n == "runaway") {
      *what = ended(Status::killed) && delta(0, "killed_overrun") > 0
                  ? "the runaway ended `killed`; shard 0 killed at T+G and restarted"
                  : "the runaway did not end `killed` with an overrun kill";
      return ended(Status::killed) && delta(0, "killed_overrun") > 0;
    }
    if (n == "garbage") {
      const bool ok = ended(Status::worker_lost) && delta(0, "protocol_violation") > 0;
      *what = ok ? "the garbage evaluation ended `worker_lost`; shard 0 killed for a protocol "
                   "violation and restarted"
                 : "no protocol violation was seen";
      return ok;
    }
    if (n == "memory") {
      const bool ok = ended(Status::memory_limit) && after[0].value("deaths", uint64_t{0}) ==
                                                         before[0].value("deaths", uint64_t{0});
      *what = !ok ? "the memory bomb did not end `memory_limit`, or its worker died"
              : (*fault_error_).find("backstop") != std::string::npos
                  ? "the memory bomb ended `memory_limit` at the worker's backstop; the worker "
                    "lived on"
                  : "the memory bomb ended `memory_limit` at the per-script limit (this daemon's "
                    "memory_limit_mb is below its worker_address_space_limit_mb)";
      return ok;
    }
    if (n == "crash-loop") {
      const bool ok = delta(0, "exited") > 0 && crash_loop_seen_;
      *what = ok ? "shard 0's workers exited at start " + std::to_string(delta(0, "exited")) +
                       " times, it was in its crash loop, then it served again"
              : delta(0, "exited") == 0
                  ? "shard 0's workers never exited at start (were they outrun-test-worker?)"
                  : "shard 0 never reached its crash loop";
      return ok;
    }
    return false;
  }

  int report(const std::string& daemon_desc, const json& before, const json& after,
             const std::string& daemon_exit) {
    std::map<std::string, uint64_t> by_status;
    uint64_t answered = 0, lost = 0, duplicated = 0, wrong = 0;
    int64_t recovered_at = 0;
    for (int s = 0; s < std::min(load_shards_, kMaxShards); ++s) {
      const int64_t f = first_ok_[s].load();
      if (f == 0) {
        recovered_at = 0;
        break;
      }
      recovered_at = std::max(recovered_at, f);
    }
    LatencyHistogram lat[3];  // before, during, after (ns)
    for (std::size_t i = 0; i < submitted_; ++i) {
      const Ev& e = evs_[i];
      const uint32_t calls = e.calls.load(std::memory_order_acquire);
      if (calls == 0) {
        ++lost;
        continue;
      }
      ++answered;
      if (calls > 1) ++duplicated;
      ++by_status[std::string(to_string(e.status))];
      if (e.status == Status::ok && !e.right) ++wrong;
      const int phase = e.submit_ns < fault_ns_                             ? 0
                        : (recovered_at == 0 || e.submit_ns < recovered_at) ? 1
                                                                            : 2;
      lat[phase].record(e.done_ns - e.submit_ns);
    }
    json fault_json = json::object();
    if (fault_ev_) {
      const uint32_t calls = fault_ev_->calls.load(std::memory_order_acquire);
      if (calls == 0) ++lost;
      if (calls > 1) ++duplicated;
      if (calls > 0) {
        ++answered;
        ++by_status[std::string(to_string(fault_ev_->status))];
      }
      fault_json = {
          {"status", calls ? std::string(to_string(fault_ev_->status)) : "lost"},
          {"error", (*fault_error_)},
          {"latency_ms",
           calls ? static_cast<double>(fault_ev_->done_ns - fault_ev_->submit_ns) / 1e6 : -1.0}};
    }
    std::string observed_what;
    const bool observed = fault_ok_ && fault_observed(before, after, &observed_what);
    const double recovery_ms =
        recovered_at == 0 ? -1.0 : static_cast<double>(recovered_at - clear_ns_.load()) / 1e6;
    const bool daemon_ok = a_.socket.empty() ? daemon_.clean_exit() : true;
    const bool passed =
        lost == 0 && duplicated == 0 && wrong == 0 && observed && recovered_at != 0 && daemon_ok;
    if (!passed && a_.socket.empty()) daemon_.keep();

    const char* phase_names[3] = {"before", "during", "after"};
    json latency = json::object();
    struct {
      uint64_t count;
      double p50_us, p99_us, max_us;
    } q[3];
    for (int p = 0; p < 3; ++p) {
      q[p] = {lat[p].count(), static_cast<double>(lat[p].quantile(0.5)) / 1e3,
              static_cast<double>(lat[p].quantile(0.99)) / 1e3,
              static_cast<double>(lat[p].max()) / 1e3};
      latency[phase_names[p]] = {{"count", q[p].count},
                                 {"p50_us", q[p].p50_us},
                                 {"p99_us", q[p].p99_us},
                                 {"max_us", q[p].max_us}};
    }
    json shards_after = json::array();
    for (const auto& s : after)
      shards_after.push_back({{"index", s.value("index", -1)},
                              {"state", s.value("state", "")},
                              {"restarts", s.value("restarts", 0)},
                              {"death_causes", s.value("death_causes", json::object())},
                              {"last_death", s.value("last_death", "")}});
    const double seconds = static_cast<double>(end_ns_ - start_ns_) / 1e9;
    json j{{"drill", a_.name},
           {"what", info_.what},
           {"daemon", daemon_desc},
           {"rate", a_.rate},
           {"load_seconds", seconds},
           {"fault_at_s", static_cast<double>(fault_ns_ - start_ns_) / 1e9},
           {"fault", fault_note_.empty() ? observed_what : fault_note_ + observed_what},
           {"fault_observed", observed},
           {"submitted", submitted_ + (fault_ev_ ? 1 : 0)},
           {"not_submitted", skipped_},
           {"answered", answered},
           {"completed", by_status},
           {"lost", lost},
           {"duplicated", duplicated},
           {"wrong_values", wrong},
           {"recovery_ms", recovery_ms},
           {"latency_us", latency},
           {"fault_evaluation", fault_json},
           {"shards", shards_after},
           {"passed", passed}};
    if (!daemon_exit.empty()) j["daemon_exit"] = daemon_exit;
    if (!passed && a_.socket.empty()) j["daemon_log"] = daemon_.log();
    if (a_.json) {
      std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
      return passed ? 0 : 1;
    }
    std::printf("outrun drill %s: %s\n", a_.name.c_str(), info_.what);
    std::printf("  daemon        %s\n", daemon_desc.c_str());
    std::printf("  load          %d/s for %.1f s over %zu scripts; fault at %.2f s\n", a_.rate,
                seconds, load_.size(), static_cast<double>(fault_ns_ - start_ns_) / 1e9);
    std::printf("  fault         %s%s\n", fault_note_.c_str(), observed_what.c_str());
    if (fault_ev_)
      std::printf("  its evaluation %s%s%s\n", fault_json["status"].get<std::string>().c_str(),
                  (*fault_error_).empty() ? "" : ": ", (*fault_error_).c_str());
    std::printf("  submitted     %zu", submitted_ + (fault_ev_ ? 1 : 0));
    if (skipped_) std::printf("  (%zu not submitted: every script in flight)", skipped_);
    std::printf("\n  completed     %llu:",
                static_cast<unsigned long long>(j["answered"].get<uint64_t>()));
    for (const auto& [k, v] : by_status)
      std::printf(" %s %llu", k.c_str(), static_cast<unsigned long long>(v));
    std::printf("\n");
    std::printf("  lost          %llu\n  duplicated    %llu\n  wrong values  %llu\n",
                static_cast<unsigned long long>(lost), static_cast<unsigned long long>(duplicated),
                static_cast<unsigned long long>(wrong));
    if (recovered_at)
      std::printf(
          "  recovery      %.1f ms (from the end of the fault until every shard answered "
          "ok an evaluation submitted after it)\n",
          recovery_ms);
    else
      std::printf("  recovery      NONE: not every shard answered ok again\n");
    std::printf("  latency       %-8s %8s %10s %10s %10s\n", "", "count", "p50 µs", "p99 µs",
                "max µs");
    for (int p = 0; p < 3; ++p)
      std::printf("                %-8s %8llu %10.0f %10.0f %10.0f\n", phase_names[p],
                  static_cast<unsigned long long>(q[p].count), q[p].p50_us, q[p].p99_us,
                  q[p].max_us);
    for (const auto& s : shards_after)
      std::printf("  shard %d       %s, %llu restarts%s%s\n", s["index"].get<int>(),
                  s["state"].get<std::string>().c_str(),
                  static_cast<unsigned long long>(s["restarts"].get<uint64_t>()),
                  s["last_death"].get<std::string>().empty() ? "" : "; last death: ",
                  s["last_death"].get<std::string>().c_str());
    if (!daemon_exit.empty()) std::printf("  outrund       stopped: %s\n", daemon_exit.c_str());
    if (!passed && a_.socket.empty()) std::printf("  outrund log   %s\n", daemon_.log().c_str());
    std::printf("  result        %s\n", passed ? "PASS" : "FAIL");
    return passed ? 0 : 1;
  }

  static constexpr int kMaxShards = 64;
  static constexpr std::chrono::seconds kMaxExtension{30};  // load goes on this long for recovery

  DrillArgs a_;
  const DrillInfo& info_;
  PrivateDaemon daemon_;
  std::unique_ptr<Client> client_;
  int shards_ = 0;
  int load_shards_ = 0;  // shards_ but the slow lane
  std::vector<Script> load_;
  std::unique_ptr<std::atomic<bool>[]> busy_;
  Script fault_script_;
  std::unique_ptr<Ev[]> evs_;
  std::size_t capacity_ = 0;
  std::size_t submitted_ = 0;
  std::size_t skipped_ = 0;
  std::shared_ptr<Ev> fault_ev_;
  std::shared_ptr<std::atomic<bool>> closing_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::string> fault_error_ = std::make_shared<std::string>();
  int stopped_pid_ = 0;  // hang: SIGCONT at the end, should the host not have killed it
  std::string fault_note_;
  bool fault_ok_ = true;
  int64_t start_ns_ = 0, end_ns_ = 0, fault_ns_ = 0, recovered_seen_ = 0;
  int64_t last_state_poll_ = 0;
  bool crash_loop_seen_ = false;
  std::atomic<int64_t> clear_ns_{INT64_MAX};
  std::atomic<int64_t> first_ok_[kMaxShards] = {};
};

}  // namespace

const std::vector<std::string>& drill_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const DrillInfo& d : kDrills) v.emplace_back(d.name);
    return v;
  }();
  return names;
}

int run_drill(const DrillArgs& args) {
  const DrillInfo* info = find_drill(args.name);
  if (!info) {
    std::cerr << "invalid_argument: unknown drill '" << args.name << "'\n";
    return 2;
  }
  // One slot per evaluation the drill may submit, the 30 s of extension included.
  if (static_cast<double>(args.rate) * (args.duration_s + 31) > 10e6) {
    std::cerr << "invalid_argument: --rate x (--duration + 31 s) may not pass 10 million "
                 "evaluations (one slot each)\n";
    return 2;
  }
  if (!args.socket.empty()) {
    if (*info->test_fault) {
      std::cerr << "invalid_argument: the " << args.name
                << " drill needs workers started with the test fault '" << info->test_fault
                << "' (outrun-test-worker), which a production outrund never has; run it without "
                   "--socket (the drill then starts a private outrund)\n";
      return 2;
    }
    if (args.shards_given) {
      std::cerr << "invalid_argument: --shards is for the private outrund; the daemon at "
                << args.socket << " has its own\n";
      return 2;
    }
  }
  Drill d(args, *info);
  return d.run();
}

}  // namespace outrun::cli

// The peer a user would pick instead of outrun: Redis running the same script through EVALSHA
// (BRIEF §5). The harness starts its own redis-server on a Unix socket in a temporary folder, with
// no persistence, talks RESP to it with a minimal client of its own, and stops it and removes the
// folder whatever happens (also on SIGINT/SIGTERM).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "floors.h"
#include "measure.h"

namespace outrun::perf {

// The script of BRIEF §5, as Redis runs it. Redis turns the Lua number into an integer reply
// (truncated): (a + (a + 1)) / 2 answers a.
inline constexpr const char* kRedisScript = "return (tonumber(ARGV[1]) + tonumber(ARGV[2])) / 2";

class RedisServer {
 public:
  // Finds `binary` (a path, or a name looked up on PATH and in /usr/bin, /usr/sbin), starts it
  // and waits until it answers PING. Returns null with *why set when it is absent or fails.
  static std::unique_ptr<RedisServer> start(const std::string& binary, std::string* why);
  ~RedisServer();  // SIGTERM (then SIGKILL), removes the folder
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int pid() const { return pid_; }
  const std::string& socket_path() const { return socket_; }
  const std::string& version() const { return version_; }

  // SCRIPT LOAD of kRedisScript; returns its SHA-1 (empty on failure).
  std::string load_script();

 private:
  RedisServer() = default;
  int pid_ = 0;
  std::string dir_, socket_, log_, version_;
};

struct RedisPipelinedFig {
  double evals_per_s = 0;
  double client_cpu_us_per_eval = 0;    // this process
  double server_cpu_us_per_eval = 0;    // redis-server
  double server_switches_per_eval = 0;  // redis-server: voluntary + involuntary
  int64_t evaluations = 0;
  int64_t wrong = 0;
};

// One client, one request at a time. *server (when given): what redis-server spent over the
// measured requests.
LatencyFig redis_single_client(const RedisServer& server, const std::string& sha, int iterations,
                               int64_t* wrong, ProcsCost* server_cost = nullptr);
// One connection, open loop paced at `rate`: a pacing thread writes, a reader thread reads the
// replies in order; latency from the intended send time. other_* = redis-server.
PacedFig redis_paced(const RedisServer& server, const std::string& sha, double rate,
                     double warmup_s, double duration_s);
// `clients` connections, each keeping a `depth`-deep pipeline (send depth, read depth, repeat),
// driven by one epoll thread, every reply checked.
RedisPipelinedFig redis_pipelined(const RedisServer& server, const std::string& sha, int clients,
                                  int depth, double seconds);

}  // namespace outrun::perf

// outrund as a server, beside redis-server in the same run (issue 15): the harness starts its own
// outrund on a Unix socket in a temporary folder (the build's bin/outrund, next to outrun-perf),
// registers the same script as the host rows, and talks to it with a minimal client of its own:
// raw frames built with protocol/'s encoders and decoders, blocking write + read, like
// redis_peer.cpp's RESP client, so that both servers are measured through the same kind of client.
// outrund is stopped and the folder removed whatever happens (also on SIGINT/SIGTERM/SIGHUP).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "floors.h"
#include "measure.h"

namespace outrun::perf {

class DaemonServer {
 public:
  struct Launch {
    std::string binary;  // outrund
    int shards = 2;      // as the host rows
    int keys = 64;       // the script is registered under this many keys, used round robin
    std::string script;  // its source (outrun_perf.cpp's kScript)
  };
  // Starts outrund (single flight off, as the host rows' loads have it: several evaluations of
  // a key in flight), waits until it listens, registers the script under every key and
  // evaluates each once (its worker compiles it). Null with *why set when it cannot.
  static std::unique_ptr<DaemonServer> start(const Launch& launch, std::string* why);
  ~DaemonServer();  // SIGTERM (it drains and stops its workers), SIGKILL after 10 s; the folder
  DaemonServer(const DaemonServer&) = delete;
  DaemonServer& operator=(const DaemonServer&) = delete;

  int pid() const { return pid_; }
  // Its worker processes: the children of outrund, read from /proc now.
  std::vector<int> worker_pids() const;
  const std::string& socket_path() const { return socket_; }
  // The handles of the script's keys (Registered.handle64), in key order.
  const std::vector<uint64_t>& handles() const { return handles_; }

 private:
  DaemonServer() = default;
  int pid_ = 0;
  std::string dir_, socket_;
  std::vector<uint64_t> handles_;
};

// What outrund spent over a measured window, per evaluation: outrund's own threads and,
// apart, its workers (ProcsCost: on-CPU, voluntary and involuntary context switches).
struct DaemonCost {
  double daemon_us = 0, workers_us = 0;              // on-CPU µs per evaluation
  double daemon_switches = 0, workers_switches = 0;  // voluntary + involuntary per evaluation
  double daemon_voluntary = 0, workers_voluntary = 0;
  double total_us() const { return daemon_us + workers_us; }
};

// How the raw-frames client sends inputs: protocol 2's Evaluation.inputs_buffer (true, the
// default) or protocol 1's `inputs` (outrun-perf --daemon-inputs plain).
void set_daemon_nested_inputs(bool nested);

struct DaemonSingleFig {
  LatencyFig lat;
  DaemonCost cost;
  int64_t wrong = 0;
};
// One client, one evaluation at a time (write one Evaluate frame, read its Results), `iterations`
// measured after 200 unmeasured; every result checked.
DaemonSingleFig daemon_single_client(const DaemonServer& server, int iterations);

struct DaemonPipelinedFig {
  double evals_per_s = 0;
  double client_cpu_us_per_eval = 0;  // this process
  DaemonCost cost;
  int64_t evaluations = 0;
  int64_t wrong = 0;
};
// `clients` connections, each keeping a `depth`-deep pipeline as redis_pipelined does (one write
// of `depth` Evaluate frames of one evaluation each, then read every answer, repeat), driven by
// one epoll thread; every result checked (answers may come in any order: by id).
DaemonPipelinedFig daemon_pipelined(const DaemonServer& server, int clients, int depth,
                                    double seconds);

}  // namespace outrun::perf

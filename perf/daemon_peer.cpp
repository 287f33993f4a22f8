#include "daemon_peer.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <variant>

#include "daemon_process.h"
#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/wire_value.h"

namespace outrun::perf {

namespace {

// ---- cleanup whatever happens: the destructor, exit(), SIGINT/SIGTERM/SIGHUP ----

cli::DaemonProcess g_process;  // the one outrund of the run
std::atomic<int> g_daemon_pid{0};
char g_dir[256];
// What outrund and the harness leave in the folder (unlinked from a signal handler too).
constexpr std::array<const char*, 3> kFiles = {"outrund.sock", "outrund.log", "outrund.toml"};
struct sigaction g_previous[3];
constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGHUP};

void remove_files_async_safe() {  // only async-signal-safe calls
  if (!g_dir[0]) return;
  char path[320];
  for (const char* f : kFiles) {
    std::size_t n = 0;
    for (const char* p = g_dir; *p && n < sizeof path - 1; ++p) path[n++] = *p;
    if (n < sizeof path - 1) path[n++] = '/';
    for (const char* p = f; *p && n < sizeof path - 1; ++p) path[n++] = *p;
    path[n] = '\0';
    unlink(path);
  }
  rmdir(g_dir);
}

void kill_and_remove(int sig) {
  const int pid = g_daemon_pid.exchange(0);
  if (pid > 0) {
    kill(pid, SIGKILL);  // its workers see the end of their stream and exit
    waitpid(pid, nullptr, 0);
  }
  remove_files_async_safe();
  if (sig == 0) return;
  for (std::size_t i = 0; i < kSignals.size(); ++i)
    if (kSignals[i] == sig && g_previous[i].sa_handler != SIG_DFL &&
        g_previous[i].sa_handler != SIG_IGN && !(g_previous[i].sa_flags & SA_SIGINFO)) {
      g_previous[i].sa_handler(sig);  // redis_peer's: stops redis-server, then re-raises
      return;
    }
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_cleanup_once() {
  static bool done = false;
  if (done) return;
  done = true;
  std::atexit([] {
    g_daemon_pid.store(0);
    g_process.kill_now();  // should it still run: the destructor was skipped
    remove_files_async_safe();
  });
  for (std::size_t i = 0; i < kSignals.size(); ++i) {
    struct sigaction sa {};
    sa.sa_handler = &kill_and_remove;
    sigemptyset(&sa.sa_mask);
    sigaction(kSignals[i], &sa, &g_previous[i]);
  }
}

// ---- a minimal client: raw frames, the protocol/ codecs ----

int64_t input_of(int64_t i) {
  return i % 1'000'000;
}

// Protocol 2's Evaluation.inputs_buffer (outrund passes it to the worker as it is), or protocol
// 1's `inputs` (outrund decodes them and the host encodes them again): --daemon-inputs.
bool g_nested_inputs = true;

}  // namespace

void set_daemon_nested_inputs(bool nested) {
  g_nested_inputs = nested;
}

namespace {

class FrameConn {
 public:
  explicit FrameConn(const std::string& path) { fd_ = connect_unix(path); }
  ~FrameConn() {
    if (fd_ >= 0) close(fd_);
  }
  FrameConn(const FrameConn&) = delete;
  FrameConn& operator=(const FrameConn&) = delete;
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void set_nonblocking() { fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK); }

  bool send(std::span<const uint8_t> s) {
    while (!s.empty()) {
      const ssize_t n = ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
      if (n > 0) {
        s = s.subspan(static_cast<std::size_t>(n));
      } else if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
        if (errno == EAGAIN) std::this_thread::yield();
      } else {
        return false;
      }
    }
    return true;
  }

  // One read. 1: got bytes, 0: would block, -1: end of stream or error.
  int fill() {
    const long n = reader_.read_from(fd_);
    if (n > 0) return 1;
    return n == -EAGAIN ? 0 : -1;
  }
  // The next complete frame already read; false when more bytes are needed (or broken()).
  bool next(protocol::FrameView& v) { return reader_.next(v); }
  bool broken() const { return reader_.error() != protocol::FrameError::kNone; }

  // Blocks until the next daemon frame that this client knows, decoded into *m.
  bool read_message(protocol::DaemonMessage* m) {
    protocol::FrameView v;
    std::string why;
    for (;;) {
      while (reader_.next(v))
        if (protocol::decode_daemon_frame(v.frame, m, &why)) return true;
      if (broken() || fill() < 0) return false;
    }
  }

  // ClientHello, then the ServerHello (refused: false).
  bool hello(std::string* why) {
    flatbuffers::FlatBufferBuilder fbb;
    protocol::DaemonMessage m;
    if (!send(protocol::encode_client_hello(fbb, "outrun-perf",
                                            g_nested_inputs ? protocol::kProtocolVersion : 1)) ||
        !read_message(&m)) {
      *why = "no ServerHello";
      return false;
    }
    const auto* h = std::get_if<protocol::ServerHelloMsg>(&m);
    if (!h || h->error) {
      *why = h ? "refused: " + std::string(*h->error) : "a frame other than ServerHello first";
      return false;
    }
    return true;
  }

  bool register_script(const std::string& key, const std::string& source, uint64_t* handle,
                       std::string* why) {
    flatbuffers::FlatBufferBuilder fbb;
    protocol::DaemonMessage m;
    if (!send(protocol::encode_register(fbb, 1, key, source)) || !read_message(&m)) {
      *why = "no answer to Register";
      return false;
    }
    const auto* r = std::get_if<protocol::RegisteredMsg>(&m);
    if (!r || r->status != wire::Status::Ok) {
      *why = "Register refused" + (r ? ": " + r->error : std::string());
      return false;
    }
    *handle = r->handle64;
    return true;
  }

 private:
  int fd_ = -1;
  protocol::FrameReader reader_;
};

// Evaluate { one Evaluation: id, the handle, inputs a = input_of(id), b = a + 1 }, appended to
// `out` (fbb is cleared: the frame is copied out).
void append_evaluate(std::vector<uint8_t>& out, flatbuffers::FlatBufferBuilder& fbb, int64_t id,
                     uint64_t handle) {
  // The inputs: in a builder of their own (an InputList) or in the frame's.
  static thread_local flatbuffers::FlatBufferBuilder list(256);
  flatbuffers::FlatBufferBuilder& ib = g_nested_inputs ? list : fbb;
  fbb.Clear();
  ib.Clear();
  protocol::WireValueBuilder v(ib);
  const int64_t a = input_of(id);
  const auto va = v.integer(a);
  const auto vb = v.integer(a + 1);
  const auto na = ib.CreateString("a");
  const auto nb = ib.CreateString("b");
  const std::array<flatbuffers::Offset<wire::Input>, 2> in = {wire::CreateInput(ib, na, va),
                                                              wire::CreateInput(ib, nb, vb)};
  const auto inputs = ib.CreateVector(in.data(), in.size());
  flatbuffers::Offset<wire::Evaluation> ev;
  if (g_nested_inputs) {
    ib.Finish(wire::CreateInputList(ib, inputs));
    const auto buffer = protocol::add_input_list(fbb, {ib.GetBufferPointer(), ib.GetSize()});
    ev = protocol::build_evaluation(fbb, static_cast<uint64_t>(id), static_cast<uint32_t>(handle),
                                    0, {}, nullptr, buffer, handle);
  } else {
    ev = protocol::build_evaluation(fbb, static_cast<uint64_t>(id), static_cast<uint32_t>(handle),
                                    0, inputs, nullptr, {}, handle);
  }
  const std::span<const uint8_t> frame = protocol::finish_evaluate(fbb, std::span(&ev, 1));
  out.insert(out.end(), frame.begin(), frame.end());
}

std::atomic<bool> g_reported{false};

// ok with (a + b) / 2 = a + 0.5 for the input of its id.
bool result_ok(const protocol::ClientResult& r) {
  const double want = static_cast<double>(input_of(static_cast<int64_t>(r.id))) + 0.5;
  if (r.status == wire::Status::Ok && r.value && r.value->kind() == wire::ValueKind::Double &&
      r.value->double_value() == want)
    return true;
  if (!g_reported.exchange(true))
    std::fprintf(stderr, "outrun-perf: outrund answered id %llu with status %d %s\n",
                 static_cast<unsigned long long>(r.id), static_cast<int>(r.status),
                 r.error.c_str());
  return false;
}

// One blocking round trip of `frame` (one evaluation, `id`): its result checked into *right.
// False when the connection failed.
bool round_trip(FrameConn& c, std::span<const uint8_t> frame, int64_t id, bool* right) {
  if (!c.send(frame)) return false;
  protocol::DaemonMessage m;
  while (c.read_message(&m)) {
    const auto* res = std::get_if<protocol::ResultsMsg>(&m);
    if (!res || !res->items || res->items->size() == 0) continue;
    protocol::ClientResult r;
    protocol::decode_daemon_result(res->items->Get(0), &r);
    *right = res->items->size() == 1 && r.id == static_cast<uint64_t>(id) && result_ok(r);
    return true;
  }
  return false;
}

std::vector<int> children_of(int parent) {
  std::vector<int> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/stat");
    std::string s((std::istreambuf_iterator<char>(f)), {});
    const auto close = s.rfind(')');
    if (close == std::string::npos) continue;
    int ppid = 0;
    char state = 0;
    if (std::sscanf(s.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent)
      out.push_back(std::atoi(e->d_name));
  }
  closedir(d);
  return out;
}

DaemonCost cost_of(const ProcsCost& daemon, const ProcsCost& workers, int64_t evaluations) {
  const double n = static_cast<double>(std::max<int64_t>(1, evaluations));
  DaemonCost c;
  c.daemon_us = us(daemon.cpu_ns) / n;
  c.workers_us = us(workers.cpu_ns) / n;
  c.daemon_switches = static_cast<double>(daemon.voluntary + daemon.involuntary) / n;
  c.workers_switches = static_cast<double>(workers.voluntary + workers.involuntary) / n;
  c.daemon_voluntary = static_cast<double>(daemon.voluntary) / n;
  c.workers_voluntary = static_cast<double>(workers.voluntary) / n;
  return c;
}

}  // namespace

std::unique_ptr<DaemonServer> DaemonServer::start(const Launch& launch, std::string* why) {
  if (access(launch.binary.c_str(), X_OK) != 0) {
    *why = "outrund not found at '" + launch.binary + "' (build the outrund target)";
    return nullptr;
  }
  if (g_process.pid() > 0) {
    *why = "an outrund of this run is already running";
    return nullptr;
  }
  install_cleanup_once();
  std::unique_ptr<DaemonServer> s(new DaemonServer());
  s->dir_ = cli::make_temp_dir("outrun-perf-outrund", why);
  if (s->dir_.empty()) return nullptr;
  std::snprintf(g_dir, sizeof g_dir, "%s", s->dir_.c_str());
  s->socket_ = s->dir_ + "/outrund.sock";
  const std::string config = s->dir_ + "/outrund.toml";
  {
    // cache_dir: the folder itself, so that outrund creates nothing outside it.
    std::ofstream f(config);
    f << "[daemon]\nsocket = \"" << s->socket_ << "\"\nlog_file = \"" << s->dir_
      << "/outrund.log\"\nlog_level = \"error\"\ncache_dir = \"" << s->dir_ << "\"\n\n[host]\n"
      << "shards = " << launch.shards << "\nsingle_flight = \"off\"\n";
    if (!f) {
      *why = "cannot write " + config;
      return nullptr;
    }
  }
  cli::DaemonLaunch l;
  l.binary = launch.binary;
  l.args = {"--config", config};
  l.socket = s->socket_;
  l.death_signal = SIGTERM;  // a harness that dies takes its daemon with it
  if (!g_process.start(l, why)) return nullptr;
  s->pid_ = g_process.pid();
  g_daemon_pid.store(s->pid_);

  FrameConn c(s->socket_);
  if (!c.ok() || !c.hello(why)) {
    if (c.ok()) *why = "outrund: " + *why;
    return nullptr;
  }
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<uint8_t> buf;
  for (int k = 0; k < launch.keys; ++k) {
    uint64_t handle = 0;
    if (!c.register_script("perf.avg." + std::to_string(k), launch.script, &handle, why))
      return nullptr;
    s->handles_.push_back(handle);
    buf.clear();
    append_evaluate(buf, fbb, k, handle);
    bool right = false;
    if (!round_trip(c, buf, k, &right) || !right) {
      *why = "the first evaluation of key " + std::to_string(k) + " failed";
      return nullptr;
    }
  }
  return s;
}

DaemonServer::~DaemonServer() {
  if (pid_ > 0) {
    g_process.stop(std::chrono::seconds(10));
    g_daemon_pid.store(0);
  }
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  g_dir[0] = '\0';
}

std::vector<int> DaemonServer::worker_pids() const {
  return children_of(pid_);
}

DaemonSingleFig daemon_single_client(const DaemonServer& server, int iterations) {
  DaemonSingleFig f;
  FrameConn c(server.socket_path());
  std::string why;
  if (!c.ok() || !c.hello(&why)) {
    f.wrong = 1;
    return f;
  }
  const std::vector<uint64_t>& handles = server.handles();
  const std::vector<int> daemon = {server.pid()}, workers = server.worker_pids();
  LatencyHistogram h;
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<uint8_t> buf;
  ProcsCost d0, w0;
  int measured = 0;
  for (int i = 0; i < iterations + 200; ++i) {
    if (i == 200) {
      d0 = procs_cost(daemon);
      w0 = procs_cost(workers);
    }
    buf.clear();
    append_evaluate(buf, fbb, i, handles[static_cast<std::size_t>(i) % handles.size()]);
    const int64_t t0 = mono_ns();
    bool right = false;
    const bool answered = round_trip(c, buf, i, &right);
    const int64_t dt = mono_ns() - t0;
    if (!answered) {
      ++f.wrong;
      break;
    }
    if (!right) ++f.wrong;
    if (i >= 200) {
      h.record(dt);
      ++measured;
    }
  }
  f.cost = cost_of(procs_cost(daemon) - d0, procs_cost(workers) - w0, measured);
  f.lat = latency_of(h);
  return f;
}

DaemonPipelinedFig daemon_pipelined(const DaemonServer& server, int clients, int depth,
                                    double seconds) {
  DaemonPipelinedFig f;
  struct Conn {
    std::unique_ptr<FrameConn> conn;
    int64_t next = 0;         // id of the next evaluation to send
    int64_t batch_start = 0;  // first id of the batch in flight
    int64_t received = 0;     // answers read
    std::vector<bool> seen;   // of the batch in flight, by id - batch_start
    bool sending = true;
  };
  const std::vector<uint64_t>& handles = server.handles();
  std::vector<Conn> conns(static_cast<std::size_t>(clients));
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  for (std::size_t k = 0; k < conns.size(); ++k) {
    conns[k].conn = std::make_unique<FrameConn>(server.socket_path());
    std::string why;
    if (!conns[k].conn->ok() || !conns[k].conn->hello(&why)) {
      f.wrong = 1;
      close(ep);
      return f;
    }
    conns[k].conn->set_nonblocking();
    conns[k].seen.assign(static_cast<std::size_t>(depth), false);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = k;
    epoll_ctl(ep, EPOLL_CTL_ADD, conns[k].conn->fd(), &ev);
  }
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<uint8_t> buf;
  std::size_t key = 0;
  auto send_batch = [&](Conn& c) {
    buf.clear();
    c.batch_start = c.next;
    std::fill(c.seen.begin(), c.seen.end(), false);
    for (int d = 0; d < depth; ++d) {
      append_evaluate(buf, fbb, c.next++, handles[key]);
      key = (key + 1) % handles.size();
    }
    return c.conn->send(buf);
  };
  const std::vector<int> daemon = {server.pid()}, workers = server.worker_pids();
  Window w;
  const ProcsCost d0 = procs_cost(daemon), w0 = procs_cost(workers);
  w.start();
  const int64_t end = w.wall0 + static_cast<int64_t>(seconds * 1e9);
  for (auto& c : conns) send_batch(c);
  std::size_t active = conns.size();
  protocol::FrameView v;
  protocol::DaemonMessage m;
  std::string why;
  while (active > 0) {
    epoll_event events[64];
    const int n = epoll_wait(ep, events, 64, 1000);
    if (n < 0 && errno != EINTR) break;
    if (n == 0) {  // nothing for a second: an answer is missing
      f.wrong += 1;
      break;
    }
    const bool past_end = mono_ns() >= end;
    for (int e = 0; e < n && active > 0; ++e) {
      Conn& c = conns[events[e].data.u64];
      if (c.conn->fill() < 0) {
        f.wrong += 1;
        active = 0;
        break;
      }
      while (c.conn->next(v)) {
        if (!protocol::decode_daemon_frame(v.frame, &m, &why)) continue;
        const auto* res = std::get_if<protocol::ResultsMsg>(&m);
        if (!res || !res->items) continue;
        for (const wire::Result* item : *res->items) {
          protocol::ClientResult r;
          protocol::decode_daemon_result(item, &r);
          const int64_t at = static_cast<int64_t>(r.id) - c.batch_start;
          if (at < 0 || at >= depth || c.seen[static_cast<std::size_t>(at)]) {
            ++f.wrong;  // not of this batch, or twice
            continue;
          }
          c.seen[static_cast<std::size_t>(at)] = true;
          if (!result_ok(r)) ++f.wrong;
          ++c.received;
        }
      }
      if (c.conn->broken()) {
        f.wrong += 1;
        active = 0;
        break;
      }
      if (c.received == c.next && c.sending) {
        if (past_end) {
          c.sending = false;
          --active;
        } else if (!send_batch(c)) {
          f.wrong += 1;
          active = 0;
          break;
        }
      }
    }
  }
  w.stop();
  const ProcsCost d1 = procs_cost(daemon), w1 = procs_cost(workers);
  close(ep);
  for (auto& c : conns) f.evaluations += c.received;
  const double n = static_cast<double>(std::max<int64_t>(1, f.evaluations));
  f.evals_per_s = static_cast<double>(f.evaluations) / (static_cast<double>(w.wall_ns) / 1e9);
  f.client_cpu_us_per_eval = us(w.cpu_ns) / n;
  f.cost = cost_of(d1 - d0, w1 - w0, f.evaluations);
  return f;
}

}  // namespace outrun::perf

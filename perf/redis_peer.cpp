#include "redis_peer.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string_view>
#include <thread>
#include <vector>

#include "measure.h"

namespace outrun::perf {

namespace {

// ---- cleanup whatever happens: the destructor, exit(), SIGINT/SIGTERM/SIGHUP ----

std::atomic<int> g_redis_pid{0};
char g_redis_dir[256];
char g_redis_socket[320];
char g_redis_log[320];

void remove_files_async_safe() {  // only async-signal-safe calls
  if (g_redis_socket[0]) unlink(g_redis_socket);
  if (g_redis_log[0]) unlink(g_redis_log);
  if (g_redis_dir[0]) rmdir(g_redis_dir);
}

void kill_and_remove(int sig) {
  const int pid = g_redis_pid.exchange(0);
  if (pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  remove_files_async_safe();
  if (sig != 0) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

void install_cleanup_once() {
  static bool done = false;
  if (done) return;
  done = true;
  std::atexit([] { kill_and_remove(0); });
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction sa {};
    sa.sa_handler = &kill_and_remove;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}

std::string find_binary(const std::string& name) {
  auto executable = [](const std::string& p) { return access(p.c_str(), X_OK) == 0; };
  if (name.find('/') != std::string::npos) return executable(name) ? name : "";
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/bin:/usr/sbin:/usr/local/bin";
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t end = std::min(path.find(':', start), path.size());
    const std::string dir = path.substr(start, end - start);
    if (!dir.empty() && executable(dir + "/" + name)) return dir + "/" + name;
    start = end + 1;
  }
  return "";
}

// ---- a minimal RESP client ----

struct Reply {
  char type = 0;  // '+', '-', ':', '$' ('$' with nil = true for a null bulk string)
  int64_t integer = 0;
  std::string text;
  bool nil = false;
};

class Resp {
 public:
  explicit Resp(const std::string& path) { fd_ = connect_unix(path); }
  ~Resp() {
    if (fd_ >= 0) close(fd_);
  }
  Resp(const Resp&) = delete;
  Resp& operator=(const Resp&) = delete;
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void set_nonblocking() { fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK); }

  bool send(std::string_view s) {
    while (!s.empty()) {
      const ssize_t n = write(fd_, s.data(), s.size());
      if (n > 0) {
        s.remove_prefix(static_cast<std::size_t>(n));
      } else if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
        if (errno == EAGAIN) std::this_thread::yield();
      } else {
        return false;
      }
    }
    return true;
  }

  // One read into the buffer. 1: got bytes, 0: would block, -1: EOF or error.
  int fill() {
    if (pos_ == end_) {
      pos_ = end_ = 0;
    } else if (pos_ > buf_.size() / 2) {
      std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
      end_ -= pos_;
      pos_ = 0;
    }
    if (buf_.size() - end_ < 4096) buf_.resize(buf_.size() * 2);
    ssize_t n;
    do {
      n = read(fd_, buf_.data() + end_, buf_.size() - end_);
    } while (n < 0 && errno == EINTR);
    if (n > 0) {
      end_ += static_cast<std::size_t>(n);
      return 1;
    }
    return n < 0 && errno == EAGAIN ? 0 : -1;
  }

  // Parses one reply from what is buffered. 1: parsed, 0: incomplete, -1: unsupported/garbage.
  int parse(Reply* r) {
    const std::string_view have(buf_.data() + pos_, end_ - pos_);
    const std::size_t eol = have.find("\r\n");
    if (eol == std::string_view::npos || have.empty()) return 0;
    const char* line = have.data() + 1;
    const char* line_end = have.data() + eol;
    r->type = have[0];
    r->nil = false;
    switch (r->type) {
      case '+':
      case '-':
        r->text.assign(line, line_end);
        pos_ += eol + 2;
        return 1;
      case ':':
        if (std::from_chars(line, line_end, r->integer).ec != std::errc()) return -1;
        pos_ += eol + 2;
        return 1;
      case '$': {
        int64_t len = 0;
        if (std::from_chars(line, line_end, len).ec != std::errc()) return -1;
        if (len < 0) {
          r->nil = true;
          r->text.clear();
          pos_ += eol + 2;
          return 1;
        }
        if (have.size() < eol + 2 + static_cast<std::size_t>(len) + 2) return 0;
        r->text.assign(have.data() + eol + 2, static_cast<std::size_t>(len));
        pos_ += eol + 2 + static_cast<std::size_t>(len) + 2;
        return 1;
      }
      default:
        return -1;
    }
  }

  bool read_reply(Reply* r) {
    for (;;) {
      const int k = parse(r);
      if (k == 1) return true;
      if (k < 0 || fill() < 0) return false;
    }
  }

  bool command(std::string_view wire, Reply* r) { return send(wire) && read_reply(r); }

 private:
  int fd_ = -1;
  std::vector<char> buf_ = std::vector<char>(1u << 16);
  std::size_t pos_ = 0, end_ = 0;
};

void append_bulk(std::string& out, std::string_view s) {
  char len[24];
  const auto end = std::to_chars(len, len + sizeof len, s.size()).ptr;
  out += '$';
  out.append(len, end);
  out += "\r\n";
  out += s;
  out += "\r\n";
}

std::string command(std::initializer_list<std::string_view> args) {
  std::string out = "*" + std::to_string(args.size()) + "\r\n";
  for (auto a : args) append_bulk(out, a);
  return out;
}

// EVALSHA sha 0 a a+1, appended to `out`.
void append_evalsha(std::string& out, const std::string& sha, int64_t a) {
  out += "*5\r\n$7\r\nEVALSHA\r\n$40\r\n";
  out += sha;
  out += "\r\n$1\r\n0\r\n";
  char num[24];
  append_bulk(out, std::string_view(num, static_cast<std::size_t>(
                                             std::to_chars(num, num + sizeof num, a).ptr - num)));
  append_bulk(out,
              std::string_view(num, static_cast<std::size_t>(
                                        std::to_chars(num, num + sizeof num, a + 1).ptr - num)));
}

int64_t input_of(int64_t i) {
  return i % 1'000'000;
}

bool reply_ok(const Reply& r, int64_t i) {
  return r.type == ':' && r.integer == input_of(i);
}

void report_first_error(const Reply& r, std::atomic<bool>* reported) {
  if (r.type == '-' && !reported->exchange(true))
    std::fprintf(stderr, "outrun-perf: redis answered %s\n", r.text.c_str());
}

}  // namespace

std::unique_ptr<RedisServer> RedisServer::start(const std::string& binary, std::string* why) {
  const std::string bin = find_binary(binary);
  if (bin.empty()) {
    *why = "redis-server not found ('" + binary + "'; Debian: apt-get install redis-server)";
    return nullptr;
  }
  install_cleanup_once();
  char tmpl[] = "/tmp/outrun-perf-redis.XXXXXX";
  if (!mkdtemp(tmpl)) {
    *why = std::string("mkdtemp: ") + std::strerror(errno);
    return nullptr;
  }
  std::unique_ptr<RedisServer> s(new RedisServer());
  s->dir_ = tmpl;
  s->socket_ = s->dir_ + "/redis.sock";
  s->log_ = s->dir_ + "/redis.log";
  std::snprintf(g_redis_dir, sizeof g_redis_dir, "%s", s->dir_.c_str());
  std::snprintf(g_redis_socket, sizeof g_redis_socket, "%s", s->socket_.c_str());
  std::snprintf(g_redis_log, sizeof g_redis_log, "%s", s->log_.c_str());

  std::vector<std::string> args = {bin,        "--port",           "0",   "--unixsocket",
                                   s->socket_, "--unixsocketperm", "700", "--save",
                                   "",         "--appendonly",     "no",  "--dir",
                                   s->dir_,    "--daemonize",      "no",  "--logfile",
                                   s->log_,    "--databases",      "1"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, 0);
      dup2(devnull, 1);
      dup2(devnull, 2);
    }
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  if (pid < 0) {
    *why = std::string("fork: ") + std::strerror(errno);
    return nullptr;
  }
  s->pid_ = pid;
  g_redis_pid.store(pid);
  const int64_t deadline = mono_ns() + 5'000'000'000;
  while (mono_ns() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      s->pid_ = 0;
      g_redis_pid.store(0);
      std::ifstream log(s->log_);
      std::string text((std::istreambuf_iterator<char>(log)), {});
      *why = "redis-server exited at start" +
             (text.empty() ? std::string() : ": " + text.substr(0, 400));
      return nullptr;
    }
    Resp c(s->socket_);
    Reply r;
    if (c.ok() && c.command(command({"PING"}), &r) && r.type == '+') {
      if (c.command(command({"INFO", "server"}), &r) && r.type == '$') {
        const auto at = r.text.find("redis_version:");
        if (at != std::string::npos)
          s->version_ = r.text.substr(at + 14, r.text.find('\r', at) - at - 14);
      }
      return s;
    }
    sleep_ns(10'000'000);
  }
  *why = "redis-server did not answer PING within 5 s";
  return nullptr;  // the destructor stops it and removes the folder
}

RedisServer::~RedisServer() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    const int64_t deadline = mono_ns() + 3'000'000'000;
    bool gone = false;
    while (!gone && mono_ns() < deadline) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_)
        gone = true;
      else
        sleep_ns(5'000'000);
    }
    if (!gone) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  g_redis_pid.store(0);
  if (DIR* d = opendir(dir_.c_str())) {  // whatever redis left there
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') unlink((dir_ + "/" + e->d_name).c_str());
    closedir(d);
  }
  rmdir(dir_.c_str());
  g_redis_dir[0] = g_redis_socket[0] = g_redis_log[0] = '\0';
}

std::string RedisServer::load_script() {
  Resp c(socket_);
  Reply r;
  if (!c.ok() || !c.command(command({"SCRIPT", "LOAD", kRedisScript}), &r) || r.type != '$' ||
      r.text.size() != 40)
    return "";
  return r.text;
}

LatencyFig redis_single_client(const RedisServer& server, const std::string& sha, int iterations,
                               int64_t* wrong, ProcsCost* server_cost) {
  Resp c(server.socket_path());
  if (!c.ok()) {
    ++*wrong;
    return {};
  }
  LatencyHistogram h;
  std::string cmd;
  Reply r;
  std::atomic<bool> reported{false};
  const std::vector<int> pids = {server.pid()};
  ProcsCost at_start;
  for (int i = 0; i < iterations + 200; ++i) {
    if (i == 200) at_start = procs_cost(pids);
    cmd.clear();
    append_evalsha(cmd, sha, input_of(i));
    const int64_t t0 = mono_ns();
    if (!c.command(cmd, &r)) {
      ++*wrong;
      break;
    }
    const int64_t dt = mono_ns() - t0;
    if (!reply_ok(r, i)) {
      ++*wrong;
      report_first_error(r, &reported);
    }
    if (i >= 200) h.record(dt);
  }
  if (server_cost) *server_cost = procs_cost(pids) - at_start;
  return latency_of(h);
}

PacedFig redis_paced(const RedisServer& server, const std::string& sha, double rate,
                     double warmup_s, double duration_s) {
  Resp c(server.socket_path());
  if (!c.ok()) {
    PacedFig f;
    f.wrong = 1;
    return f;
  }
  Paced p(rate, warmup_s, duration_s);
  std::thread reader([&] {
    Reply r;
    std::atomic<bool> reported{false};
    for (int64_t k = 0; k < p.total(); ++k) {
      if (!c.read_reply(&r)) return;
      report_first_error(r, &reported);
      p.complete(k, reply_ok(r, k));
    }
  });
  Window w;
  w.pids = {server.pid()};
  std::string cmd;
  const bool drained = p.run(
      [&](int64_t i) {
        cmd.clear();
        append_evalsha(cmd, sha, input_of(i));
        c.send(cmd);
      },
      [&] { w.start(); });
  w.stop();
  if (!drained) shutdown(c.fd(), SHUT_RDWR);  // unblocks the reader
  reader.join();
  return paced_fig(p, w, drained);
}

RedisPipelinedFig redis_pipelined(const RedisServer& server, const std::string& sha, int clients,
                                  int depth, double seconds) {
  RedisPipelinedFig f;
  struct Conn {
    std::unique_ptr<Resp> resp;
    int64_t next = 0;      // index of the next request to send
    int64_t received = 0;  // replies read
    bool sending = true;
  };
  std::vector<Conn> conns(static_cast<std::size_t>(clients));
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  for (std::size_t k = 0; k < conns.size(); ++k) {
    conns[k].resp = std::make_unique<Resp>(server.socket_path());
    if (!conns[k].resp->ok()) {
      f.wrong = 1;
      close(ep);
      return f;
    }
    conns[k].resp->set_nonblocking();
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = k;
    epoll_ctl(ep, EPOLL_CTL_ADD, conns[k].resp->fd(), &ev);
  }
  std::string cmd;
  auto send_batch = [&](Conn& c) {
    cmd.clear();
    for (int d = 0; d < depth; ++d) append_evalsha(cmd, sha, input_of(c.next++));
    return c.resp->send(cmd);
  };
  std::atomic<bool> reported{false};
  Window w;
  w.pids = {server.pid()};
  const ProcsCost server0 = procs_cost(w.pids);
  w.start();
  const int64_t end = w.wall0 + static_cast<int64_t>(seconds * 1e9);
  for (auto& c : conns) send_batch(c);
  std::size_t active = conns.size();
  Reply r;
  while (active > 0) {
    epoll_event events[64];
    const int n = epoll_wait(ep, events, 64, 1000);
    if (n < 0 && errno != EINTR) break;
    if (n == 0) {  // nothing for a second: a reply is missing
      f.wrong += 1;
      break;
    }
    const bool past_end = mono_ns() >= end;
    for (int e = 0; e < n; ++e) {
      Conn& c = conns[events[e].data.u64];
      if (c.resp->fill() < 0) {
        f.wrong += 1;
        active = 0;
        break;
      }
      int k;
      while ((k = c.resp->parse(&r)) == 1) {
        report_first_error(r, &reported);
        if (!reply_ok(r, c.received)) ++f.wrong;
        ++c.received;
      }
      if (k < 0) {
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
  const ProcsCost server_cost = procs_cost(w.pids) - server0;
  close(ep);
  for (auto& c : conns) f.evaluations += c.received;
  const double n = static_cast<double>(std::max<int64_t>(1, f.evaluations));
  f.evals_per_s = static_cast<double>(f.evaluations) / (static_cast<double>(w.wall_ns) / 1e9);
  f.client_cpu_us_per_eval = us(w.cpu_ns) / n;
  f.server_cpu_us_per_eval = us(w.others_ns) / n;
  f.server_switches_per_eval = static_cast<double>(server_cost.switches()) / n;
  return f;
}

}  // namespace outrun::perf

// outrund's Acceptor (host/daemon/acceptor.h) without a daemon: the socket path it refuses, the
// peers it lets in, and its pause when accept() finds no fd left (EMFILE). The whole daemon's
// accepting is tested end to end in daemon_test.cpp and hardening_test.cpp.
#include "acceptor.h"

#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

using outrun::daemon::Acceptor;
using outrun::daemon::DaemonConfig;
using outrun::daemon::loop_thread;
using outrun::daemon::Peer;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/outrun-acceptor-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { (void)!std::system(("rm -rf '" + path + "'").c_str()); }
};

DaemonConfig config_at(const std::string& socket) {
  DaemonConfig cfg;
  cfg.socket = socket;
  cfg.socket_mode = 0600;
  cfg.allowed_uids = {static_cast<uint32_t>(::getuid())};
  return cfg;
}

int connect_to(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), path.size());
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

}  // namespace

TEST_CASE("Acceptor: a path that is not a socket, or where a daemon listens, is refused") {
  loop_thread.bind_to_current_thread();
  loop_thread.assert_here();
  TempDir dir;
  const std::string path = dir.path + "/outrund.sock";
  std::ofstream(path) << "not a socket";
  const DaemonConfig cfg = config_at(path);
  std::string err;
  {
    Acceptor a(cfg, [](const Peer&) {});
    CHECK(!a.open(&err));
    CHECK(err.find("is not a socket") != std::string::npos);
  }
  ::unlink(path.c_str());
  Acceptor first(cfg, [](const Peer&) {});
  REQUIRE(first.open(&err));
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);  // the configured mode
  {
    Acceptor second(cfg, [](const Peer&) {});
    err.clear();
    CHECK(!second.open(&err));
    CHECK(err.find("another daemon is listening") != std::string::npos);
  }
}

TEST_CASE("Acceptor: a socket left by a daemon that died is replaced") {
  loop_thread.bind_to_current_thread();
  loop_thread.assert_here();
  TempDir dir;
  const std::string path = dir.path + "/outrund.sock";
  const DaemonConfig cfg = config_at(path);
  std::string err;
  {
    Acceptor dead(cfg, [](const Peer&) {});
    REQUIRE(dead.open(&err));
  }  // its fd closed, its file left
  Acceptor a(cfg, [](const Peer&) {});
  CHECK(a.open(&err));
}

TEST_CASE("Acceptor: accept() out of fds (EMFILE) pauses accepting, which resumes after it") {
  loop_thread.bind_to_current_thread();
  loop_thread.assert_here();
  TempDir dir;
  const std::string path = dir.path + "/outrund.sock";
  const DaemonConfig cfg = config_at(path);
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  std::vector<Peer> peers;
  Acceptor a(cfg, [&](const Peer& p) { peers.push_back(p); });
  std::string err;
  REQUIRE(a.open(&err));
  a.start(&loop);
  const int client = connect_to(path);

  // Every fd below a lowered soft limit in use: accept() gets EMFILE.
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &old) == 0);
  const int top = ::dup(client);
  REQUIRE(top >= 0);
  ::close(top);
  rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(top + 1);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<int> fillers;
  for (int fd; (fd = ::dup(client)) >= 0;) fillers.push_back(fd);
  const int dup_errno = errno;
  uv_run(&loop, UV_RUN_NOWAIT);  // the socket is readable: accept() finds no fd
  const bool paused = a.paused();
  const std::size_t accepted_while_full = peers.size();
  for (int fd : fillers) ::close(fd);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &old) == 0);
  CHECK(dup_errno == EMFILE);
  CHECK(paused);
  CHECK(accepted_while_full == 0);

  // The pause ends (its timer), and the connection waiting in the backlog is taken.
  while (peers.empty()) uv_run(&loop, UV_RUN_ONCE);
  CHECK(!a.paused());
  REQUIRE(peers.size() == 1);
  CHECK(peers[0].uid == ::getuid());
  CHECK(peers[0].pid == ::getpid());
  CHECK(!peers[0].admin);
  ::close(peers[0].fd);
  ::close(client);

  a.close();  // the drain and finish: the socket file goes, the handles close
  struct stat st {};
  CHECK(::stat(path.c_str(), &st) != 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("Acceptor: a peer that is not allowed is refused and counted") {
  loop_thread.bind_to_current_thread();
  loop_thread.assert_here();
  TempDir dir;
  const std::string path = dir.path + "/outrund.sock";
  DaemonConfig cfg = config_at(path);
  cfg.allowed_uids = {static_cast<uint32_t>(::getuid()) + 1};
  cfg.allowed_gids.clear();
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  std::vector<Peer> peers;
  Acceptor a(cfg, [&](const Peer& p) { peers.push_back(p); });
  std::string err;
  REQUIRE(a.open(&err));
  a.start(&loop);
  const int client = connect_to(path);
  while (a.refused() == 0) uv_run(&loop, UV_RUN_ONCE);
  CHECK(peers.empty());
  ::close(client);
  a.close();
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(uv_loop_close(&loop) == 0);
}

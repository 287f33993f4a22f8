// A worker process on Windows through the platform seam (outrun/platform/worker_os.h), under
// Wine in CI: spawned in its own Job Object over named pipes, evaluating a script, killed at its
// deadline, killed with its parent, and its transport's failures (design/windows.md).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>

#include "outrun/protocol/worker_exit.h"
#include "windows/worker_session.h"

using outrun::platform::ExitKind;
using outrun::wintest::WorkerSession;
namespace protocol = outrun::protocol;
namespace wire = outrun::wire;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The hello, the first frame a worker sends.
void expect_hello(WorkerSession& s) {
  protocol::FrameView fv;
  REQUIRE(s.next_frame(&fv));
  protocol::WorkerMessage m;
  std::string why;
  REQUIRE(protocol::decode_worker_frame(fv.frame, &m, &why));
  REQUIRE(std::holds_alternative<protocol::HelloMsg>(m));
  CHECK(std::get<protocol::HelloMsg>(m).pid == s.child.pid);
}

// The one result of the next Results frame.
protocol::ResultView next_result(WorkerSession& s) {
  protocol::FrameView fv;
  REQUIRE(s.next_frame(&fv));
  protocol::WorkerMessage m;
  std::string why;
  REQUIRE(protocol::decode_worker_frame(fv.frame, &m, &why));
  const auto* items = std::get<protocol::ResultsMsg>(m).items;
  REQUIRE(items);
  REQUIRE(items->size() == 1);
  protocol::ResultView r;
  REQUIRE(protocol::decode_worker_result(items->Get(0), &r, &why));
  return r;
}

int64_t wait_exit(WorkerSession& s) {
  int64_t code = -1;
  REQUIRE(outrun::platform::wait_worker_exit(s.child, 60'000, &code));
  return code;
}

}  // namespace

TEST_CASE("a worker in its Job Object evaluates return 1 + 1 over named pipes") {
  const auto t0 = Clock::now();
  WorkerSession s;
  REQUIRE(s.start() == "");
  expect_hello(s);
  const double start_ms = ms_since(t0);
  const auto t1 = Clock::now();
  REQUIRE(s.evaluate(7, "return 1 + 1"));
  const protocol::ResultView r = next_result(s);
  const double round_trip_ms = ms_since(t1);
  CHECK(r.id == 7);
  REQUIRE(r.status == wire::Status::Ok);
  REQUIRE(r.value);
  CHECK(r.value->int_value() == 2);
  // A second evaluation: the script is held now (sent without its source it would be too).
  const auto t2 = Clock::now();
  REQUIRE(s.evaluate(8, "return 1 + 1"));
  CHECK(next_result(s).value->int_value() == 2);
  std::printf(
      "windows worker: started and said hello in %.1f ms; first round trip %.2f ms, "
      "second %.2f ms\n",
      start_ms, round_trip_ms, ms_since(t2));
  // The host closes its end: the worker exits cleanly.
  outrun::platform::close_channel(&s.ch.host_write);
  const int64_t code = wait_exit(s);
  CHECK(code == 0);
  CHECK(outrun::platform::exit_kind(code, 0) == ExitKind::kExited);
}

TEST_CASE("a worker in while true do end is killed at its deadline through its Job Object") {
  WorkerSession s;
  REQUIRE(s.start() == "");
  expect_hello(s);
  REQUIRE(s.evaluate(1, "while true do end", outrun::wintest::kHour));
  REQUIRE(s.wait_running(std::chrono::seconds(60)));
  Sleep(100);  // its deadline: the host's kill at T+G
  const auto t = Clock::now();
  outrun::platform::kill_worker(s.child);
  const int64_t code = wait_exit(s);
  const double kill_ms = ms_since(t);
  protocol::FrameView fv;
  CHECK(!s.next_frame(&fv));  // its pipe ended with it
  CHECK(s.reader.error() == protocol::FrameError::kNone);
  CHECK(code == outrun::platform::kKilledExitCode);
  CHECK(outrun::platform::exit_kind(code, 0) == ExitKind::kKilled);
  CHECK(outrun::platform::describe_exit(code, 0) == "was killed (its Job Object was terminated)");
  std::printf("windows worker: kill latency (TerminateJobObject to its exit) %.2f ms\n", kill_ms);
}

TEST_CASE("a worker whose parent dies is killed with its Job Object") {
  // The helper starts a worker kept busy in while true do end and prints its pid.
  SECURITY_ATTRIBUTES inherit{sizeof inherit, nullptr, TRUE};
  HANDLE out_r = nullptr, out_w = nullptr;
  REQUIRE(CreatePipe(&out_r, &out_w, &inherit, 0));
  SetHandleInformation(out_r, HANDLE_FLAG_INHERIT, 0);
  STARTUPINFOA si{};
  si.cb = sizeof si;
  si.dwFlags = STARTF_USESTDHANDLES;
  si.hStdOutput = out_w;
  si.hStdError = GetStdHandle(STD_ERROR_HANDLE);
  PROCESS_INFORMATION helper{};
  std::string cmd = "\"" + outrun::wintest::beside_me("outrun_win_spawn_helper.exe") + "\"";
  REQUIRE(CreateProcessA(nullptr, cmd.data(), nullptr, nullptr, TRUE, 0, nullptr, nullptr, &si,
                         &helper));
  CloseHandle(out_w);
  CloseHandle(helper.hThread);
  std::string line;
  char c;
  DWORD n = 0;
  while (ReadFile(out_r, &c, 1, &n, nullptr) && n == 1 && c != '\n') line.push_back(c);
  CloseHandle(out_r);
  const int pid = std::atoi(line.c_str());
  REQUIRE_MESSAGE(pid > 0, "the helper printed no worker pid");
  HANDLE worker =
      OpenProcess(SYNCHRONIZE | PROCESS_QUERY_LIMITED_INFORMATION, FALSE, static_cast<DWORD>(pid));
  REQUIRE(worker);
  CHECK(WaitForSingleObject(worker, 0) == WAIT_TIMEOUT);  // busy, alive

  TerminateProcess(helper.hProcess, 1);
  WaitForSingleObject(helper.hProcess, INFINITE);
  CloseHandle(helper.hProcess);
  // It cannot have seen its pipe close (it is in while true do end): only the job ends it.
  CHECK(WaitForSingleObject(worker, 60'000) == WAIT_OBJECT_0);
  DWORD code = 0;
  GetExitCodeProcess(worker, &code);
  std::printf("windows worker: killed with its parent's job, exit code 0x%08lX\n",
              static_cast<unsigned long>(code));
  CloseHandle(worker);
}

TEST_CASE("a worker sent garbage exits with a protocol violation") {
  WorkerSession s;
  REQUIRE(s.start() == "");
  expect_hello(s);
  // A length prefix of 8 bytes and 8 bytes that are no frame.
  const uint8_t garbage[] = {8, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef};
  REQUIRE(s.send(garbage));
  const int64_t code = wait_exit(s);
  CHECK(code == protocol::exit_code(protocol::WorkerExit::kProtocol));
  CHECK(outrun::platform::describe_exit(code, 0) ==
        "exited: the host sent a frame it could not verify (code 76)");
  protocol::FrameView fv;
  CHECK(!s.next_frame(&fv));  // and its pipe ended
}

TEST_CASE("the host reads garbage from a worker's pipe as a broken stream") {
  // The worker's end written by the test itself: what a worker gone wrong would send.
  outrun::platform::WorkerChannels ch;
  REQUIRE(outrun::platform::open_worker_channels(&ch) == "");
  const uint8_t garbage[] = {0xff, 0xff, 0xff, 0x7f, 1, 2, 3, 4};  // a 2 GB frame
  REQUIRE(outrun::platform::channel_write_all(ch.worker_write, garbage));
  protocol::FrameReader reader;
  REQUIRE(outrun::platform::read_frames(reader, ch.host_read) == 8);
  protocol::FrameView fv;
  CHECK(!reader.next(fv));
  CHECK(reader.error() == protocol::FrameError::kOversized);
  // A closed worker end is the end of the stream (0), not an error, and so is a write to a
  // closed host end a failure, not a crash.
  outrun::platform::close_channel(&ch.worker_write);
  CHECK(outrun::platform::read_frames(reader, ch.host_read) == 0);
  outrun::platform::close_channel(&ch.worker_read);
  CHECK(!outrun::platform::channel_write_all(ch.host_write, garbage));
  outrun::platform::close_all(&ch);
}

TEST_CASE("a worker cannot start outside its channels: a bad --fd is a usage error") {
  WorkerSession s;
  REQUIRE(s.start(0, {"--fd", "12345"}) == "");  // a later --fd wins: no such handle
  const int64_t code = wait_exit(s);
  CHECK(code == protocol::exit_code(protocol::WorkerExit::kUsage));
}

TEST_CASE("the job's memory limit stops a worker (real Windows only)") {
  if (outrun::wintest::under_wine()) {
    MESSAGE("skipped under Wine: Wine does not enforce a Job Object's process memory limit");
    return;
  }
  WorkerSession s;
  // 1 GB for Lua, 256 MB for the process: the job's limit is reached first.
  REQUIRE(s.start(256u << 20, {"--memory-limit", "1073741824", "--script-budget", "1073741824"}) ==
          "");
  expect_hello(s);
  REQUIRE(s.evaluate(1, "local t = {} for i = 1, 1e9 do t[i] = i end return #t"));
  protocol::FrameView fv;
  if (s.next_frame(&fv)) {  // an error result (not enough memory), or it died
    protocol::WorkerMessage m;
    std::string why;
    REQUIRE(protocol::decode_worker_frame(fv.frame, &m, &why));
    protocol::ResultView r;
    REQUIRE(
        protocol::decode_worker_result(std::get<protocol::ResultsMsg>(m).items->Get(0), &r, &why));
    CHECK(r.status != wire::Status::Ok);
  }
}

TEST_CASE("a worker's mitigation policies hold (real Windows only)") {
  if (outrun::wintest::under_wine()) {
    MESSAGE("skipped under Wine: Wine accepts process mitigation policies and enforces none");
    return;
  }
  WorkerSession s;
  REQUIRE(s.start() == "");
  expect_hello(s);  // it confined itself before its hello
  HANDLE p = OpenProcess(PROCESS_QUERY_INFORMATION, FALSE, static_cast<DWORD>(s.child.pid));
  REQUIRE(p);
  PROCESS_MITIGATION_CHILD_PROCESS_POLICY child{};
  REQUIRE(GetProcessMitigationPolicy(p, ProcessChildProcessPolicy, &child, sizeof child));
  CHECK(static_cast<unsigned>(child.NoChildProcessCreation) == 1u);
  PROCESS_MITIGATION_DYNAMIC_CODE_POLICY code{};
  REQUIRE(GetProcessMitigationPolicy(p, ProcessDynamicCodePolicy, &code, sizeof code));
  CHECK(static_cast<unsigned>(code.ProhibitDynamicCode) == 1u);
  CloseHandle(p);
}

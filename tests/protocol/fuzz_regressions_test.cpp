// Regression tests for what the fuzz targets (tests/fuzz/, design/fuzzing.md) and their
// harnesses turned up. Each case names its corpus entry (tests/fuzz/corpus/TARGET/NAME), which
// the fuzzer replays on every run.
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "outrun/protocol/frame.h"
#include "outrun/protocol/messages.h"

namespace outrun::protocol {
namespace {

// A real outrun-worker on one end of a socketpair, the test on the other: the worker as the
// host's frames reach it, without a Host around it.
class RawWorker {
 public:
  RawWorker() {
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      dup2(sv[1], 3);  // dup2 clears CLOEXEC on the copy
      execl(OUTRUN_TEST_WORKER, "outrun-worker", "--fd", "3", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(sv[1]);
    fd_ = sv[0];
    timeval tv{20, 0};  // a broken worker fails the test instead of hanging it
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawWorker() {
    if (fd_ >= 0) close(fd_);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  void send(const flatbuffers::FlatBufferBuilder& fbb) {
    const uint8_t* p = fbb.GetBufferPointer();
    std::size_t n = fbb.GetSize();
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      REQUIRE(w > 0);
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }

  // Calls `on_frame` for each frame until it returns false. Fails on end of stream or timeout.
  template <class F>
  void read_frames(F on_frame) {
    for (;;) {
      FrameView fv;
      while (reader_.next(fv))
        if (!on_frame(fv.frame)) return;
      REQUIRE(reader_.error() == FrameError::kNone);
      REQUIRE(reader_.read_from(fd_) > 0);
    }
  }

  int wait_exit() {
    int status = 0;
    REQUIRE(waitpid(pid_, &status, 0) == pid_);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  FrameReader reader_;
};

// A timeout_us the int64 nanosecond arithmetic could not hold (2^64 - 1, and 2^62, whose
// product with 1000 wraps to exactly 0) overflowed in the worker -- undefined behaviour, found
// while writing fuzz_worker_input's timeout clamp; in practice the deadline landed in the past
// and a script that ran past the first hook check (1,000 instructions) ended `timeout` at once.
// The worker now saturates: such a timeout means "no practical limit".
// Corpus: tests/fuzz/corpus/fuzz_worker_input/huge_timeouts.
TEST_CASE("fuzz regression: a huge timeout_us is no limit, not an overflow") {
  RawWorker w;
  bool hello = false;
  w.read_frames([&](const wire::Frame* f) {
    hello = f->body_type() == wire::Body::Hello;
    return false;
  });
  REQUIRE(hello);

  const char* source = "local n = 0 for i = 1, 100000 do n = n + i end return n";
  const uint64_t timeouts[] = {std::numeric_limits<uint64_t>::max(), uint64_t{1} << 62,
                               uint64_t{1} << 53};
  flatbuffers::FlatBufferBuilder fbb(1024);
  std::vector<flatbuffers::Offset<wire::Evaluation>> items;
  std::vector<uint8_t> sha(32, 7);
  for (std::size_t i = 0; i < std::size(timeouts); ++i) {
    const auto e = i == 0 ? wire::CreateEvaluation(fbb, i + 1, 0, fbb.CreateVector(sha),
                                                   fbb.CreateString(source),
                                                   fbb.CreateString("huge"), timeouts[i])
                          : wire::CreateEvaluation(fbb, i + 1, 0, 0, 0, 0, timeouts[i]);
    items.push_back(e);
  }
  protocol::finish_evaluate(fbb, items);
  w.send(fbb);
  flatbuffers::FlatBufferBuilder bye(64);
  protocol::encode_shutdown(bye);
  w.send(bye);

  std::size_t answered = 0;
  w.read_frames([&](const wire::Frame* f) {
    REQUIRE(f->body_type() == wire::Body::Results);
    for (const wire::Result* r : *f->body_as_Results()->items()) {
      CAPTURE(r->id());
      CHECK(r->id() == answered + 1);
      CHECK_MESSAGE(r->status() == wire::Status::Ok, (r->error() ? r->error()->str() : ""));
      REQUIRE(r->value() != nullptr);
      CHECK(r->value()->int_value() == 5000050000);
      ++answered;
    }
    return answered < std::size(timeouts);
  });
  CHECK(w.wait_exit() == 0);
}

}  // namespace
}  // namespace outrun::protocol

// Tests of the framing layer's write side: FrameWriter on a non-blocking socketpair.
//
// The other end of the socket is read with FrameReader, so every test checks what actually
// arrived: whole, verified frames, byte for byte, in the order the writer promises.
#include "outrun/protocol/frame_writer.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "outrun/protocol/frame.h"
#include "outrun/protocol/messages.h"

namespace outrun::protocol {
namespace {

using Bytes = std::vector<uint8_t>;
using State = FrameWriter::State;
using Flush = FrameWriter::Flush;

uint8_t payload_byte(uint64_t id, std::size_t i) {
  return static_cast<uint8_t>('a' + (id * 7 + i * 13 + (i >> 9)) % 26);
}

// A Results frame whose id and string payload identify it; see check_payload().
Bytes results_frame(uint64_t id, std::size_t size) {
  flatbuffers::FlatBufferBuilder fbb(size + 256);
  std::string s(size, ' ');
  for (std::size_t i = 0; i < size; ++i) s[i] = static_cast<char>(payload_byte(id, i));
  const auto str = fbb.CreateString(s);
  const auto value = wire::CreateValue(fbb, wire::ValueKind::String, false, 0, 0.0, str);
  const auto result = protocol::build_result(fbb, id, wire::Status::Ok, value, {});
  const auto frame = protocol::finish_results(fbb, {&result, 1});
  return Bytes(frame.begin(), frame.end());
}

// The id of a frame built by results_frame(), after checking that its payload is the one that
// id was built with; 0 when the frame is not such a frame.
uint64_t checked_id(const wire::Frame* frame) {
  const auto* results = frame->body_as_Results();
  if (results == nullptr || results->items() == nullptr || results->items()->size() != 1) return 0;
  const auto* r = results->items()->Get(0);
  if (r->value() == nullptr || r->value()->string_value() == nullptr) return 0;
  const auto* s = r->value()->string_value();
  for (std::size_t i = 0; i < s->size(); ++i) {
    if (static_cast<uint8_t>(s->c_str()[i]) != payload_byte(r->id(), i)) return 0;
  }
  return r->id();
}

Bytes concat(const std::vector<Bytes>& frames) {
  Bytes out;
  for (const auto& f : frames) out.insert(out.end(), f.begin(), f.end());
  return out;
}

void set_nonblocking(int fd) {
  REQUIRE(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
}

// fds[0] is the writer's end (non-blocking, as FrameWriter requires); fds[1] the peer's.
struct SocketPair {
  explicit SocketPair(bool peer_nonblocking = true) {
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    set_nonblocking(fds[0]);
    if (peer_nonblocking) set_nonblocking(fds[1]);
  }
  ~SocketPair() {
    close_writer();
    close_peer();
  }
  void close_writer() {
    if (fds[0] >= 0) ::close(fds[0]);
    fds[0] = -1;
  }
  void close_peer() {
    if (fds[1] >= 0) ::close(fds[1]);
    fds[1] = -1;
  }
  // A small send buffer makes the writer hit EAGAIN after a few KiB instead of ~200 KiB.
  void shrink_send_buffer() {
    const int size = 4096;  // the kernel doubles it and applies its minimum
    REQUIRE(::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof size) == 0);
  }
  int fds[2] = {-1, -1};
};

// Reads everything that has arrived on the (non-blocking) peer and collects its frames.
struct Peer {
  explicit Peer(int peer_fd) : fd(peer_fd) {}
  // Returns bytes read.
  std::size_t pump() {
    std::size_t total = 0;
    for (;;) {
      const long n = reader.read_from(fd);
      if (n <= 0) {
        eof = eof || n == 0;
        if (n < 0 && n != -EAGAIN) error = static_cast<int>(-n);
        break;
      }
      total += static_cast<std::size_t>(n);
    }
    FrameView view;
    while (reader.next(view)) frames.emplace_back(view.bytes.begin(), view.bytes.end());
    bytes += total;
    return total;
  }
  int fd;
  FrameReader reader;
  std::vector<Bytes> frames;
  std::size_t bytes = 0;
  bool eof = false;
  int error = 0;
};

// Writes frames of ~1 KiB until the writer hands off to the loop; returns what was written,
// including the frame whose write() returned kHandedOff (it is queued, not lost).
std::vector<Bytes> fill_until_handed_off(FrameWriter& writer, uint64_t first_id) {
  std::vector<Bytes> sent;
  for (uint64_t id = first_id; id < first_id + 10'000; ++id) {
    sent.push_back(results_frame(id, 1000));
    const State s = writer.write(sent.back());
    if (s == State::kHandedOff) return sent;
    REQUIRE(s == State::kWritten);
  }
  FAIL("the socket never filled up");
  return sent;
}

// Plays the event loop after a hand-off: reads everything that arrived at the peer, then lets
// the writer send more, until flush_from_loop() says kDone. Returns the number of rounds. Every
// round frees socket space, so this terminates; the bound only turns a bug into a failure.
int drain_through_loop(FrameWriter& writer, Peer& peer) {
  int rounds = 0;
  for (Flush f = Flush::kMore; f != Flush::kDone; ++rounds) {
    REQUIRE(rounds < 100'000);
    peer.pump();
    f = writer.flush_from_loop();
    REQUIRE(f != Flush::kClosed);
  }
  peer.pump();
  return rounds;
}

TEST_CASE("FrameWriter: direct writes arrive in order") {
  SocketPair sp;
  FrameWriter writer(sp.fds[0]);
  Peer peer(sp.fds[1]);
  std::vector<Bytes> sent;
  for (uint64_t id = 1; id <= 50; ++id) {
    sent.push_back(results_frame(id, id * 17));
    REQUIRE(writer.write(sent.back()) == State::kWritten);
  }
  // One write() of several frames is fine too: the writer does not look inside.
  const std::vector<Bytes> batch = {results_frame(100, 3), results_frame(101, 0)};
  REQUIRE(writer.write(concat(batch)) == State::kWritten);
  sent.insert(sent.end(), batch.begin(), batch.end());
  // A socket with room takes each pass in one call.
  CHECK(writer.syscalls() == 51);
  CHECK(writer.bytes_written() == concat(sent).size());
  peer.pump();
  CHECK(peer.reader.error() == FrameError::kNone);
  CHECK(peer.frames == sent);
}

TEST_CASE("FrameWriter: frames queued while a pass is busy are written by that pass") {
  SocketPair sp;
  int blocked = 0;
  FrameWriter writer(sp.fds[0], [&] { ++blocked; });
  Peer peer(sp.fds[1]);
  const Bytes a = results_frame(1, 10), b = results_frame(2, 20), c = results_frame(3, 30);

  CHECK(writer.enqueue(a));                   // no pass running: this caller must run it
  CHECK_FALSE(writer.enqueue(b));             // the pass is claimed: just queued
  CHECK(writer.write(c) == State::kWritten);  // queued for the claimed pass, not written
  CHECK(writer.syscalls() == 0);
  CHECK(writer.bytes_written() == 0);
  CHECK(peer.pump() == 0);

  CHECK(writer.write_pending() == State::kWritten);
  // All three went out merged, in one send(2), in the order they were queued.
  CHECK(writer.syscalls() == 1);
  CHECK(writer.bytes_written() == a.size() + b.size() + c.size());
  peer.pump();
  CHECK(peer.frames == std::vector<Bytes>{a, b, c});

  // The pass was released: the next producer writes directly again.
  const Bytes d = results_frame(4, 40);
  CHECK(writer.write(d) == State::kWritten);
  CHECK(writer.syscalls() == 2);
  CHECK(writer.enqueue(a));
  CHECK(writer.write_pending() == State::kWritten);
  CHECK(writer.syscalls() == 3);
  // Nothing to do for the loop: it was never handed anything.
  CHECK(writer.flush_from_loop() == Flush::kDone);
  CHECK(blocked == 0);
  peer.pump();
  CHECK(peer.frames == std::vector<Bytes>{a, b, c, d, a});
}

TEST_CASE("FrameWriter: EAGAIN hands the rest to the loop, which finishes it in order") {
  SocketPair sp;
  sp.shrink_send_buffer();
  int blocked = 0;
  FrameWriter writer(sp.fds[0], [&] { ++blocked; });
  Peer peer(sp.fds[1]);

  std::vector<Bytes> sent = fill_until_handed_off(writer, 1);
  CHECK(blocked == 1);
  CHECK(sent.size() > 1);

  // While the loop owns the backlog, producers only append: no send(2), no second on_blocked.
  const uint64_t calls = writer.syscalls();
  for (uint64_t id = 5000; id < 5020; ++id) {
    sent.push_back(results_frame(id, 700));
    CHECK(writer.write(sent.back()) == State::kWritten);
  }
  CHECK(writer.enqueue(sent.back()) == false);  // a pass is running (the loop's)
  sent.push_back(sent.back());
  CHECK(writer.syscalls() == calls);
  CHECK(blocked == 1);

  // Nobody reads yet, so the socket is still full.
  CHECK(writer.flush_from_loop() == Flush::kMore);
  CHECK(blocked == 1);

  // Drain the peer while flushing, as the loop does on each writability event.
  CHECK(drain_through_loop(writer, peer) > 1);
  CHECK(blocked == 1);
  CHECK(peer.reader.error() == FrameError::kNone);
  CHECK(peer.frames.size() == sent.size());
  CHECK(peer.frames == sent);
  CHECK(writer.bytes_written() == concat(sent).size());
  CHECK(peer.bytes == concat(sent).size());

  // Done: producers write directly again, and a new hand-off calls on_blocked again, once.
  CHECK(writer.flush_from_loop() == Flush::kDone);
  const Bytes direct = results_frame(9000, 5);
  const uint64_t before = writer.syscalls();
  CHECK(writer.write(direct) == State::kWritten);
  CHECK(writer.syscalls() == before + 1);
  peer.pump();
  CHECK(peer.frames.back() == direct);

  std::vector<Bytes> second = fill_until_handed_off(writer, 10'000);
  CHECK(blocked == 2);
  drain_through_loop(writer, peer);
  CHECK(blocked == 2);
  REQUIRE(peer.frames.size() == sent.size() + 1 + second.size());
  CHECK(std::vector<Bytes>(peer.frames.end() - second.size(), peer.frames.end()) == second);
}

TEST_CASE("FrameWriter: frames written from on_blocked queue behind the backlog") {
  SocketPair sp;
  sp.shrink_send_buffer();
  const Bytes marker = results_frame(424242, 3);
  FrameWriter* self = nullptr;
  State from_callback = State::kClosed;
  FrameWriter writer(sp.fds[0], [&] { from_callback = self->write(marker); });
  self = &writer;
  Peer peer(sp.fds[1]);

  std::vector<Bytes> sent = fill_until_handed_off(writer, 1);
  CHECK(from_callback == State::kWritten);  // appended, not written: the loop owns the pass
  const Bytes after = results_frame(424243, 3);
  CHECK(writer.write(after) == State::kWritten);
  sent.push_back(marker);
  sent.push_back(after);
  drain_through_loop(writer, peer);
  CHECK(peer.frames == sent);
}

// A minimal event loop for the concurrency tests: a thread that, after each on_blocked, waits
// for the socket to become writable and calls flush_from_loop() until kDone.
class TestLoop {
 public:
  void on_blocked() {
    std::lock_guard lock(mu_);
    ++pending_;
    ++handoffs_;
    cv_.notify_all();
  }
  void run(FrameWriter& writer, int fd) {
    thread_ = std::thread([this, &writer, fd] {
      for (;;) {
        {
          std::unique_lock lock(mu_);
          cv_.wait(lock, [&] { return pending_ > 0 || stopping_; });
          if (pending_ == 0) return;
          --pending_;
          flushing_ = true;
        }
        for (;;) {
          pollfd p{fd, POLLOUT, 0};
          ::poll(&p, 1, -1);
          const Flush f = writer.flush_from_loop();
          if (f == Flush::kDone) break;
          if (f == Flush::kClosed) {
            closed_ = true;
            break;
          }
        }
        std::lock_guard lock(mu_);
        flushing_ = false;
        cv_.notify_all();
        if (closed_) return;
      }
    });
  }
  // Waits until every hand-off so far is finished (the writer is back on the direct path).
  void wait_idle() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return (pending_ == 0 && !flushing_) || closed_; });
  }
  // Call once no producer can write any more: finishes the outstanding hand-offs, then stops.
  void finish() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    thread_.join();
  }
  int handoffs() {
    std::lock_guard lock(mu_);
    return handoffs_;
  }
  bool closed() const { return closed_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int pending_ = 0;
  int handoffs_ = 0;
  bool flushing_ = false;
  bool stopping_ = false;
  std::atomic<bool> closed_{false};
  std::thread thread_;
};

// Producer threads write numbered frames through one writer while a loop thread finishes
// hand-offs and a reader thread collects what arrives. With `hold_reader`, the reader starts
// only after the first hand-off, so the socket is certain to fill up and the loop path runs (a
// fast reader could otherwise keep it from ever happening). Once the loop owns the backlog,
// busy producers keep it owning it, so the producers work in phases and wait for the loop to
// finish between them: each phase starts with producers racing for the pass on the direct
// path, and the hand-back from the loop to the producers happens once per phase.
void run_concurrent_producers(bool hold_reader, bool small_send_buffer) {
  constexpr int kThreads = 4;
  constexpr uint64_t kFramesPerThread = 1500;
  constexpr uint64_t kFramesPerPhase = 150;
  SocketPair sp(/*peer_nonblocking=*/false);
  if (small_send_buffer) sp.shrink_send_buffer();
  TestLoop loop;

  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool gate_open = !hold_reader;
  const auto open_gate = [&] {
    std::lock_guard lock(gate_mu);
    gate_open = true;
    gate_cv.notify_all();
  };
  FrameWriter writer(sp.fds[0], [&] {
    loop.on_blocked();
    open_gate();
  });
  loop.run(writer, sp.fds[0]);

  // The peer: a blocking reader collecting (thread, sequence) per frame. Doctest assertions
  // stay on the main thread; the threads only record.
  std::vector<std::vector<uint64_t>> seen(kThreads);
  std::size_t bad_frames = 0;
  FrameError read_error = FrameError::kNone;
  std::size_t bytes_read = 0;
  std::thread reader_thread([&] {
    {
      std::unique_lock lock(gate_mu);
      gate_cv.wait(lock, [&] { return gate_open; });
    }
    FrameReader reader;
    FrameView view;
    for (;;) {
      const long n = reader.read_from(sp.fds[1]);
      if (n <= 0) break;
      bytes_read += static_cast<std::size_t>(n);
      while (reader.next(view)) {
        const uint64_t id = checked_id(view.frame);
        const uint64_t thread = id >> 32;
        if (id == 0 || thread == 0 || thread > kThreads) {
          ++bad_frames;
          continue;
        }
        seen[thread - 1].push_back(id & 0xFFFFFFFFu);
      }
    }
    read_error = reader.error();
  });

  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<int> unexpected_state{0};
  // Between phases no producer is inside write() and the loop is idle, so nothing may be left
  // queued: a frame appended while another thread's pass was sending must have been sent by
  // that pass, not left for whoever writes next (at the end of a stream, nobody does).
  int phases_with_unsent_bytes = 0;
  const auto between_phases = [&]() noexcept {
    loop.wait_idle();
    if (writer.bytes_written() != bytes_sent.load()) ++phases_with_unsent_bytes;
  };
  std::barrier phase_end(kThreads, between_phases);
  std::vector<std::thread> producers;
  for (int t = 1; t <= kThreads; ++t) {
    producers.emplace_back([&, t] {
      uint64_t phase = 0;
      for (uint64_t seq = 1; seq <= kFramesPerThread; ++seq) {
        // Every thread follows the same schedule, so all arrive at each barrier.
        if ((seq - 1) / kFramesPerPhase != phase) {
          phase = (seq - 1) / kFramesPerPhase;
          phase_end.arrive_and_wait();
        }
        const uint64_t id = (uint64_t(t) << 32) | seq;
        Bytes frame = results_frame(id, (seq * 37 + t * 101) % 2500);
        State s = State::kWritten;
        if (seq % 7 == 0) {
          // Two frames in one write(): they must stay together and in order.
          ++seq;
          const Bytes second = results_frame((uint64_t(t) << 32) | seq, seq % 300);
          frame.insert(frame.end(), second.begin(), second.end());
          s = writer.write(frame);
        } else if (seq % 5 == 0) {
          if (writer.enqueue(frame)) s = writer.write_pending();
        } else {
          s = writer.write(frame);
        }
        if (s == State::kClosed) ++unexpected_state;
        bytes_sent += frame.size();
      }
    });
  }
  for (auto& p : producers) p.join();
  open_gate();  // in case nothing ever blocked, so the reader still drains what was sent
  loop.finish();
  // Everything is in the kernel now; end the stream so the reader stops at the end of it.
  ::shutdown(sp.fds[0], SHUT_WR);
  reader_thread.join();

  MESSAGE(loop.handoffs() << " hand-offs, " << writer.syscalls() << " send calls");
  if (hold_reader) CHECK(loop.handoffs() >= 1);
  CHECK_FALSE(loop.closed());
  CHECK(unexpected_state.load() == 0);
  CHECK(read_error == FrameError::kNone);
  CHECK(bad_frames == 0);
  CHECK(phases_with_unsent_bytes == 0);
  CHECK(bytes_read == bytes_sent.load());
  CHECK(writer.bytes_written() == bytes_sent.load());
  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t + 1);
    std::vector<uint64_t> expected(kFramesPerThread);
    for (uint64_t i = 0; i < kFramesPerThread; ++i) expected[i] = i + 1;
    CHECK(seen[t].size() == kFramesPerThread);
    CHECK(seen[t] == expected);
  }
}

TEST_CASE("FrameWriter: concurrent producers, every frame intact and in per-thread order") {
  SUBCASE("through hand-offs to the loop") {
    run_concurrent_producers(true, true);
  }
  SUBCASE("racing for the pass, small socket buffer") {
    run_concurrent_producers(false, true);
  }
  SUBCASE("racing for the pass, default socket buffer") {
    run_concurrent_producers(false, false);
  }
}

TEST_CASE("FrameWriter: a frame appended during another thread's send is sent by that pass") {
  // Thread A writes a large frame, whose send(2) takes a while; thread B writes small frames
  // until it finds the pass busy (enqueue() returns false), so its last frame is appended while
  // A's pass is sending. The writer promises that A's pass sends it before returning; nobody
  // writes after B, so a frame left queued would never be sent. Whether B catches A's pass is
  // up to the scheduler; the invariant is checked in every trial either way.
  const Bytes big = results_frame(1, 64 * 1024);
  int trials_caught = 0;
  for (int trial = 0; trial < 40; ++trial) {
    INFO("trial " << trial);
    SocketPair sp(/*peer_nonblocking=*/false);
    TestLoop loop;  // hand-offs are not the point here, but must not hang the test if they occur
    FrameWriter writer(sp.fds[0], [&] { loop.on_blocked(); });
    loop.run(writer, sp.fds[0]);
    std::vector<Bytes> received;
    std::thread reader_thread([&] {
      FrameReader reader;
      FrameView view;
      while (reader.read_from(sp.fds[1]) > 0) {
        while (reader.next(view)) received.emplace_back(view.bytes.begin(), view.bytes.end());
      }
    });
    std::atomic<bool> go{false}, a_done{false};
    std::vector<Bytes> b_frames;
    bool caught = false;
    std::thread a([&] {
      while (!go.load()) {
      }
      writer.write(big);
      a_done = true;
    });
    std::thread b([&] {
      go = true;
      for (uint64_t id = 100; id < 400 && !a_done.load(); ++id) {
        b_frames.push_back(results_frame(id, 20));
        if (!writer.enqueue(b_frames.back())) {
          caught = true;  // A's pass is running: it has to send this frame
          break;
        }
        writer.write_pending();
      }
    });
    a.join();
    b.join();
    loop.finish();
    const uint64_t written = writer.bytes_written();
    ::shutdown(sp.fds[0], SHUT_WR);
    reader_thread.join();
    trials_caught += caught;
    REQUIRE(written == big.size() + concat(b_frames).size());
    std::vector<Bytes> from_b;
    for (const auto& f : received) {
      if (f != big) from_b.push_back(f);
    }
    CHECK(received.size() == b_frames.size() + 1);
    CHECK(from_b == b_frames);
  }
  MESSAGE(trials_caught << " of 40 trials appended during the other thread's pass");
}

TEST_CASE("FrameWriter: a closed peer is kClosed, not SIGPIPE") {
  // SIGPIPE must be deliverable here, or this test proves nothing. The check runs in a child
  // with the default disposition restored, so a regression kills the child (reported below)
  // rather than the whole test binary.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
    int code = 0;
    {
      // Direct write into a closed peer.
      int fds[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) ::_exit(10);
      ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
      FrameWriter writer(fds[0]);
      ::close(fds[1]);
      const Bytes f = results_frame(1, 10);
      if (writer.write(f) != State::kClosed) code |= 1;
      if (writer.write(f) != State::kClosed) code |= 2;
    }
    {
      // The loop's flush into a peer that closed during a hand-off.
      int fds[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) ::_exit(10);
      ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
      const int size = 4096;
      ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
      FrameWriter writer(fds[0]);
      State s = State::kWritten;
      for (int i = 0; i < 10'000 && s == State::kWritten; ++i) {
        s = writer.write(results_frame(i, 900));
      }
      if (s != State::kHandedOff) code |= 4;
      ::close(fds[1]);
      if (writer.flush_from_loop() != Flush::kClosed) code |= 8;
      if (writer.write(results_frame(1, 1)) != State::kClosed) code |= 16;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  if (WIFSIGNALED(status)) {
    // Said on unbuffered stderr too: with the same regression, the in-process test below dies
    // of SIGPIPE and takes doctest's buffered report with it.
    std::fprintf(stderr, "FrameWriter: child writing to a closed peer was killed by signal %d\n",
                 WTERMSIG(status));
  }
  INFO("child " << (WIFSIGNALED(status) ? "killed by signal " : "exited with ")
                << (WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status)));
  CHECK_FALSE(WIFSIGNALED(status));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("FrameWriter: a closed peer drops everything and stays closed") {
  SocketPair sp;
  int blocked = 0;
  FrameWriter writer(sp.fds[0], [&] { ++blocked; });
  const Bytes f = results_frame(1, 10);
  CHECK(writer.write(f) == State::kWritten);
  sp.close_peer();
  CHECK(writer.write(f) == State::kClosed);
  const uint64_t calls = writer.syscalls();
  CHECK(writer.write(f) == State::kClosed);
  CHECK_FALSE(writer.enqueue(f));
  CHECK(writer.flush_from_loop() == Flush::kClosed);
  CHECK(writer.syscalls() == calls);  // no more attempts on a dead socket
  CHECK(writer.bytes_written() == f.size());
  CHECK(blocked == 1);  // the failed send told the loop, once
}

TEST_CASE("FrameWriter: close() makes later writes kClosed") {
  SUBCASE("idle writer") {
    SocketPair sp;
    FrameWriter writer(sp.fds[0]);
    Peer peer(sp.fds[1]);
    const Bytes a = results_frame(1, 10);
    CHECK(writer.write(a) == State::kWritten);
    writer.close();
    CHECK(writer.write(a) == State::kClosed);
    CHECK_FALSE(writer.enqueue(a));
    CHECK(writer.flush_from_loop() == Flush::kClosed);
    CHECK(writer.bytes_written() == a.size());
    peer.pump();
    CHECK(peer.frames == std::vector<Bytes>{a});
    CHECK(peer.bytes == a.size());
    // close() leaves the fd to its owner.
    CHECK(::fcntl(sp.fds[0], F_GETFD) != -1);
  }

  SUBCASE("with a queued pass") {
    SocketPair sp;
    FrameWriter writer(sp.fds[0]);
    Peer peer(sp.fds[1]);
    const Bytes a = results_frame(1, 10);
    REQUIRE(writer.enqueue(a));
    writer.close();
    // The claimed pass finds the writer closed and drops what was queued.
    CHECK(writer.write_pending() == State::kClosed);
    CHECK(writer.write(a) == State::kClosed);
    CHECK(writer.bytes_written() == 0);
    CHECK(peer.pump() == 0);
  }

  SUBCASE("during a hand-off") {
    SocketPair sp;
    sp.shrink_send_buffer();
    int blocked = 0;
    FrameWriter writer(sp.fds[0], [&] { ++blocked; });
    Peer peer(sp.fds[1]);
    fill_until_handed_off(writer, 1);
    CHECK(writer.write(results_frame(77, 10)) == State::kWritten);  // queued behind
    const uint64_t written = writer.bytes_written();
    writer.close();
    CHECK(writer.flush_from_loop() == Flush::kClosed);
    CHECK(writer.write(results_frame(78, 10)) == State::kClosed);
    CHECK_FALSE(writer.enqueue(results_frame(79, 10)));
    // Only what reached the kernel before close() arrives; the queue was dropped.
    peer.pump();
    CHECK(peer.bytes == written);
    CHECK(writer.bytes_written() == written);
    CHECK(blocked == 1);
  }
}

}  // namespace
}  // namespace outrun::protocol

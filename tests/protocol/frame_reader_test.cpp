// Tests of the framing layer's read side: FrameReader reassembly, error detection, alignment,
// buffer capacity, and verify_frame.
//
// Every test feeds real frames built with protocol::finish_frame and the encoders (the producer
// the reader has to agree with), and checks the frames that come out byte for byte against the
// frames that went in, so a reader that drops, duplicates, reorders or cuts a frame fails.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "outrun/protocol/frame.h"
#include "outrun/protocol/messages.h"

namespace outrun::protocol {
namespace {

using Bytes = std::vector<uint8_t>;

enum class Payload { kString, kBytes };

// Payload content is a function of the frame id and the position, so a frame whose bytes were
// shifted or mixed with another frame's cannot pass the content check by accident.
uint8_t payload_byte(uint64_t id, std::size_t i) {
  return static_cast<uint8_t>('a' + (id * 7 + i * 13 + (i >> 9)) % 26);
}

// A Results frame carrying one Ok result whose value is a string or bytes of `size` bytes.
Bytes results_frame(uint64_t id, std::size_t size, Payload kind = Payload::kString) {
  flatbuffers::FlatBufferBuilder fbb(size + 256);
  flatbuffers::Offset<wire::Value> value;
  if (kind == Payload::kString) {
    std::string s(size, ' ');
    for (std::size_t i = 0; i < size; ++i) s[i] = static_cast<char>(payload_byte(id, i));
    const auto str = fbb.CreateString(s);
    value = wire::CreateValue(fbb, wire::ValueKind::String, false, 0, 0.0, str);
  } else {
    uint8_t* p = nullptr;
    const auto vec = fbb.CreateUninitializedVector<uint8_t>(size, &p);
    for (std::size_t i = 0; i < size; ++i) p[i] = payload_byte(id, i);
    value = wire::CreateValue(fbb, wire::ValueKind::Bytes, false, 0, 0.0, 0, vec);
  }
  const auto result = build_result(fbb, id, wire::Status::Ok, value, {});
  const auto frame = finish_results(fbb, {&result, 1});
  return Bytes(frame.begin(), frame.end());
}

// The smallest real frame: a Shutdown body is an empty table. It has no 8-byte field, so
// FlatBuffers only aligns it to 4: its size is 4 mod 8 (checked below), which leaves the next
// frame on the stream misaligned in the reader's buffer.
Bytes shutdown_frame() {
  flatbuffers::FlatBufferBuilder fbb;
  const auto frame = encode_shutdown(fbb);
  return Bytes(frame.begin(), frame.end());
}

Bytes hello_frame(int32_t pid) {
  flatbuffers::FlatBufferBuilder fbb;
  const auto frame = encode_hello(fbb, pid);
  return Bytes(frame.begin(), frame.end());
}

void store_le32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16);
  p[3] = static_cast<uint8_t>(v >> 24);
}

uint32_t load_le32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// A frame as a peer that pads differently would send it: `pad` trailing bytes that the length
// counts. Still a valid frame (nothing points at the padding), but with an odd `pad` the frames
// after it sit at odd offsets in the reader's buffer.
Bytes padded(Bytes frame, std::size_t pad) {
  frame.resize(frame.size() + pad, 0xEE);
  store_le32(frame.data(), static_cast<uint32_t>(frame.size() - kLengthPrefixSize));
  return frame;
}

// A bare length prefix followed by `body` bytes.
Bytes raw_frame(uint32_t length, const Bytes& body = {}) {
  Bytes out(kLengthPrefixSize);
  store_le32(out.data(), length);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

Bytes concat(const std::vector<Bytes>& frames) {
  Bytes out;
  for (const auto& f : frames) out.insert(out.end(), f.begin(), f.end());
  return out;
}

// verify_frame wants 8-aligned input; a std::vector<uint8_t> gives no such promise.
struct Aligned {
  explicit Aligned(const Bytes& b) : words((b.size() + 7) / 8 + 1), size(b.size()) {
    std::memcpy(words.data(), b.data(), b.size());
  }
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(words.data()); }
  std::vector<uint64_t> words;
  std::size_t size;
};

// Reads every field reachable from a verified frame and folds it into a checksum. Run on
// frames that passed verification after corruption: under ASan it proves the verifier bounded
// every read, and the checksum keeps the compiler from dropping the reads.
uint64_t walk_value(const wire::Value* v) {
  if (v == nullptr) return 1;
  uint64_t h = static_cast<uint64_t>(v->kind()) + v->bool_value() +
               static_cast<uint64_t>(v->int_value()) + static_cast<uint64_t>(v->double_value());
  if (const auto* s = v->string_value()) h += std::string(s->c_str(), s->size()).size();
  if (const auto* b = v->bytes_value()) {
    for (const uint8_t c : *b) h += c;
  }
  if (const auto* items = v->items()) {
    for (const auto* item : *items) h = h * 31 + walk_value(item);
  }
  if (const auto* keys = v->keys()) {
    for (const auto* k : *keys) h += k->size() + (k->size() ? uint8_t(k->c_str()[0]) : 0);
  }
  return h;
}

uint64_t walk(const wire::Frame* f) {
  uint64_t h = static_cast<uint64_t>(f->body_type());
  if (const auto* hello = f->body_as_Hello()) h += hello->protocol_version() + hello->pid();
  if (const auto* results = f->body_as_Results()) {
    if (const auto* items = results->items()) {
      for (const auto* r : *items) {
        h = h * 31 + r->id() + static_cast<uint64_t>(r->status()) + walk_value(r->value());
        if (const auto* e = r->error()) h += e->size();
      }
    }
  }
  if (const auto* evaluate = f->body_as_Evaluate()) {
    if (const auto* items = evaluate->items()) {
      for (const auto* e : *items) {
        h += e->id() + e->script_id() + e->timeout_us();
        if (const auto* s = e->sha256()) h += s->size();
        if (const auto* s = e->source()) h += s->size();
        if (const auto* s = e->chunk_name()) h += s->size();
        if (const auto* inputs = e->inputs()) {
          for (const auto* in : *inputs) h += in->name()->size() + walk_value(in->value());
        }
      }
    }
  }
  return h;
}

// Collects the frames a reader hands out and checks, for each, the invariants a caller relies
// on: it is 8-aligned (the reader copies misaligned frames to scratch), `frame` is the root of
// exactly `bytes`, and the length prefix covers exactly `bytes`.
struct Collector {
  std::vector<Bytes> frames;
  std::string problem;  // first broken invariant, empty when none

  void drain(FrameReader& reader) {
    FrameView view;
    while (reader.next(view)) {
      const auto addr = reinterpret_cast<uintptr_t>(view.bytes.data());
      if (problem.empty()) {
        if (view.frame == nullptr) {
          problem = "null frame";
        } else if (addr % 8 != 0) {
          problem = "frame handed out at a misaligned address";
        } else if (view.bytes.size() < kLengthPrefixSize + kMinFrameSize ||
                   load_le32(view.bytes.data()) != view.bytes.size() - kLengthPrefixSize) {
          problem = "bytes do not match the length prefix";
        } else if (view.frame != wire::GetSizePrefixedFrame(view.bytes.data())) {
          problem = "frame is not the root of bytes";
        }
      }
      frames.emplace_back(view.bytes.begin(), view.bytes.end());
    }
  }
};

// The frames used for the exhaustive split tests: the minimum frame, frames of either payload
// kind across the small sizes, Shutdowns (4 mod 8) and an odd-padded frame so that later frames
// arrive misaligned, and everything in between.
std::vector<Bytes> small_frames() {
  return {
      shutdown_frame(),
      results_frame(1, 0),
      results_frame(2, 1, Payload::kBytes),
      hello_frame(1234),
      results_frame(3, 7),
      results_frame(4, 8, Payload::kBytes),
      padded(results_frame(5, 3), 3),
      results_frame(6, 100),
      shutdown_frame(),
      results_frame(7, 257, Payload::kBytes),
      hello_frame(-1),
      results_frame(8, 0, Payload::kBytes),
  };
}

// Frames from the minimum up to 1 MiB, for the random-split tests.
std::vector<Bytes> large_frames() {
  return {
      shutdown_frame(),
      results_frame(10, (1u << 20) - 128, Payload::kBytes),
      results_frame(11, 0),
      hello_frame(7),
      results_frame(12, 1u << 20),  // the FlatBuffer is a little over 1 MiB
      results_frame(13, 65536 - 100, Payload::kBytes),
      padded(results_frame(14, 300'000), 5),
      results_frame(15, 1),
      results_frame(16, (1u << 20) - 7, Payload::kBytes),
      results_frame(17, 12345),
  };
}

// Random piece sizes: mostly large reads, with tiny pieces mixed in so that splits land inside
// length prefixes and inside the FlatBuffer header too.
std::size_t piece_size(std::mt19937& rng) {
  switch (rng() % 4) {
    case 0:
      return 1 + rng() % 8;
    case 1:
      return 1 + rng() % 4096;
    default:
      return 1 + rng() % (96 * 1024);
  }
}

struct SocketPair {
  SocketPair() {
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    // Both ends non-blocking: a test that expects data which is not there fails with EAGAIN
    // instead of hanging.
    for (const int fd : fds) REQUIRE(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
  }
  ~SocketPair() {
    for (const int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  int fds[2] = {-1, -1};
};

// Writes all of `bytes`; the tests keep what is in flight far below the socket buffer, so a
// short write means something is wrong.
void write_all(int fd, std::span<const uint8_t> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    REQUIRE(n > 0);
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
}

// read_from() until the socket is empty; returns the bytes read.
std::size_t read_available(FrameReader& reader, int fd) {
  std::size_t total = 0;
  for (;;) {
    const long n = reader.read_from(fd);
    if (n == -EAGAIN) return total;
    REQUIRE(n > 0);
    total += static_cast<std::size_t>(n);
  }
}

TEST_CASE("FrameReader: test frames have the shapes the tests rely on") {
  // Guards the premises of the alignment tests: if FlatBuffers ever padded Shutdown to 8, the
  // misaligned-frame cases below would silently stop testing anything.
  CHECK(shutdown_frame().size() % 8 == 4);
  CHECK(padded(results_frame(5, 3), 3).size() % 2 == 1);
  for (const auto& f : small_frames()) {
    const Aligned a(f);
    CHECK(verify_frame(a.data(), a.size) != nullptr);
  }
  for (const auto& f : large_frames()) {
    CHECK(f.size() <= (1u << 20) + 256);
  }
  MESSAGE("smallest real frame: " << shutdown_frame().size() << " bytes");
}

TEST_CASE("FrameReader: every two-part split of a small stream via append") {
  const auto frames = small_frames();
  const Bytes stream = concat(frames);
  for (std::size_t split = 0; split <= stream.size(); ++split) {
    INFO("split at byte " << split << " of " << stream.size());
    FrameReader reader;
    Collector got;
    reader.append(std::span(stream).first(split));
    got.drain(reader);
    reader.append(std::span(stream).subspan(split));
    got.drain(reader);
    REQUIRE(got.problem == "");
    REQUIRE(reader.error() == FrameError::kNone);
    REQUIRE(got.frames == frames);
    REQUIRE(reader.buffered() == 0);
  }
}

TEST_CASE("FrameReader: every two-part split of a small stream via read_from") {
  const auto frames = small_frames();
  const Bytes stream = concat(frames);
  SocketPair sp;
  for (std::size_t split = 0; split <= stream.size(); ++split) {
    INFO("split at byte " << split << " of " << stream.size());
    FrameReader reader;
    Collector got;
    write_all(sp.fds[0], std::span(stream).first(split));
    REQUIRE(read_available(reader, sp.fds[1]) == split);
    got.drain(reader);
    write_all(sp.fds[0], std::span(stream).subspan(split));
    REQUIRE(read_available(reader, sp.fds[1]) == stream.size() - split);
    got.drain(reader);
    REQUIRE(got.problem == "");
    REQUIRE(reader.error() == FrameError::kNone);
    REQUIRE(got.frames == frames);
    REQUIRE(reader.buffered() == 0);
  }
}

TEST_CASE("FrameReader: a small stream fed one byte at a time") {
  const auto frames = small_frames();
  const Bytes stream = concat(frames);
  FrameReader reader;
  Collector got;
  for (std::size_t i = 0; i < stream.size(); ++i) {
    reader.append(std::span(stream).subspan(i, 1));
    got.drain(reader);
    REQUIRE(reader.error() == FrameError::kNone);
  }
  CHECK(got.problem == "");
  CHECK(got.frames == frames);
  CHECK(reader.buffered() == 0);
  CHECK(reader.capacity() == 64 * 1024);  // a stream of small frames never grows the buffer
}

TEST_CASE("FrameReader: large frames split at random points via append") {
  const auto frames = large_frames();
  const Bytes stream = concat(frames);
  for (const uint32_t seed : {1u, 2u, 3u, 4u}) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    FrameReader reader;
    Collector got;
    std::size_t pos = 0;
    std::size_t pieces = 0;
    while (pos < stream.size()) {
      const std::size_t n = std::min(piece_size(rng), stream.size() - pos);
      reader.append(std::span(stream).subspan(pos, n));
      pos += n;
      ++pieces;
      // Usually drain after each piece like a loop would; sometimes let pieces pile up so that
      // several frames (and a partial one) sit in the buffer at once.
      if (rng() % 4 != 0) got.drain(reader);
    }
    got.drain(reader);
    MESSAGE("seed " << seed << ": " << pieces << " pieces");
    CHECK(got.problem == "");
    CHECK(reader.error() == FrameError::kNone);
    CHECK(got.frames.size() == frames.size());
    CHECK(got.frames == frames);
    CHECK(reader.buffered() == 0);
  }
}

TEST_CASE("FrameReader: large frames split at random points via read_from") {
  const auto frames = large_frames();
  const Bytes stream = concat(frames);
  SocketPair sp;
  for (const uint32_t seed : {5u, 6u, 7u}) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    FrameReader reader;
    Collector got;
    std::size_t pos = 0;
    while (pos < stream.size()) {
      // Pieces stay well under the socket's buffer so the write never comes up short.
      const std::size_t n =
          std::min({piece_size(rng), std::size_t{48 * 1024}, stream.size() - pos});
      write_all(sp.fds[0], std::span(stream).subspan(pos, n));
      pos += n;
      REQUIRE(read_available(reader, sp.fds[1]) == n);
      if (rng() % 4 != 0) got.drain(reader);
    }
    got.drain(reader);
    CHECK(got.problem == "");
    CHECK(reader.error() == FrameError::kNone);
    CHECK(got.frames == frames);
    CHECK(reader.buffered() == 0);
  }
}

TEST_CASE("FrameReader: read_from reports EAGAIN and end of stream") {
  SocketPair sp;
  FrameReader reader;
  CHECK(reader.read_from(sp.fds[1]) == -EAGAIN);
  const Bytes f = results_frame(1, 10);
  write_all(sp.fds[0], f);
  CHECK(reader.read_from(sp.fds[1]) == static_cast<long>(f.size()));
  ::close(sp.fds[0]);
  sp.fds[0] = -1;
  CHECK(reader.read_from(sp.fds[1]) == 0);
  Collector got;
  got.drain(reader);
  CHECK(got.frames == std::vector<Bytes>{f});
  CHECK(reader.read_from(-1) == -EBADF);
}

TEST_CASE("FrameReader: a truncated frame waits for the rest without an error") {
  const Bytes f = results_frame(42, 50, Payload::kBytes);
  for (std::size_t cut = 0; cut < f.size(); ++cut) {
    INFO("first " << cut << " bytes of " << f.size());
    FrameReader reader;
    FrameView view;
    reader.append(std::span(f).first(cut));
    REQUIRE_FALSE(reader.next(view));
    REQUIRE_FALSE(reader.next(view));  // asking again changes nothing
    REQUIRE(reader.error() == FrameError::kNone);
    REQUIRE(reader.buffered() == cut);
    reader.append(std::span(f).subspan(cut));
    REQUIRE(reader.next(view));
    REQUIRE(Bytes(view.bytes.begin(), view.bytes.end()) == f);
    REQUIRE_FALSE(reader.next(view));
    REQUIRE(reader.error() == FrameError::kNone);
  }
}

TEST_CASE("FrameReader: oversized length") {
  const Bytes good = results_frame(1, 20);

  SUBCASE("just above kMaxFrameSize, detected from the prefix alone") {
    FrameReader reader;
    FrameView view;
    Bytes bad = raw_frame(kMaxFrameSize + 1);
    reader.append(good);
    reader.append(std::span(bad).first(3));
    REQUIRE(reader.next(view));  // the frame before the bad one still comes out
    CHECK(Bytes(view.bytes.begin(), view.bytes.end()) == good);
    CHECK_FALSE(reader.next(view));
    CHECK(reader.error() == FrameError::kNone);  // three bytes are not a length yet
    reader.append(std::span(bad).subspan(3));
    CHECK_FALSE(reader.next(view));
    CHECK(reader.error() == FrameError::kOversized);
  }

  SUBCASE("0xFFFFFFFF") {
    FrameReader reader;
    FrameView view;
    reader.append(raw_frame(0xFFFFFFFFu, Bytes(64, 0)));
    CHECK_FALSE(reader.next(view));
    CHECK(reader.error() == FrameError::kOversized);
  }

  SUBCASE("exactly kMaxFrameSize is allowed: the reader waits for the body") {
    FrameReader reader;
    FrameView view;
    reader.append(raw_frame(kMaxFrameSize, Bytes(64, 0)));
    CHECK_FALSE(reader.next(view));
    CHECK(reader.error() == FrameError::kNone);
  }

  SUBCASE("a reader's own smaller bound, at the boundary") {
    const uint32_t max = 1024;
    const Bytes base = results_frame(2, 100);
    const Bytes at_max = padded(base, max - (base.size() - kLengthPrefixSize));
    const Bytes over = padded(base, max + 1 - (base.size() - kLengthPrefixSize));
    REQUIRE(at_max.size() == kLengthPrefixSize + max);
    FrameReader reader(max);
    FrameView view;
    reader.append(at_max);
    REQUIRE(reader.next(view));
    CHECK(Bytes(view.bytes.begin(), view.bytes.end()) == at_max);
    reader.append(over);
    CHECK_FALSE(reader.next(view));
    CHECK(reader.error() == FrameError::kOversized);
  }

  SUBCASE("read_from does not try to make room for an oversized length") {
    SocketPair sp;
    FrameReader reader;
    FrameView view;
    write_all(sp.fds[0], raw_frame(0x7FFFFFFFu, Bytes(16, 1)));
    CHECK(read_available(reader, sp.fds[1]) == 20);
    CHECK_FALSE(reader.next(view));
    CHECK(reader.error() == FrameError::kOversized);
    write_all(sp.fds[0], good);  // read_from still works (and stays small) after the error
    CHECK(read_available(reader, sp.fds[1]) == good.size());
    CHECK(reader.capacity() == 64 * 1024);
    CHECK_FALSE(reader.next(view));
  }
}

TEST_CASE("FrameReader: undersized length") {
  for (uint32_t len = 0; len < kMinFrameSize; ++len) {
    INFO("length " << len);
    FrameReader reader;
    FrameView view;
    reader.append(raw_frame(len, Bytes(32, 0)));
    CHECK_FALSE(reader.next(view));
    CHECK(reader.error() == FrameError::kUndersized);
  }
  // kMinFrameSize itself passes the length check; eight zero bytes then fail verification.
  FrameReader reader;
  FrameView view;
  reader.append(raw_frame(kMinFrameSize, Bytes(kMinFrameSize, 0)));
  CHECK_FALSE(reader.next(view));
  CHECK(reader.error() == FrameError::kMalformed);
}

TEST_CASE("FrameReader: every later next() fails after an error") {
  const Bytes good = results_frame(1, 20);
  const std::vector<std::pair<Bytes, FrameError>> cases = {
      {raw_frame(kMaxFrameSize + 1), FrameError::kOversized},
      {raw_frame(3, Bytes(3, 0)), FrameError::kUndersized},
      {raw_frame(16, Bytes(16, 0xAB)), FrameError::kMalformed},
  };
  for (const auto& [bad, error_] : cases) {
    const FrameError error = error_;  // clang 14 cannot capture a structured binding (INFO)
    INFO("error " << to_string(error));
    FrameReader reader;
    FrameView view;
    reader.append(bad);
    reader.append(good);
    CHECK_FALSE(reader.next(view));
    CHECK(reader.error() == error);
    // More good frames after the error do not resynchronise the stream: a broken length means
    // nothing after it can be trusted.
    for (int i = 0; i < 3; ++i) {
      reader.append(good);
      CHECK_FALSE(reader.next(view));
      CHECK(reader.error() == error);
    }
  }
  CHECK(std::string(to_string(FrameError::kNone)) !=
        std::string(to_string(FrameError::kMalformed)));
}

TEST_CASE("FrameReader: structurally corrupted frames are malformed") {
  const Bytes good = results_frame(9, 40);
  const auto expect_malformed = [&](const Bytes& bad) {
    FrameReader reader;
    FrameView view;
    reader.append(bad);
    reader.append(good);
    CHECK_FALSE(reader.next(view));
    CHECK(reader.error() == FrameError::kMalformed);
  };
  SUBCASE("root offset past the end") {
    Bytes bad = good;
    store_le32(bad.data() + 4, static_cast<uint32_t>(bad.size()));
    expect_malformed(bad);
  }
  SUBCASE("root offset of zero") {
    Bytes bad = good;
    store_le32(bad.data() + 4, 0);
    expect_malformed(bad);
  }
  SUBCASE("misaligned root offset") {
    Bytes bad = good;
    store_le32(bad.data() + 4, load_le32(bad.data() + 4) + 1);
    expect_malformed(bad);
  }
  SUBCASE("vtable offset pointing outside the frame") {
    Bytes bad = good;
    const uint32_t root = kLengthPrefixSize + load_le32(bad.data() + 4);
    store_le32(bad.data() + root, 0x40000000u);
    expect_malformed(bad);
  }
  SUBCASE("a frame cut short with a matching length") {
    // Drop the tail of the FlatBuffer and fix up the length: the offsets now point past it.
    Bytes bad(good.begin(), good.end() - 8);
    store_le32(bad.data(), static_cast<uint32_t>(bad.size() - kLengthPrefixSize));
    expect_malformed(bad);
  }
  SUBCASE("Frame without its required body") {
    flatbuffers::FlatBufferBuilder fbb;
    wire::FrameBuilder fb(fbb);
    fb.add_body_type(wire::Body::Shutdown);
    // Bypass FrameBuilder::Finish, which would assert on the missing required field.
    const auto frame = finish_frame(fbb, flatbuffers::Offset<wire::Frame>(fbb.EndTable(fb.start_)));
    expect_malformed(Bytes(frame.begin(), frame.end()));
  }
}

TEST_CASE("FrameReader: random byte flips never crash and never yield a wrong frame") {
  // A flipped byte inside a string payload yields a frame that verifies (the wire has no
  // checksum), so the contract is: either kMalformed, or exactly the bytes that were fed, which
  // then read safely; the frame after it is unaffected.
  const std::vector<Bytes> victims = {results_frame(3, 40), results_frame(4, 5, Payload::kBytes),
                                      hello_frame(99), shutdown_frame()};
  const Bytes sentinel = results_frame(77, 16);
  std::mt19937 rng(12345);
  int malformed = 0;
  int verified = 0;
  uint64_t checksum = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    Bytes bad = victims[trial % victims.size()];
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < flips; ++i) {
      // Leave the length prefix alone here: its corruption is a different failure (below).
      const std::size_t at = kLengthPrefixSize + rng() % (bad.size() - kLengthPrefixSize);
      bad[at] ^= static_cast<uint8_t>(1 + rng() % 255);
    }
    INFO("trial " << trial);
    FrameReader reader;
    FrameView view;
    reader.append(concat({bad, sentinel}));
    if (reader.next(view)) {
      ++verified;
      REQUIRE(Bytes(view.bytes.begin(), view.bytes.end()) == bad);
      checksum += walk(view.frame);
      REQUIRE(reader.next(view));
      REQUIRE(Bytes(view.bytes.begin(), view.bytes.end()) == sentinel);
    } else {
      ++malformed;
      REQUIRE(reader.error() == FrameError::kMalformed);
      REQUIRE_FALSE(reader.next(view));
    }
  }
  MESSAGE("flips: " << malformed << " malformed, " << verified << " verified, checksum "
                    << checksum);
  // Both outcomes must occur, or this test is not exercising what it claims to.
  CHECK(malformed > 400);
  CHECK(verified > 400);
}

TEST_CASE("FrameReader: a corrupted length prefix never yields a wrong frame") {
  // With a wrong length the reader frames the stream wrongly. The length alone decides the
  // first outcome; whatever the reader hands out after that must still be a verified frame made
  // of exactly the stream's bytes at that position.
  const Bytes tail = concat({results_frame(1, 30), results_frame(2, 300), shutdown_frame()});
  std::mt19937 rng(777);
  int outcomes[4] = {};  // oversized, undersized, waiting, framed (a frame or kMalformed)
  for (int trial = 0; trial < 2000; ++trial) {
    Bytes stream = concat({results_frame(0, 64), tail});
    stream[rng() % kLengthPrefixSize] ^= static_cast<uint8_t>(1 + rng() % 255);
    const uint32_t len = load_le32(stream.data());
    INFO("trial " << trial << ", length " << len);
    FrameReader reader;
    FrameView view;
    reader.append(stream);
    std::size_t pos = 0;
    bool first = true;
    while (reader.next(view)) {
      if (first) REQUIRE(view.bytes.size() == kLengthPrefixSize + len);
      first = false;
      REQUIRE(pos + view.bytes.size() <= stream.size());
      REQUIRE(std::memcmp(view.bytes.data(), stream.data() + pos, view.bytes.size()) == 0);
      walk(view.frame);
      pos += view.bytes.size();
    }
    if (len > kMaxFrameSize) {
      ++outcomes[0];
      REQUIRE(reader.error() == FrameError::kOversized);
    } else if (len < kMinFrameSize) {
      ++outcomes[1];
      REQUIRE(reader.error() == FrameError::kUndersized);
    } else if (kLengthPrefixSize + len > stream.size()) {
      ++outcomes[2];
      REQUIRE(reader.error() == FrameError::kNone);
      REQUIRE(reader.buffered() == stream.size());
    } else {
      ++outcomes[3];
      if (first) REQUIRE(reader.error() == FrameError::kMalformed);
    }
  }
  MESSAGE("oversized " << outcomes[0] << ", undersized " << outcomes[1] << ", waiting "
                       << outcomes[2] << ", framed " << outcomes[3]);
  for (const int n : outcomes) CHECK(n > 0);
}

TEST_CASE("FrameReader: random garbage with a plausible length is malformed") {
  std::mt19937 rng(4242);
  int malformed = 0;
  const int trials = 3000;
  for (int trial = 0; trial < trials; ++trial) {
    const uint32_t len = kMinFrameSize + rng() % 2048;
    Bytes body(len);
    for (auto& b : body) b = static_cast<uint8_t>(rng());
    if (trial % 2 == 0) {
      // Half the trials get an in-range, aligned root offset, so they reach the table checks
      // instead of failing on the first offset.
      store_le32(body.data(), static_cast<uint32_t>(4 * (1 + rng() % (len / 4))));
    }
    FrameReader reader;
    FrameView view;
    const Bytes stream = raw_frame(len, body);
    reader.append(stream);
    if (reader.next(view)) {
      // Astronomically unlikely, but allowed: then it must be exactly these bytes and safe.
      REQUIRE(Bytes(view.bytes.begin(), view.bytes.end()) == stream);
      walk(view.frame);
    } else {
      REQUIRE(reader.error() == FrameError::kMalformed);
      ++malformed;
    }
  }
  CHECK(malformed >= trials * 99 / 100);
}

TEST_CASE("FrameReader: Value nesting is bounded by kVerifierMaxDepth") {
  // Frame, Results and Result are three tables; each Value level is one more.
  const auto nested = [](int levels) {
    flatbuffers::FlatBufferBuilder fbb;
    auto v = wire::CreateValue(fbb, wire::ValueKind::Int, false, 42);
    for (int i = 1; i < levels; ++i) {
      const auto items = fbb.CreateVector(&v, 1);
      v = wire::CreateValue(fbb, wire::ValueKind::Array, false, 0, 0.0, 0, 0, items);
    }
    const auto result = build_result(fbb, 1, wire::Status::Ok, v, {});
    const auto frame = finish_results(fbb, {&result, 1});
    return Bytes(frame.begin(), frame.end());
  };
  const int deepest = static_cast<int>(kVerifierMaxDepth) - 3;
  {
    FrameReader reader;
    FrameView view;
    reader.append(nested(deepest));
    CHECK(reader.next(view));
    CHECK(reader.error() == FrameError::kNone);
  }
  {
    FrameReader reader;
    FrameView view;
    reader.append(nested(deepest + 1));
    CHECK_FALSE(reader.next(view));
    CHECK(reader.error() == FrameError::kMalformed);
  }
}

TEST_CASE("FrameReader: misaligned frames are copied to aligned scratch and still verify") {
  const Bytes a = results_frame(1, 33);
  const Bytes b = results_frame(2, 100, Payload::kBytes);

  SUBCASE("after a Shutdown (size 4 mod 8) in the same buffer") {
    const std::vector<Bytes> frames = {shutdown_frame(), a, b, hello_frame(6), shutdown_frame(),
                                       shutdown_frame(), b};
    FrameReader reader;
    Collector got;
    reader.append(concat(frames));
    got.drain(reader);
    CHECK(got.problem == "");
    CHECK(got.frames == frames);
  }

  SUBCASE("at odd offsets, after odd-padded frames") {
    for (std::size_t pad = 1; pad < 8; ++pad) {
      INFO("pad " << pad);
      const std::vector<Bytes> frames = {padded(a, pad), b, padded(b, pad), a, a};
      FrameReader reader;
      Collector got;
      reader.append(concat(frames));
      got.drain(reader);
      CHECK(got.problem == "");
      CHECK(got.frames == frames);
    }
  }

  SUBCASE("via read_from") {
    const std::vector<Bytes> frames = {padded(a, 1), b, shutdown_frame(), a};
    SocketPair sp;
    write_all(sp.fds[0], concat(frames));
    FrameReader reader;
    Collector got;
    read_available(reader, sp.fds[1]);
    got.drain(reader);
    CHECK(got.problem == "");
    CHECK(got.frames == frames);
  }

  SUBCASE("the view of a misaligned frame stays valid until the next call") {
    FrameReader reader;
    FrameView view;
    reader.append(concat({padded(a, 3), b}));
    REQUIRE(reader.next(view));
    REQUIRE(reader.next(view));
    const auto* results = view.frame->body_as_Results();
    REQUIRE(results != nullptr);
    REQUIRE(results->items()->size() == 1);
    const auto* value = results->items()->Get(0)->value();
    CHECK(results->items()->Get(0)->id() == 2);
    REQUIRE(value->bytes_value() != nullptr);
    CHECK(value->bytes_value()->size() == 100);
    CHECK(value->bytes_value()->Get(99) == payload_byte(2, 99));
  }
}

TEST_CASE("FrameReader: capacity grows for a large frame and shrinks back after it") {
  const std::size_t initial = 64 * 1024;
  const Bytes big = results_frame(1, 1u << 20, Payload::kBytes);
  const Bytes small = results_frame(2, 10);

  SUBCASE("append, buffer emptied by the large frame") {
    FrameReader reader;
    Collector got;
    CHECK(reader.capacity() == initial);
    reader.append(big);
    CHECK(reader.capacity() >= big.size());
    got.drain(reader);
    reader.append(small);
    CHECK(reader.capacity() == initial);
    got.drain(reader);
    CHECK(got.frames == std::vector<Bytes>{big, small});
  }

  SUBCASE("append, a partial frame follows the large frame") {
    FrameReader reader;
    Collector got;
    reader.append(concat({big, std::vector<uint8_t>(small.begin(), small.begin() + 9)}));
    got.drain(reader);
    reader.append(std::span(small).subspan(9));
    CHECK(reader.capacity() == initial);
    got.drain(reader);
    CHECK(got.frames == std::vector<Bytes>{big, small});
  }

  SUBCASE("read_from, buffer emptied by the large frame") {
    SocketPair sp;
    FrameReader reader;
    Collector got;
    std::size_t pos = 0;
    while (pos < big.size()) {
      const std::size_t n = std::min<std::size_t>(32 * 1024, big.size() - pos);
      write_all(sp.fds[0], std::span(big).subspan(pos, n));
      pos += n;
      read_available(reader, sp.fds[1]);
      got.drain(reader);
    }
    CHECK(got.frames.size() == 1);
    write_all(sp.fds[0], small);
    read_available(reader, sp.fds[1]);
    CHECK(reader.capacity() == initial);
    got.drain(reader);
    CHECK(got.frames == std::vector<Bytes>{big, small});
  }

  SUBCASE("read_from, a partial frame follows the large frame") {
    SocketPair sp;
    FrameReader reader;
    Collector got;
    const Bytes stream = concat({big, small});
    const std::size_t cut = big.size() + 9;
    std::size_t pos = 0;
    while (pos < cut) {
      const std::size_t n = std::min<std::size_t>(32 * 1024, cut - pos);
      write_all(sp.fds[0], std::span(stream).subspan(pos, n));
      pos += n;
      read_available(reader, sp.fds[1]);
      got.drain(reader);
    }
    write_all(sp.fds[0], std::span(stream).subspan(cut));
    read_available(reader, sp.fds[1]);
    CHECK(reader.capacity() == initial);
    got.drain(reader);
    CHECK(got.frames == std::vector<Bytes>{big, small});
  }

  SUBCASE("read_from makes room for the rest of an announced frame at once") {
    // Once the length is in, one read takes everything of that frame that has arrived, rather
    // than growing the buffer a little per read.
    SocketPair sp;
    FrameReader reader;
    FrameView view;
    write_all(sp.fds[0], std::span(big).first(64));
    CHECK(read_available(reader, sp.fds[1]) == 64);
    CHECK_FALSE(reader.next(view));
    const std::size_t chunk = 150 * 1024;  // more than the initial capacity, less than the frame
    write_all(sp.fds[0], std::span(big).subspan(64, chunk));
    CHECK(reader.read_from(sp.fds[1]) == static_cast<long>(chunk));
    CHECK(reader.capacity() >= big.size());
    write_all(sp.fds[0], std::span(big).subspan(64 + chunk, 150 * 1024));
    CHECK(reader.read_from(sp.fds[1]) == static_cast<long>(150 * 1024));
  }

  SUBCASE("a stream of small frames never grows the buffer") {
    FrameReader reader;
    Collector got;
    const Bytes batch = concat(small_frames());
    std::mt19937 rng(3);
    for (int i = 0; i < 2000; ++i) {
      const std::size_t cut = rng() % batch.size();
      reader.append(std::span(batch).first(cut));
      got.drain(reader);
      reader.append(std::span(batch).subspan(cut));
      got.drain(reader);
    }
    CHECK(got.problem == "");
    CHECK(got.frames.size() == 2000 * small_frames().size());
    CHECK(reader.capacity() == initial);
  }
}

TEST_CASE("FrameReader: verify_frame") {
  const Bytes f = results_frame(5, 64);
  const Aligned ok(f);
  const wire::Frame* frame = verify_frame(ok.data(), ok.size);
  REQUIRE(frame != nullptr);
  CHECK(frame->body_type() == wire::Body::Results);
  CHECK(frame->body_as_Results()->items()->Get(0)->id() == 5);

  // The length prefix must match the size exactly, in both directions.
  Bytes longer = f;
  longer.push_back(0);
  const Aligned extra(longer);
  CHECK(verify_frame(extra.data(), extra.size) == nullptr);
  CHECK(verify_frame(ok.data(), ok.size - 1) == nullptr);

  // Too small to hold a length and a minimal FlatBuffer.
  const Aligned tiny(raw_frame(kMinFrameSize - 1, Bytes(kMinFrameSize - 1, 0)));
  CHECK(verify_frame(tiny.data(), tiny.size) == nullptr);
  CHECK(verify_frame(ok.data(), 0) == nullptr);

  // A well-formed FlatBuffer over kMaxFrameSize is refused even though it would verify, and
  // one of exactly kMaxFrameSize is accepted (also by a default reader).
  const Bytes huge = results_frame(6, kMaxFrameSize, Payload::kBytes);
  REQUIRE(huge.size() - kLengthPrefixSize > kMaxFrameSize);
  const Aligned huge_aligned(huge);
  CHECK(verify_frame(huge_aligned.data(), huge_aligned.size) == nullptr);
  FrameReader lenient(kMaxFrameSize + 1024);
  FrameView view;
  lenient.append(huge);
  CHECK_FALSE(lenient.next(view));
  CHECK(lenient.error() == FrameError::kMalformed);

  const Bytes base = results_frame(7, kMaxFrameSize - 1024, Payload::kBytes);
  const Bytes at_max = padded(base, kMaxFrameSize - (base.size() - kLengthPrefixSize));
  REQUIRE(at_max.size() - kLengthPrefixSize == kMaxFrameSize);
  const Aligned at_max_aligned(at_max);
  CHECK(verify_frame(at_max_aligned.data(), at_max_aligned.size) != nullptr);
  FrameReader reader;
  reader.append(at_max);
  REQUIRE(reader.next(view));
  CHECK(view.bytes.size() == at_max.size());
}

}  // namespace
}  // namespace outrun::protocol

namespace outrun::protocol {
namespace {

// An Evaluate frame with one input: an array of `uses` items that all point at one map of `keys`
// keys (each the same string). Verified in an 8-aligned copy.
const wire::Frame* shared_map_frame(std::vector<uint64_t>& storage, unsigned keys, unsigned uses,
                                    std::size_t* size) {
  flatbuffers::FlatBufferBuilder f(1 << 20);
  const auto k = f.CreateString("k");
  const auto kv = f.CreateVector(std::vector(keys, k));
  wire::ValueBuilder mb(f);
  mb.add_kind(wire::ValueKind::Map);
  mb.add_keys(kv);
  const auto map = mb.Finish();
  const auto iv = f.CreateVector(std::vector(uses, map));
  wire::ValueBuilder ab(f);
  ab.add_kind(wire::ValueKind::Array);
  ab.add_items(iv);
  const auto arr = ab.Finish();
  const std::vector in{wire::CreateInput(f, f.CreateString("x"), arr)};
  const auto ev = build_evaluation(f, 1, 1, 0, f.CreateVector(in), nullptr);
  const auto frame = finish_evaluate(f, std::span(&ev, 1));
  storage.assign(frame.size() / 8 + 1, 0);
  std::memcpy(storage.data(), frame.data(), frame.size());
  *size = frame.size();
  return verify_frame(reinterpret_cast<const uint8_t*>(storage.data()), frame.size());
}

}  // namespace

TEST_CASE("verify_frame: a map's keys are paid for at every use of the map") {
  std::vector<uint64_t> storage;
  std::size_t size = 0;
  // 1,000 uses of a map of 1,000 keys: 10^6 key checks, within the budget.
  CHECK(shared_map_frame(storage, 1000, 1000, &size) != nullptr);
  // 2 million uses of a map of 2 million keys, in 16 MB: 4 × 10^12 key checks, hours of the
  // loop thread with FlatBuffers' own Value::Verify; refused after the budget's 8 million.
  CHECK(shared_map_frame(storage, 2'000'000, 2'000'000, &size) == nullptr);
  CHECK(size <= kMaxFrameSize + kLengthPrefixSize);
  // A map used once is never near the budget, however many keys it has.
  CHECK(shared_map_frame(storage, 2'000'000, 1, &size) != nullptr);
}

}  // namespace outrun::protocol

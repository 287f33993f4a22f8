// Framing of the outrun wire protocol, shared by host, worker and (later) daemon clients.
//
// Byte layout of one frame on a stream:
//
//   +----------------------+-------------------------------------------+
//   | length: uint32 (LE)  | FlatBuffer, root `outrun.wire.Frame`      |
//   +----------------------+-------------------------------------------+
//     4 bytes                `length` bytes, 8 <= length <= kMaxFrameSize
//
// Frames follow each other with no padding. FlatBufferBuilder::FinishSizePrefixed produces
// exactly this layout. FlatBuffers aligns its fields relative to the start of the length
// prefix, and keeps the whole frame a multiple of its largest alignment, so a stream of frames
// stays aligned in a reader's 8-aligned buffer; a frame that arrives misaligned (a peer that
// pads differently) is copied to an aligned scratch buffer before it is verified and read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "outrun/protocol/outrun_generated.h"

namespace outrun::protocol {

// Bumped when a peer could misread a frame. Sent in Hello; a mismatch is a protocol violation.
// 2: `Evaluation.inputs_buffer`. 3: 64-bit client handles (`Registered.handle64`,
// `Evaluation.handle64`). outrund also accepts clients from kMinClientProtocolVersion on and
// answers each in its own version (design/protocol.md "Versions").
inline constexpr uint16_t kProtocolVersion = 3;
inline constexpr uint16_t kMinClientProtocolVersion = 1;

// Largest FlatBuffer (the part after the length) a peer may send: 16 MiB. A larger length is a
// protocol violation and the stream is abandoned (it cannot be resynchronised).
inline constexpr uint32_t kMaxFrameSize = 16u << 20;
// The largest bytecode of one script the host keeps from its compile-only process (as large as
// the largest source, kMaxSourceSize): an Evaluate frame carrying it stays as far below
// kMaxFrameSize as one carrying a source (design/sandbox.md "The compiler").
inline constexpr std::size_t kMaxBytecodeSize = 1u << 20;

// Smallest FlatBuffer that can hold a root offset and a table: anything shorter is malformed.
inline constexpr uint32_t kMinFrameSize = 8;

// Size of the length prefix.
inline constexpr std::size_t kLengthPrefixSize = 4;

// Verifier limits for every received frame. Depth bounds Value nesting (a Value level costs one
// table and one vector); tables bound the verifier's work on tables, and value checks its work
// on Values: one per Value used and one per map key checked, however often a frame points at
// the same one (outrun_generated.h). A frame without shared parts never comes near either
// (16 MiB hold under a million map entries).
inline constexpr unsigned kVerifierMaxDepth = 128;
inline constexpr unsigned kVerifierMaxTables = 4'000'000;
inline constexpr std::size_t kVerifierMaxValueChecks = 8'000'000;

// While one lives on a thread, the Values verified there take their checks from `left`
// (kVerifierMaxValueChecks for verify_frame); without one, nothing is counted. Nests.
class ValueCheckBudget {
 public:
  explicit ValueCheckBudget(std::size_t checks);
  ~ValueCheckBudget();
  ValueCheckBudget(const ValueCheckBudget&) = delete;
  ValueCheckBudget& operator=(const ValueCheckBudget&) = delete;
  std::size_t left() const { return left_; }

 private:
  std::size_t left_;
  std::size_t* previous_;
};

// Why a stream was abandoned.
enum class FrameError : uint8_t {
  kNone = 0,
  kOversized,   // length > kMaxFrameSize
  kUndersized,  // length < kMinFrameSize
  kMalformed,   // FlatBuffers verification failed (bad offsets, depth, missing body, ...)
};

const char* to_string(FrameError e);

// One verified frame. `frame` points into the reader's buffer (or its aligned scratch copy) and
// stays valid until the next call to FrameReader::next(), read_from() or append().
struct FrameView {
  const wire::Frame* frame = nullptr;
  std::span<const uint8_t> bytes;  // the whole frame: length prefix and FlatBuffer
};

// Buffered frame reader. One read_from() takes every byte that has arrived, up to the free space
// (at least half the initial capacity, and always room for the rest of a frame whose length has
// arrived); next() then hands out complete, verified frames one at a time, reassembling frames
// split across any number of reads. After a large frame the buffer shrinks back to its initial
// capacity.
//
// Not thread-safe: owned by one thread at a time (the worker's main thread; in the host, whoever
// holds the shard's read token: the loop thread or one leader).
class FrameReader {
 public:
  // `max_frame` lets tests use a smaller bound; production uses kMaxFrameSize.
  explicit FrameReader(uint32_t max_frame = kMaxFrameSize,
                       std::size_t initial_capacity = 64 * 1024);

  // One read(2) from `fd` into the free space. Returns bytes read (> 0), 0 at end of stream, or
  // -errno (-EAGAIN on an empty non-blocking fd). EINTR is retried.
  long read_from(int fd);
  // read_from() in two halves, for a transport that is not an fd (a Windows named pipe,
  // outrun/platform/worker_os.h): the free space one read may fill, then how much it did.
  std::span<uint8_t> read_space();
  void commit(std::size_t n) { end_ += n; }

  // Appends bytes as if they had been read (tests, fuzzers, in-memory peers).
  void append(std::span<const uint8_t> bytes);

  // Next complete frame. Returns true and fills `out` when one is ready; false when more bytes
  // are needed or the stream is broken (then error() != kNone and every later call fails too).
  bool next(FrameView& out);
  // Hands the frame the last next() returned back, so the next call returns it again. Only right
  // after a next() that returned true, before any read_from() or append(): the host's leader
  // leaves a frame it does not handle to the loop thread this way (design/threading.md).
  void put_back() {
    begin_ = last_begin_;
    end_ = last_end_;
  }

  FrameError error() const { return error_; }
  // Bytes received but not yet handed out as frames.
  std::size_t buffered() const { return end_ - begin_; }
  // Current buffer capacity (tests check that it shrinks back after a large frame).
  std::size_t capacity() const { return capacity_; }

 private:
  void compact_and_reserve(std::size_t need);

  uint32_t max_frame_;
  std::size_t initial_capacity_;
  std::unique_ptr<uint64_t[]> storage_;  // uint64_t keeps the buffer 8-byte aligned
  std::size_t capacity_ = 0;
  std::size_t begin_ = 0;                      // first unconsumed byte
  std::size_t end_ = 0;                        // one past the last received byte
  std::size_t last_begin_ = 0, last_end_ = 0;  // before the last next() that returned a frame
  std::vector<uint64_t> scratch_;              // aligned copy of a misaligned frame
  FrameError error_ = FrameError::kNone;
};

// Verifies one whole frame (length prefix included) as a Frame: the prefix must equal the
// FlatBuffer's size, which must be within [kMinFrameSize, kMaxFrameSize]. `data` must be
// 8-aligned. Returns nullptr when it is not a valid frame.
const wire::Frame* verify_frame(const uint8_t* data, std::size_t size);

}  // namespace outrun::protocol

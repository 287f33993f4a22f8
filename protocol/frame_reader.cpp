#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "outrun/protocol/frame.h"

namespace outrun::protocol {

const char* to_string(FrameError e) {
  switch (e) {
    case FrameError::kNone:
      return "no error";
    case FrameError::kOversized:
      return "frame length exceeds the maximum frame size";
    case FrameError::kUndersized:
      return "frame length is too small to hold a frame";
    case FrameError::kMalformed:
      return "frame failed verification";
  }
  return "unknown frame error";
}

const wire::Frame* verify_frame(const uint8_t* data, std::size_t size) {
  if (size < kLengthPrefixSize + kMinFrameSize || size - kLengthPrefixSize > kMaxFrameSize)
    return nullptr;
  flatbuffers::Verifier::Options opts;
  opts.max_depth = kVerifierMaxDepth;
  opts.max_tables = kVerifierMaxTables;
  opts.check_alignment = true;
  // Evaluation.inputs_buffer is checked by check_input_list, which pays for each use of it
  // (input_list.h); FlatBuffers would verify it with fresh limits every time it is met.
  opts.check_nested_flatbuffers = false;
  const ValueCheckBudget checks(kVerifierMaxValueChecks);
  flatbuffers::Verifier verifier(data, size, opts);
  if (!wire::VerifySizePrefixedFrameBuffer(verifier)) return nullptr;
  return wire::GetSizePrefixedFrame(data);
}

namespace {
uint32_t load_le32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
std::size_t round8(std::size_t n) {
  return (n + 7) & ~std::size_t(7);
}
}  // namespace

FrameReader::FrameReader(uint32_t max_frame, std::size_t initial_capacity)
    : max_frame_(max_frame),
      initial_capacity_(round8(initial_capacity < 64 ? 64 : initial_capacity)) {
  storage_.reset(new uint64_t[initial_capacity_ / 8]);
  capacity_ = initial_capacity_;
}

// Moves unconsumed bytes to the front and makes room for `need` contiguous bytes after them.
// The shift is a multiple of 8 whenever frames are multiples of 8, which keeps them aligned.
void FrameReader::compact_and_reserve(std::size_t need) {
  auto* buf = reinterpret_cast<uint8_t*>(storage_.get());
  const std::size_t live = end_ - begin_;
  std::size_t want = live + need;
  if (want > capacity_ || (capacity_ > initial_capacity_ && want <= initial_capacity_)) {
    // Grow for a large frame, or give the memory of a past large frame back once it is consumed
    // (what is left of the buffer then fits in the initial capacity; it is copied over).
    const std::size_t cap = want > capacity_ ? round8(want) : initial_capacity_;
    std::unique_ptr<uint64_t[]> bigger(new uint64_t[cap / 8]);
    if (live) std::memcpy(bigger.get(), buf + begin_, live);
    storage_ = std::move(bigger);
    capacity_ = cap;
  } else if (begin_ != 0) {
    if (live) std::memmove(buf, buf + begin_, live);
  }
  begin_ = 0;
  end_ = live;
}

std::span<uint8_t> FrameReader::read_space() {
  // Room for what the partial frame at the front still needs, and at least half the initial
  // capacity, so one read takes every frame that has arrived in the common case.
  std::size_t need = initial_capacity_ / 2;
  const std::size_t live = end_ - begin_;
  if (live >= kLengthPrefixSize && error_ == FrameError::kNone) {
    const auto* buf = reinterpret_cast<const uint8_t*>(storage_.get());
    const uint32_t len = load_le32(buf + begin_);
    if (len <= max_frame_ && kLengthPrefixSize + len > live)
      need = std::max(need, kLengthPrefixSize + len - live);
  }
  // A grown buffer is always revisited: next() resets an emptied buffer to offset 0, so
  // without the capacity test the shrink in compact_and_reserve() would never be reached.
  if (capacity_ - end_ < need || begin_ != 0 || capacity_ > initial_capacity_) {
    compact_and_reserve(need);
  }
  return {reinterpret_cast<uint8_t*>(storage_.get()) + end_, capacity_ - end_};
}

long FrameReader::read_from(int fd) {
  const std::span<uint8_t> space = read_space();
  for (;;) {
    const ssize_t n = ::read(fd, space.data(), space.size());
    if (n > 0) {
      end_ += static_cast<std::size_t>(n);
      return n;
    }
    if (n == 0) return 0;
    if (errno == EINTR) continue;
    return -errno;
  }
}

void FrameReader::append(std::span<const uint8_t> bytes) {
  if (capacity_ - end_ < bytes.size() || begin_ != 0 || capacity_ > initial_capacity_) {
    compact_and_reserve(bytes.size());
  }
  std::memcpy(reinterpret_cast<uint8_t*>(storage_.get()) + end_, bytes.data(), bytes.size());
  end_ += bytes.size();
}

bool FrameReader::next(FrameView& out) {
  if (error_ != FrameError::kNone) return false;
  const std::size_t live = end_ - begin_;
  if (live < kLengthPrefixSize) return false;
  const auto* buf = reinterpret_cast<const uint8_t*>(storage_.get());
  const uint32_t len = load_le32(buf + begin_);
  if (len > max_frame_) {
    error_ = FrameError::kOversized;
    return false;
  }
  if (len < kMinFrameSize) {
    error_ = FrameError::kUndersized;
    return false;
  }
  if (live < kLengthPrefixSize + len) return false;
  const std::size_t total = kLengthPrefixSize + len;
  const uint8_t* data = buf + begin_;
  if (reinterpret_cast<uintptr_t>(data) % 8 != 0) {
    scratch_.resize(round8(total) / 8);
    std::memcpy(scratch_.data(), data, total);
    data = reinterpret_cast<const uint8_t*>(scratch_.data());
  }
  const wire::Frame* frame = verify_frame(data, total);
  if (frame == nullptr) {
    error_ = FrameError::kMalformed;
    return false;
  }
  last_begin_ = begin_;
  last_end_ = end_;
  begin_ += total;
  if (begin_ == end_) begin_ = end_ = 0;  // cheap reset keeps later frames at aligned offsets
  out.frame = frame;
  out.bytes = {data, total};
  return true;
}

}  // namespace outrun::protocol

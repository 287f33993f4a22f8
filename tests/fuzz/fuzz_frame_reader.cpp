// fuzz_frame_reader: an arbitrary byte stream, cut at fuzzer-chosen points, through
// protocol::FrameReader -- the first thing the host does with a worker's bytes (and the worker
// with the host's).
//
// Input: the stream's bytes come from the front; the choices (reader bound and capacity, how
// each piece arrives, where the pieces are cut) from the back (FuzzedDataProvider).
//
// Checked against model_stream(), an independent reading of the protocol: the reader returns
// exactly the model's frames, byte for byte and in order, each verified, 8-aligned and no larger
// than its bound; it stops with the model's error, at the model's offset; errors are sticky
// (valid frames appended later are never returned); its buffer stays bounded.
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "fuzz_support.h"

using namespace outrun;
using namespace outrun::fuzz;

namespace {

// One socketpair for the process, both ends non-blocking: read_from() is exercised on a real fd.
struct Pipe {
  int w = -1, r = -1;
  Pipe() {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
    w = sv[0];
    r = sv[1];
  }
  void drain() {
    uint8_t buf[4096];
    while (::read(r, buf, sizeof buf) > 0) {
    }
  }
};

ByteVec shutdown_frame() {
  flatbuffers::FlatBufferBuilder fbb(64);
  const auto frame = protocol::encode_shutdown(fbb);
  return ByteVec(frame.begin(), frame.end());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Pipe pipe;
  static const ByteVec kShutdown = shutdown_frame();
  FuzzedDataProvider in(data, size);

  // Reader bound: production's, or a small one so that kOversized is reachable.
  static constexpr uint32_t kBounds[] = {protocol::kMaxFrameSize, 8, 16, 64, 256, 4096};
  const uint32_t max_frame = in.PickValueInArray(kBounds);
  static constexpr std::size_t kCapacities[] = {64, 72, 100, 1024, 64 * 1024};
  const std::size_t capacity = in.PickValueInArray(kCapacities);
  const bool use_fd = in.ConsumeBool();

  // The stream is what is left after taking a cut schedule of up to 64 pieces from the back.
  std::vector<std::size_t> cuts;
  const std::size_t pieces = in.ConsumeIntegralInRange<std::size_t>(1, 64);
  for (std::size_t i = 0; i < pieces && in.remaining_bytes() > 0; ++i)
    cuts.push_back(in.ConsumeIntegralInRange<std::size_t>(0, 1u << 16));
  const ByteVec stream = in.ConsumeRemainingBytes<uint8_t>();
  const StreamModel model = model_stream(stream, max_frame);

  protocol::FrameReader reader(max_frame, capacity);
  std::size_t fed = 0, got = 0, out_bytes = 0, largest_piece = 0;
  auto take_frames = [&] {
    protocol::FrameView fv;
    while (reader.next(fv)) {
      FUZZ_CHECK(got < model.frames.size());
      const auto& want = model.frames[got];
      FUZZ_CHECK(fv.bytes.size() == want.size);
      FUZZ_CHECK(fv.bytes.size() <= protocol::kLengthPrefixSize + max_frame);
      FUZZ_CHECK(load_le32(fv.bytes.data()) + protocol::kLengthPrefixSize == fv.bytes.size());
      FUZZ_CHECK(std::memcmp(fv.bytes.data(), stream.data() + want.offset, want.size) == 0);
      FUZZ_CHECK(reinterpret_cast<uintptr_t>(fv.bytes.data()) % 8 == 0);
      FUZZ_CHECK(fv.frame == protocol::verify_frame(fv.bytes.data(), fv.bytes.size()));
      FUZZ_CHECK(fv.frame->body_type() == want.body);
      (void)touch_frame(fv.frame);
      out_bytes += fv.bytes.size();
      ++got;
    }
  };

  std::size_t c = 0;
  while (fed < stream.size()) {
    std::size_t n = cuts.empty() ? stream.size() - fed : cuts[c++ % cuts.size()];
    n = std::min(n, stream.size() - fed);
    if (n == 0) n = 1;
    largest_piece = std::max(largest_piece, n);
    if (use_fd) {
      // Write what the socket takes; read_from() takes what has arrived, maybe less.
      std::size_t off = 0;
      while (off < n) {
        const ssize_t w = ::write(pipe.w, stream.data() + fed + off, n - off);
        if (w > 0) off += static_cast<std::size_t>(w);
        for (;;) {
          const long r = reader.read_from(pipe.r);
          if (r == -EAGAIN) break;
          FUZZ_CHECK(r > 0);
          take_frames();
        }
      }
    } else {
      reader.append(std::span<const uint8_t>(stream.data() + fed, n));
      take_frames();
    }
    fed += n;
    // Bounded memory: the buffer holds at most a partial frame, one piece (or one read, at
    // most the capacity it had) and alignment slack. (After an error it keeps what it is
    // given; its owner stops reading.)
    if (reader.error() == protocol::FrameError::kNone)
      FUZZ_CHECK(reader.capacity() <=
                 std::max(capacity, 2 * (protocol::kLengthPrefixSize + std::size_t{max_frame}) +
                                        2 * largest_piece + capacity + 64));
  }
  take_frames();

  FUZZ_CHECK(got == model.frames.size());
  FUZZ_CHECK(out_bytes == model.consumed);
  FUZZ_CHECK(reader.error() == model.error);
  FUZZ_CHECK(reader.buffered() == stream.size() - model.consumed);

  // Sticky errors: a valid frame after a broken stream never comes out.
  if (model.error != protocol::FrameError::kNone) {
    reader.append(kShutdown);
    protocol::FrameView fv;
    FUZZ_CHECK(!reader.next(fv));
    FUZZ_CHECK(reader.error() == model.error);
  } else if (model.consumed == stream.size() &&
             kShutdown.size() - protocol::kLengthPrefixSize <= max_frame) {
    // A clean stream keeps working: the next frame comes out whole.
    reader.append(kShutdown);
    protocol::FrameView fv;
    FUZZ_CHECK(reader.next(fv));
    FUZZ_CHECK(fv.frame->body_type() == wire::Body::Shutdown);
    FUZZ_CHECK(reader.buffered() == 0);
  }
  pipe.drain();
  return 0;
}

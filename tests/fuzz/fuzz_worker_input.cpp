// fuzz_worker_input: the worker reading host frames. The real outrun::worker::Worker (the code
// outrun-worker runs, without confinement) serves one end of a socketpair; the fuzz input is the
// byte stream the "host" wrote before closing its side. The worker runs until it returns, and
// everything it answered is read back and checked.
//
// Bounded per input (reasoned in design/fuzzing.md): a script's soft timeout is the only thing
// that stops a runaway, and a frame may carry any timeout and may repeat one evaluation table
// thousands of times (FlatBuffers vectors may share offsets). So before the worker sees the
// stream, every Evaluation's timeout_us is clamped in place to <= 2 ms, with 100 ms for the whole
// input (later evaluations get what is left, down to 0 = stop at the first hook check); inputs
// with more than 256 evaluations or 64 sources are refused (not run, not kept). Each script
// state has a 1 MiB memory limit.
//
// Checked: the worker's exit code is 76 exactly when the stream holds a frame that breaks the
// rules (else 0); it says Hello first; every evaluation in the valid frames is answered once, in
// order, with a status a worker may send; ids out of range are InvalidArgument; every Ok value
// is one the host accepts (decode_value); error messages stay cut at 64 KiB; every frame it
// writes verifies and fits kMaxFrameSize.
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "fuzz_support.h"
#include "outrun/value.h"
#include "wire_codec.h"
#include "worker.h"

using namespace outrun;
using namespace outrun::fuzz;

namespace {

constexpr std::size_t kMaxInput = 60000;  // one read(2) of the worker's 64 KiB buffer takes it all
constexpr uint64_t kMaxTimeoutUs = 2000;
constexpr uint64_t kBudgetUs = 100'000;
constexpr std::size_t kMaxEvaluations = 256;
constexpr std::size_t kMaxSources = 64;
constexpr std::size_t kMemoryLimit = 1u << 20;

struct Expected {
  uint64_t id;
  uint32_t script_id;
};

// Clamps timeouts in place (see above). Fields of a fuzzed buffer may overlap other fields,
// vtables or vector lengths, so the writes are planned on the unchanged frame first and made
// after; the caller then reads the stream again (it may no longer verify as it did).
void clamp_timeouts(ByteVec& stream) {
  const StreamModel m = model_stream(stream);
  uint64_t spent = 0;
  for (const auto& f : m.frames) {
    if (f.body != wire::Body::Evaluate) continue;
    Aligned copy(std::span<const uint8_t>(stream.data() + f.offset, f.size));
    const wire::Frame* frame = protocol::verify_frame(copy.data(), f.size);
    FUZZ_CHECK(frame != nullptr);
    const auto* items = frame->body_as_Evaluate()->items();
    if (!items) continue;
    std::vector<std::pair<std::size_t, uint64_t>> writes;  // offset in the frame, value
    for (const wire::Evaluation* e : *items) {
      const uint64_t t = std::min({e->timeout_us(), kMaxTimeoutUs, kBudgetUs - spent});
      spent += t;
      // The field may be absent (default 0: already the smallest). Generated tables inherit
      // flatbuffers::Table privately, at offset 0.
      const auto* table = reinterpret_cast<const flatbuffers::Table*>(e);
      if (const uint8_t* p = table->GetAddressOf(wire::Evaluation::VT_TIMEOUT_US))
        writes.emplace_back(static_cast<std::size_t>(p - copy.data()), t);
    }
    for (const auto& [off, t] : writes) flatbuffers::WriteScalar<uint64_t>(copy.data() + off, t);
    std::memcpy(stream.data() + f.offset, copy.data(), f.size);
  }
}

// Lists the evaluations the worker must answer, from the stream as the worker gets it. Returns
// false to refuse the input: too many evaluations or sources, or timeouts over the bounds
// (possible only where the clamp's writes overlapped other fields).
bool expected_answers(const ByteVec& stream, std::vector<Expected>* expected) {
  const StreamModel m = model_stream(stream);
  uint64_t total = 0;
  std::size_t sources = 0;
  for (const auto& f : m.frames) {
    if (f.body != wire::Body::Evaluate) continue;
    Aligned copy(std::span<const uint8_t>(stream.data() + f.offset, f.size));
    const wire::Frame* frame = protocol::verify_frame(copy.data(), f.size);
    FUZZ_CHECK(frame != nullptr);
    const auto* items = frame->body_as_Evaluate()->items();
    if (!items) continue;
    for (const wire::Evaluation* e : *items) {
      if (expected->size() == kMaxEvaluations) return false;
      if (e->source() && ++sources > kMaxSources) return false;
      // Pattern matching can run for minutes inside one C call, which only the host's hard kill
      // ends (design/sandbox.md); fuzz_compile fuzzes it with bounded arguments. Here a script
      // that names a pattern function is refused.
      if (const auto* src = e->source()) {
        const std::string_view text = src->string_view();
        if (text.find("find") != text.npos || text.find("match") != text.npos ||
            text.find("gsub") != text.npos)
          return false;
      }
      if (e->timeout_us() > kMaxTimeoutUs) return false;
      total += e->timeout_us();
      if (total > kBudgetUs) return false;
      expected->push_back({e->id(), e->script_id()});
    }
  }
  return true;
}

bool worker_status(wire::Status s) {
  switch (s) {
    case wire::Status::Ok:
    case wire::Status::CompileError:
    case wire::Status::RuntimeError:
    case wire::Status::Timeout:
    case wire::Status::MemoryLimit:
    case wire::Status::InvalidArgument:
    case wire::Status::NeedSource:
      return true;
    default:
      return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // protocol violations are expected, and logged
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return -1;
  ByteVec stream(data, data + size);
  clamp_timeouts(stream);
  std::vector<Expected> expected;
  if (!expected_answers(stream, &expected)) return -1;
  const StreamModel model = model_stream(stream);

  int sv[2];
  FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  std::size_t off = 0;
  while (off < stream.size()) {
    const ssize_t n = ::write(sv[0], stream.data() + off, stream.size() - off);
    FUZZ_CHECK(n > 0);
    off += static_cast<std::size_t>(n);
  }
  ::shutdown(sv[0], SHUT_WR);
  ByteVec answer;
  std::thread drain([&] {
    uint8_t buf[64 * 1024];
    for (;;) {
      const ssize_t n = ::read(sv[0], buf, sizeof buf);
      if (n <= 0) break;
      answer.insert(answer.end(), buf, buf + n);
    }
  });

  int rc;
  {
    worker::WorkerOptions opts;
    opts.fd = sv[1];
    opts.memory_limit = kMemoryLimit;
    worker::Worker w(opts);
    rc = w.run();
  }
  ::shutdown(sv[1], SHUT_RDWR);
  drain.join();
  ::close(sv[0]);
  ::close(sv[1]);

  FUZZ_CHECK(rc == protocol::exit_code(model.error == protocol::FrameError::kNone
                                           ? protocol::WorkerExit::kOk
                                           : protocol::WorkerExit::kProtocol));

  protocol::FrameReader reader;
  reader.append(answer);
  protocol::FrameView fv;
  bool hello = false;
  std::size_t answered = 0;
  while (reader.next(fv)) {
    if (!hello) {
      FUZZ_CHECK(fv.frame->body_type() == wire::Body::Hello);
      FUZZ_CHECK(fv.frame->body_as_Hello()->protocol_version() == protocol::kProtocolVersion);
      FUZZ_CHECK(fv.frame->body_as_Hello()->pid() == getpid());
      hello = true;
      continue;
    }
    FUZZ_CHECK(fv.frame->body_type() == wire::Body::Results);
    const auto* items = fv.frame->body_as_Results()->items();
    FUZZ_CHECK(items != nullptr && items->size() > 0);
    for (const wire::Result* r : *items) {
      FUZZ_CHECK(answered < expected.size());
      const Expected& want = expected[answered++];
      FUZZ_CHECK(r->id() == want.id);
      FUZZ_CHECK(worker_status(r->status()));
      if (want.script_id >= worker::kMaxScriptId)
        FUZZ_CHECK(r->status() == wire::Status::InvalidArgument);
      if (r->status() == wire::Status::Ok) {
        Value v;
        FUZZ_CHECK(detail::decode_value(r->value(), &v));
      } else if (const auto* e = r->error()) {
        FUZZ_CHECK(e->size() <= (64u << 10) + 100);
      }
    }
  }
  if (std::getenv("OUTRUN_FUZZ_VERBOSE"))  // when reproducing a finding by hand
    std::fprintf(stderr, "exit %d, stream error %s, %zu frames, %zu evaluations, %zu answered\n",
                 rc, protocol::to_string(model.error), model.frames.size(), expected.size(),
                 answered);
  FUZZ_CHECK(hello);
  FUZZ_CHECK(reader.error() == protocol::FrameError::kNone);
  FUZZ_CHECK(reader.buffered() == 0);
  FUZZ_CHECK(answered == expected.size());
  return 0;
}

// fuzz_host_results: what the host does with a worker's bytes -- the stream through the
// host's FrameReader (split at fuzzer-chosen points, as reads arrive), then the rules of
// Host::Impl::process_frames/handle_results (host/src/workers.cpp) and decode_value on every
// Ok result, until the first violation (where the host kills the worker).
//
// Why not a real outrun::Host with a fake worker process: each input would cost a process spawn,
// a hello handshake and a kill/restart (tens of ms), and the outcome would depend on timing
// (batching, restarts), which libFuzzer cannot reproduce. The untrusted bytes meet the host in
// exactly three places, all driven here with the host's own code: FrameReader::read_from/next
// (framing and verification), the frame-type and status rules (protocol::decode_worker_frame and
// decode_worker_result, which workers.cpp calls; the hello and id rules around them are mirrored
// below), and detail::decode_value. The id bookkeeping behind them (slots) is covered by
// tests/host/supervision_test.cpp with real workers, including a worker writing garbage.
//
// Input: stream bytes from the front; from the back, the evaluations in flight (ids as the host
// makes them: generation << 32 | slot) and the cut schedule.
#include <fuzzer/FuzzedDataProvider.h>

#include <set>

#include "fuzz_support.h"
#include "value_oracle.h"

using namespace outrun;
using namespace outrun::fuzz;

namespace {

// Mirrors the host's checks; returns the violation ("" while the worker is in good standing).
struct HostSide {
  bool hello = false;
  std::set<uint64_t> in_flight;
  std::set<uint64_t> source_resent;

  std::string frame(const wire::Frame* f) {
    protocol::WorkerMessage m;
    std::string why;
    if (!protocol::decode_worker_frame(f, &m, &why)) return why;  // a type or version
    if (std::holds_alternative<protocol::HelloMsg>(m)) {
      if (hello) return "second hello";
      hello = true;
      return "";
    }
    if (!hello) return "results before hello";
    const auto* items = std::get<protocol::ResultsMsg>(m).items;
    if (!items) return "";
    std::size_t budget = detail::kMaxResultsDecodeBytes;  // per frame, as handle_results
    for (const wire::Result* item : *items) {
      if (!in_flight.count(item->id())) return "not in flight";
      protocol::ResultView r;
      if (!protocol::decode_worker_result(item, &r, &why)) return why;  // a host-only status
      if (r.status == wire::Status::NeedSource) {
        if (!source_resent.insert(r.id).second) return "second NeedSource";
        continue;  // re-sent: stays in flight
      }
      in_flight.erase(r.id);
      if (r.status == wire::Status::Ok) check_decode(r.value);
      Value v;
      std::string message;
      switch (detail::decode_result(r.status == wire::Status::Ok, r.value, r.error, &v, &message,
                                    &budget)) {
        case detail::ResultDecode::ok:
          break;
        case detail::ResultDecode::invalid:
          return "invalid value";
        case detail::ResultDecode::spent:
          return "past the decode budget";
      }
    }
    return "";
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  HostSide host;
  const uint32_t slots = in.ConsumeIntegralInRange<uint32_t>(0, 16);
  for (uint32_t i = 0; i < slots; ++i) host.in_flight.insert((uint64_t{1} << 32) | i);
  std::vector<std::size_t> cuts;
  const std::size_t pieces = in.ConsumeIntegralInRange<std::size_t>(0, 16);
  for (std::size_t i = 0; i < pieces && in.remaining_bytes() > 0; ++i)
    cuts.push_back(in.ConsumeIntegralInRange<std::size_t>(1, 1u << 14));
  const ByteVec stream = in.ConsumeRemainingBytes<uint8_t>();

  protocol::FrameReader reader;  // the host's: kMaxFrameSize, 64 KiB
  std::string violation;
  std::size_t fed = 0, c = 0;
  while (fed < stream.size() && violation.empty()) {
    std::size_t n = cuts.empty() ? stream.size() - fed : cuts[c++ % cuts.size()];
    n = std::min(n, stream.size() - fed);
    reader.append(std::span<const uint8_t>(stream.data() + fed, n));
    fed += n;
    protocol::FrameView fv;
    while (violation.empty() && reader.next(fv)) {
      (void)touch_frame(fv.frame);
      violation = host.frame(fv.frame);
    }
    if (violation.empty() && reader.error() != protocol::FrameError::kNone)
      violation = protocol::to_string(reader.error());
  }
  return 0;
}

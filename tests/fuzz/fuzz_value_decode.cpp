// fuzz_value_decode: value decoding on both sides of the pipe.
//
// First input byte even: the rest is taken as a FlatBuffer whose root is a wire::Value; when it
// verifies (production verifier options, fewer tables), the host's decode_value must agree with
// host_accepts(), say what the wire said, and round-trip through the host's encoder.
//
// Odd: the rest is a small program that builds values with the real builders, including shapes
// no valid peer sends (unknown kinds, maps whose keys and items differ, fields of other kinds,
// shared subtrees, nesting past 32), puts them as the inputs of an Evaluate frame, and verifies
// the frame. Each input goes through decode_value (host) and the whole list through the worker's
// push_wire_inputs into a 1 MiB Lua state running `return inputs`: the worker must refuse
// (InvalidArgument) exactly the inputs the host refuses, unless memory runs out first, and what
// the script returns converts to a value the host accepts (or is refused by the converter).
#include <fuzzer/FuzzedDataProvider.h>

#include <lua.hpp>

#include "lua_values.h"
#include "outrun/protocol/wire_value.h"
#include "sandbox.h"
#include "value_oracle.h"
#include "wire_values.h"

using namespace outrun;
using namespace outrun::fuzz;

namespace {

// Fewer than production's 4,000,000: shared subtables are verified (and decoded) once per
// reference, and a few million per input would only make the fuzzer slow.
constexpr unsigned kFuzzMaxTables = 10'000;

void raw_value(FuzzedDataProvider& in) {
  const ByteVec rest = in.ConsumeRemainingBytes<uint8_t>();
  Aligned buf(rest);
  flatbuffers::Verifier::Options opts;
  opts.max_depth = protocol::kVerifierMaxDepth;
  opts.max_tables = kFuzzMaxTables;
  opts.check_alignment = true;
  flatbuffers::Verifier verifier(buf.data(), buf.size(), opts);
  if (!verifier.VerifyBuffer<wire::Value>(nullptr)) return;
  const auto* v = flatbuffers::GetRoot<wire::Value>(buf.data());
  (void)touch_value(v);
  check_decode(v);
}

using Ref = flatbuffers::Offset<wire::Value>;

std::vector<Ref> pop(std::vector<Ref>& stack, std::size_t k) {
  k = std::min(k, stack.size());
  std::vector<Ref> out(stack.end() - static_cast<std::ptrdiff_t>(k), stack.end());
  stack.resize(stack.size() - k);
  return out;
}

// Builds the values; returns the stack (the inputs, in order).
std::vector<Ref> build(FuzzedDataProvider& in, flatbuffers::FlatBufferBuilder& fbb) {
  protocol::WireValueBuilder b(fbb);
  std::vector<Ref> stack;
  while (in.remaining_bytes() > 0 && stack.size() < 256) {
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
      case 0:
        stack.push_back(b.nil());
        break;
      case 1:
        stack.push_back(b.boolean(in.ConsumeBool()));
        break;
      case 2:
        stack.push_back(b.integer(in.ConsumeIntegral<int64_t>()));
        break;
      case 3: {
        // Any bit pattern: NaNs, infinities, -0.0.
        const uint64_t bits = in.ConsumeIntegral<uint64_t>();
        double d;
        std::memcpy(&d, &bits, sizeof d);
        stack.push_back(b.number(d));
        break;
      }
      case 4: {
        const bool utf8 = in.ConsumeBool();
        const std::string s = in.ConsumeRandomLengthString(64);
        stack.push_back(b.string(s, utf8));
        break;
      }
      case 5: {
        const auto items = pop(stack, in.ConsumeIntegralInRange<std::size_t>(0, 8));
        stack.push_back(b.array(items));
        break;
      }
      case 6: {
        const auto items = pop(stack, in.ConsumeIntegralInRange<std::size_t>(0, 8));
        std::vector<std::string> keys;
        for (std::size_t i = 0; i < items.size(); ++i)
          keys.push_back(in.ConsumeRandomLengthString(16));  // duplicates allowed
        std::vector<std::pair<std::string_view, Ref>> entries;
        for (std::size_t i = 0; i < items.size(); ++i) entries.emplace_back(keys[i], items[i]);
        stack.push_back(b.map(entries));
        break;
      }
      case 7: {
        // Anything the schema allows: any kind byte, any mix of fields.
        const auto kind = static_cast<wire::ValueKind>(in.ConsumeIntegral<uint8_t>());
        const uint8_t fields = in.ConsumeIntegral<uint8_t>();
        flatbuffers::Offset<flatbuffers::String> str;
        flatbuffers::Offset<flatbuffers::Vector<uint8_t>> bytes;
        flatbuffers::Offset<flatbuffers::Vector<Ref>> items;
        flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> keys;
        if (fields & 1) str = fbb.CreateString(in.ConsumeRandomLengthString(16));
        if (fields & 2) {
          const std::string s = in.ConsumeRandomLengthString(16);
          bytes = fbb.CreateVector(reinterpret_cast<const uint8_t*>(s.data()), s.size());
        }
        if (fields & 4) items = fbb.CreateVector(pop(stack, in.ConsumeIntegralInRange<int>(0, 4)));
        if (fields & 8) {
          std::vector<flatbuffers::Offset<flatbuffers::String>> ks;
          const int n = in.ConsumeIntegralInRange<int>(0, 4);
          for (int i = 0; i < n; ++i)
            ks.push_back(fbb.CreateString(in.ConsumeRandomLengthString(8)));
          keys = fbb.CreateVector(ks);
        }
        stack.push_back(wire::CreateValue(fbb, kind, (fields & 16) != 0,
                                          (fields & 32) ? in.ConsumeIntegral<int64_t>() : 0,
                                          (fields & 64) ? 1.5 : 0.0, str, bytes, items, keys));
        break;
      }
      case 8:  // share a subtree (FlatBuffers offsets may point to the same table)
        if (!stack.empty()) stack.push_back(stack.back());
        break;
      case 9: {  // nest the top `depth` times in one-element arrays (reaches 32 quickly)
        if (stack.empty()) break;
        const int depth = in.ConsumeIntegralInRange<int>(1, 40);
        Ref r = stack.back();
        for (int i = 0; i < depth; ++i) r = b.array({r});
        stack.back() = r;
        break;
      }
    }
  }
  return stack;
}

void built_values(FuzzedDataProvider& in) {
  flatbuffers::FlatBufferBuilder fbb(1024);
  const std::vector<Ref> values = build(in, fbb);
  std::vector<flatbuffers::Offset<wire::Input>> inputs;
  for (std::size_t i = 0; i < values.size(); ++i)
    inputs.push_back(wire::CreateInput(fbb, fbb.CreateString("i" + std::to_string(i)), values[i]));
  const auto inputs_vec = fbb.CreateVector(inputs);
  const auto source = fbb.CreateString("return inputs");
  const auto eval = wire::CreateEvaluation(fbb, 1, 0, 0, source, 0, 1000, inputs_vec);
  Aligned frame_bytes(protocol::finish_evaluate(fbb, {&eval, 1}));
  // The production verifier (4,000,000 tables) is what frames get; shared subtrees make a
  // program that passes it costly, so they are bounded by the fuzz limit first.
  flatbuffers::Verifier::Options opts;
  opts.max_depth = protocol::kVerifierMaxDepth;
  opts.max_tables = kFuzzMaxTables;
  flatbuffers::Verifier small(frame_bytes.data(), frame_bytes.size(), opts);
  if (!wire::VerifySizePrefixedFrameBuffer(small)) return;  // too deep or too large
  const wire::Frame* frame = protocol::verify_frame(frame_bytes.data(), frame_bytes.size());
  FUZZ_CHECK(frame != nullptr);
  const auto* e = frame->body_as_Evaluate()->items()->Get(0);

  bool all_accepted = true;
  for (const wire::Input* input : *e->inputs()) {
    check_decode(input->value());
    all_accepted = all_accepted && host_accepts(input->value());
  }

  std::string err;
  auto state = sandbox::ScriptState::create(1u << 20, &err);
  FUZZ_CHECK(state != nullptr);
  FUZZ_CHECK(state->compile(e->source()->string_view(), "=fuzz").status == wire::Status::Ok);
  const auto out = state->run(sandbox::push_wire_inputs, e->inputs(), 50'000'000);
  if (out.status == wire::Status::MemoryLimit) return;
  FUZZ_CHECK(out.status == (all_accepted ? wire::Status::Ok : wire::Status::InvalidArgument));
  if (out.status != wire::Status::Ok) return;
  flatbuffers::FlatBufferBuilder rb(1024);
  sandbox::WireValueBuilder builder(rb);
  sandbox::ResultConverter conv(state->L(), builder);
  Ref result;
  if (!conv.convert(lua_gettop(state->L()), &result)) return;
  rb.Finish(result);
  flatbuffers::Verifier rv(rb.GetBufferPointer(), rb.GetSize(), opts);
  FUZZ_CHECK(rv.VerifyBuffer<wire::Value>(nullptr));
  const auto* w = flatbuffers::GetRoot<wire::Value>(rb.GetBufferPointer());
  FUZZ_CHECK(host_accepts(w));
  check_decode(w);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  FuzzedDataProvider in(data + 1, size - 1);
  if ((data[0] & 1) == 0)
    raw_value(in);
  else
    built_values(in);
  return 0;
}

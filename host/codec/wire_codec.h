// outrun::Value <-> wire::Value for the host side.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <span>
#include <string>
#include <string_view>

#include "outrun/protocol/frame.h"
#include "outrun/protocol/outrun_generated.h"
#include "outrun/runner.h"
#include "outrun/value.h"

namespace outrun::detail {

// Largest encoded inputs of one evaluation (strings and bytes), so every frame fits.
inline constexpr std::size_t kMaxInputBytes = 8u << 20;

// What the results of one frame from a worker (the Host) or from outrund (outrun::Client) may
// decode to, counted as the budgeted decode_value counts (16 bytes per value plus its strings,
// bytes and map keys, a shared part each time it is used) plus their error messages. An honest
// sender shares nothing, so a frame (at most kMaxFrameSize) decodes to less than twice its size;
// one that shares a large string among many array items, map keys or results could otherwise
// have the receiver copy terabytes (D-result-budget).
inline constexpr std::size_t kMaxResultsDecodeBytes = std::size_t{4} * protocol::kMaxFrameSize;

using InputsOffset = flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::Input>>>;
using InputBufferOffset = flatbuffers::Offset<flatbuffers::Vector<uint8_t>>;

// Verifies and checks an InputList's bytes (protocol::check_input_list: a client's
// inputs_buffer, or what EncodedInputs::from is given): at most kMaxInputs inputs, no tag-only
// kind (UInt, Float, DateTime), nesting at most kMaxValueDepth, map keys and items of one length,
// and at most kMaxInputBytes counted as Budget does (a shared part each time it is used), in at
// most protocol::kMaxInputListBytes, 8-byte aligned in memory. Also takes what it counted from
// `*frame_budget` (outrund's per-frame decode budget; null: none), also when it refuses. False
// with *error, naming the input where it can, otherwise.
bool check_encoded_inputs(std::span<const uint8_t> bytes, std::size_t* frame_budget,
                          std::string* error);
// Why outrund refuses an evaluation once its frame's decode budget is spent.
std::string frame_budget_spent_message();

// The Inputs of a checked InputList (InProcess, which runs Values).
Inputs decode_input_list(const wire::InputList* list);

// Encodes `inputs` as an InputList FlatBuffer of its own in `fbb` (cleared first) and returns its
// bytes (valid until `fbb` changes); false with *error as encode_inputs.
bool encode_input_list(flatbuffers::FlatBufferBuilder& fbb, const Inputs& inputs,
                       std::span<const uint8_t>* out, std::string* error);

struct EncodedInputsAccess {
  static EncodedInputs make(std::span<const uint8_t> checked_bytes) {
    EncodedInputs e;
    e.assign(checked_bytes.data(), checked_bytes.size());
    return e;
  }
  static const uint8_t* data(const EncodedInputs& e) { return e.data(); }
};

inline std::span<const uint8_t> bytes_of(const EncodedInputs& e) {
  return {EncodedInputsAccess::data(e), e.bytes().size()};
}

// The InputList in checked EncodedInputs (not empty; its storage is 8-byte aligned).
inline const wire::InputList* input_list_of(const EncodedInputs& e) {
  return flatbuffers::GetRoot<wire::InputList>(EncodedInputsAccess::data(e));
}

// Encodes `inputs`. Returns false (with *error) when they are too many, too deep or too large;
// the builder then holds garbage and must be cleared.
bool encode_inputs(flatbuffers::FlatBufferBuilder& fbb, const Inputs& inputs, InputsOffset* out,
                   std::string* error);

flatbuffers::Offset<wire::Value> encode_value(flatbuffers::FlatBufferBuilder& fbb, const Value& v);

// Decodes a value received from a worker (untrusted, but already verified structurally).
// Returns false for a value no valid worker sends: unknown kind, depth > kMaxValueDepth, map
// keys and items of different lengths.
bool decode_value(const wire::Value* in, Value* out);

// The same, taking from `*budget` 16 bytes per value plus its strings, bytes and map keys,
// counted each time a shared subtree is used; false (and `*out` unspecified) once it would go
// below 0. For a client's frames (outrund): a 16 KiB frame whose values share subtrees can
// otherwise stand for millions of values.
bool decode_value(const wire::Value* in, Value* out, std::size_t* budget);

// One received result (from a worker, or from outrund), within its frame's `*budget`
// (kMaxResultsDecodeBytes, D-result-budget): `ok`, its value into *value, otherwise its error
// message into *message, the message's bytes charged too. `spent` once the budget is (also by
// an earlier result of the frame), `invalid` for a value no valid sender sends.
enum class ResultDecode : uint8_t { ok, invalid, spent };
ResultDecode decode_result(bool ok, const wire::Value* in, std::string_view error, Value* value,
                           std::string* message, std::size_t* budget);

// A received result's log lines (Result.logs, untrusted): at most
// protocol::kMaxLogLinesPerEvaluation kept (more are added to `*dropped`), each line's text copied
// when it is clean (protocol::log_text_clean) and escaped again otherwise, an unknown level read
// as info; each line's bytes (plus 16) are taken from `*budget`, and once it is spent the rest are
// dropped. `*dropped` starts as the result's logs_dropped.
void decode_logs(const flatbuffers::Vector<flatbuffers::Offset<wire::LogLine>>* in,
                 std::vector<LogLine>* out, uint32_t* dropped, std::size_t* budget);
// A result's log lines on the wire (0 when there are none).
flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::LogLine>>> encode_logs(
    flatbuffers::FlatBufferBuilder& fbb, const std::vector<LogLine>& logs);

// A client's protocol 1 `inputs` (verified structurally): at most kMaxInputs, each input's name
// (16 bytes plus its size) and value taken from `*budget` (null: none) at each use, as
// decode_value takes. False with *error: too many, a value that is not valid, or the budget
// spent (frame_budget_spent_message()).
bool decode_inputs(const flatbuffers::Vector<flatbuffers::Offset<wire::Input>>* in, Inputs* out,
                   std::size_t* budget, std::string* error);

// Tag values (DataValue.value on client frames): the same, plus the kinds UInt, Float and
// DateTime, which encode_value lowers to Lua's kinds and decode_value refuses.
flatbuffers::Offset<wire::Value> encode_tag_value(flatbuffers::FlatBufferBuilder& fbb,
                                                  const Value& v);
bool decode_tag_value(const wire::Value* in, Value* out, std::size_t* budget);

}  // namespace outrun::detail

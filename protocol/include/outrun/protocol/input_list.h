// Encoded inputs (design/protocol.md "Encoded inputs"): an InputList FlatBuffer carried whole in
// Evaluation.inputs_buffer. The frame's verifier leaves it alone (check_nested_flatbuffers off:
// FlatBuffers would verify it with fresh limits at every use, so a small frame that points at
// one nested buffer many times could stand for hours of verification). check_input_list
// verifies and checks it in one walk instead, each part paid for each time it is used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "outrun/protocol/outrun_generated.h"

namespace outrun::protocol {

// Largest inputs_buffer: one evaluation's inputs, so every frame that carries one still fits
// kMaxFrameSize beside a frame's cut (1 MiB), a source or bytecode (1 MiB each) and the rest.
inline constexpr std::size_t kMaxInputListBytes = 8u << 20;
// The limits of one evaluation's inputs, as outrun::kMaxInputs and outrun::kMaxValueDepth
// (host/codec/wire_codec.cpp checks they agree).
inline constexpr std::size_t kMaxInputCount = 4096;
inline constexpr int kMaxInputDepth = 32;

enum class InputListError : uint8_t {
  none,
  too_large,    // more than kMaxInputListBytes
  misaligned,   // its data does not start at a multiple of 8 in memory
  malformed,    // not an InputList FlatBuffer (out of bounds, a bad offset, a missing name)
  too_many,     // more than kMaxInputCount inputs
  bad_value,    // a tag-only kind (UInt, Float, DateTime) or an unknown one, nesting over
                // kMaxInputDepth, a map whose keys and items differ in number
  over_budget,  // *budget ran out
};

struct InputListVerdict {
  InputListError error = InputListError::none;
  std::string_view input;  // bad_value, over_budget: the name of the input it was in, if known
};

// Verifies `data` (size bytes) as an InputList and checks its inputs, in one walk that reads only
// what the value kinds use (a string's `items` are never looked at). It takes from `*budget` 16
// bytes per value plus its string or bytes, its map keys and every input name, counted each time
// a shared part is used (the walk's work is proportional to what it takes). Returns the list, or
// null with *verdict (the budget is then partly spent; 0 when it ran out).
const wire::InputList* check_input_list(const uint8_t* data, std::size_t size, std::size_t* budget,
                                        InputListVerdict* verdict);

}  // namespace outrun::protocol

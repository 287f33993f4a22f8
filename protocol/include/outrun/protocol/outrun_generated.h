// The wire schema's generated code (flatc makes outrun_schema.h from protocol/outrun.fbs), with
// one change to how a frame's Values are verified.
//
// FlatBuffers' generated Value::Verify checks every string of a map's `keys` and counts only the
// table. A frame may point at one Value from many places, and each use verifies its keys again:
// a 16 MiB frame of 2 million items that all point at one map of 2 million keys stands for
// 4 × 10^12 string checks (hours of a loop thread; measured: 1.6 ns each). Every use of a Value
// table as a field (Input, Result and DataValue values, and Value's own items) goes through
// Verifier::VerifyTable<Value>, which this header specializes before the generated code uses
// it: the same checks, each value and each key taken from a budget that verify_frame sets for
// the frame (ValueCheckBudget, frame.h). Every file includes the schema through this header.
#pragma once

#include <flatbuffers/flatbuffers.h>

namespace outrun::wire {
struct Value;
}  // namespace outrun::wire

namespace flatbuffers {
template <>
bool Verifier::VerifyTable<outrun::wire::Value>(const outrun::wire::Value* const table);
}  // namespace flatbuffers

#include "outrun/protocol/outrun_schema.h"

// Wire values <-> Lua, for the worker: inputs are read straight from the received frame into
// Lua, and results are built straight into the outgoing frame (no intermediate copies).
#pragma once

#include <string_view>
#include <utility>
#include <vector>

#include <flatbuffers/flatbuffers.h>

#include "outrun/protocol/outrun_generated.h"

struct lua_State;

namespace outrun::sandbox {

// PushInputsFn for a `flatbuffers::Vector<Offset<wire::Input>>*` (may be null: no inputs).
// Fills the table on the top of the stack. Runs inside a protected call.
bool push_wire_inputs(lua_State* L, const void* inputs);

// Builder (see lua_values.h) that writes a wire::Value into a FlatBufferBuilder.
class WireValueBuilder {
 public:
  using Ref = flatbuffers::Offset<wire::Value>;
  explicit WireValueBuilder(flatbuffers::FlatBufferBuilder& fbb) : f_(fbb) {}
  Ref nil();
  Ref boolean(bool b);
  Ref integer(int64_t i);
  Ref number(double d);
  Ref string(std::string_view s, bool utf8);
  Ref array(std::vector<Ref>& items);
  Ref map(std::vector<std::pair<std::string_view, Ref>>& entries);

 private:
  flatbuffers::FlatBufferBuilder& f_;
};

}  // namespace outrun::sandbox

// Wire values <-> Lua, for the worker: inputs are read straight from the received frame into
// Lua, and results are built straight into the outgoing frame (no intermediate copies).
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <string_view>
#include <utility>
#include <vector>

#include "outrun/protocol/outrun_generated.h"
#include "outrun/protocol/wire_value.h"

struct lua_State;

namespace outrun::sandbox {

// PushInputsFn for a `flatbuffers::Vector<Offset<wire::Input>>*` (may be null: no inputs).
// Fills the table on the top of the stack. Runs inside a protected call.
bool push_wire_inputs(lua_State* L, const void* inputs);

// The Builder (see lua_values.h) for results is protocol::WireValueBuilder.
using protocol::WireValueBuilder;

}  // namespace outrun::sandbox

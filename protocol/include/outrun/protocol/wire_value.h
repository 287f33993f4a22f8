// Building wire::Value tables. Used by the worker (results, straight from Lua) and the host
// (inputs, from outrun::Value): one encoding, one place.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "outrun/protocol/outrun_generated.h"

namespace outrun::protocol {

// Children first, then the container (FlatBuffers builds bottom-up). Every method finishes one
// complete table, so calls can be freely interleaved with other tables being built.
class WireValueBuilder {
 public:
  using Ref = flatbuffers::Offset<wire::Value>;
  explicit WireValueBuilder(flatbuffers::FlatBufferBuilder& fbb) : f_(fbb) {}
  Ref nil();
  Ref boolean(bool b);
  Ref integer(int64_t i);
  Ref number(double d);
  Ref string(std::string_view s, bool utf8);  // utf8 false: Bytes
  Ref array(const std::vector<Ref>& items);
  // Keys must be unique; they are written in the order given.
  Ref map(const std::vector<std::pair<std::string_view, Ref>>& entries);

 private:
  flatbuffers::FlatBufferBuilder& f_;
};

}  // namespace outrun::protocol

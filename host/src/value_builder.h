// The result Builder (see worker/lua_values.h) that makes outrun::Value: used by InProcess and
// by tests that convert results straight from a lua_State.
#pragma once

#include <string_view>
#include <utility>
#include <vector>

#include "outrun/value.h"

namespace outrun::detail {

struct ValueBuilder {
  using Ref = Value;
  Ref nil() { return Value(); }
  Ref boolean(bool b) { return Value(b); }
  Ref integer(int64_t i) { return Value(i); }
  Ref number(double d) { return Value(d); }
  Ref string(std::string_view s, bool utf8) {
    return utf8 ? Value(std::string(s)) : Value(Bytes{std::string(s)});
  }
  Ref array(std::vector<Ref>& items) {
    return Value(
        Array(std::make_move_iterator(items.begin()), std::make_move_iterator(items.end())));
  }
  Ref map(std::vector<std::pair<std::string_view, Ref>>& entries) {
    Map m;
    m.reserve(entries.size());
    for (auto& [k, v] : entries) m.push_back(MapEntry{std::string(k), std::move(v)});
    return Value(std::move(m));
  }
};

}  // namespace outrun::detail

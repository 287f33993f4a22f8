// Converting a script's result (a Lua value) into outrun values, with raw access only: no
// metamethod of the value runs, so a script cannot run code during the conversion. Tables become
// arrays (keys exactly 1..n) or maps (string keys only, sorted by key so every runner returns
// the same order); depth, cycles, element count and bytes are bounded.
//
// Runs outside any protected call: it uses only Lua API functions that cannot raise
// (lua_next, lua_rawgeti, lua_type, lua_to*, lua_checkstack on non-string values).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <lua.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace outrun::sandbox {

inline constexpr int kMaxResultDepth = 32;  // == outrun::kMaxValueDepth
// Bytes of strings and keys plus kValueWireOverhead per value and per key: an upper bound of the
// result's encoded size, so that it fits a frame (kMaxFrameSize 16 MiB) beside the worker's
// pending results (up to kFlushBytes 4 MiB).
inline constexpr std::size_t kMaxResultBytes = 8u << 20;
// With kValueWireOverhead per value, the byte budget allows at most 8 MiB / 32 = 262,144 values.
inline constexpr std::size_t kMaxResultElements = 1u << 18;
// Encoded bytes of one value or key besides its string bytes, rounded up: a wire::Value table
// and its offset in the parent vector, a string's length prefix, NUL and padding (at most 28).
inline constexpr std::size_t kValueWireOverhead = 32;

bool is_valid_utf8(const char* s, std::size_t n);

// Builder concept:
//   using Ref = ...;
//   Ref nil(); Ref boolean(bool); Ref integer(int64_t); Ref number(double);
//   Ref string(std::string_view, bool utf8);      // utf8 false: bytes
//   Ref array(std::vector<Ref>& items);
//   Ref map(std::vector<std::pair<std::string_view, Ref>>& entries_sorted_by_key);
template <class Builder>
class ResultConverter {
 public:
  using Ref = typename Builder::Ref;
  ResultConverter(lua_State* L, Builder& b) : L_(L), b_(b) {}

  // Converts the value at absolute stack index `idx`. On failure returns false and error().
  bool convert(int idx, Ref* out) { return value(idx, 0, out); }
  const std::string& error() const { return error_; }

 private:
  bool fail(std::string msg) {
    if (error_.empty()) error_ = std::move(msg);
    return false;
  }

  bool value(int idx, int depth, Ref* out) {
    switch (lua_type(L_, idx)) {
      case LUA_TNIL:
        if (!charge(0)) return false;
        *out = b_.nil();
        return true;
      case LUA_TBOOLEAN:
        if (!charge(0)) return false;
        *out = b_.boolean(lua_toboolean(L_, idx) != 0);
        return true;
      case LUA_TNUMBER:
        if (!charge(0)) return false;
        if (lua_isinteger(L_, idx))
          *out = b_.integer(static_cast<int64_t>(lua_tointeger(L_, idx)));
        else
          *out = b_.number(static_cast<double>(lua_tonumber(L_, idx)));
        return true;
      case LUA_TSTRING: {
        std::size_t n = 0;
        const char* s = lua_tolstring(L_, idx, &n);
        if (!charge(n)) return false;
        *out = b_.string(std::string_view(s, n), is_valid_utf8(s, n));
        return true;
      }
      case LUA_TTABLE:
        return table(idx, depth, out);
      default:
        return fail(std::string("cannot return a ") + lua_typename(L_, lua_type(L_, idx)) +
                    " value (results are nil, booleans, numbers, strings and tables of them)");
    }
  }

  bool charge(std::size_t bytes) {
    bytes_ += bytes + kValueWireOverhead;
    if (++elements_ > kMaxResultElements || bytes_ > kMaxResultBytes)
      return fail("result is too large (more than " + std::to_string(kMaxResultElements) +
                  " values or " + std::to_string(kMaxResultBytes) + " bytes encoded)");
    return true;
  }

  bool table(int idx, int depth, Ref* out) {
    if (depth >= kMaxResultDepth)
      return fail("result is nested deeper than " + std::to_string(kMaxResultDepth) + " levels");
    const void* self = lua_topointer(L_, idx);
    for (int i = 0; i < depth; ++i)
      if (path_[i] == self) return fail("cannot return a cyclic table");
    path_[depth] = self;
    if (!lua_checkstack(L_, 4)) return fail("result is too large for the Lua stack");
    if (!charge(0)) return false;

    // Classify with raw iteration: keys exactly 1..n -> array; all strings -> map.
    std::size_t count = 0, string_keys = 0;
    lua_Integer max_int = 0;
    bool other_keys = false;
    lua_pushnil(L_);
    while (lua_next(L_, idx) != 0) {
      ++count;
      if (lua_type(L_, -2) == LUA_TSTRING) {
        ++string_keys;
      } else if (lua_isinteger(L_, -2) && lua_tointeger(L_, -2) >= 1) {
        max_int = std::max(max_int, lua_tointeger(L_, -2));
      } else {
        other_keys = true;
      }
      lua_pop(L_, 1);
    }
    const int top = lua_gettop(L_);
    if (!other_keys && string_keys == 0 && static_cast<std::size_t>(max_int) == count &&
        count > 0) {
      std::vector<Ref> items;
      items.reserve(count);
      for (lua_Integer i = 1; i <= max_int; ++i) {
        lua_rawgeti(L_, idx, i);
        Ref r{};
        const bool ok = value(top + 1, depth + 1, &r);
        lua_settop(L_, top);
        if (!ok) return false;
        items.push_back(std::move(r));
      }
      *out = b_.array(items);
      return true;
    }
    if (other_keys || string_keys != count)
      return fail(
          "cannot return a table with mixed or non-string keys (use an array 1..n or string keys)");
    std::vector<std::pair<std::string_view, Ref>> entries;
    entries.reserve(count);
    lua_pushnil(L_);
    while (lua_next(L_, idx) != 0) {
      std::size_t n = 0;
      const char* k = lua_tolstring(L_, -2, &n);  // a string key: no conversion, no allocation
      Ref r{};
      if (!charge(n) || !value(top + 2, depth + 1, &r)) {
        lua_settop(L_, top);
        return false;
      }
      entries.emplace_back(std::string_view(k, n), std::move(r));
      lua_settop(L_, top + 1);  // keep the key for lua_next
    }
    std::sort(entries.begin(), entries.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    *out = b_.map(entries);
    return true;
  }

  lua_State* L_;
  Builder& b_;
  const void* path_[kMaxResultDepth] = {};
  std::size_t bytes_ = 0;
  std::size_t elements_ = 0;
  std::string error_;
};

}  // namespace outrun::sandbox

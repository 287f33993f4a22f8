#include "wire_values.h"

#include <lua.hpp>

#include "lua_values.h"

namespace outrun::sandbox {

namespace {

// Pushes one wire value. Follows the longjmp rule: only trivially destructible locals.
bool push_value(lua_State* L, const wire::Value* v, int depth) {
  luaL_checkstack(L, 3, "inputs nested too deeply");
  if (v == nullptr) {
    lua_pushnil(L);
    return true;
  }
  switch (v->kind()) {
    // Tag-value kinds: the host lowers them to Lua's kinds before a frame reaches a worker.
    case wire::ValueKind::UInt:
    case wire::ValueKind::Float:
    case wire::ValueKind::DateTime:
      return false;
    case wire::ValueKind::Nil:
      lua_pushnil(L);
      return true;
    case wire::ValueKind::Boolean:
      lua_pushboolean(L, v->bool_value());
      return true;
    case wire::ValueKind::Int:
      lua_pushinteger(L, v->int_value());
      return true;
    case wire::ValueKind::Double:
      lua_pushnumber(L, v->double_value());
      return true;
    case wire::ValueKind::String: {
      const auto* s = v->string_value();
      if (s)
        lua_pushlstring(L, s->c_str(), s->size());
      else
        lua_pushliteral(L, "");
      return true;
    }
    case wire::ValueKind::Bytes: {
      const auto* b = v->bytes_value();
      if (b)
        lua_pushlstring(L, reinterpret_cast<const char*>(b->data()), b->size());
      else
        lua_pushliteral(L, "");
      return true;
    }
    case wire::ValueKind::Array: {
      if (depth >= kMaxResultDepth) return false;
      const auto* items = v->items();
      const int n = items ? static_cast<int>(items->size()) : 0;
      lua_createtable(L, n, 0);
      for (int i = 0; i < n; ++i) {
        if (!push_value(L, items->Get(static_cast<flatbuffers::uoffset_t>(i)), depth + 1))
          return false;
        lua_rawseti(L, -2, i + 1);
      }
      return true;
    }
    case wire::ValueKind::Map: {
      if (depth >= kMaxResultDepth) return false;
      const auto* keys = v->keys();
      const auto* items = v->items();
      const flatbuffers::uoffset_t n = keys ? keys->size() : 0;
      if ((items ? items->size() : 0) != n) return false;
      lua_createtable(L, 0, static_cast<int>(n));
      for (flatbuffers::uoffset_t i = 0; i < n; ++i) {
        const auto* k = keys->Get(i);
        lua_pushlstring(L, k->c_str(), k->size());
        if (!push_value(L, items->Get(i), depth + 1)) return false;
        lua_rawset(L, -3);
      }
      return true;
    }
  }
  return false;  // unknown kind from a newer peer
}

}  // namespace

bool push_wire_inputs(lua_State* L, const void* p) {
  const auto* inputs = static_cast<const flatbuffers::Vector<flatbuffers::Offset<wire::Input>>*>(p);
  if (!inputs) return true;
  for (const wire::Input* in : *inputs) {
    lua_pushlstring(L, in->name()->c_str(), in->name()->size());
    if (!push_value(L, in->value(), 0)) return false;
    lua_rawset(L, -3);
  }
  return true;
}

}  // namespace outrun::sandbox

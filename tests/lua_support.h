// Lua helpers shared by the sandbox tests.
#pragma once

#include <doctest/doctest.h>

#include <lua.hpp>
#include <string>

namespace outrun::test {

// A real Lua 5.4 binary chunk (`return 42`), made with lua_dump on a plain, unsandboxed state:
// what the sandbox must refuse by every route.
inline std::string binary_chunk() {
  lua_State* L = luaL_newstate();
  REQUIRE(L != nullptr);
  REQUIRE(luaL_loadstring(L, "return 42") == LUA_OK);
  std::string out;
  lua_dump(
      L,
      [](lua_State*, const void* p, size_t n, void* ud) {
        static_cast<std::string*>(ud)->append(static_cast<const char*>(p), n);
        return 0;
      },
      &out, 0);
  lua_close(L);
  REQUIRE(out.size() > 4);
  REQUIRE(out.substr(0, 4) == "\x1bLua");
  return out;
}

}  // namespace outrun::test

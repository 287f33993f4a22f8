#include "sandbox.h"

#include <mimalloc.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <ctime>
#include <iterator>
#include <lua.hpp>
#include <new>

#include "lua_values.h"
#include "outrun/protocol/script_log.h"
#include "status_codes.h"

namespace outrun::sandbox {

ScriptLog::ScriptLog() : lines(protocol::kMaxLogLinesPerEvaluation) {
  for (Line& l : lines) l.text.reserve(protocol::kMaxLogLineBytes);
}

void ScriptLog::reset(std::size_t max) {
  count = 0;
  bytes = 0;
  dropped = 0;
  max_lines = std::min(max, lines.size());
}

int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

namespace {

// Marks the metatables of read-only library proxies (a light userdata key no script can forge).
const char kReadOnlyKey = 0;

void* counting_alloc(void* ud, void* ptr, size_t osize, size_t nsize) {
  auto* acc = static_cast<MemoryAccount*>(ud);
  ScriptBudget* budget = acc->budget;
  const size_t old = ptr ? osize : 0;  // when ptr is NULL, osize is a type tag
  if (nsize == 0) {
    if (ptr) {
      acc->used -= old;
      if (budget) budget->used -= old;
      mi_free(ptr);
    }
    return nullptr;
  }
  if (nsize > old) {
    ++acc->allocations;
    if (acc->fail_at != 0 && acc->allocations == acc->fail_at) return nullptr;
    if (acc->used - old + nsize > acc->limit) return nullptr;
    // The worker's budget: other states' idle bytes give way first (reclaim closes them; their
    // frees come back through this function, with their own accounts).
    if (budget && budget->used + (nsize - old) > budget->limit &&
        !(budget->reclaim && budget->reclaim(budget->reclaim_ctx, acc, nsize - old))) {
      acc->budget_refused = true;
      return nullptr;
    }
  }
  void* p = ptr ? mi_realloc(ptr, nsize) : mi_malloc(nsize);
  if (!p) {
    acc->system_refused = true;  // the process is out of memory (its backstop), not the script
    return nullptr;
  }
  acc->used = acc->used - old + nsize;
  if (budget) budget->used = budget->used - old + nsize;
  if (acc->used > acc->peak) acc->peak = acc->used;
  return p;
}

// The soft timeout. Runs every kHookInterval instructions of any coroutine of the state (Lua
// copies the hook into new threads). Once the deadline has passed it raises an error on every
// instruction, so pcall/xpcall, error handlers, __close handlers and coroutines cannot swallow
// it: whatever catches the error runs at most one more instruction before the next one.
void count_hook(lua_State* L, lua_Debug*) {
  auto* ctx = *static_cast<RunContext**>(lua_getextraspace(L));
  if (!ctx->timed_out) {
    if (monotonic_ns() < ctx->deadline_ns) {
      // A coroutine left at interval 1 by an earlier timeout goes back to normal.
      if (lua_gethookcount(L) != kHookInterval)
        lua_sethook(L, count_hook, LUA_MASKCOUNT, kHookInterval);
      return;
    }
    ctx->timed_out = true;
  }
  lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
  luaL_error(L, "timeout");
}

// print(...) and log.<level>(...): the arguments as tostring shows them, joined by spaces (not
// print's tab: it would be escaped), escaped
// and cut at kMaxLogLineBytes, recorded in the run's ScriptLog (design/sandbox.md "Script
// logs"). Past the run's caps a call only counts itself (cheap: a script that logs in a loop
// costs its own time). No C++ object with a destructor lives across the Lua calls here
// (luaL_tolstring may raise through a __tostring): the line's storage is the log's, reserved.
int record_log(lua_State* L, uint8_t level) {
  auto* ctx = *static_cast<RunContext**>(lua_getextraspace(L));
  ScriptLog* log = ctx->log;
  if (!log) return 0;
  if (log->count >= log->max_lines || log->bytes >= protocol::kMaxLogBytesPerEvaluation) {
    if (log->dropped != UINT32_MAX) ++log->dropped;
    return 0;
  }
  ScriptLog::Line& line = log->lines[log->count];
  line.level = level;
  line.text.clear();
  const std::size_t room =
      std::min(protocol::kMaxLogLineBytes, protocol::kMaxLogBytesPerEvaluation - log->bytes);
  const int n = lua_gettop(L);
  for (int i = 1; i <= n; ++i) {
    std::size_t len = 0;
    const char* s = luaL_tolstring(L, i, &len);
    const bool fit = (i == 1 || protocol::append_log_text(&line.text, " ", room)) &&
                     protocol::append_log_text(&line.text, std::string_view(s, len), room);
    lua_pop(L, 1);
    if (!fit) break;
  }
  log->bytes += line.text.size();
  ++log->count;
  return 0;
}

int script_print(lua_State* L) {
  return record_log(L, static_cast<uint8_t>(wire::LogLevel::Info));
}

int script_log(lua_State* L) {
  return record_log(L, static_cast<uint8_t>(lua_tointeger(L, lua_upvalueindex(1))));
}

// xpcall's message handler runs while the error is being raised. When that error is the
// timeout, it is raised inside count_hook, where Lua has hooks switched off: a handler that
// loops would never be interrupted. Every handler is therefore called through this guard, which
// skips it once the deadline has passed and passes the error object through unchanged.
int guarded_handler(lua_State* L) {
  auto* ctx = *static_cast<RunContext**>(lua_getextraspace(L));
  if (ctx->timed_out) return 1;
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

int finish_xpcall(lua_State* L, int status, lua_KContext extra) {
  if (status != LUA_OK && status != LUA_YIELD) {
    lua_pushboolean(L, 0);
    lua_pushvalue(L, -2);
    return 2;
  }
  return lua_gettop(L) - static_cast<int>(extra);
}

// luaB_xpcall with the handler wrapped in guarded_handler (and yieldable like the original).
int safe_xpcall(lua_State* L) {
  const int n = lua_gettop(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_pushvalue(L, 2);
  lua_pushcclosure(L, guarded_handler, 1);
  lua_replace(L, 2);
  lua_pushboolean(L, 1);  // first result
  lua_pushvalue(L, 1);    // function
  lua_rotate(L, 3, 2);    // both below the function's arguments
  const int status = lua_pcallk(L, n - 2, LUA_MULTRET, 2, 2, finish_xpcall);
  return finish_xpcall(L, status, 2);
}

// load(chunk [, name [, mode [, env]]]) with mode forced to "t": binary chunks can crash the VM.
int safe_load(lua_State* L) {
  // The original's argument errors, raised below where it is called from C, would name neither
  // the script's line nor 'load' ("bad argument #1 to '?'"): check its arguments here.
  if (!lua_isstring(L, 1)) luaL_checktype(L, 1, LUA_TFUNCTION);
  luaL_optstring(L, 2, nullptr);
  const int n = lua_gettop(L);
  lua_settop(L, 4);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 2);
  lua_pushliteral(L, "t");
  int nargs = 3;
  if (n >= 4) {  // an explicit env (even nil) differs from none
    lua_pushvalue(L, 4);
    nargs = 4;
  }
  lua_call(L, nargs, LUA_MULTRET);
  return lua_gettop(L) - 4;
}

// setmetatable without finalizers: __gc handlers run with hooks off, so the soft timeout could
// not stop them. Any non-nil __gc is refused (a placeholder would arm finalization for later).
int safe_setmetatable(lua_State* L) {
  // Every check of the original is made here, where an error names the script's line and
  // 'setmetatable'; the original, called from C below, would name neither ("cannot change a
  // protected metatable" without a line, "bad argument #1 to '?'").
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_argexpected(L, lua_type(L, 2) == LUA_TNIL || lua_type(L, 2) == LUA_TTABLE, 2,
                   "nil or table");
  if (luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL)
    return luaL_error(L, "cannot change a protected metatable");
  if (lua_type(L, 2) == LUA_TTABLE) {
    lua_pushliteral(L, "__gc");
    if (lua_rawget(L, 2) != LUA_TNIL)
      return luaL_error(L, "setmetatable: __gc metamethods are not allowed");
    lua_pop(L, 1);
  }
  lua_settop(L, 2);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, 2, 1);
  return 1;
}

bool is_read_only(lua_State* L, int idx) {
  if (!lua_getmetatable(L, idx)) return false;
  const bool ro = lua_rawgetp(L, -1, &kReadOnlyKey) != LUA_TNIL;
  lua_pop(L, 2);
  return ro;
}

// rawset that refuses library proxies (rawset would otherwise bypass their __newindex).
int safe_rawset(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  if (is_read_only(L, 1)) return luaL_error(L, "rawset: library tables are read-only");
  lua_settop(L, 3);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, 3, 1);
  return 1;
}

int read_only_newindex(lua_State* L) {
  return luaL_error(L, "library tables are read-only");
}

int safe_collectgarbage(lua_State* L) {
  const char* opt = luaL_optstring(L, 1, "collect");
  if (std::strcmp(opt, "count") != 0)
    return luaL_error(L, "collectgarbage: only \"count\" is allowed");
  lua_pushnumber(L, lua_gc(L, LUA_GCCOUNT, 0) + lua_gc(L, LUA_GCCOUNTB, 0) / 1024.0);
  return 1;
}

// A library proxy's metatable: reads go to the library (`__index`), writes raise, and the
// metatable is hidden (`__metatable`), so the library cannot be reached or changed through it.
// Leaves the metatable on the stack; its `__index` is set by the caller.
void push_read_only_metatable(lua_State* L, int more_fields = 0) {
  lua_createtable(L, 0, 4 + more_fields);
  lua_pushcfunction(L, read_only_newindex);
  lua_setfield(L, -2, "__newindex");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_pushboolean(L, 1);
  lua_rawsetp(L, -2, &kReadOnlyKey);
}

// Replaces global `name` (a library table) by a read-only proxy.
void make_read_only(lua_State* L, const char* name) {
  lua_newtable(L);  // proxy
  push_read_only_metatable(L);
  lua_getglobal(L, name);
  lua_setfield(L, -2, "__index");
  lua_setmetatable(L, -2);
  lua_setglobal(L, name);
}

// Lua 5.4.4 bug 5.4.4-9 (lua.org/bugs.html, "C-stack overflow with deep nesting of
// coroutine.close"): lua_resetthread runs the coroutine's __close handlers without counting the
// call against LUAI_MAXCCALLS, so a chain of coroutines whose __close closes the previous one
// (~12,000 deep) overflows the C stack: a segfault of the worker, or of the application in
// InProcess. Fixed upstream in 5.4.6 (lua_closethread); Debian 12 ships 5.4.4 unpatched.
// coroutine.close is therefore this copy of luaB_close, which bounds the nesting (a counter in
// the state's RunContext, shared by all its coroutines through the extra space). Every check
// that can raise is made before the counter moves, and lua_resetthread itself never raises
// (it runs the handlers in protected mode), so no error can skip the decrement.
constexpr int kMaxCloseDepth = 100;
constexpr uintptr_t kMaxCloseStack = 1u << 20;

int safe_coroutine_close(lua_State* L) {
  lua_State* co = lua_tothread(L, 1);
  if (!co)  // named as luaB_close names it (luaL_argexpected would say '?': we are not in _G)
    return luaL_error(L, "bad argument #1 to 'close' (coroutine expected, got %s)",
                      luaL_typename(L, 1));
  const char* busy = nullptr;  // the states luaB_close refuses, named as it names them
  lua_Debug ar;
  if (co == L)
    busy = "running";
  else if (lua_status(co) == LUA_OK && lua_getstack(co, 0, &ar))
    busy = "normal";
  if (busy) return luaL_error(L, "cannot close a %s coroutine", busy);
  auto* ctx = *static_cast<RunContext**>(lua_getextraspace(L));
  const auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  if (ctx->close_depth >= kMaxCloseDepth ||
      (ctx->stack_base != 0 && here < ctx->stack_base && ctx->stack_base - here > kMaxCloseStack))
    return luaL_error(L,
                      "coroutine.close: too deeply nested (more than %d closes inside __close "
                      "handlers, or too much C stack)",
                      kMaxCloseDepth);
  ++ctx->close_depth;
  const int status = lua_resetthread(co);
  --ctx->close_depth;
  if (status == LUA_OK) {
    lua_pushboolean(L, 1);
    return 1;
  }
  lua_pushboolean(L, 0);
  lua_xmove(co, L, 1);  // the error object
  return 2;
}

// coroutine, with close replaced by safe_coroutine_close.
int open_coroutine(lua_State* L) {
  luaopen_coroutine(L);
  lua_pushcfunction(L, safe_coroutine_close);
  lua_setfield(L, -2, "close");
  return 1;
}

// os: only the harmless clocks.
int open_os_clocks(lua_State* L) {
  luaopen_os(L);
  lua_createtable(L, 0, 3);
  for (const char* fn : {"clock", "time", "difftime"}) {
    lua_getfield(L, -2, fn);
    lua_setfield(L, -2, fn);
  }
  return 1;
}

// `StatusCode`, the OPC UA StatusCodes by name (StatusCode.BadTimeout == 0x800A0000), for the
// tags prelude (host/tags/prelude.h): every name of the generated table (status_codes.h, 271),
// without building that table in each state. The prelude calls new_status_code_table once per
// state; the table it returns starts empty and its hidden metatable's `__index` looks a missing
// name up (a binary search) and keeps what it found in the table, so a state holds only the names
// its script used and every later read of one is a plain table hit, as when the prelude built the
// whole table. A name not there is nil and is not kept (scripts may test `StatusCode.X == nil`).
// The table is the script's own, like its other globals: writing it changes only that script.
int status_code_index(lua_State* L) {
  if (lua_type(L, 2) != LUA_TSTRING) return 0;
  size_t n = 0;
  const char* name = lua_tolstring(L, 2, &n);
  const status_codes::Entry* e = status_codes::find(std::string_view(name, n));
  if (e == nullptr) return 0;
  lua_pushinteger(L, static_cast<lua_Integer>(e->code));
  lua_pushvalue(L, 2);
  lua_pushvalue(L, -2);
  lua_rawset(L, 1);
  return 1;
}

int new_status_code_table(lua_State* L) {
  lua_createtable(L, 0, 0);
  lua_createtable(L, 0, 2);
  lua_pushcfunction(L, status_code_index);
  lua_setfield(L, -2, "__index");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
  return 1;
}

// Where the prelude finds new_status_code_table: a key of the string library that no script
// names by accident, reached as ("")["\0StatusCode"] through the strings' own metatable, which no
// script can change. Not a global: a new global would cost every state of every script (the
// globals table is sized to the name), while this slot is one of the string table's spare ones.
constexpr std::string_view kStatusCodeKey("\0StatusCode", 11);

// Libraries most scripts never touch are opened on first use: a new script state costs about
// half as much time and memory (a warm restart creates one per script). Until then every lazy
// proxy has the same read-only metatable, made once per state, whose `__index` is this function
// and which maps each proxy to its library (proxy -> index into kLazyLibs, keys no script can
// reach: the metatable is hidden). On first use it opens the library and gives the proxy a
// read-only metatable of its own whose `__index` is the library table, so later reads go straight
// to it. A script cannot tell the difference: proxies are opaque either way. One shared metatable
// instead of one per library took ~10k instructions off every new state (a fifth of setup_sandbox,
// design/decisions.md "D-lean-state").
// Upvalue: [1] the shared metatable.
struct LazyLib {
  const char* name;
  lua_CFunction open;
};
constexpr LazyLib kLazyLibs[] = {{LUA_COLIBNAME, open_coroutine},
                                 {LUA_TABLIBNAME, luaopen_table},
                                 {LUA_MATHLIBNAME, luaopen_math},
                                 {LUA_UTF8LIBNAME, luaopen_utf8},
                                 {LUA_OSLIBNAME, open_os_clocks}};
constexpr int kLazyLibCount = static_cast<int>(std::size(kLazyLibs));

int open_on_first_use(lua_State* L) {
  lua_pushvalue(L, 1);
  const lua_Integer i =
      lua_rawget(L, lua_upvalueindex(1)) == LUA_TNUMBER ? lua_tointeger(L, -1) : 0;
  lua_pop(L, 1);
  if (i < 1 || i > kLazyLibCount) return 0;  // not a proxy of this state: nothing there
  lua_pushcfunction(L, kLazyLibs[i - 1].open);
  lua_call(L, 0, 1);  // the library table
  push_read_only_metatable(L);
  lua_pushvalue(L, -2);
  lua_setfield(L, -2, "__index");  // later reads go straight to the table
  lua_setmetatable(L, 1);          // from C: __metatable does not stop it
  lua_pushvalue(L, 2);
  lua_rawget(L, -2);
  return 1;
}

// The five lazy proxies, as globals, sharing one metatable.
void make_lazy_libs(lua_State* L) {
  push_read_only_metatable(L, kLazyLibCount);
  lua_pushvalue(L, -1);
  lua_pushcclosure(L, open_on_first_use, 1);
  lua_setfield(L, -2, "__index");
  for (int i = 0; i < kLazyLibCount; ++i) {
    lua_newtable(L);  // proxy
    lua_pushvalue(L, -1);
    lua_pushinteger(L, i + 1);
    lua_rawset(L, -4);  // metatable[proxy] = i + 1
    lua_pushvalue(L, -2);
    lua_setmetatable(L, -2);
    lua_setglobal(L, kLazyLibs[i].name);
  }
  lua_pop(L, 1);
}

void wrap_global(lua_State* L, const char* name, lua_CFunction fn) {
  lua_getglobal(L, name);
  lua_pushcclosure(L, fn, 1);
  lua_setglobal(L, name);
}

// Builds the sandbox's globals. Runs inside lua_pcall (allocation may fail).
int setup_sandbox(lua_State* L) {
  // Base and string now (string methods go through the string metatable, which needs the
  // library); the others on first use (make_lazy).
  // The globals table, sized once for what the sandbox puts there (32 names) plus `inputs`:
  // filling lua_newstate's empty one rehashed it five times (a new state costs ~15 % less).
  lua_createtable(L, 0, 33);
  lua_rawseti(L, LUA_REGISTRYINDEX, LUA_RIDX_GLOBALS);
  // Opened directly rather than with luaL_requiref: no loaded-modules table is made, so none can
  // hand out the real libraries (scripts have no `require` anyway).
  lua_pushcfunction(L, luaopen_base);
  lua_call(L, 0, 0);
  lua_pushcfunction(L, luaopen_string);
  lua_call(L, 0, 1);
  lua_setglobal(L, LUA_STRLIBNAME);

  // The two file loaders base opens. (`require` and `module` are not there to remove: clearing
  // them made two strings for nothing, ~1k instructions a state.)
  for (const char* name : {"dofile", "loadfile"}) {
    lua_pushnil(L);
    lua_setglobal(L, name);
  }
  lua_pushcfunction(L, script_print);
  lua_setglobal(L, "print");
  // log.debug/info/warn/error: read-only like string (make_read_only below).
  lua_createtable(L, 0, 4);
  static constexpr std::pair<const char*, wire::LogLevel> kLevels[] = {
      {"debug", wire::LogLevel::Debug},
      {"info", wire::LogLevel::Info},
      {"warn", wire::LogLevel::Warn},
      {"error", wire::LogLevel::Error}};
  for (const auto& [name, level] : kLevels) {
    lua_pushinteger(L, static_cast<lua_Integer>(level));
    lua_pushcclosure(L, script_log, 1);
    lua_setfield(L, -2, name);
  }
  lua_setglobal(L, "log");
  lua_pushcfunction(L, safe_collectgarbage);
  lua_setglobal(L, "collectgarbage");
  lua_pushcfunction(L, safe_xpcall);
  lua_setglobal(L, "xpcall");
  wrap_global(L, "load", safe_load);
  wrap_global(L, "setmetatable", safe_setmetatable);
  wrap_global(L, "rawset", safe_rawset);

  lua_getglobal(L, LUA_STRLIBNAME);
  lua_pushnil(L);
  lua_setfield(L, -2, "dump");
  lua_pushlstring(L, kStatusCodeKey.data(), kStatusCodeKey.size());
  lua_pushcfunction(L, new_status_code_table);
  lua_rawset(L, -3);
  lua_pop(L, 1);
  // The string metatable: hidden from getmetatable, so `("").__index` tricks cannot reach it.
  lua_pushliteral(L, "");
  lua_getmetatable(L, -1);
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 2);

  make_read_only(L, LUA_STRLIBNAME);
  make_read_only(L, "log");
  make_lazy_libs(L);
  return 0;
}

struct CompileArgs {
  const char* source;
  size_t size;
  const char* chunk_name;
  const char* mode;  // "t": source text; "b": bytecode this process dumped (load_chunk)
};

int compile_trampoline(lua_State* L) {
  const auto* a = static_cast<const CompileArgs*>(lua_touserdata(L, 1));
  const int status = luaL_loadbufferx(L, a->source, a->size, a->chunk_name, a->mode);
  if (status != LUA_OK) return lua_error(L);  // keeps the status kind (syntax vs memory)
  return 1;
}

struct RunArgs {
  PushInputsFn push;
  const void* inputs;
  bool inputs_ok;
};

// Stack: [1] RunArgs*, [2] the compiled chunk.
int run_trampoline(lua_State* L) {
  auto* a = static_cast<RunArgs*>(lua_touserdata(L, 1));
  lua_createtable(L, 0, 4);
  if (!a->push(L, a->inputs)) {
    a->inputs_ok = false;
    return 0;
  }
  lua_setglobal(L, "inputs");
  lua_pushvalue(L, 2);
  lua_call(L, 0, 1);
  return 1;
}

// Longest error message passed on. A script can raise a string as large as its memory limit
// allows (`error(string.rep("x", 20 * 2^20))`); uncut, such a message made the worker write a
// frame past kMaxFrameSize, and the host killed it as a protocol violation (found by the sandbox
// corpus, tests/host/sandbox_corpus_test.cpp). Messages are for people: the start, which has the
// script's name and line, is kept.
constexpr size_t kMaxErrorMessageBytes = 64u << 10;

// A message for the error object at `idx`, without running any metamethod of it.
std::string error_message(lua_State* L, int idx) {
  switch (lua_type(L, idx)) {
    case LUA_TSTRING: {
      size_t n = 0;
      const char* s = lua_tolstring(L, idx, &n);
      if (n <= kMaxErrorMessageBytes) return std::string(s, n);
      size_t keep = kMaxErrorMessageBytes;
      while (keep > 0 && (static_cast<unsigned char>(s[keep]) & 0xC0) == 0x80)
        --keep;  // whole UTF-8 characters
      return std::string(s, keep) + "... (error message cut, " + std::to_string(n) +
             " bytes in all)";
    }
    case LUA_TNUMBER: {
      char buf[64];
      if (lua_isinteger(L, idx))
        snprintf(buf, sizeof buf, "%lld", static_cast<long long>(lua_tointeger(L, idx)));
      else
        snprintf(buf, sizeof buf, "%.14g", lua_tonumber(L, idx));
      return buf;
    }
    default:
      return std::string("(error object is a ") + lua_typename(L, lua_type(L, idx)) + " value)";
  }
}

// 1.5 GiB, 64 MiB, 300 KiB, 12 bytes: budgets and limits are usually round numbers of these.
std::string human_bytes(std::size_t n) {
  constexpr const char* kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double v = static_cast<double>(n);
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  char buf[32];
  if (unit == 0 || v == static_cast<double>(static_cast<uint64_t>(v)))
    snprintf(buf, sizeof buf, "%llu %s", static_cast<unsigned long long>(v), kUnits[unit]);
  else
    snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[unit]);
  return buf;
}

std::string memory_message(const MemoryAccount& acc) {
  if (acc.budget_refused)
    return "the worker's script memory budget (" + human_bytes(acc.budget->limit) +
           ") is full: the script held " + std::to_string(acc.used) +
           " bytes and no idle script state was left to drop (its own limit is " +
           std::to_string(acc.limit) + " bytes)";
  if (acc.system_refused)
    return "the worker is out of memory (its process-wide backstop refused an allocation of the "
           "script, "
           "which held " +
           std::to_string(acc.used) + " bytes of its " + std::to_string(acc.limit) + " byte limit)";
  return "script exceeded its memory limit of " + std::to_string(acc.limit) + " bytes";
}

}  // namespace

std::unique_ptr<ScriptState> ScriptState::create(std::size_t memory_limit, std::string* error,
                                                 ScriptBudget* budget) {
  std::unique_ptr<ScriptState> s(new ScriptState());
  s->account_ = std::make_unique<MemoryAccount>();
  s->account_->limit = memory_limit;
  s->account_->budget = budget;
  s->ctx_ = std::make_unique<RunContext>();
  s->L_ = lua_newstate(counting_alloc, s->account_.get());
  if (!s->L_) {
    *error = memory_message(*s->account_);
    return nullptr;
  }
  *static_cast<RunContext**>(lua_getextraspace(s->L_)) = s->ctx_.get();
  // No collection while the sandbox is built: everything it makes stays alive, so incremental
  // steps would only mark it (~2k instructions of a state's ~80k).
  lua_gc(s->L_, LUA_GCSTOP);
  lua_pushcfunction(s->L_, setup_sandbox);
  if (lua_pcall(s->L_, 0, 0, 0) != LUA_OK) {
    *error = memory_message(*s->account_);
    return nullptr;  // the destructor closes the state
  }
  lua_gc(s->L_, LUA_GCRESTART);
  // The state starts as though a collection had just ended: the first one starts once it has
  // allocated as much again as it holds (LUA_GCPAUSE's 200 %). RESTART leaves the collector's
  // debt at 0, so the first allocation after it (the chunk's load, the inputs table) began a
  // cycle that marked the whole bare state: ~9k instructions of a miss's ~122k, for a state that,
  // with more scripts than the budget holds, is often evicted after that one evaluation. A
  // negative LUA_GCSTEP adds a negative debt (lapi.c: debt = data * 1024 + GCdebt) and runs no
  // step (design/decisions.md "D-lean-state").
  //
  // How much more than that differs from state to state, evenly spread over the states a
  // process makes (a golden-ratio sequence): between one and three times what it holds. States
  // made together that run alike, as the virtual tags of one plant or a load spread over many
  // keys, otherwise all collect in the same round, every ~46 evaluations each: a burst of
  // collections that held 10k updates/s of 1,000 tags 3 deep back by up to 4 ms and set their
  // p99 (design/decisions.md "D-gc-phase").
  static std::atomic<uint32_t> made{0};
  const uint64_t phase = static_cast<uint32_t>(made.fetch_add(1, std::memory_order_relaxed) *
                                               2654435769u);  // 2^32 / golden ratio
  const std::size_t kb = std::max<std::size_t>(1, s->account_->used / 1024);
  const std::size_t extra = static_cast<std::size_t>((2 * kb * phase) >> 32);
  lua_gc(s->L_, LUA_GCSTEP, -static_cast<int>(kb + extra));
  lua_sethook(s->L_, count_hook, LUA_MASKCOUNT, kHookInterval);
  return s;
}

ScriptState::~ScriptState() {
  if (L_) lua_close(L_);
}

Outcome ScriptState::compile(std::string_view source, const std::string& chunk_name) {
  return load(source, chunk_name.c_str(), "t");
}

Outcome ScriptState::load_chunk(std::string_view bytecode) {
  return load(bytecode, "=chunk", "b");  // the name in the bytecode is the one kept
}

namespace {
int append_dump(lua_State*, const void* p, size_t n, void* out) {
  try {
    static_cast<std::string*>(out)->append(static_cast<const char*>(p), n);
    return 0;
  } catch (const std::bad_alloc&) {
    return 1;  // lua_dump stops and reports it
  }
}
}  // namespace

// lua_dump allocates nothing in Lua 5.4 (it only walks the function and calls the writer), so it
// needs no protected call; a later Lua whose dump allocates would need one.
bool ScriptState::dump_chunk(std::string* out) {
  if (!compiled_) return false;
  lua_settop(L_, 1);
  lua_pushvalue(L_, 1);  // lua_dump writes the function on the top
  const int status = lua_dump(L_, append_dump, out, 0);
  lua_settop(L_, 1);
  return status == 0;
}

Outcome ScriptState::load(std::string_view text, const char* chunk_name, const char* mode) {
  lua_settop(L_, 0);
  compiled_ = false;
  CompileArgs args{text.data(), text.size(), chunk_name, mode};
  // Compilation runs no script code, but give it the deadline machinery a sane state anyway.
  ctx_->timed_out = false;
  ctx_->deadline_ns = INT64_MAX;
  account_->system_refused = false;
  account_->budget_refused = false;
  lua_pushcfunction(L_, compile_trampoline);
  lua_pushlightuserdata(L_, &args);
  const int status = lua_pcall(L_, 1, 1, 0);
  if (status == LUA_OK) {
    compiled_ = true;  // the chunk stays at stack slot 1 for the state's lifetime
    return {};
  }
  Outcome out;
  if (status == LUA_ERRMEM) {
    out = {Status::MemoryLimit, memory_message(*account_)};
  } else {
    out = {Status::CompileError, error_message(L_, -1)};
  }
  lua_settop(L_, 0);
  return out;
}

Outcome ScriptState::run(PushInputsFn push_inputs, const void* inputs, int64_t timeout_ns,
                         int64_t start_ns, ScriptLog* log) {
  lua_settop(L_, 1);
  // Only during the run: a __gc that prints while the state is closed (evicted while another
  // script runs) must not write into that script's log; what finalizers print after it is lost.
  ctx_->log = log;
  RunArgs args{push_inputs, inputs, true};
  lua_pushcfunction(L_, run_trampoline);
  lua_pushlightuserdata(L_, &args);
  lua_pushvalue(L_, 1);
  ctx_->timed_out = false;
  ctx_->close_depth = 0;
  ctx_->stack_base = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  ctx_->deadline_ns = (start_ns != 0 ? start_ns : monotonic_ns()) + timeout_ns;
  account_->system_refused = false;
  account_->budget_refused = false;
  const int status = lua_pcall(L_, 2, 1, 0);
  ctx_->log = nullptr;
  ctx_->stack_base = 0;
  const bool timed_out = ctx_->timed_out;
  if (lua_gethookcount(L_) != kHookInterval)
    lua_sethook(L_, count_hook, LUA_MASKCOUNT, kHookInterval);
  ctx_->timed_out = false;
  if (status == LUA_OK && !timed_out) {
    if (!args.inputs_ok) {
      lua_settop(L_, 1);
      return {Status::InvalidArgument, "inputs are not valid values"};
    }
    return {};  // result at slot 2
  }
  Outcome out;
  if (timed_out) {
    out = {Status::Timeout,
           "script exceeded its timeout of " + std::to_string(timeout_ns / 1'000'000) + " ms"};
  } else if (status == LUA_ERRMEM) {
    out = {Status::MemoryLimit, memory_message(*account_)};
  } else {
    out = {Status::RuntimeError, error_message(L_, -1)};
  }
  lua_settop(L_, 1);
  if (out.status != Status::RuntimeError) lua_gc(L_, LUA_GCCOLLECT);  // give back what it piled up
  return out;
}

}  // namespace outrun::sandbox

namespace outrun::sandbox {

bool is_valid_utf8(const char* s, std::size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(s);
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else
      return false;
    if (i + len > n) return false;
    for (std::size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += len;
  }
  return true;
}

}  // namespace outrun::sandbox

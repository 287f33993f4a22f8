// The sandbox corpus (issue #6, "What must be shown"): a table of hostile and edge-case scripts,
// each with the status and message (or value) it must end with, run through BOTH the real
// out-of-process outrun::Host (worker processes) and outrun::InProcess, which share the sandbox
// (worker/sandbox.cpp, design/sandbox.md).
//
// Every case must be handled inside the sandbox: after every case a plain script is evaluated on
// the same runner and must give the right value, and the worker's pid must not have changed (no
// case may crash, or get killed, the worker). Each Host has one shard, so every case of a profile
// hits the same worker process. A profile is the runner's options (the timeout and the memory
// limit are per runner): one Host and one InProcess per profile.
//
// No assertion is about wall-clock time. Cases that are not about the soft timeout get a 2 s
// timeout (and 5 s grace), so a loaded machine cannot turn them into timeouts.
#include <doctest/doctest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <lua.hpp>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "host/host_support.h"
#include "lua_support.h"
#include "outrun/host.h"
#include "outrun/in_process.h"

using namespace outrun;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// ---------------------------------------------------------------------------------------------
// Profiles: the options a case runs under.
// ---------------------------------------------------------------------------------------------

enum class Profile : std::size_t {
  standard,      // 20 s timeout, 16 MiB (the default memory limit)
  small_memory,  // memory bombs: 8 MiB
  soft_timeout,  // runaways: 200 ms timeout (5 s grace: the worker itself must stop them)
  large_memory,  // huge values that need a raised limit: 128 MiB
};
constexpr std::size_t kProfiles = 4;

struct ProfileOptions {
  const char* name;
  std::chrono::milliseconds timeout;
  std::size_t memory_limit;
};
constexpr std::array<ProfileOptions, kProfiles> kProfileOptions = {{
    // Long timeouts where the case is not about them: sanitizer builds and a loaded machine run
    // the deep-recursion cases several times slower.
    {"standard", 20000ms, 16 * kMiB},
    {"small_memory", 20000ms, 8 * kMiB},
    {"soft_timeout", 200ms, 16 * kMiB},
    {"large_memory", 20000ms, 128 * kMiB},
}};

// ---------------------------------------------------------------------------------------------
// The cases.
// ---------------------------------------------------------------------------------------------

struct Case {
  std::string name;  // also the script key, so errors read "name:line: ..."
  std::string source;
  Status status;        // expected status (invalid_argument: refused at registration)
  std::string message;  // status != ok: a substring of Result::error; a leading '@' stands for
                        // "name:" (the script's own position prefix)
  Value value;          // status == ok: the expected value
  Profile profile;
};

Case returns(std::string name, std::string source, Value value, Profile p = Profile::standard) {
  return {std::move(name), std::move(source), Status::ok, {}, std::move(value), p};
}

Case fails(std::string name, std::string source, Status status, std::string message,
           Profile p = Profile::standard) {
  if (!message.empty() && message[0] == '@') message = name + ":" + message.substr(1);
  return {std::move(name), std::move(source), status, std::move(message), Value(), p};
}

using outrun::test::binary_chunk;

std::string repeat(std::string_view s, std::size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (std::size_t i = 0; i < n; ++i) out += s;
  return out;
}

// A valid script of exactly `size` bytes: a long comment, then `return 7`.
std::string source_of_size(std::size_t size) {
  const std::string tail = "\nreturn 7";
  std::string s = "--[[" + std::string(size - tail.size() - 6, 'x') + "]]" + tail;
  REQUIRE(s.size() == size);
  return s;
}

// Many short statements, close to the source limit: real code to compile (not a comment). The
// script returns how many there are.
std::pair<std::string, int64_t> long_code(std::size_t size_at_least) {
  std::string s = "local x = 0\n";
  int64_t n = 0;
  for (; s.size() < size_at_least; ++n) s += "x = x + 1 -- ..........................\n";
  return {s + "return x", n};
}

const std::string kMemory8 = "script exceeded its memory limit of 8388608 bytes";
const std::string kMemory16 = "script exceeded its memory limit of 16777216 bytes";
const std::string kTimeout = "script exceeded its timeout of 200 ms";
const std::string kBinary = "attempt to load a binary chunk (mode is 't')";

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

// Lua 5.4.4 bug 5.4.4-9's reproducer (lua.org/bugs.html), 12,000 coroutines deep; `coro` is the
// last one.
const std::string kCloseChain = R"(local coro = false
for i = 1, 12000 do
  local previous = coro
  coro = coroutine.create(function()
    local cc <close> = setmetatable({}, {__close = function()
      if previous then assert(coroutine.close(previous)) end
    end})
    coroutine.yield()
  end)
  assert(coroutine.resume(coro))
end
)";

// What Debian's 5.4.4 answers (the bitwise constants of 5.4.4-3 and utf8.codes of 5.4.4-8).
const Value kBitwiseConstants =
    Array{Value(3), Value(3), Value(2), Value(1), Value(4), Value(4), Value(-4)};
const Value kUtf8CodesContinuation = Value(1);  // 5.4.6 raises "invalid UTF-8 code"

std::vector<Case> corpus(const std::string& chunk) {
  constexpr auto M = Profile::small_memory;
  constexpr auto T = Profile::soft_timeout;
  constexpr auto L = Profile::large_memory;
  const Status rt = Status::runtime_error, ce = Status::compile_error, mem = Status::memory_limit,
               to = Status::timeout;
  // Sources that try a binary chunk run it if load accepts it (the mutation check: the result
  // would then be 42) and raise load's own message otherwise.
  const std::string run_or_raise = " if f then return f() end error(e, 0)";
  const auto [near_limit, near_limit_statements] = long_code(kMaxSourceSize - 100);
  return {
      // ---- Binary chunks, by every route -------------------------------------------------
      // load(chunk, name, "b"): asks for binary explicitly.
      fails("bin_mode_b", "local f, e = load(inputs.chunk, '=c', 'b')" + run_or_raise, rt, kBinary),
      // load(chunk, name, "bt"): binary allowed alongside text.
      fails("bin_mode_bt", "local f, e = load(inputs.chunk, '=c', 'bt')" + run_or_raise, rt,
            kBinary),
      // load(chunk): the default mode of plain Lua is "bt".
      fails("bin_mode_default", "local f, e = load(inputs.chunk)" + run_or_raise, rt, kBinary),
      // load(chunk, name, nil, env): default mode plus an explicit environment.
      fails("bin_mode_nil_env", "local f, e = load(inputs.chunk, '=c', nil, {})" + run_or_raise, rt,
            kBinary),
      // load(reader, name, "b"): the chunk fed one byte at a time by a reader function.
      fails("bin_reader",
            "local i = 0\n"
            "local f, e = load(function() i = i + 1 return inputs.chunk:sub(i, i) end, '=c', 'b')" +
                run_or_raise,
            rt, kBinary),
      // Just the signature "\27Lua", built in the script.
      fails("bin_signature", "local f, e = load('\\27Lua', '=c', 'b')" + run_or_raise, rt, kBinary),
      // The script's own source is a binary chunk (the worker compiles text only).
      fails("bin_as_source", chunk, ce, kBinary),
      // string.dump, the way to make bytecode inside a script, is absent...
      fails("bin_string_dump", "return string.dump(function() end)", rt,
            "@1: attempt to call a nil value (field 'dump')"),
      // ...also through the string metatable's __index (the real library table).
      fails("bin_string_dump_method", "return ('x'):dump()", rt,
            "@1: attempt to call a nil value (method 'dump')"),

      // ---- Library tampering -----------------------------------------------------------------
      // Adding a field to a library.
      fails("lib_string_field", "string.x = 1", rt, "@1: library tables are read-only"),
      // rawset bypasses __newindex.
      fails("lib_rawset_string", "rawset(string, 'upper', print)", rt,
            "@1: rawset: library tables are read-only"),
      // Removing a library function.
      fails("lib_table_insert_nil", "table.insert = nil", rt, "@1: library tables are read-only"),
      // Changing a library constant.
      fails("lib_math_pi", "math.pi = 3", rt, "@1: library tables are read-only"),
      // Replacing the os proxy's functions.
      fails("lib_os_exit_replace", "os.exit = function() end", rt,
            "@1: library tables are read-only"),
      // table.insert into a library table (lua_seti honours __newindex). Raised from inside
      // table.insert, the message has no line.
      fails("lib_table_insert_into", "table.insert(string, 'x')", rt,
            "library tables are read-only"),
      // Replacing a library's metatable.
      fails("lib_setmetatable_string",
            "setmetatable(string, {__index = function() return 'pwned' end})", rt,
            "@1: cannot change a protected metatable"),
      // Reaching the string metatable to redirect every string method.
      fails("lib_string_mt_index",
            "getmetatable('').__index = {upper = function() return 'pwned' end}", rt,
            "@1: attempt to index a boolean value"),
      // Reaching the real string library through the string metatable.
      fails("lib_string_mt_upper", "getmetatable('').__index.upper = function() return 'pwned' end",
            rt, "@1: attempt to index a boolean value"),
      // The metatables of the library proxies are hidden.
      returns("lib_getmetatable_proxy",
              "return {getmetatable(string), getmetatable(''), getmetatable(math)}",
              Array{Value(false), Value(false), Value(false)}),
      // Raw access and iteration see an empty proxy, not the library.
      returns("lib_proxy_empty",
              "return {next(string) == nil, rawget(string, 'upper') == nil, #string}",
              Array{Value(true), Value(true), Value(0)}),
      // Returning a library gives its (empty) proxy.
      returns("lib_return_string", "return string", Map{}),
      // After every refused attempt the libraries still work.
      returns("lib_intact_after_attempts",
              "pcall(function() string.upper = nil end)\n"
              "pcall(rawset, string, 'upper', nil)\n"
              "pcall(setmetatable, string, {})\n"
              "return ('abc'):upper() .. string.upper('d') .. math.pi",
              "ABCD3.1415926535898"),
      // Rebinding a global name to a fake library: the script's own globals, its own state only
      // (the next case, in a fresh state, sees the real library).
      returns("lib_rebind_global",
              "string = {upper = function() return 'fake' end} return string.upper('a')", "fake"),

      // ---- Global leaks between scripts (the runner runs these two in this order) ---------
      // Script A writes globals every way it can.
      returns("leak_writer",
              "leaked = 1\n_G.leaked_g = 2\nrawset(_G, 'leaked_raw', 3)\n_ENV.leaked_env = 4\n"
              "setmetatable(_G, {__index = function() return 'from A' end})\n"
              "return leaked + leaked_g + leaked_raw + leaked_env",
              10),
      // Script B, evaluated next on the same worker, sees none of it.
      returns("leak_reader",
              "return {leaked == nil, leaked_g == nil, leaked_raw == nil, leaked_env == nil, "
              "getmetatable(_G) == nil, nothing == nil, ('abc'):upper()}",
              Array{Value(true), Value(true), Value(true), Value(true), Value(true), Value(true),
                    Value("ABC")}),

      // ---- _ENV tricks --------------------------------------------------------------------
      // A local _ENV replaces the globals for the rest of the chunk.
      returns("env_local_table", "local _ENV = {x = 5} return x", 5),
      // ...and with it the libraries are gone, not reachable.
      fails("env_local_empty", "local _ENV = {} return string.upper('a')", rt,
            "@1: attempt to index a nil value (global 'string')"),
      // Setting fields of _ENV sets globals (of this state).
      returns("env_set_field", "_ENV.x = 1 _ENV['y'] = 2 return x + y", 3),
      // _G is the global table of this state.
      returns("env_g_is_env",
              "return rawequal(_G, _ENV) and rawequal(_G._G, _G) and rawequal(_G._G._G, _G)", true),
      // An _ENV with a metatable that falls back to _G.
      returns(
          "env_proxy_env",
          "local _ENV = setmetatable({}, {__index = _G}) z = 3 return rawget(_G, 'z') == nil and z",
          3),
      // load with a custom environment table.
      returns("env_load_custom", "return load('return x', 'n', 't', {x = 1})()", 1),
      // load with an empty environment: no libraries inside.
      returns("env_load_empty", "return load('return string', 'n', 't', {})() == nil", true),
      // load with an environment that hands over the os proxy: still no os.exit.
      fails("env_load_os", "return load('os.exit()', '=inner', 't', {os = os})()", rt,
            "inner:1: attempt to call a nil value (field 'exit')"),
      // load with an explicit nil environment.
      fails("env_load_nil", "return load('return print', '=inner', 't', nil)()", rt,
            "inner:1: attempt to index a nil value (upvalue '_ENV')"),
      // Returning the global table: holds functions, so it cannot be a result.
      fails("env_return_g", "return _G", rt, "cannot return a"),
      // load's own argument errors name the script's line and 'load'.
      fails("env_load_bad_chunk", "return load(nil)", rt,
            "@1: bad argument #1 to 'load' (function expected, got nil)"),

      // ---- Removed: package, require, files, processes, debug, gc control ---------------
      // package and its loaders.
      fails("rm_package_loaded", "return package.loaded", rt,
            "@1: attempt to index a nil value (global 'package')"),
      // require a real library module.
      fails("rm_require", "return require('os')", rt,
            "@1: attempt to call a nil value (global 'require')"),
      // loadlib: native code.
      fails("rm_loadlib", "return package.loadlib('libc.so.6', 'system')", rt,
            "@1: attempt to index a nil value (global 'package')"),
      // dofile / loadfile: reading files.
      fails("rm_dofile", "return dofile('/etc/passwd')", rt,
            "@1: attempt to call a nil value (global 'dofile')"),
      fails("rm_loadfile", "return loadfile('/etc/passwd')", rt,
            "@1: attempt to call a nil value (global 'loadfile')"),
      // io: files and processes.
      fails("rm_io_open", "return io.open('/etc/passwd')", rt,
            "@1: attempt to index a nil value (global 'io')"),
      fails("rm_io_popen", "return io.popen('id')", rt,
            "@1: attempt to index a nil value (global 'io')"),
      // os: processes, environment, exit, files.
      fails("rm_os_execute", "return os.execute('id')", rt,
            "@1: attempt to call a nil value (field 'execute')"),
      fails("rm_os_getenv", "return os.getenv('HOME')", rt,
            "@1: attempt to call a nil value (field 'getenv')"),
      fails("rm_os_exit", "os.exit(1)", rt, "@1: attempt to call a nil value (field 'exit')"),
      fails("rm_os_remove", "return os.remove('/tmp/x')", rt,
            "@1: attempt to call a nil value (field 'remove')"),
      // What os keeps.
      returns("rm_os_kept", "return {type(os.clock()), type(os.time()), os.difftime(2, 1)}",
              Array{Value("number"), Value("number"), Value(1.0)}),
      // debug: the registry, hooks (the soft timeout), upvalues.
      fails("rm_debug_registry", "return debug.getregistry()", rt,
            "@1: attempt to index a nil value (global 'debug')"),
      fails("rm_debug_sethook", "debug.sethook()", rt,
            "@1: attempt to index a nil value (global 'debug')"),
      // collectgarbage: only "count".
      fails("rm_gc_collect", "collectgarbage('collect')", rt,
            "@1: collectgarbage: only \"count\" is allowed"),
      fails("rm_gc_stop", "collectgarbage('stop')", rt,
            "@1: collectgarbage: only \"count\" is allowed"),
      fails("rm_gc_step", "collectgarbage('step')", rt,
            "@1: collectgarbage: only \"count\" is allowed"),
      fails("rm_gc_default", "collectgarbage()", rt,
            "@1: collectgarbage: only \"count\" is allowed"),
      returns("rm_gc_count", "return collectgarbage('count') > 0", true),
      // No userdata is reachable at all (io, the usual source, is absent).
      returns("rm_no_userdata", "return io == nil and debug == nil and package == nil", true),

      // ---- Finalizers and __close --------------------------------------------------------
      // A __gc finalizer (would run with hooks off: no timeout could stop it).
      fails("gc_finalizer", "setmetatable({}, {__gc = function() while true do end end})", rt,
            "@1: setmetatable: __gc metamethods are not allowed"),
      // A placeholder __gc that would arm finalization for a function assigned later.
      fails("gc_placeholder", "setmetatable({}, {__gc = false})", rt,
            "@1: setmetatable: __gc metamethods are not allowed"),
      // __gc assigned after setmetatable: never armed, so it never runs (garbage drives the GC).
      returns("gc_assigned_later",
              "local mt = {}\nlocal t = setmetatable({}, mt)\nmt.__gc = function() ran = true end\n"
              "t = nil\nfor i = 1, 200000 do local g = {i} end\nreturn ran == nil",
              true),
      // __gc supplied by an __index on the metatable: Lua looks finalizers up raw, never armed.
      returns("gc_via_index",
              "local t = setmetatable({}, setmetatable({}, {__index = function(_, k) "
              "if k == '__gc' then return function() ran = true end end end}))\n"
              "t = nil\nfor i = 1, 200000 do local g = {i} end\nreturn ran == nil",
              true),
      // __close runs when the variable goes out of scope.
      returns("close_runs",
              "do local x <close> = setmetatable({}, {__close = function() closed = true end}) end "
              "return closed",
              true),
      // An error inside __close is the script's error.
      fails("close_raises",
            "local x <close> = setmetatable({}, {__close = function() error('in close') "
            "end})\nreturn 1",
            rt, "@1: in close"),
      // __close during an error sees it; the original error is reported.
      fails("close_during_error",
            "do local x <close> = setmetatable({}, {__close = function(_, e) seen = e end}) "
            "error('boom') end",
            rt, "@1: boom"),
      // A to-be-closed variable that is not closable.
      fails("close_non_closable", "local x <close> = 42 return 1", rt,
            "@1: variable 'x' got a non-closable value"),

      // ---- Recursion depth -----------------------------------------------------------------
      // Plain Lua recursion: the Lua stack (1,000,000 slots) outgrows a 16 MiB limit first.
      fails("rec_lua_16mib", "local function f() return 1 + f() end return f()", mem, kMemory16),
      // The same with room for the whole stack: Lua's own stack overflow.
      fails("rec_lua_large", "local function f() return 1 + f() end return f()", rt,
            "@1: stack overflow", L),
      // C stack: pcall inside pcall.
      fails("rec_pcall",
            "local function f() local ok, e = pcall(f) if not ok then error(e, 0) end return e "
            "end\nreturn f()",
            rt, "C stack overflow"),
      // C stack: string.gsub callbacks that call gsub.
      fails("rec_gsub", "local function f(s) return (s:gsub('.', f)) end return f('x')", rt,
            "C stack overflow"),
      // C stack: an __index function that indexes its own table.
      fails("rec_index_function",
            "local t = setmetatable({}, {__index = function(t, k) return t[k] end}) return t.x", rt,
            "@1: C stack overflow"),
      // An __index chain that loops.
      fails("rec_index_loop",
            "local a, b = {}, {} setmetatable(a, {__index = b}) setmetatable(b, {__index = a}) "
            "return a.x",
            rt, "@1: '__index' chain too long; possible loop"),
      // A long (non-looping) __index chain of 3000 tables.
      fails("rec_index_chain",
            "local t = {} for i = 1, 3000 do t[i] = setmetatable({}, {__index = t[i - 1]}) end "
            "return t[3000].x",
            rt, "@1: '__index' chain too long; possible loop"),
      // C stack: coroutine.wrap inside coroutine.wrap.
      fails("rec_coroutine_wrap", "local function f() return coroutine.wrap(f)() end return f()",
            rt, "C stack overflow"),
      // C stack: table.sort comparators that sort.
      fails("rec_sort_comparator",
            "local function cmp(a, b) table.sort({3, 2, 1}, cmp) return a < b end table.sort({3, "
            "2, 1}, cmp)",
            rt, "C stack overflow"),
      // C stack: __tostring calling tostring on itself.
      fails("rec_tostring",
            "local t = setmetatable({}, {__tostring = function(s) return tostring(s) end}) return "
            "tostring(t)",
            rt, "C stack overflow"),
      // Deeply nested table constructors in the source.
      fails("rec_source_tables", "return " + repeat("{", 300) + repeat("}", 300), ce,
            "C stack overflow"),
      // Deeply nested parentheses in the source.
      fails("rec_source_parens", "return " + repeat("(", 300) + "1" + repeat(")", 300), ce,
            "C stack overflow"),
      // Deeply nested function definitions in the source.
      fails("rec_source_functions",
            "return " + repeat("function() return ", 300) + "1" + repeat(" end", 300), ce,
            "C stack overflow"),
      // A result nested past the depth limit (built by recursion).
      fails("rec_deep_result",
            "local function f(n) if n == 0 then return {} end return {f(n - 1)} end return f(100)",
            rt, "result is nested deeper than 32 levels"),

      // ---- Huge sizes from one library call ----------------------------------------------
      // string.rep past Lua's maximum string size.
      fails("size_rep_max", "return string.rep('x', math.maxinteger)", rt,
            "@1: resulting string too large"),
      // string.rep with a separator past the maximum.
      fails("size_rep_sep_max", "return string.rep('x', 1 << 40, 'yy')", rt,
            "@1: resulting string too large"),
      // string.rep within Lua's maximum but past the memory limit.
      fails("size_rep_limit", "return #string.rep('x', 1e9)", mem, kMemory16),
      // string.rep with a separator, normal use.
      returns("size_rep_sep", "return string.rep('ab', 3, ',')", "ab,ab,ab"),
      // table.concat of 64 references to one 1 MiB string.
      fails("size_concat",
            "local s = string.rep('x', 2^20) local t = {} for i = 1, 64 do t[i] = s end return "
            "#table.concat(t)",
            mem, kMemory8, M),
      // table.unpack of a huge range.
      fails("size_unpack", "return table.unpack({}, 1, 1e8)", rt, "@1: too many results to unpack"),
      // table.unpack of the whole integer range.
      fails("size_unpack_full", "return table.unpack({}, math.mininteger, math.maxinteger)", rt,
            "@1: too many results to unpack"),
      // string.format with a huge field width.
      fails("size_format_width", "return string.format('%99999d', 1)", rt,
            "@1: invalid conversion specification: '%99999d'"),
      // string.pack with an out-of-range size.
      fails("size_pack", "return string.pack('i17', 1)", rt,
            "@1: integral size (17) out of limits [1,16]"),
      // gsub multiplying a 1 MiB string tenfold.
      fails("size_gsub", "return #string.rep('x', 2^20):gsub('x', 'xxxxxxxxxx')", mem, kMemory16),
      // An error message of 20 MiB: cut to a readable size, not sent whole (it once made the
      // worker write a frame past the 16 MiB maximum and get killed).
      fails("size_error_message", "error(string.rep('x', 20 * 2^20))", rt,
            "error message cut, " +
                std::to_string(20 * kMiB + std::string("size_error_message:1: ").size()) +
                " bytes in all",
            L),

      // ---- Memory bombs (8 MiB) ----------------------------------------------------------
      // A string doubling itself.
      fails("bomb_string_doubling", "local s = 'x' while true do s = s .. s end", mem, kMemory8, M),
      // Many distinct strings made by concatenation in a loop.
      fails("bomb_string_concat",
            "local t, i = {}, 0 while true do i = i + 1 t[i] = 'k' .. i .. 'v' end", mem, kMemory8,
            M),
      // One growing table.
      fails("bomb_table", "local t, i = {}, 0 while true do i = i + 1 t[i] = i end", mem, kMemory8,
            M),
      // A table of tables.
      fails("bomb_table_of_tables", "local t = {} while true do t[#t + 1] = {{}, {}, {}} end", mem,
            kMemory8, M),
      // Closures, each with its own upvalue.
      fails("bomb_closures",
            "local t = {} while true do local n = #t t[n + 1] = function() return n end end", mem,
            kMemory8, M),
      // Coroutines, each suspended with its own stack.
      fails("bomb_coroutines",
            "local t = {} while true do local c = coroutine.wrap(function() coroutine.yield() end) "
            "c() t[#t + 1] = c end",
            mem, kMemory8, M),
      // Held in globals: the state stays full (only this script's state).
      fails("bomb_globals", "hoard = {} while true do hoard[#hoard + 1] = {} end", mem, kMemory8,
            M),
      // A bomb caught by pcall: the script goes on once the garbage is gone.
      returns("bomb_pcall_caught",
              "local ok, e = pcall(function() local t = {} while true do t[#t + 1] = {} end end) "
              "return e",
              "not enough memory", M),
      // ...re-raised as it is: still memory_limit.
      fails("bomb_pcall_reraised",
            "local ok, e = pcall(function() local t = {} while true do t[#t + 1] = {} end end) "
            "error(e, 0)",
            mem, kMemory8, M),
      // ...re-raised with a position: the script's own runtime error.
      fails("bomb_pcall_rewrapped",
            "local ok, e = pcall(function() local t = {} while true do t[#t + 1] = {} end end) "
            "error(e)",
            rt, "@1: not enough memory", M),

      // ---- Error objects -------------------------------------------------------------------
      // __tostring that would hang if it ran: it does not.
      fails("err_tostring",
            "error(setmetatable({}, {__tostring = function() while true do end end}))", rt,
            "(error object is a table value)"),
      // __index and __name on the error object: not consulted.
      fails("err_index_name",
            "error(setmetatable({}, {__index = function() error('trap') end, __name = 'MyError'}))",
            rt, "(error object is a table value)"),
      // An error object with __gc: refused before it can be raised.
      fails("err_gc", "error(setmetatable({}, {__gc = function() end}))", rt,
            "@1: setmetatable: __gc metamethods are not allowed"),
      // error(nil) and error().
      fails("err_nil", "error(nil)", rt, "(error object is a nil value)"),
      // A coroutine as the error object.
      fails("err_thread", "error(coroutine.create(function() end))", rt,
            "(error object is a thread value)"),
      // A function as the error object.
      fails("err_function", "error(print)", rt, "(error object is a function value)"),
      // Numbers are messages.
      fails("err_number", "error(1.5)", rt, "1.5"),
      // A message handler that raises: Lua's "error in error handling", caught by xpcall.
      returns("err_in_handler", "return select(2, xpcall(error, function(e) error('h') end, 'x'))",
              "error in error handling"),
      // An error raised inside a coroutine names its line through the wrap.
      fails("err_in_coroutine", "local f = coroutine.wrap(function()\n  error('in co')\nend)\nf()",
            rt, "@2: in co"),

      // ---- Results ------------------------------------------------------------------------
      // A function.
      fails("res_function", "return function() end", rt, "cannot return a function value"),
      // A coroutine (thread).
      fails("res_thread", "return coroutine.create(function() end)", rt,
            "cannot return a thread value"),
      // A cyclic table.
      fails("res_cycle", "local t = {} t.self = t return t", rt, "cannot return a cyclic table"),
      // A shared (not cyclic) table is fine.
      returns("res_shared", "local s = {1} return {a = s, b = s}",
              Map{{"a", Value(Array{Value(1)})}, {"b", Value(Array{Value(1)})}}),
      // Metamethods of a returned table do not run (raw conversion).
      returns("res_metamethods",
              "return setmetatable({}, {__pairs = function() error('trap') end, __index = "
              "function() return 1 end})",
              Map{}),
      // A table with 1e6 entries: fine to build with room, too large to return.
      returns("res_million_count", "local t = {} for i = 1, 1e6 do t[i] = i end return #t", 1000000,
              L),
      fails("res_million_return", "local t = {} for i = 1, 1e6 do t[i] = i end return t", rt,
            "result is too large", L),
      // A 20 MiB string: fine to build with room, too large to return.
      returns("res_20mib_count", "return #string.rep('x', 20 * 2^20)", 20 * 1048576, L),
      fails("res_20mib_return", "return string.rep('x', 20 * 2^20)", rt, "result is too large", L),
      // Mixed keys.
      fails("res_mixed_keys", "return {1, 2, x = 3}", rt,
            "cannot return a table with mixed or non-string keys"),
      // A float key.
      fails("res_float_key", "return {[1.5] = 1}", rt,
            "cannot return a table with mixed or non-string keys"),
      // Integral float keys are integer keys in Lua: an array.
      returns("res_integral_float_keys", "return {[1.0] = 'a', [2.0] = 'b'}",
              Array{Value("a"), Value("b")}),
      // A boolean key.
      fails("res_boolean_key", "return {[true] = 1}", rt,
            "cannot return a table with mixed or non-string keys"),
      // An array with a hole.
      fails("res_hole", "return {1, nil, 3}", rt,
            "cannot return a table with mixed or non-string keys"),
      // NaN keys cannot even be stored.
      fails("res_nan_key", "local t = {} t[0/0] = 1 return t", rt, "@1: table index is NaN"),
      // Nor can nil keys.
      fails("res_nil_key", "local t = {} t[nil] = 1 return t", rt, "@1: table index is nil"),

      // ---- Patterns --------------------------------------------------------------------
      fails("pat_missing_bracket", "return string.find('abc', '[a')", rt,
            "@1: malformed pattern (missing ']')"),
      fails("pat_ends_with_percent", "return (string.gsub('abc', '%', ''))", rt,
            "@1: malformed pattern (ends with '%')"),
      fails("pat_balance_args", "return string.match('abc', '%b')", rt,
            "@1: malformed pattern (missing arguments to '%b')"),
      fails("pat_frontier", "return string.find('abc', '%f')", rt,
            "@1: missing '[' after '%f' in pattern"),
      fails("pat_unfinished_capture", "return string.match('abc', '(')", rt,
            "@1: unfinished capture"),
      fails("pat_capture_index", "return string.gsub('abc', 'a', '%2')", rt,
            "@1: invalid capture index %2"),
      // More than 32 captures.
      fails("pat_too_many_captures",
            "return string.match(string.rep('a', 100), string.rep('(a)', 40))", rt,
            "@1: too many captures"),
      // Matcher recursion past its limit.
      fails("pat_too_complex", "return string.match(string.rep('a', 300), string.rep('a?', 250))",
            rt, "@1: pattern too complex"),
      // Plain find treats magic characters as text.
      returns("pat_plain", "return string.find('a.b[c', '[c', 1, true)", 4),

      // ---- Numbers and UTF-8 -------------------------------------------------------------
      fails("num_idiv_zero", "return 1 // 0", rt, "@1: attempt to divide by zero"),
      fails("num_mod_zero", "return 1 % 0", rt, "@1: attempt to perform 'n%0'"),
      returns("num_float_div_zero", "return 1 / 0 == math.huge", true),
      returns("num_wraparound",
              "return math.maxinteger + 1 == math.mininteger and math.mininteger // -1",
              std::numeric_limits<int64_t>::min()),
      fails("num_no_integer_rep", "return 2^63 | 0", rt,
            "@1: number has no integer representation"),
      returns("num_tointeger",
              "return {math.tointeger(3.0), math.tointeger(3.5) == nil, math.tointeger('8')}",
              Array{Value(3), Value(true), Value(8)}),
      fails("num_string_arith", "return 'abc' + 1", rt,
            "@1: attempt to add a 'string' with a 'number'"),
      fails("utf8_char_range", "return utf8.char(-1)", rt,
            "@1: bad argument #1 to 'char' (value out of range)"),
      fails("utf8_codepoint_invalid", "return utf8.codepoint('\\xff')", rt,
            "@1: invalid UTF-8 code"),
      fails("utf8_codes_invalid", "for _ in utf8.codes('a\\xffb') do end", rt,
            "@1: invalid UTF-8 code"),
      returns("utf8_len_invalid", "local n, pos = utf8.len('a\\xffb') return {n == nil, pos}",
              Array{Value(true), Value(2)}),

      // ---- goto, labels, syntax: compile errors with lines -----------------------------
      fails("goto_no_label", "local x = 1\ngoto nowhere", ce,
            "@2: no visible label 'nowhere' for <goto> at line 2"),
      fails("goto_duplicate_label", "::a::\n::a::", ce,
            "@2: label 'a' already defined on line"),  // (Lua 5.4.4 names line 2)
      fails("goto_into_scope", "goto f\nlocal x\n::f::\nreturn x", ce,
            "jumps into the scope of local 'x'"),
      fails("syntax_break_outside", "\nbreak", ce, "@2: break outside loop at line 2"),
      fails("syntax_const_assign", "local x <const> = 1\nx = 2", ce,
            "@2: attempt to assign to const variable 'x'"),
      fails("syntax_line_3", "local a = 1\nlocal b = 2\nlocal c = = 3", ce,
            "@3: unexpected symbol near '='"),
      fails("syntax_unfinished_string", "local a = 1\nlocal s = 'unfinished", ce,
            "@2: unfinished string"),
      fails("syntax_unfinished_comment", "--[[ unfinished\n\n", ce,
            "unfinished long comment (starting at line 1)"),
      fails("syntax_too_many_locals", repeat("local v = 1\n", 201), ce,
            "too many local variables (limit is 200)"),

      // ---- Source size -------------------------------------------------------------------
      // Just under the 1 MiB limit, real code.
      returns("src_near_limit", near_limit, near_limit_statements),
      // Exactly the limit.
      returns("src_at_limit", source_of_size(kMaxSourceSize), 7),
      // One byte over: refused at registration.
      fails("src_over_limit", source_of_size(kMaxSourceSize + 1), Status::invalid_argument,
            "script source is larger than 1048576 bytes"),

      // ---- Runaways: the soft timeout (200 ms) cannot be swallowed ----------------------
      fails("to_loop", "while true do end", to, kTimeout, T),
      fails("to_pcall", "while true do pcall(function() while true do end end) end", to, kTimeout,
            T),
      fails("to_xpcall_handler",
            "return xpcall(function() while true do end end, function() while true do end end)", to,
            kTimeout, T),
      fails("to_coroutine", "coroutine.wrap(function() while true do end end)()", to, kTimeout, T),
      fails(
          "to_close",
          "do local x <close> = setmetatable({}, {__close = function() while true do end end}) end",
          to, kTimeout, T),
      fails("to_gsub_callback",
            "return (string.gsub('abc', '.', function() while true do end end))", to, kTimeout, T),
      fails("to_sort_comparator", "table.sort({3, 2, 1}, function() while true do end end)", to,
            kTimeout, T),
      fails("to_tostring",
            "return tostring(setmetatable({}, {__tostring = function() while true do end end}))",
            to, kTimeout, T),
      fails("to_error_loop", "while true do pcall(error, 'x') end", to, kTimeout, T),
      fails("to_load_reader", "return load(function() while true do end end)", to, kTimeout, T),
      fails("to_tail_recursion", "local function f() return f() end return f()", to, kTimeout, T),

      // ---- Published Lua 5.4 bugs a script can reach on 5.4.4 (design/sandbox.md) --------
      // 5.4.4-9, C-stack overflow with deep nesting of coroutine.close: a chain of coroutines,
      // each with a to-be-closed variable whose __close closes the previous one, then the last
      // one closed. Unguarded this segfaults the worker (and InProcess, the test process).
      // (128 MiB: the 12,000 coroutines take about 12 MiB.)
      fails("lua544_9_close_nesting", kCloseChain + "return assert(coroutine.close(coro))", rt,
            "coroutine.close: too deeply nested", L),
      // The same chain, with every refusal ignored: nothing crashes, the close just stops deep.
      returns("lua544_9_close_nesting_ignored",
              replace_all(kCloseChain, "assert(coroutine.close(previous))",
                          "coroutine.close(previous)") +
                  "return coroutine.close(coro)",
              true, L),
      // Each __close nests 90 pcalls (within LUAI_MAXCCALLS) before closing the previous one:
      // bounded by the C stack the evaluation has used, well before the nesting count.
      fails("lua544_9_close_nesting_pcall",
            "local function deep(n, f) if n == 0 then return f() end\n"
            "  local ok, e = pcall(deep, n - 1, f) if not ok then error(e, 0) end return e end\n" +
                replace_all(kCloseChain, "assert(coroutine.close(previous))",
                            "deep(90, function() assert(coroutine.close(previous)) end)") +
                "return assert(coroutine.close(coro))",
            rt, "coroutine.close: too deeply nested", L),
      // coroutine.close keeps luaB_close's answers.
      returns("lua544_9_close_answers",
              "local co = coroutine.create(function() local x <close> = setmetatable({}, "
              "{__close = function() error('in close', 0) end}) coroutine.yield() end)\n"
              "coroutine.resume(co)\n"
              "local ok, e = coroutine.close(co)\n"
              "local r1, m1 = pcall(coroutine.close, coroutine.running())\n"
              "local r2 = coroutine.close(coroutine.create(print))\n"
              "local r3, m3 = pcall(coroutine.close, 1)\n"
              "local m4 = select(2, coroutine.resume(coroutine.create(function(main)\n"
              "  return select(2, pcall(coroutine.close, main)) end), coroutine.running()))\n"
              "return {ok, e, r1, m1, r2, r3, m3, m4}",
              Array{Value(false), Value("in close"), Value(false),
                    Value("cannot close a running coroutine"), Value(true), Value(false),
                    Value("bad argument #1 to 'close' (coroutine expected, got number)"),
                    Value("cannot close a normal coroutine")}),
      // 5.4.4-2 (CVE-2022-28805, heap over-read parsing _ENV <const>; Debian patched).
      fails("lua544_2_env_const", "local _ENV <const> = 11\nreturn x.y", rt,
            "@2: attempt to index"),
      returns("lua544_2_env_const_table", "local _ENV <const> = {x = {y = 5}}\nreturn x.y", 5),
      // 5.4.4-3, wrong code generation for constants in bitwise operations.
      returns("lua544_3_bitwise_constants",
              "local k <const> = 3.0\nlocal s <const> = 2\n"
              "return {k | 1, 1 | k, k & 2, 2 ~ k, s << 1, 1 << s, ~k}",
              kBitwiseConstants),
      // 5.4.4-4 (CVE-2022-33099, Lua-stack overflow when the C stack overflows while handling an
      // error; Debian patched): upstream's regression test.
      returns("lua544_4_error_in_error",
              "local function loop() assert(pcall(loop)) end\n"
              "local ok, e = xpcall(loop, loop)\nreturn {ok, type(e)}",
              Array{Value(false), Value("string")}),
      // 5.4.4-8, utf8.codes does not raise on spurious continuation bytes: a wrong answer in
      // 5.4.4, nothing worse.
      returns("lua544_8_utf8_codes_continuation",
              "local n = 0 for _ in utf8.codes('a\\x80') do n = n + 1 end return n",
              kUtf8CodesContinuation),
      // 5.4.6: read overflow in l_strcmp (strings with embedded zeros).
      returns("lua546_strcmp_embedded_zero",
              "return {'a\\0b' < 'a\\0c', 'a\\0' < 'a', 'a' < 'a\\0', ('\\0'):rep(1000) < "
              "('\\0'):rep(1001)}",
              Array{Value(true), Value(false), Value(true), Value(true)}),
  };
}

// ---------------------------------------------------------------------------------------------
// Running the cases.
// ---------------------------------------------------------------------------------------------

std::string describe(const Result& r) {
  std::string s = "status=" + std::string(to_string(r.status));
  if (!r.error.empty())
    s += " error=\"" + (r.error.size() > 400 ? r.error.substr(0, 400) + "..." : r.error) + "\"";
  if (r.status == Status::ok) {
    std::string v = to_display_string(r.value);
    s += " value=" + (v.size() > 300 ? v.substr(0, 300) + "..." : v);
  }
  return s;
}

// Registers and evaluates; a registration refused is the case's result.
Result run_case(Runner& runner, const Case& c, const Inputs& inputs) {
  Script s;
  if (Error err = runner.register_script(c.name, c.source, &s))  // its code as the case's status
    return Result{
        err.code == ErrorCode::invalid_argument ? Status::invalid_argument : Status::unavailable,
        Value(), err.message, -1};
  return runner.evaluate(s, inputs).get();
}

void check_case(const Case& c, const Result& r) {
  CHECK_MESSAGE(r.status == c.status, describe(r));
  if (c.status == Status::ok) {
    CHECK_MESSAGE(r.value == c.value, describe(r));
  } else {
    CHECK_MESSAGE(r.error.find(c.message) != std::string::npos,
                  "expected \"" << c.message << "\" in: " << describe(r));
  }
}

HostOptions host_options(const ProfileOptions& p) {
  HostOptions o;
  o.shards = 1;
  o.timeout = p.timeout;
  o.grace = 5000ms;  // the worker must stop every case itself: never a kill on a loaded machine
  o.memory_limit = p.memory_limit;
  o.worker_path = OUTRUN_TEST_WORKER;
  o.slow_lane = false;  // one worker runs every case: the one whose soundness is checked
  return o;
}

InProcessOptions in_process_options(const ProfileOptions& p) {
  InProcessOptions o;
  o.timeout = p.timeout;
  o.memory_limit = p.memory_limit;
  return o;
}

// The plain script evaluated after every case: the runner must still give the right answer.
constexpr const char* kProbe = "return inputs.a + 1";

}  // namespace

TEST_CASE(
    "sandbox corpus: every case, through real workers and in process, leaves the runner sound") {
  const std::string chunk = binary_chunk();
  const std::vector<Case> cases = corpus(chunk);
  REQUIRE(cases.size() >= 70);
  std::set<std::string> names;
  for (const Case& c : cases) names.insert(c.name);
  REQUIRE(names.size() == cases.size());  // each case is its own script key

  std::array<std::unique_ptr<Host>, kProfiles> hosts;
  std::array<std::unique_ptr<InProcess>, kProfiles> inprocs;
  std::array<Script, kProfiles> host_probe, inproc_probe;
  std::array<int, kProfiles> pids{};
  for (std::size_t p = 0; p < kProfiles; ++p) {
    hosts[p] = test::start_host(host_options(kProfileOptions[p]));
    inprocs[p] = std::make_unique<InProcess>(in_process_options(kProfileOptions[p]));
    host_probe[p] = test::reg(*hosts[p], "probe", kProbe);
    inproc_probe[p] = test::reg(*inprocs[p], "probe", kProbe);
    const std::vector<int> worker = hosts[p]->worker_pids();
    REQUIRE(worker.size() == 1);
    REQUIRE(worker[0] > 0);
    CHECK(worker[0] != getpid());
    pids[p] = worker[0];
  }

  const Inputs inputs = {{"a", Value(41)}, {"chunk", Value(Bytes{chunk})}};
  int index = 0;
  for (const Case& c : cases) {
    ++index;
    const auto p = static_cast<std::size_t>(c.profile);
    CAPTURE(c.name);
    const std::string profile = kProfileOptions[p].name;
    CAPTURE(profile);
    INFO("source: " << (c.source.size() > 200 ? c.source.substr(0, 200) + "..." : c.source));

    const Result out = run_case(*hosts[p], c, inputs);
    {
      INFO("out of process");
      check_case(c, out);
    }
    // A case that cost the worker its life is not run in process: a runaway the worker did not
    // stop itself would hang this process, a crash would end it.
    if (out.status == Status::killed || out.status == Status::worker_lost) {
      FAIL_CHECK("not run in process after a worker loss: " << describe(out));
    } else {
      const Result in = run_case(*inprocs[p], c, inputs);
      {
        INFO("in process");
        check_case(c, in);
      }
      // The same sandbox: the same answer either way.
      CHECK(out.status == in.status);
      // Which of several faults a result conversion meets first follows the table's traversal
      // order, which Lua seeds per state: `return _G` finds a function or the _G._G cycle.
      if (c.name != "env_return_g") CHECK(out.error == in.error);
      CHECK(out.value == in.value);
    }

    // The runner is sound afterwards: the same worker answers a plain script correctly.
    const Result probe_out = hosts[p]->evaluate(host_probe[p], {{"a", Value(index)}}).get();
    CHECK_MESSAGE(probe_out.status == Status::ok, describe(probe_out));
    CHECK_MESSAGE(probe_out.value == Value(index + 1), describe(probe_out));
    const Result probe_in = inprocs[p]->run(inproc_probe[p], {{"a", Value(index)}});
    CHECK_MESSAGE(probe_in.status == Status::ok, describe(probe_in));
    CHECK_MESSAGE(probe_in.value == Value(index + 1), describe(probe_in));
    for (std::size_t q = 0; q < kProfiles; ++q) {
      const std::vector<int> now = hosts[q]->worker_pids();
      REQUIRE(now.size() == 1);
      CHECK_MESSAGE(now[0] == pids[q], "the " << kProfileOptions[q].name << " worker was replaced");
      pids[q] = now[0];  // report each replacement once
    }
  }
  for (std::size_t p = 0; p < kProfiles; ++p) {
    const ShardStats st = hosts[p]->shard_stats(0);
    CHECK(st.starts == 1);
    CHECK(st.deaths == 0);
  }
}

namespace {

// Script A tries everything that could reach another script of the same worker; every
// attempt on a library or the string metatable raises (A counts them, so it also checks that
// the protections hold in its own state, round after round).
constexpr const char* kTamperer = R"(
local refused = 0
local function try(f) if not pcall(f) then refused = refused + 1 end end
try(function() string.upper = function() return "pwned" end end)
try(function() rawset(string, "upper", function() return "pwned" end) end)
try(function() setmetatable(string, {__index = function() return "pwned" end}) end)
try(function() getmetatable("").__index = {upper = function() return "pwned" end} end)
try(function() getmetatable("").__index.upper = function() return "pwned" end end)
try(function() table.insert = nil end)
try(function() math.pi = 3 end)
try(function() os.time = function() return 0 end end)
try(function() coroutine.wrap = nil end)
try(function() utf8.char = nil end)
try(function() collectgarbage("stop") end)
math.randomseed(inputs.round)
for i = 1, 10 do math.random() end
counter = (counter or 0) + 1
_ENV.leaked = inputs.round
rawset(_ENV, "leaked_raw", inputs.round)
tostring = function() return "pwned" end
pairs = nil
setmetatable(_ENV, {__index = function() return "pwned" end})
_ENV._G = nil
return refused
)";
constexpr int kTampererRefusals = 11;

// Script B reads what A tampers with; its result must never change.
constexpr const char* kObserver = R"(
return {
  upper = ("abc"):upper() .. string.upper("d"),
  pi = math.pi,
  insert = type(table.insert),
  tostr = tostring(12),
  time = type(os.time()),
  wrap = type(coroutine.wrap),
  char = utf8.char(72, 105),
  leaked = type(leaked) .. type(leaked_raw) .. type(counter),
  g = rawequal(_G, _ENV) and rawequal(_G._G, _G),
  gmeta = getmetatable(_G) == nil,
  smeta = getmetatable(""),
  pairs = type(pairs),
}
)";

// Script C seeds its generator once, on its first evaluation, and returns the next number each
// time: the sequence must be that of an untouched state, whatever A seeds meanwhile.
constexpr const char* kRandom = R"(
if not seeded then math.randomseed(7) seeded = true end
return math.random(1, 1000000000)
)";

void check_isolation(Runner& runner, const char* where, const std::vector<int>* expect_pids,
                     const std::function<std::vector<int>()>& pids_now) {
  CAPTURE(where);
  // The references: B and C in a runner where nothing else ever ran.
  InProcess clean(in_process_options(kProfileOptions[0]));
  const Script clean_b = test::reg(clean, "B", kObserver);
  const Script clean_c = test::reg(clean, "C", kRandom);
  const Result expected_b = clean.run(clean_b, {});
  REQUIRE_MESSAGE(expected_b.status == Status::ok, describe(expected_b));

  const Script a = test::reg(runner, "A", kTamperer);
  const Script b = test::reg(runner, "B", kObserver);
  const Script c = test::reg(runner, "C", kRandom);
  for (int round = 0; round < 200; ++round) {
    CAPTURE(round);
    const Result ra = runner.evaluate(a, {{"round", Value(round)}}).get();
    REQUIRE_MESSAGE(ra.status == Status::ok, describe(ra));
    CHECK(ra.value == Value(kTampererRefusals));
    const Result rb = runner.evaluate(b, {}).get();
    REQUIRE_MESSAGE(rb.status == Status::ok, describe(rb));
    CHECK_MESSAGE(rb.value == expected_b.value, describe(rb));
    const Result rc = runner.evaluate(c, {}).get();
    const Result expected_c = clean.run(clean_c, {});
    REQUIRE_MESSAGE(rc.status == Status::ok, describe(rc));
    CHECK_MESSAGE(rc.value == expected_c.value, describe(rc));
    if (expect_pids) CHECK(pids_now() == *expect_pids);
  }
}

}  // namespace

TEST_CASE(
    "sandbox corpus isolation: 200 rounds of tampering never change another script's result") {
  // The observer's reference value, spelled out once, so a change in both runners is noticed.
  {
    InProcess r;
    const Script b = test::reg(r, "B", kObserver);
    const Result res = r.run(b, {});
    REQUIRE_MESSAGE(res.status == Status::ok, describe(res));
    CHECK(res.value == Value(Map{{"char", Value("Hi")},
                                 {"g", Value(true)},
                                 {"gmeta", Value(true)},
                                 {"insert", Value("function")},
                                 {"leaked", Value("nilnilnil")},
                                 {"pairs", Value("function")},
                                 {"pi", Value(3.141592653589793)},
                                 {"smeta", Value(false)},
                                 {"time", Value("number")},
                                 {"tostr", Value("12")},
                                 {"upper", Value("ABCD")},
                                 {"wrap", Value("function")}}));
  }
  SUBCASE("out of process, one worker") {
    auto host = test::start_host(host_options(kProfileOptions[0]));
    const std::vector<int> pids = host->worker_pids();
    REQUIRE(pids.size() == 1);
    check_isolation(*host, "host", &pids, [&] { return host->worker_pids(); });
  }
  SUBCASE("in process") {
    InProcess inproc(in_process_options(kProfileOptions[0]));
    check_isolation(inproc, "in process", nullptr, {});
  }
}

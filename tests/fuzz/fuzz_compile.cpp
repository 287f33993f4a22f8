// fuzz_compile: script source (the one untrusted thing that is not bytes on a pipe) through
// sandbox::ScriptState::compile, then the compiled chunk run twice (globals persist between
// runs, as in a worker) with a few inputs, a 2 ms soft timeout and a 1 MiB memory limit.
//
// Checked: compile ends Ok, CompileError or MemoryLimit; each run ends Ok, RuntimeError, Timeout
// or MemoryLimit; error messages stay cut at 64 KiB; an Ok result converts to a value the host
// accepts, or the converter refuses it with a message. ASan/UBSan watch the sandbox's C
// functions, the allocator accounting and the result conversion.
//
// Lua itself is Debian's shared library, not instrumented: coverage guidance comes from the
// sandbox's code only, so the dictionary (tests/fuzz/lua.dict) and the seed scripts matter.
#include <lua.hpp>

#include "lua_values.h"
#include "sandbox.h"
#include "value_oracle.h"
#include "wire_values.h"

using namespace outrun;
using namespace outrun::fuzz;

namespace {

constexpr std::size_t kMemoryLimit = 1u << 20;
constexpr int64_t kTimeoutNs = 2'000'000;
constexpr std::size_t kMaxMessage = (64u << 10) + 100;

// inputs = {a = 1, b = 2.5, s = "text", t = {1, 2, 3}, m = {x = true}, raw = "\xff\x00"}
struct FixedInputs {
  flatbuffers::FlatBufferBuilder fbb{1024};
  const flatbuffers::Vector<flatbuffers::Offset<wire::Input>>* inputs = nullptr;
  FixedInputs() {
    protocol::WireValueBuilder b(fbb);
    std::vector<flatbuffers::Offset<wire::Input>> in;
    auto add = [&](const char* name, flatbuffers::Offset<wire::Value> v) {
      in.push_back(wire::CreateInput(fbb, fbb.CreateString(name), v));
    };
    add("a", b.integer(1));
    add("b", b.number(2.5));
    add("s", b.string("text", true));
    add("t", b.array({b.integer(1), b.integer(2), b.integer(3)}));
    add("m", b.map({{"x", b.boolean(true)}}));
    add("raw", b.string(std::string_view("\xff\x00", 2), false));
    const auto vec = fbb.CreateVector(in);
    const auto eval = wire::CreateEvaluation(fbb, 1, 0, 0, 0, 0, 2000, vec);
    const auto body = wire::CreateEvaluate(fbb, fbb.CreateVector(&eval, 1));
    fbb.Finish(wire::CreateFrame(fbb, wire::Body::Evaluate, body.Union()));
    inputs = flatbuffers::GetRoot<wire::Frame>(fbb.GetBufferPointer())
                 ->body_as_Evaluate()
                 ->items()
                 ->Get(0)
                 ->inputs();
  }
};

// Pattern matching is one C call the soft timeout cannot interrupt (design/sandbox.md): a
// backtracking pattern runs for minutes, and in production the worker's hard kill at T+G ends
// it (tests/host/supervision_test.cpp, kStuckInC). This fuzzer found one within minutes
// (corpus: pattern_backtracking.lua) and would keep reporting them as timeouts, so here -- only
// here -- string.find/match/gmatch/gsub refuse (raise) a subject longer than 128 bytes or a
// pattern with more than 2 repetition items, and otherwise call the real function. The library
// is one table behind both the `string` proxy and the string metatable, so one patch covers
// `string.find(s, p)` and `s:find(p)`.
constexpr std::size_t kMaxSubject = 128;
constexpr int kMaxRepetitions = 2;

int bounded_pattern_call(lua_State* L) {
  std::size_t ls = 0, lp = 0;
  luaL_checklstring(L, 1, &ls);
  const char* p = luaL_checklstring(L, 2, &lp);
  int reps = 0;
  for (std::size_t i = 0; i < lp; ++i)
    if (p[i] == '*' || p[i] == '+' || p[i] == '-' || p[i] == '?') ++reps;
  if (ls > kMaxSubject || reps > kMaxRepetitions)
    return luaL_error(L, "fuzz: pattern call refused (subject %d bytes, %d repetitions)",
                      static_cast<int>(ls), reps);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

int patch_patterns(lua_State* L) {
  lua_getglobal(L, "string");  // the read-only proxy; its __index is the library
  lua_getmetatable(L, -1);
  lua_getfield(L, -1, "__index");
  for (const char* fn : {"find", "match", "gmatch", "gsub"}) {
    lua_getfield(L, -1, fn);
    lua_pushcclosure(L, bounded_pattern_call, 1);
    lua_setfield(L, -2, fn);
  }
  return 0;
}

void check_run(sandbox::ScriptState& state, const FixedInputs& inputs) {
  const auto out = state.run(sandbox::push_wire_inputs, inputs.inputs, kTimeoutNs);
  FUZZ_CHECK(out.status == wire::Status::Ok || out.status == wire::Status::RuntimeError ||
             out.status == wire::Status::Timeout || out.status == wire::Status::MemoryLimit);
  FUZZ_CHECK(out.error.size() <= kMaxMessage);
  FUZZ_CHECK(state.memory().used <= kMemoryLimit);
  if (out.status != wire::Status::Ok) {
    FUZZ_CHECK(!out.error.empty());
    return;
  }
  lua_State* L = state.L();
  flatbuffers::FlatBufferBuilder rb(1024);
  sandbox::WireValueBuilder builder(rb);
  sandbox::ResultConverter conv(L, builder);
  flatbuffers::Offset<wire::Value> result;
  const bool ok = conv.convert(lua_gettop(L), &result);
  lua_settop(L, 1);
  if (!ok) {
    FUZZ_CHECK(!conv.error().empty());
    return;
  }
  rb.Finish(result);
  flatbuffers::Verifier::Options opts;
  opts.max_depth = protocol::kVerifierMaxDepth;
  opts.max_tables = protocol::kVerifierMaxTables;
  flatbuffers::Verifier v(rb.GetBufferPointer(), rb.GetSize(), opts);
  FUZZ_CHECK(v.VerifyBuffer<wire::Value>(nullptr));
  const auto* w = flatbuffers::GetRoot<wire::Value>(rb.GetBufferPointer());
  FUZZ_CHECK(host_accepts(w));
  check_decode(w);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const FixedInputs inputs;
  std::string err;
  auto state = sandbox::ScriptState::create(kMemoryLimit, &err);
  FUZZ_CHECK(state != nullptr);
  lua_pushcfunction(state->L(), patch_patterns);
  FUZZ_CHECK(lua_pcall(state->L(), 0, 0, 0) == LUA_OK);
  const auto c =
      state->compile(std::string_view(reinterpret_cast<const char*>(data), size), "=fuzz");
  FUZZ_CHECK(c.status == wire::Status::Ok || c.status == wire::Status::CompileError ||
             c.status == wire::Status::MemoryLimit);
  FUZZ_CHECK(c.error.size() <= kMaxMessage);
  if (c.status != wire::Status::Ok) return 0;
  check_run(*state, inputs);
  check_run(*state, inputs);
  return 0;
}

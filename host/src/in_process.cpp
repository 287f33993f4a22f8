#include "outrun/in_process.h"

#include <lua.hpp>

#include "future_state.h"
#include "lua_values.h"
#include "outrun/protocol/script_log.h"
#include "outrun/thread_annotations.h"
#include "sandbox.h"
#include "script_record.h"
#include "script_registry.h"
#include "thread_scratch.h"
#include "value_builder.h"
#include "wire_codec.h"

namespace outrun {

namespace {

// Pushes one outrun::Value. Runs inside a protected call: only trivially destructible locals
// may be alive across Lua API calls (they may longjmp on allocation failure).
bool push_value(lua_State* L, const Value& v, int depth) {
  luaL_checkstack(L, 3, "inputs nested too deeply");
  if (v.is<Nil>())
    lua_pushnil(L);
  else if (const bool* b = std::get_if<bool>(&v.v))
    lua_pushboolean(L, *b);
  else if (const int64_t* i = std::get_if<int64_t>(&v.v))
    lua_pushinteger(L, *i);
  else if (const double* d = std::get_if<double>(&v.v))
    lua_pushnumber(L, *d);
  else if (const std::string* s = std::get_if<std::string>(&v.v))
    lua_pushlstring(L, s->data(), s->size());
  else if (const Bytes* by = std::get_if<Bytes>(&v.v))
    lua_pushlstring(L, by->data.data(), by->data.size());
  else if (const uint64_t* u = std::get_if<uint64_t>(&v.v)) {
    if (*u <= static_cast<uint64_t>(INT64_MAX))
      lua_pushinteger(L, static_cast<lua_Integer>(*u));
    else
      lua_pushnumber(L, static_cast<lua_Number>(*u));
  } else if (const float* f = std::get_if<float>(&v.v))
    lua_pushnumber(L, static_cast<lua_Number>(*f));
  else if (const DateTime* t = std::get_if<DateTime>(&v.v))
    lua_pushnumber(L, t->unix_seconds());
  else if (const Array* a = std::get_if<Array>(&v.v)) {
    if (depth >= kMaxValueDepth) return false;
    lua_createtable(L, static_cast<int>(a->size()), 0);
    for (std::size_t k = 0; k < a->size(); ++k) {
      if (!push_value(L, (*a)[k], depth + 1)) return false;
      lua_rawseti(L, -2, static_cast<lua_Integer>(k + 1));
    }
  } else if (const Map* m = std::get_if<Map>(&v.v)) {
    if (depth >= kMaxValueDepth) return false;
    lua_createtable(L, 0, static_cast<int>(m->size()));
    for (const MapEntry& e : *m) {
      lua_pushlstring(L, e.key.data(), e.key.size());
      if (!push_value(L, e.value, depth + 1)) return false;
      lua_rawset(L, -3);
    }
  } else {
    return false;
  }
  return true;
}

bool push_inputs(lua_State* L, const void* p) {
  const auto& inputs = *static_cast<const Inputs*>(p);
  if (inputs.size() > kMaxInputs) return false;
  for (const Input& in : inputs) {
    lua_pushlstring(L, in.name.data(), in.name.size());
    if (!push_value(L, in.value, 0))
      return false;  // as the worker: kMaxValueDepth levels of tables
    lua_rawset(L, -3);
  }
  return true;
}

// One registered script's engine: compiled on first use, serialised by its mutex.
struct Engine {
  Mutex mu;  // a lua_State is single-threaded
  std::unique_ptr<sandbox::ScriptState> state GUARDED_BY(mu);
  sandbox::Outcome compile_outcome GUARDED_BY(mu);
  bool tried GUARDED_BY(mu) = false;
};

}  // namespace

struct InProcess::Impl {
  explicit Impl(const InProcessOptions& o) : opts(o), registry(this, 1) {}
  InProcessOptions opts;
  detail::ScriptRegistry registry;
};

InProcess::InProcess(const InProcessOptions& options) : impl_(std::make_unique<Impl>(options)) {}
InProcess::~InProcess() = default;

Error InProcess::register_script(std::string_view key, std::string_view source, Script* out) {
  // The engine lives as long as the record: freed with its last handle.
  return impl_->registry.add(key, source, out, [](detail::ScriptRecord& r) {
    r.engine = new Engine();
    r.free_engine = [](void* e) { delete static_cast<Engine*>(e); };
  });
}

Error InProcess::unregister_script(std::string_view key) {
  return impl_->registry.remove(key);
}

RegistryStats InProcess::registry_stats() const {
  return impl_->registry.stats();
}

Result InProcess::run(const Script& script, const Inputs& inputs) {
  const detail::ScriptRecord* r = detail::record_of(script);
  if (!r || r->owner != impl_.get())
    return {Status::invalid_argument, {}, "script handle is not from this runner", -1};
  if (r->unregistered.load(std::memory_order_relaxed)) [[unlikely]]
    return {Status::invalid_argument, {}, "script '" + r->chunk_name + "' was unregistered", -1};
  auto* e = static_cast<Engine*>(r->engine);
  MutexLock lock(e->mu);
  if (!e->tried) {
    e->tried = true;
    std::string err;
    e->state = sandbox::ScriptState::create(impl_->opts.memory_limit, &err);
    if (!e->state)
      e->compile_outcome = {wire::Status::MemoryLimit, err};
    else
      e->compile_outcome = e->state->compile(r->source, "=" + r->chunk_name);
  }
  if (e->compile_outcome.status != wire::Status::Ok)
    return {static_cast<Status>(e->compile_outcome.status), {}, e->compile_outcome.error, -1};
  const int64_t timeout_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(impl_->opts.timeout).count();
  // What it prints or logs, with the worker's per-evaluation caps (no rate limit: it runs on
  // the caller's thread, its cost is the caller's).
  OUTRUN_THREAD_SCRATCH(sandbox::ScriptLog, log);
  log.reset(protocol::kMaxLogLinesPerEvaluation);
  auto outcome = e->state->run(push_inputs, &inputs, timeout_ns, 0, &log);
  Result res;
  if (log.count != 0 || log.dropped != 0) [[unlikely]] {
    res.logs.reserve(log.count);
    for (std::size_t i = 0; i < log.count; ++i)
      res.logs.push_back({static_cast<LogLevel>(log.lines[i].level), log.lines[i].text});
    res.logs_dropped = log.dropped;
  }
  if (outcome.status != wire::Status::Ok) {
    res.status = static_cast<Status>(outcome.status);
    res.error = std::move(outcome.error);
    return res;
  }
  lua_State* L = e->state->L();
  detail::ValueBuilder builder;
  sandbox::ResultConverter conv(L, builder);
  const bool ok = conv.convert(lua_gettop(L), &res.value);
  lua_settop(L, 1);
  if (!ok) {
    res.value = Value{};
    res.status = Status::runtime_error;
    res.error = conv.error();
  }
  return res;
}

void InProcess::evaluate(const Script& script, Inputs inputs, Callback done) {
  done(run(script, inputs));
}

Future InProcess::evaluate(const Script& script, Inputs inputs) {
  detail::Promise p;
  Future f = p.future();
  p.set(run(script, inputs));
  return f;
}

Result InProcess::evaluate_sync(const Script& script, Inputs inputs) {
  return run(script, inputs);
}

void InProcess::evaluate_batch(std::vector<Request> requests, BatchCallback done) {
  for (std::size_t i = 0; i < requests.size(); ++i) {
    Request& req = requests[i];
    if (!req.encoded.empty())
      req.inputs = detail::decode_input_list(detail::input_list_of(req.encoded));
    done(i, run(req.script, req.inputs));
  }
}

}  // namespace outrun

// outrun tags test -f TAGS_FILE ID [--inputs-json JSON] [--status-json JSON] [--state-json JSON]
//                  [--prev-json JSON] [--now ISO8601] [--json] [--timeout MS]
// Runs one tag's script once, for real in a worker, with the inputs given on the command line,
// and prints the DataValue, how its status was decided, the script's log lines and its state
// after (design/tags.md "Testing one tag"). Only the tag ID is defined, in an engine of its own
// over an embedded Host: its inputs are written as sources (no other tag of the file runs), so
// the Bad-input rule, the status rule, the coercion and the timestamps are the engine's.
#include <chrono>
#include <iostream>
#include <mutex>
#include <optional>

#include "json_values.h"
#include "outrun/host.h"
#include "outrun/tags.h"
#include "tags_cmd.h"
#include "tags_file.h"

namespace outrun::cli {

namespace {

struct TagsTestArgs {
  std::string file;
  std::string id;
  std::string inputs_json;
  std::string status_json;
  std::string state_json;
  std::string prev_json;
  std::string now;
  bool json = false;
  int timeout_ms = 1000;
};

std::string printable(std::string_view s) {
  return tags::file::printable(s);
}

std::string type_name(tags::TypeSpec t) {
  return std::string(tags::to_string(t.type)) + (t.array ? "[]" : "");
}

std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

int usage(const std::string& message) {
  std::cerr << "outrun: tags test: " << printable(message) << "\n";
  return 2;
}

bool parse_json(const std::string& text, const char* flag, nlohmann::json* out,
                std::string* error) {
  try {
    *out = nlohmann::json::parse(text);
    return true;
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e999
    *error = std::string(flag) + ": not JSON: " + e.what();
    return false;
  }
}

bool parse_status(const nlohmann::json& j, tags::StatusCode* out) {
  if (j.is_string()) return tags::parse_status_code(j.get_ref<const std::string&>(), out);
  if (j.is_number_unsigned() && j.get<uint64_t>() <= UINT32_MAX) {
    *out = static_cast<tags::StatusCode>(j.get<uint64_t>());
    return true;
  }
  return false;
}

// The DataType a tag of the file or a declared [[source]] gives its value, as the engine would
// publish it (a virtual tag's coerced result) or an OPC UA server would write it.
std::optional<tags::TypeSpec> declared_type(const std::vector<tags::TagDefinition>& defs,
                                            const tags::file::Declarations& decls,
                                            const std::string& tag) {
  for (const auto& d : defs)
    if (d.id == tag && d.config_error.empty()) return d.type;
  for (const auto& s : decls.sources) {
    if (!s.is_object() || s.value("id", "") != tag || !s.contains("type")) continue;
    std::string name = s["type"].get<std::string>();
    tags::TypeSpec t;
    if (name.size() > 2 && name.ends_with("[]")) {
      t.array = true;
      name.resize(name.size() - 2);
    }
    if (tags::parse_data_type(name, &t.type)) return t;
  }
  return std::nullopt;
}

DateTime wall_now() {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return DateTime::from_unix_micros(us);
}

const Value* map_field(const Value& v, std::string_view key) {
  if (!v.is<Map>()) return nullptr;
  for (const auto& e : v.as<Map>())
    if (e.key == key) return &e.value;
  return nullptr;
}

// What the test saw of the evaluation through the engine's observers.
struct Seen {
  std::mutex mu;
  bool submitted = false;
  bool has_result = false;
  Result result;
};

int run_tags_test(const TagsTestArgs& a) {
  using namespace std::string_view_literals;
  std::vector<tags::TagDefinition> defs;
  tags::file::Declarations decls;
  {
    std::vector<std::string> file_errors;
    if (!tags::file::load_tags_file(a.file, &defs, &file_errors, &decls)) {
      for (const auto& line : tags::file::describe_errors(file_errors, {}))
        std::cerr << "outrun: " << line << "\n";
      return 2;
    }
  }
  const tags::TagDefinition* found = nullptr;
  for (const auto& d : defs)
    if (d.id == a.id) found = &d;
  if (found == nullptr) {
    std::string ids;
    for (std::size_t i = 0; i < defs.size() && i < 20; ++i)
      ids += (i == 0 ? "" : ", ") + defs[i].id;
    if (defs.size() > 20) ids += ", ...";
    return usage("no tag '" + a.id + "' in " + a.file +
                 (ids.empty() ? std::string(" (it has no tags)") : " (its tags: " + ids + ")"));
  }
  tags::TagDefinition def = *found;
  if (!def.config_error.empty()) {
    std::cerr << "outrun: " << printable(def.location) << (def.location.empty() ? "" : ": ")
              << "tag '" << printable(def.id) << "': " << printable(def.config_error) << "\n";
    return 2;
  }
  auto name_of = [&](std::size_t i) -> const std::string& {
    return def.inputs[i].name.empty() ? def.inputs[i].tag : def.inputs[i].name;
  };
  // A key of --inputs-json / --status-json: an input's name, or its tag id.
  auto input_index = [&](const std::string& key) -> std::optional<std::size_t> {
    for (std::size_t i = 0; i < def.inputs.size(); ++i)
      if (name_of(i) == key) return i;
    for (std::size_t i = 0; i < def.inputs.size(); ++i)
      if (def.inputs[i].tag == key) return i;
    return std::nullopt;
  };
  auto declared_inputs = [&] {
    std::string s;
    for (std::size_t i = 0; i < def.inputs.size(); ++i) s += (i == 0 ? "" : ", ") + name_of(i);
    return s.empty() ? std::string("it has no inputs") : "its inputs: " + s;
  };

  DateTime now = wall_now();
  if (!a.now.empty()) {
    bool out_of_range = false;
    if (!parse_datetime(a.now, &now, &out_of_range))
      return usage("--now: " +
                   std::string(out_of_range ? "outside DateTime's range (1601..9999)"
                                            : "expected an ISO 8601 time") +
                   " ('" + a.now + "')");
  }

  // The inputs: a value (--inputs-json) and a status (--status-json, default Good) per input
  // given; the others are never written (BadWaitingForInitialData).
  std::string err;
  std::vector<std::optional<Value>> values(def.inputs.size());
  std::vector<std::optional<tags::StatusCode>> statuses(def.inputs.size());
  if (!a.inputs_json.empty()) {
    nlohmann::json j;
    if (!parse_json(a.inputs_json, "--inputs-json", &j, &err)) return usage(err);
    if (!j.is_object()) return usage("--inputs-json: expected a JSON object {\"INPUT\": value}");
    for (auto it = j.begin(); it != j.end(); ++it) {
      auto i = input_index(it.key());
      if (!i)
        return usage("--inputs-json: '" + it.key() + "' is not an input of '" + def.id + "' (" +
                     declared_inputs() + ")");
      if (values[*i]) return usage("--inputs-json: input '" + name_of(*i) + "' is given twice");
      Value v;
      if (!json_values::from_json(*it, &v, &err))
        return usage("--inputs-json: " + it.key() + ": " + err);
      // Typed as the tag or [[source]] of the file that it is would publish it.
      if (auto t = declared_type(defs, decls, def.inputs[*i].tag); t && !v.is_nil()) {
        Value coerced;
        std::string reason;
        if (tags::coerce(v, *t, &coerced, &reason) != tags::codes::Good)
          return usage("--inputs-json: input '" + name_of(*i) + "' (" + def.inputs[*i].tag + ", " +
                       type_name(*t) + "): " + reason);
        v = std::move(coerced);
      }
      values[*i] = std::move(v);
    }
  }
  if (!a.status_json.empty()) {
    nlohmann::json j;
    if (!parse_json(a.status_json, "--status-json", &j, &err)) return usage(err);
    if (!j.is_object())
      return usage(
          "--status-json: expected a JSON object {\"INPUT\": \"StatusCodeName\" or number}");
    for (auto it = j.begin(); it != j.end(); ++it) {
      auto i = input_index(it.key());
      if (!i)
        return usage("--status-json: '" + it.key() + "' is not an input of '" + def.id + "' (" +
                     declared_inputs() + ")");
      tags::StatusCode code = 0;
      if (!parse_status(*it, &code))
        return usage("--status-json: " + it.key() +
                     ": expected a StatusCode name (Good, UncertainLastUsableValue, "
                     "BadSensorFailure, ...) or number");
      statuses[*i] = code;
    }
  }
  std::vector<tags::SourceUpdate> updates;
  for (std::size_t i = 0; i < def.inputs.size(); ++i) {
    if (!values[i] && !statuses[i]) continue;
    const tags::StatusCode code = statuses[i].value_or(tags::codes::Good);
    if (!values[i] && tags::severity(code) != tags::Severity::bad)
      return usage("input '" + name_of(i) + "' has the status " + tags::status_code_name(code) +
                   " but no value: give it in --inputs-json (only a Bad input may have none)");
    bool again = false;
    for (const auto& u : updates) again = again || u.tag == def.inputs[i].tag;
    if (again) continue;  // two inputs read one tag: its first value
    tags::SourceUpdate u;
    u.tag = def.inputs[i].tag;
    u.value.value = values[i].value_or(Value());
    u.value.status = code;
    u.value.source_time = now;
    updates.push_back(std::move(u));
  }

  // The state before (the script's `state`) and the previous output (`prev`).
  std::optional<Value> state_before;
  if (!a.state_json.empty()) {
    nlohmann::json j;
    if (!parse_json(a.state_json, "--state-json", &j, &err)) return usage(err);
    if (!j.is_object() && !j.is_array())
      return usage("--state-json: expected a JSON object or array (the script's `state` table)");
    Value v;
    if (!json_values::from_json(j, &v, &err)) return usage("--state-json: " + err);
    state_before = std::move(v);
  }
  std::optional<Value> prev;
  if (!a.prev_json.empty()) {
    nlohmann::json j;
    if (!parse_json(a.prev_json, "--prev-json", &j, &err)) return usage(err);
    // {"value": V, "status": S, "source_time": T} (each optional), or the value itself.
    bool wrapped_form = j.is_object() && !j.empty();
    if (wrapped_form)
      for (auto it = j.begin(); it != j.end(); ++it)
        wrapped_form = wrapped_form &&
                       (it.key() == "value" || it.key() == "status" || it.key() == "source_time");
    tags::StatusCode code = tags::codes::Good;
    DateTime source_time = now;
    nlohmann::json value = j;
    if (wrapped_form) {
      value = j.value("value", nlohmann::json());
      if (j.contains("status") && !parse_status(j["status"], &code))
        return usage("--prev-json: status: expected a StatusCode name or number");
      if (j.contains("source_time")) {
        if (!j["source_time"].is_string() ||
            !parse_datetime(j["source_time"].get<std::string>(), &source_time))
          return usage("--prev-json: source_time: expected an ISO 8601 time");
      }
    }
    Value v;
    if (!json_values::from_json(value, &v, &err)) return usage("--prev-json: " + err);
    // As the engine publishes it: coerced to the tag's type, and no value with a Bad status.
    if (tags::severity(code) == tags::Severity::bad) {
      v = Value();
    } else if (!v.is_nil()) {
      Value coerced;
      std::string reason;
      if (tags::coerce(v, def.type, &coerced, &reason) != tags::codes::Good)
        return usage("--prev-json: value (" + type_name(def.type) + "): " + reason);
      v = std::move(coerced);
    }
    Map m;
    m.push_back({"source_time", Value(source_time.unix_seconds())});
    m.push_back({"status", Value(static_cast<int64_t>(code))});
    m.push_back({"value", std::move(v)});
    prev = Value(std::move(m));
  }

  // A Host of one worker, an engine of our own, and the tag alone, triggered by hand once.
  HostOptions ho;
  ho.shards = 1;
  ho.timeout = std::chrono::milliseconds(a.timeout_ms);
  std::unique_ptr<Host> host;
  if (Error e = Host::create(ho, &host)) {
    std::cerr << "outrun: " << to_string(e.code) << ": " << printable(e.message) << "\n";
    return 3;
  }
  Seen seen;
  tags::TagsOptions to;
  to.clock = [now] { return now; };
  to.real_time_periodic = false;
  to.on_submit = [&](const std::string& id, Inputs* in) {
    if (id != def.id) return;
    {
      std::lock_guard lock(seen.mu);
      seen.submitted = true;
    }
    if (in->empty() || in->back().name != "__c" || !in->back().value.is<Map>()) return;
    auto& ctx = std::get<Map>(in->back().value.v);
    auto put = [&](const char* key, const Value& v) {
      for (auto& e : ctx)
        if (e.key == key) {
          e.value = v;
          return;
        }
      ctx.push_back({key, v});
    };
    if (prev) put("p", *prev);
    if (state_before) put("st", *state_before);
  };
  to.on_result = [&](const std::string& id, const Result& r) {
    if (id != def.id) return;
    std::lock_guard lock(seen.mu);
    seen.has_result = true;
    seen.result = r;
  };
  std::unique_ptr<tags::Engine> engine;
  if (Error e = tags::Engine::create(*host, to, &engine)) {
    std::cerr << "outrun: " << printable(e.message) << "\n";
    return 3;
  }
  if (!updates.empty())
    if (Error e = engine->update(updates, now)) return usage(e.message);
  def.trigger = tags::Trigger{tags::TriggerKind::manual, {}, {}};
  tags::ApplyResult applied;
  const Error apply_error = engine->apply({def}, tags::ApplyOptions{}, &applied);
  if (!applied.errors.empty()) {
    for (const auto& problem : tags::file::describe_errors({}, applied.errors))
      std::cerr << "outrun: " << problem << "\n";
    return 2;
  }
  if (apply_error) {
    std::cerr << "outrun: " << printable(a.file) << ": " << to_string(apply_error.code) << ": "
              << printable(apply_error.message) << "\n";
    return apply_error.code == ErrorCode::unavailable ? 3 : 2;
  }
  if (Error e = engine->trigger(def.id)) return usage(e.message);
  engine->wait_idle(std::chrono::milliseconds(60000));
  tags::TagInfo info;
  if (Error e = engine->info(def.id, &info)) return usage(e.message);
  const tags::DataValue& dv = info.value;

  bool submitted = false, has_result = false;
  Result r;
  {
    std::lock_guard lock(seen.mu);
    submitted = seen.submitted;
    has_result = seen.has_result;
    r = seen.result;
  }

  // How the status was decided (design/tags.md "What a script sees", "Error -> StatusCode").
  auto input_status = [&](std::size_t i) {
    return values[i] || statuses[i] ? statuses[i].value_or(tags::codes::Good)
                                    : tags::codes::BadWaitingForInitialData;
  };
  std::string decision;
  if (!submitted) {
    bool any_written = def.inputs.empty();
    for (std::size_t i = 0; i < def.inputs.size(); ++i)
      any_written = any_written || values[i] || statuses[i];
    if (!any_written) {
      decision =
          "not evaluated: no input has a value (every one is BadWaitingForInitialData); the "
          "engine evaluates the tag when the first one arrives";
    } else {
      std::string why = dv.diagnostics;
      if (why.empty())
        for (std::size_t i = 0; i < def.inputs.size() && why.empty(); ++i)
          if (tags::severity(input_status(i)) == tags::Severity::bad)
            why = "not evaluated: input '" + name_of(i) + "' is " +
                  tags::status_code_name(input_status(i));
      decision = why +
                 "; the script did not run (a Bad input is not evaluated unless "
                 "evaluate_bad_inputs = true) and the tag takes that input's status";
    }
  } else if (!has_result) {
    decision = "evaluated, but no result came back";
  } else if (r.status != Status::ok) {
    decision = "the script ended " + std::string(to_string(r.status)) + ": " +
               tags::status_code_name(tags::status_code_for(r.status));
  } else {
    const bool wrapped = r.value.is<Map>() && map_field(r.value, "\0v"sv) != nullptr;
    const Value* s = wrapped ? map_field(r.value, "\0s"sv) : nullptr;
    if (s != nullptr && !s->is_nil()) {
      decision = "evaluated; the script returned its status: " +
                 (s->is<std::string>() ? s->as<std::string>() : to_display_string(*s));
    } else {
      int worst = 0;
      std::size_t which = 0;
      for (std::size_t i = 0; i < def.inputs.size(); ++i) {
        const int sev = static_cast<int>(tags::severity(input_status(i)));
        if (sev > worst) {
          worst = sev;
          which = i;
        }
      }
      decision = worst == 0 ? "evaluated; every input is Good: Good"
                            : "evaluated; the worst input's status: '" + name_of(which) + "' is " +
                                  tags::status_code_name(input_status(which));
    }
    if (!dv.diagnostics.empty())
      decision += "; the result was refused: " + tags::status_code_name(dv.status) + " (" +
                  dv.diagnostics + ")";
  }

  // The state after: what the script left in `state`, returned with the result (keep_state).
  std::optional<Value> state_after;
  std::string state_note;
  if (!def.keep_state) {
    state_note = "not returned: keep_state = false (the state stays in the worker)";
  } else if (has_result && r.status == Status::ok) {
    if (const Value* st = map_field(r.value, "\0st"sv)) state_after = *st;
    if (info.counters.last_error.starts_with("state is larger"))
      state_note = info.counters.last_error;
  } else {
    state_note = submitted ? "none: the evaluation failed" : "none: the script did not run";
  }

  const int rc = tags::severity(dv.status) == tags::Severity::good ? 0 : 1;
  if (a.json) {
    nlohmann::ordered_json j = tags::file::change_to_json(def.id, dv);
    j.erase("error");
    j["type"] = type_name(def.type);
    j["diagnostics"] =
        dv.diagnostics.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(dv.diagnostics);
    j["evaluated"] = submitted;
    j["decision"] = decision;
    j["outrun_status"] =
        has_result ? nlohmann::ordered_json(to_string(r.status)) : nlohmann::ordered_json();
    nlohmann::ordered_json ins = nlohmann::ordered_json::object();
    for (std::size_t i = 0; i < def.inputs.size(); ++i) {
      nlohmann::ordered_json in;
      in["tag"] = def.inputs[i].tag;
      in["value"] = values[i] ? json_values::to_json(*values[i]) : nlohmann::json();
      in["status"] = tags::status_code_name(input_status(i));
      ins[name_of(i)] = std::move(in);
    }
    j["inputs"] = std::move(ins);
    nlohmann::ordered_json logs = nlohmann::ordered_json::array();
    for (const auto& l : r.logs) logs.push_back({{"level", to_string(l.level)}, {"text", l.text}});
    j["logs"] = std::move(logs);
    j["logs_dropped"] = r.logs_dropped;
    j["state_after"] = state_after ? nlohmann::ordered_json(json_values::to_json(*state_after))
                                   : nlohmann::ordered_json();
    if (!state_note.empty()) j["state_note"] = state_note;
    std::cout << dump(j) << "\n";
    return rc;
  }
  std::cout << "tag: " << printable(def.id) << "\n";
  for (std::size_t i = 0; i < def.inputs.size(); ++i)
    std::cout << "input: " << printable(name_of(i)) << " = "
              << (values[i] ? printable(to_display_string(*values[i])) : std::string("(none)"))
              << "  " << tags::status_code_name(input_status(i)) << "\n";
  std::cout << "evaluated: " << (submitted ? "yes" : "no") << "\n";
  std::cout << "decision: " << printable(decision) << "\n";
  std::cout << "value: "
            << (dv.value.is_nil()
                    ? std::string("(none)")
                    : printable(to_display_string(dv.value)) + " (" + type_name(def.type) + ")")
            << "\n";
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%08X", dv.status);
  std::cout << "status: " << tags::status_code_name(dv.status) << " (" << hex << ")\n";
  auto time = [](DateTime t) { return t.ticks == 0 ? std::string("(none)") : format_datetime(t); };
  std::cout << "source time: " << time(dv.source_time) << "\n";
  std::cout << "server time: " << time(dv.server_time) << "\n";
  std::cout << "diagnostics: " << (dv.diagnostics.empty() ? "(none)" : printable(dv.diagnostics))
            << "\n";
  for (const auto& l : r.logs)
    std::cout << "log: [" << to_string(l.level) << "] " << printable(l.text) << "\n";
  if (r.logs_dropped > 0) std::cout << "log: " << r.logs_dropped << " more lines dropped\n";
  std::cout << "state after: "
            << (state_after ? printable(dump(json_values::to_json(*state_after)))
                            : printable(state_note))
            << (state_after && !state_note.empty() ? "  (" + printable(state_note) + ")" : "")
            << "\n";
  return rc;
}

}  // namespace

void add_tags_test_command(CLI::App& tags_cmd, int* rc) {
  auto args = std::make_shared<TagsTestArgs>();
  auto* test = tags_cmd.add_subcommand(
      "test",
      "offline: run one tag's script once, in a worker, with the given inputs; print the "
      "DataValue, how its status was decided, the log lines and the state after (exit 0: Good, "
      "1: not Good, 2: bad usage, 3: the worker did not start)");
  test->add_option("-f,--file", args->file, "tags file (TOML) that defines the tag")->required();
  test->add_option("id", args->id, "the tag to run (only it: its inputs come from the flags)")
      ->required();
  test->add_option("--inputs-json", args->inputs_json,
                   "the inputs' values: {\"INPUT\": value}, INPUT an input's name or tag id; "
                   "typed as the file's tag or [[source]] it names; an input not given is "
                   "BadWaitingForInitialData");
  test->add_option("--status-json", args->status_json,
                   "the inputs' StatusCodes: {\"INPUT\": \"UncertainLastUsableValue\" or a "
                   "number} (default Good; a Bad input may have no value)");
  test->add_option("--state-json", args->state_json,
                   "the script's `state` before the run (a JSON object or array; default {})");
  test->add_option("--prev-json", args->prev_json,
                   "the tag's previous output, `prev`: {\"value\": V, \"status\": S, "
                   "\"source_time\": ISO8601} or the value alone (default: none, prev is nil)");
  test->add_option("--now", args->now,
                   "the evaluation's time, ISO 8601 (`now`, the server and the inputs' source "
                   "timestamps; default: the wall clock)");
  test->add_flag("--json", args->json, "print one JSON object");
  test->add_option("--timeout", args->timeout_ms, "soft timeout T of the evaluation, ms")
      ->check(CLI::Range(1, 3600000))
      ->capture_default_str();
  test->callback([args, rc] { *rc = run_tags_test(*args); });
}

}  // namespace outrun::cli

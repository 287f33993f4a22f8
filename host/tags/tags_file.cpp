#include "tags_file.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "json_values.h"

namespace outrun::tags::file {

namespace {

struct Reader {
  // Every error, in file order: the position ("LINE:COL") and the message.
  std::vector<std::pair<std::string, std::string>> errs;
  bool fail(const toml::node& n, std::string msg) {
    const auto& src = n.source();
    errs.emplace_back(std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column),
                      std::move(msg));
    return false;
  }

  bool string(const toml::node& n, std::string_view key, std::string* out) {
    auto v = n.value<std::string>();
    if (!v) return fail(n, std::string(key) + ": expected a string");
    *out = *v;
    return true;
  }
  bool boolean(const toml::node& n, std::string_view key, bool* out) {
    if (!n.is_boolean()) return fail(n, std::string(key) + ": expected true or false");
    *out = *n.value<bool>();
    return true;
  }
  bool number(const toml::node& n, std::string_view key, double* out) {
    if (!n.is_number()) return fail(n, std::string(key) + ": expected a number");
    *out = *n.value<double>();
    if (!std::isfinite(*out)) return fail(n, std::string(key) + ": expected a finite number");
    return true;
  }
  bool ms(const toml::node& n, std::string_view key, int64_t lo, std::chrono::milliseconds* out) {
    auto v = n.value<int64_t>();
    if (!n.is_integer() || !v || *v < lo || *v > 86'400'000LL * 365)
      return fail(
          n, std::string(key) + ": expected milliseconds, an integer >= " + std::to_string(lo));
    *out = std::chrono::milliseconds(*v);
    return true;
  }

  bool type(const toml::node& n, TypeSpec* out) {
    std::string s;
    if (!string(n, "type", &s)) return false;
    out->array = false;
    if (s.size() > 2 && s.compare(s.size() - 2, 2, "[]") == 0) {
      out->array = true;
      s.resize(s.size() - 2);
    }
    if (!parse_data_type(s, &out->type))
      return fail(
          n, "type: unknown DataType '" + s +
                 "' (Boolean, SByte, Byte, Int16, UInt16, Int32, UInt32, Int64, UInt64, Float, "
                 "Double, String, DateTime, ByteString, Variant; '[]' for an array)");
    return true;
  }

  bool trigger(const toml::node& n, TriggerKind* out) {
    std::string s;
    if (!string(n, "trigger", &s)) return false;
    if (s == "on_change")
      *out = TriggerKind::on_change;
    else if (s == "periodic")
      *out = TriggerKind::periodic;
    else if (s == "on_read")
      *out = TriggerKind::on_read;
    else if (s == "manual")
      *out = TriggerKind::manual;
    else
      return fail(n, "trigger: expected on_change, periodic, on_read or manual");
    return true;
  }

  bool timestamps(const toml::node& n, TimestampPolicy* out) {
    std::string s;
    if (!string(n, "timestamps", &s)) return false;
    if (s == "newest_input")
      *out = TimestampPolicy::newest_input;
    else if (s == "triggering_input")
      *out = TimestampPolicy::triggering_input;
    else if (s == "evaluation_time")
      *out = TimestampPolicy::evaluation_time;
    else
      return fail(n, "timestamps: expected newest_input, triggering_input or evaluation_time");
    return true;
  }

  bool input(const toml::node& n, InputSpec* out) {
    if (auto s = n.value<std::string>(); n.is_string()) {
      out->tag = *s;
      return true;
    }
    const toml::table* t = n.as_table();
    if (t == nullptr) return fail(n, "inputs: each input is a tag id or a table {tag = ..., ...}");
    bool has_tag = false;
    for (const auto& [k, v] : *t) {
      const std::string_view key = k.str();
      if (key == "tag") {
        if (!string(v, key, &out->tag)) return false;
        has_tag = true;
      } else if (key == "name") {
        if (!string(v, key, &out->name)) return false;
      } else if (key == "trigger") {
        if (!boolean(v, key, &out->trigger)) return false;
      } else if (key == "deadband") {
        if (!number(v, key, &out->deadband_value)) return false;
        out->deadband = DeadbandKind::absolute;
      } else if (key == "deadband_percent") {
        if (!number(v, key, &out->deadband_value)) return false;
        out->deadband = DeadbandKind::percent;
      } else if (key == "range") {
        const toml::array* a = v.as_array();
        if (a == nullptr || a->size() != 2 || !(*a)[0].is_number() || !(*a)[1].is_number())
          return fail(v, "range: expected [low, high]");
        out->range_low = *(*a)[0].value<double>();
        out->range_high = *(*a)[1].value<double>();
      } else {
        return fail(v, "inputs: unknown key '" + std::string(key) +
                           "' (tag, name, trigger, deadband, deadband_percent, range)");
      }
    }
    if (!has_tag) return fail(n, "inputs: an input table needs `tag`");
    return true;
  }

  // Keys shared by [defaults] and [[tag]].
  bool common(std::string_view key, const toml::node& v, TagDefinition* d, bool* known) {
    *known = true;
    if (key == "type") return type(v, &d->type);
    if (key == "trigger") return trigger(v, &d->trigger.kind);
    if (key == "period_ms") return ms(v, key, 1, &d->trigger.period);
    if (key == "max_age_ms") return ms(v, key, 0, &d->trigger.max_age);
    if (key == "timestamps") return timestamps(v, &d->timestamps);
    if (key == "keep_state") return boolean(v, key, &d->keep_state);
    if (key == "last_usable_ms") return ms(v, key, 0, &d->last_usable);
    if (key == "max_state_bytes") {
      auto x = v.value<int64_t>();
      if (!v.is_integer() || *x < 0 || *x > (8 << 20))
        return fail(v, "max_state_bytes: expected 0..8388608");
      d->max_state_bytes = static_cast<std::size_t>(*x);
      return true;
    }
    *known = false;
    return true;
  }
};

bool read_file(const std::string& path, std::size_t limit, std::string* out, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot open '" + path + "'";
    return false;
  }
  std::ostringstream ss;
  char buf[65536];
  std::size_t total = 0;
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    total += static_cast<std::size_t>(in.gcount());
    if (total > limit) {
      *error = "'" + path + "' is larger than " + std::to_string(limit) + " bytes";
      return false;
    }
    ss.write(buf, in.gcount());
  }
  *out = ss.str();
  return true;
}

bool numeric(DataType t) {
  return t != DataType::Boolean && t != DataType::String && t != DataType::DateTime &&
         t != DataType::ByteString && t != DataType::Variant;
}

bool integral(DataType t) {
  return numeric(t) && t != DataType::Float && t != DataType::Double;
}

// A declared initial value of one element of `type` as JSON; false (with *why) when it does not
// fit the type.
bool initial_element(const toml::node& n, DataType type, nlohmann::ordered_json* out,
                     std::string* why) {
  if (type == DataType::Boolean) {
    if (!n.is_boolean()) return *why = "expected true or false for a Boolean source", false;
    *out = *n.value<bool>();
    return true;
  }
  if (type == DataType::String) {
    if (!n.is_string()) return *why = "expected a string for a String source", false;
    *out = *n.value<std::string>();
    return true;
  }
  if (!numeric(type))
    return *why = "an initial value is not supported for " + std::string(to_string(type)), false;
  if (integral(type)) {
    if (!n.is_integer())
      return *why = "expected an integer for " + std::string(to_string(type)), false;
    Value v(*n.value<int64_t>()), coerced;
    std::string reason;
    if (coerce(v, TypeSpec{type, false}, &coerced, &reason) != 0)
      return *why = std::to_string(*n.value<int64_t>()) + " is outside " +
                    std::string(to_string(type)) + "'s range",
             false;
    *out = *n.value<int64_t>();
    return true;
  }
  if (!n.is_number()) return *why = "expected a number for " + std::string(to_string(type)), false;
  const double d = *n.value<double>();
  if (!std::isfinite(d)) return *why = "expected a finite number", false;
  *out = d;
  return true;
}

bool declared_id(Reader& r, const toml::node& v, const char* what, std::string* out) {
  if (!r.string(v, "id", out)) return false;
  if (out->empty() || out->size() > kMaxTagIdSize)
    return r.fail(v, std::string(what) + " id: 1 to " + std::to_string(kMaxTagIdSize) + " bytes");
  for (unsigned char ch : *out)
    if (ch < 0x20 || ch == 0x7f) return r.fail(v, std::string(what) + " id: control character");
  return true;
}

// [[source]] tables: errors go to `r` (errors of the file as a whole).
void read_sources(Reader& r, const toml::array& arr, const std::set<std::string>& tag_ids,
                  Declarations* out) {
  std::set<std::string> seen;
  for (const auto& n : arr) {
    const toml::table* t = n.as_table();
    if (t == nullptr) {
      r.fail(n, "source: expected [[source]] tables");
      continue;
    }
    nlohmann::ordered_json j;
    std::string id;
    TypeSpec type;  // Double when not given (an undeclared source's type)
    const toml::node* initial = nullptr;
    const toml::node* range = nullptr;
    bool has_id = false, writable = true;
    std::string description;
    for (const auto& [k, v] : *t) {
      const std::string_view key = k.str();
      if (key == "id") {
        has_id = declared_id(r, v, "source", &id);
      } else if (key == "type") {
        r.type(v, &type);
      } else if (key == "eu_range") {
        range = &v;
      } else if (key == "initial") {
        initial = &v;
      } else if (key == "writable") {
        r.boolean(v, key, &writable);
      } else if (key == "description") {
        r.string(v, key, &description);
      } else {
        r.fail(v, "source: unknown key '" + std::string(key) +
                      "' (id, type, eu_range, initial, writable, description)");
      }
    }
    if (!has_id) {
      if (t->get("id") == nullptr) r.fail(n, "a source needs an `id`");
      continue;
    }
    if (tag_ids.count(id))
      r.fail(n, "source '" + id +
                    "' is also a [[tag]]: a virtual tag is "
                    "computed, not written");
    if (!seen.insert(id).second) r.fail(n, "source '" + id + "' is declared twice");
    j["id"] = id;
    j["type"] = std::string(to_string(type.type)) + (type.array ? "[]" : "");
    if (range != nullptr) {
      const toml::array* a = range->as_array();
      if (a == nullptr || a->size() != 2 || !(*a)[0].is_number() || !(*a)[1].is_number()) {
        r.fail(*range, "eu_range: expected [low, high]");
      } else {
        const double lo = *(*a)[0].value<double>(), hi = *(*a)[1].value<double>();
        if (!numeric(type.type))
          r.fail(*range,
                 "eu_range: only for a numeric type, not " + std::string(to_string(type.type)));
        else if (!std::isfinite(lo) || !std::isfinite(hi) || !(lo < hi))
          r.fail(*range, "eu_range: expected finite numbers with low < high");
        else
          j["eu_range"] = {lo, hi};
      }
    }
    if (initial != nullptr) {
      std::string why;
      nlohmann::ordered_json val;
      bool ok = true;
      if (type.array) {
        const toml::array* a = initial->as_array();
        if (a == nullptr) {
          ok = false;
          why = "expected an array for an array source";
        } else {
          val = nlohmann::ordered_json::array();
          for (const auto& e : *a) {
            nlohmann::ordered_json x;
            if (!(ok = initial_element(e, type.type, &x, &why))) break;
            val.push_back(std::move(x));
          }
        }
      } else {
        ok = initial_element(*initial, type.type, &val, &why);
      }
      if (ok && j.contains("eu_range")) {
        const double lo = j["eu_range"][0], hi = j["eu_range"][1];
        auto outside = [&](const nlohmann::ordered_json& x) {
          return x.is_number() && (x.get<double>() < lo || x.get<double>() > hi);
        };
        bool any = val.is_array() ? std::any_of(val.begin(), val.end(), outside) : outside(val);
        if (any) {
          ok = false;
          why = "outside eu_range";
        }
      }
      if (!ok)
        r.fail(*initial, "source '" + id + "': initial: " + why);
      else
        j["initial"] = std::move(val);
    }
    j["writable"] = writable;
    if (!description.empty()) j["description"] = description;
    out->sources.push_back(std::move(j));
  }
}

// [[alarm]] tables on the text's tags and sources.
void read_alarms(Reader& r, const toml::array& arr, const std::set<std::string>& known,
                 const std::set<std::string>& boolean_ids, Declarations* out) {
  std::set<std::string> seen;
  static constexpr const char* kLimits[] = {"high_high", "high", "low", "low_low"};
  for (const auto& n : arr) {
    const toml::table* t = n.as_table();
    if (t == nullptr) {
      r.fail(n, "alarm: expected [[alarm]] tables");
      continue;
    }
    nlohmann::ordered_json j;
    std::string id, tag, kind, message;
    bool has_id = false, has_tag = false, has_normal = false, normal = false;
    int64_t severity = 500;
    std::chrono::milliseconds max_shelved{3'600'000};
    std::map<std::string, double> limits;
    for (const auto& [k, v] : *t) {
      const std::string key(k.str());
      if (key == "id") {
        has_id = declared_id(r, v, "alarm", &id);
      } else if (key == "tag") {
        has_tag = r.string(v, key, &tag);
      } else if (key == "kind") {
        if (r.string(v, key, &kind) && kind != "limit" && kind != "off_normal")
          r.fail(v, "kind: expected limit or off_normal");
      } else if (key == "high_high" || key == "high" || key == "low" || key == "low_low") {
        double x;
        if (r.number(v, key, &x)) limits[key] = x;
      } else if (key == "normal") {
        has_normal = r.boolean(v, key, &normal);
      } else if (key == "severity") {
        if (!v.is_integer() || *v.value<int64_t>() < 1 || *v.value<int64_t>() > 1000)
          r.fail(v, "severity: expected an integer 1..1000");
        else
          severity = *v.value<int64_t>();
      } else if (key == "message") {
        r.string(v, key, &message);
      } else if (key == "max_shelved_ms") {
        r.ms(v, key, 10, &max_shelved);
      } else {
        r.fail(v, "alarm: unknown key '" + key +
                      "' (id, tag, kind, high_high, high, low, low_low, normal, severity, "
                      "message, max_shelved_ms)");
      }
    }
    if (!has_id) {
      if (t->get("id") == nullptr) r.fail(n, "an alarm needs an `id`");
      continue;
    }
    if (!seen.insert(id).second) r.fail(n, "alarm '" + id + "' is declared twice");
    if (!has_tag) {
      if (t->get("tag") == nullptr) r.fail(n, "alarm '" + id + "' needs a `tag`");
      continue;
    }
    if (!known.count(tag))
      r.fail(n, "alarm '" + id + "': tag '" + tag + "' is not a tag, a source or an input here");
    if (kind.empty()) kind = limits.empty() ? "off_normal" : "limit";
    if (kind == "limit") {
      if (limits.empty())
        r.fail(n, "alarm '" + id + "': a limit alarm needs high_high, high, low or low_low");
      if (has_normal) r.fail(n, "alarm '" + id + "': normal is for an off_normal alarm");
      if (boolean_ids.count(tag))
        r.fail(n,
               "alarm '" + id + "': a limit alarm needs a numeric tag, '" + tag + "' is Boolean");
      // low_low <= low <= high <= high_high, for those given.
      double last = -INFINITY;
      const char* last_name = nullptr;
      for (const char* name : {"low_low", "low", "high", "high_high"}) {
        auto it = limits.find(name);
        if (it == limits.end()) continue;
        if (it->second < last) r.fail(n, "alarm '" + id + "': " + name + " is below " + last_name);
        last = it->second;
        last_name = name;
      }
    } else if (!limits.empty()) {
      r.fail(n, "alarm '" + id + "': limits are for a limit alarm, not off_normal");
    }
    j["id"] = id;
    j["tag"] = tag;
    j["kind"] = kind;
    for (const char* name : kLimits)
      if (limits.count(name)) j[name] = limits[name];
    if (kind == "off_normal") j["normal"] = normal;
    j["severity"] = severity;
    if (!message.empty()) j["message"] = message;
    j["max_shelved_ms"] = max_shelved.count();
    out->alarms.push_back(std::move(j));
  }
}

constexpr std::string_view kTagKeys =
    "id, script, script_file, inputs, type, trigger, period_ms, max_age_ms, timestamps, "
    "keep_state, reset_state, max_state_bytes, last_usable_ms, evaluate_bad_inputs, every_update, "
    "description";

}  // namespace

namespace {

// The line of `text` where a string value that starts at (line, column) has its first character:
// a multi-line string's opening quotes followed by a newline start it on the next line.
// `line_starts`: the offset of each line (made once per text: looking each script's line up from
// the start made a file of 100,000 tags take minutes).
int first_content_line(std::string_view text, const std::vector<std::size_t>& line_starts,
                       const toml::source_position& pos) {
  if (pos.line == 0 || pos.line > line_starts.size()) return static_cast<int>(pos.line);
  std::size_t off = line_starts[pos.line - 1];
  off += pos.column > 0 ? pos.column - 1 : 0;
  if (off + 3 <= text.size()) {
    const std::string_view q = text.substr(off, 3);
    if (q == "'''" || q == "\"\"\"") {
      std::size_t after = off + 3;
      if (after < text.size() && text[after] == '\r') ++after;
      if (after < text.size() && text[after] == '\n') return static_cast<int>(pos.line) + 1;
    }
  }
  return static_cast<int>(pos.line);
}

std::string with_origin(std::string_view origin, const std::string& pos) {
  return origin.empty() ? pos : std::string(origin) + ":" + pos;
}

}  // namespace

bool parse_tags(std::string_view text, const std::string& base_dir, std::string_view origin,
                std::vector<TagDefinition>* out, std::vector<std::string>* file_errors,
                std::size_t max_tags, Declarations* decls) {
  out->clear();
  file_errors->clear();
  const std::string name = origin.empty() ? "" : std::string(origin) + ": ";
  if (text.size() > kMaxTagsFileBytes) {
    file_errors->push_back(name + "the tags file is larger than " +
                           std::to_string(kMaxTagsFileBytes) + " bytes");
    return false;
  }
  toml::table root;
  try {
    root = toml::parse(text, std::string_view("tags"));
  } catch (const toml::parse_error& e) {
    file_errors->push_back(with_origin(origin, std::to_string(e.source().begin.line) + ":" +
                                                   std::to_string(e.source().begin.column)) +
                           ": " + std::string(e.description()));
    return false;
  }
  // Outside [[tag]]: errors of the file as a whole (every one is reported, nothing is defined).
  Reader r;
  TagDefinition defaults;
  for (const auto& [k, v] : root) {
    const std::string_view key = k.str();
    if (key == "defaults") {
      const toml::table* t = v.as_table();
      if (t == nullptr) {
        r.fail(v, "defaults: expected a table");
        continue;
      }
      for (const auto& [dk, dv] : *t) {
        bool known = false;
        if (!r.common(dk.str(), dv, &defaults, &known)) continue;
        if (!known) r.fail(dv, "defaults: unknown key '" + std::string(dk.str()) + "'");
      }
    } else if (key != "tag" && key != "source" && key != "alarm") {
      r.fail(v, "unknown top-level key '" + std::string(key) + "' (defaults, tag, source, alarm)");
    }
  }
  const toml::node* tags_node = root.get("tag");
  const toml::array* tags = tags_node != nullptr ? tags_node->as_array() : nullptr;
  if (tags_node != nullptr && tags == nullptr) r.fail(*tags_node, "tag: expected [[tag]] tables");
  if (tags != nullptr)
    for (const auto& tn : *tags)
      if (tn.as_table() == nullptr) r.fail(tn, "tag: expected [[tag]] tables");
  // [[source]] and [[alarm]]: checked against the text's tags (ids as written; a broken [[tag]]
  // still names its id).
  const toml::node* sources_node = root.get("source");
  const toml::node* alarms_node = root.get("alarm");
  if (sources_node != nullptr || alarms_node != nullptr) {
    std::set<std::string> tag_ids, known, boolean_ids;
    if (tags != nullptr)
      for (const auto& tn : *tags) {
        const toml::table* t = tn.as_table();
        if (t == nullptr) continue;
        std::string id = t->get("id") ? t->get("id")->value_or(std::string()) : std::string();
        const std::string ty =
            t->get("type") ? t->get("type")->value_or(std::string()) : std::string();
        if (!id.empty()) {
          tag_ids.insert(id);
          known.insert(id);
          if (ty == "Boolean") boolean_ids.insert(id);
        }
        if (const toml::array* ins = t->get("inputs") ? t->get("inputs")->as_array() : nullptr)
          for (const auto& in : *ins) {
            if (in.is_string())
              known.insert(*in.value<std::string>());
            else if (const toml::table* it = in.as_table(); it && it->get("tag"))
              known.insert(it->get("tag")->value_or(std::string()));
          }
      }
    Declarations local;
    Declarations* d = decls != nullptr ? decls : &local;
    *d = Declarations{};
    for (const auto& [node, what] : {std::pair{sources_node, "source"}, {alarms_node, "alarm"}}) {
      if (node == nullptr) continue;
      const toml::array* a = node->as_array();
      if (a == nullptr) {
        r.fail(*node, std::string(what) + ": expected [[" + what + "]] tables");
        continue;
      }
      if (a->size() > kMaxDeclarations) {
        r.fail(*node, std::to_string(a->size()) + " [[" + what + "]] tables, more than " +
                          std::to_string(kMaxDeclarations));
        continue;
      }
      if (node == sources_node) {
        read_sources(r, *a, tag_ids, d);
        for (const auto& s : d->sources) {
          known.insert(s["id"].get<std::string>());
          if (s["type"] == "Boolean") boolean_ids.insert(s["id"].get<std::string>());
        }
      } else {
        read_alarms(r, *a, known, boolean_ids, d);
      }
    }
  } else if (decls != nullptr) {
    *decls = Declarations{};
  }
  if (!r.errs.empty()) {
    for (const auto& [pos, msg] : r.errs)
      file_errors->push_back(with_origin(origin, pos) + ": " + msg);
    return false;
  }
  if (tags == nullptr) return true;  // an empty set
  if (tags->size() > max_tags) {
    file_errors->push_back(name + std::to_string(tags->size()) + " [[tag]] tables, more than " +
                           std::to_string(max_tags) + " in one text");
    return false;
  }
  std::vector<std::size_t> line_starts{0};
  for (std::size_t i = 0; i < text.size(); ++i)
    if (text[i] == '\n') line_starts.push_back(i + 1);
  // Each [[tag]]: its errors make it a broken definition (config_error), the others go on.
  for (const auto& tn : *tags) {
    const toml::table* t = tn.as_table();
    Reader tr;
    TagDefinition d = defaults;
    const auto& tpos = tn.source().begin;
    d.location = with_origin(origin, std::to_string(tpos.line) + ":" + std::to_string(tpos.column));
    bool has_id = false, has_script = false;
    for (const auto& [k, v] : *t) {
      const std::string_view key = k.str();
      bool known = false;
      if (key == "id") {
        if (tr.string(v, key, &d.id)) has_id = true;
      } else if (key == "script") {
        if (has_script) {
          tr.fail(v, "script and script_file are exclusive");
        } else if (tr.string(v, key, &d.script)) {
          has_script = true;
          d.script_origin = std::string(origin);
          d.script_line = first_content_line(text, line_starts, v.source().begin);
        }
      } else if (key == "script_file") {
        std::string p;
        if (!tr.string(v, key, &p)) continue;
        if (has_script) {
          tr.fail(v, "script and script_file are exclusive");
          continue;
        }
        if (base_dir.empty()) {
          tr.fail(v, "script_file is not allowed here (give the script inline)");
          continue;
        }
        std::string why;
        const std::string path = p.size() && p[0] == '/' ? p : base_dir + "/" + p;
        if (!read_file(path, kMaxSourceSize, &d.script, &why)) {
          tr.fail(v, "script_file: " + why);
          continue;
        }
        has_script = true;
        d.script_origin = path;
        d.script_line = 1;
      } else if (key == "inputs") {
        const toml::array* a = v.as_array();
        if (a == nullptr) {
          tr.fail(v, "inputs: expected an array");
          continue;
        }
        d.inputs.clear();
        for (const auto& in : *a) {
          InputSpec spec;
          if (tr.input(in, &spec)) d.inputs.push_back(std::move(spec));
        }
      } else if (key == "reset_state") {
        tr.boolean(v, key, &d.reset_state);
      } else if (key == "evaluate_bad_inputs") {
        tr.boolean(v, key, &d.evaluate_bad_inputs);
      } else if (key == "every_update") {
        tr.boolean(v, key, &d.every_update);
      } else if (key == "description") {
        std::string ignored;
        tr.string(v, key, &ignored);
      } else if (!tr.common(key, v, &d, &known)) {
        continue;
      } else if (!known) {
        tr.fail(v, "unknown key '" + std::string(key) + "' (" + std::string(kTagKeys) + ")");
      }
    }
    if (!has_id) tr.fail(tn, "a tag needs an `id`");
    if (!has_script) tr.fail(tn, "tag '" + d.id + "' needs a `script` or `script_file`");
    if (!tr.errs.empty()) {
      // Where the first problem is, and every problem in the message.
      d.location = with_origin(origin, tr.errs.front().first);
      d.config_error = tr.errs.front().second;
      for (std::size_t i = 1; i < tr.errs.size(); ++i)
        d.config_error += "; also " + tr.errs[i].first + ": " + tr.errs[i].second;
      if (!has_id) d.id.clear();
    }
    out->push_back(std::move(d));
  }
  return true;
}

bool parse_tags(std::string_view text, const std::string& base_dir, std::vector<TagDefinition>* out,
                std::string* error) {
  std::vector<std::string> file_errors;
  if (!parse_tags(text, base_dir, "", out, &file_errors)) {
    *error = file_errors.empty() ? "the tags file could not be read" : file_errors.front();
    return false;
  }
  std::set<std::string> seen;
  for (const auto& d : *out) {
    if (!d.config_error.empty()) {
      *error = d.location + ": " + d.config_error;
      out->clear();
      return false;
    }
    if (!seen.insert(d.id).second) {
      *error = d.location + ": tag '" + d.id + "' is defined twice";
      out->clear();
      return false;
    }
  }
  return true;
}

bool load_tags_file(const std::string& path, std::vector<TagDefinition>* out,
                    std::vector<std::string>* file_errors, Declarations* decls) {
  std::string text, why;
  out->clear();
  file_errors->clear();
  if (!read_file(path, kMaxTagsFileBytes, &text, &why)) {
    file_errors->push_back(why);
    return false;
  }
  std::string dir = ".";
  if (auto p = path.rfind('/'); p != std::string::npos) dir = p == 0 ? "/" : path.substr(0, p);
  return parse_tags(text, dir, path, out, file_errors, SIZE_MAX, decls);
}

void Declarations::merge(const Declarations& more) {
  for (auto [mine, theirs] : {std::pair{&sources, &more.sources}, {&alarms, &more.alarms}})
    for (const auto& d : *theirs) {
      auto same = std::find_if(mine->begin(), mine->end(),
                               [&](const nlohmann::ordered_json& x) { return x["id"] == d["id"]; });
      if (same != mine->end())
        *same = d;
      else
        mine->push_back(d);
    }
}

bool load_tags_file(const std::string& path, std::vector<TagDefinition>* out, std::string* error) {
  std::string text;
  if (!read_file(path, kMaxTagsFileBytes, &text, error)) return false;
  std::string dir = ".";
  if (auto p = path.rfind('/'); p != std::string::npos) dir = p == 0 ? "/" : path.substr(0, p);
  if (!parse_tags(text, dir, out, error)) {
    *error = path + ":" + *error;
    return false;
  }
  return true;
}

namespace {

bool time_field(const nlohmann::json& j, const char* what, DateTime* out, std::string* error) {
  if (j.is_string()) {
    bool outside = false;
    if (!parse_datetime(j.get_ref<const std::string&>(), out, &outside)) {
      *error = std::string(what) + (outside ? ": outside DateTime's range (1601..9999)"
                                            : ": expected an ISO 8601 time such as "
                                              "2026-12-01T10:00:00.000Z");
      return false;
    }
    return true;
  }
  if (j.is_number()) {  // seconds since 1970
    const double s = j.get<double>();
    if (!(s > -11644473600.0 && s < 253402300799.0)) {
      *error = std::string(what) + ": out of range";
      return false;
    }
    *out = DateTime::from_unix_seconds(s);
    return true;
  }
  *error = std::string(what) + ": expected an ISO 8601 string or seconds since 1970";
  return false;
}

bool id_list(const nlohmann::json& j, const char* what, std::vector<std::string>* out,
             std::string* error) {
  if (!j.is_array()) {
    *error = std::string(what) + ": expected an array of tag ids";
    return false;
  }
  for (const auto& e : j) {
    if (!e.is_string()) {
      *error = std::string(what) + ": expected an array of tag ids";
      return false;
    }
    out->push_back(e.get<std::string>());
  }
  return true;
}

}  // namespace

bool parse_wave(std::string_view line, Wave* out, std::string* error) {
  *out = Wave();
  if (line.size() > kMaxUpdateLineBytes) {
    *error = "the line is longer than " + std::to_string(kMaxUpdateLineBytes) + " bytes";
    return false;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e999
    *error = std::string("not JSON: ") + e.what();
    return false;
  }
  if (!j.is_object()) {
    *error = "expected a JSON object {\"t\": ..., \"values\": {...}}";
    return false;
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key == "t") {
      if (!time_field(*it, "t", &out->time, error)) return false;
      out->has_time = true;
    } else if (key == "values") {
      if (!it->is_object()) {
        *error = "values: expected an object {\"TAG\": value or {\"value\": ..., \"status\": ...}}";
        return false;
      }
      for (auto v = it->begin(); v != it->end(); ++v) {
        SourceUpdate u;
        u.tag = v.key();
        u.value.status = codes::Good;
        const nlohmann::json* value = &*v;
        if (v->is_object() && (v->contains("value") || v->contains("status"))) {
          for (auto f = v->begin(); f != v->end(); ++f) {
            if (f.key() == "value") {
              value = &*f;
            } else if (f.key() == "status") {
              bool ok = false;
              if (f->is_string())
                ok = parse_status_code(f->get_ref<const std::string&>(), &u.value.status);
              else if (f->is_number_unsigned() && f->get<uint64_t>() <= UINT32_MAX) {
                u.value.status = static_cast<StatusCode>(f->get<uint64_t>());
                ok = true;
              }
              if (!ok) {
                *error =
                    "values." + u.tag +
                    ".status: expected a StatusCode name (Good, BadSensorFailure, ...) or number";
                return false;
              }
            } else if (f.key() == "source_time") {
              if (!time_field(*f, ("values." + u.tag + ".source_time").c_str(),
                              &u.value.source_time, error))
                return false;
            } else {
              *error = "values." + u.tag + ": unknown key '" + f.key() +
                       "' (value, status, source_time)";
              return false;
            }
          }
          if (!v->contains("value")) value = nullptr;
        }
        if (value != nullptr) {
          std::string why;
          if (!json_values::from_json(*value, &u.value.value, &why)) {
            *error = "values." + u.tag + ": " + why;
            return false;
          }
        }
        out->updates.push_back(std::move(u));
      }
    } else if (key == "trigger") {
      if (!id_list(*it, "trigger", &out->triggers, error)) return false;
    } else if (key == "read") {
      if (!id_list(*it, "read", &out->reads, error)) return false;
    } else {
      *error = "unknown key '" + key + "' (t, values, trigger, read)";
      return false;
    }
  }
  return true;
}

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::vector<std::string> describe_errors(const std::vector<std::string>& file_errors,
                                         const std::vector<DefinitionError>& errors) {
  std::vector<std::string> out;
  out.reserve(file_errors.size() + errors.size());
  for (const auto& e : file_errors) out.push_back(printable(e));
  for (const auto& e : errors)
    out.push_back(printable(e.location.empty() ? e.message : e.location + ": " + e.message));
  return out;
}

nlohmann::ordered_json apply_result_json(const ApplyResult& r) {
  auto ids = [](const std::vector<std::string>& v) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const auto& id : v) a.push_back(id);
    return a;
  };
  nlohmann::ordered_json defined = ids(r.defined);
  for (const auto& id : r.unchanged) defined.push_back(id);
  nlohmann::ordered_json broken = nlohmann::ordered_json::array();
  nlohmann::ordered_json errors = nlohmann::ordered_json::array();
  for (const auto& e : r.errors) {
    if (e.installed) broken.push_back(e.id);
    errors.push_back({{"id", e.id},
                      {"location", e.location},
                      {"message", e.message},
                      {"code", std::string(to_string(e.code))},
                      {"installed", e.installed}});
  }
  return {{"defined", std::move(defined)}, {"changed", ids(r.defined)},
          {"unchanged", ids(r.unchanged)}, {"removed", ids(r.removed)},
          {"broken", std::move(broken)},   {"errors", std::move(errors)}};
}

nlohmann::ordered_json change_to_json(const std::string& tag, const DataValue& dv) {
  nlohmann::ordered_json j;
  j["tag"] = tag;
  j["value"] = json_values::to_json(dv.value);
  j["status"] = status_code_name(dv.status);
  j["status_code"] = dv.status;
  // A time never set (0 ticks, 1601-01-01) is null: no value has it, it is not a date.
  auto time = [](DateTime t) {
    return t.ticks == 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(format_datetime(t));
  };
  j["source_time"] = time(dv.source_time);
  j["server_time"] = time(dv.server_time);
  j["error"] =
      dv.diagnostics.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(dv.diagnostics);
  return j;
}

nlohmann::ordered_json definition_to_json(const TagDefinition& d) {
  static const char* triggers[] = {"on_change", "periodic", "on_read", "manual"};
  static const char* stamps[] = {"newest_input", "triggering_input", "evaluation_time"};
  nlohmann::ordered_json j;
  j["id"] = d.id;
  j["type"] = std::string(to_string(d.type.type)) + (d.type.array ? "[]" : "");
  j["trigger"] = triggers[static_cast<int>(d.trigger.kind)];
  if (d.trigger.kind == TriggerKind::periodic) j["period_ms"] = d.trigger.period.count();
  if (d.trigger.kind == TriggerKind::on_read) j["max_age_ms"] = d.trigger.max_age.count();
  j["timestamps"] = stamps[static_cast<int>(d.timestamps)];
  auto inputs = nlohmann::ordered_json::array();
  for (const auto& in : d.inputs) {
    nlohmann::ordered_json i;
    i["tag"] = in.tag;
    if (!in.name.empty()) i["name"] = in.name;
    if (!in.trigger) i["trigger"] = false;
    if (in.deadband == DeadbandKind::absolute) i["deadband"] = in.deadband_value;
    if (in.deadband == DeadbandKind::percent) i["deadband_percent"] = in.deadband_value;
    inputs.push_back(std::move(i));
  }
  j["inputs"] = std::move(inputs);
  j["keep_state"] = d.keep_state;
  return j;
}

}  // namespace outrun::tags::file

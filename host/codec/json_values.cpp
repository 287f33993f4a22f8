#include "json_values.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace outrun::json_values {

bool from_json(const nlohmann::json& j, Value* out, std::string* error, int depth) {
  if (depth > kMaxValueDepth) {
    *error = "input is nested deeper than " + std::to_string(kMaxValueDepth) + " levels";
    return false;
  }
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      *out = Value();
      return true;
    case nlohmann::json::value_t::boolean:
      *out = Value(j.get<bool>());
      return true;
    case nlohmann::json::value_t::number_integer:
      *out = Value(j.get<int64_t>());
      return true;
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      *out =
          u <= uint64_t(INT64_MAX) ? Value(static_cast<int64_t>(u)) : Value(static_cast<double>(u));
      return true;
    }
    case nlohmann::json::value_t::number_float:
      *out = Value(j.get<double>());
      return true;
    case nlohmann::json::value_t::string:
      *out = Value(j.get<std::string>());
      return true;
    case nlohmann::json::value_t::array: {
      Array a(j.size());
      for (std::size_t i = 0; i < j.size(); ++i)
        if (!from_json(j[i], &a[i], error, depth + 1)) return false;
      *out = Value(std::move(a));
      return true;
    }
    case nlohmann::json::value_t::object: {
      Map m;
      for (auto it = j.begin(); it != j.end(); ++it) {
        MapEntry e{it.key(), {}};
        if (!from_json(it.value(), &e.value, error, depth + 1)) return false;
        m.push_back(std::move(e));
      }
      *out = Value(std::move(m));
      return true;
    }
    default:
      *error = "unsupported JSON value";
      return false;
  }
}

nlohmann::json to_json(const Value& v) {
  if (v.is<Nil>()) return nullptr;
  if (const bool* b = std::get_if<bool>(&v.v)) return *b;
  if (const int64_t* i = std::get_if<int64_t>(&v.v)) return *i;
  if (const double* d = std::get_if<double>(&v.v)) {
    if (std::isnan(*d)) return "NaN";
    if (std::isinf(*d)) return *d > 0 ? "Infinity" : "-Infinity";
    return nlohmann::json(*d);
  }
  if (const std::string* s = std::get_if<std::string>(&v.v)) return *s;
  if (const Bytes* by = std::get_if<Bytes>(&v.v)) {
    static const char* hex = "0123456789abcdef";
    std::string h;
    for (unsigned char c : by->data) {
      h += hex[c >> 4];
      h += hex[c & 15];
    }
    return nlohmann::json{{"$bytes", h}};
  }
  if (const uint64_t* u = std::get_if<uint64_t>(&v.v)) return *u;
  if (const float* f = std::get_if<float>(&v.v)) return to_json(Value(float_as_double(*f)));
  if (const DateTime* t = std::get_if<DateTime>(&v.v)) return format_datetime(*t);
  if (const Array* a = std::get_if<Array>(&v.v)) {
    auto j = nlohmann::json::array();
    for (const auto& x : *a) j.push_back(to_json(x));
    return j;
  }
  auto j = nlohmann::json::object();
  for (const auto& e : v.as<Map>()) j[e.key] = to_json(e.value);
  return j;
}

Value parse_scalar(const std::string& t, std::string* err) {
  if (t == "true") return Value(true);
  if (t == "false") return Value(false);
  if (t == "nil") return Value();
  if (t.size() >= 2 && t.front() == '"' && t.back() == '"') return Value(t.substr(1, t.size() - 2));
  if (!t.empty()) {
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(t.c_str(), &end, 10);
    if (errno == 0 && *end == '\0') return Value(static_cast<int64_t>(i));
    errno = 0;
    const double d = std::strtod(t.c_str(), &end);
    const bool whole = *end == '\0' && !std::isspace(static_cast<unsigned char>(t[0]));
    if (errno == 0 && whole) return Value(d);
    // A number a double cannot hold (1e400, 1e-400) is an error, not the string "1e400".
    if (errno == ERANGE && whole && err) {
      *err = "'" + t + "' is out of a double's range";
      return Value();
    }
  }
  return Value(t);
}

std::string escape_control(std::string_view s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace outrun::json_values

// Small pieces of the public API: status names, value display, script hashes.
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "outrun/runner.h"
#include "outrun/status.h"
#include "outrun/value.h"

namespace outrun {

namespace {
constexpr std::string_view kStatusNames[] = {"ok",          "compile_error", "runtime_error", "timeout",
                                             "killed",      "memory_limit",  "busy",          "worker_lost",
                                             "unavailable", "cancelled",     "invalid_argument"};

void append_number(std::string& out, double d) {
  if (std::isnan(d)) { out += std::signbit(d) ? "-nan" : "nan"; return; }
  if (std::isinf(d)) { out += d < 0 ? "-inf" : "inf"; return; }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.14g", d);  // as Lua's tostring
  out += buf;
  if (std::string_view(buf).find_first_of(".eEn") == std::string_view::npos) out += ".0";
}

void append(std::string& out, const Value& v, bool top) {
  struct Visitor {
    std::string& out;
    bool top;
    void operator()(const Nil&) { out += "nil"; }
    void operator()(bool b) { out += b ? "true" : "false"; }
    void operator()(int64_t i) { out += std::to_string(i); }
    void operator()(double d) { append_number(out, d); }
    void operator()(const std::string& s) { out += top ? s : nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }
    void operator()(const Bytes& b) {
      static const char* hex = "0123456789abcdef";
      out += "0x";
      for (unsigned char c : b.data) { out += hex[c >> 4]; out += hex[c & 15]; }
    }
    void operator()(const Array& a) {
      out += '[';
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (i) out += ", ";
        append(out, a[i], false);
      }
      out += ']';
    }
    void operator()(const Map& m) {
      out += '{';
      for (std::size_t i = 0; i < m.size(); ++i) {
        if (i) out += ", ";
        out += nlohmann::json(m[i].key).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        out += ": ";
        append(out, m[i].value, false);
      }
      out += '}';
    }
  };
  std::visit(Visitor{out, top}, v.v);
}
}  // namespace

std::string_view to_string(Status s) {
  const auto i = static_cast<std::size_t>(s);
  return i < std::size(kStatusNames) ? kStatusNames[i] : "unknown";
}

bool parse_status(std::string_view name, Status* out) {
  for (std::size_t i = 0; i < std::size(kStatusNames); ++i) {
    if (kStatusNames[i] == name) {
      *out = static_cast<Status>(i);
      return true;
    }
  }
  return false;
}

std::string to_display_string(const Value& v) {
  std::string out;
  append(out, v, true);
  return out;
}

std::string Script::sha256_hex() const {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : rec_->sha256) {
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

}  // namespace outrun

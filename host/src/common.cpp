// Small pieces of the public API: status names, value display, script hashes.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <nlohmann/json.hpp>

#include "outrun/runner.h"
#include "outrun/status.h"
#include "outrun/value.h"
#include "script_record.h"

namespace outrun {

namespace {
constexpr std::string_view kStatusNames[] = {
    "ok",   "compile_error", "runtime_error", "timeout",   "killed",          "memory_limit",
    "busy", "worker_lost",   "unavailable",   "cancelled", "invalid_argument"};

void append_number(std::string& out, double d) {
  if (std::isnan(d)) {
    out += std::signbit(d) ? "-nan" : "nan";
    return;
  }
  if (std::isinf(d)) {
    out += d < 0 ? "-inf" : "inf";
    return;
  }
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
    void operator()(const std::string& s) {
      out += top ? s
                 : nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    void operator()(const Bytes& b) {
      static const char* hex = "0123456789abcdef";
      out += "0x";
      for (unsigned char c : b.data) {
        out += hex[c >> 4];
        out += hex[c & 15];
      }
    }
    void operator()(uint64_t u) { out += std::to_string(u); }
    void operator()(float f) { append_number(out, float_as_double(f)); }
    void operator()(const DateTime& t) { out += format_datetime(t); }
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
        out +=
            nlohmann::json(m[i].key).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
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

std::string_view to_string(ErrorCode c) {
  switch (c) {
    case ErrorCode::ok:
      return "ok";
    case ErrorCode::invalid_argument:
      return "invalid_argument";
    case ErrorCode::compile_error:
      return "compile_error";
    case ErrorCode::unavailable:
      return "unavailable";
    case ErrorCode::protocol_error:
      return "protocol_error";
  }
  return "unknown";
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

double float_as_double(float f) {
  if (!std::isfinite(f)) return static_cast<double>(f);
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, f);  // the shortest decimal that reads back as f
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

std::string format_datetime(DateTime t) {
  // Floor division, so that times before 1970 print correctly.
  int64_t us = t.unix_micros();
  int64_t secs = us / 1000000;
  int64_t frac = us % 1000000;
  if (frac < 0) {
    frac += 1000000;
    --secs;
  }
  std::time_t tt = static_cast<std::time_t>(secs);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(frac / 1000));
  std::string s = buf;
  if (frac % 1000 != 0) {  // keep microseconds when there are any
    std::snprintf(buf, sizeof buf, "%03d", static_cast<int>(frac % 1000));
    s.insert(s.size() - 1, buf);
  }
  return s;
}

bool parse_datetime(std::string_view text, DateTime* out) {
  bool out_of_range = false;
  return parse_datetime(text, out, &out_of_range);
}

bool parse_datetime(std::string_view text, DateTime* out, bool* out_of_range) {
  // YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)
  *out_of_range = false;
  int y, mo, d, h, mi, se;
  if (text.size() < 20) return false;
  for (std::size_t k = 0; k < 4; ++k)
    if (text[k] < '0' || text[k] > '9') return false;  // four digits: no sign, no space
  std::string s(text);
  int n = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &se, &n) != 6 ||
      n != 19)
    return false;
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || se > 60) return false;
  std::size_t i = 19;
  int64_t frac_us = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    int digits = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (digits < 6) frac_us = frac_us * 10 + (s[i] - '0');
      ++digits;
      ++i;
    }
    if (digits == 0) return false;
    for (int k = digits; k < 6; ++k) frac_us *= 10;
  }
  int64_t offset_s = 0;
  if (i < s.size() && (s[i] == 'Z' || s[i] == 'z')) {
    ++i;
  } else if (i + 6 == s.size() && (s[i] == '+' || s[i] == '-') && s[i + 3] == ':') {
    const int oh = (s[i + 1] - '0') * 10 + (s[i + 2] - '0');
    const int om = (s[i + 4] - '0') * 10 + (s[i + 5] - '0');
    if (oh > 23 || om > 59) return false;
    offset_s = (s[i] == '+' ? 1 : -1) * (oh * 3600 + om * 60);
    i += 6;
  } else {
    return false;
  }
  if (i != s.size()) return false;
  // Days from civil (Howard Hinnant's algorithm).
  const int yy = y - (mo <= 2);
  const int era = (yy >= 0 ? yy : yy - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(yy - era * 400);
  const unsigned doy =
      (153 * static_cast<unsigned>(mo + (mo > 2 ? -3 : 9)) + 2) / 5 + static_cast<unsigned>(d) - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  const int64_t days = static_cast<int64_t>(era) * 146097 + static_cast<int64_t>(doe) - 719468;
  const int64_t secs = days * 86400 + h * 3600 + mi * 60 + se - offset_s;
  // OPC UA's DateTime range, 1601-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999Z (OPC 10000-6
  // 5.2.2.5), checked on the instant: a local time with its offset may cross either end.
  constexpr int64_t kMinSecs = -11644473600, kMaxSecs = 253402300799;
  if (secs < kMinSecs || secs > kMaxSecs) {
    *out_of_range = true;
    return false;
  }
  *out = DateTime::from_unix_micros(secs * 1000000 + frac_us);
  return true;
}

void detail::retain_script_record(const detail::ScriptRecord* rec) {
  rec->refs.fetch_add(1, std::memory_order_relaxed);
}

const std::string& Script::key() const {
  return rec_->key;
}
const std::string& Script::source() const {
  return rec_->source;
}
const std::array<uint8_t, 32>& Script::sha256() const {
  return rec_->sha256;
}
uint32_t Script::shard() const {
  return rec_->shard;
}
uint32_t Script::id() const {
  return rec_->id;
}
bool Script::registered() const {
  return rec_ && !rec_->unregistered.load(std::memory_order_relaxed);
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

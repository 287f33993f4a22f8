// The tags file (TOML) and the updates stream (JSON lines) of design/tags.md, shared by
// `outrun tags run`, outrund and the fuzz target. Untrusted input: every field is checked and
// every error names its line.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "outrun/tags.h"

namespace outrun::tags::file {

inline constexpr std::size_t kMaxTagsFileBytes = 64u << 20;
inline constexpr std::size_t kMaxUpdateLineBytes = 16u << 20;

// Parses a tags file. `base_dir` resolves `script_file` paths (empty: script_file is refused).
// On failure returns false with "LINE:COL: message" (or "message" for whole-file errors).
bool parse_tags(std::string_view text, const std::string& base_dir, std::vector<TagDefinition>* out,
                std::string* error);
bool load_tags_file(const std::string& path, std::vector<TagDefinition>* out, std::string* error);

// One wave of the updates stream.
struct Wave {
  bool has_time = false;
  DateTime time;
  std::vector<SourceUpdate> updates;
  std::vector<std::string> triggers;  // manual triggers
  std::vector<std::string> reads;     // tags to read (and print) after the wave
};

// Parses one JSON line: {"t": "ISO 8601", "values": {"ID": {"value": V, "status": S,
// "source_time": "ISO 8601"} | V, ...}, "trigger": [ID...], "read": [ID...]}.
bool parse_wave(std::string_view line, Wave* out, std::string* error);

// A DataValue as the JSON object of design/tags.md ({"tag", "value", "status", ...}).
nlohmann::ordered_json change_to_json(const std::string& tag, const DataValue& dv);
// A tag definition back as JSON (outrun tags list --json).
nlohmann::ordered_json definition_to_json(const TagDefinition& d);

}  // namespace outrun::tags::file

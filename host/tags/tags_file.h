// The tags file (TOML) and the updates stream (JSON lines) of design/tags.md, shared by
// `outrun tags run`, outrund and the fuzz target. Untrusted input: every field is checked and
// every error names its line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "outrun/tags.h"

namespace outrun::tags::file {

inline constexpr std::size_t kMaxTagsFileBytes = 64u << 20;
inline constexpr std::size_t kMaxUpdateLineBytes = 16u << 20;

// Parses a tags file. `base_dir` resolves `script_file` paths (empty: script_file is refused);
// `origin` names the file in locations ("" for text without a file: locations are "LINE:COL").
// An error inside a [[tag]] makes that definition broken (TagDefinition::config_error, its
// location the first problem's; every problem in the message) and the others are read on: the
// engine installs it as a tag with BadConfigurationError (or refuses the set, strict). An error
// of the file as a whole (TOML syntax, [defaults], unknown top-level keys, the size) returns false
// with every such error in *file_errors ("ORIGIN:LINE:COL: message").
// `max_tags`: more [[tag]] tables than this are an error of the file as a whole, found before any
// definition is built (outrund's max_tags_per_define).
// `decls` (optional) gets the file's [[source]] and [[alarm]] tables (below); they are checked
// whether or not it is given, and an error in one is an error of the file as a whole.
struct Declarations;
bool parse_tags(std::string_view text, const std::string& base_dir, std::string_view origin,
                std::vector<TagDefinition>* out, std::vector<std::string>* file_errors,
                std::size_t max_tags = SIZE_MAX, Declarations* decls = nullptr);
bool load_tags_file(const std::string& path, std::vector<TagDefinition>* out,
                    std::vector<std::string>* file_errors, Declarations* decls = nullptr);

// What a tags file declares for an OPC UA server beside its tags (design/tags.md "Sources and
// alarms"): typed sources and alarms. The engine does not use them; outrund keeps them and serves
// them in ListTags, so that a server learns them from outrund, whoever defined the tags.
//   sources: [{"id", "type", "eu_range": [lo, hi]?, "initial"?, "writable", "description"?}]
//   alarms:  [{"id", "tag", "kind": "limit"|"off_normal", "high_high"?, "high"?, "low"?,
//              "low_low"?, "normal"?, "severity", "message"?, "max_shelved_ms"}]
struct Declarations {
  nlohmann::ordered_json sources = nlohmann::ordered_json::array();
  nlohmann::ordered_json alarms = nlohmann::ordered_json::array();
  bool empty() const { return sources.empty() && alarms.empty(); }
  // Replaces those with the same id, adds the others (a DefineTags that is not replace_all).
  void merge(const Declarations& more);
};
inline constexpr std::size_t kMaxDeclarations = 20'000;  // [[source]] or [[alarm]] tables
// All or nothing: false with the first error ("LINE:COL: message") if anything is wrong,
// duplicate ids included.
bool parse_tags(std::string_view text, const std::string& base_dir, std::vector<TagDefinition>* out,
                std::string* error);
bool load_tags_file(const std::string& path, std::vector<TagDefinition>* out, std::string* error);

// Text from a file, a script or a client made safe for a terminal or a log: control characters
// (BEL, ESC, ...) as \xNN.
std::string printable(std::string_view s);

// One line per problem of an apply: the file's own errors, then every broken definition
// ("LOCATION: message"), each made printable.
std::vector<std::string> describe_errors(const std::vector<std::string>& file_errors,
                                         const std::vector<DefinitionError>& errors);

// What an apply did, as outrund's DefineTags reply and `outrun tags define --json` show it:
// {"defined": [ids that run: new, changed and unchanged], "changed": [...], "unchanged": [...],
//  "removed": [...], "broken": [ids with BadConfigurationError],
//  "errors": [{"id", "location", "message", "code", "installed"}]}.
nlohmann::ordered_json apply_result_json(const ApplyResult& r);

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

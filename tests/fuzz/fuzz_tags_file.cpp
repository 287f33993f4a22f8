// fuzz_tags_file: the tags file (TOML) and the updates stream (JSON lines) of design/tags.md,
// both untrusted text (a tags file comes from a client of outrund or from disk).
//
// First byte even: the rest is a tags file. A file that parses must give definitions with unique,
// non-empty ids and scripts; parsing it again gives the same definitions (the parser keeps no
// state). Odd: the rest is one updates line; a line that parses has tag ids for every update.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdlib>
#include <set>

#include "tags_file.h"

using namespace outrun;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool tags_file = (data[0] & 1) == 0;
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string error;
  if (tags_file) {
    std::vector<tags::TagDefinition> defs;
    if (!tags::file::parse_tags(text, "", &defs, &error)) {
      if (error.empty()) std::abort();  // every refusal says why
      return 0;
    }
    std::set<std::string> ids;
    for (const auto& d : defs) {
      if (d.id.empty() || !ids.insert(d.id).second) std::abort();
      (void)tags::file::definition_to_json(d).dump(
          -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    }
    std::vector<tags::TagDefinition> again;
    if (!tags::file::parse_tags(text, "", &again, &error) || again.size() != defs.size())
      std::abort();
    for (std::size_t i = 0; i < defs.size(); ++i)
      if (again[i].id != defs[i].id || again[i].script != defs[i].script) std::abort();
  } else {
    tags::file::Wave wave;
    if (!tags::file::parse_wave(text, &wave, &error)) {
      if (error.empty()) std::abort();
      return 0;
    }
    for (const auto& u : wave.updates) {
      (void)tags::file::change_to_json(u.tag, u.value)
          .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    }
  }
  return 0;
}

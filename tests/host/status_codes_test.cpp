// OPC UA StatusCode names: the table generated from host/tags/StatusCode.csv at build time
// (worker/status_codes.h) against the CSV itself, read here at run time, and the hand-written
// constants of outrun/tags.h against it.
#include "status_codes.h"

#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <regex>
#include <string>

#include "outrun/tags.h"

namespace outrun::test {
namespace {

// Name -> value, every row of the OPC Foundation's list as committed.
std::map<std::string, uint32_t> csv_codes() {
  std::ifstream in(std::string(OUTRUN_TEST_SOURCE_DIR) + "/host/tags/StatusCode.csv");
  REQUIRE(in);
  const std::regex row(R"(^([A-Za-z][A-Za-z0-9_]*),0x([0-9A-Fa-f]{8}),.*$)");
  std::map<std::string, uint32_t> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::smatch m;
    REQUIRE_MESSAGE(std::regex_match(line, m, row), line);
    const bool fresh =
        out.emplace(m[1].str(), static_cast<uint32_t>(std::stoul(m[2].str(), nullptr, 16))).second;
    CHECK_MESSAGE(fresh, m[1].str());
  }
  return out;
}

}  // namespace

TEST_CASE("status codes: every name of StatusCode.csv round-trips through parse and name") {
  auto csv = csv_codes();
  CHECK(csv.size() > 250);
  // Good, Uncertain and Bad are named even when a copy of the CSV leaves them out.
  csv.emplace("Good", 0x00000000u);
  csv.emplace("Uncertain", 0x40000000u);
  csv.emplace("Bad", 0x80000000u);
  for (const auto& entry : csv) {  // (no structured binding: clang 14 refuses it in CAPTURE)
    const std::string& name = entry.first;
    const auto code = entry.second;
    CAPTURE(name);
    tags::StatusCode c = 1;
    CHECK(tags::parse_status_code(name, &c));
    CHECK(c == code);
    CHECK(tags::status_code_name(code) == name);
    const status_codes::Entry* e = status_codes::find(name);
    REQUIRE(e != nullptr);
    CHECK(e->code == code);
  }
  // Nothing more than the CSV (and the three), sorted for the binary searches.
  const auto all = status_codes::by_name();
  CHECK(all.size() == csv.size());
  for (std::size_t i = 1; i < all.size(); ++i) CHECK(all[i - 1].name < all[i].name);
  // Codes with no name print as hex and parse back; unknown names are refused.
  CHECK(tags::status_code_name(0x80AA0001u) == "0x80AA0001");
  tags::StatusCode c = 0;
  CHECK(tags::parse_status_code("0x80AA0001", &c));
  CHECK(c == 0x80AA0001u);
  CHECK_FALSE(tags::parse_status_code("BadOutOfServic", &c));
  CHECK_FALSE(tags::parse_status_code("badoutofservice", &c));
  CHECK_FALSE(tags::parse_status_code("", &c));
  CHECK(status_codes::find(std::string_view("BadTimeoutX")) == nullptr);
  CHECK(status_codes::find(0x00000001u) == nullptr);
}

TEST_CASE("status codes: the constants of outrun/tags.h are the CSV's values") {
  const auto csv = csv_codes();
  auto value_of = [&](const char* name) -> int64_t {
    if (std::string_view(name) == "Good") return 0;
    if (std::string_view(name) == "Uncertain") return 0x40000000;
    if (std::string_view(name) == "Bad") return 0x80000000;
    const auto it = csv.find(name);
    return it == csv.end() ? -1 : it->second;
  };
#define CHECK_CODE(name)                                  \
  do {                                                    \
    CAPTURE(#name);                                       \
    CHECK(value_of(#name) == int64_t{tags::codes::name}); \
  } while (0)
  CHECK_CODE(Good);
  CHECK_CODE(Uncertain);
  CHECK_CODE(UncertainLastUsableValue);
  CHECK_CODE(UncertainSubstituteValue);
  CHECK_CODE(UncertainInitialValue);
  CHECK_CODE(UncertainSensorNotAccurate);
  CHECK_CODE(UncertainEngineeringUnitsExceeded);
  CHECK_CODE(Bad);
  CHECK_CODE(BadInternalError);
  CHECK_CODE(BadOutOfMemory);
  CHECK_CODE(BadResourceUnavailable);
  CHECK_CODE(BadTimeout);
  CHECK_CODE(BadTooManyOperations);
  CHECK_CODE(BadNoCommunication);
  CHECK_CODE(BadWaitingForInitialData);
  CHECK_CODE(BadNodeIdUnknown);
  CHECK_CODE(BadOutOfRange);
  CHECK_CODE(BadTypeMismatch);
  CHECK_CODE(BadConfigurationError);
  CHECK_CODE(BadInvalidArgument);
  CHECK_CODE(BadSensorFailure);
  CHECK_CODE(BadDeviceFailure);
#undef CHECK_CODE
  // Every constant the header declares, including ones added after this test was written.
  std::ifstream in(std::string(OUTRUN_TEST_SOURCE_DIR) + "/host/include/outrun/tags.h");
  REQUIRE(in);
  const std::regex decl(R"(inline constexpr StatusCode (\w+) = 0x([0-9A-Fa-f]{8});)");
  int declared = 0;
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, decl)) continue;
    ++declared;
    CAPTURE(line);
    CHECK(value_of(m[1].str().c_str()) ==
          static_cast<int64_t>(std::stoul(m[2].str(), nullptr, 16)));
  }
  CHECK(declared == 22);  // the ones checked by name above
}

}  // namespace outrun::test

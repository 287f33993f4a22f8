// Figures, their aggregation over repeats, the budget rows of BRIEF §5 and their verdicts, and
// the three renderings (text table, Markdown, JSON).
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace outrun::perf {

// Every figure of one run of the sections, by id ("host.paced_cpu_pct"). Units are in the id's
// metadata (figure_unit).
using Figs = std::map<std::string, double>;

struct Agg {
  std::vector<double> samples;
  double min = 0, median = 0, max = 0;
};

// One arm: HostOptions as given (or one side of an A/B), and its samples, one per repeat.
struct Arm {
  std::string name;  // "A", "B", or "default"
  std::string spec;  // "fulfill_futures_on_loop=false"
  std::vector<Figs> samples;
  std::map<std::string, Agg> agg;
  void aggregate();
  std::optional<double> median(const std::string& id) const;
};

enum class Verdict { none, pass, fail, na };

struct Check {
  std::string text;  // "≤ 25 % of a core"
  // Verdict for the row's median value; `m` gives the median of any other figure of the arm.
  std::function<Verdict(double value,
                        const std::function<std::optional<double>(const std::string&)>& m)>
      judge;
};

struct RowDef {
  std::string id;
  std::string label;
  std::string figure;  // the measured value
  Check seed, goal;
  std::vector<std::pair<std::string, std::string>> beside;  // label, figure id
};

// The rows, in BRIEF §5 order, then information rows. `rate` names the paced rate in labels;
// `clients` × `depth`, the pipelined rows'; `scale`, the N of the scale rows (one set per N).
std::vector<RowDef> budget_rows(double rate, int scripts, int clients, int depth,
                                const std::vector<int>& scale = {});

std::string figure_unit(const std::string& id);
std::string format_value(double v, const std::string& unit);
const char* verdict_text(Verdict v);

struct RowResult {
  const RowDef* def = nullptr;
  bool present = false;
  double median = 0, min = 0, max = 0;
  int samples = 0;
  Verdict seed = Verdict::none, goal = Verdict::none;
  std::vector<std::pair<std::string, std::string>> beside;  // label, formatted value
};
std::vector<RowResult> evaluate_rows(const std::vector<RowDef>& defs, const Arm& arm);

std::string text_table(const std::vector<RowResult>& rows, bool show_range);
std::string markdown_table(const std::vector<RowResult>& rows, bool show_range);
nlohmann::json rows_json(const std::vector<RowResult>& rows);
nlohmann::json arm_json(const Arm& arm);

// A/B: per row, median of A and B and the ratio B/A.
std::string ab_table(const std::vector<RowDef>& defs, const Arm& a, const Arm& b, bool markdown);
nlohmann::json ab_json(const std::vector<RowDef>& defs, const Arm& a, const Arm& b);

}  // namespace outrun::perf

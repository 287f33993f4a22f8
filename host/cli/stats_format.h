// Rendering the daemon's stats document (design/daemon.md) for people and for Prometheus.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace outrun::cli {

// Prometheus text exposition format (version 0.0.4).
std::string stats_prometheus(const nlohmann::json& stats);
// A few lines and a shard table.
std::string stats_text(const nlohmann::json& stats);
std::string shards_text(const nlohmann::json& shards_doc);
// The table of a ListScripts document (one page of it), with or without its header line.
std::string scripts_text(const nlohmann::json& scripts_doc, bool header = true);

}  // namespace outrun::cli

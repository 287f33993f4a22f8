// outrund configuration: defaults, the TOML file (toml++), command-line overrides.
// Every key and its default is documented in design/daemon.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "outrun/host.h"

namespace outrun::daemon {

inline constexpr std::size_t kHardLimitFactor = 4;  // max_client_queued_bytes × this: disconnect

struct DaemonConfig {
  // [daemon]
  std::string socket;                  // default: default_socket_path()
  unsigned socket_mode = 0660;         // permission bits of the socket file
  std::vector<uint32_t> allowed_uids;  // empty and !uids_set: the daemon's uid and root
  std::vector<uint32_t> allowed_gids;  // empty: none (besides uids)
  bool uids_set = false;               // allowed_uids given explicitly (file or flag)
  std::string socket_group;            // empty: the daemon's group; else the socket file's group
  std::vector<uint32_t> admin_uids;    // Control KillShard/RestartShard; empty and !admin_set:
  std::vector<uint32_t> admin_gids;    // the daemon's uid and root
  bool admin_set = false;              // admin_uids given explicitly
  bool socket_is_default = false;      // socket left to default_socket_path() (finalize_config)
  int max_clients = 256;
  int max_pending_hello = 64;                     // connections that have not said hello yet
  std::chrono::milliseconds hello_timeout{5000};  // a connection's time to send its ClientHello
  uint32_t max_inflight_per_client = 10000;
  std::chrono::milliseconds drain_timeout{5000};
  std::string log_level = "info";  // trace, debug, info, warn, error, critical, off
  std::string log_file;            // empty: stderr (journald under systemd)
  std::string cache_dir;           // default: default_cache_dir(); reserved (created, unused)
  std::string tags_file;           // tags loaded at start and on SIGHUP (empty: none)
  // All or nothing: a tags file with any broken definition is refused (at start: outrund exits
  // 2; on reload: the running tags are kept). Off: broken tags get BadConfigurationError and
  // the others run (design/tags.md "Broken definitions").
  bool tags_strict = false;
  // The tags' state store (design/daemon.md "State store"): keep_state states and last values
  // survive a restart of outrund in state_dir/tags-state.sqlite. Empty: no store (nothing
  // survives outrund; a worker restart still keeps keep_state). The unit sets
  // /var/lib/outrund (StateDirectory=outrund).
  std::string state_dir;
  // The longest a new value or state waits before it is committed: what a SIGKILL can lose.
  std::chrono::milliseconds state_flush{1000};
  // What the stored rows may hold together; past it a tag's row is not stored (logged, and in
  // its diagnostics).
  std::size_t max_state_store_bytes = std::size_t{256} << 20;
  // What the log rings of the registered scripts hold together, and those of the tags (each its
  // own budget): `outrun logs`, `outrun tags log` (design/daemon.md "Script logs").
  std::size_t max_log_bytes = std::size_t{32} << 20;
  // A tags subscriber whose connection has more than this queued keeps only the latest value of
  // each tag until it drains (design/daemon.md "Subscribers").
  std::size_t max_subscriber_bytes = 4u << 20;
  // Tags bounds (design/daemon.md "Tags bounds"). Virtual tags in the engine (DefineTags and the
  // tags file), and definitions in one DefineTags.
  std::size_t max_tags = 100'000;
  // Per-tag series in the stats document (tags.per_tag) and so in `outrun stats --prometheus`:
  // at most this many tags, the first in `outrun tags list` order; 0: none (design/daemon.md).
  std::size_t metrics_per_tag_series = 0;
  std::size_t max_tags_per_define = 20'000;
  // Source tags: how many, what they hold together (ids, values, updates waiting), one value.
  // Only an admin creates one with SourceUpdates (others update those that exist); per uid: the
  // sources it created that no tag uses, and what the sources it wrote last hold.
  std::size_t max_tag_sources = 100'000;
  std::size_t max_tag_source_bytes = std::size_t{256} << 20;
  std::size_t max_tag_source_value_bytes = std::size_t{1} << 20;
  std::size_t max_tag_sources_per_uid = 10'000;
  std::size_t max_tag_source_bytes_per_uid = std::size_t{64} << 20;
  // Subscribe: ids one connection may hold (whether they name a tag yet or not).
  std::size_t max_subscribed_ids = 16'384;
  // ReadTags waiting for on_read evaluations: per connection queued, and on_read tags one
  // ReadTags may evaluate.
  std::size_t max_tag_reads_per_client = 4;
  std::size_t max_read_evaluations = 64;
  // Answers queued to a client that does not read them: past this, the daemon stops reading
  // the client and feeding its queued evaluations to the Host until they drain below half;
  // past kHardLimitFactor times this, the client is disconnected (design/daemon.md "Scheduler").
  std::size_t max_client_queued_bytes = 16u << 20;
  // Per-uid registry quota (design/daemon.md "Registry quotas"): what the script records one uid
  // registered may cost together (ScriptRecord::bytes, as max_script_bytes counts them) and how
  // many there may be. 0 bytes: half of host.max_script_bytes (finalize_config), so that one uid
  // cannot take the whole registry; admins have the same quota.
  std::size_t max_registry_bytes_per_uid = 0;
  std::size_t max_registry_scripts_per_uid = std::size_t{1} << 21;  // half of the 2^22 record ids
  // Crash budget per uid (design/daemon.md "Crash budget", D-crash-budget): a uid whose
  // evaluations killed their worker (Result::killed_worker) max_crashes_per_uid times within
  // crash_window is refused -- its evaluations `busy`, its new scripts `unavailable` -- for
  // crash_cooldown. Admins too: a crash loop hurts the other clients whoever sends it.
  uint32_t max_crashes_per_uid = 10;
  std::chrono::milliseconds crash_window{10'000};
  std::chrono::milliseconds crash_cooldown{60'000};
  // [host]
  // The Host's log lines (deaths, their stderr, quarantines) a second, a burst of as many; the
  // rest are dropped and counted in a "lines suppressed" line at most once a second
  // (LogRateLimit). The daemon's, not a HostOptions field: the Host logs every line it has.
  uint32_t crash_log_per_second = 10;
  // The daemon's result callbacks never block (D-inline): they run on the Host's loop thread,
  // which also serves the clients (design/daemon.md "One loop"). busy_poll stays 0, off
  // (D-busy-poll: spinning did not pay for its CPU on the 2-core VM).
  HostOptions host = [] {
    HostOptions h;
    h.callbacks_on_loop = true;
    return h;
  }();
};

std::string default_socket_path();
std::string default_cache_dir();

// Reads `path` into *cfg (keys not in the file keep their value). Returns an error message, or
// empty on success. Unknown keys are errors (a typo must not silently fall back to a default).
std::string load_config_file(const std::string& path, DaemonConfig* cfg);

// Fills defaults that depend on the environment (socket, cache dir, allowed uids) and checks
// ranges. Returns an error message, or empty.
std::string finalize_config(DaemonConfig* cfg);

// What the configuration names outside itself and start would otherwise find wrong: a
// socket_group that no group has, a log_file whose directory does not exist (outrund creates no
// directory for a log: a typo as root must not make /var/lgo). Every problem, one per element.
std::vector<std::string> check_environment(const DaemonConfig& cfg);
// Why a log file cannot be opened without creating a directory, or empty.
std::string log_dir_problem(const std::string& log_file);

// The effective configuration as TOML (outrund --check-config prints it).
std::string to_toml(const DaemonConfig& cfg);

}  // namespace outrun::daemon

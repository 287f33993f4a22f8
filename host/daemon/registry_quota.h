// outrund's per-uid registry quotas (design/daemon.md "Registry quotas", decision D-quota): what
// the script records each peer uid registered cost, against max_registry_bytes_per_uid and
// max_registry_scripts_per_uid. Loop thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "outrun/status.h"

namespace outrun::daemon {

class RegistryQuota {
 public:
  struct Usage {
    std::size_t scripts = 0;
    std::size_t bytes = 0;  // ScriptRecord::bytes of each record charged
  };

  RegistryQuota(std::size_t max_bytes, std::size_t max_scripts)
      : max_bytes_(max_bytes), max_scripts_(max_scripts) {}

  // None if `uid` may hold one more record of `bytes`; else `unavailable` (the status of the
  // registry's own max_script_bytes) with the quota, its size and the uid's usage.
  Error admit(uint32_t uid, std::size_t bytes) const;
  void charge(uint32_t uid, std::size_t bytes);
  // Undoes one charge(uid, bytes).
  void release(uint32_t uid, std::size_t bytes);

  Usage usage(uint32_t uid) const;
  // Uids that hold at least one charged record.
  const std::unordered_map<uint32_t, Usage>& uids() const { return by_uid_; }
  std::size_t max_bytes() const { return max_bytes_; }
  std::size_t max_scripts() const { return max_scripts_; }

 private:
  const std::size_t max_bytes_;
  const std::size_t max_scripts_;
  std::unordered_map<uint32_t, Usage> by_uid_;
};

}  // namespace outrun::daemon

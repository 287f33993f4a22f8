#include "registry_quota.h"

#include <string>

namespace outrun::daemon {

Error RegistryQuota::admit(uint32_t uid, std::size_t bytes) const {
  const Usage u = usage(uid);
  const std::string holds = "uid " + std::to_string(uid) + " holds " + std::to_string(u.scripts) +
                            " scripts of " + std::to_string(u.bytes) + " bytes";
  if (u.scripts >= max_scripts_)
    return {ErrorCode::unavailable, holds +
                                        "; one more would pass its registry quota "
                                        "max_registry_scripts_per_uid (" +
                                        std::to_string(max_scripts_) + " scripts)"};
  if (bytes > max_bytes_ || u.bytes > max_bytes_ - bytes)
    return {ErrorCode::unavailable, holds + "; this one (" + std::to_string(bytes) +
                                        " bytes) would pass its registry quota "
                                        "max_registry_bytes_per_uid (" +
                                        std::to_string(max_bytes_) + " bytes)"};
  return {};
}

void RegistryQuota::charge(uint32_t uid, std::size_t bytes) {
  Usage& u = by_uid_[uid];
  ++u.scripts;
  u.bytes += bytes;
}

void RegistryQuota::release(uint32_t uid, std::size_t bytes) {
  auto it = by_uid_.find(uid);
  if (it == by_uid_.end()) return;
  --it->second.scripts;
  it->second.bytes -= bytes;
  if (it->second.scripts == 0) by_uid_.erase(it);
}

RegistryQuota::Usage RegistryQuota::usage(uint32_t uid) const {
  auto it = by_uid_.find(uid);
  return it == by_uid_.end() ? Usage{} : it->second;
}

}  // namespace outrun::daemon

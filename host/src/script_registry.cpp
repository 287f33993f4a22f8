#include "script_registry.h"

#include <openssl/sha.h>

namespace outrun::detail {

uint64_t route_hash(std::string_view key) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : key) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void sha256(std::string_view data, std::array<uint8_t, 32>* out) {
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out->data());
}

Error ScriptRegistry::add(std::string_view key, std::string_view source, Script* out,
                          const std::function<void(ScriptRecord&)>& on_new) {
  if (key.empty() || key.size() > kMaxKeySize)
    return {Status::invalid_argument, "script key must be 1.." + std::to_string(kMaxKeySize) + " bytes"};
  if (source.size() > kMaxSourceSize)
    return {Status::invalid_argument, "script source is larger than " + std::to_string(kMaxSourceSize) + " bytes"};
  std::array<uint8_t, 32> digest;
  sha256(source, &digest);  // once per registration, outside the lock
  std::lock_guard lock(mu_);
  auto it = by_key_.find(std::string(key));
  if (it != by_key_.end() && records_[it->second].sha256 == digest) {
    *out = Script(&records_[it->second]);
    return {};
  }
  if (records_.size() >= (1u << 22)) return {Status::invalid_argument, "too many scripts registered"};
  const std::size_t bytes = key.size() + source.size();
  if (bytes > max_bytes_ - bytes_)
    return {Status::unavailable, "the host holds " + std::to_string(records_.size()) +
                                     " scripts of " + std::to_string(bytes_) +
                                     " bytes; this one would pass max_script_bytes (" +
                                     std::to_string(max_bytes_) + ")"};
  bytes_ += bytes;
  ScriptRecord& r = records_.emplace_back();
  r.owner = owner_;
  r.id = static_cast<uint32_t>(records_.size() - 1);
  r.shard = static_cast<uint32_t>(route_hash(key) % shards_);
  r.key = std::string(key);
  r.source = std::string(source);
  r.sha256 = digest;
  r.chunk_name = std::string(key);
  r.key_id = it != by_key_.end() ? records_[it->second].key_id : keys_++;
  if (on_new) on_new(r);
  by_key_[r.key] = r.id;
  *out = Script(&r);
  return {};
}

uint32_t ScriptRegistry::keys() const {
  std::lock_guard lock(mu_);
  return keys_;
}

std::size_t ScriptRegistry::size() const {
  std::lock_guard lock(mu_);
  return records_.size();
}

const ScriptRecord* ScriptRegistry::get(uint32_t id) const {
  std::lock_guard lock(mu_);
  return id < records_.size() ? &records_[id] : nullptr;
}

}  // namespace outrun::detail

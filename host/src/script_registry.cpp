#include "script_registry.h"

#include <openssl/sha.h>

#include <algorithm>

namespace outrun::detail {

static_assert(sizeof(ScriptRecord) + 96 <= kScriptRecordOverhead,
              "kScriptRecordOverhead must cover the record and its key-index entry");

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

void release_script_record(const ScriptRecord* rec) {
  if (rec->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  auto* r = const_cast<ScriptRecord*>(rec);  // the last reference: nobody else can see it
  if (std::shared_ptr<RegistryShared> shared = std::move(r->registry)) {
    MutexLock lock(shared->mu);
    if (ScriptRegistry* reg = shared->reg) {
      reg->shared_->mu.assert_held();  // reg->shared_ is `shared`
      reg->freed(r);
    }
  }
  if (r->free_engine) r->free_engine(r->engine);
  delete r;
}

ScriptRegistry::ScriptRegistry(const void* owner, uint32_t shards, std::size_t max_bytes,
                               bool deferred_ids)
    : owner_(owner),
      shards_(shards),
      max_bytes_(max_bytes),
      deferred_ids_(deferred_ids),
      shared_(std::make_shared<RegistryShared>()) {
  MutexLock lock(shared_->mu);  // nobody else can see it yet: for the analysis
  shared_->reg = this;
}

ScriptRegistry::~ScriptRegistry() {
  std::unordered_map<std::string, Script> held;
  {
    MutexLock lock(shared_->mu);
    shared_->reg = nullptr;  // records still held by handles are deleted without accounting
    held.swap(by_key_);
  }
}

void ScriptRegistry::freed(ScriptRecord* r) {
  if (r->id < by_id_.size() && by_id_[r->id] == r) by_id_[r->id] = nullptr;
  bytes_ -= r->bytes;
  --records_;
  if (r->slow.load(std::memory_order_relaxed)) freed_slow_.fetch_add(1, std::memory_order_relaxed);
  if (--key_refs_[r->key_id] == 0) free_key_ids_.push_back(r->key_id);
  if (deferred_ids_) {
    retired_.emplace_back(r->shard, r->id);
    if (on_retire_) on_retire_();
  } else {
    free_ids_.push_back(r->id);
  }
}

Error ScriptRegistry::add(std::string_view key, std::string_view source, Script* out,
                          const std::function<void(ScriptRecord&)>& on_new, const AdmitFn& admit) {
  if (key.empty() || key.size() > kMaxKeySize)
    return {ErrorCode::invalid_argument,
            "script key must be 1.." + std::to_string(kMaxKeySize) + " bytes"};
  if (source.size() > kMaxSourceSize)
    return {ErrorCode::invalid_argument,
            "script source is larger than " + std::to_string(kMaxSourceSize) + " bytes"};
  std::array<uint8_t, 32> digest;
  sha256(source, &digest);  // once per registration, outside the lock
  Script result, replaced;  // dropped after the lock: the last reference takes it
  {
    MutexLock lock(shared_->mu);
    auto it = by_key_.find(std::string(key));
    if (it != by_key_.end() && detail::record_of(it->second)->sha256 == digest) {
      result = it->second;
    } else {
      if (free_ids_.empty() && next_id_ >= (1u << 22))
        return {ErrorCode::invalid_argument, "too many scripts registered"};
      const std::size_t bytes = script_record_bytes(key, source);
      if (bytes > max_bytes_ - bytes_)
        return {ErrorCode::unavailable, "the host holds " + std::to_string(records_) +
                                            " scripts of " + std::to_string(bytes_) +
                                            " bytes; this one would pass max_script_bytes (" +
                                            std::to_string(max_bytes_) + ")"};
      if (admit)
        if (Error e = admit(bytes)) return e;
      auto* r = new ScriptRecord();
      r->owner = owner_;
      if (!free_ids_.empty()) {
        r->id = free_ids_.back();
        free_ids_.pop_back();
      } else {
        r->id = next_id_++;
      }
      r->serial = next_serial_++;
      if (r->id >= by_id_.size())
        by_id_.resize(std::max<std::size_t>(r->id + 1, by_id_.size() * 2));
      by_id_[r->id] = r;
      r->shard = static_cast<uint32_t>(route_hash(key) % shards_);
      r->key = std::string(key);
      r->source = std::string(source);
      r->sha256 = digest;
      r->chunk_name = std::string(chunk_name_of(key));
      r->bytes = bytes;
      if (it != by_key_.end()) {
        r->key_id = detail::record_of(it->second)->key_id;
      } else if (!free_key_ids_.empty()) {
        r->key_id = free_key_ids_.back();
        free_key_ids_.pop_back();
      } else {
        r->key_id = next_key_id_++;
        key_refs_.push_back(0);
      }
      ++key_refs_[r->key_id];
      r->registry = shared_;
      bytes_ += bytes;
      ++records_;
      if (on_new) on_new(*r);
      result = ScriptAccess::make(r);
      if (it != by_key_.end()) {
        replaced = std::move(it->second);
        it->second = result;
      } else {
        by_key_.emplace(r->key, result);
      }
    }
  }
  *out = std::move(result);
  return {};
}

Error ScriptRegistry::remove(std::string_view key) {
  Script gone;  // dropped after the lock
  {
    MutexLock lock(shared_->mu);
    auto it = by_key_.find(std::string(key));
    if (it == by_key_.end())
      return {ErrorCode::invalid_argument,
              "no script is registered under '" + std::string(key) + "'"};
    const_cast<ScriptRecord*>(detail::record_of(it->second))->unregistered.store(true);
    gone = std::move(it->second);
    by_key_.erase(it);
  }
  return {};
}

RegistryStats ScriptRegistry::stats() const {
  MutexLock lock(shared_->mu);
  return {records_, bytes_};
}

std::size_t ScriptRegistry::size() const {
  MutexLock lock(shared_->mu);
  return records_;
}

uint32_t ScriptRegistry::keys() const {
  MutexLock lock(shared_->mu);
  return next_key_id_ - static_cast<uint32_t>(free_key_ids_.size());
}

Script ScriptRegistry::acquire(uint32_t id, uint64_t serial) const {
  MutexLock lock(shared_->mu);
  if (id >= by_id_.size()) return {};
  const ScriptRecord* r = by_id_[id];
  if (!r || r->serial != serial) return {};
  // Alive only while someone holds it: a record whose last reference is going (0, freed() not
  // yet run) is not taken back.
  uint32_t n = r->refs.load(std::memory_order_acquire);
  while (n > 0)
    if (r->refs.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel)) {
      Script s = ScriptAccess::make(r);
      r->refs.fetch_sub(1, std::memory_order_acq_rel);  // the one Script(r) took is kept
      return s;
    }
  return {};
}

void ScriptRegistry::set_on_retire(std::function<void()> f) {
  MutexLock lock(shared_->mu);
  on_retire_ = std::move(f);
}

void ScriptRegistry::take_retired(std::vector<std::pair<uint32_t, uint32_t>>* out) {
  MutexLock lock(shared_->mu);
  out->swap(retired_);
  retired_.clear();
}

void ScriptRegistry::recycle(const std::vector<uint32_t>& ids) {
  MutexLock lock(shared_->mu);
  free_ids_.insert(free_ids_.end(), ids.begin(), ids.end());
}

}  // namespace outrun::detail

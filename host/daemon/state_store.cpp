// The tags' state store (state_store.h; design/daemon.md "State store").
//
// The file (kStateFileName), SQLite in WAL mode with synchronous=FULL (one fsync per commit, at
// most one commit per flush interval):
//
//   meta(key TEXT PRIMARY KEY, value TEXT)       -- 'format' = 'outrun-tag-state',
//                                                 -- 'version' = kStateFormatVersion
//   tag_state(id BLOB PRIMARY KEY,                -- the tag id, 1..256 bytes
//             status INTEGER,                     -- the StatusCode last published
//             source_time INTEGER,                -- OPC UA DateTime ticks (100 ns since 1601)
//             server_time INTEGER,
//             value BLOB,                         -- the value: a wire::Value FlatBuffer
//             state BLOB,                         -- keep_state's state, the same; NULL: none
//             script_sha256 TEXT,                 -- hex, of the script the state came from
//             crc32 INTEGER)                      -- CRC-32 of the fields above (row_crc)
//
// A row is checked when it is read: its CRC, its value and state verified and decoded as a
// client's would be, the state at most kMaxStoredStateBytes.
#include "state_store.h"

#include <flatbuffers/flatbuffers.h>
#include <spdlog/spdlog.h>
#include <sqlite3.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "outrun/protocol/frame.h"
#include "outrun/protocol/outrun_generated.h"
#include "tags_file.h"
#include "wire_codec.h"

namespace outrun::daemon {

namespace {

constexpr const char* kSchema =
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS tag_state(id BLOB PRIMARY KEY, status INTEGER NOT NULL,"
    " source_time INTEGER NOT NULL, server_time INTEGER NOT NULL, value BLOB NOT NULL,"
    " state BLOB, script_sha256 TEXT NOT NULL, crc32 INTEGER NOT NULL) WITHOUT ROWID;";

// What a row costs against max_bytes besides its blobs and id (its integers, SQLite's own).
constexpr std::size_t kRowOverhead = 64;

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> r{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      r[i] = c;
    }
    return r;
  }();
  return t;
}

uint32_t crc_add(uint32_t crc, const void* data, std::size_t n) {
  const auto& t = crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  for (std::size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

uint32_t crc_u64(uint32_t crc, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  return crc_add(crc, b, 8);
}

// CRC-32 (IEEE) of a row: each field as its length (8 bytes, little-endian) and its bytes, the
// integers as 8 bytes; a NULL state is length 2^64-1.
uint32_t row_crc(std::string_view id, uint32_t status, int64_t source, int64_t server,
                 std::string_view value, const std::string_view* state, std::string_view sha) {
  uint32_t c = 0xFFFFFFFFu;
  c = crc_u64(c, id.size());
  c = crc_add(c, id.data(), id.size());
  c = crc_u64(c, status);
  c = crc_u64(c, static_cast<uint64_t>(source));
  c = crc_u64(c, static_cast<uint64_t>(server));
  c = crc_u64(c, value.size());
  c = crc_add(c, value.data(), value.size());
  if (state != nullptr) {
    c = crc_u64(c, state->size());
    c = crc_add(c, state->data(), state->size());
  } else {
    c = crc_u64(c, ~uint64_t{0});
  }
  c = crc_u64(c, sha.size());
  c = crc_add(c, sha.data(), sha.size());
  return c ^ 0xFFFFFFFFu;
}

std::string encode_blob(const Value& v) {
  flatbuffers::FlatBufferBuilder f(256);
  f.Finish(detail::encode_tag_value(f, v));
  return std::string(reinterpret_cast<const char*>(f.GetBufferPointer()), f.GetSize());
}

// A stored blob, checked as a client's value is: verified, then decoded within a budget.
bool decode_blob(std::string_view blob, Value* out) {
  if (blob.size() < 8 || blob.size() > 4 * kMaxStoredStateBytes) return false;
  std::vector<uint64_t> aligned((blob.size() + 7) / 8);
  std::memcpy(aligned.data(), blob.data(), blob.size());
  const auto* data = reinterpret_cast<const uint8_t*>(aligned.data());
  flatbuffers::Verifier::Options o;
  o.max_depth = 2 * kMaxValueDepth + 8;
  o.max_tables = 1u << 30;
  o.check_alignment = true;
  flatbuffers::Verifier v(data, blob.size(), o);
  protocol::ValueCheckBudget checks(4 * kMaxStoredStateBytes);
  if (!v.VerifyBuffer<wire::Value>(nullptr)) return false;
  std::size_t budget = 4 * kMaxStoredStateBytes;
  return detail::decode_tag_value(flatbuffers::GetRoot<wire::Value>(data), out, &budget);
}

std::string_view column_blob(sqlite3_stmt* s, int i) {
  const void* p = sqlite3_column_blob(s, i);
  const int n = sqlite3_column_bytes(s, i);
  return p == nullptr ? std::string_view()
                      : std::string_view(static_cast<const char*>(p), static_cast<std::size_t>(n));
}

bool exec(sqlite3* db, const char* sql, std::string* why) {
  char* msg = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &msg) == SQLITE_OK) return true;
  *why = msg != nullptr ? msg : sqlite3_errmsg(db);
  sqlite3_free(msg);
  return false;
}

// The first column of the first row of `sql`, as text ("" with *why on failure).
bool query_text(sqlite3* db, const char* sql, std::string* out, std::string* why) {
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &s, nullptr) != SQLITE_OK) {
    *why = sqlite3_errmsg(db);
    return false;
  }
  const int rc = sqlite3_step(s);
  bool ok = rc == SQLITE_ROW || rc == SQLITE_DONE;
  if (rc == SQLITE_ROW) {
    const auto* t = sqlite3_column_text(s, 0);
    *out = t != nullptr ? reinterpret_cast<const char*>(t) : "";
  } else if (rc == SQLITE_DONE) {
    out->clear();
  } else {
    *why = sqlite3_errmsg(db);
  }
  sqlite3_finalize(s);
  return ok;
}

// Opens `path` and checks it: WAL, quick_check, the schema and its version. False with *why
// (the file is then not usable as it is).
bool open_checked(const std::string& path, sqlite3** out, std::string* why) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    *why = db != nullptr ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return false;
  }
  sqlite3_busy_timeout(db, 5000);
  std::string mode, check, version;
  bool ok = query_text(db, "PRAGMA journal_mode=WAL", &mode, why);
  if (ok && mode != "wal") {
    *why = "cannot use WAL (journal_mode is " + mode + ")";
    ok = false;
  }
  ok = ok && exec(db, "PRAGMA synchronous=FULL", why);
  ok = ok && query_text(db, "PRAGMA quick_check", &check, why);
  if (ok && check != "ok") {
    *why = "quick_check: " + check;
    ok = false;
  }
  ok = ok && exec(db, kSchema, why);
  ok = ok && query_text(db, "SELECT value FROM meta WHERE key='version'", &version, why);
  if (ok && version.empty()) {
    std::string rows;
    ok = query_text(db, "SELECT count(*) FROM tag_state", &rows, why);
    if (ok && rows != "0") {
      *why = "the format version is missing";
      ok = false;
    }
    const std::string ins = "INSERT INTO meta VALUES('format','outrun-tag-state'),('version','" +
                            std::to_string(kStateFormatVersion) + "')";
    ok = ok && exec(db, ins.c_str(), why);
  } else if (ok && version != std::to_string(kStateFormatVersion)) {
    *why = "format version " + version + " (this outrund reads " +
           std::to_string(kStateFormatVersion) + ")";
    ok = false;
  }
  if (!ok) {
    sqlite3_close(db);
    return false;
  }
  *out = db;
  return true;
}

std::string utc_stamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string printable(std::string_view s) {
  return tags::file::printable(std::string(s));
}

}  // namespace

bool StateStore::open(const StateStoreOptions& options, std::shared_ptr<StateStore>* out,
                      StateStoreOpened* opened, std::string* error) {
  namespace fs = std::filesystem;
  *opened = StateStoreOpened();
  const std::string path = options.dir + "/" + kStateFileName;
  sqlite3* db = nullptr;
  std::string why;
  if (!open_checked(path, &db, &why)) {
    // Set aside, never deleted: an operator may want to look at it.
    std::error_code ec;
    const std::string aside = path + ".corrupt-" + utc_stamp();
    fs::rename(path, aside, ec);
    if (ec && fs::exists(path)) {
      *error = "state store " + path + " is unusable (" + why +
               ") and cannot be moved aside: " + ec.message();
      return false;
    }
    for (const char* tail : {"-wal", "-shm"}) {
      std::error_code e2;
      if (fs::exists(path + tail)) fs::rename(path + tail, aside + tail, e2);
    }
    opened->set_aside = aside;
    opened->set_aside_reason = why;
    spdlog::error("state store {}: unusable ({}); moved aside to {}; every tag starts from {{}}",
                  path, printable(why), aside);
    std::string why2;
    if (!open_checked(path, &db, &why2)) {
      *error = "cannot create the state store " + path + ": " + why2;
      return false;
    }
  }
  std::shared_ptr<StateStore> s(new StateStore(options, db));
  // Every row, checked.
  sqlite3_stmt* q = nullptr;
  if (sqlite3_prepare_v2(db,
                         "SELECT id,status,source_time,server_time,value,state,script_sha256,crc32 "
                         "FROM tag_state",
                         -1, &q, nullptr) != SQLITE_OK) {
    *error = "state store " + path + ": " + sqlite3_errmsg(db);
    return false;
  }
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    tags::RestoredTag r;
    const std::string_view id = column_blob(q, 0);
    const int64_t status = sqlite3_column_int64(q, 1);
    const int64_t source = sqlite3_column_int64(q, 2);
    const int64_t server = sqlite3_column_int64(q, 3);
    const std::string_view value = column_blob(q, 4);
    const bool has_state = sqlite3_column_type(q, 5) != SQLITE_NULL;
    const std::string_view state = has_state ? column_blob(q, 5) : std::string_view();
    const auto* sha_text = sqlite3_column_text(q, 6);
    const std::string sha = sha_text ? reinterpret_cast<const char*>(sha_text) : "";
    const int64_t crc = sqlite3_column_int64(q, 7);
    if (id.empty() || id.size() > tags::kMaxTagIdSize) {
      ++opened->bad_rows;  // no usable id: no tag to tell (the row is left as it is)
      spdlog::warn("state store {}: a row with an id of {} bytes is dropped", path, id.size());
      continue;
    }
    r.id = std::string(id);
    s->sizes_[r.id] = id.size() + value.size() + state.size() + sha.size() + kRowOverhead;
    s->bytes_ += s->sizes_[r.id];
    if (status < 0 || status > UINT32_MAX ||
        row_crc(id, static_cast<uint32_t>(status), source, server, value,
                has_state ? &state : nullptr, sha) != static_cast<uint32_t>(crc)) {
      r.problem = "the stored row is damaged (checksum mismatch)";
    } else if (!decode_blob(value, &r.value.value)) {
      r.problem = "the stored value does not decode";
    } else if (has_state && state.size() > 2 * kMaxStoredStateBytes) {
      r.problem = "the stored state is larger than 8 MiB";
    } else if (has_state && !decode_blob(state, &r.state)) {
      r.problem = "the stored state does not decode";
    }
    if (r.problem.empty()) {
      r.has_value = true;
      r.value.status = static_cast<uint32_t>(status);
      r.value.source_time = DateTime{source};
      r.value.server_time = DateTime{server};
      r.has_state = has_state;
      r.script_sha256 = sha;
    } else {
      r.value = tags::DataValue();
      r.state = Value();
      ++opened->bad_rows;
      spdlog::error("state store {}: tag '{}': {}; it starts from {{}}", path, printable(r.id),
                    r.problem);
    }
    opened->rows.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) {
    // A damage quick_check did not see: what was read stays, the rest starts from {}.
    spdlog::error("state store {}: reading stopped: {}; the tags not read start from {{}}", path,
                  sqlite3_errmsg(db));
  }
  sqlite3_finalize(q);
  {
    MutexLock lock(s->mu_);
    s->total_ = s->bytes_;
  }
  spdlog::info("state store {}: {} tags restored, {} damaged, {} bytes", path,
               opened->rows.size() - std::min(opened->rows.size(), opened->bad_rows),
               opened->bad_rows, s->bytes_);
  s->writer_ = std::thread([p = s.get()] { p->writer_main(); });
  *out = std::move(s);
  return true;
}

StateStore::StateStore(StateStoreOptions options, sqlite3* db)
    : opts_(std::move(options)), db_(db) {}

StateStore::~StateStore() {
  close();
}

void StateStore::close() {
  {
    MutexLock lock(mu_);
    if (closing_) return;
    closing_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  sqlite3_close(db_);  // the last connection: checkpoints the WAL into the file
  db_ = nullptr;
  {
    MutexLock lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

void StateStore::flush() {
  MutexLock lock(mu_);
  if (closing_) return;
  const uint64_t mine = ++flush_asked_;
  cv_.notify_all();
  cv_.wait(mu_, [&]() REQUIRES(mu_) { return flush_done_ >= mine || closed_; });
}

void StateStore::saved(const std::string& id, const tags::DataValue& value, const Value* state,
                       const std::string& script_sha256) {
  MutexLock lock(mu_);
  if (closing_) return;
  Row& r = pending_[id];
  r.erase = false;
  r.value = value;
  r.has_state = state != nullptr;
  r.state = state != nullptr ? *state : Value();
  r.script_sha256 = script_sha256;
}

void StateStore::removed(const std::string& id) {
  MutexLock lock(mu_);
  if (closing_) return;
  Row& r = pending_[id];
  r = Row();
  r.erase = true;
  notes_.erase(id);
}

std::string StateStore::note(const std::string& id) {
  MutexLock lock(mu_);
  if (notes_.empty()) return {};
  auto it = notes_.find(id);
  return it == notes_.end() ? std::string() : it->second;
}

std::size_t StateStore::stored_bytes() const {
  MutexLock lock(mu_);
  return total_;
}

void StateStore::writer_main() {
  std::unordered_map<std::string, Row> batch;
  for (;;) {
    uint64_t asked;
    bool stop;
    {
      MutexLock lock(mu_);
      cv_.wait_for(mu_, opts_.flush_interval,
                   [&]() REQUIRES(mu_) { return closing_ || flush_asked_ > flush_done_; });
      batch.swap(pending_);
      asked = flush_asked_;
      stop = closing_;
    }
    if (!batch.empty()) write(batch);
    batch.clear();
    {
      MutexLock lock(mu_);
      flush_done_ = asked;
      total_ = bytes_;
    }
    cv_.notify_all();
    if (stop) return;
  }
}

void StateStore::write(std::unordered_map<std::string, Row>& batch) {
  std::string why;
  sqlite3_stmt* put = nullptr;
  sqlite3_stmt* del = nullptr;
  // The notes this commit sets ("" clears one).
  std::vector<std::pair<std::string, std::string>> notes;
  bool ok = exec(db_, "BEGIN IMMEDIATE", &why);
  ok = ok &&
       sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO tag_state VALUES(?1,?2,?3,?4,?5,?6,?7,?8)",
                          -1, &put, nullptr) == SQLITE_OK;
  ok = ok &&
       sqlite3_prepare_v2(db_, "DELETE FROM tag_state WHERE id=?1", -1, &del, nullptr) == SQLITE_OK;
  // Sizes change only once the commit is done.
  std::unordered_map<std::string, std::size_t> sizes;
  std::size_t bytes = bytes_;
  auto old_size = [&](const std::string& id) -> std::size_t {
    if (auto it = sizes.find(id); it != sizes.end()) return it->second;
    auto it = sizes_.find(id);
    return it == sizes_.end() ? 0 : it->second;
  };
  for (auto& [id, r] : batch) {
    if (!ok) break;
    const std::size_t before = old_size(id);
    if (r.erase) {
      sqlite3_bind_blob(del, 1, id.data(), static_cast<int>(id.size()), SQLITE_STATIC);
      ok = sqlite3_step(del) == SQLITE_DONE;
      sqlite3_reset(del);
      bytes -= before;
      sizes[id] = 0;
      continue;
    }
    const std::string value = encode_blob(r.value.value);
    std::string state = r.has_state ? encode_blob(r.state) : std::string();
    bool has_state = r.has_state;
    std::size_t size =
        id.size() + value.size() + state.size() + r.script_sha256.size() + kRowOverhead;
    std::string note;
    if (bytes - before + size > opts_.max_bytes) {
      note = "state store: max_state_store_bytes (" + std::to_string(opts_.max_bytes) +
             ") is reached; " + (has_state ? "this tag's state and value are" : "its value is") +
             " not stored and a restart starts it from {}";
      size = 0;
      // What it had stored is stale from now on: dropped, so a restart does not bring it back.
      sqlite3_bind_blob(del, 1, id.data(), static_cast<int>(id.size()), SQLITE_STATIC);
      ok = sqlite3_step(del) == SQLITE_DONE;
      sqlite3_reset(del);
      (void)has_state;
    } else {
      const std::string_view sv(state);
      const uint32_t crc =
          row_crc(id, r.value.status, r.value.source_time.ticks, r.value.server_time.ticks, value,
                  has_state ? &sv : nullptr, r.script_sha256);
      sqlite3_bind_blob(put, 1, id.data(), static_cast<int>(id.size()), SQLITE_STATIC);
      sqlite3_bind_int64(put, 2, r.value.status);
      sqlite3_bind_int64(put, 3, r.value.source_time.ticks);
      sqlite3_bind_int64(put, 4, r.value.server_time.ticks);
      sqlite3_bind_blob(put, 5, value.data(), static_cast<int>(value.size()), SQLITE_STATIC);
      if (has_state)
        sqlite3_bind_blob(put, 6, state.data(), static_cast<int>(state.size()), SQLITE_STATIC);
      else
        sqlite3_bind_null(put, 6);
      sqlite3_bind_text(put, 7, r.script_sha256.data(), static_cast<int>(r.script_sha256.size()),
                        SQLITE_STATIC);
      sqlite3_bind_int64(put, 8, crc);
      ok = sqlite3_step(put) == SQLITE_DONE;
      sqlite3_reset(put);
      sqlite3_clear_bindings(put);
    }
    bytes = bytes - before + size;
    sizes[id] = size;
    notes.emplace_back(id, std::move(note));
  }
  if (!ok && why.empty()) why = sqlite3_errmsg(db_);
  sqlite3_finalize(put);
  sqlite3_finalize(del);
  ok = ok && exec(db_, "COMMIT", &why);
  if (!ok) {
    std::string ignored;
    (void)exec(db_, "ROLLBACK", &ignored);
    spdlog::error("state store: a commit of {} tags failed: {}; retried after {} ms", batch.size(),
                  printable(why), opts_.flush_interval.count());
    // Back into the handoff, behind anything newer.
    MutexLock lock(mu_);
    if (closing_) return;
    for (auto& [id, r] : batch)
      if (!pending_.count(id)) pending_.emplace(id, std::move(r));
    return;
  }
  bytes_ = bytes;
  for (auto& [id, size] : sizes) {
    if (size == 0)
      sizes_.erase(id);
    else
      sizes_[id] = size;
  }
  MutexLock lock(mu_);
  for (auto& [id, note] : notes) {
    if (note.empty()) {
      notes_.erase(id);
      continue;
    }
    auto [it, fresh] = notes_.try_emplace(id, note);
    if (fresh) spdlog::warn("tag '{}': {}", printable(id), note);
  }
}

}  // namespace outrun::daemon

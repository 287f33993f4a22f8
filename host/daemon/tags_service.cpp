// The tags service (design/daemon.md "Tags"): its start and stop, the tags thread (DefineTags,
// RemoveTags and the SIGHUP reload of the tags file wait for the waves that are running and
// compile in the workers, so they run there, not on the loop), the read thread, the state store,
// the ListTags document.
#include "tags_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conn.h"
#include "tags_file.h"

namespace outrun::daemon {

namespace {

// ListTags pages (design/protocol.md "Paged ListTags"): at most this many tags, and about this
// many bytes of document (one tag at least).
constexpr uint32_t kListTagsDefaultLimit = 10'000;
constexpr uint32_t kListTagsMaxLimit = 10'000;
constexpr std::size_t kListTagsPageBytes = 4u << 20;

}  // namespace

int TagsService::start(Runner& host, TagsLane::Submit lane) {
  tags::TagsOptions to;
  to.on_change = [this](const std::vector<tags::Change>& ch) { on_changes(ch); };
  to.max_tags = cfg_.max_tags;
  to.max_sources = cfg_.max_tag_sources;
  to.max_source_bytes = cfg_.max_tag_source_bytes;
  to.max_source_value_bytes = cfg_.max_tag_source_value_bytes;
  to.max_log_bytes = cfg_.max_log_bytes;
  to.on_log = [](std::string_view id, const std::vector<LogLine>& lines) {
    if (!spdlog::should_log(spdlog::level::debug)) return;
    for (const LogLine& l : lines)
      spdlog::debug("tag '{}': {}: {}", id, detail::script_level_name(l.level), l.text);
  };
  if (!cfg_.state_dir.empty() && !open_state_store(&to)) return 1;
  lane_ = std::make_unique<TagsLane>(std::move(lane), host);
  if (Error e = tags::Engine::create(*lane_, std::move(to), &engine_)) {
    spdlog::critical("cannot start the tags engine: {}", e.message);
    return 3;
  }
  // A broken tag gets BadConfigurationError and the others run (not strict). A file that
  // cannot be read as a whole (missing, TOML syntax, [defaults]) -- or any error, strict --
  // is a configuration error: exit 2 (the unit's RestartPreventExitStatus=2: no restart loop).
  if (!cfg_.tags_file.empty() && !apply_tags_file("start")) {
    stop();
    return 2;
  }
  jobs_thread_ = std::thread([this] { jobs_main(); });
  reads_thread_ = std::thread([this] { reads_main(); });
  return 0;
}

void TagsService::stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    MutexLock lock(tq_mu_);
    tq_stop_ = true;
  }
  stopping_.store(true, std::memory_order_release);
  tq_cv_.notify_all();
  { MutexLock lock(rq_mu_); }  // the read thread is waiting, or sees stopping_
  rq_cv_.notify_all();
  if (jobs_thread_.joinable()) jobs_thread_.join();
  if (reads_thread_.joinable()) reads_thread_.join();
  engine_.reset();  // before the Host it runs on
  // After the engine: what it published last is committed.
  if (store_) store_->close();
}

bool TagsService::post_job(std::function<void()> job) {
  {
    MutexLock lock(tq_mu_);
    if (tq_stop_ || tq_.size() >= kMaxJobs) return false;
    tq_.push_back(std::move(job));
  }
  tq_cv_.notify_one();
  return true;
}

void TagsService::request_reload() {
  {
    MutexLock lock(tq_mu_);
    reload_requested_ = true;
  }
  tq_cv_.notify_one();
}

void TagsService::jobs_main() {
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(tq_mu_);
      tq_cv_.wait(tq_mu_,
                  [&]() REQUIRES(tq_mu_) { return tq_stop_ || reload_requested_ || !tq_.empty(); });
      if (tq_stop_) return;     // what is left is for connections that are closed by now
      if (reload_requested_) {  // a reload goes first, whatever clients queued
        reload_requested_ = false;
        uint64_t covers = 0;
        {
          MutexLock r(reload_mu_);
          covers = reload_seen_;  // every SIGHUP so far: this reload reads the file after them
        }
        job = [this, covers] { reload(covers); };
      } else {
        job = std::move(tq_.front());
        tq_.pop_front();
      }
    }
    job();
  }
}

bool TagsService::post_read(uint64_t conn, std::function<void()> job) {
  {
    MutexLock lock(rq_mu_);
    if (stopping_.load(std::memory_order_acquire) || rq_count_ >= kMaxJobs) return false;
    auto& q = rq_[conn];
    if (q.size() >= cfg_.max_tag_reads_per_client) {
      if (q.empty()) rq_.erase(conn);
      return false;
    }
    if (q.empty()) rq_ring_.push_back(conn);
    q.push_back(std::move(job));
    ++rq_count_;
    reads_.fetch_add(1, std::memory_order_relaxed);
  }
  rq_cv_.notify_one();
  return true;
}

void TagsService::reads_main() {
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(rq_mu_);
      rq_cv_.wait(rq_mu_, [&]() REQUIRES(rq_mu_) {
        return stopping_.load(std::memory_order_acquire) || !rq_ring_.empty();
      });
      if (stopping_.load(std::memory_order_acquire)) {
        // The jobs left answer nothing: their connections are closed by now. Each held the
        // drain open (reads_); nothing waits for that count any more.
        return;
      }
      // The connection at the front runs one read and goes to the back if it has more.
      const uint64_t conn = rq_ring_.front();
      rq_ring_.pop_front();
      auto it = rq_.find(conn);
      job = std::move(it->second.front());
      it->second.pop_front();
      --rq_count_;
      if (it->second.empty())
        rq_.erase(it);
      else
        rq_ring_.push_back(conn);
    }
    job();
    reads_.fetch_sub(1, std::memory_order_release);
  }
}

void TagsService::set_declarations(tags::file::Declarations d, bool replace) {
  MutexLock l(decls_mu_);
  if (!replace && decls_) {
    auto merged = std::make_shared<tags::file::Declarations>(*decls_);
    merged->merge(d);
    decls_ = std::move(merged);
  } else {
    decls_ = std::make_shared<const tags::file::Declarations>(std::move(d));
  }
}

bool TagsService::open_state_store(tags::TagsOptions* to) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(cfg_.state_dir, ec)) {
    if (fs::create_directories(cfg_.state_dir, ec); !ec)
      fs::permissions(cfg_.state_dir, fs::perms::owner_all, fs::perm_options::replace, ec);
    if (ec || !fs::is_directory(cfg_.state_dir)) {
      spdlog::critical("cannot create the state directory {}: {}",
                       tags::file::printable(cfg_.state_dir), ec.message());
      return false;
    }
  }
  StateStoreOptions so;
  so.dir = cfg_.state_dir;
  so.flush_interval = cfg_.state_flush;
  so.max_bytes = cfg_.max_state_store_bytes;
  StateStoreOpened opened;
  std::string err;
  if (!StateStore::open(so, &store_, &opened, &err)) {
    spdlog::critical("{}", tags::file::printable(err));
    return false;
  }
  if (!opened.set_aside.empty())
    to->restore_note = "state store: the store was unusable (" +
                       tags::file::printable(opened.set_aside_reason) + ") and was moved to " +
                       opened.set_aside + "; the tag starts from {}";
  to->restored = std::move(opened.rows);
  to->state_sink = store_;
  return true;
}

void TagsService::note_sighup() {
  MutexLock lock(reload_mu_);
  ++reload_seen_;
  if (cfg_.tags_file.empty()) {  // the logs are reopened: that was all
    reload_covered_ = reload_seen_;
    reload_ok_ = true;
    reload_errors_.clear();
  }
}

void TagsService::reload(uint64_t covers) {
  std::vector<std::string> errors;
  const bool ok = apply_tags_file("SIGHUP", &errors);
  constexpr std::size_t kMaxKept = 100;  // the first errors say what to fix; the log has all
  if (errors.size() > kMaxKept) errors.resize(kMaxKept);
  MutexLock lock(reload_mu_);
  reload_covered_ = covers;
  reload_ok_ = ok;
  reload_errors_ = std::move(errors);
}

bool TagsService::apply_tags_file(const char* when, std::vector<std::string>* errors) {
  const std::string file = tags::file::printable(cfg_.tags_file);
  std::vector<tags::TagDefinition> defs;
  std::vector<std::string> file_errors;
  tags::ApplyResult res;
  Error e;
  tags::file::Declarations decls;
  if (tags::file::load_tags_file(cfg_.tags_file, &defs, &file_errors, &decls)) {
    tags::ApplyOptions o;
    o.replace_all = true;
    o.strict = cfg_.tags_strict;
    e = engine_->apply(defs, o, &res);
    if (!e) set_declarations(std::move(decls), true);
  }
  // Every error, each on its own line (an operator fixes them all in one edit).
  for (const auto& line : tags::file::describe_errors(file_errors, res.errors)) {
    spdlog::error("{}: {}", when, line);
    if (errors) errors->push_back(line);
  }
  if (!file_errors.empty() || e) {
    if (e) {
      spdlog::error("{}: tags file {}: {}: {}", when, file, to_string(e.code),
                    tags::file::printable(e.message));
      if (errors)
        errors->push_back(file + ": " + std::string(to_string(e.code)) + ": " +
                          tags::file::printable(e.message));
    }
    spdlog::error("{}: tags file {} not applied; {}", when, file,
                  engine_->ids().empty() ? "no tags are defined" : "the running tags are kept");
    return false;
  }
  std::size_t broken = 0;
  for (const auto& err : res.errors) broken += err.installed ? 1 : 0;
  spdlog::info(
      "{}: tags file {}: {} defined or changed, {} unchanged, {} removed, {} broken "
      "(BadConfigurationError)",
      when, file, res.defined.size(), res.unchanged.size(), res.removed.size(), broken);
  return true;
}

TagsService::ReloadStats TagsService::reload_stats() const {
  MutexLock lock(reload_mu_);
  return ReloadStats{reload_seen_, reload_covered_, reload_ok_, reload_errors_};
}

Error TagsService::list_json(std::string_view after, uint32_t limit, std::string* out) const {
  if (limit == 0) limit = kListTagsDefaultLimit;
  limit = std::min(limit, kListTagsMaxLimit);
  std::vector<tags::TagInfo> page;
  bool more = false;
  if (Error e = engine_->page(after, limit, kListTagsPageBytes, &page, &more)) return e;
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (tags::TagInfo& info : page) {
    const std::string& id = info.definition.id;
    nlohmann::ordered_json d = tags::file::definition_to_json(info.definition);
    nlohmann::ordered_json j;
    j["id"] = id;
    for (const char* k :
         {"type", "trigger", "period_ms", "max_age_ms", "timestamps", "inputs", "keep_state"})
      if (d.contains(k)) j[k] = d[k];
    j["value"] = tags::file::change_to_json(id, info.value);
    const tags::TagCounters& tc = info.counters;
    nlohmann::ordered_json by_status = nlohmann::ordered_json::object();
    for (int i = 0; i < kStatusCount; ++i)
      if (tc.by_status[i])
        by_status[std::string(to_string(static_cast<Status>(i)))] = tc.by_status[i];
    j["counters"] = {{"evaluations", tc.evaluations},
                     {"by_status", by_status},
                     {"coalesced", tc.coalesced},
                     {"overflows", tc.overflows},
                     {"skipped_bad", tc.skipped_bad},
                     {"busy", tc.busy},
                     {"changes", tc.changes},
                     {"last_error", tc.last_error},
                     {"last_duration_us", tc.last_duration.count()}};
    // What the state store says of this tag (design/daemon.md "State store"); "" when all is well.
    j["counters"]["state_store"] = tc.state_store;
    j["version"] = info.version;
    arr.push_back(std::move(j));
  }
  nlohmann::ordered_json doc{{"tags", std::move(arr)}, {"total", engine_->size()}};
  if (after.empty()) {  // the declarations, on the first page
    std::shared_ptr<const tags::file::Declarations> decls;
    {
      MutexLock l(decls_mu_);
      decls = decls_;
    }
    if (decls) {
      doc["sources"] = decls->sources;
      doc["alarms"] = decls->alarms;
    } else {
      doc["sources"] = nlohmann::ordered_json::array();
      doc["alarms"] = nlohmann::ordered_json::array();
    }
  }
  doc["next"] = more && !page.empty() ? nlohmann::ordered_json(page.back().definition.id)
                                      : nlohmann::ordered_json(nullptr);
  *out = doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return {};
}

}  // namespace outrun::daemon

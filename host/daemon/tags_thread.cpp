// The tags thread: DefineTags, RemoveTags and the SIGHUP reload of the tags file wait for the
// waves that are running and compile in the workers, so they run here, not on the loop
// (design/daemon.md "Tags").
#include <spdlog/spdlog.h>

#include <filesystem>
#include <string>
#include <vector>

#include "server.h"
#include "tags_file.h"

namespace outrun::daemon {

namespace {
constexpr std::size_t kMaxTagsJobs = 64;
}  // namespace

bool Server::post_tags_job(std::function<void()> job) {
  {
    MutexLock lock(tq_mu_);
    if (tq_stop_ || tq_.size() >= kMaxTagsJobs) return false;
    tq_.push_back(std::move(job));
  }
  tq_cv_.notify_one();
  return true;
}

void Server::request_reload() {
  {
    MutexLock lock(tq_mu_);
    reload_requested_ = true;
  }
  tq_cv_.notify_one();
}

void Server::tags_thread_main() {
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
        job = [this, covers] { reload_tags(covers); };
      } else {
        job = std::move(tq_.front());
        tq_.pop_front();
      }
    }
    job();
  }
}

bool Server::post_read_job(uint64_t conn, std::function<void()> job) {
  {
    MutexLock lock(rq_mu_);
    if (tags_stopping_.load(std::memory_order_acquire) || rq_count_ >= kMaxTagsJobs) return false;
    auto& q = rq_[conn];
    if (q.size() >= cfg_.max_tag_reads_per_client) {
      if (q.empty()) rq_.erase(conn);
      return false;
    }
    if (q.empty()) rq_ring_.push_back(conn);
    q.push_back(std::move(job));
    ++rq_count_;
  }
  rq_cv_.notify_one();
  return true;
}

void Server::tags_read_thread_main() {
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(rq_mu_);
      rq_cv_.wait(rq_mu_, [&]() REQUIRES(rq_mu_) {
        return tags_stopping_.load(std::memory_order_acquire) || !rq_ring_.empty();
      });
      if (tags_stopping_.load(std::memory_order_acquire)) {
        // The jobs left answer nothing: their connections are closed by now. Each held the
        // drain open (tags_reads_); nothing waits for that count any more.
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
  }
}

void Server::set_declarations(tags::file::Declarations d, bool replace) {
  MutexLock l(decls_mu_);
  if (!replace && decls_) {
    auto merged = std::make_shared<tags::file::Declarations>(*decls_);
    merged->merge(d);
    decls_ = std::move(merged);
  } else {
    decls_ = std::make_shared<const tags::file::Declarations>(std::move(d));
  }
}

bool Server::open_state_store(tags::TagsOptions* to) {
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
  if (!StateStore::open(so, &state_store_, &opened, &err)) {
    spdlog::critical("{}", tags::file::printable(err));
    return false;
  }
  if (!opened.set_aside.empty())
    to->restore_note = "state store: the store was unusable (" +
                       tags::file::printable(opened.set_aside_reason) + ") and was moved to " +
                       opened.set_aside + "; the tag starts from {}";
  to->restored = std::move(opened.rows);
  to->state_sink = state_store_;
  return true;
}

void Server::note_sighup() {
  MutexLock lock(reload_mu_);
  ++reload_seen_;
  if (cfg_.tags_file.empty()) {  // the logs are reopened: that was all
    reload_covered_ = reload_seen_;
    reload_ok_ = true;
    reload_errors_.clear();
  }
}

void Server::reload_tags(uint64_t covers) {
  std::vector<std::string> errors;
  const bool ok = apply_tags_file("SIGHUP", &errors);
  constexpr std::size_t kMaxKept = 100;  // the first errors say what to fix; the log has all
  if (errors.size() > kMaxKept) errors.resize(kMaxKept);
  MutexLock lock(reload_mu_);
  reload_covered_ = covers;
  reload_ok_ = ok;
  reload_errors_ = std::move(errors);
}

bool Server::apply_tags_file(const char* when, std::vector<std::string>* errors) {
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
    e = tags_->apply(defs, o, &res);
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
                  tags_->ids().empty() ? "no tags are defined" : "the running tags are kept");
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

}  // namespace outrun::daemon

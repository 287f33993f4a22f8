// The tags thread: DefineTags, RemoveTags and the SIGHUP reload of the tags file wait for the
// waves that are running and compile in the workers, so they run here, not on the loop
// (design/daemon.md "Tags").
#include <spdlog/spdlog.h>

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

void Server::tags_thread_main() {
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(tq_mu_);
      tq_cv_.wait(tq_mu_, [&]() REQUIRES(tq_mu_) { return tq_stop_ || !tq_.empty(); });
      if (tq_stop_) return;  // what is left is for connections that are closed by now
      job = std::move(tq_.front());
      tq_.pop_front();
    }
    job();
  }
}

void Server::reload_tags() {
  std::vector<tags::TagDefinition> defs;
  std::string why;
  if (!tags::file::load_tags_file(cfg_.tags_file, &defs, &why)) {
    spdlog::error("SIGHUP: tags file {}: {}; the running tags are kept", cfg_.tags_file, why);
    return;
  }
  if (Error e = tags_->apply(defs, /*replace_all=*/true)) {
    spdlog::error("SIGHUP: tags file {}: {}: {}; the running tags are kept", cfg_.tags_file,
                  to_string(e.status), e.message);
    return;
  }
  spdlog::info("SIGHUP: defined {} tags from {}", defs.size(), cfg_.tags_file);
}

}  // namespace outrun::daemon

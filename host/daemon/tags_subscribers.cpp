// Tags subscribers (design/daemon.md "Subscribers"): each wave's changes to the connections that
// subscribed to them, and only the latest value per tag for one over max_subscriber_bytes.
#include <spdlog/spdlog.h>

#include <string>
#include <utility>
#include <vector>

#include "conn.h"
#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/frame.h"
#include "tags_service.h"
#include "tags_wire.h"

namespace outrun::daemon {

namespace {

using ChangeRef = std::pair<const std::string*, const tags::DataValue*>;

// One TagChanges frame per ~4 MiB of changes, in order.
void write_changes(protocol::FrameWriter& w, const std::vector<ChangeRef>& items) {
  auto& f = t_changes_fbb;
  f.Clear();
  std::vector<flatbuffers::Offset<wire::TagValue>> offs;
  auto flush = [&] {
    if (offs.empty()) return;
    const auto frame = protocol::encode_tag_changes(f, offs);
    if (frame.size() <= protocol::kMaxFrameSize)
      w.write(frame);
    else
      spdlog::warn("a TagChanges frame of {} bytes was dropped (more than a frame holds)",
                   frame.size());
    offs.clear();
    f.Clear();
  };
  for (const auto& [tag, dv] : items) {
    offs.push_back(detail::encode_tag_entry(f, *tag, *dv));
    if (f.GetSize() > (4u << 20)) flush();
  }
  flush();
}

}  // namespace

void TagsService::on_changes(const std::vector<tags::Change>& changes) {
  MutexLock lock(sub_mu_);
  std::vector<ChangeRef> mine;
  for (auto& [p, c] : subscribers_) {
    mine.clear();
    for (const auto& ch : changes)
      if (c->sub_all || c->sub_ids.count(ch.tag)) mine.emplace_back(&ch.tag, &ch.value);
    if (mine.empty()) continue;
    if (!c->sub_overflow && c->writer.queued_bytes() > cfg_.max_subscriber_bytes) {
      c->sub_overflow = true;
      spdlog::debug("client {}: tags subscriber over max_subscriber_bytes; keeping latest values",
                    c->id);
    }
    if (c->sub_overflow) {
      for (const auto& [tag, dv] : mine) c->sub_latest[*tag] = *dv;
      continue;
    }
    write_changes(c->writer, mine);
  }
}

namespace {
// sub_mu_ held.
void flush_latest(Conn& c, std::size_t budget) {
  if (!c.sub_overflow || c.gone || c.writer.queued_bytes() > budget / 2) return;
  std::vector<ChangeRef> items;
  items.reserve(c.sub_latest.size());
  for (const auto& [tag, dv] : c.sub_latest) items.emplace_back(&tag, &dv);
  write_changes(c.writer, items);
  c.sub_latest.clear();
  c.sub_overflow = false;
}
}  // namespace

void TagsService::flush_subscriber(Conn& c) {
  MutexLock lock(sub_mu_);
  flush_latest(c, cfg_.max_subscriber_bytes);
}

void TagsService::flush_subscribers() {
  MutexLock lock(sub_mu_);
  for (auto& [p, c] : subscribers_) flush_latest(*c, cfg_.max_subscriber_bytes);
}

Error TagsService::subscribe(const std::shared_ptr<Conn>& c, bool cancel,
                             const std::vector<std::string>& ids) {
  // An id may name a tag that does not exist yet (a watcher started before the definitions,
  // a subscription renewed after a restart), so the bound is per connection: at most
  // max_subscribed_ids ids (design/daemon.md "Tags bounds").
  MutexLock lock(sub_mu_);
  if (cancel) {
    if (ids.empty()) {
      c->sub_all = false;
      c->sub_ids.clear();
    } else {
      for (const auto& id : ids) c->sub_ids.erase(id);
    }
    if (!c->sub_all && c->sub_ids.empty()) {
      subscribers_.erase(c.get());
      c->sub_latest.clear();
      c->sub_overflow = false;
    }
    return {};
  }
  if (c->sub_ids.size() + ids.size() > cfg_.max_subscribed_ids)
    return Error{ErrorCode::invalid_argument, "more than max_subscribed_ids (" +
                                                  std::to_string(cfg_.max_subscribed_ids) +
                                                  ") subscribed ids on one connection"};
  if (ids.empty())
    c->sub_all = true;
  else
    c->sub_ids.insert(ids.begin(), ids.end());
  subscribers_[c.get()] = c;
  return {};
}

void TagsService::forget(Conn& c) {
  {
    MutexLock lock(sub_mu_);
    c.gone = true;
    subscribers_.erase(&c);
    c.sub_latest.clear();
  }
  // The source tags it created that no tag uses go with it (design/daemon.md "Tags bounds").
  if (c.made_sources && engine_) engine_->forget_sources(c.id);
}

}  // namespace outrun::daemon

// Tags subscribers (design/daemon.md "Subscribers"): each wave's changes to the connections that
// subscribed to them, and only the latest value per tag for one over max_subscriber_bytes.
#include <spdlog/spdlog.h>

#include <string>
#include <utility>
#include <vector>

#include "conn.h"
#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/frame.h"
#include "server.h"
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

void Server::on_tag_changes(const std::vector<tags::Change>& changes) {
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

void Server::flush_subscriber(Conn* c) {
  MutexLock lock(sub_mu_);
  flush_latest(*c, cfg_.max_subscriber_bytes);
}

void Server::flush_subscribers() {
  MutexLock lock(sub_mu_);
  for (auto& [p, c] : subscribers_) flush_latest(*c, cfg_.max_subscriber_bytes);
}

}  // namespace outrun::daemon

// Helpers shared by the libFuzzer targets (design/fuzzing.md): a checked assertion that
// survives NDEBUG, an independent model of the frame stream, and a walk that reads every field
// of a verified frame (so ASan sees any read the verifier should have refused).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "outrun/protocol/frame.h"
#include "outrun/protocol/messages.h"
#include "outrun/protocol/outrun_generated.h"

// A failed invariant is a crash: libFuzzer saves the input and stops.
#define FUZZ_CHECK(cond)                                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

namespace outrun::fuzz {

using ByteVec = std::vector<uint8_t>;

inline uint32_t load_le32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// An 8-aligned copy of some bytes (verify_frame needs an aligned frame).
class Aligned {
 public:
  explicit Aligned(std::span<const uint8_t> bytes)
      : words_((bytes.size() + 7) / 8 + 1), size_(bytes.size()) {
    if (!bytes.empty()) std::memcpy(words_.data(), bytes.data(), bytes.size());
  }
  uint8_t* data() { return reinterpret_cast<uint8_t*>(words_.data()); }
  std::size_t size() const { return size_; }

 private:
  std::vector<uint64_t> words_;
  std::size_t size_;
};

// What the protocol says a stream holds, computed without FrameReader: the frames (offset and
// size in the stream, length prefix included) up to the first frame that breaks a rule, and
// why the stream stops there.
struct StreamModel {
  struct Frame {
    std::size_t offset;
    std::size_t size;
    wire::Body body;
  };
  std::vector<Frame> frames;
  protocol::FrameError error = protocol::FrameError::kNone;  // kNone: ends in a partial frame
  std::size_t consumed = 0;                                  // bytes of the complete, valid frames
};

inline StreamModel model_stream(std::span<const uint8_t> s,
                                uint32_t max_frame = protocol::kMaxFrameSize) {
  StreamModel m;
  std::size_t p = 0;
  while (s.size() - p >= protocol::kLengthPrefixSize) {
    const uint32_t len = load_le32(s.data() + p);
    if (len > max_frame) {
      m.error = protocol::FrameError::kOversized;
      break;
    }
    if (len < protocol::kMinFrameSize) {
      m.error = protocol::FrameError::kUndersized;
      break;
    }
    const std::size_t total = protocol::kLengthPrefixSize + len;
    if (s.size() - p < total) break;
    Aligned copy(s.subspan(p, total));
    const wire::Frame* f = protocol::verify_frame(copy.data(), total);
    if (f == nullptr) {
      m.error = protocol::FrameError::kMalformed;
      break;
    }
    m.frames.push_back({p, total, f->body_type()});
    p += total;
  }
  m.consumed = p;
  return m;
}

// Reads every field of a verified frame, recursively; returns a checksum so nothing is
// optimised away. A verifier gap shows up here as an ASan report.
inline uint64_t touch_value(const wire::Value* v, int depth = 0) {
  if (v == nullptr) return 1;
  uint64_t h = static_cast<uint64_t>(v->kind()) + static_cast<uint64_t>(v->int_value()) +
               (v->bool_value() ? 3 : 0);
  double d = v->double_value();
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  h ^= bits;
  if (const auto* s = v->string_value()) h += std::string(s->c_str(), s->size()).size();
  if (const auto* b = v->bytes_value())
    for (uint8_t x : *b) h = h * 31 + x;
  if (const auto* keys = v->keys())
    for (const auto* k : *keys)
      h += k->size() + (k->size() ? uint8_t(k->c_str()[k->size() - 1]) : 0);
  if (const auto* items = v->items())
    for (const auto* it : *items) h = h * 7 + touch_value(it, depth + 1);
  return h;
}

inline uint64_t touch_frame(const wire::Frame* f) {
  uint64_t h = static_cast<uint64_t>(f->body_type());
  switch (f->body_type()) {
    case wire::Body::Hello: {
      const auto* b = f->body_as_Hello();
      h += b->protocol_version() + static_cast<uint64_t>(b->pid());
      break;
    }
    case wire::Body::Evaluate:
      if (const auto* items = f->body_as_Evaluate()->items()) {
        for (const auto* e : *items) {
          h += e->id() + e->script_id() + e->timeout_us();
          if (const auto* s = e->sha256()) h += s->size() ? (*s)[s->size() - 1] : 0;
          if (const auto* s = e->source()) h += s->size();
          if (const auto* s = e->chunk_name()) h += std::strlen(s->c_str());
          if (const auto* ins = e->inputs())
            for (const auto* in : *ins) h += in->name()->size() + touch_value(in->value());
        }
      }
      break;
    case wire::Body::Results:
      if (const auto* items = f->body_as_Results()->items()) {
        for (const auto* r : *items) {
          h += r->id() + static_cast<uint64_t>(r->status()) + touch_value(r->value());
          if (const auto* e = r->error()) h += e->size();
        }
      }
      break;
    case wire::Body::Shutdown:
      h += 5;
      break;
    // Client <-> daemon frames (design/daemon.md) share the schema and the framing.
    case wire::Body::ClientHello: {
      const auto* b = f->body_as_ClientHello();
      h += b->protocol_version();
      if (const auto* s = b->client_name()) h += s->str().size();
      break;
    }
    case wire::Body::ServerHello: {
      const auto* b = f->body_as_ServerHello();
      h += b->protocol_version() + static_cast<uint64_t>(b->shards()) + b->max_inflight();
      if (const auto* s = b->server_version()) h += s->str().size();
      if (const auto* s = b->error()) h += s->str().size();
      break;
    }
    case wire::Body::Register: {
      const auto* b = f->body_as_Register();
      h += b->request_id();
      if (const auto* s = b->key()) h += s->str().size();
      if (const auto* s = b->source()) h += s->str().size();
      break;
    }
    case wire::Body::Registered: {
      const auto* b = f->body_as_Registered();
      h += b->request_id() + static_cast<uint64_t>(b->status()) + b->handle() +
           static_cast<uint64_t>(b->shard());
      if (const auto* s = b->error()) h += s->str().size();
      break;
    }
    case wire::Body::Control: {
      const auto* b = f->body_as_Control();
      h +=
          b->request_id() + static_cast<uint64_t>(b->command()) + static_cast<uint64_t>(b->shard());
      break;
    }
    case wire::Body::ControlReply: {
      const auto* b = f->body_as_ControlReply();
      h += b->request_id() + static_cast<uint64_t>(b->status());
      if (const auto* s = b->error()) h += s->str().size();
      if (const auto* s = b->json()) h += s->str().size();
      break;
    }
    default:
      break;
  }
  return h;
}

}  // namespace outrun::fuzz

#include "compile_only.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "outrun/protocol/frame.h"
#include "outrun/protocol/messages.h"
#include "outrun/protocol/worker_exit.h"
#include "sandbox.h"
#include "worker.h"

namespace outrun::worker {

using protocol::exit_code;
using protocol::WorkerExit;

namespace {

// One sandboxed state compiles every source in turn (compile() drops the previous chunk first);
// nothing is ever called in it. A fresh one after a compile that ran out of memory, and every
// kStateUses compiles, so that what one source left interned never weighs on many others.
constexpr int kStateUses = 4096;
// The host keeps no bytecode past kMaxBytecodeSize, and a Compiled frame stays below 12 MiB:
// what does not fit is answered MemoryLimit, and that script keeps its source path.
constexpr std::size_t kMaxAnswerBytes = 12u << 20;

class Compiler {
 public:
  explicit Compiler(const CompileOnlyOptions& o) : opts_(o) {}

  // Answers one Compile frame with one Compiled frame; false when the host cannot be written to.
  bool answer(const wire::Compile* c) {
    fbb_.Clear();
    items_.clear();
    if (const auto* items = c->items()) {
      items_.reserve(items->size());
      for (const wire::CompileItem* item : *items) items_.push_back(compile_one(item));
    }
    return send_all(opts_.out_fd, protocol::finish_compiled(fbb_, items_));
  }

 private:
  flatbuffers::Offset<wire::CompiledItem> compile_one(const wire::CompileItem* item) {
    const auto* src = item->source();
    const auto* name = item->chunk_name();
    if (!state_ || uses_ >= kStateUses) {
      std::string err;
      state_.reset();
      state_ = sandbox::ScriptState::create(opts_.memory_limit, &err);
      uses_ = 0;
      if (!state_)
        return protocol::build_compiled(fbb_, item->ticket(), wire::Status::MemoryLimit, {}, err);
    }
    ++uses_;
    // The same chunk name the worker gives a source it compiles itself (Worker::script_for).
    const sandbox::Outcome out = state_->compile(
        src ? src->string_view() : std::string_view{},
        sandbox::chunk_name_for(name ? std::optional(name->string_view()) : std::nullopt));
    if (opts_.page) opts_.page->compiles.fetch_add(1, std::memory_order_relaxed);
    if (out.status != wire::Status::Ok) {
      if (out.status == wire::Status::MemoryLimit) state_.reset();
      return protocol::build_compiled(fbb_, item->ticket(), out.status, {}, out.error);
    }
    bytecode_.clear();
    if (!state_->dump_chunk(&bytecode_)) {
      state_.reset();
      return protocol::build_compiled(fbb_, item->ticket(), wire::Status::MemoryLimit, {},
                                      "out of memory writing the bytecode");
    }
    if (bytecode_.size() > protocol::kMaxBytecodeSize ||
        fbb_.GetSize() + bytecode_.size() > kMaxAnswerBytes)
      return protocol::build_compiled(fbb_, item->ticket(), wire::Status::MemoryLimit, {},
                                      "its bytecode is too large to keep");
    if (opts_.hooks && opts_.hooks->compiled) [[unlikely]]
      opts_.hooks->compiled(&bytecode_);
    return protocol::build_compiled(fbb_, item->ticket(), wire::Status::Ok, bytecode_, {});
  }

  const CompileOnlyOptions opts_;
  std::unique_ptr<sandbox::ScriptState> state_;
  int uses_ = 0;
  std::string bytecode_;
  flatbuffers::FlatBufferBuilder fbb_{1u << 16};
  std::vector<flatbuffers::Offset<wire::CompiledItem>> items_;
};

}  // namespace

int run_compile_only(const CompileOnlyOptions& opts) {
  {
    flatbuffers::FlatBufferBuilder fbb(128);
    if (!send_all(opts.out_fd,
                  protocol::encode_hello(fbb, static_cast<int32_t>(platform::current_pid()))))
      return exit_code(WorkerExit::kIo);
  }
  Compiler compiler(opts);
  protocol::FrameReader reader;
  for (;;) {
    const long n = platform::read_frames(reader, opts.fd);
    if (n == 0) return exit_code(WorkerExit::kOk);  // the host closed its end
    if (n < 0) {
      spdlog::error("read from host failed: {}", platform::channel_error_text(n));
      return exit_code(WorkerExit::kIo);
    }
    protocol::FrameView fv;
    while (reader.next(fv)) {
      switch (fv.frame->body_type()) {
        case wire::Body::Compile:
          if (!compiler.answer(fv.frame->body_as_Compile())) return exit_code(WorkerExit::kIo);
          break;
        case wire::Body::Shutdown:
          return exit_code(WorkerExit::kOk);
        default:
          break;  // nothing else is for a compiler; ignored, like a worker's unknown frames
      }
    }
    if (reader.error() != protocol::FrameError::kNone) {
      spdlog::error("protocol violation from host: {}", protocol::to_string(reader.error()));
      return exit_code(WorkerExit::kProtocol);
    }
  }
}

}  // namespace outrun::worker

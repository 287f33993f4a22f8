#include "outrun/protocol/messages.h"

#include <cstdint>
#include <vector>

#include "outrun/protocol/input_list.h"

namespace outrun::protocol {

namespace {
std::span<const uint8_t> bytes_of(const flatbuffers::FlatBufferBuilder& fbb) {
  return {fbb.GetBufferPointer(), fbb.GetSize()};
}
}  // namespace

std::span<const uint8_t> finish_frame(flatbuffers::FlatBufferBuilder& fbb,
                                      flatbuffers::Offset<wire::Frame> frame) {
  fbb.FinishSizePrefixed(frame);
  return bytes_of(fbb);
}

std::span<const uint8_t> finish_frame(flatbuffers::FlatBufferBuilder& fbb, wire::Body type,
                                      flatbuffers::Offset<void> body) {
  return finish_frame(fbb, wire::CreateFrame(fbb, type, body));
}

bool check_worker_status(wire::Status status, std::string* why) {
  switch (status) {
    case wire::Status::Ok:
    case wire::Status::CompileError:
    case wire::Status::RuntimeError:
    case wire::Status::Timeout:
    case wire::Status::MemoryLimit:
    case wire::Status::InvalidArgument:
    case wire::Status::NeedSource:
      return true;
    case wire::Status::Killed:
    case wire::Status::Busy:
    case wire::Status::WorkerLost:
    case wire::Status::Unavailable:
    case wire::Status::Cancelled:
      *why =
          "sent a status only the host may give (" + std::to_string(static_cast<int>(status)) + ")";
      return false;
  }
  *why = "sent an unknown status (" + std::to_string(static_cast<int>(status)) + ")";
  return false;
}

// ---- Host -> worker

flatbuffers::Offset<wire::Evaluation> build_evaluation(
    flatbuffers::FlatBufferBuilder& fbb, uint64_t id, uint32_t script_id, uint64_t timeout_us,
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::Input>>> inputs,
    const ScriptSource* source, flatbuffers::Offset<flatbuffers::Vector<uint8_t>> inputs_buffer,
    uint64_t handle64) {
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> sha, bytecode;
  flatbuffers::Offset<flatbuffers::String> src, name;
  if (source) {
    sha = fbb.CreateVector(source->sha256.data(), source->sha256.size());
    if (!source->bytecode.empty())
      bytecode = fbb.CreateVector(source->bytecode.data(), source->bytecode.size());
    else
      src = fbb.CreateString(source->source.data(), source->source.size());
    if (source->chunk_name)
      name = fbb.CreateString(source->chunk_name->data(), source->chunk_name->size());
  }
  wire::EvaluationBuilder eb(fbb);
  eb.add_id(id);
  eb.add_script_id(script_id);
  eb.add_timeout_us(timeout_us);
  eb.add_inputs(inputs);
  eb.add_inputs_buffer(inputs_buffer);
  eb.add_handle64(handle64);  // 0 (the worker's frames): not written
  if (source) {
    eb.add_sha256(sha);
    eb.add_source(src);
    eb.add_bytecode(bytecode);
    eb.add_chunk_name(name);
  }
  return eb.Finish();
}

flatbuffers::Offset<flatbuffers::Vector<uint8_t>> add_input_list(
    flatbuffers::FlatBufferBuilder& fbb, std::span<const uint8_t> bytes) {
  fbb.ForceVectorAlignment(bytes.size(), 1, 8);
  return fbb.CreateVector(bytes.data(), bytes.size());
}

bool evaluation_input_list(const wire::Evaluation* e, const wire::InputList** out) {
  *out = nullptr;
  const auto* b = e->inputs_buffer();
  if (!b) return true;
  std::size_t budget = kMaxInputListBytes;  // one evaluation's inputs, as the host counts them
  InputListVerdict verdict;
  *out = check_input_list(b->data(), b->size(), &budget, &verdict);
  return *out != nullptr;
}

std::span<const uint8_t> finish_evaluate(
    flatbuffers::FlatBufferBuilder& fbb,
    std::span<const flatbuffers::Offset<wire::Evaluation>> items) {
  auto vec = fbb.CreateVector(items.data(), items.size());
  return finish_frame(fbb, wire::Body::Evaluate, wire::CreateEvaluate(fbb, vec).Union());
}

std::span<const uint8_t> encode_shutdown(flatbuffers::FlatBufferBuilder& fbb) {
  return finish_frame(fbb, wire::Body::Shutdown, wire::CreateShutdown(fbb).Union());
}

std::span<const uint8_t> encode_forget(flatbuffers::FlatBufferBuilder& fbb,
                                       std::span<const uint32_t> script_ids) {
  auto vec = fbb.CreateVector(script_ids.data(), script_ids.size());
  return finish_frame(fbb, wire::Body::Forget, wire::CreateForget(fbb, vec).Union());
}

bool evaluation_source(const wire::Evaluation* e, ScriptSource* out) {
  const auto* src = e->source();
  const auto* sha = e->sha256();
  const auto* bytecode = e->bytecode();
  if ((!src && (!bytecode || bytecode->size() == 0)) || !sha || sha->size() != 32) return false;
  out->sha256 = {sha->data(), sha->size()};
  out->source = src ? src->string_view() : std::string_view{};
  out->bytecode = {};
  if (!src) out->bytecode = {bytecode->data(), bytecode->size()};
  out->chunk_name.reset();
  if (const auto* name = e->chunk_name()) out->chunk_name = name->string_view();
  return true;
}

bool decode_host_frame(const wire::Frame* frame, HostMessage* out, std::string* why) {
  switch (frame->body_type()) {
    case wire::Body::Evaluate:
      *out = EvaluateMsg{frame->body_as_Evaluate()->items()};
      return true;
    case wire::Body::Shutdown:
      *out = ShutdownMsg{};
      return true;
    case wire::Body::Forget:
      *out = ForgetMsg{frame->body_as_Forget()->script_ids()};
      return true;
    default:
      *why = std::string("a frame the host does not send (") +
             wire::EnumNameBody(frame->body_type()) + ")";
      return false;
  }
}

// ---- Host <-> compile-only process

std::span<const uint8_t> encode_compile(flatbuffers::FlatBufferBuilder& fbb,
                                        std::span<const CompileRequest> items) {
  std::vector<flatbuffers::Offset<wire::CompileItem>> offsets;
  offsets.reserve(items.size());
  for (const CompileRequest& r : items) {
    const auto src = fbb.CreateString(r.source.data(), r.source.size());
    const auto name = fbb.CreateString(r.chunk_name.data(), r.chunk_name.size());
    offsets.push_back(wire::CreateCompileItem(fbb, r.ticket, src, name));
  }
  const auto vec = fbb.CreateVector(offsets);
  return finish_frame(fbb, wire::Body::Compile, wire::CreateCompile(fbb, vec).Union());
}

flatbuffers::Offset<wire::CompiledItem> build_compiled(flatbuffers::FlatBufferBuilder& fbb,
                                                       uint32_t ticket, wire::Status status,
                                                       std::string_view bytecode,
                                                       std::string_view error) {
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> code;
  flatbuffers::Offset<flatbuffers::String> err;
  if (status == wire::Status::Ok)
    code = fbb.CreateVector(reinterpret_cast<const uint8_t*>(bytecode.data()), bytecode.size());
  else
    err = fbb.CreateString(error.data(), error.size());
  return wire::CreateCompiledItem(fbb, ticket, status, code, err);
}

std::span<const uint8_t> finish_compiled(
    flatbuffers::FlatBufferBuilder& fbb,
    std::span<const flatbuffers::Offset<wire::CompiledItem>> items) {
  const auto vec = fbb.CreateVector(items.data(), items.size());
  return finish_frame(fbb, wire::Body::Compiled, wire::CreateCompiled(fbb, vec).Union());
}

// ---- Worker -> host

std::span<const uint8_t> encode_hello(flatbuffers::FlatBufferBuilder& fbb, int32_t pid,
                                      uint16_t protocol_version) {
  auto hello = wire::CreateHello(fbb, protocol_version, pid);
  return finish_frame(fbb, wire::Body::Hello, hello.Union());
}

flatbuffers::Offset<wire::Result> build_result(flatbuffers::FlatBufferBuilder& fbb, uint64_t id,
                                               wire::Status status,
                                               flatbuffers::Offset<wire::Value> value,
                                               std::string_view error, LogLinesOffset logs,
                                               uint32_t logs_dropped) {
  flatbuffers::Offset<flatbuffers::String> err;
  if (!error.empty()) err = fbb.CreateString(error.data(), error.size());
  return wire::CreateResult(fbb, id, status, value, err, logs, logs_dropped);
}

std::span<const uint8_t> finish_results(flatbuffers::FlatBufferBuilder& fbb,
                                        std::span<const flatbuffers::Offset<wire::Result>> items) {
  auto vec = fbb.CreateVector(items.data(), items.size());
  return finish_frame(fbb, wire::Body::Results, wire::CreateResults(fbb, vec).Union());
}

bool decode_worker_frame(const wire::Frame* frame, WorkerMessage* out, std::string* why) {
  switch (frame->body_type()) {
    case wire::Body::Hello: {
      const auto* h = frame->body_as_Hello();
      if (h->protocol_version() != kProtocolVersion) {
        *why = "speaks protocol version " + std::to_string(h->protocol_version()) +
               ", host speaks " + std::to_string(kProtocolVersion);
        return false;
      }
      *out = HelloMsg{h->protocol_version(), h->pid()};
      return true;
    }
    case wire::Body::Results:
      *out = ResultsMsg{frame->body_as_Results()->items()};
      return true;
    default:
      *why = "sent an unexpected frame type";
      return false;
  }
}

bool decode_worker_result(const wire::Result* r, ResultView* out, std::string* why) {
  if (!check_worker_status(r->status(), why)) return false;
  out->id = r->id();
  out->status = r->status();
  out->value = r->status() == wire::Status::Ok ? r->value() : nullptr;
  out->error = r->error() ? r->error()->string_view() : std::string_view();
  out->logs = r->logs();
  out->logs_dropped = r->logs_dropped();
  return true;
}

}  // namespace outrun::protocol

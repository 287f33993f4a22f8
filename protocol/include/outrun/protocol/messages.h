// The frame bodies of a worker pipe (host <-> worker): one encoder and one decoder per message.
// The client <-> daemon bodies are in client_messages.h; the rules in design/protocol.md.
//
// Encoders build into the caller's builder and return the finished frame (length prefix
// included), valid until the builder is cleared or reused. They never clear it: it is empty, or
// holds only this frame's children, built before (inputs, values, the Evaluations or Results of
// a batch). finish_frame() is the one place in outrun where a frame is finished.
//
// Decoders take a verified frame (FrameReader::next, verify_frame) and give a typed view whose
// pointers and string_views point into that frame; false, with a reason, for a body that is not
// one of the direction's or breaks its rules.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "outrun/protocol/frame.h"

namespace outrun::protocol {

// The builder of the frames every evaluation passes through (Evaluate, Results), kept by its
// thread or owner for its capacity. Its tables do not share vtables: FlatBuffers otherwise looks
// each new table's vtable up among every distinct one the buffer already has, one memcmp per
// candidate of the same size, which was ~8 % of outrund's CPU per evaluation (design/decisions.md
// D-turn). Unshared, a table carries its own vtable, 8-12 bytes for these.
class HotBuilder : public flatbuffers::FlatBufferBuilder {
 public:
  explicit HotBuilder(std::size_t initial) : flatbuffers::FlatBufferBuilder(initial) {
    DedupVtables(false);
  }
};

// ---- Frames

// Finishes `body`, of type `type`, as a whole frame (size prefix, root table Frame).
std::span<const uint8_t> finish_frame(flatbuffers::FlatBufferBuilder& fbb, wire::Body type,
                                      flatbuffers::Offset<void> body);
// Finishes a Frame table the caller built itself: tests build malformed ones (no body).
std::span<const uint8_t> finish_frame(flatbuffers::FlatBufferBuilder& fbb,
                                      flatbuffers::Offset<wire::Frame> frame);

// ---- Statuses a worker sends

// Worker -> host: Ok, CompileError, RuntimeError, Timeout, MemoryLimit, InvalidArgument and
// NeedSource. Any other status is a protocol violation, the worker is killed: one only the host
// gives (Killed, Busy, WorkerLost, Unavailable, Cancelled: *why "sent a status only the host may
// give (N)") or one this build does not know ("sent an unknown status (N)"). Host and worker are
// built together, so neither is a version difference: it is a broken or subverted worker.
bool check_worker_status(wire::Status status, std::string* why);

// ---- Host -> worker

// The script an Evaluation carries the first time it goes to a worker.
// Either its source, or (from the host's compile-only process, design/sandbox.md "The
// compiler") its bytecode instead: `bytecode` not empty means the source is not sent.
struct ScriptSource {
  std::span<const uint8_t> sha256;  // 32 bytes, of the source
  std::string_view source;
  std::optional<std::string_view> chunk_name;  // the script key; absent: none was sent
  std::span<const uint8_t> bytecode;           // not empty: sent instead of `source`
};

// One Evaluation. `inputs` was built before (null: none), or `inputs_buffer` (an InputList
// FlatBuffer, made by add_input_list); `source` only when the worker may lack the script.
// `timeout_us` 0 is not written (a client's evaluations carry none). `handle64` (a protocol 3
// client's handle to outrund, `script_id` then 0) 0 is not written.
flatbuffers::Offset<wire::Evaluation> build_evaluation(
    flatbuffers::FlatBufferBuilder& fbb, uint64_t id, uint32_t script_id, uint64_t timeout_us,
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::Input>>> inputs,
    const ScriptSource* source, flatbuffers::Offset<flatbuffers::Vector<uint8_t>> inputs_buffer = 0,
    uint64_t handle64 = 0);
// Copies an InputList FlatBuffer's bytes into `fbb` for Evaluation.inputs_buffer, 8-byte aligned
// in the frame (its 8-byte scalars are read in place).
flatbuffers::Offset<flatbuffers::Vector<uint8_t>> add_input_list(
    flatbuffers::FlatBufferBuilder& fbb, std::span<const uint8_t> bytes);
// The InputList of `e`'s inputs_buffer, or null when it has none. False when it has one that
// check_input_list (input_list.h) refuses with one evaluation's limits: not 8-byte aligned in
// memory, not an InputList, inputs over the limits. The frame's verifier does not look inside it.
bool evaluation_input_list(const wire::Evaluation* e, const wire::InputList** out);
// Evaluate { items }: the evaluations built in `fbb` before, in order. Also client -> daemon.
std::span<const uint8_t> finish_evaluate(
    flatbuffers::FlatBufferBuilder& fbb,
    std::span<const flatbuffers::Offset<wire::Evaluation>> items);
std::span<const uint8_t> encode_shutdown(flatbuffers::FlatBufferBuilder& fbb);
std::span<const uint8_t> encode_forget(flatbuffers::FlatBufferBuilder& fbb,
                                       std::span<const uint32_t> script_ids);

// An Evaluation's source: true (and *out) when it carries a source or bytecode with a 32-byte
// SHA-256; false when it names its script by id only (either without a valid SHA-256 counts as
// none). Both sent: the source is taken, the bytecode ignored.
bool evaluation_source(const wire::Evaluation* e, ScriptSource* out);

struct EvaluateMsg {
  // The evaluations, in order; null when the frame has none.
  const flatbuffers::Vector<flatbuffers::Offset<wire::Evaluation>>* items = nullptr;
};
struct ShutdownMsg {};
struct ForgetMsg {
  const flatbuffers::Vector<uint32_t>* script_ids = nullptr;  // null: none
};
using HostMessage = std::variant<EvaluateMsg, ShutdownMsg, ForgetMsg>;
// A frame from the host. false for a body the host does not send (Hello, Results, a client's
// frame): the worker ignores it.
bool decode_host_frame(const wire::Frame* frame, HostMessage* out, std::string* why);

// ---- Worker -> host

std::span<const uint8_t> encode_hello(flatbuffers::FlatBufferBuilder& fbb, int32_t pid,
                                      uint16_t protocol_version = kProtocolVersion);
using LogLinesOffset = flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::LogLine>>>;
// One Result: `value` (built before) with Ok, `error` (written when not empty) otherwise; the
// script's log lines (built before; 0: none) and how many more it dropped, whatever the status.
flatbuffers::Offset<wire::Result> build_result(flatbuffers::FlatBufferBuilder& fbb, uint64_t id,
                                               wire::Status status,
                                               flatbuffers::Offset<wire::Value> value,
                                               std::string_view error, LogLinesOffset logs = 0,
                                               uint32_t logs_dropped = 0);
// Results { items }: the results built in `fbb` before, in order. Also daemon -> client.
std::span<const uint8_t> finish_results(flatbuffers::FlatBufferBuilder& fbb,
                                        std::span<const flatbuffers::Offset<wire::Result>> items);

struct HelloMsg {
  uint16_t protocol_version = 0;
  int32_t pid = 0;
};
struct ResultsMsg {
  const flatbuffers::Vector<flatbuffers::Offset<wire::Result>>* items = nullptr;  // null: none
};
using WorkerMessage = std::variant<HelloMsg, ResultsMsg>;
// A frame from a worker. false (a protocol violation) for a body a worker does not send ("an
// unexpected frame type") and for a Hello of another protocol version ("speaks protocol
// version N, host speaks M"). Whether a Hello comes first and once is the caller's to check.
bool decode_worker_frame(const wire::Frame* frame, WorkerMessage* out, std::string* why);

// ---- Host <-> compile-only process (design/sandbox.md "The compiler")

struct CompileRequest {
  uint32_t ticket = 0;
  std::string_view source;
  std::string_view chunk_name;
};
// Compile { items }.
std::span<const uint8_t> encode_compile(flatbuffers::FlatBufferBuilder& fbb,
                                        std::span<const CompileRequest> items);
// One CompiledItem: `bytecode` with Ok, `error` otherwise.
flatbuffers::Offset<wire::CompiledItem> build_compiled(flatbuffers::FlatBufferBuilder& fbb,
                                                       uint32_t ticket, wire::Status status,
                                                       std::string_view bytecode,
                                                       std::string_view error);
std::span<const uint8_t> finish_compiled(
    flatbuffers::FlatBufferBuilder& fbb,
    std::span<const flatbuffers::Offset<wire::CompiledItem>> items);

// One Result as its receiver sees it.
struct ResultView {
  uint64_t id = 0;
  wire::Status status = wire::Status::Ok;
  const wire::Value* value = nullptr;  // Ok: the value (null: Nil)
  std::string_view error;              // otherwise: the message (may be empty)
  // What the script logged (null: nothing), unchecked: see script_log.h.
  const flatbuffers::Vector<flatbuffers::Offset<wire::LogLine>>* logs = nullptr;
  uint32_t logs_dropped = 0;
};
// A Result from a worker, its status checked by check_worker_status (false: a violation).
bool decode_worker_result(const wire::Result* r, ResultView* out, std::string* why);

}  // namespace outrun::protocol

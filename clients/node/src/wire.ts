// Frames to and from the daemon, on top of the flatc-generated classes (src/generated/).
import * as flatbuffers from 'flatbuffers';
import * as w from './generated/outrun_generated';
// Reached only through Evaluation.inputs_buffer's nested_flatbuffer attribute, which flatc's
// index (outrun_generated.ts) leaves out.
import { InputList } from './generated/outrun/wire/input-list';
import { CheckedByteBuffer, MalformedFrame } from './checked-buffer';
import { EVALUATE_SPLIT_BYTES, MAX_VALUE_DEPTH, PROTOCOL_VERSION } from './constants';
import { DecodeBudget, InvalidValue, OutputValue, WireInputs, WireValue } from './values';
import { decodeAnyValue } from './value-decoder';

export { w, InputList };

// ---- encoding ----

function finish(b: flatbuffers.Builder, type: w.Body, body: flatbuffers.Offset): Uint8Array {
  const frame = w.Frame.createFrame(b, type, body);
  w.Frame.finishSizePrefixedFrameBuffer(b, frame);
  return b.asUint8Array().slice(); // copy: the builder's buffer is reused
}

export function clientHello(name: string): Uint8Array {
  const b = new flatbuffers.Builder(256);
  const n = b.createString(name);
  w.ClientHello.startClientHello(b);
  w.ClientHello.addProtocolVersion(b, PROTOCOL_VERSION);
  w.ClientHello.addClientName(b, n);
  return finish(b, w.Body.ClientHello, w.ClientHello.endClientHello(b));
}

export function register(requestId: number, key: string, source: string, check = false): Uint8Array {
  const b = new flatbuffers.Builder(256 + source.length);
  const k = b.createString(key);
  const s = b.createString(source);
  return finish(b, w.Body.Register, w.Register.createRegister(b, BigInt(requestId), k, s, check));
}

/**
 * `after`/`limit`: ListScripts paging (design/protocol.md "Paged ListScripts"); '' and 0: absent.
 * `key`/`since`: ScriptLogs and TagLogs (design/protocol.md "Script logs").
 */
export function control(requestId: number, command: w.ControlCommand, shard: number, after = '', limit = 0,
                        key = '', since = 0): Uint8Array {
  const b = new flatbuffers.Builder(64 + after.length + key.length);
  const a = after === '' ? 0 : b.createString(after);
  const k = key === '' ? 0 : b.createString(key);
  return finish(b, w.Body.Control,
    w.Control.createControl(b, BigInt(requestId), command, shard, a, limit, k, BigInt(since)));
}

export function encodeValue(b: flatbuffers.Builder, v: WireValue): flatbuffers.Offset {
  switch (v.k) {
    case w.ValueKind.Nil:
      w.Value.startValue(b);
      return w.Value.endValue(b);
    case w.ValueKind.Boolean:
      w.Value.startValue(b);
      w.Value.addKind(b, v.k);
      w.Value.addBoolValue(b, v.v);
      return w.Value.endValue(b);
    case w.ValueKind.Int:
      w.Value.startValue(b);
      w.Value.addKind(b, v.k);
      w.Value.addIntValue(b, v.v);
      return w.Value.endValue(b);
    case w.ValueKind.Double:
      w.Value.startValue(b);
      w.Value.addKind(b, v.k);
      w.Value.addDoubleValue(b, v.v);
      return w.Value.endValue(b);
    case w.ValueKind.String: {
      const s = b.createString(v.v);
      w.Value.startValue(b);
      w.Value.addKind(b, v.k);
      w.Value.addStringValue(b, s);
      return w.Value.endValue(b);
    }
    case w.ValueKind.Bytes: {
      const s = w.Value.createBytesValueVector(b, v.v);
      w.Value.startValue(b);
      w.Value.addKind(b, v.k);
      w.Value.addBytesValue(b, s);
      return w.Value.endValue(b);
    }
    case w.ValueKind.Array: {
      const items = w.Value.createItemsVector(b, v.v.map((x) => encodeValue(b, x)));
      w.Value.startValue(b);
      w.Value.addKind(b, v.k);
      w.Value.addItems(b, items);
      return w.Value.endValue(b);
    }
    case w.ValueKind.DateTime:
      w.Value.startValue(b);
      w.Value.addKind(b, v.k);
      w.Value.addIntValue(b, v.v);
      return w.Value.endValue(b);
    case w.ValueKind.Map: {
      const items = w.Value.createItemsVector(b, v.v.map((x) => encodeValue(b, x)));
      const keys = w.Value.createKeysVector(b, v.keys.map((k) => b.createString(k)));
      w.Value.startValue(b);
      w.Value.addKind(b, v.k);
      w.Value.addItems(b, items);
      w.Value.addKeys(b, keys);
      return w.Value.endValue(b);
    }
  }
}

export interface OutgoingEvaluation {
  id: number;
  handle: number;
  inputs: WireInputs;
}

/** `bytes` as a [ubyte] vector whose data starts 8-byte aligned in the frame (it is read in place). */
function addInputList(b: flatbuffers.Builder, bytes: Uint8Array): flatbuffers.Offset {
  b.startVector(1, bytes.length, 8);
  for (let i = bytes.length - 1; i >= 0; i--) b.addInt8(bytes[i]);
  return b.endVector();
}

/**
 * Evaluate frames for `items`, in order: one frame, split when its FlatBuffer passes
 * EVALUATE_SPLIT_BYTES (so no frame nears MAX_FRAME_SIZE; one evaluation's inputs are at most
 * 8 MiB).
 */
export function evaluate(items: readonly OutgoingEvaluation[]): Uint8Array[] {
  const frames: Uint8Array[] = [];
  let b = new flatbuffers.Builder(1024);
  let offsets: flatbuffers.Offset[] = [];
  const flush = () => {
    if (offsets.length === 0) return;
    const vec = w.Evaluate.createItemsVector(b, offsets);
    frames.push(finish(b, w.Body.Evaluate, w.Evaluate.createEvaluate(b, vec)));
    b = new flatbuffers.Builder(1024);
    offsets = [];
  };
  // Inputs go as an InputList FlatBuffer of their own (protocol 2's Evaluation.inputs_buffer),
  // which outrund passes to the worker without decoding (design/protocol.md "Encoded inputs").
  const lb = new flatbuffers.Builder(256);
  for (const e of items) {
    let inputs = 0;
    if (e.inputs.length) {
      lb.clear();
      const ins = e.inputs.map(([name, value]) => {
        const n = lb.createString(name);
        const v = encodeValue(lb, value);
        w.Input.startInput(lb);
        w.Input.addName(lb, n);
        w.Input.addValue(lb, v);
        return w.Input.endInput(lb);
      });
      lb.finish(InputList.createInputList(lb, InputList.createInputsVector(lb, ins)));
      inputs = addInputList(b, lb.asUint8Array());
    }
    w.Evaluation.startEvaluation(b);
    w.Evaluation.addId(b, BigInt(e.id));
    w.Evaluation.addScriptId(b, e.handle);
    if (inputs) w.Evaluation.addInputsBuffer(b, inputs);
    offsets.push(w.Evaluation.endEvaluation(b));
    if (b.offset() > EVALUATE_SPLIT_BYTES) flush();
  }
  flush();
  return frames;
}

// ---- decoding ----

/** A received frame whose root and body passed the structural checks. */
export interface IncomingFrame {
  type: w.Body;
  frame: w.Frame;
  bytes: Uint8Array;
}

/**
 * Opens one whole frame (prefix included, as FrameReader returns it). Throws MalformedFrame when
 * the prefix does not match, the root is out of bounds, or the body is missing or of a type this
 * schema does not know. Accessors on the result still throw MalformedFrame on out-of-bounds
 * reads (CheckedByteBuffer).
 */
export function openFrame(bytes: Uint8Array): IncomingFrame {
  const bb = new CheckedByteBuffer(bytes);
  if (bb.readUint32(0) !== bytes.length - 4) throw new MalformedFrame('length prefix does not match the frame');
  const frame = w.Frame.getSizePrefixedRootAsFrame(bb);
  bb.readInt32(frame.bb_pos); // the root table's vtable offset must be inside
  const type = frame.bodyType();
  if (type === w.Body.NONE || w.Body[type] === undefined) throw new MalformedFrame(`unknown body type ${type}`);
  if (!hasField(frame, 6)) throw new MalformedFrame('frame has no body');
  return { type, frame, bytes };
}

function hasField(t: { bb: flatbuffers.ByteBuffer | null; bb_pos: number }, vtableOffset: number): boolean {
  return t.bb!.__offset(t.bb_pos, vtableOffset) !== 0;
}

/** The body of `f` as a table of class `T`. */
export function body<T>(f: IncomingFrame, make: new () => T): T {
  return f.frame.body(new make()) as T;
}

/** Bytes of a [ubyte] vector, bounds-checked (a copy). */
export function bytesOf(arr: Uint8Array | null): Uint8Array | null {
  return arr ? Uint8Array.from(arr) : null;
}

/**
 * Decodes a result Value (decodeAnyValue without the tag-only kinds): InvalidValue for a value
 * that breaks the rules, MalformedFrame for a frame that cannot be read.
 */
export function decodeValue(v: w.Value, budget: DecodeBudget): OutputValue {
  return decodeAnyValue(v, budget, false) as OutputValue;
}

// Tags frames (design/protocol.md "Tags frames"): encoding of the requests, decoding of
// TagValue vectors (TagChanges, TagValues).
import * as flatbuffers from 'flatbuffers';
import * as w from './generated/outrun_generated';
import { CheckedByteBuffer, MalformedFrame } from './checked-buffer';
import { DECODED_TAG_ENTRY_BYTES, MAX_DECODED_BYTES, MAX_FRAME_SIZE, MAX_SOURCE_UPDATES, MAX_TAG_ID_BYTES, MAX_VALUE_DEPTH } from './constants';
import { statusCodeName, toStatusCode } from './opcua-status';
import { dateToTicks, ticksToDate } from './ticks';
import { AnyOutputValue, decodeAnyValue } from './value-decoder';
import { DecodeBudget, InputValue, InvalidInput, InvalidValue, toWire, WireBudget, WireValue } from './values';

export { EPOCH_TICKS, dateToTicks, ticksToDate } from './ticks';

/** A tag value as it arrives: the JS mapping of design/protocol.md plus UInt, Float, DateTime. */
export type TagOutputValue = AnyOutputValue;

/** A value a source update may carry: the input values of evaluate(), plus Date (DateTime). */
export type TagInputValue = InputValue | Date | readonly TagInputValue[];

/** One DataValue of a tag (OPC UA semantics, design/tags.md). */
export interface TagChange {
  tag: string;
  /** null when the status is Bad and there is no value. */
  value: TagOutputValue;
  /** The OPC UA StatusCode (uint32). */
  status: number;
  /** Its name when outrun knows it ("Good", "BadTimeout", ...). */
  statusName?: string;
  sourceTime: Date | null;
  serverTime: Date | null;
  /** Why the status is Bad ("runtime_error: tag:X:3: ..."), else "". */
  diagnostics: string;
}

export interface SourceUpdate {
  tag: string;
  value: TagInputValue;
  /** A StatusCode number or name; default Good. */
  status?: number | string;
  /** Default: the wave's time. */
  sourceTime?: Date;
}

function toTagWire(x: TagInputValue, path: string, budget: WireBudget, depth = 1): WireValue {
  if (depth > MAX_VALUE_DEPTH) throw new InvalidInput(`input '${path}' nests deeper than ${MAX_VALUE_DEPTH} levels`);
  if (x instanceof Date) return { k: w.ValueKind.DateTime, v: dateToTicks(x) };
  if (Array.isArray(x) && x.some((e) => e instanceof Date || Array.isArray(e)))
    return { k: w.ValueKind.Array, v: x.map((e, i) => toTagWire(e, `${path}[${i}]`, budget, depth + 1)) };
  return toWire(x as InputValue, depth, budget, path);
}

function finish(b: flatbuffers.Builder, type: w.Body, body: flatbuffers.Offset): Uint8Array {
  const frame = w.Frame.createFrame(b, type, body);
  w.Frame.finishSizePrefixedFrameBuffer(b, frame);
  return b.asUint8Array().slice();
}

function stringVector(b: flatbuffers.Builder, ids: readonly string[]): flatbuffers.Offset {
  const offs = ids.map((s) => b.createString(s));
  b.startVector(4, offs.length, 4);
  for (let i = offs.length - 1; i >= 0; i--) b.addOffset(offs[i]);
  return b.endVector();
}

export function defineTags(requestId: number, toml: string, replaceAll: boolean): Uint8Array {
  const b = new flatbuffers.Builder(1024 + toml.length * 3);
  const t = b.createString(toml);
  return finish(b, w.Body.DefineTags, w.DefineTags.createDefineTags(b, BigInt(requestId), t, replaceAll));
}

export function removeTags(requestId: number, ids: readonly string[]): Uint8Array {
  const b = new flatbuffers.Builder(256);
  const v = stringVector(b, ids);
  return finish(b, w.Body.RemoveTags, w.RemoveTags.createRemoveTags(b, BigInt(requestId), v));
}

/** One page of ListTags: after the cursor `after` (the previous page's `next`; '' or null: the first). */
export function listTags(requestId: number, after: string | null = null, limit = 0): Uint8Array {
  const b = new flatbuffers.Builder(64);
  const a = after ? b.createString(after) : 0;
  return finish(b, w.Body.ListTags, w.ListTags.createListTags(b, BigInt(requestId), a, limit));
}

export function readTags(requestId: number, ids: readonly string[]): Uint8Array {
  const b = new flatbuffers.Builder(256);
  const v = stringVector(b, ids);
  return finish(b, w.Body.ReadTags, w.ReadTags.createReadTags(b, BigInt(requestId), v));
}

export function subscribe(requestId: number, ids: readonly string[], cancel: boolean): Uint8Array {
  const b = new flatbuffers.Builder(256);
  const v = stringVector(b, ids);
  return finish(b, w.Body.Subscribe, w.Subscribe.createSubscribe(b, BigInt(requestId), v, cancel));
}

/** Converts the updates (throws InvalidInput for a value with no wire kind, a bad status). */
export interface WireUpdate {
  tag: string;
  value: WireValue;
  status: number;
  sourceTime: bigint;
}
export function toWireUpdates(updates: readonly SourceUpdate[]): WireUpdate[] {
  if (!Array.isArray(updates)) throw new InvalidInput('updates must be an array');
  if (updates.length > MAX_SOURCE_UPDATES) throw new InvalidInput(`more than ${MAX_SOURCE_UPDATES} updates in one wave`);
  // No limit per value: a wave is bounded by its frame (MAX_FRAME_SIZE), exactly once encoded
  // (Client's requestFrame); strings, bytes and keys past it are refused here, before encoding.
  const budget: WireBudget = { bytes: 0, limit: Number.POSITIVE_INFINITY, payload: 0 };
  return updates.map((u, i) => {
    if (!u || typeof u.tag !== 'string' || u.tag.length === 0) throw new InvalidInput(`update ${i}: tag must be a non-empty string`);
    if (Buffer.byteLength(u.tag) > MAX_TAG_ID_BYTES) throw new InvalidInput(`update ${i}: a tag id must be 1..${MAX_TAG_ID_BYTES} bytes`);
    let status: number;
    try {
      status = toStatusCode(u.status);
    } catch (e) {
      throw new InvalidInput(`update ${i} (${u.tag}): ${(e as Error).message}`);
    }
    const st = u.sourceTime === undefined ? 0n : dateToTicks(u.sourceTime);
    const value = toTagWire(u.value, u.tag, budget);
    budget.payload! += Buffer.byteLength(u.tag);
    if (budget.payload! > MAX_FRAME_SIZE)
      throw new InvalidInput(`the updates hold more than ${MAX_FRAME_SIZE} bytes of strings, bytes and ids: more than a frame holds (MAX_FRAME_SIZE); nothing was sent`);
    return { tag: u.tag, value, status, sourceTime: st };
  });
}

export function sourceUpdates(requestId: number, time: bigint, updates: readonly WireUpdate[], encodeValue: (b: flatbuffers.Builder, v: WireValue) => flatbuffers.Offset): Uint8Array {
  const b = new flatbuffers.Builder(256 + updates.length * 64);
  const tvs = updates.map((u) => {
    const tag = b.createString(u.tag);
    const val = encodeValue(b, u.value);
    w.DataValue.startDataValue(b);
    w.DataValue.addValue(b, val);
    w.DataValue.addStatus(b, u.status);
    w.DataValue.addSourceTime(b, u.sourceTime);
    const dv = w.DataValue.endDataValue(b);
    w.TagValue.startTagValue(b);
    w.TagValue.addTag(b, tag);
    w.TagValue.addValue(b, dv);
    return w.TagValue.endTagValue(b);
  });
  const vec = w.SourceUpdates.createUpdatesVector(b, tvs);
  return finish(b, w.Body.SourceUpdates, w.SourceUpdates.createSourceUpdates(b, BigInt(requestId), time, vec));
}

// ---- decoding ----

export function decodeTagValue(v: w.Value, budget: DecodeBudget): TagOutputValue {
  return decodeAnyValue(v, budget, true);
}

function decodeOne(tv: w.TagValue, budget: DecodeBudget): TagChange {
  const tag = tv.tag();
  if (tag === null) throw new MalformedFrame('TagValue without its tag');
  const dv = tv.value(new w.DataValue());
  if (!dv) return { tag, value: null, status: 0x80320000, statusName: 'BadWaitingForInitialData', sourceTime: null, serverTime: null, diagnostics: '' };
  const vv = dv.value(new w.Value());
  let value: TagOutputValue = null;
  let diagnostics = dv.diagnostics() ?? '';
  let status = dv.status() >>> 0;
  try {
    value = vv ? decodeTagValue(vv, budget) : null;
  } catch (e) {
    if (!(e instanceof InvalidValue)) throw e;
    status = 0x80020000;
    diagnostics = `outrund sent an invalid value: ${e.message}`;
  }
  const st = dv.sourceTime();
  const sv = dv.serverTime();
  const name = statusCodeName(status);
  const out: TagChange = { tag, value, status, sourceTime: st ? ticksToDate(st) : null, serverTime: sv ? ticksToDate(sv) : null, diagnostics };
  if (name !== undefined) out.statusName = name;
  return out;
}

/**
 * Decodes a [TagValue] vector of the frame read through `bb`; throws MalformedFrame for a frame
 * that cannot be read. Each entry counts DECODED_TAG_ENTRY_BYTES against the frame's decode budget
 * (with its strings and values, a shared TagValue counted at each use), all of them before the
 * first is decoded: a frame whose entries alone would pass MAX_DECODED_BYTES is refused at once.
 */
export function decodeTagValues(n: number, at: (i: number, obj: w.TagValue) => w.TagValue | null, bb: flatbuffers.ByteBuffer | null): TagChange[] {
  if (!(bb instanceof CheckedByteBuffer)) throw new MalformedFrame('tag values outside a checked frame');
  if (n * DECODED_TAG_ENTRY_BYTES > MAX_DECODED_BYTES)
    throw new MalformedFrame(`frame of ${n} tag values decodes to more than ${MAX_DECODED_BYTES} bytes (${DECODED_TAG_ENTRY_BYTES} per entry, a shared one counted at each use)`);
  bb.charge(n * DECODED_TAG_ENTRY_BYTES);
  const budget = new DecodeBudget();
  const out: TagChange[] = new Array(n);
  const obj = new w.TagValue();
  for (let i = 0; i < n; i++) {
    const tv = at(i, obj);
    if (!tv) throw new MalformedFrame('TagValue missing');
    out[i] = decodeOne(tv, budget);
  }
  return out;
}

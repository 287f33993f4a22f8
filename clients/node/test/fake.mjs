// Frames a daemon sends, built with the generated classes: for fake servers in tests.
import * as flatbuffers from 'flatbuffers';
import { FrameReader, wire } from '../dist/index.js';

const { w, InputList } = wire;

function finish(b, type, body) {
  w.Frame.finishSizePrefixedFrameBuffer(b, w.Frame.createFrame(b, type, body));
  return Buffer.from(b.asUint8Array());
}

export function serverHello({ version = 2, shards = 1, error = null, maxInflight = 100 } = {}) {
  const b = new flatbuffers.Builder(128);
  const v = b.createString('fake');
  const e = error ? b.createString(error) : 0;
  w.ServerHello.startServerHello(b);
  w.ServerHello.addProtocolVersion(b, version);
  w.ServerHello.addShards(b, shards);
  w.ServerHello.addServerVersion(b, v);
  if (e) w.ServerHello.addError(b, e);
  w.ServerHello.addMaxInflight(b, maxInflight);
  return finish(b, w.Body.ServerHello, w.ServerHello.endServerHello(b));
}

/** Input `i` of Evaluation `e`, from its inputs_buffer (an InputList FlatBuffer of its own). */
export function inputOf(e, i) {
  const list = InputList.getRootAsInputList(new flatbuffers.ByteBuffer(e.inputsBufferArray()));
  return list.inputs(i);
}

export function registered(requestId, handle, shard = 0) {
  const b = new flatbuffers.Builder(128);
  const sha = w.Registered.createSha256Vector(b, new Uint8Array(32).fill(0xab));
  return finish(b, w.Body.Registered, w.Registered.createRegistered(b, BigInt(requestId), w.Status.Ok, 0, handle, sha, shard, 0n));
}

/** Results{[Result{id, Ok, Int value}]} */
export function intResults(pairs) {
  const b = new flatbuffers.Builder(256);
  const items = pairs.map(([id, n]) => {
    w.Value.startValue(b);
    w.Value.addKind(b, w.ValueKind.Int);
    w.Value.addIntValue(b, BigInt(n));
    const v = w.Value.endValue(b);
    w.Result.startResult(b);
    w.Result.addId(b, BigInt(id));
    w.Result.addValue(b, v);
    return w.Result.endResult(b);
  });
  const vec = w.Results.createItemsVector(b, items);
  return finish(b, w.Body.Results, w.Results.createResults(b, vec));
}

/**
 * Results{[Result{id, Ok, value}]} where value is an array of `count` items, each the same
 * String Value of `size` bytes (or, `asKeys`, the same map whose one key is that string): a
 * small frame that decodes to count × size bytes.
 */
export function sharedStringResults(id, { count = 512, size = 1 << 20, asKeys = false } = {}) {
  const b = new flatbuffers.Builder(size + 4096);
  const big = b.createString('x'.repeat(size));
  let shared;
  if (asKeys) {
    // a one-entry map {[big]: nil}: its key is read each time the map is
    w.Value.startValue(b);
    const nil = w.Value.endValue(b);
    const items = w.Value.createItemsVector(b, [nil]);
    const keys = w.Value.createKeysVector(b, [big]);
    w.Value.startValue(b);
    w.Value.addKind(b, w.ValueKind.Map);
    w.Value.addItems(b, items);
    w.Value.addKeys(b, keys);
    shared = w.Value.endValue(b);
  } else {
    w.Value.startValue(b);
    w.Value.addKind(b, w.ValueKind.String);
    w.Value.addStringValue(b, big);
    shared = w.Value.endValue(b);
  }
  const items = w.Value.createItemsVector(b, new Array(count).fill(shared));
  w.Value.startValue(b);
  w.Value.addKind(b, w.ValueKind.Array);
  w.Value.addItems(b, items);
  const v = w.Value.endValue(b);
  w.Result.startResult(b);
  w.Result.addId(b, BigInt(id));
  w.Result.addValue(b, v);
  const r = w.Result.endResult(b);
  const vec = w.Results.createItemsVector(b, [r]);
  return finish(b, w.Body.Results, w.Results.createResults(b, vec));
}

/** Reads the client's frames off a socket: calls onFrame(IncomingFrame) for each. */
export function readFrames(sock, onFrame) {
  const reader = new FrameReader();
  sock.on('data', (chunk) => {
    for (const bytes of reader.push(chunk)) onFrame(wire.openFrame(bytes));
  });
}

/** One TagValue {tag, DataValue{Double value, Good, both times}} into builder `b`. */
function tagEntry(b, tag, { value = 1.5, diagnostics = '' } = {}) {
  const t = b.createString(tag);
  const d = diagnostics ? b.createString(diagnostics) : 0;
  w.Value.startValue(b);
  w.Value.addKind(b, w.ValueKind.Double);
  w.Value.addDoubleValue(b, value);
  const v = w.Value.endValue(b);
  w.DataValue.startDataValue(b);
  w.DataValue.addValue(b, v);
  w.DataValue.addStatus(b, 0);
  w.DataValue.addSourceTime(b, 133500000000000000n);
  w.DataValue.addServerTime(b, 133500000000000000n);
  if (d) w.DataValue.addDiagnostics(b, d);
  const dv = w.DataValue.endDataValue(b);
  w.TagValue.startTagValue(b);
  w.TagValue.addTag(b, t);
  w.TagValue.addValue(b, dv);
  return w.TagValue.endTagValue(b);
}

/**
 * TagChanges{changes} with `count` entries. `shared`: every entry points at one TagValue (a
 * frame of about 4 × count bytes that decodes to count changes); otherwise each its own, as
 * outrund encodes them (tag ids `T<i>`).
 */
export function tagChanges(count, { shared = true, diagnostics = '' } = {}) {
  const b = new flatbuffers.Builder(shared ? 4 * count + 1024 : 80 * count + 1024);
  let offs;
  if (shared) {
    const one = tagEntry(b, 'Tank1.Level', { diagnostics });
    offs = new Array(count).fill(one);
  } else {
    offs = Array.from({ length: count }, (_, i) => tagEntry(b, `T${i}`, { value: i, diagnostics }));
  }
  const vec = w.TagChanges.createChangesVector(b, offs);
  return finish(b, w.Body.TagChanges, w.TagChanges.createTagChanges(b, vec));
}

/** TagValues{request_id, Ok, values} answering ReadTags, `count` entries sharing one TagValue. */
export function sharedTagValues(requestId, count) {
  const b = new flatbuffers.Builder(4 * count + 1024);
  const one = tagEntry(b, 'Tank1.Level');
  const vec = w.TagValues.createValuesVector(b, new Array(count).fill(one));
  return finish(b, w.Body.TagValues, w.TagValues.createTagValues(b, BigInt(requestId), w.Status.Ok, 0, vec));
}

/** TagsReply{request_id, Ok, json} */
export function tagsReply(requestId, json = '{}') {
  const b = new flatbuffers.Builder(json.length + 256);
  const j = b.createString(json);
  return finish(b, w.Body.TagsReply, w.TagsReply.createTagsReply(b, BigInt(requestId), w.Status.Ok, 0, j));
}

/** ControlReply{request_id, Ok, json} */
export function controlReply(requestId, json = '{}') {
  const b = new flatbuffers.Builder(json.length + 256);
  const j = b.createString(json);
  return finish(b, w.Body.ControlReply, w.ControlReply.createControlReply(b, BigInt(requestId), w.Status.Ok, 0, j));
}

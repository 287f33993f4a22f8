// Unit tests of the one value decoder (src/value-decoder.ts): results and tag values share it,
// and differ only in the tag-only kinds (no daemon).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as flatbuffers from 'flatbuffers';
import { wire } from '../dist/index.js';
import { decodeAnyValue } from '../dist/value-decoder.js';
import { DecodeBudget, InvalidValue } from '../dist/values.js';

const K = wire.w.ValueKind;

function valueOf(v) {
  const b = new flatbuffers.Builder(256);
  b.finish(wire.encodeValue(b, v));
  return wire.w.Value.getRootAsValue(new flatbuffers.ByteBuffer(b.asUint8Array()));
}
const decodeResult = (v) => wire.decodeValue(valueOf(v), new DecodeBudget());
const decodeTag = (v) => decodeAnyValue(valueOf(v), new DecodeBudget(), true);

test('a map with a duplicate key is refused, in results and in tag values alike', () => {
  const dup = { k: K.Map, keys: ['a', 'a'], v: [{ k: K.Int, v: 1n }, { k: K.Int, v: 2n }] };
  assert.throws(() => decodeResult(dup), (e) => e instanceof InvalidValue && /duplicate map key 'a'/.test(e.message));
  assert.throws(() => decodeTag(dup), (e) => e instanceof InvalidValue && /duplicate map key 'a'/.test(e.message));
});

test('a key named __proto__ is an own property, never the prototype', () => {
  const m = { k: K.Map, keys: ['__proto__', 'b'], v: [{ k: K.Map, keys: ['polluted'], v: [{ k: K.Boolean, v: true }] }, { k: K.Int, v: 2n }] };
  for (const out of [decodeResult(m), decodeTag(m)]) {
    assert.equal(Object.getPrototypeOf(out), Object.prototype);
    assert.deepEqual(Object.keys(out), ['__proto__', 'b']);
    assert.equal(out.polluted, undefined);
    assert.equal({}.polluted, undefined);
  }
});

test('tag-only kinds decode in tag values and are invalid in results', () => {
  const t = { k: K.DateTime, v: 116444736000000000n + 10000n * 1500n };
  assert.deepEqual(decodeTag(t), new Date(1500));
  assert.throws(() => decodeResult(t), (e) => e instanceof InvalidValue && /unknown value kind/.test(e.message));
  // The rest decodes the same either way.
  const v = { k: K.Array, v: [{ k: K.Int, v: 7n }, { k: K.String, v: 'x' }, { k: K.Nil }, { k: K.Double, v: 1.5 }] };
  assert.deepEqual(decodeResult(v), [7, 'x', null, 1.5]);
  assert.deepEqual(decodeTag(v), [7, 'x', null, 1.5]);
});

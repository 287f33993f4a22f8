// Unit tests of the frame reader and frame checks (no daemon).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { constants, FrameError, FrameReader, STATUS_NAMES, wire } from '../dist/index.js';
import { inputOf, intResults, serverHello } from './fake.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

function frames(n) {
  return Array.from({ length: n }, (_, i) => intResults([[i + 1, i * 7]]));
}
function idsOf(list) {
  return list.map((bytes) => {
    const f = wire.openFrame(bytes);
    assert.equal(f.type, wire.w.Body.Results);
    const r = wire.body(f, wire.w.Results).items(0);
    return Number(r.id());
  });
}

test('a frame split at every byte is reassembled', () => {
  const f = Buffer.concat([serverHello(), intResults([[5, 42], [6, -1]])]);
  for (let cut = 0; cut <= f.length; cut++) {
    const r = new FrameReader();
    const out = [...r.push(f.subarray(0, cut)), ...r.push(f.subarray(cut))];
    assert.equal(out.length, 2, `cut at ${cut}`);
    assert.deepEqual(Buffer.from(out[0]), serverHello());
    assert.equal(r.buffered, 0);
  }
});

test('one byte at a time', () => {
  const all = Buffer.concat(frames(20));
  const r = new FrameReader();
  const out = [];
  for (const b of all) out.push(...r.push(Uint8Array.of(b)));
  assert.deepEqual(idsOf(out), Array.from({ length: 20 }, (_, i) => i + 1));
});

test('many frames in one chunk, and a chunk ending mid-header', () => {
  const list = frames(500);
  const all = Buffer.concat(list);
  const r = new FrameReader();
  const cut = all.length - list[499].length + 2; // two bytes into the last length prefix
  const a = r.push(all.subarray(0, cut));
  assert.equal(a.length, 499);
  assert.equal(r.buffered, 2);
  const b = r.push(all.subarray(cut));
  assert.deepEqual(idsOf([...a, ...b]), Array.from({ length: 500 }, (_, i) => i + 1));
});

test('each frame owns an ArrayBuffer of exactly its size', () => {
  const out = new FrameReader().push(Buffer.concat(frames(3)));
  for (const f of out) {
    assert.equal(f.byteOffset, 0);
    assert.equal(f.buffer.byteLength, f.length);
  }
});

test('oversized and undersized lengths break the stream', () => {
  const big = Buffer.alloc(4);
  big.writeUInt32LE(constants.MAX_FRAME_SIZE + 1);
  const r = new FrameReader();
  assert.throws(() => r.push(big), (e) => e instanceof FrameError && e.kind === 'oversized');
  assert.throws(() => r.push(serverHello()), FrameError, 'stays broken');
  const small = Buffer.from([7, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7]);
  assert.throws(() => new FrameReader().push(small), { kind: 'undersized' });
  // exactly the maximum is allowed (only the header is needed to decide)
  const max = Buffer.alloc(4);
  max.writeUInt32LE(constants.MAX_FRAME_SIZE);
  const ok = new FrameReader();
  assert.deepEqual(ok.push(max), []);
  assert.equal(ok.buffered, 4);
  // a smaller bound for tests
  assert.throws(() => new FrameReader(64).push(intResults([[1, 1], [2, 2], [3, 3]])), { kind: 'oversized' });
});

test('openFrame rejects garbage, truncation and unknown bodies', () => {
  const good = serverHello();
  assert.equal(wire.openFrame(good).type, wire.w.Body.ServerHello);
  // random bytes behind a correct prefix
  let seed = 1;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) >>> 0) >>> 24);
  let rejected = 0;
  for (let i = 0; i < 2000; i++) {
    const n = 8 + (i % 64);
    const f = Buffer.alloc(4 + n);
    f.writeUInt32LE(n);
    for (let k = 4; k < f.length; k++) f[k] = rnd();
    try {
      const fr = wire.openFrame(f);
      // opened: reading the body must either work or throw, never hang
      try {
        if (fr.type === wire.w.Body.Results) wire.body(fr, wire.w.Results).itemsLength();
      } catch {
        rejected++;
      }
    } catch {
      rejected++;
    }
  }
  assert.ok(rejected > 1500, `most random frames rejected (${rejected})`);
  // a prefix that disagrees with the size
  const bad = Buffer.from(good);
  bad.writeUInt32LE(good.length);
  assert.throws(() => wire.openFrame(bad), /length prefix/);
  // an unknown union type
  const f = wire.openFrame(good);
  const typeAt = f.frame.bb_pos + f.frame.bb.__offset(f.frame.bb_pos, 4);
  const unknown = Buffer.from(good);
  unknown[typeAt] = 200;
  assert.throws(() => wire.openFrame(unknown), /unknown body type/);
  // a string pointing past the end
  const hs = wire.body(f, wire.w.ServerHello);
  const strField = hs.bb_pos + hs.bb.__offset(hs.bb_pos, 8);
  const past = Buffer.from(good);
  past.writeInt32LE(1 << 20, strField);
  assert.throws(() => wire.body(wire.openFrame(past), wire.w.ServerHello).serverVersion(), /outside/);
});

test('constants agree with frame.h, runner.h and status.h', () => {
  const frame = readFileSync(path.join(root, 'protocol/include/outrun/protocol/frame.h'), 'utf8');
  // The Node.js client speaks protocol 2, which outrund still accepts (kMinClientProtocolVersion
  // .. kProtocolVersion); protocol 3 (64-bit handles) is not adopted yet.
  const newest = Number(/kProtocolVersion = (\d+);/.exec(frame)[1]);
  assert.ok(constants.PROTOCOL_VERSION <= newest, `client ${constants.PROTOCOL_VERSION}, outrun ${newest}`);
  assert.equal(constants.PROTOCOL_VERSION, 2);
  assert.match(frame, /kMaxFrameSize = 16u << 20;/);
  assert.equal(constants.MAX_FRAME_SIZE, 16 << 20);
  assert.match(frame, /kMinFrameSize = 8;/);
  const runner = readFileSync(path.join(root, 'host/include/outrun/runner.h'), 'utf8');
  assert.match(runner, /kMaxKeySize = 256;/);
  assert.match(runner, /kMaxSourceSize = 1u << 20;/);
  const status = readFileSync(path.join(root, 'host/include/outrun/status.h'), 'utf8');
  // The evaluation statuses: the entries of `enum class Status` (status.h has ErrorCode too).
  const start = status.indexOf('enum class Status');
  const block = status.slice(start, status.indexOf('};', start));
  const names = [...block.matchAll(/^\s+([a-z_]+)(?: = 0)?,/gm)].map((m) => m[1]);
  assert.deepEqual([...STATUS_NAMES], names);
});

test('Evaluate frames are split past 4 MiB, in order', () => {
  const big = { k: wire.w.ValueKind.String, v: 'x'.repeat(1 << 20) };
  const items = Array.from({ length: 12 }, (_, i) => ({ id: i + 1, handle: 7, inputs: [['s', big]] }));
  const out = wire.evaluate(items);
  assert.ok(out.length >= 2 && out.length <= 4, `${out.length} frames`);
  const ids = [];
  for (const bytes of out) {
    assert.ok(bytes.length - 4 <= 5 << 20);
    const [frame] = new FrameReader().push(bytes);
    const ev = wire.body(wire.openFrame(frame), wire.w.Evaluate);
    for (let i = 0; i < ev.itemsLength(); i++) {
      const e = ev.items(i);
      assert.equal(e.scriptId(), 7);
      assert.equal(e.inputsLength(), 0); // protocol 2: in inputs_buffer
      assert.equal(inputOf(e, 0).name(), 's');
      assert.equal(inputOf(e, 0).value().stringValue().length, 1 << 20);
      ids.push(Number(e.id()));
    }
  }
  assert.deepEqual(ids, Array.from({ length: 12 }, (_, i) => i + 1));
});

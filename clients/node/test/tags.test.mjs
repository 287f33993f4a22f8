// The tags API against a real outrund (design/protocol.md "Tags frames"). Skipped, with the reason,
// only when this outrund does not answer the tags frames.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, OutrunError, dateToTicks, ticksToDate, statusCodeName, toStatusCode, STATUS_CODES } from '../dist/index.js';
import { startDaemon, tempSocket } from './helpers.mjs';

const TOML = `
[[tag]]
id = "T.Sum"
inputs = ["T.A", "T.B"]
script = "return inputs['T.A'] + inputs['T.B']"

[[tag]]
id = "T.U16"
type = "UInt16"
inputs = [{ tag = "T.A", name = "a" }]
script = "return inputs.a"

[[tag]]
id = "T.F"
type = "Float"
inputs = [{ tag = "T.A", name = "a" }]
script = "return inputs.a / 2"

[[tag]]
id = "T.When"
type = "DateTime"
inputs = [{ tag = "T.A", name = "a" }]
script = "return source_time.a"

[[tag]]
id = "T.Err"
inputs = [{ tag = "T.E", name = "e" }]
script = "error('boom')"
`;

test('ticks <-> Date', () => {
  assert.equal(dateToTicks(new Date(0)), 116444736000000000n);
  assert.equal(dateToTicks(new Date(1)), 116444736000010000n);
  assert.equal(ticksToDate(dateToTicks(new Date('2026-12-01T10:00:00.123Z'))).toISOString(), '2026-12-01T10:00:00.123Z');
  assert.equal(statusCodeName(0x800a0000), 'BadTimeout');
  assert.equal(toStatusCode('BadSensorFailure'), STATUS_CODES.BadSensorFailure);
  assert.throws(() => toStatusCode('NoSuchCode'), RangeError);
});

describe('tags against outrund', async () => {
  let tmp, daemon, client, skip = false;
  before(async () => {
    tmp = tempSocket();
    daemon = await startDaemon(tmp.socket);
    client = await connect(tmp.socket, { name: 'node-tags-test', replyTimeoutMs: 3000 });
    try {
      await client.listTags();
    } catch (e) {
      skip = `outrund does not support the tags frames yet (${e.message})`;
      console.log(`# SKIP tags tests: ${skip}`);
    }
  });
  after(async () => {
    await client?.close();
    await daemon?.stop();
    tmp?.cleanup();
  });

  test('defineTags, listTags, subscribe, updateSources, readTags', async (t) => {
    if (skip) return t.skip(skip);
    const r = await client.defineTags(TOML);
    assert.deepEqual([...r.defined].sort(), ['T.Err', 'T.F', 'T.Sum', 'T.U16', 'T.When']);
    const list = await client.listTags();
    assert.deepEqual(list.tags.map((x) => x.id).sort(), ['T.Err', 'T.F', 'T.Sum', 'T.U16', 'T.When']);

    const got = [];
    const sub = await client.subscribe(['T.Sum', 'T.U16', 'T.F', 'T.When'], (ch) => got.push(...ch));
    const t0 = new Date(Date.now() - 5000);
    await client.updateSources([{ tag: 'T.A', value: 3, sourceTime: t0 }, { tag: 'T.B', value: 4 }], t0);
    const wait = async (pred, ms = 3000) => {
      const end = Date.now() + ms;
      while (!pred()) {
        if (Date.now() > end) throw new Error(`timed out; got ${JSON.stringify(got.map((g) => [g.tag, String(g.value), g.status]))}`);
        await new Promise((r) => setTimeout(r, 10));
      }
    };
    await wait(() => ['T.Sum', 'T.U16', 'T.F', 'T.When'].every((id) => got.some((g) => g.tag === id)));
    const by = (id) => got.filter((g) => g.tag === id).at(-1);
    assert.equal(by('T.Sum').value, 7);
    assert.equal(by('T.Sum').status, 0);
    assert.equal(by('T.Sum').statusName, 'Good');
    assert.equal(by('T.U16').value, 3);
    assert.equal(by('T.F').value, 1.5);
    assert.ok(by('T.When').value instanceof Date);
    assert.equal(by('T.When').value.getTime(), t0.getTime());
    assert.ok(by('T.Sum').sourceTime instanceof Date && by('T.Sum').serverTime instanceof Date);
    assert.equal(by('T.Sum').sourceTime.getTime(), t0.getTime());

    const vals = await client.readTags(['T.Sum', 'T.Err']);
    assert.equal(vals[0].value, 7);
    assert.equal(vals[1].status, 0x80320000, 'never evaluated: BadWaitingForInitialData');

    await client.updateSources([{ tag: 'T.E', value: 1 }]);
    await new Promise((r) => setTimeout(r, 200));
    const [e] = await client.readTags(['T.Err']);
    assert.equal(e.status, STATUS_CODES.BadInternalError);
    assert.match(e.diagnostics, /boom/);

    await client.updateSources([{ tag: 'T.A', value: 1, status: 'BadSensorFailure' }]);
    await wait(() => by('T.Sum').status === STATUS_CODES.BadSensorFailure);

    await sub.cancel();
    const n = got.length;
    client.updateSourcesNoReply([{ tag: 'T.A', value: 10 }]);
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(got.length, n, 'no changes after cancel');
    assert.equal((await client.readTags(['T.Sum']))[0].value, 14);
  });

  test('errors: OutrunError with .status', async (t) => {
    if (skip) return t.skip(skip);
    // A definition with no usable id: reported with its location, nothing installed.
    const noId = await client.defineTags('[[tag]]\nid = 3\n');
    assert.equal(noId.errors.length, 1);
    assert.equal(noId.errors[0].installed, false);
    assert.equal(noId.errors[0].location, '2:6');
    await assert.rejects(client.defineTags('[[tag]\nid = 3\n'), (e) => e instanceof OutrunError && e.status === 'invalid_argument' && /^1:/.test(e.message));
    // A broken definition does not fail the request: it is listed, and exists with
    // BadConfigurationError; the others of the text are applied.
    const r = await client.defineTags('[[tag]]\nid = "X"\ninputs=["Y"]\nscript = "return +"\n' +
      '[[tag]]\nid = "X2"\ninputs=["X"]\nscript = "return 1"\n' +
      '[[tag]]\nid = "X3"\ntype = "Dobule"\nscript = "return 1"\n');
    assert.deepEqual(r.broken, ['X', 'X3']);
    assert.equal(r.errors.length, 2);
    assert.equal(r.errors[0].code, 'compile_error');
    assert.equal(r.errors[0].location, '4:1');
    assert.equal(r.errors[1].location, '11:8');
    assert.match(r.errors[1].message, /unknown DataType 'Dobule'/);
    const [x, x2] = await client.readTags(['X', 'X2']);
    assert.equal(x.status, STATUS_CODES.BadConfigurationError);
    assert.equal(x.value, null);
    assert.match(x.diagnostics, /^4:1: tag 'X': compile_error: /);
    assert.equal(x2.status, STATUS_CODES.BadConfigurationError);  // the quality rule
    await client.removeTags(['X2']);
    await client.removeTags(['X', 'X3']);
    await assert.rejects(client.readTags(['No.Such.Tag']), (e) => e instanceof OutrunError && e.status === 'invalid_argument');
    await assert.rejects(client.updateSources([{ tag: 'T.Sum', value: 1 }]), (e) => e instanceof OutrunError);
    await assert.rejects(client.updateSources([{ tag: 'T.A', value: 1, status: 'NotAName' }]), (e) => e instanceof OutrunError && e.status === 'invalid_argument');
    const refused = new Promise((r) => client.once('updateRefused', r));
    client.updateSourcesNoReply([{ tag: 'T.Sum', value: 1 }]);
    const err = await refused;
    assert.ok(err instanceof OutrunError);
  });

  test('requests larger than a frame: invalid_argument before sending, the connection kept', async (t) => {
    if (skip) return t.skip(skip);
    await client.defineTags(TOML); // the same definitions again: also runs on its own
    const big = 'x'.repeat(20 << 20); // 20 MiB: more than a 16 MiB frame holds
    const tooBig = (e) => e instanceof OutrunError && e.status === 'invalid_argument' && /16777216/.test(e.message);
    let dropped = false;
    const onDrop = () => { dropped = true; };
    client.on('disconnected', onDrop);
    try {
      await assert.rejects(client.updateSources([{ tag: 'T.A', value: big }]), tooBig);
      // Nested in an array, and spread over several updates of 5 MiB each.
      await assert.rejects(client.updateSources([{ tag: 'T.A', value: [big] }]), tooBig);
      const five = 'y'.repeat(5 << 20);
      await assert.rejects(client.updateSources(['A', 'B', 'C', 'D'].map((x) => ({ tag: `T.${x}`, value: five }))), tooBig);
      assert.throws(() => client.updateSourcesNoReply([{ tag: 'T.A', value: big }]), tooBig);
      await assert.rejects(client.defineTags(`# ${big}\n`), tooBig);
      // A text just under the limit whose frame (with its tables) is just over: the encoded size.
      await assert.rejects(client.defineTags('#'.repeat((16 << 20) - 4)), (e) => tooBig(e) && /DefineTags frame would be/.test(e.message));
      // Ids longer than the daemon takes (1..256 bytes), which 4096 of could also pass a frame.
      const longIds = Array.from({ length: 4096 }, (_, i) => `${i}`.padEnd(5000, 'z'));
      for (const call of [() => client.readTags(longIds), () => client.subscribe(longIds, () => {}), () => client.removeTags(longIds)])
        await assert.rejects(call(), (e) => e instanceof OutrunError && e.status === 'invalid_argument' && /256/.test(e.message));
      await assert.rejects(client.updateSources([{ tag: 'T'.repeat(257), value: 1 }]), (e) => e instanceof OutrunError && e.status === 'invalid_argument' && /256/.test(e.message));
      // The same connection serves the next calls.
      await client.updateSources([{ tag: 'T.A', value: 30 }, { tag: 'T.B', value: 12 }]);
      const end = Date.now() + 3000;
      for (;;) {
        const [sum] = await client.readTags(['T.Sum']);
        if (sum.value === 42) break;
        if (Date.now() > end) throw new Error(`T.Sum is ${sum.value}, not 42`);
        await new Promise((r) => setTimeout(r, 10));
      }
      // A value within outrund's bound for one source value (max_tag_source_value_bytes, 1 MiB by
      // default) still goes through; a larger one that fits a frame is refused by outrund alone.
      await client.updateSources([{ tag: 'T.Big', value: 'b'.repeat(512 << 10) }]);
      await assert.rejects(client.updateSources([{ tag: 'T.Big', value: 'b'.repeat(10 << 20) }]), (e) => e instanceof OutrunError && e.status === 'invalid_argument' && /max_source_value_bytes/.test(e.message));
      assert.equal(dropped, false, 'the connection was not dropped');
    } finally {
      client.off('disconnected', onDrop);
    }
  });

  test('tagLogs: what a tag\'s script logged', async (t) => {
    if (skip) return t.skip(skip);
    await client.defineTags('[[tag]]\nid = "T.Log"\ninputs = ["T.LogIn"]\nscript = "log.info(\'got\', inputs[\'T.LogIn\']) return 1"\n');
    await client.updateSources([{ tag: 'T.LogIn', value: 5 }]);
    const end = Date.now() + 5000;
    let page;
    do {
      page = await client.tagLogs('T.Log');
      if (page.lines.length) break;
      await new Promise((r) => setTimeout(r, 10));
    } while (Date.now() < end);
    assert.equal(page.lines.length, 1);
    assert.equal(page.lines[0].level, 'info');
    assert.match(page.lines[0].text, /^got 5(\.0)?$/); // as Lua prints the number it got
    await assert.rejects(client.tagLogs('T.Nope'), (e) => e instanceof OutrunError && e.status === 'invalid_argument');
  });

  test('removeTags', async (t) => {
    if (skip) return t.skip(skip);
    const r = await client.removeTags(['T.Err']);
    assert.deepEqual(r.removed, ['T.Err']);
    assert.ok(!(await client.listTags()).tags.some((x) => x.id === 'T.Err'));
  });
});

describe('tags: re-subscribe after a reconnection', async () => {
  test('a new daemon on the same socket pushes again', async (t) => {
    const tmp = tempSocket();
    let daemon = await startDaemon(tmp.socket);
    const client = await connect(tmp.socket, { name: 'node-tags-reconnect', replyTimeoutMs: 3000, reconnectInitialDelayMs: 20 });
    try {
      try {
        await client.listTags();
      } catch (e) {
        return t.skip(`outrund does not support the tags frames yet (${e.message})`);
      }
      await client.defineTags(TOML);
      const got = [];
      await client.subscribe(['T.Sum'], (ch) => got.push(...ch));
      // Listen before the restart: the client may reconnect while startDaemon is still
      // polling the socket, and a listener attached after that would wait forever.
      const reconnected = new Promise((resolve) => client.once('connected', resolve));
      await daemon.stop();
      daemon = await startDaemon(tmp.socket);
      await reconnected;
      await client.defineTags(TOML);
      await client.updateSources([{ tag: 'T.A', value: 20 }, { tag: 'T.B', value: 22 }]);
      const end = Date.now() + 3000;
      while (!got.some((g) => g.value === 42)) {
        if (Date.now() > end) throw new Error('no TagChanges after the reconnection');
        await new Promise((r) => setTimeout(r, 10));
      }
    } finally {
      await client.close();
      await daemon.stop();
      tmp.cleanup();
    }
  });
});

// Against a real outrund started here (OUTRUN_OUTRUND, default ../../build/bin/outrund).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, double, OutrunError } from '../dist/index.js';
import { startDaemon, tempSocket } from './helpers.mjs';

describe('outrund', () => {
  let tmp, daemon, client;
  before(async () => {
    tmp = tempSocket();
    daemon = await startDaemon(tmp.socket);
    client = await connect(tmp.socket, { name: 'node-test' });
  });
  after(async () => {
    await client?.close();
    await daemon?.stop();
    tmp?.cleanup();
  });

  test('hello: server info', () => {
    const info = client.serverInfo;
    assert.equal(info.protocolVersion, 2);
    assert.equal(info.shards, 3); // 2 shards and the slow lane, the last one (D-slow-lane)
    assert.equal(info.maxInflight, 10000);
    assert.ok(info.serverVersion.length > 0);
    assert.equal(client.connected, true);
  });

  test('register + evaluate ok', async () => {
    const s = await client.register('Line1.Avg', 'return (inputs.a + inputs.b) / 2');
    assert.equal(s.key, 'Line1.Avg');
    assert.match(s.sha256, /^[0-9a-f]{64}$/);
    assert.ok(s.shard === 0 || s.shard === 1);
    const r = await client.evaluate(s, { a: 1, b: 2 });
    assert.deepEqual(r, { status: 'ok', value: 1.5, error: '', shard: s.shard });
    // the same key and source again: the same handle
    assert.equal(await client.register('Line1.Avg', 'return (inputs.a + inputs.b) / 2'), s);
  });

  test('script logs: print and log.* come with the result and stay in the ring', async () => {
    const s = await client.register('node.logger', "print('n =', inputs.n) log.warn('careful') return 1");
    const r = await client.evaluate(s, { n: 7 });
    assert.equal(r.status, 'ok');
    assert.deepEqual(r.logs, [{ level: 'info', text: 'n = 7' }, { level: 'warn', text: 'careful' }]);
    assert.equal(r.logsDropped, 0);
    const page = await client.scriptLogs('node.logger');
    assert.deepEqual(page.lines.map((l) => [l.seq, l.level, l.text]), [[1, 'info', 'n = 7'], [2, 'warn', 'careful']]);
    assert.match(page.lines[0].time, /^\d{4}-\d\d-\d\dT.*Z$/);
    assert.equal(page.next, 3);
    assert.deepEqual((await client.scriptLogs('node.logger', page.next)).lines, []);
    await assert.rejects(client.scriptLogs('node.nope'), (e) => e instanceof OutrunError && e.status === 'invalid_argument');
    // A script that logs nothing: no logs field at all.
    const quiet = await client.register('node.quiet', 'return 1');
    assert.equal('logs' in (await client.evaluate(quiet)), false);
  });

  test('every value kind round-trips', async () => {
    const echo = await client.register('Echo', 'return inputs.x');
    const kind = await client.register('Kind', 'return math.type(inputs.x) or type(inputs.x)');
    const cases = [
      [null, null],
      [undefined, null],
      [true, true],
      [false, false],
      [0, 0],
      [-42, -42],
      [Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER],
      [2n ** 62n, 2n ** 62n],
      [-(2n ** 63n), -(2n ** 63n)],
      [5n, 5],
      [1.5, 1.5],
      [-0.25, -0.25],
      [1e300, 1e300],
      [double(2), 2],
      ['', ''],
      ['héllo wörld ✓', 'héllo wörld ✓'],
      [Buffer.from([0, 1, 0xff, 0xfe]), Buffer.from([0, 1, 0xff, 0xfe])],
      [new Uint8Array([0xc3, 0x28]), Buffer.from([0xc3, 0x28])],
      [[1, 'two', 3.5, true, [null === null]], [1, 'two', 3.5, true, [true]]],
      [{ a: 1, b: { c: 'd', e: [1, 2] } }, { a: 1, b: { c: 'd', e: [1, 2] } }],
      [new Map([['k', 'v']]), { k: 'v' }],
      [{}, {}],
    ];
    for (const [input, expected] of cases) {
      const r = await client.evaluate(echo, { x: input });
      assert.equal(r.status, 'ok', `${String(input)}: ${r.error}`);
      assert.deepEqual(r.value, expected, `round trip of ${String(input)}`);
    }
    // Lua sees integers as integers and other numbers (and double()) as floats.
    assert.equal((await client.evaluate(kind, { x: 3 })).value, 'integer');
    assert.equal((await client.evaluate(kind, { x: 3n })).value, 'integer');
    assert.equal((await client.evaluate(kind, { x: 3.25 })).value, 'float');
    assert.equal((await client.evaluate(kind, { x: double(3) })).value, 'float');
    assert.equal((await client.evaluate(kind, { x: 'a' })).value, 'string');
    assert.equal((await client.evaluate(kind, { x: Buffer.from([0xff]) })).value, 'string');
    // NaN and infinities are doubles
    const nan = await client.evaluate(echo, { x: NaN });
    assert.ok(Number.isNaN(nan.value));
    assert.equal((await client.evaluate(echo, { x: -Infinity })).value, -Infinity);
    // values the script builds
    const built = await client.register('Built', 'return {n = 1, list = {10, 20}, s = "x", f = 0.5, t = true}');
    assert.deepEqual((await client.evaluate(built)).value, { f: 0.5, list: [10, 20], n: 1, s: 'x', t: true });
    // several inputs
    const sum = await client.register('Sum', 'local t = 0 for _, v in pairs(inputs) do t = t + v end return t');
    assert.equal((await client.evaluate(sum, { a: 1, b: 2, c: 3.5 })).value, 6.5);
  });

  test('inputs without a wire kind end invalid_argument (a Result, not a rejection)', async () => {
    const echo = await client.register('Echo', 'return inputs.x');
    for (const bad of [() => 1, Symbol('s'), new Date(), 2n ** 64n]) {
      const r = await client.evaluate(echo, { x: bad });
      assert.equal(r.status, 'invalid_argument');
      assert.ok(r.error.length > 0);
    }
    let deep = 1;
    for (let i = 0; i < 40; i++) deep = [deep];
    assert.equal((await client.evaluate(echo, { x: deep })).status, 'invalid_argument');
    assert.equal((await client.evaluate({ key: 'fake' }, {})).status, 'invalid_argument');
    const throwing = { get x() { throw new Error('no'); } };
    const r = await client.evaluate(echo, { y: throwing });
    assert.equal(r.status, 'invalid_argument');
    assert.match(r.error, /threw: no/);
    assert.equal((await client.evaluate(echo, 'not an object')).status, 'invalid_argument');
  });

  test('compile_error and runtime_error carry the line', async () => {
    const bad = await client.register('Bad.Compile', 'local a = 1\nreturn +');
    const r1 = await client.evaluate(bad, {});
    assert.equal(r1.status, 'compile_error');
    assert.match(r1.error, /^Bad\.Compile:2:/);
    assert.equal(r1.value, null);
    const rt = await client.register('Bad.Runtime', 'local a = 1\nlocal b = 2\nerror("boom")');
    const r2 = await client.evaluate(rt, {});
    assert.equal(r2.status, 'runtime_error');
    assert.match(r2.error, /^Bad\.Runtime:3: boom/);
    const nilidx = await client.register('Bad.Index', 'return inputs.missing.field');
    const r3 = await client.evaluate(nilidx, {});
    assert.equal(r3.status, 'runtime_error');
    assert.match(r3.error, /Bad\.Index:1:/);
  });

  test('register with check: a syntax error rejects compile_error and registers nothing', async () => {
    const good = await client.register('Checked', 'return 1', { check: true });
    await assert.rejects(
      client.register('Checked', 'local x = 1\n\nreturn x +', { check: true }),
      (e) => e instanceof OutrunError && e.status === 'compile_error' && /^Checked:3:/.test(e.message),
    );
    // the key still holds its checked source
    assert.deepEqual(await client.evaluate(good), { status: 'ok', value: 1, error: '', shard: good.shard });
    await assert.rejects(
      client.register('NeverChecked', 'return = 1', { check: true }),
      (e) => e instanceof OutrunError && e.status === 'compile_error',
    );
    const listed = (await client.scripts()).scripts.map((x) => x.key);
    assert.ok(!listed.includes('NeverChecked'));
    // without check: registered as before, the error comes with the evaluation
    const bad = await client.register('Unchecked', 'return = 1');
    assert.equal((await client.evaluate(bad)).status, 'compile_error');
  });

  test('timeout', async () => {
    const loop = await client.register('Loop', 'while true do end');
    const t0 = Date.now();
    const r = await client.evaluate(loop, {});
    assert.equal(r.status, 'timeout');
    assert.ok(Date.now() - t0 >= 90, 'ended at about T');
    // the shard still works
    const ok = await client.register('After.Loop', 'return 7');
    assert.equal((await client.evaluate(ok)).value, 7);
  });

  test('evaluateBatch of 1,000', async () => {
    const sq = await client.register('Square', 'return inputs.x * inputs.x');
    const reqs = Array.from({ length: 1000 }, (_, i) => ({ script: sq, inputs: { x: i } }));
    // one socket write, one Evaluate frame
    const sock = client.socket;
    const writes = [];
    const orig = sock.write;
    sock.write = function (buf, ...rest) {
      writes.push(buf);
      return orig.call(this, buf, ...rest);
    };
    let results;
    try {
      const p = client.evaluateBatch(reqs);
      await null; // the flush runs in a microtask queued by the first evaluation
      assert.equal(client.inflightCount, 1000);
      results = await p;
    } finally {
      sock.write = orig;
    }
    assert.equal(writes.length, 1);
    const len = Buffer.from(writes[0]).readUInt32LE(0);
    assert.equal(len + 4, writes[0].length, 'exactly one frame in the write');
    assert.equal(results.length, 1000);
    results.forEach((r, i) => {
      assert.equal(r.status, 'ok');
      assert.equal(r.value, i * i);
      assert.equal(r.shard, sq.shard);
    });
  });

  test('a batch larger than 4 MiB is split into several frames', async () => {
    const len = await client.register('Len', 'return #inputs.s + inputs.i');
    const big = 'x'.repeat(1 << 20);
    const reqs = Array.from({ length: 12 }, (_, i) => ({ script: len, inputs: { s: big, i } }));
    const results = await client.evaluateBatch(reqs);
    results.forEach((r, i) => assert.deepEqual(r, { status: 'ok', value: (1 << 20) + i, error: '', shard: len.shard }));
    // one evaluation over the 8 MiB input limit ends invalid_argument before it is sent
    const huge = await client.evaluate(len, { s: 'y'.repeat(9 << 20), i: 0 });
    assert.equal(huge.status, 'invalid_argument');
  });

  test('10,000 evaluations in flight across several scripts', async () => {
    const scripts = await Promise.all(
      Array.from({ length: 8 }, (_, k) => client.register(`Conc.${k}`, `return inputs.i * ${k + 1} + ${k}`)),
    );
    const n = 10000;
    const pending = [];
    for (let i = 0; i < n; i++) {
      const k = i % scripts.length;
      pending.push(client.evaluate(scripts[k], { i }).then((r) => [i, k, r]));
    }
    await null; // after the flush: all sent, none answered yet
    assert.equal(client.inflightCount, n);
    const all = await Promise.all(pending);
    for (const [i, k, r] of all) {
      assert.equal(r.status, 'ok', r.error);
      assert.equal(r.value, i * (k + 1) + k);
    }
  });

  test('control calls return parsed JSON', async () => {
    const st = await client.stats();
    assert.equal(typeof st.pid, 'number');
    assert.ok(st.evaluations.ok > 0);
    const sh = await client.shards();
    assert.equal(sh.shards.length, 3); // the slow lane's worker is the last
    assert.equal(sh.shards[0].index, 0);
    assert.equal(sh.shards[2].slow_lane, true);
    const sc = await client.scripts();
    assert.ok(sc.scripts.some((s) => s.key === 'Line1.Avg'));
  });

  test('scripts() reads every ListScripts page; scriptsPage() one at a time', async () => {
    const n = 2500;
    await Promise.all(Array.from({ length: n }, (_, i) => client.register(`Page.${String(i).padStart(5, '0')}`, 'return 1')));
    const first = await client.scriptsPage(); // no paging fields: the first 1000 and a cursor
    assert.equal(first.scripts.length, 1000);
    assert.equal(typeof first.next, 'string');
    const keys = [];
    let after = '';
    for (;;) {
      const page = await client.scriptsPage(after, 700);
      assert.ok(page.scripts.length <= 700);
      for (const s of page.scripts) keys.push(s.key);
      if (page.next === null) break;
      after = page.next;
    }
    const sorted = [...keys].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
    assert.deepEqual(keys, sorted); // by key
    assert.equal(new Set(keys).size, keys.length); // each once
    const all = (await client.scripts()).scripts.map((s) => s.key);
    assert.deepEqual(all, keys);
    assert.equal(all.filter((k) => k.startsWith('Page.')).length, n);
    await assert.rejects(client.scriptsPage('not a cursor'), (e) => {
      assert.ok(e instanceof OutrunError);
      assert.equal(e.status, 'invalid_argument');
      return true;
    });
  });

  test('invalid key and source reject with OutrunError invalid_argument', async () => {
    for (const key of ['', 'k'.repeat(257)]) {
      await assert.rejects(client.register(key, 'return 1'), (e) => {
        assert.ok(e instanceof OutrunError);
        assert.ok(e instanceof Error);
        assert.equal(e.status, 'invalid_argument');
        return true;
      });
    }
    await assert.rejects(client.register('Big', 'x'.repeat((1 << 20) + 1)), { status: 'invalid_argument' });
    await assert.rejects(client.killShard(99), { name: 'OutrunError', status: 'invalid_argument' });
  });

  test('close: later calls end cancelled', async () => {
    const c2 = await connect(tmp.socket);
    const s = await c2.register('Close.Me', 'return 1');
    const inflight = c2.evaluate(s, {});
    await c2.close();
    assert.equal((await inflight).status, 'cancelled');
    assert.equal((await c2.evaluate(s, {})).status, 'cancelled');
    await assert.rejects(c2.register('x', 'return 1'), { status: 'cancelled' });
  });

  test('connect to a path with no daemon rejects unavailable', async () => {
    await assert.rejects(connect(tmp.socket + '.none'), { name: 'OutrunError', status: 'unavailable' });
  });
});

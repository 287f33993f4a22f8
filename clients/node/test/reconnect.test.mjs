// The daemon is SIGKILLed mid-flight, then a new one starts on the same path.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { connect } from '../dist/index.js';
import { startDaemon, tempSocket } from './helpers.mjs';

const SLOW = 'local x = 0 for i = 1, 3000000 do x = x + 1 end return inputs.tag';

test('SIGKILL mid-flight: in flight ends unavailable, then the client reconnects with the same handles', async () => {
  const tmp = tempSocket();
  let d1 = await startDaemon(tmp.socket, { timeoutMs: 5000 });
  const c = await connect(tmp.socket, { reconnectInitialDelayMs: 300, reconnectMaxDelayMs: 1000, disconnectedWaitMs: 10000 });
  const failFast = await connect(tmp.socket, { disconnectedWaitMs: 0 });
  const noReconnect = await connect(tmp.socket, { reconnect: false });
  let other = null;
  try {
    const a = await c.register('A', 'return "a" .. inputs.i');
    const b = await c.register('B', 'return inputs.i * 10');
    const slow = await c.register('Slow', SLOW);
    const ffScript = await failFast.register('FF', 'return 1');
    const nrScript = await noReconnect.register('NR', 'return 1');
    assert.equal((await c.evaluate(a, { i: 1 })).value, 'a1');
    const handles = [a.handle, b.handle, slow.handle];

    // Fill the shards with slow evaluations, then kill the daemon while they run.
    const inflight = Array.from({ length: 40 }, (_, tag) => c.evaluate(slow, { tag }));
    await null;
    assert.equal(c.inflightCount, 40);
    const disconnected = once(c, 'disconnected');
    const nrDisconnected = once(noReconnect, 'disconnected');
    await new Promise((r) => setTimeout(r, 30));
    d1.child.kill('SIGKILL');
    await d1.exited;
    const results = await Promise.all(inflight);
    const lost = results.filter((r) => r.status === 'unavailable');
    assert.ok(lost.length > 0, 'some were in flight');
    for (const r of results) {
      assert.ok(r.status === 'ok' || r.status === 'unavailable', r.status);
      if (r.status === 'unavailable') assert.match(r.error, /connection to outrund was lost/);
    }
    const [err, willReconnect] = await disconnected;
    assert.match(err.message, /lost/);
    assert.equal(willReconnect, true);
    assert.equal(c.connected, false);
    assert.equal((await nrDisconnected)[1], false);

    // Disconnected: the fail-fast client answers unavailable at once, the other waits.
    assert.equal((await failFast.evaluate(ffScript, {})).status, 'unavailable');
    assert.equal((await noReconnect.evaluate(nrScript, {})).status, 'unavailable');
    const waiting = c.evaluate(b, { i: 4 });
    const waitingReg = c.register('C', 'return "c"');

    // A new daemon on the same path; another client takes handle 0 first, so the new daemon's
    // handles for A, B, Slow differ from the old ones.
    const connected = once(c, 'connected');
    const d2 = await startDaemon(tmp.socket, { timeoutMs: 5000 });
    d1 = d2;
    other = await connect(tmp.socket, { reconnect: false });
    await other.register('Other.First', 'return "other"');
    const [info] = await connected;
    assert.equal(info.shards, 3); // 2 shards and the slow lane (design/supervision.md)
    assert.equal(c.connected, true);

    assert.deepEqual(await waiting, { status: 'ok', value: 40, error: '', shard: b.shard });
    const cs = await waitingReg;
    assert.equal((await c.evaluate(cs)).value, 'c');
    assert.equal((await c.evaluate(a, { i: 2 })).value, 'a2');
    assert.equal((await c.evaluate(b, { i: 3 })).value, 30);
    assert.equal((await c.evaluate(slow, { tag: 'x' })).value, 'x');
    const rs = await Promise.all(Array.from({ length: 500 }, (_, i) => c.evaluate(i % 2 ? a : b, { i })));
    rs.forEach((r, i) => assert.equal(r.value, i % 2 ? `a${i}` : i * 10));
    const now = [a.handle, b.handle, slow.handle];
    if (now[0] !== handles[0]) assert.notDeepEqual(now, handles); // remapped (usually: Other.First took 0)
    // the fail-fast client came back too
    if (!failFast.connected) await once(failFast, 'connected');
    assert.equal((await failFast.evaluate(ffScript, {})).value, 1);
  } finally {
    await other?.close();
    await c.close();
    await failFast.close();
    await noReconnect.close();
    await d1.stop();
    tmp.cleanup();
  }
});

test('evaluations waiting for a reconnection give up after disconnectedWaitMs', async () => {
  const tmp = tempSocket();
  const d = await startDaemon(tmp.socket);
  const c = await connect(tmp.socket, { disconnectedWaitMs: 150, disconnectedQueueLimit: 3, reconnectInitialDelayMs: 50 });
  try {
    const s = await c.register('S', 'return 1');
    const down = once(c, 'disconnected');
    d.child.kill('SIGKILL');
    await d.exited;
    await down;
    const t0 = Date.now();
    const waits = [c.evaluate(s), c.evaluate(s), c.evaluate(s), c.evaluate(s)];
    const rs = await Promise.all(waits);
    assert.deepEqual(rs.map((r) => r.status), ['unavailable', 'unavailable', 'unavailable', 'unavailable']);
    assert.match(rs[3].error, /already wait/);
    assert.match(rs[0].error, /not reconnected within 150 ms/);
    assert.ok(Date.now() - t0 >= 140);
    await assert.rejects(c.stats(), { status: 'unavailable' });
  } finally {
    await c.close();
    tmp.cleanup();
  }
});

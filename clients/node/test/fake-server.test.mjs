// A fake daemon on a Unix socket: what the client does with bad or unusual server behaviour.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { once } from 'node:events';
import { connect, OutrunError, wire } from '../dist/index.js';
import { tempSocket } from './helpers.mjs';
import { controlReply, inputOf, intResults, readFrames, registered, serverHello, sharedStringResults, sharedTagValues, tagChanges, tagsReply } from './fake.mjs';

const { w } = wire;

/** Starts a server; `onClient(sock, frames)` gets each connection and an async frame iterator. */
async function fakeServer(onClient) {
  const tmp = tempSocket('fake');
  const socks = new Set();
  const server = net.createServer((sock) => {
    socks.add(sock);
    sock.on('error', () => {});
    sock.on('close', () => socks.delete(sock));
    onClient(sock);
  });
  server.listen(tmp.socket);
  await once(server, 'listening');
  return {
    path: tmp.socket,
    async close() {
      for (const s of socks) s.destroy();
      await new Promise((r) => server.close(r));
      tmp.cleanup();
    },
  };
}

test('ServerHello then garbage: the connection closes with an error', async () => {
  let registerSeen = null;
  const srv = await fakeServer((sock) => {
    readFrames(sock, (f) => {
      if (f.type === w.Body.ClientHello) {
        const h = wire.body(f, w.ClientHello);
        assert.equal(h.protocolVersion(), 2);
        assert.equal(h.clientName(), 'fake-test');
        sock.write(serverHello());
      } else if (f.type === w.Body.Register) {
        registerSeen = wire.body(f, w.Register).key();
        // a plausible length, then bytes that are no FlatBuffer
        const junk = Buffer.alloc(4 + 64, 0xff);
        junk.writeUInt32LE(64);
        sock.write(junk);
      }
    });
  });
  const c = await connect(srv.path, { name: 'fake-test', reconnect: false });
  const disconnected = once(c, 'disconnected');
  await assert.rejects(c.register('k', 'return 1'), (e) => {
    assert.ok(e instanceof OutrunError);
    assert.equal(e.status, 'unavailable');
    assert.match(e.message, /bad frame/);
    return true;
  });
  const [err, willReconnect] = await disconnected;
  assert.match(err.message, /bad frame/);
  assert.equal(willReconnect, false);
  assert.equal(registerSeen, 'k');
  assert.equal(c.connected, false);
  await c.close();
  await srv.close();
});

test('an oversized length closes the connection; in-flight evaluations end unavailable', async () => {
  const srv = await fakeServer((sock) => {
    readFrames(sock, (f) => {
      if (f.type === w.Body.ClientHello) sock.write(serverHello());
      else if (f.type === w.Body.Register) sock.write(registered(wire.body(f, w.Register).requestId(), 3));
      else if (f.type === w.Body.Evaluate) {
        const big = Buffer.alloc(4);
        big.writeUInt32LE(0xffffffff);
        sock.write(big);
      }
    });
  });
  const c = await connect(srv.path, { reconnect: false });
  const s = await c.register('k', 'return 1');
  assert.equal(s.handle, 3);
  assert.equal(s.sha256, 'ab'.repeat(32));
  const r = await c.evaluate(s, { a: 1 });
  assert.equal(r.status, 'unavailable');
  assert.match(r.error, /exceeds the maximum/);
  // no reconnection: later evaluations end unavailable at once
  assert.equal((await c.evaluate(s, {})).status, 'unavailable');
  await c.close();
  await srv.close();
});

for (const asKeys of [false, true]) {
  test(`results sharing one large string ${asKeys ? 'as map keys' : 'as array items'} are refused, not copied 512 times`, async () => {
    const srv = await fakeServer((sock) => {
      readFrames(sock, (f) => {
        if (f.type === w.Body.ClientHello) sock.write(serverHello());
        else if (f.type === w.Body.Register) sock.write(registered(wire.body(f, w.Register).requestId(), 3));
        else if (f.type === w.Body.Evaluate) {
          const e = wire.body(f, w.Evaluate).items(0);
          sock.write(sharedStringResults(Number(e.id()), { asKeys }));
        }
      });
    });
    const c = await connect(srv.path, { reconnect: false });
    const s = await c.register('k', 'return 1');
    const r = await c.evaluate(s, {});
    assert.equal(r.status, 'unavailable');
    assert.match(r.error, /decodes to more than 67108864 bytes/);
    await c.close();
    await srv.close();
  });
}

test('a frame body a daemon never sends (Evaluate) is a violation', async () => {
  const srv = await fakeServer((sock) => {
    readFrames(sock, (f) => {
      if (f.type === w.Body.ClientHello) sock.write(serverHello());
      else if (f.type === w.Body.Evaluate) sock.write(Buffer.from(f.bytes)); // echo it back
      else if (f.type === w.Body.Register) sock.write(registered(wire.body(f, w.Register).requestId(), 0));
    });
  });
  const c = await connect(srv.path, { reconnect: false });
  const s = await c.register('k', 'return 1');
  const r = await c.evaluate(s, { x: 1 });
  assert.equal(r.status, 'unavailable');
  assert.match(r.error, /Evaluate frame/);
  await c.close();
  await srv.close();
});

test('results split across writes and many per write; max_inflight is respected', async () => {
  let maxSeen = 0;
  const inflight = new Map();
  let sockRef;
  const srv = await fakeServer((sock) => {
    sockRef = sock;
    readFrames(sock, (f) => {
      if (f.type === w.Body.ClientHello) sock.write(serverHello({ maxInflight: 100 }));
      else if (f.type === w.Body.Register) sock.write(registered(wire.body(f, w.Register).requestId(), 0));
      else if (f.type === w.Body.Evaluate) {
        const ev = wire.body(f, w.Evaluate);
        for (let i = 0; i < ev.itemsLength(); i++) {
          const e = ev.items(i);
          const input = inputOf(e, 0);
          inflight.set(Number(e.id()), Number(input.value().intValue()));
        }
        maxSeen = Math.max(maxSeen, inflight.size);
        // answer everything, doubled, as many small frames in one write, split at odd places
        const out = Buffer.concat([...inflight].map(([id, v]) => intResults([[id, v * 2]])));
        inflight.clear();
        const third = Math.floor(out.length / 3) + 1;
        sock.write(out.subarray(0, third));
        setImmediate(() => sock.write(out.subarray(third)));
      }
    });
  });
  const c = await connect(srv.path, { reconnect: false });
  assert.equal(c.serverInfo.maxInflight, 100);
  const s = await c.register('k', 'return inputs.v * 2');
  const results = await Promise.all(Array.from({ length: 1000 }, (_, v) => c.evaluate(s, { v })));
  results.forEach((r, v) => assert.deepEqual(r, { status: 'ok', value: v * 2, error: '', shard: 0 }));
  assert.equal(maxSeen, 100, 'never more than max_inflight sent');
  await c.close();
  await srv.close();
});

test('a refusing daemon: connect rejects with its reason', async () => {
  const srv = await fakeServer((sock) => {
    readFrames(sock, (f) => {
      if (f.type === w.Body.ClientHello) sock.end(serverHello({ error: 'uid 1234 is not allowed' }));
    });
  });
  await assert.rejects(connect(srv.path), (e) => e instanceof OutrunError && e.status === 'unavailable' && /not allowed/.test(e.message));
  await srv.close();
});

test('a daemon that never says hello: connect times out', async () => {
  const srv = await fakeServer(() => {});
  await assert.rejects(connect(srv.path, { replyTimeoutMs: 200 }), { status: 'unavailable', message: /no hello/ });
  await srv.close();
});

test('a daemon speaking another protocol version is refused', async () => {
  const srv = await fakeServer((sock) => {
    readFrames(sock, (f) => {
      if (f.type === w.Body.ClientHello) sock.write(serverHello({ version: 3 }));
    });
  });
  await assert.rejects(connect(srv.path), { status: 'unavailable', message: /protocol 3/ });
  await srv.close();
});

test("the daemon's own refusal of a registration rejects OutrunError with its status and message", async () => {
  const flatbuffers = await import('flatbuffers');
  const srv = await fakeServer((sock) => {
    readFrames(sock, (f) => {
      if (f.type === w.Body.ClientHello) sock.write(serverHello());
      else if (f.type === w.Body.Register) {
        const r = wire.body(f, w.Register);
        const b = new flatbuffers.Builder(128);
        const full = r.key() === 'full';
        const e = b.createString(full ? 'the registry is full' : 'script key is odd');
        const body = w.Registered.createRegistered(b, r.requestId(), full ? w.Status.Unavailable : w.Status.InvalidArgument, e, 0, 0, 0, 0n);
        w.Frame.finishSizePrefixedFrameBuffer(b, w.Frame.createFrame(b, w.Body.Registered, body));
        sock.write(b.asUint8Array());
      }
    });
  });
  const c = await connect(srv.path, { reconnect: false });
  await assert.rejects(c.register('odd', 'return 1'), (e) => e instanceof OutrunError && e.status === 'invalid_argument' && e.message === 'script key is odd');
  await assert.rejects(c.register('full', 'return 1'), { status: 'unavailable', message: 'the registry is full' });
  assert.equal(c.connected, true, 'a refusal is not a protocol violation');
  await c.close();
  await srv.close();
});

test('a request larger than a frame is refused invalid_argument without a byte sent; the connection goes on', async () => {
  const flatbuffers = await import('flatbuffers');
  const seen = [];
  let bytes = 0;
  const srv = await fakeServer((sock) => {
    sock.on('data', (chunk) => { bytes += chunk.length; });
    readFrames(sock, (f) => {
      seen.push(w.Body[f.type]);
      if (f.type === w.Body.ClientHello) sock.write(serverHello());
      else if (f.type === w.Body.SourceUpdates) {
        const b = new flatbuffers.Builder(64);
        const body = w.TagsReply.createTagsReply(b, wire.body(f, w.SourceUpdates).requestId(), w.Status.Ok, 0, 0);
        w.Frame.finishSizePrefixedFrameBuffer(b, w.Frame.createFrame(b, w.Body.TagsReply, body));
        sock.write(b.asUint8Array());
      }
    });
  });
  const c = await connect(srv.path, { reconnect: false });
  await new Promise((r) => setTimeout(r, 50));
  const before = bytes;
  const big = 'x'.repeat(17 << 20);
  const tooBig = (e) => e instanceof OutrunError && e.status === 'invalid_argument' && /16777216/.test(e.message);
  await assert.rejects(c.updateSources([{ tag: 'A', value: big }]), tooBig);
  await assert.rejects(c.updateSources([{ tag: 'A', value: { nested: [Buffer.alloc(9 << 20), Buffer.alloc(9 << 20)] } }]), tooBig);
  assert.throws(() => c.updateSourcesNoReply([{ tag: 'A', value: big }]), tooBig);
  await assert.rejects(c.defineTags(big), tooBig);
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(bytes, before, 'nothing was sent');
  await c.updateSources([{ tag: 'A', value: 1 }]);
  assert.deepEqual(seen, ['ClientHello', 'SourceUpdates']);
  assert.equal(c.connected, true);
  await c.close();
  await srv.close();
});

// ---- a hostile daemon: every call settles; what a frame decodes to is bounded ----

/** The request id of a client frame that carries one (Register, Control, tags requests). */
function requestIdOf(f) {
  const cls = { [w.Body.Register]: w.Register, [w.Body.Control]: w.Control, [w.Body.DefineTags]: w.DefineTags,
    [w.Body.RemoveTags]: w.RemoveTags, [w.Body.ListTags]: w.ListTags, [w.Body.SourceUpdates]: w.SourceUpdates,
    [w.Body.Subscribe]: w.Subscribe, [w.Body.ReadTags]: w.ReadTags }[f.type];
  return cls ? wire.body(f, cls).requestId() : null;
}

test('a daemon that answers hello and Register but ignores Evaluate: evaluations end unavailable at evaluateTimeoutMs; a late result is dropped', async () => {
  const ignored = [];
  let answer = false;
  let sockRef;
  const srv = await fakeServer((sock) => {
    sockRef = sock;
    readFrames(sock, (f) => {
      if (f.type === w.Body.ClientHello) sock.write(serverHello({ maxInflight: 2 }));
      else if (f.type === w.Body.Register) sock.write(registered(wire.body(f, w.Register).requestId(), 3));
      else if (f.type === w.Body.Evaluate) {
        const ev = wire.body(f, w.Evaluate);
        for (let i = 0; i < ev.itemsLength(); i++) {
          const id = Number(ev.items(i).id());
          if (answer) sock.write(intResults([[id, 7]]));
          else ignored.push(id);
        }
      }
    });
  });
  const c = await connect(srv.path, { reconnect: false, evaluateTimeoutMs: 300 });
  const s = await c.register('k', 'return 1');
  const t0 = Date.now();
  // 5 evaluations, 2 in flight (max_inflight) and 3 queued behind them: all settle.
  const results = await Promise.all([c.evaluate(s, { a: 1 }), ...Array.from({ length: 4 }, () => c.evaluate(s, {}))]);
  const took = Date.now() - t0;
  for (const r of results) {
    assert.equal(r.status, 'unavailable');
    assert.match(r.error, /did not answer within 300 ms \(evaluateTimeoutMs\)/);
  }
  assert.ok(took >= 290 && took < 3000, `settled after ${took} ms`);
  assert.equal(c.inflightCount, 0);
  assert.ok(ignored.length >= 2, 'the daemon got them');
  // The results come now, late: dropped, nothing settles twice, the connection goes on.
  sockRef.write(Buffer.concat(ignored.map((id) => intResults([[id, 99]]))));
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(c.connected, true);
  answer = true;
  assert.deepEqual(await c.evaluate(s, {}), { status: 'ok', value: 7, error: '', shard: 0 });
  // Nothing waits: the sweep stops, and it never held the process.
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(c.sweepTimer, null, 'the sweep stops once nothing waits');
  await c.close();
  await srv.close();
});

test('a daemon that ignores every request: each call rejects unavailable at replyTimeoutMs; late replies are dropped', async () => {
  const pending = [];
  let sockRef;
  const srv = await fakeServer((sock) => {
    sockRef = sock;
    readFrames(sock, (f) => {
      if (f.type === w.Body.ClientHello) sock.write(serverHello());
      else {
        const id = requestIdOf(f);
        if (id !== null) pending.push([f.type, id]);
      }
    });
  });
  const c = await connect(srv.path, { reconnect: false, replyTimeoutMs: 250 });
  assert.equal(c.sweepTimer, null, 'nothing waits: no timer');
  const t0 = Date.now();
  const calls = {
    register: c.register('k', 'return 1'),
    stats: c.stats(),
    shards: c.shards(),
    scripts: c.scripts(),
    killShard: c.killShard(0),
    defineTags: c.defineTags('[tags.A]\nscript = "return 1"\n'),
    removeTags: c.removeTags(['A']),
    listTags: c.listTags(),
    updateSources: c.updateSources([{ tag: 'S', value: 1 }]),
    subscribe: c.subscribe([], () => {}),
    readTags: c.readTags(['A']),
  };
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(c.sweepTimer.hasRef(), false, 'the sweep does not keep the process alive');
  const settled = Object.entries(calls).map(([name, p]) => [name, p.then(() => assert.fail(`${name} resolved`), (e) => e)]);
  for (const [name, p] of settled) {
    await assert.rejects(p.then((e) => Promise.reject(e)), (e) => {
      assert.ok(e instanceof OutrunError, name);
      assert.equal(e.status, 'unavailable', name);
      assert.match(e.message, /did not answer within 250 ms \(replyTimeoutMs\)/, name);
      return true;
    });
  }
  const took = Date.now() - t0;
  assert.ok(took < 3000, `settled after ${took} ms`);
  assert.equal(pending.length, Object.keys(calls).length);
  // Late replies of every kind: dropped.
  sockRef.write(Buffer.concat(pending.map(([type, id]) =>
    type === w.Body.Register ? registered(id, 1) : type === w.Body.Control ? controlReply(id, '{}') : type === w.Body.ReadTags ? sharedTagValues(id, 1) : tagsReply(id, '{}'))));
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(c.connected, true);
  await c.close();
  await srv.close();
});

for (const how of ['closes', 'is killed mid-frame']) {
  test(`a daemon that ${how}: every call in flight settles at once`, async () => {
    let sockRef;
    let seen = 0;
    const srv = await fakeServer((sock) => {
      sockRef = sock;
      readFrames(sock, (f) => {
        if (f.type === w.Body.ClientHello) sock.write(serverHello());
        else if (f.type === w.Body.Register && seen++ === 0) sock.write(registered(wire.body(f, w.Register).requestId(), 3));
      });
    });
    const c = await connect(srv.path, { reconnect: false, replyTimeoutMs: 60000, evaluateTimeoutMs: 60000 });
    const s = await c.register('k', 'return 1');
    const evals = [c.evaluate(s, {}), c.evaluateBatch([{ script: s }, { script: s, inputs: { x: 1 } }])];
    const calls = [c.register('k2', 'return 2'), c.stats(), c.scriptsPage(), c.listTags(), c.readTags(['A']),
      c.updateSources([{ tag: 'S', value: 1 }]), c.subscribe(['A'], () => {}), c.defineTags('x'), c.removeTags(['A'])]
      .map((p) => p.then(() => null, (e) => e));
    await new Promise((r) => setTimeout(r, 50));
    const t0 = Date.now();
    if (how === 'closes') sockRef.end();
    else sockRef.destroy(Buffer.from([0x40, 0, 0])); // half a length prefix, then gone
    if (how !== 'closes') sockRef.destroy();
    const [one, batch] = await Promise.all(evals);
    for (const r of [one, ...batch]) assert.equal(r.status, 'unavailable');
    for (const e of await Promise.all(calls)) assert.equal(e?.status, 'unavailable');
    assert.ok(Date.now() - t0 < 1000);
    assert.equal(c.inflightCount, 0);
    await c.close();
    await srv.close();
  });
}

test('close() ends every call still waiting, and later calls, cancelled', async () => {
  const srv = await fakeServer((sock) => {
    readFrames(sock, (f) => {
      if (f.type === w.Body.ClientHello) sock.write(serverHello());
      else if (f.type === w.Body.Register) sock.write(registered(wire.body(f, w.Register).requestId(), 3));
    });
  });
  const c = await connect(srv.path, { reconnect: false });
  const s = await c.register('k', 'return 1');
  const ev = c.evaluate(s, {});
  const calls = [c.stats(), c.listTags(), c.readTags(['A'])].map((p) => p.then(() => null, (e) => e));
  await new Promise((r) => setTimeout(r, 20));
  await c.close();
  assert.equal((await ev).status, 'cancelled');
  for (const e of await Promise.all(calls)) assert.equal(e?.status, 'cancelled');
  await assert.rejects(c.listTags(), { status: 'cancelled' });
  assert.equal(c.sweepTimer, null);
  await srv.close();
});

/** A daemon that answers hello and Register, subscribes, then sends `frames` (a function of the socket). */
async function pushingDaemon(onSubscribed) {
  return fakeServer((sock) => {
    readFrames(sock, (f) => {
      if (f.type === w.Body.ClientHello) sock.write(serverHello());
      else if (f.type === w.Body.Subscribe) {
        sock.write(tagsReply(wire.body(f, w.Subscribe).requestId()));
        onSubscribed(sock);
      } else if (f.type === w.Body.ReadTags) onSubscribed(sock, wire.body(f, w.ReadTags).requestId());
    });
  });
}

test('a TagChanges frame of 3.5 million entries pointing at one TagValue is refused at once, not decoded', async () => {
  const frame = tagChanges(3_500_000); // 14 MB
  assert.ok(frame.length > 13e6 && frame.length < 16 << 20);
  let stalls = 0;
  let last = performance.now();
  const ticker = setInterval(() => {
    const now = performance.now();
    stalls = Math.max(stalls, now - last);
    last = now;
  }, 5);
  const srv = await pushingDaemon((sock) => sock.write(frame));
  const c = await connect(srv.path, { reconnect: false });
  const got = [];
  const heap0 = process.memoryUsage().heapUsed;
  let peak = heap0;
  const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().heapUsed)), 2);
  const disconnected = once(c, 'disconnected');
  await c.subscribe([], (changes) => got.push(changes.length));
  const [err] = await disconnected;
  clearInterval(ticker);
  clearInterval(sampler);
  peak = Math.max(peak, process.memoryUsage().heapUsed);
  assert.match(err.message, /bad frame: frame of 3500000 tag values decodes to more than 67108864 bytes \(512 per entry/);
  assert.deepEqual(got, [], 'nothing delivered');
  assert.ok(peak - heap0 < 200e6, `heap grew ${((peak - heap0) / 1e6).toFixed(0)} MB`);
  assert.ok(stalls < 1500, `event loop blocked ${stalls.toFixed(0)} ms`);
  await c.close();
  await srv.close();
});

test('TagChanges: entries that fit the budget one by one but not together are refused; an honest frame of 50,000 passes', async () => {
  // 130,000 entries × 512 fit 64 MiB, but with their 11-byte tag ids they do not: refused while decoding.
  let n = 0;
  const frames = [tagChanges(50_000, { shared: false }), tagChanges(130_000)];
  const srv = await pushingDaemon((sock) => sock.write(frames[n++]));
  const c = await connect(srv.path, { reconnect: false });
  const got = [];
  const disconnected = once(c, 'disconnected');
  await c.subscribe([], (changes) => {
    got.push(changes.length);
    if (got.length === 1) c.subscribe(['X'], () => {}).catch(() => {}); // asks for the second frame
  });
  const [err] = await Promise.race([disconnected, new Promise((_, no) => setTimeout(() => no(new Error(`not refused; delivered ${got}`)), 20000))]);
  assert.match(err.message, /decodes to more than 67108864 bytes/);
  assert.deepEqual(got, [50_000]);
  await c.close();
  await srv.close();
});

test('TagValues (a ReadTags reply) of a million shared entries: refused, the connection closes, the call rejects', async () => {
  const srv = await pushingDaemon((sock, id) => {
    if (id !== undefined) sock.write(sharedTagValues(id, 1_000_000));
  });
  const c = await connect(srv.path, { reconnect: false });
  await assert.rejects(c.readTags(['Tank1.Level']), { status: 'unavailable', message: /decodes to more than 67108864 bytes/ });
  assert.equal(c.connected, false);
  await c.close();
  await srv.close();
});

for (const [name, json, why] of [
  // (16 MiB less room for the frame around the text)
  ['16 MB of nested arrays', () => '['.repeat((8 << 20) - 512) + ']'.repeat((8 << 20) - 512), /nests deeper than 64 levels/],
  ['16 MB of empty objects', () => '[' + '{},'.repeat(((16 << 20) - 1024) / 3 - 2) + '{}]', /holds more than 1000000 objects and arrays/],
]) {
  test(`a reply of ${name} is refused with a clear error, not parsed; the connection goes on`, async () => {
    const text = json();
    const srv = await fakeServer((sock) => {
      readFrames(sock, (f) => {
        if (f.type === w.Body.ClientHello) sock.write(serverHello());
        else if (f.type === w.Body.ListTags) sock.write(tagsReply(wire.body(f, w.ListTags).requestId(), text));
        else if (f.type === w.Body.Control) sock.write(controlReply(wire.body(f, w.Control).requestId(), text));
      });
    });
    const c = await connect(srv.path, { reconnect: false });
    global.gc?.();
    const heap0 = process.memoryUsage().heapUsed;
    const t0 = performance.now();
    await assert.rejects(c.listTags(), (e) => e instanceof OutrunError && e.status === 'runtime_error' && why.test(e.message) && /ListTags reply/.test(e.message));
    await assert.rejects(c.stats(), (e) => e.status === 'runtime_error' && why.test(e.message) && /control reply/.test(e.message));
    const ms = performance.now() - t0;
    const grew = process.memoryUsage().heapUsed - heap0;
    assert.ok(grew < 150e6, `heap grew ${(grew / 1e6).toFixed(0)} MB`);
    assert.ok(ms < 20000, `${ms.toFixed(0)} ms`); // parsing them took 25-65 s here
    assert.equal(c.connected, true);
    await c.close();
    await srv.close();
  });
}

// A fake daemon on a Unix socket: what the client does with bad or unusual server behaviour.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { once } from 'node:events';
import { connect, OutrunError, wire } from '../dist/index.js';
import { tempSocket } from './helpers.mjs';
import { inputOf, intResults, readFrames, registered, serverHello, sharedStringResults } from './fake.mjs';

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
        const body = w.Registered.createRegistered(b, r.requestId(), full ? w.Status.Unavailable : w.Status.InvalidArgument, e, 0, 0, 0);
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

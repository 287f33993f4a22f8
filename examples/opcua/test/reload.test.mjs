// SIGHUP to outrund with a changed tags file changes what OPC UA clients see; a broken file
// changes nothing.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { combinedTags, daemonSupportsTags, startServerProcess, opcuaSession, read, write, until } from './helpers.mjs';

const support = await daemonSupportsTags();
const skip = support === true ? false : `outrund does not support the tags frames yet (${support})`;

let srv, ua, tags;
after(async () => {
  if (ua) await ua.close();
  if (srv) await srv.stop();
  if (tags) tags.cleanup();
});

test('SIGHUP reload: a changed file changes the results, a broken one changes nothing', { skip }, async () => {
  tags = combinedTags();
  srv = await startServerProcess({ tags: tags.file });
  assert.ok(srv.pid, 'the server says its outrund pid');
  const ns = srv.ns;
  ua = await opcuaSession(srv.endpoint);
  await write(ua.session, ns, 'Tank1.LevelRaw', 2047.5);
  await until(async () => (await read(ua.session, ns, 'Tank1.Volume')).value.value === 6);

  const text = readFileSync(tags.file, 'utf8');
  const changed = text.replace('script = "return inputs.level / 100 * 12"', 'script = "return inputs.level / 100 * 24"');
  assert.notEqual(changed, text);
  writeFileSync(tags.file, changed);
  process.kill(srv.pid, 'SIGHUP');
  await until(async () => (await read(ua.session, ns, 'Tank1.Volume')).value.value === 12, 5000);

  writeFileSync(tags.file, changed.replace('[[tag]]\nid = "Tank1.Volume"', '[[tag]\nid = "Tank1.Volume"'));
  process.kill(srv.pid, 'SIGHUP');
  await new Promise((r) => setTimeout(r, 500));
  assert.equal((await read(ua.session, ns, 'Tank1.Volume')).value.value, 12);
  await write(ua.session, ns, 'Tank1.LevelRaw', 4095);
  await until(async () => (await read(ua.session, ns, 'Tank1.Volume')).value.value === 24, 3000);
  assert.equal((await read(ua.session, ns, 'Tank1.Volume')).statusCode.value, 0);
});

test('a reload adds, removes and retypes nodes, with a GeneralModelChangeEvent', { skip }, async () => {
  const { ClientSubscription, ClientMonitoredItem, TimestampsToReturn, AttributeIds, StatusCodes, DataType, constructEventFilter, resolveNodeId } = await import('node-opcua');
  const t = combinedTags();
  const s = await startServerProcess({ tags: t.file });
  const u = await opcuaSession(s.endpoint);
  try {
    const ns = s.ns;
    await write(u.session, ns, 'Tank1.LevelRaw', 2047.5);
    await until(async () => (await read(u.session, ns, 'Tank1.Volume')).value.value === 6);
    const sub = ClientSubscription.create(u.session, { requestedPublishingInterval: 10, requestedLifetimeCount: 1000, requestedMaxKeepAliveCount: 20, maxNotificationsPerPublish: 1000, publishingEnabled: true, priority: 1 });
    await new Promise((r) => sub.once('started', r));
    const events = [];
    const ev = ClientMonitoredItem.create(sub, { nodeId: 'i=2253', attributeId: AttributeIds.EventNotifier }, { samplingInterval: 0, queueSize: 100, filter: constructEventFilter(['EventType', 'Changes']) }, TimestampsToReturn.Both);
    ev.on('changed', (fields) => events.push(fields));
    const volSeen = [];
    const vol = ClientMonitoredItem.create(sub, { nodeId: `ns=${ns};s=Tank1.Volume`, attributeId: AttributeIds.Value }, { samplingInterval: 0, queueSize: 100 }, TimestampsToReturn.Both);
    vol.on('changed', (dv) => volSeen.push(dv.statusCode.value >>> 0));
    await new Promise((r) => vol.once('initialized', r));
    // Remove Tank1.Volume, retype Tank1.LevelAvg (Double -> Float), add Tank1.Half.
    let text = readFileSync(t.file, 'utf8');
    const start = text.indexOf('[[tag]]\nid = "Tank1.Volume"');
    assert.ok(start >= 0);
    const end = text.indexOf('[[tag]]', start + 7);
    text = text.slice(0, start) + text.slice(end);
    const avg = text.indexOf('id = "Tank1.LevelAvg"');
    assert.ok(avg >= 0);
    text = text.slice(0, avg) + 'id = "Tank1.LevelAvg"\ntype = "Float"' + text.slice(avg + 'id = "Tank1.LevelAvg"'.length);
    text += '\n[[tag]]\nid = "Tank1.Half"\ninputs = [{ tag = "Tank1.Level", name = "level" }]\nscript = "return inputs.level / 2"\n';
    writeFileSync(t.file, text);
    process.kill(s.pid, 'SIGHUP');
    await until(async () => (await read(u.session, ns, 'Tank1.Half')).value.value === 25, 8000);
    // The removed node: gone, and its subscriber was told BadNodeIdUnknown.
    assert.equal((await read(u.session, ns, 'Tank1.Volume')).statusCode.value, StatusCodes.BadNodeIdUnknown.value);
    await until(() => volSeen.includes(StatusCodes.BadNodeIdUnknown.value), 3000);
    // The retyped node: its new DataType.
    const dt = await u.session.read({ nodeId: `ns=${ns};s=Tank1.LevelAvg`, attributeId: AttributeIds.DataType });
    assert.equal(dt.value.value.toString(), resolveNodeId('Float').toString());
    // One model change event naming what changed.
    const mce = await until(() => events.find((f) => f[0].value && f[0].value.toString() === resolveNodeId('GeneralModelChangeEventType').toString()), 3000);
    const affected = (mce[1].value ?? []).map((c) => c.affected.toString());
    for (const id of ['Tank1.Volume', 'Tank1.LevelAvg', 'Tank1.Half']) assert.ok(affected.includes(`ns=${ns};s=${id}`), `${id} in ${affected}`);
    await sub.terminate();
  } finally {
    await u.close();
    await s.stop();
    t.cleanup();
  }
});

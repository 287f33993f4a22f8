// End-to-end: node-opcua client -> the outrun OPC UA server -> its own outrund.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { join, dirname } from 'node:path';
import {
  ClientSubscription,
  ClientMonitoredItem,
  TimestampsToReturn,
  AttributeIds,
  DataType,
  StatusCodes,
  StatusCode,
  coerceNodeId,
  LocalizedText,
  Variant,
} from 'node-opcua';
import { ROOT, OUTRUND, combinedTags, daemonSupportsTags, startServerProcess, opcuaSession, read, write, until } from './helpers.mjs';

const support = await daemonSupportsTags();
const skip = support === true ? false : `outrund does not support the tags frames yet (${support})`;
if (skip) console.log(`# SKIP examples/opcua end-to-end tests: ${skip}`);

let srv, ua, tags, ns;
before(async () => {
  if (skip) return;
  tags = combinedTags();
  srv = await startServerProcess({ tags: tags.file });
  ns = srv.ns;
  ua = await opcuaSession(srv.endpoint);
});
after(async () => {
  if (ua) await ua.close();
  if (srv) assert.equal(await srv.stop(), 0, 'the server exits 0 at SIGTERM');
  if (srv && srv.pid) assert.throws(() => process.kill(srv.pid, 0), 'its outrund is gone');
  if (tags) tags.cleanup();
});

const code = (dv) => dv.statusCode.value >>> 0;

test('virtual tags start BadWaitingForInitialData', { skip }, async () => {
  const dv = await read(ua.session, ns, 'Test.Error');
  assert.equal(code(dv), StatusCodes.BadWaitingForInitialData.value);
});

test('source writes come back computed, with the declared DataTypes', { skip }, async () => {
  const t = new Date(Date.now() - 1000);
  assert.equal((await write(ua.session, ns, 'Tank1.LevelRaw', 2047.5, undefined, t)).value, 0);
  const level = await until(async () => {
    const dv = await read(ua.session, ns, 'Tank1.Level');
    return code(dv) === 0 && dv.value.value === 50 ? dv : null;
  });
  assert.equal(level.value.dataType, DataType.Double);
  assert.equal(level.sourceTimestamp.getTime(), t.getTime(), 'source timestamp: the write\'s');
  const vol = await until(async () => {
    const dv = await read(ua.session, ns, 'Tank1.Volume');
    return dv.value.value === 6 ? dv : null;
  });
  assert.equal(vol.value.dataType, DataType.Double);

  await write(ua.session, ns, 'Tank1.TempC', 20);
  const f = await until(async () => {
    const dv = await read(ua.session, ns, 'Tank1.TempF');
    return code(dv) === 0 && dv.value.value === 68 ? dv : null;
  });
  assert.equal(f.value.dataType, DataType.Float);

  await write(ua.session, ns, 'Test.InTypes', 41.7);
  const i = await until(async () => {
    const dv = await read(ua.session, ns, 'Test.Int');
    return code(dv) === 0 ? dv : null;
  });
  assert.equal(i.value.dataType, DataType.Int32);
  assert.equal(i.value.value, 41);
  const u = await read(ua.session, ns, 'Test.UInt');
  assert.equal(u.value.dataType, DataType.UInt16);
  assert.equal(u.value.value, 41);
  const s = await read(ua.session, ns, 'Test.Text');
  assert.equal(s.value.dataType, DataType.String);
  assert.equal(s.value.value, 'x=41.7');
  const a = await read(ua.session, ns, 'Test.Array');
  assert.equal(a.value.dataType, DataType.Double);
  assert.deepEqual(Array.from(a.value.value), [41.7, 83.4]);
  const d = await read(ua.session, ns, 'Test.When');
  assert.equal(d.value.dataType, DataType.DateTime);
  assert.ok(d.value.value instanceof Date);
  const hi = await until(async () => {
    const dv = await read(ua.session, ns, 'Tank1.HighAlarm'); // periodic (1 s)
    return code(dv) === 0 ? dv : null;
  }, 3000);
  assert.equal(hi.value.dataType, DataType.Boolean);
});

test('a Bad source gives a Bad virtual tag', { skip }, async () => {
  const r = await write(ua.session, ns, 'Tank1.LevelRaw', 1000, StatusCodes.BadSensorFailure);
  assert.equal(r.value, 0, `write: ${r.toString()}`);
  const dv = await until(async () => {
    const x = await read(ua.session, ns, 'Tank1.Level');
    return code(x) === StatusCodes.BadSensorFailure.value ? x : null;
  });
  assert.equal(code(dv), StatusCodes.BadSensorFailure.value);
  await until(async () => code(await read(ua.session, ns, 'Tank1.Volume')) === StatusCodes.BadSensorFailure.value);
  await write(ua.session, ns, 'Tank1.LevelRaw', 2047.5);
  await until(async () => code(await read(ua.session, ns, 'Tank1.Level')) === 0);
});

test('a script error is BadInternalError, a runaway BadTimeout; the rest keeps working', { skip }, async () => {
  await write(ua.session, ns, 'Test.InError', 1);
  await until(async () => code(await read(ua.session, ns, 'Test.Error')) === StatusCodes.BadInternalError.value);
  await write(ua.session, ns, 'Test.InRunaway', 1);
  // The server stays responsive: reads are answered at once during the runaway.
  const t0 = Date.now();
  await read(ua.session, ns, 'Tank1.Level');
  assert.ok(Date.now() - t0 < 500, `a read during the runaway took ${Date.now() - t0} ms`);
  // Other tags keep being computed (one that shares the runaway's worker waits at most T+G).
  await write(ua.session, ns, 'Tank1.TempC', 30);
  await until(async () => (await read(ua.session, ns, 'Tank1.TempF')).value.value === 86, 3000);
  await until(async () => code(await read(ua.session, ns, 'Test.Runaway')) === StatusCodes.BadTimeout.value, 6000);
  await write(ua.session, ns, 'Test.InRunaway', 0);
  await until(async () => code(await read(ua.session, ns, 'Test.Runaway')) === 0, 5000);
});

async function monitor(id, onValue) {
  const sub = ClientSubscription.create(ua.session, {
    requestedPublishingInterval: 10,
    requestedLifetimeCount: 1000,
    requestedMaxKeepAliveCount: 20,
    maxNotificationsPerPublish: 1000,
    publishingEnabled: true,
    priority: 1,
  });
  await new Promise((r) => sub.once('started', r));
  const item = ClientMonitoredItem.create(
    sub,
    { nodeId: `ns=${ns};s=${id}`, attributeId: AttributeIds.Value },
    { samplingInterval: 0, discardOldest: false, queueSize: 1000 },
    TimestampsToReturn.Both,
  );
  item.on('changed', onValue);
  await new Promise((r) => item.once('initialized', r));
  return sub;
}

test('a steady input produces no notifications', { skip }, async () => {
  await write(ua.session, ns, 'Tank1.LevelRaw', 3000);
  await until(async () => (await read(ua.session, ns, 'Tank1.Level')).value.value === 73.26);
  const seen = [];
  const sub = await monitor('Tank1.Level', (dv) => seen.push(dv));
  await until(() => seen.length >= 1, 2000);
  await new Promise((r) => setTimeout(r, 200));
  const before = seen.length;
  for (let i = 0; i < 20; i++) {
    await write(ua.session, ns, 'Tank1.LevelRaw', 3000);
    await write(ua.session, ns, 'Tank1.LevelRaw', 3001); // within the deadband (4 counts)
  }
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(seen.length, before, `no notifications for a steady input (got ${seen.length - before})`);
  await write(ua.session, ns, 'Tank1.LevelRaw', 3100);
  await until(() => seen.length > before, 2000);
  await sub.terminate();
});

test('kill-shard during an evaluation: UncertainLastUsableValue, then Good again', { skip }, async () => {
  const seen = [];
  const sub = await monitor('Test.Slow', (dv) => seen.push({ code: code(dv), value: dv.value.value }));
  await write(ua.session, ns, 'Test.InSlow', 1);
  await until(() => seen.some((s) => s.code === 0 && s.value === 2), 6000);
  // Test.Slow is busy for 300 ms: kill its shard during it. Under a loaded machine the kill may
  // land outside the evaluation; then try again (a new value each time).
  const UNC = StatusCodes.UncertainLastUsableValue.value;
  let x = 1;
  for (let attempt = 0; attempt < 4 && !seen.some((s) => s.code === UNC); attempt++) {
    x++;
    await write(ua.session, ns, 'Test.InSlow', x);
    await new Promise((r) => setTimeout(r, 60));
    for (const shard of ['0', '1']) execFileSync(join(dirname(OUTRUND), 'outrun'), ['--socket', srv.socket, 'kill-shard', shard]);
    await until(() => seen.some((s) => s.code === UNC) || seen.some((s) => s.code === 0 && s.value === 2 * x), 3000).catch(() => {});
  }
  const u = seen.find((s) => s.code === UNC);
  assert.ok(u, `no UncertainLastUsableValue: ${JSON.stringify(seen)}`);
  assert.equal(typeof u.value, 'number', 'the last usable value');
  await until(() => seen.length && seen[seen.length - 1].code === 0 && seen[seen.length - 1].value === 2 * x, 5000);
  await sub.terminate();
});

test('the high alarm goes active and can be acknowledged', { skip }, async () => {
  const cond = `ns=${ns};s=Alarm.Tank1.HighLevel`;
  const child = async (path) => {
    const r = await ua.session.translateBrowsePath({
      startingNode: coerceNodeId(cond),
      relativePath: { elements: path.map((p) => ({ referenceTypeId: coerceNodeId('i=33'), isInverse: false, includeSubtypes: true, targetName: { namespaceIndex: 0, name: p } })) },
    });
    assert.equal(r.statusCode.value, 0, `browse ${path.join('/')}: ${r.statusCode.toString()}`);
    return r.targets[0].targetId;
  };
  const activeId = await child(['ActiveState', 'Id']);
  const ackedId = await child(['AckedState', 'Id']);
  const eventIdNode = await child(['EventId']);
  await write(ua.session, ns, 'Tank1.LevelRaw', 4000); // 97.68 % > 90 % for 5 s
  await until(async () => (await ua.session.read({ nodeId: activeId, attributeId: AttributeIds.Value })).value.value === true, 12000, 200);
  assert.equal((await read(ua.session, ns, 'Tank1.HighAlarm')).value.value, true);
  assert.equal((await ua.session.read({ nodeId: ackedId, attributeId: AttributeIds.Value })).value.value, false);
  const eventId = (await ua.session.read({ nodeId: eventIdNode, attributeId: AttributeIds.Value })).value.value;
  const res = await ua.session.call({
    objectId: coerceNodeId(cond),
    methodId: coerceNodeId('i=9111'), // AcknowledgeableConditionType.Acknowledge
    inputArguments: [new Variant({ dataType: DataType.ByteString, value: eventId }), new Variant({ dataType: DataType.LocalizedText, value: new LocalizedText({ text: 'seen' }) })],
  });
  assert.equal(res.statusCode.value, 0, `Acknowledge: ${res.statusCode.toString()}`);
  await until(async () => (await ua.session.read({ nodeId: ackedId, attributeId: AttributeIds.Value })).value.value === true, 2000);
  await write(ua.session, ns, 'Tank1.LevelRaw', 1000); // below 85 %: inactive
  await until(async () => (await ua.session.read({ nodeId: activeId, attributeId: AttributeIds.Value })).value.value === false, 5000, 100);
});

test('Diagnostics folder: counters and health', { skip }, async () => {
  await until(async () => (await read(ua.session, ns, 'Diagnostics.Tank1.Level.Evaluations')).value.value > 0, 3000, 100);
  assert.equal((await read(ua.session, ns, 'Diagnostics.outrund.Connected')).value.value, true);
  const le = await until(async () => {
    const v = (await read(ua.session, ns, 'Diagnostics.Test.Error.LastError')).value.value;
    return v ? v : null;
  }, 3000, 100);
  assert.match(le, /boom/);
  // The counters `outrun tags list` shows: a failing tag counts its failures, a tag its changes.
  await until(async () => (await read(ua.session, ns, 'Diagnostics.Test.Error.Failed')).value.value > 0, 3000, 100);
  await until(async () => (await read(ua.session, ns, 'Diagnostics.Tank1.Level.Changes')).value.value > 0, 3000, 100);
  assert.equal((await read(ua.session, ns, 'Diagnostics.Tank1.Level.Failed')).value.value, 0);
  assert.equal((await read(ua.session, ns, 'Diagnostics.Tank1.Level.StateStore')).value.value, '');
});

// End-to-end: what OPC UA clients see when the server's outrund goes away and comes back
// (README "OPC UA server", issue: honest statuses). A node-opcua client subscribes to a virtual
// tag; outrund is killed with SIGKILL (the server's own one, then an external one).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ClientSubscription, ClientMonitoredItem, TimestampsToReturn, AttributeIds, StatusCodes } from 'node-opcua';
import { OUTRUND, FIXTURES, combinedTags, daemonSupportsTags, startServerProcess, opcuaSession, read, write, until } from './helpers.mjs';

const support = await daemonSupportsTags();
const skip = support === true ? false : `outrund does not support the tags frames yet (${support})`;

const UNC = StatusCodes.UncertainNoCommunicationLastUsableValue.value;
const BADNC = StatusCodes.BadNoCommunication.value;
const code = (dv) => dv.statusCode.value >>> 0;
const SERVER_STATE = 'i=2259'; // Server.ServerStatus.State

async function monitor(session, ns, id, onValue) {
  const sub = ClientSubscription.create(session, { requestedPublishingInterval: 10, requestedLifetimeCount: 1000, requestedMaxKeepAliveCount: 20, maxNotificationsPerPublish: 1000, publishingEnabled: true, priority: 1 });
  await new Promise((r) => sub.once('started', r));
  const item = ClientMonitoredItem.create(sub, { nodeId: `ns=${ns};s=${id}`, attributeId: AttributeIds.Value }, { samplingInterval: 0, discardOldest: false, queueSize: 1000 }, TimestampsToReturn.Both);
  item.on('changed', (dv) => onValue(dv, Date.now()));
  await new Promise((r) => item.once('initialized', r));
  return sub;
}

function pidFromLog(srv, after) {
  const re = /outrund restarted \(pid (\d+)/g;
  let m, pid = null;
  while ((m = re.exec(srv.stderr))) if (m.index >= after) pid = Number(m[1]);
  return pid;
}

let tags;
before(() => {
  if (!skip) tags = combinedTags();
});
after(() => tags && tags.cleanup());

test('own outrund killed: UncertainNoCommunication at once, restarted, sources re-sent, Good again, no duplicates', { skip }, async () => {
  const srv = await startServerProcess({ tags: tags.file, args: ['--no-communication-ms', '1500'] });
  const ua = await opcuaSession(srv.endpoint);
  try {
    const ns = srv.ns;
    assert.equal((await write(ua.session, ns, 'Tank1.LevelRaw', 2047.5)).value, 0);
    await until(async () => (await read(ua.session, ns, 'Tank1.Level')).value.value === 50);
    const seen = [];
    const sub = await monitor(ua.session, ns, 'Tank1.Level', (dv, at) => seen.push({ code: code(dv), value: dv.value.value, st: dv.sourceTimestamp?.getTime(), at }));
    await until(() => seen.length >= 1);
    const goodSt = seen[seen.length - 1].st;
    const figures = [];
    let pid = srv.pid;
    // OUTRUN_LOSS_ROUNDS=10 for the figures of design/budgets.md (medians printed).
    const rounds = Number(process.env.OUTRUN_LOSS_ROUNDS ?? 2);
    for (let round = 0; round < rounds; round++) {
      const mark = srv.stderr.length;
      const n0 = seen.length;
      const killedAt = Date.now();
      process.kill(pid, 'SIGKILL');
      const unc = await until(() => seen.slice(n0).find((s) => s.code === UNC), 3000);
      assert.equal(unc.value, 50, 'the last value');
      assert.equal(unc.st, goodSt, 'its source timestamp kept');
      // ServerStatus says it too: CommunicationFault (6) while outrund is away, Running (0) after.
      assert.equal((await ua.session.read({ nodeId: SERVER_STATE, attributeId: AttributeIds.Value })).value.value, 6);
      // A write while outrund is away fails fast with a Bad status, and changes nothing.
      const w0 = Date.now();
      const wr = await write(ua.session, ns, 'Tank1.LevelRaw', 1000);
      const writeMs = Date.now() - w0;
      assert.ok(wr.value >>> 30 >= 2 || (await until(() => seen.some((s) => s.code === 0), 5000)), `write status ${wr.toString()}`);
      // Back (restarted with backoff): the source value held is sent again, Good again, 50 again.
      const good = await until(() => seen.slice(n0).find((s) => s.code === 0 && s.value === 50), 15000);
      figures.push({ toUncertainMs: unc.at - killedAt, toGoodMs: good.at - killedAt, writeMs });
      assert.equal((await ua.session.read({ nodeId: SERVER_STATE, attributeId: AttributeIds.Value })).value.value, 0);
      pid = await until(() => pidFromLog(srv, mark), 5000);
      assert.notEqual(pid, srv.pid);
      // No duplicate notifications for the unchanged value.
      await new Promise((r) => setTimeout(r, 700));
      const after = seen.slice(seen.indexOf(good) + 1);
      assert.equal(after.length, 0, `no duplicates: ${JSON.stringify(after)}`);
    }
    const median = (k) => figures.map((f) => f[k]).sort((a, b) => a - b)[Math.floor(figures.length / 2)];
    console.log(`# outrund loss figures (${rounds} rounds): median kill -9 -> UncertainNoCommunication ${median('toUncertainMs')} ms, -> Good again ${median('toGoodMs')} ms, refused write ${median('writeMs')} ms; all ${JSON.stringify(figures)}`);
    // Diagnostics say it: connected, and how many times it came back; read-only to clients.
    const rec = await read(ua.session, ns, 'Diagnostics.outrund.Reconnects');
    assert.ok(rec.value.value >= 2, `reconnects ${rec.value.value}`);
    assert.equal((await read(ua.session, ns, 'Diagnostics.outrund.Connected')).value.value, true);
    const wd = await ua.session.write({ nodeId: `ns=${ns};s=Diagnostics.outrund.Reconnects`, attributeId: AttributeIds.Value, value: { value: { dataType: 'UInt32', value: 0 } } });
    assert.equal(wd.value, StatusCodes.BadNotWritable.value);
    await sub.terminate();
    // outrund's own log lines reach the server's log.
    assert.match(srv.stderr, /outrund\[\d+\]: .*listening|outrund\[\d+\]: /);
  } finally {
    await ua.close();
    assert.equal(await srv.stop(), 0);
  }
});

test('external outrund restarted on its socket: reconnected, tags defined again, sources re-sent, Good again; BadNoCommunication after the age', { skip }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'outrun-ext-'));
  const socket = join(dir, 'outrund.sock');
  const startDaemon = async () => {
    const child = spawn(OUTRUND, ['--socket', socket, '--config', join(FIXTURES, 'outrund.toml')], { stdio: 'ignore' });
    await until(() => existsSync(socket), 10000);
    return child;
  };
  let daemon = await startDaemon();
  const srv = await startServerProcess({ tags: tags.file, config: null, args: ['--socket', socket, '--no-communication-ms', '800'] });
  const ua = await opcuaSession(srv.endpoint);
  try {
    const ns = srv.ns;
    assert.equal((await write(ua.session, ns, 'Tank1.LevelRaw', 2047.5)).value, 0);
    await until(async () => (await read(ua.session, ns, 'Tank1.Level')).value.value === 50);
    const seen = [];
    const sub = await monitor(ua.session, ns, 'Tank1.Level', (dv) => seen.push({ code: code(dv), value: dv.value.value }));
    await until(() => seen.length >= 1);
    daemon.kill('SIGKILL');
    await until(() => seen.find((s) => s.code === UNC), 3000);
    // Away longer than the age: BadNoCommunication with no value.
    const bad = await until(() => seen.find((s) => s.code === BADNC), 5000);
    assert.equal(bad.value, null);
    const wr = await write(ua.session, ns, 'Tank1.LevelRaw', 1000);
    assert.equal(wr.value, StatusCodes.BadNoCommunication.value);
    // A new outrund on the same socket, with no tags: the server defines its file again and
    // re-sends the source it holds (2047.5, not the refused 1000).
    daemon = await startDaemon();
    await until(() => seen.find((s) => s.code === 0 && s.value === 50), 15000);
    await sub.terminate();
  } finally {
    await ua.close();
    assert.equal(await srv.stop(), 0);
    daemon.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

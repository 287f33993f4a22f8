#!/usr/bin/env node
// OPC UA server benchmark (design/budgets.md "OPC UA server"): the tank's tags as plain
// JavaScript in the server's own process vs. through outrun, in the same run.
//   node bench/opcua-bench.mjs [--seconds 2] [--rates 1000,10000]
// Latency: source write (the server's write path, driven in-process) -> the virtual tag's
// setDataValue in the server ("set"), and -> the notification at a node-opcua client
// subscription in this process ("notify", publishing interval as revised by the server).
// CPU: process.cpuUsage() of this process (server + driver + client), /proc of outrund and its
// children (workers), per source change. Runaway drill: a tag that never returns.
import { spawn } from 'node:child_process';
import { readFileSync, readdirSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import {
  OPCUAServer,
  OPCUAClient,
  DataType,
  DataValue,
  Variant,
  StatusCodes,
  AttributeIds,
  ClientSubscription,
  ClientMonitoredItem,
  TimestampsToReturn,
  Subscription,
  MessageSecurityMode,
  SecurityPolicy,
} from 'node-opcua';
import { startServer, setDataValue, ROOT } from '../lib.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const { values: args } = parseArgs({
  options: {
    seconds: { type: 'string', default: '2' },
    rates: { type: 'string', default: '1000,10000' },
    'js-server': { type: 'string' },
    'js-only': { type: 'boolean', default: false }, // debugging the harness without outrund // child mode: the in-process JS server on this port
  },
});
const SECONDS = Number(args.seconds);
Subscription.minimumPublishingInterval = 10; // node-opcua's floor is 50 ms; the benchmark asks for 10
const RATES = args.rates.split(',').map(Number);
const CLK = 100; // USER_HZ
const nsOf = (s) => s.nsIndex;

// ---- the tank as plain JavaScript (examples/tags/tank.toml, same arithmetic) ----
function jsTank() {
  const st = { rate: {}, avg: [], alarm: { active: false, since: null } };
  return {
    'Tank1.Level': { type: DataType.Double, from: 'Tank1.LevelRaw', f: (raw) => Math.round((raw / 4095) * 100 * 100) / 100 },
    'Tank1.Volume': { type: DataType.Double, from: 'Tank1.Level', f: (l) => (l / 100) * 12 },
    'Tank1.LevelRate': {
      type: DataType.Double,
      from: 'Tank1.Level',
      f: (l, t) => {
        const r = st.rate;
        if (r.t === undefined || t <= r.t) {
          r.t = t;
          r.v = l;
          return 0;
        }
        const v = ((l - r.v) / (t - r.t)) * 60;
        r.t = t;
        r.v = l;
        return Math.round(v * 1000) / 1000;
      },
    },
    'Tank1.LevelAvg': {
      type: DataType.Double,
      from: 'Tank1.Level',
      f: (l) => {
        st.avg.push(l);
        if (st.avg.length > 5) st.avg.shift();
        return Math.round((st.avg.reduce((a, b) => a + b, 0) / st.avg.length) * 100) / 100;
      },
    },
    'Tank1.TempF': { type: DataType.Float, from: 'Tank1.TempC', f: (c) => (c * 9) / 5 + 32 },
    'Test.Runaway': {
      type: DataType.Double,
      from: 'Test.InRunaway',
      f: (x) => {
        if (x > 0) while (true) {} // eslint-disable-line no-constant-condition
        return x;
      },
    },
  };
}

async function startJsServer(port) {
  const server = new OPCUAServer({ port, resourcePath: '/UA/js', serverCapabilities: { minSupportedSampleRate: 0 } });
  await server.initialize();
  const ns = server.engine.addressSpace.registerNamespace('urn:outrun:tags');
  const folder = ns.addFolder(server.engine.addressSpace.rootFolder.objects, { browseName: 'Tags', nodeId: 's=Tags' });
  const defs = jsTank();
  const vars = new Map();
  for (const [id, d] of Object.entries(defs)) {
    const v = ns.addVariable({ componentOf: folder, browseName: id, nodeId: `s=${id}`, dataType: DataType[d.type], minimumSamplingInterval: 0 });
    setDataValue(v, new DataValue({ value: new Variant({ dataType: DataType.Null }), statusCode: StatusCodes.BadWaitingForInitialData }));
    vars.set(id, v);
  }
  const state = { server, nsIndex: ns.index, onChange: null, endpoint: `opc.tcp://localhost:${port}/UA/js` };
  const propagate = (src, value, t) => {
    const changes = [];
    for (const [id, d] of Object.entries(defs)) {
      if (d.from !== src) continue;
      const out = d.f(value, t.getTime() / 1000);
      setDataValue(vars.get(id), new DataValue({ value: new Variant({ dataType: d.type, value: out }), sourceTimestamp: t, serverTimestamp: new Date() }));
      changes.push({ tag: id, value: out });
      for (const c of propagate(id, out, t)) changes.push(c);
    }
    return changes;
  };
  state.writeSource = async (id, value, _status = 0, t = new Date()) => {
    const v = typeof value === 'object' && value ? value.value : value;
    const ch = propagate(id, v, t);
    if (state.onChange && ch.length) state.onChange(ch.map((c) => ({ ...c, sourceTime: t })));
  };
  // Source variables, writable, on the same write path.
  for (const src of new Set(Object.values(defs).map((d) => d.from))) {
    if (defs[src]) continue;
    let last = new DataValue({ statusCode: StatusCodes.BadWaitingForInitialData });
    ns.addVariable({
      componentOf: folder,
      browseName: src,
      nodeId: `s=${src}`,
      dataType: 'Double',
      accessLevel: 'CurrentRead | CurrentWrite',
      userAccessLevel: 'CurrentRead | CurrentWrite',
      minimumSamplingInterval: 10,
      value: {
        timestamped_get: () => last,
        timestamped_set: (dv, cb) => {
          last = dv;
          state.writeSource(src, dv.value.value, 0, dv.sourceTimestamp ?? new Date()).then(() => cb(null, StatusCodes.Good));
        },
      },
    });
  }
  await server.start();
  state.stop = () => server.shutdown(0);
  return state;
}

// ---- measurement helpers ----
const pct = (a, p) => {
  if (!a.length) return NaN;
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
function procTicks(pid) {
  try {
    const f = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const r = f.slice(f.lastIndexOf(')') + 2).split(' ');
    return Number(r[11]) + Number(r[12]); // utime + stime
  } catch {
    return 0;
  }
}
function treeTicks(root) {
  if (!root) return 0;
  let total = procTicks(root);
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const f = readFileSync(`/proc/${d}/stat`, 'utf8');
      const r = f.slice(f.lastIndexOf(')') + 2).split(' ');
      if (Number(r[1]) === root) total += procTicks(Number(d));
    } catch {}
  }
  return total;
}

async function uaSession(endpoint) {
  const client = OPCUAClient.create({ endpointMustExist: false, securityMode: MessageSecurityMode.None, securityPolicy: SecurityPolicy.None, connectionStrategy: { maxRetry: 1 } });
  await client.connect(endpoint);
  const session = await client.createSession();
  return { client, session, close: async () => { await session.close().catch(() => {}); await client.disconnect().catch(() => {}); } };
}

// One load run: `rate` TempC changes/s for SECONDS; TempC = seq/10 so TempF identifies the change.
async function loadRun(state, ua, rate, daemonPid) {
  const sent = new Map(); // seq -> hrtime ms
  const setLat = [];
  const notifyLat = [];
  const seqOf = (f) => Math.round(((f - 32) * 5) / 9 * 10);
  state.onChange = (changes) => {
    const now = performance.now();
    for (const c of changes) if (c.tag === 'Tank1.TempF') {
      const t = sent.get(seqOf(c.value));
      if (t !== undefined) setLat.push(now - t);
    }
  };
  const sub = ClientSubscription.create(ua.session, { requestedPublishingInterval: 10, requestedLifetimeCount: 30000, requestedMaxKeepAliveCount: 100, maxNotificationsPerPublish: 0, publishingEnabled: true });
  await new Promise((r) => sub.once('started', r));
  const item = ClientMonitoredItem.create(sub, { nodeId: `ns=${nsOf(state)};s=Tank1.TempF`, attributeId: AttributeIds.Value }, { samplingInterval: 0, queueSize: 100000, discardOldest: true }, TimestampsToReturn.Both);
  await new Promise((r) => item.once('initialized', r));
  item.on('changed', (dv) => {
    const now = performance.now();
    const t = sent.get(seqOf(dv.value.value));
    if (t !== undefined) notifyLat.push(now - t);
  });
  // Idle baseline of this process with the subscription running (node-opcua's publish loop,
  // timers): subtracted, so the CPU column is what the changes cost.
  const b0 = process.cpuUsage();
  const d00 = treeTicks(daemonPid);
  const bt0 = performance.now();
  await new Promise((r) => setTimeout(r, 1000));
  const bcpu = process.cpuUsage(b0);
  const idleUsPerMs = (bcpu.user + bcpu.system) / (performance.now() - bt0);
  const idleDaemonTicksPerMs = (treeTicks(daemonPid) - d00) / (performance.now() - bt0);
  const base = (RATES.indexOf(rate) + 1) * 100000; // fresh values, small enough for a Float TempF to name them
  const total = rate * SECONDS;
  const cpu0 = process.cpuUsage();
  const d0 = treeTicks(daemonPid);
  const t0 = performance.now();
  let seq = 0;
  await new Promise((resolve) => {
    const tick = () => {
      const due = Math.min(total, Math.floor(((performance.now() - t0) / 1000) * rate));
      while (seq < due) {
        const s = base + seq++;
        sent.set(s, performance.now());
        state.writeSource('Tank1.TempC', s / 10, 0, new Date()).catch(() => {});
      }
      if (seq >= total) resolve();
      else setTimeout(tick, 1); // not setImmediate: a spinning driver would count as server CPU
    };
    tick();
  });
  await new Promise((r) => setTimeout(r, 500)); // let the tail arrive
  const wall = performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  const dTicks = treeTicks(daemonPid) - d0 - idleDaemonTicksPerMs * wall;
  await sub.terminate();
  state.onChange = null;
  return {
    rate,
    sent: total,
    set: setLat.length,
    setP50: pct(setLat, 50),
    setP99: pct(setLat, 99),
    notified: notifyLat.length,
    notifyP50: pct(notifyLat, 50),
    notifyP99: pct(notifyLat, 99),
    publishingInterval: sub.publishingInterval,
    serverCpuUsPerChange: (cpu.user + cpu.system - idleUsPerMs * wall) / total,
    idleCpuPct: idleUsPerMs / 10,
    daemonCpuUsPerChange: daemonPid ? (dTicks * (1e6 / CLK)) / total : 0,
  };
}

async function readLatencies(ua, ns, ms, timeoutMs = 2000) {
  const lat = [];
  let timeouts = 0;
  const end = performance.now() + ms;
  while (performance.now() < end) {
    const t = performance.now();
    const r = await Promise.race([ua.session.read({ nodeId: `ns=${ns};s=Tank1.Level`, attributeId: AttributeIds.Value }).then(() => true), new Promise((res) => setTimeout(() => res(false), timeoutMs))]);
    if (r) lat.push(performance.now() - t);
    else {
      timeouts++;
      break;
    }
    await new Promise((r2) => setTimeout(r2, 5));
  }
  return { p99: pct(lat, 99), p50: pct(lat, 50), n: lat.length, timeouts };
}

// ---- child mode: the JS server alone (so its freeze does not freeze the measuring client) ----
if (args['js-server']) {
  const st = await startJsServer(Number(args['js-server']));
  process.stdout.write(`ready ${st.endpoint} ${st.nsIndex}\n`);
  await new Promise(() => {});
}

// ---- main ----
const RUNAWAY_TOML = `
[[tag]]
id = "Test.Runaway"
inputs = [{ tag = "Test.InRunaway", name = "x" }]
script = '''
if inputs.x > 0 then while true do end end
return inputs.x
'''
`;
const dir = mkdtempSync(join(tmpdir(), 'outrun-opcua-bench-'));
const tagsFile = join(dir, 'tags.toml');
writeFileSync(tagsFile, readFileSync(join(ROOT, 'examples/tags/tank.toml'), 'utf8') + RUNAWAY_TOML);
const cfg = join(dir, 'outrund.toml');
writeFileSync(cfg, '[host]\nshards = 2\n[daemon]\nlog_level = "warn"\n');

const rows = [];
const js = await startJsServer(48611);
const jsUa = await uaSession(js.endpoint);
const JS_ONLY = args['js-only'];
const out = JS_ONLY ? null : await startServer({ port: 48612, tags: tagsFile, config: cfg, log: () => {} });
const outUa = JS_ONLY ? null : await uaSession(out.endpoint);
for (const rate of RATES) {
  rows.push({ impl: 'in-process JS', ...(await loadRun(js, jsUa, rate, 0)) });
  if (!JS_ONLY) rows.push({ impl: 'outrun', ...(await loadRun(out, outUa, rate, out.daemon.pid)) });
}
await jsUa.close();
await js.stop();
let idle = {}, during = {}, tempUpdates = 0, ra = null;
if (!JS_ONLY) {

// Runaway drill, outrun: Test.Runaway loops (T+G, killed, again on every trigger) while reads go on.
idle = await readLatencies(outUa, out.nsIndex, 2000);
let keep = true;
out.onChange = (ch) => (tempUpdates += ch.filter((c) => c.tag === 'Tank1.TempF').length);
const runaway = (async () => {
  let i = 1;
  while (keep) {
    await out.writeSource('Test.InRunaway', i++).catch(() => {});
    await out.writeSource('Tank1.TempC', 20 + (i % 50) / 10).catch(() => {});
    await new Promise((r) => setTimeout(r, 20));
  }
})();
await new Promise((r) => setTimeout(r, 100));
during = await readLatencies(outUa, out.nsIndex, 2000);
keep = false;
await runaway;
const listed = await out.client.listTags();
ra = listed.tags.find((t) => t.id === 'Test.Runaway');
await outUa.close();
await out.stop();
}

// Runaway drill, in-process JS: the server in a child process; one write freezes it.
const child = spawn(process.execPath, [fileURLToPath(import.meta.url), '--js-server', '48613'], { stdio: ['ignore', 'pipe', 'ignore'] });
const [endpoint, nsIdx] = await new Promise((res) => {
  let buf = '';
  child.stdout.on('data', (d) => {
    buf += d;
    const m = /ready (\S+) (\d+)/.exec(buf);
    if (m) res([m[1], Number(m[2])]);
  });
});
const jua = await uaSession(endpoint);
const jsIdle = await readLatencies(jua, nsIdx, 1000);
jua.session.write({ nodeId: `ns=${nsIdx};s=Test.InRunaway`, attributeId: AttributeIds.Value, value: { value: { dataType: DataType.Double, value: 1 } } }).catch(() => {});
await new Promise((r) => setTimeout(r, 200));
const jsDuring = await readLatencies(jua, nsIdx, 2500, 2000);
child.kill('SIGKILL');
jua.client.disconnect().catch(() => {});
rmSync(dir, { recursive: true, force: true });

const f = (x, d = 2) => (Number.isFinite(x) ? x.toFixed(d) : '-');
console.log('\nSource write -> virtual tag (Tank1.TempC -> Tank1.TempF), latency in ms, CPU in µs per source change');
console.log('| impl | changes/s | set p50 | set p99 | notify p50 | notify p99 | notified/sent | server CPU µs/chg | outrund+workers CPU µs/chg |');
console.log('|---|---|---|---|---|---|---|---|---|');
for (const r of rows)
  console.log(`| ${r.impl} | ${r.rate} | ${f(r.setP50, 3)} | ${f(r.setP99, 3)} | ${f(r.notifyP50)} | ${f(r.notifyP99)} | ${r.notified}/${r.sent} (set ${r.set}) | ${f(r.serverCpuUsPerChange, 1)} | ${r.impl === 'outrun' ? f(r.daemonCpuUsPerChange, 1) : '-'} |`);
console.log(`(revised publishing interval: ${rows.map((r) => r.publishingInterval).join('/')} ms; idle baseline of this process subtracted: ${rows.map((r) => f(r.idleCpuPct, 0) + '%').join('/')} of a core)`);
console.log('\nRunaway drill (Test.Runaway: while true do end / while(true){}), OPC UA Read of Tank1.Level');
console.log('| impl | read p50 idle | read p99 idle | read p50 runaway | read p99 runaway | reads timed out (2 s) | other tags during |');
console.log('|---|---|---|---|---|---|---|');
console.log(`| outrun | ${f(idle.p50)} | ${f(idle.p99)} | ${f(during.p50)} | ${f(during.p99)} | ${during.timeouts} of ${during.n + during.timeouts} | ${tempUpdates} TempF updates in 2 s; Test.Runaway ${ra?.value?.status ?? ''} (${JSON.stringify(ra?.counters?.by_status ?? {})}) |`);
console.log(`| in-process JS | ${f(jsIdle.p50)} | ${f(jsIdle.p99)} | ${f(jsDuring.p50)} | ${f(jsDuring.p99)} | ${jsDuring.timeouts} of ${jsDuring.n + jsDuring.timeouts} | server frozen (killed) |`);
process.exit(0);

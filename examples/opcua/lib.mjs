// The outrun OPC UA server: node-opcua in front, virtual tags computed by outrund (README.md,
// "OPC UA server"). startServer() is used by server.mjs (the CLI), the tests and the benchmark.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, readFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  OPCUAServer,
  DataType,
  DataValue,
  Variant,
  VariantArrayType,
  StatusCode,
  StatusCodes,
  coerceNodeId,
  ModelChangeStructureDataType,
  ServerState,
} from 'node-opcua';
import outrun from '@outrun/client';
import { syncAlarms, alarmQuality } from './alarms.mjs';
import { EASY } from './security-config.mjs';
import { serverSecurityOptions, sourceWriteGate } from './security.mjs';
import { serverLimitOptions, installLimits, limitConnections, hardenInspect } from './limits.mjs';

const here = dirname(fileURLToPath(import.meta.url));
export const ROOT = resolve(here, '../..');
export const NAMESPACE_URI = 'urn:outrun:tags';
const BadWaitingForInitialData = 0x80320000;
const UncertainNoCommunicationLastUsableValue = 0x408f0000;
const BadNoCommunication = 0x80310000;

// ---- outrund ----

/**
 * Starts an outrund of our own; resolves once its socket answers. `dir`: the folder of its
 * socket (a restart reuses it, so that clients reconnect to the same path; then the caller
 * removes it); `log(line)`: where outrund's own log lines go (default: stderr, prefixed).
 */
export async function startOutrund({ outrund, tags, config, extraArgs = [], dir: given, log } = {}) {
  const dir = given ?? mkdtempSync(join(tmpdir(), 'outrun-opcua-'));
  const socket = join(dir, 'outrund.sock');
  const logLine = log ?? ((l) => process.stderr.write(`${l}\n`));
  const bin = outrund || process.env.OUTRUN_OUTRUND || join(ROOT, 'build/bin/outrund');
  const args = ['--socket', socket];
  if (config) args.push('--config', config);
  if (tags) args.push('--tags', tags);
  args.push(...extraArgs);
  const child = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  let partial = '';
  child.stderr.on('data', (d) => {
    stderr += d;
    if (stderr.length > 65536) stderr = stderr.slice(-32768);
    // outrund's own log (reload results, kills, errors) reaches the server's log, line by line.
    partial += d;
    let nl;
    while ((nl = partial.indexOf('\n')) >= 0) {
      const line = partial.slice(0, nl);
      partial = partial.slice(nl + 1);
      if (line) logLine(`outrund[${child.pid}]: ${line}`);
    }
    if (partial.length > 65536) partial = '';
  });
  let exited = null;
  // Whatever way this process ends, its outrund goes with it.
  const reap = () => {
    if (!exited) child.kill('SIGKILL');
  };
  process.once('exit', reap);
  child.on('exit', (code, sig) => {
    exited = { code, sig };
    process.removeListener('exit', reap);
  });
  const deadline = Date.now() + 15000;
  for (;;) {
    if (exited) throw new Error(`outrund exited (${exited.code ?? exited.sig}) at start: ${stderr.trim()}`);
    if (existsSync(socket)) {
      try {
        const c = await outrun.connect(socket, { reconnect: false });
        await c.close();
        break;
      } catch {}
    }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`outrund did not answer at ${socket}: ${stderr.trim()}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    socket,
    pid: child.pid,
    child,
    get stderr() {
      return stderr;
    },
    async stop() {
      if (!exited) {
        child.kill('SIGTERM');
        const t = setTimeout(() => child.kill('SIGKILL'), 5000);
        await new Promise((r) => (exited ? r() : child.once('exit', r)));
        clearTimeout(t);
      }
      if (!given) rmSync(dir, { recursive: true, force: true });
    },
  };
}

// ---- types ----

const SCALARS = {
  Boolean: DataType.Boolean,
  SByte: DataType.SByte,
  Byte: DataType.Byte,
  Int16: DataType.Int16,
  UInt16: DataType.UInt16,
  Int32: DataType.Int32,
  UInt32: DataType.UInt32,
  Int64: DataType.Int64,
  UInt64: DataType.UInt64,
  Float: DataType.Float,
  Double: DataType.Double,
  String: DataType.String,
  DateTime: DataType.DateTime,
  ByteString: DataType.ByteString,
  Variant: DataType.Variant,
};

/** "Double" / "Int32[]" -> {dataType, array, name}. */
export function parseType(t) {
  const name = typeof t === 'string' && t ? t : 'Double';
  const array = name.endsWith('[]');
  const base = array ? name.slice(0, -2) : name;
  const dataType = SCALARS[base];
  if (dataType === undefined) throw new Error(`unknown tag type ${name}`);
  return { dataType, array, name, base };
}

function to64(v) {
  // node-opcua's Int64/UInt64: [high, low] uint32 words.
  let b = typeof v === 'bigint' ? v : BigInt(Math.trunc(Number(v)));
  if (b < 0n) b = (1n << 64n) + b;
  return [Number((b >> 32n) & 0xffffffffn), Number(b & 0xffffffffn)];
}

function scalarToOpcua(base, v) {
  if (v === null || v === undefined) return null;
  switch (base) {
    case 'Int64':
    case 'UInt64':
      return to64(v);
    case 'DateTime':
      return v instanceof Date ? v : new Date(Number(v) * 1000);
    case 'ByteString':
      return Buffer.isBuffer(v) ? v : Buffer.from(String(v));
    case 'Boolean':
      return Boolean(v);
    case 'String':
      return String(v);
    case 'Variant':
      return v;
    default:
      return typeof v === 'bigint' ? Number(v) : v;
  }
}

/** A TagChange (outrun client) -> node-opcua DataValue for a variable of type `ty`. */
export function toDataValue(ty, ch) {
  const bad = ch.status >>> 30 >= 2;
  let variant;
  if (ch.value === null || ch.value === undefined || bad) {
    variant = new Variant({ dataType: DataType.Null });
  } else if (ty.array) {
    const arr = Array.isArray(ch.value) ? ch.value.map((x) => scalarToOpcua(ty.base, x)) : [];
    variant = new Variant({ dataType: ty.dataType, arrayType: VariantArrayType.Array, value: arr });
  } else if (ty.base === 'Variant') {
    variant = new Variant({ dataType: jsDataType(ch.value), value: ch.value instanceof Date || typeof ch.value !== 'bigint' ? ch.value : Number(ch.value) });
  } else {
    variant = new Variant({ dataType: ty.dataType, value: scalarToOpcua(ty.base, ch.value) });
  }
  return new DataValue({
    value: variant,
    statusCode: codeOf(ch.status),
    sourceTimestamp: ch.sourceTime ?? null,
    serverTimestamp: ch.serverTime ?? new Date(),
  });
}

function jsDataType(v) {
  if (typeof v === 'boolean') return DataType.Boolean;
  if (typeof v === 'number' || typeof v === 'bigint') return DataType.Double;
  if (typeof v === 'string') return DataType.String;
  if (v instanceof Date) return DataType.DateTime;
  if (Buffer.isBuffer(v)) return DataType.ByteString;
  return DataType.String;
}

const codeCache = new Map();
/** A uint32 -> node-opcua StatusCode (a known constant where there is one). */
export function codeOf(n) {
  n >>>= 0;
  let c = codeCache.get(n);
  if (!c) {
    for (const k of Object.keys(StatusCodes)) {
      const sc = StatusCodes[k];
      if (sc && typeof sc.value === 'number' && sc.value >>> 0 === n) {
        c = sc;
        break;
      }
    }
    if (!c) c = StatusCode.makeStatusCode ? StatusCode.makeStatusCode(n) : new StatusCode(n);
    codeCache.set(n, c);
  }
  return c;
}

/** OPC UA Variant value of a source write -> the JS value sent to outrun (a Double or Float
 * source's numbers as outrun doubles, whole ones included). */
function fromVariant(variant) {
  if (!variant) return null;
  if (variant.arrayType === VariantArrayType.Array && (variant.dataType === DataType.Double || variant.dataType === DataType.Float)) return Array.from(variant.value ?? [], (x) => outrun.double(x));
  let v = variant.value;
  if (variant.dataType === DataType.Int64 || variant.dataType === DataType.UInt64) {
    if (Array.isArray(v) && v.length === 2 && typeof v[0] === 'number') {
      const b = (BigInt(v[0]) << 32n) | BigInt(v[1]);
      return variant.dataType === DataType.Int64 && b >= 1n << 63n ? b - (1n << 64n) : b;
    }
  }
  if (v && typeof v === 'object' && ArrayBuffer.isView(v) && !Buffer.isBuffer(v)) v = Array.from(v); // Float64Array etc.
  if (variant.dataType === DataType.Double || variant.dataType === DataType.Float) {
    if (typeof v === 'number') return outrun.double(v);
  }
  return v ?? null;
}

function inputTags(def) {
  const out = [];
  for (const i of def.inputs ?? []) {
    if (typeof i === 'string') out.push(i);
    else if (i && typeof i.tag === 'string') out.push(i.tag);
  }
  return out;
}

// ---- the server ----

/**
 * Starts the OPC UA server. Options: port, host (the address listened on; default 127.0.0.1),
 * security (security-config.mjs's loadSecurityFile result; default EASY), socket (an outrund to use;
 * without it one of our own is started with `tags`), tags (tags file; default
 * examples/tags/tank.toml), config (outrund config for our own outrund), simulate, outrund
 * (binary), resourcePath.
 */
export async function startServer(opts = {}) {
  const port = opts.port ?? 4840;
  const tagsFile = resolve(opts.tags ?? join(ROOT, 'examples/tags/tank.toml'));
  const started = [];
  let daemon = null;
  let daemonDir = null;
  let socket = opts.socket;
  const log = opts.log ?? ((...a) => process.stderr.write(`opcua-server: ${a.join(' ')}\n`));
  // Our own outrund is supervised: restarted with backoff when it exits (sup.stopping: not).
  const sup = { stopping: false, restarts: 0, backoffMs: 100, timer: null, stable: null };
  const ownDaemon = () => startOutrund({ outrund: opts.outrund, tags: tagsFile, config: opts.config, dir: daemonDir, log: (l) => log(l) });
  try {
    if (!socket && !opts.client) {
      daemonDir = mkdtempSync(join(tmpdir(), 'outrun-opcua-'));
      started.push({ stop: async () => rmSync(daemonDir, { recursive: true, force: true }) });
      daemon = await ownDaemon();
      socket = daemon.socket;
    }
    // Reconnects by itself (at most reconnectMaxDelayMs apart); calls made while it is away fail
    // after disconnectedWaitMs -- but source writes are refused at once (below).
    const client = opts.client ?? await outrun.connect(socket, { name: 'outrun-opcua-server', disconnectedWaitMs: 500, reconnectMaxDelayMs: 500 });
    const defineOwnTags = async () => {
      if (opts.socket && opts.tags) await client.defineTags(readFileSync(tagsFile, 'utf8'), { replaceAll: true });
    };
    await defineOwnTags();

    // Security (security.mjs): endpoints, certificates, users; without a file, node-opcua's easy
    // defaults. Limits (limits.mjs) apply either way. Listens on localhost unless told otherwise.
    const security = opts.security ?? EASY;
    const host = opts.host ?? '127.0.0.1';
    const limitOpts = serverLimitOptions(security.limits);
    // The endpoint URLs advertised name the host listened on (a loopback one as localhost; on
    // every interface, node-opcua's choice: the machine's name).
    const loopback = /^(127\.|::1$|localhost$)/.test(host);
    const anyAddress = host === '0.0.0.0' || host === '::';
    const server = new OPCUAServer({
      port,
      host,
      hostname: loopback ? 'localhost' : anyAddress ? undefined : host,
      resourcePath: opts.resourcePath ?? '/UA/outrun',
      buildInfo: { productName: 'outrun OPC UA server', buildNumber: '1', buildDate: new Date() },
      serverInfo: { applicationUri: 'urn:outrun:opcua-server', productUri: 'urn:outrun:opcua-server' },
      maxConnectionsPerEndpoint: limitOpts.maxConnectionsPerEndpoint,
      // minSupportedSampleRate 0: a monitored item with samplingInterval 0 on a virtual tag is
      // exception-based and gets every change outrun pushes (node-opcua otherwise coalesces
      // changes over the advertised rate).
      serverCapabilities: { ...limitOpts.serverCapabilities, minSupportedSampleRate: 0 },
      isAuditing: false,
      ...(await serverSecurityOptions(security, log)),
    });
    installLimits(server, security.limits, log);
    await server.initialize();
    limitConnections(server, security.limits, log);
    const addressSpace = server.engine.addressSpace;
    addressSpace.installAlarmsAndConditionsService();
    const ns = addressSpace.registerNamespace(NAMESPACE_URI);
    const nsIndex = ns.index;
    const objects = addressSpace.rootFolder.objects;
    const tagsFolder = ns.addFolder(objects, { browseName: 'Tags', nodeId: 's=Tags' });
    const diagFolder = ns.addFolder(objects, { browseName: 'Diagnostics', nodeId: 's=Diagnostics' });
    const alarmsFolder = ns.addFolder(objects, { browseName: 'Alarms', nodeId: 's=Alarms' });

    const state = {
      server,
      client,
      daemon,
      ns,
      nsIndex,
      virtual: new Map(), // id -> {variable, type, last}
      sources: new Map(), // id -> {variable, last}
      diag: new Map(),
      alarms: new Map(), // id -> {decl, cond, ...} (alarms.mjs)
      alarmsFolder,
      decls: { sources: new Map() }, // [[source]] declarations by id (ListTags' `sources`)
      subscription: null,
      timers: [],
      changes: 0,
      onChange: null, // hook (benchmark)
      // outrund's health (Diagnostics.outrund): lost = {since, why} while it is unreachable.
      lost: null,
      lostTimer: null,
      connectedSince: new Date(),
      reconnects: 0,
      lastLoss: '',
      noCommunicationMs: opts.noCommunicationMs ?? 10000,
      log,
    };

    const list = await client.listTags();
    const defs = list.tags ?? [];
    setDeclarations(state, list);
    const sourceIds = sourceIdsOf(list);

    // Source tags: typed as declared ([[source]]), else writable Doubles.
    state.sourceWriteHook = opts.sourceWriteHook;
    state.sourceWriteGate = sourceWriteGate(security);
    for (const id of sourceIds) addSource(state, tagsFolder, id, opts.sourceWriteHook);
    for (const d of defs) addVirtual(state, tagsFolder, d);

    addDiagnostics(state, diagFolder);
    hardenInspect([objects, tagsFolder, state.health.connected, addressSpace.findNode('i=2256'), addressSpace.findNode('i=2253')].filter(Boolean));
    // The tags file's [[alarm]]s (alarms.mjs).
    syncAlarms(state, list.alarms);

    // Virtual tags: the current values, then every change. A value equal to the one shown (after
    // a reconnection, the re-read and the subscription can bring the same one) is not set again.
    const apply = (changes) => {
      for (const ch of changes) {
        const v = state.virtual.get(ch.tag);
        if (!v) continue;
        v.last = ch;
        state.changes++;
        if (v.shown && sameChange(v.shown, ch)) continue;
        v.shown = ch;
        alarmQuality(state, ch.tag, codeOf(ch.status));
        setDataValue(v.variable, toDataValue(v.type, ch));
      }
      if (state.onChange) state.onChange(changes);
    };
    state.apply = apply;
    state.tagsFolder = tagsFolder;
    state.subscription = await client.subscribe([], apply);
    await loadSources(state);
    if (state.virtual.size) {
      const cur = await client.readTags([...state.virtual.keys()]);
      apply(cur.filter((c) => c.serverTime !== null || c.status !== BadWaitingForInitialData));
    }

    // outrund lost: every virtual tag says so at once (UncertainNoCommunicationLastUsableValue with
    // its last value, then BadNoCommunication after noCommunicationMs); back: the sources are sent
    // again, the tags re-read, and subscribers see Good values again.
    client.on('disconnected', (why) => onLost(state, String(why?.message ?? why ?? 'disconnected')));
    client.on('connected', () => {
      onRestored(state, defineOwnTags).catch((e) => log(`after reconnecting to outrund: ${e?.message ?? e}`));
    });
    if (daemon) {
      const watch = (d) => {
        d.child.on('exit', (code, sig) => {
          if (sup.stopping) return;
          clearTimeout(sup.stable);
          onLost(state, `outrund (pid ${d.pid}) exited (${code ?? sig})`);
          log(`outrund (pid ${d.pid}) exited (${code ?? sig}); restarting it in ${sup.backoffMs} ms`);
          sup.timer = setTimeout(restart, sup.backoffMs);
          sup.backoffMs = Math.min(sup.backoffMs * 2, 5000);
        });
      };
      const restart = async () => {
        sup.timer = null;
        if (sup.stopping) return;
        try {
          const d = await ownDaemon();
          if (sup.stopping) return void (await d.stop());
          daemon = state.daemon = d;
          sup.restarts++;
          log(`outrund restarted (pid ${d.pid}, restart ${sup.restarts})`);
          watch(d);
          sup.stable = setTimeout(() => (sup.backoffMs = 100), 10000); // up 10 s: backoff reset
        } catch (e) {
          log(`outrund did not restart: ${e?.message ?? e}; again in ${sup.backoffMs} ms`);
          sup.timer = setTimeout(restart, sup.backoffMs);
          sup.backoffMs = Math.min(sup.backoffMs * 2, 5000);
        }
      };
      watch(daemon);
    }
    state.timers.push(setInterval(() => refreshDiagnostics(state).catch(() => {}), 1000));
    if (opts.simulate) startSimulation(state, sourceIds);

    await server.start();
    state.started = true;
    updateHealth(state);
    const endpoint = server.getEndpointUrl ? server.getEndpointUrl() : server.endpoints[0].endpointDescriptions()[0].endpointUrl;
    // The ready line's URL: localhost when it is reachable there, else the address listened on.
    const urlHost = loopback || anyAddress ? 'localhost' : host.includes(':') ? `[${host}]` : host;
    state.endpoint = endpoint.replace(/opc\.tcp:\/\/(\[[^\]]*\]|[^:/]+)/, `opc.tcp://${urlHost}`);
    state.sourceIds = sourceIds;
    state.socket = socket;

    /** The write path of a source (OPC UA writes, simulation, benchmark driver). */
    state.writeSource = (id, value, status = 0, sourceTime = new Date()) => writeSource(state, id, value, status, sourceTime);
    state.stop = async () => {
      sup.stopping = true;
      state.stopping = true;
      clearTimeout(sup.timer);
      clearTimeout(sup.stable);
      clearTimeout(state.lostTimer);
      for (const t of state.timers) clearInterval(t);
      try {
        await server.shutdown(0);
      } catch {}
      try {
        await client.close();
      } catch {}
      if (daemon) await daemon.stop();
      for (const s of started.reverse()) await s.stop();
    };
    return state;
  } catch (e) {
    sup.stopping = true;
    if (daemon) await daemon.stop().catch(() => {});
    for (const s of started.reverse()) await s.stop().catch(() => {});
    throw e;
  }
}

// ---- the address space follows the tags ----

const Verb = { NodeAdded: 1, NodeDeleted: 2, ReferenceAdded: 4, ReferenceDeleted: 8, DataTypeChanged: 16 };

/** The source ids of a ListTags document: every input that is no virtual tag, and every
 * declared [[source]]. */
function sourceIdsOf(list) {
  const defs = list.tags ?? [];
  const virtualIds = new Set(defs.map((d) => d.id));
  const ids = new Set();
  for (const d of defs) for (const t of inputTags(d)) if (!virtualIds.has(t)) ids.add(t);
  for (const d of list.sources ?? []) if (!virtualIds.has(d.id)) ids.add(d.id);
  return [...ids];
}

/**
 * Makes the Tags folder match a ListTags document (its tags, and its sources' declarations), and
 * the alarms its alarms; returns the ids of new or retyped virtual tags, and of new or retyped
 * sources.
 */
export function syncAddressSpace(state, list) {
  const as = state.server.engine.addressSpace;
  const defs = list.tags ?? [];
  const before = state.decls.sources;
  setDeclarations(state, list);
  const wantedSources = new Set(sourceIdsOf(list));
  const changes = [];
  const change = (node, verb) => changes.push(new ModelChangeStructureDataType({ affected: node.nodeId, affectedType: node.typeDefinition ?? null, verb }));
  const remove = (variable) => {
    // Subscribers of a removed node hear it first: BadNodeIdUnknown, no value.
    setDataValue(variable, new DataValue({ value: new Variant({ dataType: DataType.Null }), statusCode: StatusCodes.BadNodeIdUnknown, serverTimestamp: new Date() }));
    change(variable, Verb.NodeDeleted);
    as.deleteNode(variable);
  };
  const retype = [];
  for (const [id, v] of state.virtual) {
    const d = defs.find((x) => x.id === id);
    if (!d) {
      remove(v.variable);
      state.virtual.delete(id);
      const diag = as.findNode(`ns=${state.nsIndex};s=Diagnostics.${id}`);
      if (diag) as.deleteNode(diag);
      state.diag.delete(id);
    } else if ((d.type ?? 'Double') !== v.type.name) {
      retype.push(d);
    }
  }
  const sourcesAdded = [];
  for (const [id, e] of [...state.sources]) // (a copy: a retyped source is added again)
    if (!wantedSources.has(id)) {
      remove(e.variable);
      state.sources.delete(id);
    } else if (JSON.stringify(before.get(id) ?? null) !== JSON.stringify(state.decls.sources.get(id) ?? null)) {
      // Its declaration changed (type, range, writable ...): made again with the new one; the
      // value outrund holds is read again below.
      remove(e.variable);
      state.sources.delete(id);
      addSource(state, state.tagsFolder, id);
      const again = state.sources.get(id);
      again.sent = e.sent;
      change(again.variable, Verb.DataTypeChanged);
      sourcesAdded.push(id);
    }
  const added = [];
  for (const d of retype) {
    const v = state.virtual.get(d.id);
    setDataValue(v.variable, new DataValue({ value: new Variant({ dataType: DataType.Null }), statusCode: StatusCodes.BadNodeIdUnknown, serverTimestamp: new Date() }));
    as.deleteNode(v.variable);
    state.virtual.delete(d.id);
    addVirtual(state, state.tagsFolder, d);
    change(state.virtual.get(d.id).variable, Verb.DataTypeChanged);
    added.push(d.id);
  }
  for (const src of wantedSources)
    if (!state.sources.has(src)) {
      addSource(state, state.tagsFolder, src);
      change(state.sources.get(src).variable, Verb.NodeAdded);
      sourcesAdded.push(src);
    }
  for (const d of defs) {
    if (state.virtual.has(d.id)) continue;
    addVirtual(state, state.tagsFolder, d);
    if (state.mkDiag) addTagDiagnostics(state, d.id);
    change(state.virtual.get(d.id).variable, Verb.NodeAdded);
    added.push(d.id);
  }
  if (changes.length) {
    change(state.tagsFolder, changes.some((c) => c.verb === Verb.NodeDeleted) ? Verb.ReferenceDeleted | Verb.ReferenceAdded : Verb.ReferenceAdded);
    as.modelChangeTransaction(() => {
      for (const c of changes) as._collectModelChange(null, c);
    });
    state.log(`address space: ${changes.length - 1} node(s) added, removed or retyped after a reload`);
  }
  const alarms = syncAlarms(state, list.alarms);
  if (alarms) state.log(`alarms: ${alarms} added or removed after a reload`);
  return { added, sourcesAdded };
}

// ---- outrund lost and back ----

function sameChange(a, b) {
  const t = (d) => (d instanceof Date ? d.getTime() : d ?? null);
  if (a.status !== b.status || t(a.sourceTime) !== t(b.sourceTime)) return false;
  const key = (v) => JSON.stringify(v, (_, x) => (typeof x === 'bigint' ? `${x}n` : x));
  return a.value === b.value || key(a.value) === key(b.value);
}

/** Shows a virtual tag's DataValue while outrund is unreachable (not recorded as outrun's). */
function showLost(v, code, keepValue) {
  const last = v.last;
  const ch = {
    tag: '',
    value: keepValue && last ? last.value : null,
    status: code,
    sourceTime: keepValue && last ? last.sourceTime : null,
    serverTime: new Date(),
    diagnostics: '',
  };
  v.shown = ch;
  setDataValue(v.variable, toDataValue(v.type, ch));
}

/** outrund is unreachable: every virtual tag says so (design: README "OPC UA server"). */
export function onLost(state, why) {
  if (state.lost) return;
  state.lost = { since: new Date(), why };
  state.lastLoss = why;
  state.log(`outrund unreachable (${why}): virtual tags are UncertainNoCommunicationLastUsableValue, then BadNoCommunication after ${state.noCommunicationMs} ms`);
  for (const v of state.virtual.values()) {
    const usable = v.last && v.last.value !== null && v.last.value !== undefined && v.last.status >>> 30 < 2;
    showLost(v, usable ? UncertainNoCommunicationLastUsableValue : BadNoCommunication, usable);
  }
  clearTimeout(state.lostTimer);
  state.lostTimer = setTimeout(() => {
    if (!state.lost) return;
    for (const v of state.virtual.values()) showLost(v, BadNoCommunication, false);
  }, state.noCommunicationMs);
  state.lostTimer.unref?.();
  updateHealth(state);
}

/** outrund answers again: define (external daemon), re-send the sources, re-read the tags. */
async function onRestored(state, defineOwnTags) {
  if (!state.lost) return;
  const lost = state.lost;
  await defineOwnTags();
  const updates = [];
  for (const [id, e] of state.sources) if (e.sent) updates.push({ tag: id, ...e.sent });
  for (let i = 0; i < updates.length; i += 1000) await state.client.updateSources(updates.slice(i, i + 1000));
  await loadSources(state, [...state.sources.keys()].filter((id) => !state.sources.get(id).sent));
  state.lost = null;
  clearTimeout(state.lostTimer);
  state.reconnects++;
  state.connectedSince = new Date();
  state.log(`outrund reachable again after ${Date.now() - lost.since.getTime()} ms: ${updates.length} source values sent again`);
  updateHealth(state);
  // The waves of the re-sent sources push their changes; what is computed already is read here
  // (a tag still waiting for its inputs is left to its push, then read again below).
  const ids = [...state.virtual.keys()];
  const cur = ids.length ? await state.client.readTags(ids) : [];
  state.apply(cur.filter((c) => c.status !== BadWaitingForInitialData));
  setTimeout(async () => {
    if (state.lost || !ids.length) return;
    const again = await state.client.readTags(ids).catch(() => []);
    state.apply(again);
  }, 500).unref?.();
}

/** ListTags' declarations: `sources` by id (alarms go to syncAlarms). */
function setDeclarations(state, list) {
  state.decls.sources = new Map((list.sources ?? []).map((d) => [d.id, d]));
}

/** A source's declared type: {type (parseType), decl} (undeclared: a writable Double). */
function sourceType(state, id) {
  const decl = state.decls.sources.get(id) ?? null;
  let type;
  try {
    type = parseType(decl?.type ?? 'Double');
  } catch {
    type = parseType('Double');
  }
  return { type, decl };
}

const isNumber = (x) => typeof x === 'number' || typeof x === 'bigint';

/**
 * Checks a write against the source's declaration (design/tags.md "Sources and alarms"): the
 * DataType and rank must be the declared ones (BadTypeMismatch), numbers inside eu_range
 * (BadOutOfRange). A write with a Bad status may carry no value (Null).
 */
export function checkSourceWrite(type, decl, variant, status) {
  const bad = status >>> 30 >= 2;
  if (!variant || variant.dataType === DataType.Null) return bad ? StatusCodes.Good : StatusCodes.BadTypeMismatch;
  const isArray = variant.arrayType === VariantArrayType.Array;
  if (variant.arrayType === VariantArrayType.Matrix || isArray !== type.array) return StatusCodes.BadTypeMismatch;
  if (type.base !== 'Variant' && variant.dataType !== type.dataType) return StatusCodes.BadTypeMismatch;
  const range = decl?.eu_range;
  if (range) {
    const values = isArray ? Array.from(variant.value ?? []) : [variant.value];
    for (const x of values) {
      const n = Array.isArray(x) && x.length === 2 ? Number((BigInt(x[0]) << 32n) | BigInt(x[1])) : x; // Int64's [hi, lo]
      if (isNumber(n) && !(Number(n) >= range[0] && Number(n) <= range[1])) return StatusCodes.BadOutOfRange;
    }
  }
  return StatusCodes.Good;
}

function addSource(state, folder, id, hook) {
  const { type, decl } = sourceType(state, id);
  const writable = decl ? decl.writable !== false : true;
  const access = writable ? 'CurrentRead | CurrentWrite' : 'CurrentRead';
  const entry = {
    variable: null,
    type,
    decl,
    last: new DataValue({ value: new Variant({ dataType: DataType.Null }), statusCode: StatusCodes.BadWaitingForInitialData }),
  };
  const options = {
    componentOf: folder,
    browseName: id,
    nodeId: `s=${id}`,
    dataType: type.base === 'Variant' ? 'BaseDataType' : type.base,
    valueRank: type.array ? 1 : -1,
    arrayDimensions: type.array ? [0] : undefined,
    accessLevel: access,
    userAccessLevel: access,
    minimumSamplingInterval: 10,
    description: decl?.description ?? `source tag${decl ? '' : ' (undeclared: a Double)'}`,
    value: {
      timestamped_get: () => entry.last,
      timestamped_set: (dataValue, callback) => {
        const v = dataValue.value;
        const status = dataValue.statusCode ? dataValue.statusCode.value >>> 0 : 0;
        const st = dataValue.sourceTimestamp ?? new Date();
        if (hook ?? state.sourceWriteHook) (hook ?? state.sourceWriteHook)(id);
        // Checked against the declaration first: a refused write changes nothing.
        const checked = checkSourceWrite(entry.type, entry.decl, v, status);
        if (checked !== StatusCodes.Good) return callback(null, checked);
        // outrund unreachable: refused at once, nothing changed (not after a timeout).
        if (state.lost || !state.client.connected) return callback(null, StatusCodes.BadNoCommunication);
        writeSource(state, id, fromVariant(v), status, st).then(
          () => callback(null, StatusCodes.Good),
          (e) => callback(null, e && e.status === 'invalid_argument' ? StatusCodes.BadTypeMismatch : StatusCodes.BadCommunicationError),
        );
      },
    },
  };
  entry.variable = decl?.eu_range && type.base !== 'Variant'
    ? state.ns.addAnalogDataItem({ ...options, engineeringUnitsRange: { low: decl.eu_range[0], high: decl.eu_range[1] } })
    : state.ns.addVariable(options);
  // Who may write (security.mjs `anonymous_write`): node-opcua answers a write this refuses
  // with BadUserAccessDenied, before timestamped_set runs.
  if (writable && state.sourceWriteGate) {
    const variable = entry.variable;
    const userWritable = variable.isUserWritable.bind(variable);
    variable.isUserWritable = (context) => userWritable(context) && state.sourceWriteGate(context?.session ?? null, id);
  }
  state.sources.set(id, entry);
}

async function writeSource(state, id, value, status, sourceTime) {
  const entry = state.sources.get(id);
  const st = sourceTime instanceof Date ? sourceTime : new Date();
  await state.client.updateSources([{ tag: id, value, status, sourceTime: st }], st);
  if (entry) {
    entry.sent = { value, status, sourceTime: st }; // sent again after outrund comes back
    const ch = { value: value instanceof outrun.Double ? value.value : Array.isArray(value) ? value.map((x) => (x instanceof outrun.Double ? x.value : x)) : value, status, sourceTime: st, serverTime: new Date() };
    const ty = entry.decl ? entry.type : parseType(typeof ch.value === 'boolean' ? 'Boolean' : typeof ch.value === 'string' ? 'String' : 'Double');
    entry.last = toDataValue(ty, ch);
    // Reads and monitored items sample timestamped_get; alarms on a source hear value_changed.
    if (state.alarms.size && [...state.alarms.values()].some((a) => a.decl.tag === id)) {
      alarmQuality(state, id, entry.last.statusCode);
      entry.variable.emit('value_changed', entry.last);
    }
  }
}

/**
 * The sources' values as outrund has them (another client may have written them) and, for a
 * declared source it has no value of, the declared initial value written there.
 */
async function loadSources(state, ids = [...state.sources.keys()]) {
  if (!ids.length) return;
  // A declared source that no tag uses is unknown to outrund until it is first written.
  const cur = await state.client.readTags(ids).catch(async () => {
    const one = await Promise.all(ids.map((id) => state.client.readTags([id]).catch(() => [{ tag: id, value: null, status: BadWaitingForInitialData, sourceTime: null, serverTime: null }])));
    return one.flat();
  });
  for (const c of cur) {
    const entry = state.sources.get(c.tag);
    if (!entry) continue;
    if (c.status !== BadWaitingForInitialData || c.serverTime) {
      if (!entry.sent) entry.last = toDataValue(entry.type, c);
      continue;
    }
    const initial = entry.decl?.initial;
    if (initial === undefined) continue;
    const double = entry.type.base === 'Double' || entry.type.base === 'Float';
    const v = entry.type.array ? initial.map((x) => (double ? outrun.double(x) : x)) : double ? outrun.double(initial) : initial;
    await writeSource(state, c.tag, v, 0, new Date());
  }
}

/**
 * Sets a variable's whole DataValue: value, StatusCode, source and server timestamps as outrun
 * computed them. node-opcua's setValueFromSource(variant, statusCode, sourceTimestamp) would make
 * the server timestamp the source's; _internal_set_dataValue keeps both (and notifies monitored
 * items exactly like setValueFromSource does).
 */
export function setDataValue(variable, dv) {
  if (typeof variable._internal_set_dataValue === 'function') variable._internal_set_dataValue(dv, null);
  else variable.setValueFromSource(dv.value, dv.statusCode, dv.sourceTimestamp ?? undefined);
}

function addVirtual(state, folder, def) {
  let type;
  try {
    type = parseType(def.type);
  } catch {
    type = parseType('Variant');
  }
  const variable = state.ns.addVariable({
    componentOf: folder,
    browseName: def.id,
    nodeId: `s=${def.id}`,
    dataType: type.base === 'Variant' ? 'BaseDataType' : type.base,
    valueRank: type.array ? 1 : -1,
    arrayDimensions: type.array ? [0] : undefined,
    accessLevel: 'CurrentRead',
    userAccessLevel: 'CurrentRead',
    minimumSamplingInterval: 0,
    description: def.description ?? `virtual tag computed by outrun (${def.trigger ?? 'on_change'})`,
  });
  setDataValue(
    variable,
    new DataValue({
      value: new Variant({ dataType: DataType.Null }),
      statusCode: StatusCodes.BadWaitingForInitialData,
      serverTimestamp: new Date(),
    }),
  );
  state.virtual.set(def.id, { variable, type, last: null });
}

function addDiagnostics(state, folder) {
  const ns = state.ns;
  // Server-owned nodes are read-only to OPC UA clients.
  const mk = (parent, name, nodeId, dataType, initial) => {
    const v = ns.addVariable({ componentOf: parent, browseName: name, nodeId, dataType, minimumSamplingInterval: 1000, accessLevel: 'CurrentRead', userAccessLevel: 'CurrentRead' });
    v.setValueFromSource({ dataType: DataType[dataType], value: initial });
    return v;
  };
  const daemon = ns.addObject({ organizedBy: folder, browseName: 'outrund', nodeId: 's=Diagnostics.outrund' });
  state.health = {
    connected: mk(daemon, 'Connected', 's=Diagnostics.outrund.Connected', 'Boolean', false),
    shards: mk(daemon, 'Shards', 's=Diagnostics.outrund.Shards', 'Int32', 0),
    stats: mk(daemon, 'StatsJson', 's=Diagnostics.outrund.StatsJson', 'String', ''),
    changes: mk(daemon, 'TagChangesReceived', 's=Diagnostics.outrund.TagChangesReceived', 'Double', 0),
    connectedSince: mk(daemon, 'ConnectedSince', 's=Diagnostics.outrund.ConnectedSince', 'DateTime', state.connectedSince),
    reconnects: mk(daemon, 'Reconnects', 's=Diagnostics.outrund.Reconnects', 'UInt32', 0),
    lastLoss: mk(daemon, 'LastLoss', 's=Diagnostics.outrund.LastLoss', 'String', ''),
  };
  updateHealth(state);
  state.diagFolder = folder;
  state.mkDiag = mk;
  for (const id of state.virtual.keys()) addTagDiagnostics(state, id);
}

function addTagDiagnostics(state, id) {
  const mk = state.mkDiag;
  const o = state.ns.addObject({ organizedBy: state.diagFolder, browseName: id, nodeId: `s=Diagnostics.${id}` });
  state.diag.set(id, {
    evaluations: mk(o, 'Evaluations', `s=Diagnostics.${id}.Evaluations`, 'Double', 0),
    coalesced: mk(o, 'Coalesced', `s=Diagnostics.${id}.Coalesced`, 'Double', 0),
    lastError: mk(o, 'LastError', `s=Diagnostics.${id}.LastError`, 'String', ''),
    lastDurationUs: mk(o, 'LastDurationUs', `s=Diagnostics.${id}.LastDurationUs`, 'Double', 0),
    // The rest of what `outrun tags list` shows (design/tags.md "Counters").
    failed: mk(o, 'Failed', `s=Diagnostics.${id}.Failed`, 'Double', 0),
    timeouts: mk(o, 'Timeouts', `s=Diagnostics.${id}.Timeouts`, 'Double', 0),
    changes: mk(o, 'Changes', `s=Diagnostics.${id}.Changes`, 'Double', 0),
    overflows: mk(o, 'Overflows', `s=Diagnostics.${id}.Overflows`, 'Double', 0),
    skippedBad: mk(o, 'SkippedBad', `s=Diagnostics.${id}.SkippedBad`, 'Double', 0),
    busy: mk(o, 'Busy', `s=Diagnostics.${id}.Busy`, 'Double', 0),
    stateStore: mk(o, 'StateStore', `s=Diagnostics.${id}.StateStore`, 'String', ''),
  });
}

/** Diagnostics.outrund: connected, since when, reconnections, the last loss's reason. */
function updateHealth(state) {
  const h = state.health;
  if (!h) return;
  const up = !state.lost && state.client.connected;
  // ServerStatus.State too: CommunicationFault while outrund is unreachable ("the server is
  // running but has no communication with the underlying system", Part 5 12.6), else Running.
  const engine = state.server.engine;
  const want = up ? ServerState.Running : ServerState.CommunicationFault;
  if (engine && state.started && !state.stopping && engine.getServerState() !== want) engine.setServerState(want);
  h.connected.setValueFromSource({ dataType: DataType.Boolean, value: up });
  h.connectedSince.setValueFromSource({ dataType: DataType.DateTime, value: up ? state.connectedSince : null });
  h.reconnects.setValueFromSource({ dataType: DataType.UInt32, value: state.reconnects });
  h.lastLoss.setValueFromSource({ dataType: DataType.String, value: state.lastLoss });
}

async function refreshDiagnostics(state) {
  const h = state.health;
  updateHealth(state);
  h.changes.setValueFromSource({ dataType: DataType.Double, value: state.changes });
  if (!state.client.connected || state.lost) return;
  const [list, stats] = await Promise.all([state.client.listTags(), state.client.stats().catch(() => null)]);
  if (stats) {
    h.stats.setValueFromSource({ dataType: DataType.String, value: JSON.stringify(stats) });
    h.shards.setValueFromSource({ dataType: DataType.Int32, value: state.client.serverInfo.shards });
  }
  // A reload (SIGHUP, defineTags) changes the address space to match: new tags (and their
  // sources) get variables, removed ones lose theirs, a tag whose DataType changed is made again
  // with the new one; one GeneralModelChangeEvent says what changed (Part 3 9.32, Part 5 6.4.32).
  const { added, sourcesAdded } = syncAddressSpace(state, list);
  if (added.length) state.apply(await state.client.readTags(added));
  if (sourcesAdded.length) await loadSources(state, sourcesAdded);
  for (const t of list.tags ?? []) {
    const d = state.diag.get(t.id);
    if (!d) continue;
    const c = t.counters ?? {};
    d.evaluations.setValueFromSource({ dataType: DataType.Double, value: Number(c.evaluations ?? 0) });
    d.coalesced.setValueFromSource({ dataType: DataType.Double, value: Number(c.coalesced ?? 0) });
    d.lastError.setValueFromSource({ dataType: DataType.String, value: String(c.last_error ?? '') });
    d.lastDurationUs.setValueFromSource({ dataType: DataType.Double, value: Number(c.last_duration_us ?? 0) });
    const by = c.by_status ?? {};
    let failed = 0;
    for (const [st, n] of Object.entries(by)) if (st !== 'ok') failed += Number(n) || 0;
    const num = (v) => ({ dataType: DataType.Double, value: Number(v ?? 0) || 0 });
    d.failed.setValueFromSource(num(failed));
    d.timeouts.setValueFromSource(num((Number(by.timeout) || 0) + (Number(by.killed) || 0)));
    d.changes.setValueFromSource(num(c.changes));
    d.overflows.setValueFromSource(num(c.overflows));
    d.skippedBad.setValueFromSource(num(c.skipped_bad));
    d.busy.setValueFromSource(num(c.busy));
    d.stateStore.setValueFromSource({ dataType: DataType.String, value: String(c.state_store ?? '') });
  }
}

// Simulated sources (--simulate): sine, random walk, ramp, and one that goes Bad now and then.
function startSimulation(state, ids) {
  const kinds = ['sine', 'walk', 'ramp', 'flaky'];
  const t0 = Date.now();
  const walk = new Map();
  state.timers.push(
    setInterval(() => {
      const t = (Date.now() - t0) / 1000;
      ids.forEach((id, i) => {
        const kind = kinds[i % kinds.length];
        const raw = /raw/i.test(id); // ADC counts 0..4095
        const scale = raw ? 4095 : 100;
        let v;
        let status = 0;
        if (kind === 'sine') v = scale * (0.5 + 0.48 * Math.sin((2 * Math.PI * t) / 60));
        else if (kind === 'walk') {
          const prev = walk.get(id) ?? (raw ? 2000 : 20);
          v = Math.max(0, Math.min(scale, prev + (Math.random() - 0.5) * (raw ? 40 : 0.5)));
          walk.set(id, v);
        } else if (kind === 'ramp') v = (t * (scale / 120)) % scale;
        else {
          v = scale * 0.5 + Math.random();
          if (Math.floor(t) % 30 >= 27) status = 0x808c0000; // BadSensorFailure 3 s of every 30
        }
        writeSource(state, id, outrun.double(Math.round(v * 100) / 100), status, new Date()).catch(() => {});
      });
    }, 500),
  );
}

// The outrund client: one Unix-socket connection, pipelined requests, batched writes,
// reconnection with backoff. Wire: design/protocol.md "Client frames"; behaviour: README.md.
import { EventEmitter } from 'node:events';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import * as flatbuffers from 'flatbuffers';
import { LENGTH_PREFIX_SIZE, MAX_FRAME_SIZE, MAX_KEY_BYTES, MAX_SOURCE_BYTES, MAX_TAG_ID_BYTES, MAX_TAG_IDS, PROTOCOL_VERSION } from './constants';
import { FrameReader } from './frame-reader';
import { parseDocument } from './json';
import { MalformedFrame } from './checked-buffer';
import { OutrunError, StatusName, statusName } from './status';
import { DecodeBudget, InvalidInput, InvalidValue, Inputs, OutputValue, toWireInputs, WireInputs } from './values';
import * as wire from './wire';
import * as tags from './tags';
import type { SourceUpdate, TagChange } from './tags';
import { w } from './wire';

/** The outcome of one evaluation. */
export interface Result {
  /** `ok`, or why not (the names of outrun::Status). */
  status: StatusName;
  /** The script's return value when `status` is `ok`; otherwise null. */
  value: OutputValue;
  /** A message for a person when `status` is not `ok` (compile and runtime errors carry `key:LINE:`). */
  error: string;
  /** The shard the daemon routes this script to; -1 when the evaluation never reached a script. */
  shard: number;
  /**
   * What the script printed or logged during this evaluation (print, log.debug/info/warn/error),
   * whatever its status; absent when it logged nothing (design/sandbox.md "Script logs").
   */
  logs?: LogLine[];
  /** Lines it logged past the per-evaluation caps or its rate limit, not kept. */
  logsDropped?: number;
}

export type LogLevel = 'debug' | 'info' | 'warn' | 'error';
export interface LogLine {
  level: LogLevel;
  text: string;
}
/** One line of a script's or a tag's ring (scriptLogs, tagLogs). */
export interface LogRecord extends LogLine {
  seq: number;
  /** ISO 8601 UTC: when outrund received it. */
  time: string;
}
/** A read of a ring: lines from `since` on; `next` is the following read's `since`. */
export interface LogPage {
  lines: LogRecord[];
  next: number;
  /** Lines from `since` on that the ring no longer had. */
  missed: number;
  /** Lines never kept (caps, rate limit), in the ring's life. */
  dropped: number;
}

const LOG_LEVELS: readonly LogLevel[] = ['debug', 'info', 'warn', 'error'];
const MAX_LOG_LINES = 16; // per evaluation (protocol/include/outrun/protocol/script_log.h)

/** One item of evaluateBatch(). */
/** Options of `Client.register`. */
export interface RegisterOptions {
  /** Compile-check the source in the daemon first: a syntax error rejects `compile_error` and registers nothing. */
  check?: boolean;
}

export interface Request {
  script: Script;
  inputs?: Inputs;
}

export interface ConnectOptions {
  /** Shown in the daemon's logs. Default `@outrun/client`. */
  name?: string;
  /**
   * How long the hello and every call that is not an evaluation (register, the control and
   * tags calls) wait for their reply before they reject `unavailable`. Default 10000 ms.
   */
  replyTimeoutMs?: number;
  /**
   * How long an evaluation waits for its result, counted from the evaluate() call (time queued
   * behind `max_inflight` or for a reconnection included), before it ends `unavailable` ("outrund
   * did not answer ..."); a result that comes later is dropped. 0: no limit. Default 60000 ms.
   */
  evaluateTimeoutMs?: number;
  /** Reconnect in the background when the connection is lost. Default true. */
  reconnect?: boolean;
  /** First reconnection delay; doubles per failed attempt up to `reconnectMaxDelayMs`. Default 50 ms. */
  reconnectInitialDelayMs?: number;
  /** Default 5000 ms. */
  reconnectMaxDelayMs?: number;
  /**
   * How long evaluations and calls issued while disconnected wait for the reconnection before
   * they end `unavailable` (evaluations) or reject with it (calls). 0: at once. Default 2000 ms.
   */
  disconnectedWaitMs?: number;
  /** How many evaluations may wait while disconnected; more end `unavailable` at once. Default 10000. */
  disconnectedQueueLimit?: number;
}

/** What the daemon said in its hello. */
export interface ServerInfo {
  protocolVersion: number;
  shards: number;
  serverVersion: string;
  /** Evaluations this client may have in flight (0: the daemon did not say). */
  maxInflight: number;
}

/**
 * A registered script. The handle stays valid for the life of the Client: after a reconnection
 * the client registers the script again and maps it to the new daemon handle.
 */
export class Script {
  readonly key: string;
  /** SHA-256 of the source, lower-case hex. */
  readonly sha256: string;
  /** @internal */ _shard: number;
  /** @internal */ _handle: number;
  /** @internal */ readonly _source: string;
  /** @internal */ readonly _owner: Client;
  /** @internal set when re-registering on a new connection failed */
  _broken: { status: StatusName; error: string } | null = null;

  /** @internal */
  constructor(owner: Client, key: string, source: string, sha256: string, handle: number, shard: number) {
    this._owner = owner;
    this.key = key;
    this._source = source;
    this.sha256 = sha256;
    this._handle = handle;
    this._shard = shard;
  }
  /** The shard the daemon routes this script to. */
  get shard(): number {
    return this._shard;
  }
  /** The daemon's handle on the current connection (changes when a new daemon is reached). */
  get handle(): number {
    return this._handle;
  }
}

export interface ClientEvents {
  /** A connection is up and its scripts are registered (after connect() and after each reconnection). */
  connected: [info: ServerInfo];
  /** The connection was lost (in-flight work has ended `unavailable`); `willReconnect` tells what follows. */
  disconnected: [error: Error, willReconnect: boolean];
  /** A frame the daemon sent on its own (no request), by body name; see PUSHED_BODIES. */
  push: [body: string, frame: wire.IncomingFrame];
  /** A fire-and-forget updateSourcesNoReply() wave was refused by the daemon. */
  updateRefused: [error: OutrunError];
}

/** What defineTags()/removeTags() did. */
export interface DefineResult {
  /** Every tag of the text that runs: new, changed and unchanged. */
  defined: string[];
  removed: string[];
  /** defineTags: new or changed (evaluated once), and left alone. */
  changed?: string[];
  unchanged?: string[];
  /** defineTags: tags that exist with BadConfigurationError (design/tags.md "Broken definitions"). */
  broken?: string[];
  /** defineTags: every broken definition, in the text's order (location: "LINE:COL"). */
  errors?: DefinitionError[];
}

/** A definition defineTags() could not install as given. */
export interface DefinitionError {
  id: string;
  location: string;
  message: string;
  /** 'compile_error' or 'invalid_argument'. */
  code: string;
  /** The tag exists, with BadConfigurationError (false: no usable id, or a second definition). */
  installed: boolean;
}

/** A subscription to tag changes (subscribe()). */
export class Subscription {
  /** The tag ids, or empty for every tag. */
  readonly ids: readonly string[];
  /** @internal */ readonly _filter: Set<string> | null;
  /** @internal */ readonly _onChanges: (changes: TagChange[]) => void;
  /** @internal */ _active = true;
  /** @internal */ readonly _owner: Client;
  /** @internal */
  constructor(owner: Client, ids: readonly string[], onChanges: (changes: TagChange[]) => void) {
    this._owner = owner;
    this.ids = [...ids];
    this._filter = ids.length ? new Set(ids) : null;
    this._onChanges = onChanges;
  }
  get active(): boolean {
    return this._active;
  }
  /** Stops the subscription (the daemon stops pushing what no other subscription needs). */
  cancel(): Promise<void> {
    return this._owner._cancel(this);
  }
}

export function defaultSocketPath(): string {
  const env = process.env.OUTRUN_SOCKET;
  if (env) return env;
  const uid = process.geteuid ? process.geteuid() : os.userInfo().uid;
  if (uid === 0) return '/run/outrun/outrund.sock';
  const xdg = process.env.XDG_RUNTIME_DIR;
  if (xdg) return path.join(xdg, 'outrun', 'outrund.sock');
  return `/tmp/outrun-${uid}/outrund.sock`;
}

// ---- request kinds ----
//
// Request/reply frames are matched by request_id. Each kind names the body the daemon answers
// with and how to read it; the reply table below is built from this list, so a new kind (the
// tags API: define tags, update sources, subscribe) is one entry here plus its method.

interface Reply {
  requestId: number;
  status: number;
  error: string;
}
interface RequestKind<R extends Reply> {
  reply: w.Body;
  read(f: wire.IncomingFrame): R;
}

interface RegisteredReply extends Reply {
  handle: number;
  sha256: string;
  shard: number;
}
interface ControlReplyData extends Reply {
  json: string;
}

const REGISTER: RequestKind<RegisteredReply> = {
  reply: w.Body.Registered,
  read(f) {
    const r = wire.body(f, w.Registered);
    const status = r.status();
    let sha256 = '';
    if (status === w.Status.Ok) {
      const sha = r.sha256Array();
      if (!sha || r.sha256Length() !== 32 || sha.length !== 32) throw new MalformedFrame('Registered without a 32-byte sha256');
      sha256 = Buffer.from(sha).toString('hex');
    }
    return { requestId: Number(r.requestId()), status, error: r.error() ?? '', handle: r.handle(), sha256, shard: r.shard() };
  },
};

const CONTROL: RequestKind<ControlReplyData> = {
  reply: w.Body.ControlReply,
  read(f) {
    const r = wire.body(f, w.ControlReply);
    return { requestId: Number(r.requestId()), status: r.status(), error: r.error() ?? '', json: r.json() ?? '' };
  },
};

interface TagsReplyData extends Reply {
  json: string;
}
const TAGS_REPLY: RequestKind<TagsReplyData> = {
  reply: w.Body.TagsReply,
  read(f) {
    const r = wire.body(f, w.TagsReply);
    return { requestId: Number(r.requestId()), status: r.status(), error: r.error() ?? '', json: r.json() ?? '' };
  },
};

interface TagValuesData extends Reply {
  values: TagChange[];
}
const TAG_VALUES: RequestKind<TagValuesData> = {
  reply: w.Body.TagValues,
  read(f) {
    const r = wire.body(f, w.TagValues);
    const values = tags.decodeTagValues(r.valuesLength(), (i, o) => r.values(i, o), r.bb);
    return { requestId: Number(r.requestId()), status: r.status(), error: r.error() ?? '', values };
  },
};

const REQUEST_KINDS: readonly RequestKind<Reply>[] = [REGISTER, CONTROL, TAGS_REPLY, TAG_VALUES];

/** Bodies the daemon sends without being asked; routed to the 'push' event (and TagChanges to the subscriptions). */
export const PUSHED_BODIES: ReadonlySet<w.Body> = new Set<w.Body>([w.Body.TagChanges]);

// ---- internals ----

interface PendingEval {
  script: Script;
  inputs: WireInputs;
  resolve: (r: Result) => void;
  deadline: number; // while disconnected: when it gives up (0: no deadline)
  expires: number; // the sweep (Client.ticks) at which it ends unanswered; Infinity: never
}

interface PendingRequest {
  kind: RequestKind<Reply>;
  resolve: (r: Reply) => void;
  reject: (e: OutrunError) => void;
  expires: number; // the sweep (Client.ticks) at which it rejects unanswered
  gen: number;
}

type State = 'connecting' | 'ready' | 'down' | 'closed';

function logPage(doc: any): LogPage {
  const lines: LogRecord[] = [];
  if (Array.isArray(doc?.lines))
    for (const l of doc.lines)
      lines.push({
        seq: Number(l?.seq ?? 0),
        time: String(l?.time ?? ''),
        level: LOG_LEVELS.includes(l?.level) ? l.level : 'info',
        text: String(l?.text ?? ''),
      });
  return { lines, next: Number(doc?.next ?? 1), missed: Number(doc?.missed ?? 0), dropped: Number(doc?.dropped ?? 0) };
}

function result(status: StatusName, error: string, shard = -1): Result {
  return { status, value: null, error, shard };
}

const LOST = 'the connection to outrund was lost';

export class Client extends EventEmitter<ClientEvents> {
  readonly socketPath: string;
  private readonly opts: Required<ConnectOptions>;
  private state: State = 'connecting';
  private socket: net.Socket | null = null;
  private gen = 0; // connection generation: events of older sockets are ignored
  private info: ServerInfo = { protocolVersion: 0, shards: 0, serverVersion: '', maxInflight: 0 };
  private attempts = 0;
  private reconnectTimer: NodeJS.Timeout | null = null;
  private expiryTimer: NodeJS.Timeout | null = null;
  // One periodic sweep over what waits for the daemon (evaluations in flight or queued, requests)
  // instead of a timer per call; runs only while something waits, and never keeps the process alive.
  private sweepTimer: NodeJS.Timeout | null = null;
  // Sweeps so far: the clock of the deadlines, so an evaluation costs an addition, not a clock
  // read. A deadline of T ms is `ticks + ceil(T / sweepMs) + 1`: it ends between T and T + 2
  // sweeps after the call (later if the event loop was blocked).
  private ticks = 0;
  private readonly sweepMs: number;
  private readonly evaluateTicks: number;
  private readonly replyTicks: number;
  private lastError: Error | null = null;

  private nextEval = 1;
  private nextRequest = 1;
  private readonly inflight = new Map<number, PendingEval>();
  private queue: PendingEval[] = []; // not yet sent (window full, or not connected)
  private readonly requests = new Map<number, PendingRequest>();
  private readyWaiters: Array<{ resolve: () => void; reject: (e: OutrunError) => void; timer: NodeJS.Timeout | null }> = [];
  private outgoing: Uint8Array[] = [];
  private flushScheduled = false;

  private readonly registered: Script[] = [];
  private byHandle = new Map<number, Script>();
  private readonly replyTable = new Map<w.Body, RequestKind<Reply>>();
  private readonly subscriptions = new Set<Subscription>();

  /** @internal use connect() */
  constructor(socketPath: string, options: ConnectOptions = {}) {
    super();
    this.socketPath = socketPath;
    this.opts = {
      name: options.name ?? '@outrun/client',
      replyTimeoutMs: options.replyTimeoutMs ?? 10000,
      evaluateTimeoutMs: options.evaluateTimeoutMs ?? 60000,
      reconnect: options.reconnect ?? true,
      reconnectInitialDelayMs: options.reconnectInitialDelayMs ?? 50,
      reconnectMaxDelayMs: options.reconnectMaxDelayMs ?? 5000,
      disconnectedWaitMs: options.disconnectedWaitMs ?? 2000,
      disconnectedQueueLimit: options.disconnectedQueueLimit ?? 10000,
    };
    for (const k of REQUEST_KINDS) this.replyTable.set(k.reply, k);
    // A tenth of the shorter limit, 10 ms to 1 s.
    const e = this.opts.evaluateTimeoutMs > 0 ? this.opts.evaluateTimeoutMs : Number.POSITIVE_INFINITY;
    this.sweepMs = Math.max(10, Math.min(1000, Math.floor(Math.min(this.opts.replyTimeoutMs, e) / 10) || 10));
    this.evaluateTicks = Math.ceil(e / this.sweepMs) + 1; // Infinity when off
    this.replyTicks = Math.ceil(this.opts.replyTimeoutMs / this.sweepMs) + 1;
  }

  /** True while a connection is up and ready for evaluations. */
  get connected(): boolean {
    return this.state === 'ready';
  }
  /** What the daemon said in its last hello. */
  get serverInfo(): ServerInfo {
    return { ...this.info };
  }
  /** Evaluations sent and not yet answered. */
  get inflightCount(): number {
    return this.inflight.size;
  }

  // ---- public API ----

  /**
   * Registers (or finds) a script. Rejects with OutrunError: `invalid_argument` for a bad key or
   * source, `unavailable` when the daemon cannot be reached or refuses, `cancelled` after close().
   * With `{check: true}` the daemon compile-checks the source first: one that does not compile
   * rejects `compile_error` ("key:LINE: ...") and nothing is registered.
   */
  async register(key: string, source: string, options: RegisterOptions = {}): Promise<Script> {
    if (typeof key !== 'string' || key.length === 0 || Buffer.byteLength(key) > MAX_KEY_BYTES)
      throw new OutrunError('invalid_argument', `script key must be 1..${MAX_KEY_BYTES} bytes`);
    if (typeof source !== 'string' || Buffer.byteLength(source) > MAX_SOURCE_BYTES)
      throw new OutrunError('invalid_argument', 'script source must be a string of at most 1 MiB');
    await this.whenReady();
    const check = options.check === true;
    const r = (await this.request(REGISTER, (id) => wire.register(id, key, source, check))) as RegisteredReply;
    this.check(r);
    const known = this.byHandle.get(r.handle);
    if (known && known.key === key && known.sha256 === r.sha256) return known;
    const s = new Script(this, key, source, r.sha256, r.handle, r.shard);
    this.registered.push(s);
    this.byHandle.set(r.handle, s);
    return s;
  }

  /**
   * Evaluates `script` with `inputs`. Never rejects: every outcome is a Result, including
   * `invalid_argument` (inputs with no wire kind, a script of another client), `unavailable`
   * (connection lost, or not back within `disconnectedWaitMs`) and `cancelled` (after close()).
   */
  evaluate(script: Script, inputs?: Inputs): Promise<Result> {
    return new Promise<Result>((resolve) => this.submit(script, inputs, resolve));
  }

  /** Evaluates several requests; they go out in one Evaluate frame (split at 4 MiB). Results in order. */
  evaluateBatch(requests: readonly Request[]): Promise<Result[]> {
    return Promise.all(requests.map((r) => this.evaluate(r.script, r.inputs)));
  }

  /** The daemon's Stats document (design/daemon.md), parsed. */
  stats(): Promise<any> {
    return this.controlJson(w.ControlCommand.Stats);
  }
  /** The Shards document, parsed. */
  shards(): Promise<any> {
    return this.controlJson(w.ControlCommand.Shards);
  }
  /**
   * Every ListScripts page, merged: `{ scripts: [...] }` in key order (design/protocol.md
   * "Paged ListScripts"). It grows with the registry; scriptsPage() reads one page at a time.
   */
  async scripts(): Promise<any> {
    const all: any[] = [];
    let after = '';
    for (;;) {
      const page = await this.scriptsPage(after, 10000);
      if (Array.isArray(page.scripts)) for (const s of page.scripts) all.push(s);
      // Absent: a daemon from before paging sent everything at once.
      if (typeof page.next !== 'string') break;
      if (page.next === after) throw new OutrunError('runtime_error', 'outrund sent the same ListScripts cursor twice');
      after = page.next;
    }
    return { scripts: all };
  }
  /**
   * One ListScripts page, parsed: `{ scripts, total, next }`. `after`: the `next` of the previous
   * page ('' the first); `limit`: the most scripts (0: the daemon's default, 1000; at most 10000).
   * `next` is null on the last page.
   */
  scriptsPage(after = '', limit = 0): Promise<any> {
    return this.controlJson(w.ControlCommand.ListScripts, after, limit);
  }
  /**
   * The recent log lines of the script registered under `key` (its owner's uid or an admin), from
   * line `since` on (0: the oldest kept; a follower passes the last page's `next`).
   */
  async scriptLogs(key: string, since = 0): Promise<LogPage> {
    return logPage(await this.controlJson(w.ControlCommand.ScriptLogs, '', 0, key, since));
  }
  /** The recent log lines of a virtual tag's script, as scriptLogs. */
  async tagLogs(id: string, since = 0): Promise<LogPage> {
    return logPage(await this.controlJson(w.ControlCommand.TagLogs, '', 0, id, since));
  }
  /** Drill: SIGKILL shard `shard`'s worker (it restarts). */
  async killShard(shard: number): Promise<void> {
    await this.control(w.ControlCommand.KillShard, shard);
  }
  async restartShard(shard: number): Promise<void> {
    await this.control(w.ControlCommand.RestartShard, shard);
  }

  // ---- tags (design/protocol.md "Tags frames") ----

  /** Defines/redefines the tags of a tags-file text (admin only). Rejects with OutrunError. */
  async defineTags(toml: string, options: { replaceAll?: boolean } = {}): Promise<DefineResult> {
    if (typeof toml !== 'string') throw new OutrunError('invalid_argument', 'toml must be a string');
    if (Buffer.byteLength(toml) > MAX_FRAME_SIZE)
      throw new OutrunError('invalid_argument', `the tags text is more than a frame holds (MAX_FRAME_SIZE, ${MAX_FRAME_SIZE} bytes); nothing was sent`);
    const r = await this.tagsRequest((id) => tags.defineTags(id, toml, options.replaceAll ?? false));
    const doc = this.parseJson(r.json, 'DefineTags');
    return {
      defined: doc?.defined ?? [],
      removed: doc?.removed ?? [],
      changed: doc?.changed ?? [],
      unchanged: doc?.unchanged ?? [],
      broken: doc?.broken ?? [],
      errors: Array.isArray(doc?.errors) ? doc.errors : [],
    };
  }

  /** Removes virtual tags, all or none (admin only). */
  async removeTags(ids: readonly string[]): Promise<DefineResult> {
    const r = await this.tagsRequest((id) => tags.removeTags(id, checkIds(ids)));
    const doc = r.json ? this.parseJson(r.json, 'RemoveTags') : {};
    return { defined: doc?.defined ?? [], removed: doc?.removed ?? [...ids] };
  }

  /** The ListTags document, parsed: `{tags: [{id, type, trigger, inputs, value, counters, version}]}`. */
  async listTags(): Promise<any> {
    // outrund answers in pages (design/protocol.md "Paged ListTags"): follow `next` to the end.
    let doc: any = null;
    let after: string | null = null;
    for (;;) {
      const r = await this.tagsRequest((id) => tags.listTags(id, after));
      const page = this.parseJson(r.json, 'ListTags');
      if (doc === null) doc = page ?? { tags: [] };
      else if (page && Array.isArray(page.tags)) doc.tags.push(...page.tags);
      const next = page?.next;
      if (typeof next !== 'string' || next === '' || next === after) break;
      after = next;
    }
    delete doc.next;
    return doc;
  }

  /**
   * One wave of source updates; resolves when the daemon accepted it (rejects with OutrunError
   * when it refused, e.g. `invalid_argument` for a virtual tag or a bad value). A wave larger
   * than a frame (MAX_FRAME_SIZE, 16 MiB encoded) rejects `invalid_argument` at once: nothing is
   * sent and the connection stays.
   */
  async updateSources(updates: readonly SourceUpdate[], time?: Date): Promise<void> {
    const wu = this.wireUpdates(updates);
    const t = time ? tags.dateToTicks(time) : 0n;
    await this.tagsRequest((id) => tags.sourceUpdates(id, t, wu, wire.encodeValue));
  }

  /**
   * The same wave, fire-and-forget (request_id 0): nothing comes back unless the daemon refuses
   * it, then the 'updateRefused' event. Throws OutrunError at once for updates that cannot be
   * encoded or when not connected.
   */
  updateSourcesNoReply(updates: readonly SourceUpdate[], time?: Date): void {
    if (this.state !== 'ready' || !this.socket) throw new OutrunError('unavailable', this.lastDropReason);
    const wu = this.wireUpdates(updates);
    const t = time ? tags.dateToTicks(time) : 0n;
    this.outgoing.push(requestFrame(() => tags.sourceUpdates(0, t, wu, wire.encodeValue)));
    this.scheduleFlush();
  }

  /** Current DataValues of `ids`, in order (an unknown id: OutrunError invalid_argument). */
  async readTags(ids: readonly string[]): Promise<TagChange[]> {
    checkIds(ids);
    await this.whenReady();
    const r = (await this.request(TAG_VALUES, (id) => tags.readTags(id, ids))) as TagValuesData;
    this.check(r);
    return r.values;
  }

  /**
   * Pushes the changes of `ids` (empty: every tag) to `onChanges`, one call per TagChanges frame
   * (the changes of one or more waves, in order). Survives reconnections (subscribed again).
   */
  async subscribe(ids: readonly string[], onChanges: (changes: TagChange[]) => void): Promise<Subscription> {
    checkIds(ids);
    if (typeof onChanges !== 'function') throw new OutrunError('invalid_argument', 'onChanges must be a function');
    const sub = new Subscription(this, ids, onChanges);
    this.subscriptions.add(sub);
    try {
      await this.tagsRequest((id) => tags.subscribe(id, ids, false));
    } catch (e) {
      this.subscriptions.delete(sub);
      sub._active = false;
      throw e;
    }
    return sub;
  }

  /** @internal */
  async _cancel(sub: Subscription): Promise<void> {
    if (!sub._active) return;
    sub._active = false;
    this.subscriptions.delete(sub);
    if (this.state !== 'ready') return; // a reconnection subscribes only what is left
    const rest = [...this.subscriptions];
    if (rest.some((s) => s._filter === null)) return; // an every-tag subscription remains
    if (sub._filter === null) {
      await this.tagsRequest((id) => tags.subscribe(id, [], true));
      if (rest.length) {
        const ids = [...new Set(rest.flatMap((s) => s.ids))];
        await this.tagsRequest((id) => tags.subscribe(id, ids, false));
      }
      return;
    }
    const still = new Set(rest.flatMap((s) => s.ids));
    const drop = sub.ids.filter((i) => !still.has(i));
    if (drop.length) await this.tagsRequest((id) => tags.subscribe(id, drop, true));
  }

  private deliverChanges(changes: TagChange[]): void {
    for (const s of this.subscriptions) {
      if (!s._active) continue;
      const mine = s._filter ? changes.filter((c) => s._filter!.has(c.tag)) : changes;
      if (mine.length === 0) continue;
      try {
        s._onChanges(mine);
      } catch (e) {
        queueMicrotask(() => {
          throw e;
        });
      }
    }
  }

  private wireUpdates(updates: readonly SourceUpdate[]): tags.WireUpdate[] {
    try {
      return tags.toWireUpdates(updates);
    } catch (e) {
      if (e instanceof InvalidInput) throw new OutrunError('invalid_argument', e.message);
      throw e;
    }
  }

  private async tagsRequest(build: (id: number) => Uint8Array): Promise<TagsReplyData> {
    await this.whenReady();
    const r = (await this.request(TAGS_REPLY, build)) as TagsReplyData;
    this.check(r);
    return r;
  }

  private parseJson(text: string, what: string): any {
    return parseDocument(text, what);
  }

  /**
   * Closes the connection and stops reconnecting. Everything not yet answered ends `cancelled`
   * (evaluations resolve, calls reject). Resolves once the socket is closed.
   */
  close(): Promise<void> {
    if (this.state === 'closed') return Promise.resolve();
    this.state = 'closed';
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    if (this.expiryTimer) clearInterval(this.expiryTimer);
    if (this.sweepTimer) clearInterval(this.sweepTimer);
    this.reconnectTimer = this.expiryTimer = this.sweepTimer = null;
    this.failEverything('cancelled', 'the client was closed');
    const s = this.socket;
    this.socket = null;
    this.gen++;
    if (!s || s.destroyed) return Promise.resolve();
    return new Promise<void>((resolve) => {
      s.once('close', () => resolve());
      s.destroy();
    });
  }

  // ---- connection ----

  /** @internal first connection: rejects instead of reconnecting. */
  open(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.readyWaiters.push({ resolve, reject, timer: null });
      this.dial();
    });
  }

  private dial(): void {
    this.state = 'connecting';
    const gen = ++this.gen;
    const reader = new FrameReader();
    let hello = false;
    const sock = net.createConnection({ path: this.socketPath });
    this.socket = sock;
    const helloTimer = setTimeout(() => {
      if (gen === this.gen) this.drop(gen, new OutrunError('unavailable', `no hello from outrund at ${this.socketPath}`));
    }, this.opts.replyTimeoutMs);
    helloTimer.unref(); // the socket keeps the process alive while it connects
    sock.on('connect', () => {
      if (gen === this.gen) sock.write(wire.clientHello(this.opts.name));
    });
    sock.on('data', (chunk: Buffer) => {
      if (gen !== this.gen) return;
      let frames: Uint8Array[];
      try {
        frames = reader.push(chunk);
      } catch (e) {
        this.drop(gen, new OutrunError('unavailable', `outrund sent a bad frame: ${(e as Error).message}`));
        return;
      }
      for (const bytes of frames) {
        if (gen !== this.gen) return;
        try {
          const f = wire.openFrame(bytes);
          if (!hello) {
            clearTimeout(helloTimer);
            this.onHello(gen, f);
            hello = true;
          } else {
            this.onFrame(f);
          }
        } catch (e) {
          const why = e instanceof OutrunError ? e : new OutrunError('unavailable', `outrund sent a bad frame: ${(e as Error).message}`);
          this.drop(gen, why);
          return;
        }
      }
    });
    sock.on('error', (err) => {
      if (gen === this.gen && !this.lastError) this.lastError = err;
    });
    sock.on('close', () => {
      clearTimeout(helloTimer);
      if (gen !== this.gen) return;
      const err = this.lastError;
      this.drop(
        gen,
        new OutrunError(
          'unavailable',
          hello ? LOST : `cannot connect to outrund at ${this.socketPath}: ${err ? err.message : 'closed the connection'}`,
        ),
      );
    });
  }

  private onHello(gen: number, f: wire.IncomingFrame): void {
    if (f.type !== w.Body.ServerHello) throw new OutrunError('unavailable', 'outrund did not answer with its hello');
    const h = wire.body(f, w.ServerHello);
    const err = h.error();
    if (err) throw new OutrunError('unavailable', `outrund refused the connection: ${err}`);
    if (h.protocolVersion() !== PROTOCOL_VERSION)
      throw new OutrunError('unavailable', `outrund speaks protocol ${h.protocolVersion()}, this client ${PROTOCOL_VERSION}`);
    this.info = {
      protocolVersion: h.protocolVersion(),
      shards: h.shards(),
      serverVersion: h.serverVersion() ?? '',
      maxInflight: h.maxInflight(),
    };
    this.lastError = null;
    if (this.registered.length === 0) {
      this.becomeReady();
      return;
    }
    // A new connection (perhaps a new daemon): register every script again, in the order they
    // were first registered, and map the handles the user holds to the new daemon's.
    const byHandle = new Map<number, Script>();
    let left = this.registered.length;
    for (const s of this.registered) {
      this.request(REGISTER, (id) => wire.register(id, s.key, s._source), true).then(
        (r) => {
          if (gen !== this.gen) return;
          const rr = r as RegisteredReply;
          const st = statusName(rr.status) ?? 'runtime_error';
          if (st !== 'ok') s._broken = { status: st, error: `registering again after reconnecting: ${rr.error}` };
          else if (rr.sha256 !== s.sha256) s._broken = { status: 'invalid_argument', error: 'the daemon computed another SHA-256' };
          else {
            s._broken = null;
            s._handle = rr.handle;
            s._shard = rr.shard;
            byHandle.set(rr.handle, s);
          }
          if (--left === 0) {
            this.byHandle = byHandle;
            this.becomeReady();
          }
        },
        (e: OutrunError) => {
          // The connection went away (drop() has taken care of it), or the daemon did not
          // answer in time: then give up on this connection and try again.
          if (gen === this.gen) this.drop(gen, e);
        },
      );
    }
  }

  private becomeReady(): void {
    this.state = 'ready';
    this.everReady = true;
    this.attempts = 0;
    if (this.expiryTimer) clearInterval(this.expiryTimer);
    this.expiryTimer = null;
    for (const p of this.queue) p.deadline = 0;
    const waiters = this.readyWaiters;
    this.readyWaiters = [];
    for (const wt of waiters) {
      if (wt.timer) clearTimeout(wt.timer);
      wt.resolve();
    }
    this.resubscribe();
    this.emit('connected', this.serverInfo);
    this.scheduleFlush();
  }

  /** After a reconnection: the daemon knows none of this connection's subscriptions. */
  private resubscribe(): void {
    if (this.subscriptions.size === 0) return;
    const gen = this.gen;
    const all = [...this.subscriptions].some((s) => s._filter === null);
    const ids = all ? [] : [...new Set([...this.subscriptions].flatMap((s) => s.ids))];
    this.request(TAGS_REPLY, (id) => tags.subscribe(id, ids, false)).then(
      (r) => {
        const st = statusName(r.status);
        if (st !== 'ok' && gen === this.gen) this.drop(gen, new OutrunError('unavailable', `subscribing again after reconnecting: ${r.error}`));
      },
      () => {},
    );
  }

  /** Ends connection `gen` with `why`: in flight ends `unavailable`, then reconnect (or not). */
  private drop(gen: number, why: OutrunError): void {
    if (gen !== this.gen || this.state === 'closed') return;
    const wasReady = this.state === 'ready';
    const firstEver = !this.everReady; // connect() itself failed: reject it, no reconnection
    this.gen++;
    const s = this.socket;
    this.socket = null;
    if (s && !s.destroyed) s.destroy();
    this.lastError = null;

    const inflight = [...this.inflight.values()];
    this.inflight.clear();
    for (const p of inflight) p.resolve(result('unavailable', why.message, p.script._shard));
    for (const [id, r] of this.requests) {
      if (r.gen > gen) continue;
      this.requests.delete(id);
      r.reject(new OutrunError('unavailable', why.message));
    }
    this.outgoing = [];

    if (firstEver || !this.opts.reconnect) {
      // connect() failed, or no reconnection: nothing will come back.
      this.state = 'down';
      const waiters = this.readyWaiters;
      this.readyWaiters = [];
      for (const wt of waiters) {
        if (wt.timer) clearTimeout(wt.timer);
        wt.reject(why);
      }
      const q = this.queue;
      this.queue = [];
      for (const p of q) p.resolve(result('unavailable', why.message, p.script._shard));
      if (wasReady) this.emit('disconnected', why, false);
      return;
    }
    this.state = 'down';
    if (wasReady) this.emit('disconnected', why, true);
    // What waits for the reconnection gives up after disconnectedWaitMs.
    const deadline = Date.now() + this.opts.disconnectedWaitMs;
    for (const p of this.queue) if (!p.deadline) p.deadline = deadline;
    this.lastDropReason = why.message;
    this.expire();
    if (!this.expiryTimer && this.queue.length)
      this.expiryTimer = setInterval(() => this.expire(), Math.max(10, Math.min(100, this.opts.disconnectedWaitMs)));
    const delay = Math.min(this.opts.reconnectMaxDelayMs, this.opts.reconnectInitialDelayMs * 2 ** this.attempts);
    this.attempts = Math.min(this.attempts + 1, 30);
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = null;
      if (this.state === 'down') this.dial();
    }, delay * (0.8 + 0.4 * Math.random()));
  }
  private lastDropReason = LOST;
  private everReady = false;

  private expire(): void {
    const now = Date.now();
    if (this.state === 'ready') return;
    const keep: PendingEval[] = [];
    for (const p of this.queue) {
      if (p.deadline && p.deadline <= now) p.resolve(result('unavailable', `${this.lastDropReason} (not reconnected within ${this.opts.disconnectedWaitMs} ms)`, p.script._shard));
      else keep.push(p);
    }
    this.queue = keep;
    if (keep.length === 0 && this.expiryTimer) {
      clearInterval(this.expiryTimer);
      this.expiryTimer = null;
    }
  }

  private failEverything(status: StatusName, why: string): void {
    for (const p of this.inflight.values()) p.resolve(result(status, why, p.script._shard));
    this.inflight.clear();
    for (const p of this.queue) p.resolve(result(status, why, p.script._shard));
    this.queue = [];
    for (const r of this.requests.values()) r.reject(new OutrunError(status, why));
    this.requests.clear();
    for (const wt of this.readyWaiters) {
      if (wt.timer) clearTimeout(wt.timer);
      wt.reject(new OutrunError(status, why));
    }
    this.readyWaiters = [];
  }

  /** Resolves when the connection is ready; waits (bounded) while reconnecting. */
  private whenReady(): Promise<void> {
    if (this.state === 'ready') return Promise.resolve();
    if (this.state === 'closed') return Promise.reject(new OutrunError('cancelled', 'the client was closed'));
    if (!this.opts.reconnect) return Promise.reject(new OutrunError('unavailable', this.lastDropReason));
    if (this.opts.disconnectedWaitMs <= 0) return Promise.reject(new OutrunError('unavailable', this.lastDropReason));
    return new Promise<void>((resolve, reject) => {
      const wt = { resolve, reject, timer: null as NodeJS.Timeout | null };
      wt.timer = setTimeout(() => {
        this.readyWaiters = this.readyWaiters.filter((x) => x !== wt);
        reject(new OutrunError('unavailable', `${this.lastDropReason} (not reconnected within ${this.opts.disconnectedWaitMs} ms)`));
      }, this.opts.disconnectedWaitMs);
      wt.timer.unref?.();
      this.readyWaiters.push(wt);
    });
  }

  // ---- frames in ----

  private onFrame(f: wire.IncomingFrame): void {
    if (f.type === w.Body.Results) return this.onResults(f);
    const kind = this.replyTable.get(f.type);
    if (kind) {
      const r = kind.read(f);
      if (kind === TAGS_REPLY && r.requestId === 0) {
        // The refusal of a SourceUpdates sent with request_id 0.
        const st = statusName(r.status) ?? 'runtime_error';
        if (st !== 'ok') queueMicrotask(() => this.emit('updateRefused', new OutrunError(st, r.error)));
        return;
      }
      const p = this.requests.get(r.requestId);
      if (!p || p.kind !== kind) return; // timed out meanwhile: late replies are dropped
      this.requests.delete(r.requestId);
      p.resolve(r);
      return;
    }
    if (PUSHED_BODIES.has(f.type)) {
      const name = w.Body[f.type];
      if (f.type === w.Body.TagChanges) {
        const tc = wire.body(f, w.TagChanges);
        const changes = tags.decodeTagValues(tc.changesLength(), (i, o) => tc.changes(i, o), tc.bb);
        queueMicrotask(() => this.deliverChanges(changes));
      }
      queueMicrotask(() => this.emit('push', name, f));
      return;
    }
    throw new MalformedFrame(`outrund sent a ${w.Body[f.type]} frame, which a daemon does not send`);
  }

  private onResults(f: wire.IncomingFrame): void {
    const results = wire.body(f, w.Results);
    const n = results.itemsLength();
    const budget = new DecodeBudget();
    // Decode the whole frame first: a frame that turns out malformed completes nothing.
    const done: Array<[number, PendingEval, Result]> = [];
    const item = new w.Result();
    const val = new w.Value();
    const seen = new Set<number>();
    for (let i = 0; i < n; i++) {
      const r = results.items(i, item);
      if (!r) throw new MalformedFrame('Results item missing');
      const id = Number(r.id());
      const p = this.inflight.get(id);
      if (!p || seen.has(id)) continue; // not ours (or twice): dropped, as outrun::Client does
      seen.add(id);
      const st = statusName(r.status());
      let out: Result;
      if (st === undefined) {
        out = result('runtime_error', `outrund sent an unknown status ${r.status()}`, p.script._shard);
      } else if (st === 'ok') {
        const v = r.value(val);
        let value: OutputValue = null;
        try {
          value = v ? wire.decodeValue(v, budget) : null;
          out = { status: 'ok', value, error: '', shard: p.script._shard };
        } catch (e) {
          if (!(e instanceof InvalidValue)) throw e;
          out = result('runtime_error', `outrund sent an invalid value: ${e.message}`, p.script._shard);
        }
      } else {
        out = result(st, r.error() ?? '', p.script._shard);
      }
      const nl = r.logsLength();
      if (nl > 0 || r.logsDropped() > 0) {
        // Untrusted like the rest: at most MAX_LOG_LINES kept, the others counted as dropped.
        const logs: LogLine[] = [];
        const line = new w.LogLine();
        for (let i = 0; i < Math.min(nl, MAX_LOG_LINES); i++) {
          const l = r.logs(i, line);
          if (!l) continue;
          logs.push({ level: LOG_LEVELS[l.level()] ?? 'info', text: (l.text() ?? '').slice(0, 1024) });
        }
        out.logs = logs;
        out.logsDropped = r.logsDropped() + Math.max(0, nl - MAX_LOG_LINES);
      }
      done.push([id, p, out]);
    }
    for (const [id] of done) this.inflight.delete(id);
    for (const [, p, out] of done) p.resolve(out);
    if (this.queue.length) this.scheduleFlush();
  }

  // ---- frames out ----

  private submit(script: Script, inputs: Inputs | undefined, resolve: (r: Result) => void): void {
    if (this.state === 'closed') return resolve(result('cancelled', 'the client was closed'));
    if (!(script instanceof Script) || script._owner !== this)
      return resolve(result('invalid_argument', 'script handle is not from this client'));
    if (script._broken) return resolve(result(script._broken.status, script._broken.error, script._shard));
    let wi: WireInputs;
    try {
      wi = toWireInputs(inputs);
    } catch (e) {
      // InvalidInput, or whatever a getter or a Map iterator of the inputs threw.
      const why = e instanceof InvalidInput ? e.message : `reading the inputs threw: ${(e as Error)?.message ?? String(e)}`;
      return resolve(result('invalid_argument', why, script._shard));
    }
    const p: PendingEval = { script, inputs: wi, resolve, deadline: 0, expires: this.ticks + this.evaluateTicks };
    if (!this.sweepTimer) this.armSweep();
    if (this.state === 'ready') {
      this.queue.push(p);
      this.scheduleFlush();
      return;
    }
    // Not connected: wait for the reconnection, bounded in time and number.
    if (!this.opts.reconnect || !this.everReady || this.opts.disconnectedWaitMs <= 0)
      return resolve(result('unavailable', this.lastDropReason, script._shard));
    if (this.queue.length >= this.opts.disconnectedQueueLimit)
      return resolve(result('unavailable', `${this.lastDropReason} (${this.opts.disconnectedQueueLimit} evaluations already wait for the reconnection)`, script._shard));
    p.deadline = Date.now() + this.opts.disconnectedWaitMs;
    this.queue.push(p);
    if (!this.expiryTimer)
      this.expiryTimer = setInterval(() => this.expire(), Math.max(10, Math.min(100, this.opts.disconnectedWaitMs)));
  }

  private request(kind: RequestKind<Reply>, build: (id: number) => Uint8Array, internal = false): Promise<Reply> {
    return new Promise<Reply>((resolve, reject) => {
      if (!this.socket || (this.state !== 'ready' && !internal))
        return reject(new OutrunError('unavailable', this.lastDropReason));
      const id = this.nextRequest++;
      // Built before anything is registered or sent: a request larger than a frame is refused
      // here and the connection never sees it.
      let frame: Uint8Array;
      try {
        frame = requestFrame(() => build(id));
      } catch (e) {
        return reject(e);
      }
      this.requests.set(id, { kind, resolve, reject, expires: this.ticks + this.replyTicks, gen: this.gen });
      if (!this.sweepTimer) this.armSweep();
      this.outgoing.push(frame);
      this.scheduleFlush();
    });
  }

  /**
   * Starts the sweep that ends what the daemon does not answer in time: every evaluation within
   * evaluateTimeoutMs of its call, every request within replyTimeoutMs. One interval for all of
   * them (every sweepMs), unref'd, stopped once nothing waits.
   */
  private armSweep(): void {
    this.sweepTimer = setInterval(() => this.sweep(), this.sweepMs);
    this.sweepTimer.unref();
  }

  private sweep(): void {
    const now = ++this.ticks;
    // Evaluations are sent in the order they were called and requests are numbered in order, so
    // each list is in order of deadline: stop at the first one still in time.
    let late: PendingEval[] | null = null;
    for (const [id, p] of this.inflight) {
      if (p.expires > now) break;
      this.inflight.delete(id); // a result that comes later finds no one and is dropped
      (late ??= []).push(p);
    }
    let k = 0;
    while (k < this.queue.length && this.queue[k].expires <= now) k++;
    if (k > 0) late = (late ?? []).concat(this.queue.splice(0, k));
    let lateRequests: PendingRequest[] | null = null;
    for (const [id, r] of this.requests) {
      if (r.expires > now) break;
      this.requests.delete(id); // a late reply is dropped (onFrame)
      (lateRequests ??= []).push(r);
    }
    if (this.inflight.size === 0 && this.queue.length === 0 && this.requests.size === 0 && this.sweepTimer) {
      clearInterval(this.sweepTimer);
      this.sweepTimer = null;
    }
    if (late) {
      const why = `outrund did not answer within ${this.opts.evaluateTimeoutMs} ms (evaluateTimeoutMs)`;
      for (const p of late) p.resolve(result('unavailable', why, p.script._shard));
      if (this.queue.length) this.scheduleFlush(); // the window has room again
    }
    if (lateRequests) {
      const why = `outrund did not answer within ${this.opts.replyTimeoutMs} ms (replyTimeoutMs)`;
      for (const r of lateRequests) r.reject(new OutrunError('unavailable', why));
    }
  }

  private async control(cmd: w.ControlCommand, shard: number, after = '', limit = 0, key = '',
                        since = 0): Promise<ControlReplyData> {
    await this.whenReady();
    const r = (await this.request(CONTROL, (id) => wire.control(id, cmd, shard, after, limit, key, since))) as ControlReplyData;
    this.check(r);
    return r;
  }

  private async controlJson(cmd: w.ControlCommand, after = '', limit = 0, key = '', since = 0): Promise<any> {
    const r = await this.control(cmd, 0, after, limit, key, since);
    return parseDocument(r.json, 'control');
  }

  private check(r: Reply): void {
    const st = statusName(r.status);
    if (st === undefined) throw new OutrunError('runtime_error', `outrund sent an unknown status ${r.status}`);
    if (st !== 'ok') throw new OutrunError(st, r.error);
  }

  private scheduleFlush(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    queueMicrotask(() => this.flush());
  }

  /**
   * Everything issued since the last flush goes out in one socket write: request frames, then
   * the queued evaluations as one Evaluate frame (split at 4 MiB), as many as the daemon's
   * max_inflight leaves room for (the rest wait here for results to come back).
   */
  private flush(): void {
    this.flushScheduled = false;
    const sock = this.socket;
    if (!sock || this.state === 'closed') return;
    const frames = this.outgoing;
    this.outgoing = [];
    if (this.state === 'ready' && this.queue.length) {
      const limit = this.info.maxInflight > 0 ? this.info.maxInflight : Number.POSITIVE_INFINITY;
      const room = Math.max(0, limit - this.inflight.size);
      const take = Math.min(room, this.queue.length);
      if (take > 0) {
        const batch = take === this.queue.length ? this.queue : this.queue.slice(0, take);
        this.queue = take === this.queue.length ? [] : this.queue.slice(take);
        const items: wire.OutgoingEvaluation[] = new Array(batch.length);
        for (let i = 0; i < batch.length; i++) {
          const p = batch[i];
          const id = this.nextEval++;
          this.inflight.set(id, p);
          items[i] = { id, handle: p.script._handle, inputs: p.inputs };
          p.inputs = [];
        }
        for (const f of wire.evaluate(items)) frames.push(f);
      }
    }
    if (frames.length === 0) return;
    sock.write(frames.length === 1 ? frames[0] : Buffer.concat(frames));
  }
}

/**
 * Connects to outrund at `socketPath` (default: $OUTRUN_SOCKET, else the daemon's default path)
 * and exchanges hellos. Rejects with OutrunError `unavailable` when no daemon answers there or it
 * refuses this process; only later losses of the connection are reconnected.
 */
export async function connect(socketPath?: string, options?: ConnectOptions): Promise<Client> {
  const p = socketPath || defaultSocketPath();
  if (Buffer.byteLength(p) >= 108) throw new OutrunError('invalid_argument', `socket path too long: ${p}`);
  const c = new Client(p, options);
  await c.open();
  return c;
}

function checkIds(ids: readonly string[]): string[] {
  if (!Array.isArray(ids) || ids.some((i) => typeof i !== 'string' || i.length === 0))
    throw new OutrunError('invalid_argument', 'ids must be an array of non-empty strings');
  if (ids.length > MAX_TAG_IDS) throw new OutrunError('invalid_argument', `at most ${MAX_TAG_IDS} ids per request`);
  if (ids.some((i) => Buffer.byteLength(i) > MAX_TAG_ID_BYTES))
    throw new OutrunError('invalid_argument', `a tag id must be 1..${MAX_TAG_ID_BYTES} bytes`);
  return ids as string[];
}

/**
 * A request frame from `build`, or OutrunError `invalid_argument` when it is larger than a frame
 * holds (MAX_FRAME_SIZE after the length prefix): outrund would have to drop the whole
 * connection for it, so it is refused here, before anything is sent.
 */
function requestFrame(build: () => Uint8Array): Uint8Array {
  const limit = `more than a frame holds (MAX_FRAME_SIZE, ${MAX_FRAME_SIZE} bytes); nothing was sent`;
  let frame: Uint8Array;
  try {
    frame = build();
  } catch (e) {
    // The FlatBuffers builder stops at 2 GiB.
    if (e instanceof Error && /cannot grow buffer/.test(e.message)) throw new OutrunError('invalid_argument', `the request is ${limit}`);
    throw e;
  }
  const size = frame.length - LENGTH_PREFIX_SIZE;
  if (size > MAX_FRAME_SIZE) {
    const type = w.Frame.getSizePrefixedRootAsFrame(new flatbuffers.ByteBuffer(frame)).bodyType();
    throw new OutrunError('invalid_argument', `the ${w.Body[type] ?? 'request'} frame would be ${size} bytes, ${limit}`);
  }
  return frame;
}

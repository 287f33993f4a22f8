// Helpers of the end-to-end tests: start the server (its own outrund) on a free port, talk to it
// with node-opcua's client.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { OPCUAClient, AttributeIds, DataType, StatusCodes, MessageSecurityMode, SecurityPolicy } from 'node-opcua';

const here = dirname(fileURLToPath(import.meta.url));
export const ROOT = resolve(here, '../../..');
export const OUTRUND = process.env.OUTRUN_OUTRUND || join(ROOT, 'build/bin/outrund');
export const FIXTURES = join(here, 'fixtures');

export function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.unref();
    s.on('error', rej);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

/** A tags file of the tank's tags plus the drills, in a temp dir (returned with the dir). */
export function combinedTags(extra = []) {
  const dir = mkdtempSync(join(tmpdir(), 'outrun-opcua-test-'));
  const file = join(dir, 'tags.toml');
  const parts = [readFileSync(join(ROOT, 'examples/tags/tank.toml'), 'utf8'), readFileSync(join(FIXTURES, 'drills.toml'), 'utf8'), ...extra];
  writeFileSync(file, parts.join('\n'));
  return { dir, file, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Does the outrund here support the tags frames (--tags)? */
export async function daemonSupportsTags() {
  const { connect } = (await import('@outrun/client')).default;
  const dir = mkdtempSync(join(tmpdir(), 'outrun-probe-'));
  const sock = join(dir, 's.sock');
  const tags = join(dir, 't.toml');
  writeFileSync(tags, '[[tag]]\nid = "P"\ninputs = ["Q"]\nscript = "return inputs.Q"\n');
  const child = spawn(OUTRUND, ['--socket', sock, '--tags', tags], { stdio: 'ignore' });
  let why = null;
  let exited = false;
  child.on('exit', () => (exited = true));
  child.on('error', (e) => (why = e.message));
  try {
    const deadline = Date.now() + 10000;
    for (;;) {
      if (why) return why;
      if (exited) return 'outrund exited at start (no --tags option?)';
      try {
        const c = await connect(sock, { reconnect: false, replyTimeoutMs: 3000 });
        try {
          await c.listTags();
          return true;
        } catch (e) {
          return `ListTags: ${e.message}`;
        } finally {
          await c.close();
        }
      } catch {}
      if (Date.now() > deadline) return 'outrund did not answer';
      await new Promise((r) => setTimeout(r, 50));
    }
  } finally {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Starts `node server.mjs` (own outrund); resolves {endpoint, ns, socket, pid, stop()}. */
export async function startServerProcess({ tags, config = join(FIXTURES, 'outrund.toml'), args = [] } = {}) {
  const port = await freePort();
  const a = [join(here, '../server.mjs'), '--port', String(port), ...args];
  if (tags) a.push('--tags', tags);
  if (config) a.push('--config', config);
  const child = spawn(process.execPath, a, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, OUTRUN_OUTRUND: OUTRUND } });
  let out = '';
  let err = '';
  child.stderr.on('data', (d) => (err += d));
  const ready = await new Promise((res, rej) => {
    const t = setTimeout(() => rej(new Error(`server not ready in 60 s:\n${err}`)), 60000);
    child.stdout.on('data', (d) => {
      out += d;
      const m = /outrun OPC UA server ready: (\S+)/.exec(out);
      if (m) {
        clearTimeout(t);
        res(m[1]);
      }
    });
    child.on('exit', (code) => {
      clearTimeout(t);
      rej(new Error(`server exited ${code}:\n${err}`));
    });
  });
  const m = /outrund socket (\S+?)(?:;| pid (\d+);) namespace urn:outrun:tags is ns=(\d+)/.exec(err);
  return {
    endpoint: ready,
    port,
    socket: m ? m[1] : null,
    pid: m && m[2] ? Number(m[2]) : null,
    ns: m ? Number(m[3]) : 2,
    child,
    get stderr() {
      return err;
    },
    async stop() {
      if (child.exitCode !== null) return child.exitCode;
      child.kill('SIGTERM');
      return new Promise((r) => child.once('exit', (code) => r(code)));
    },
  };
}

export async function opcuaSession(endpoint) {
  const client = OPCUAClient.create({
    endpointMustExist: false,
    securityMode: MessageSecurityMode.None,
    securityPolicy: SecurityPolicy.None,
    connectionStrategy: { maxRetry: 2, initialDelay: 100, maxDelay: 500 },
  });
  await client.connect(endpoint);
  const session = await client.createSession();
  return {
    client,
    session,
    async close() {
      await session.close().catch(() => {});
      await client.disconnect().catch(() => {});
    },
  };
}

export async function read(session, ns, id) {
  return session.read({ nodeId: `ns=${ns};s=${id}`, attributeId: AttributeIds.Value });
}

export async function write(session, ns, id, value, statusCode, sourceTimestamp) {
  const dv = { value: { dataType: DataType.Double, value } };
  if (statusCode) dv.statusCode = statusCode;
  if (sourceTimestamp) dv.sourceTimestamp = sourceTimestamp;
  return session.write({ nodeId: `ns=${ns};s=${id}`, attributeId: AttributeIds.Value, value: dv });
}

/** Polls `fn` until it returns a truthy value; throws after `ms` with the last value. */
export async function until(fn, ms = 5000, step = 20) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    last = await fn();
    if (last) return last;
    if (Date.now() > deadline) throw new Error(`condition not met within ${ms} ms (last: ${last})`);
    await new Promise((r) => setTimeout(r, step));
  }
}

export { AttributeIds, DataType, StatusCodes };

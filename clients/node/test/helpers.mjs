// Test support: start a real outrund on a private socket.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const OUTRUND = path.resolve(process.env.OUTRUN_OUTRUND || path.join(here, '..', '..', '..', 'build', 'bin', 'outrund'));

export function requireOutrund() {
  if (!existsSync(OUTRUND))
    throw new Error(`outrund not found at ${OUTRUND}: build the C++ project (scripts/build) or set OUTRUN_OUTRUND`);
  return OUTRUND;
}

export function tempSocket(name = 'd') {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'outrun-node-'));
  return { dir, socket: path.join(dir, `${name}.sock`), cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

function canConnect(p) {
  return new Promise((resolve) => {
    const s = net.createConnection({ path: p });
    s.once('connect', () => { s.destroy(); resolve(true); });
    s.once('error', () => resolve(false));
  });
}

/** Starts outrund on `socket`; resolves once it accepts connections. */
export async function startDaemon(socket, { timeoutMs = 100, extra = [] } = {}) {
  requireOutrund();
  const args = ['--socket', socket, '--shards', '2', '--single-flight', 'off', '--timeout', String(timeoutMs), '--log-level', 'warn', ...extra];
  const child = spawn(OUTRUND, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => { stderr += d; });
  const exited = new Promise((resolve) => child.once('exit', (code, sig) => resolve({ code, sig })));
  const deadline = Date.now() + 15000;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null)
      throw new Error(`outrund exited at start (${child.exitCode ?? child.signalCode}): ${stderr}`);
    if (existsSync(socket) && (await canConnect(socket))) break;
    if (Date.now() > deadline) { child.kill('SIGKILL'); throw new Error(`outrund did not start: ${stderr}`); }
    await new Promise((r) => setTimeout(r, 20));
  }
  return {
    child,
    exited,
    stderr: () => stderr,
    async stop(signal = 'SIGTERM') {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      return exited;
    },
  };
}

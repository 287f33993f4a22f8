#!/usr/bin/env node
// outrun OPC UA server (README.md "OPC UA server"). Usage:
//   node server.mjs [--port 4840] [--host 127.0.0.1] [--security FILE] [--socket PATH] [--tags FILE]
//                   [--config OUTRUND_TOML] [--simulate]
// Without --socket it starts its own outrund (killed on exit). Prints ONE line on stdout when
// ready; everything else (node-opcua's own messages included) goes to stderr. Exit status: 0
// after SIGTERM/SIGINT, 1 when it cannot start, 2 for a bad command line or security file.
import { parseArgs } from 'node:util';
import { isIP } from 'node:net';

// node-opcua writes its warnings to stdout: keep stdout for the ready line only.
const stdoutWrite = process.stdout.write.bind(process.stdout);
process.stdout.write = (chunk, enc, cb) => process.stderr.write(chunk, enc, cb);
process.stdout.on('error', () => {}); // a reader that went away (EPIPE) does not stop the server

const usage = (msg) => {
  process.stderr.write(`opcua-server: ${msg}\n`);
  process.exit(2);
};
let values;
try {
  ({ values } = parseArgs({
    options: {
      port: { type: 'string', default: '4840' },
      // The address listened on: localhost unless told otherwise (0.0.0.0 or :: for every one).
      host: { type: 'string', default: '127.0.0.1' },
      // Security and limits (security.mjs, README.md "Security"); without it: every endpoint,
      // anonymous allowed, on localhost only.
      security: { type: 'string' },
      socket: { type: 'string' },
      tags: { type: 'string' },
      config: { type: 'string' },
      outrund: { type: 'string' },
      simulate: { type: 'boolean', default: false },
      // While outrund is unreachable, virtual tags show UncertainNoCommunicationLastUsableValue for
      // this long, then BadNoCommunication.
      'no-communication-ms': { type: 'string', default: '10000' },
    },
  }));
} catch (e) {
  usage(e.message);
}
if (!/^\d+$/.test(values.port) || Number(values.port) > 65535) usage(`bad --port ${values.port}`);
if (!isIP(values.host) && values.host !== 'localhost') usage(`bad --host ${values.host}: an IPv4 or IPv6 address`);

// The security file is checked before node-opcua loads (seconds): a bad one fails at once.
const { loadSecurityFile, SecurityConfigError } = await import('./security-config.mjs');
let security;
if (values.security) {
  try {
    security = loadSecurityFile(values.security);
  } catch (e) {
    if (e instanceof SecurityConfigError) usage(e.message);
    throw e;
  }
}
const { startServer } = await import('./lib.mjs');

let state;
let stopping = false;
let serving = false;
// One client's request never ends the server: an exception nobody caught, or a promise nobody
// awaited, is logged (at most 10 a minute, then counted) and the server keeps serving. Before
// it is ready, the same is a failed start: exit 1.
const faults = { windowStart: Date.now(), inWindow: 0, suppressed: 0 };
function onFault(kind, err) {
  if (!serving) {
    process.stderr.write(`opcua-server: ${kind} while starting: ${err && err.stack ? err.stack : err}\n`);
    stop(1);
    return;
  }
  const now = Date.now();
  if (now - faults.windowStart > 60000) {
    if (faults.suppressed) process.stderr.write(`opcua-server: ${faults.suppressed} more uncaught errors in the last minute (not shown)\n`);
    faults.windowStart = now;
    faults.inWindow = 0;
    faults.suppressed = 0;
  }
  if (++faults.inWindow > 10) {
    faults.suppressed++;
    return;
  }
  process.stderr.write(`opcua-server: ${kind} (server kept serving): ${err && err.stack ? err.stack : err}\n`);
}
process.on('uncaughtException', (e) => onFault('uncaught exception', e));
process.on('unhandledRejection', (e) => onFault('unhandled rejection', e));
async function stop(code) {
  if (stopping) return;
  stopping = true;
  try {
    if (state) await state.stop();
  } finally {
    process.exit(code);
  }
}
process.on('SIGTERM', () => stop(0));
process.on('SIGINT', () => stop(0));

try {
  state = await startServer({
    port: Number(values.port),
    host: values.host,
    security,
    socket: values.socket,
    tags: values.tags,
    config: values.config,
    outrund: values.outrund,
    simulate: values.simulate,
    noCommunicationMs: Number(values['no-communication-ms']),
  });
  if (stopping) await state.stop();
  else {
    process.stderr.write(`opcua-server: outrund socket ${state.socket}${state.daemon ? ` pid ${state.daemon.pid}` : ''}; namespace urn:outrun:tags is ns=${state.nsIndex}\n`);
    serving = true;
    stdoutWrite(`outrun OPC UA server ready: ${state.endpoint}\n`);
  }
} catch (e) {
  process.stderr.write(`opcua-server: ${e && e.stack ? e.stack : e}\n`);
  await stop(1);
}

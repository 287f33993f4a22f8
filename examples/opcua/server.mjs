#!/usr/bin/env node
// outrun OPC UA server (README.md "OPC UA server"). Usage:
//   node server.mjs [--port 4840] [--socket PATH] [--tags FILE] [--config OUTRUND_TOML] [--simulate]
// Without --socket it starts its own outrund (killed on exit). Prints ONE line on stdout when
// ready; everything else (node-opcua's own messages included) goes to stderr.
import { parseArgs } from 'node:util';

// node-opcua writes its warnings to stdout: keep stdout for the ready line only.
const stdoutWrite = process.stdout.write.bind(process.stdout);
process.stdout.write = (chunk, enc, cb) => process.stderr.write(chunk, enc, cb);
process.stdout.on('error', () => {}); // a reader that went away (EPIPE) does not stop the server

const { values } = parseArgs({
  options: {
    port: { type: 'string', default: '4840' },
    socket: { type: 'string' },
    tags: { type: 'string' },
    config: { type: 'string' },
    outrund: { type: 'string' },
    simulate: { type: 'boolean', default: false },
    // While outrund is unreachable, virtual tags show UncertainNoCommunicationLastUsableValue for
    // this long, then BadNoCommunication.
    'no-communication-ms': { type: 'string', default: '10000' },
  },
});

const { startServer } = await import('./lib.mjs');
let state;
let stopping = false;
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
    stdoutWrite(`outrun OPC UA server ready: ${state.endpoint}\n`);
  }
} catch (e) {
  process.stderr.write(`opcua-server: ${e && e.stack ? e.stack : e}\n`);
  await stop(1);
}

// Tag state across a kill -9 of outrund, through this client (design/daemon.md "State store").
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { connect, STATUS_CODES } from '../dist/index.js';
import { startDaemon, tempSocket } from './helpers.mjs';

const TOTALIZER = `
[[tag]]
id = "total"
type = "Double"
inputs = ["pulses"]
keep_state = true
script = '''
state.sum = (state.sum or 0) + inputs.pulses
return state.sum
'''
`;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitFor(pred, ms = 10000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await pred();
    if (v) return v;
    if (Date.now() > end) throw new Error('timed out');
    await sleep(10);
  }
}

describe('tags: state_dir', async () => {
  test('a keep_state totalizer keeps counting across kill -9 of outrund', async () => {
    const tmp = tempSocket('state');
    const extra = ['--state-dir', path.join(tmp.dir, 'state'), '--state-flush-ms', '20'];
    let daemon = await startDaemon(tmp.socket, { extra });
    let client;
    try {
      client = await connect(tmp.socket, { name: 'node-state-test', replyTimeoutMs: 5000 });
      await client.defineTags(TOTALIZER);
      for (const p of [1, 2, 3]) {
        await client.updateSources([{ tag: 'pulses', value: p }]);
        await waitFor(async () => (await client.readTags(['total']))[0].value === (p * (p + 1)) / 2);
      }
      await sleep(300); // > state_flush_ms: committed
      await client.close();
      client = undefined;
      const end = await daemon.stop('SIGKILL');
      assert.equal(end.sig, 'SIGKILL');

      daemon = await startDaemon(tmp.socket, { extra });
      client = await connect(tmp.socket, { name: 'node-state-test', replyTimeoutMs: 5000 });
      await client.defineTags(TOTALIZER);
      const [restored] = await client.readTags(['total']);
      assert.equal(restored.status, STATUS_CODES.UncertainLastUsableValue);
      assert.equal(restored.value, 6);
      await client.updateSources([{ tag: 'pulses', value: 4 }]);
      const [next] = await waitFor(async () => {
        const v = await client.readTags(['total']);
        return v[0].status === 0 ? v : null;
      });
      assert.equal(next.value, 10, 'counted on from the restored state');
    } finally {
      await client?.close();
      await daemon.stop();
      tmp.cleanup();
    }
  });
});

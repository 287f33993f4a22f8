// SIGHUP to outrund with a changed tags file changes what OPC UA clients see; a broken file
// changes nothing.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { combinedTags, daemonSupportsTags, startServerProcess, opcuaSession, read, write, until } from './helpers.mjs';

const support = await daemonSupportsTags();
const skip = support === true ? false : `outrund does not support the tags frames yet (${support})`;

let srv, ua, tags;
after(async () => {
  if (ua) await ua.close();
  if (srv) await srv.stop();
  if (tags) tags.cleanup();
});

test('SIGHUP reload: a changed file changes the results, a broken one changes nothing', { skip }, async () => {
  tags = combinedTags();
  srv = await startServerProcess({ tags: tags.file });
  assert.ok(srv.pid, 'the server says its outrund pid');
  const ns = srv.ns;
  ua = await opcuaSession(srv.endpoint);
  await write(ua.session, ns, 'Tank1.LevelRaw', 2047.5);
  await until(async () => (await read(ua.session, ns, 'Tank1.Volume')).value.value === 6);

  const text = readFileSync(tags.file, 'utf8');
  const changed = text.replace('script = "return inputs.level / 100 * 12"', 'script = "return inputs.level / 100 * 24"');
  assert.notEqual(changed, text);
  writeFileSync(tags.file, changed);
  process.kill(srv.pid, 'SIGHUP');
  await until(async () => (await read(ua.session, ns, 'Tank1.Volume')).value.value === 12, 5000);

  writeFileSync(tags.file, changed.replace('[[tag]]\nid = "Tank1.Volume"', '[[tag]\nid = "Tank1.Volume"'));
  process.kill(srv.pid, 'SIGHUP');
  await new Promise((r) => setTimeout(r, 500));
  assert.equal((await read(ua.session, ns, 'Tank1.Volume')).value.value, 12);
  await write(ua.session, ns, 'Tank1.LevelRaw', 4095);
  await until(async () => (await read(ua.session, ns, 'Tank1.Volume')).value.value === 24, 3000);
  assert.equal((await read(ua.session, ns, 'Tank1.Volume')).statusCode.value, 0);
});

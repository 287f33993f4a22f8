// End-to-end with a node-opcua client: sources typed by their [[source]] declaration (writes of
// another type, rank or range refused, nothing changed), declared initial values, read-only
// sources, and [[alarm]]s (a limit alarm active, acknowledged, confirmed, shelved, its quality
// from its input, ConditionRefresh), all following a SIGHUP reload.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  AttributeIds,
  DataType,
  Variant,
  VariantArrayType,
  StatusCodes,
  LocalizedText,
  coerceNodeId,
  ClientSubscription,
  ClientMonitoredItem,
  TimestampsToReturn,
  constructEventFilter,
} from 'node-opcua';
import { FIXTURES, combinedTags, daemonSupportsTags, startServerProcess, opcuaSession, read, until } from './helpers.mjs';

const support = await daemonSupportsTags();
const skip = support === true ? false : `outrund does not support the tags frames yet (${support})`;

let srv, ua, tags, ns;
before(async () => {
  if (skip) return;
  tags = combinedTags([readFileSync(join(FIXTURES, 'typed.toml'), 'utf8')]);
  srv = await startServerProcess({ tags: tags.file });
  ns = srv.ns;
  ua = await opcuaSession(srv.endpoint);
});
after(async () => {
  if (ua) await ua.close();
  if (srv) await srv.stop();
  if (tags) tags.cleanup();
});

const put = (id, dataType, value, arrayType = VariantArrayType.Scalar, statusCode) =>
  ua.session.write({
    nodeId: `ns=${ns};s=${id}`,
    attributeId: AttributeIds.Value,
    value: { value: new Variant({ dataType, arrayType, value }), ...(statusCode ? { statusCode } : {}) },
  });
const value = async (id) => (await read(ua.session, ns, id)).value.value;
const attr = async (nodeId, attributeId) => (await ua.session.read({ nodeId, attributeId })).value.value;

async function child(start, path) {
  const r = await ua.session.translateBrowsePath({
    startingNode: coerceNodeId(start),
    relativePath: { elements: path.map((p) => ({ referenceTypeId: coerceNodeId('i=33'), isInverse: false, includeSubtypes: true, targetName: { namespaceIndex: 0, name: p } })) },
  });
  if (r.statusCode.value !== 0) return null;
  return r.targets[0].targetId;
}

test('typed sources: the declared DataType and rank, the EURange, read-only and initial values', { skip }, async () => {
  // A Boolean source: a Double (0.0, truthy in Lua) is refused; true/false count starts.
  assert.equal(await attr(`ns=${ns};s=Typed.Running`, AttributeIds.DataType).then((d) => d.value), DataType.Boolean);
  assert.equal((await put('Typed.Running', DataType.Double, 0)).value, StatusCodes.BadTypeMismatch.value);
  assert.equal((await put('Typed.Running', DataType.Boolean, true)).value, 0);
  await until(async () => (await value('Typed.Starts')) === 1);
  assert.equal((await put('Typed.Running', DataType.Boolean, false)).value, 0);
  assert.equal((await put('Typed.Running', DataType.Boolean, true)).value, 0);
  await until(async () => (await value('Typed.Starts')) === 2);
  assert.equal(await value('Typed.Running'), true, 'the source reads back as a Boolean');

  // A Double with an EURange (an AnalogItem): outside it BadOutOfRange, an array
  // BadTypeMismatch; nothing changed.
  assert.ok(await child(`ns=${ns};s=Typed.LevelPct`, ['EURange']), 'EURange property');
  assert.equal((await put('Typed.LevelPct', DataType.Double, 40)).value, 0);
  await until(async () => (await value('Typed.Level')) === 40);
  assert.equal((await put('Typed.LevelPct', DataType.Double, 150)).value, StatusCodes.BadOutOfRange.value);
  assert.equal((await put('Typed.LevelPct', DataType.Double, [1, 2], VariantArrayType.Array)).value, StatusCodes.BadTypeMismatch.value);
  assert.equal((await put('Typed.LevelPct', DataType.Float, 41)).value, StatusCodes.BadTypeMismatch.value);
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(await value('Typed.Level'), 40, 'refused writes changed nothing');
  assert.equal(await value('Typed.LevelPct'), 40);

  // An array source: a scalar is refused, an array goes through.
  assert.equal(await attr(`ns=${ns};s=Typed.Window`, AttributeIds.ValueRank), 1);
  assert.equal((await put('Typed.Window', DataType.Double, 3)).value, StatusCodes.BadTypeMismatch.value);
  assert.equal((await put('Typed.Window', DataType.Double, [1, 2, 3.5], VariantArrayType.Array)).value, 0);
  await until(async () => (await value('Typed.WindowSum')) === 6.5);

  // A declared initial value: in outrund at start, without any write.
  assert.equal(await value('Typed.Initial'), 21);
  await until(async () => (await value('Typed.FromInitial')) === 42);

  // writable = false: read-only to OPC UA clients.
  assert.equal((await put('Typed.Setpoint', DataType.Double, 1)).value, StatusCodes.BadNotWritable.value);

  // An undeclared source keeps the Double behaviour.
  assert.equal((await put('Test.InTypes', DataType.Double, 3.7)).value, 0);
  await until(async () => (await value('Test.Int')) === 3);
});

test('a declared limit alarm: active, acknowledged, confirmed, shelved, quality from its input, back to normal', { skip }, async () => {
  const cond = `ns=${ns};s=Alarm.Typed.LevelAlarm`;
  const activeId = await child(cond, ['ActiveState', 'Id']);
  const ackedId = await child(cond, ['AckedState', 'Id']);
  const confirmedId = await child(cond, ['ConfirmedState', 'Id']);
  const limitState = await child(cond, ['LimitState', 'CurrentState']);
  const quality = await child(cond, ['Quality']);
  const severity = await child(cond, ['Severity']);
  const eventIdNode = await child(cond, ['EventId']);
  const shelving = await child(cond, ['ShelvingState']);
  const shelve = await child(cond, ['ShelvingState', 'OneShotShelve']);
  const unshelve = await child(cond, ['ShelvingState', 'Unshelve']);
  const shelved = await child(cond, ['SuppressedOrShelved']);
  for (const n of [activeId, ackedId, confirmedId, limitState, quality, severity, eventIdNode, shelve, unshelve, shelved]) assert.ok(n, 'condition member');
  const val = async (n) => attr(n, AttributeIds.Value);

  // Events on the Server object: ConditionRefresh sends this condition's state again.
  const sub = ClientSubscription.create(ua.session, { requestedPublishingInterval: 50, requestedLifetimeCount: 1000, requestedMaxKeepAliveCount: 20, maxNotificationsPerPublish: 100, publishingEnabled: true, priority: 1 });
  await new Promise((r) => sub.once('started', r));
  const events = [];
  const fields = ['ConditionName', 'Severity', 'Quality', 'Message', 'EventType'];
  const item = ClientMonitoredItem.create(sub, { nodeId: 'i=2253', attributeId: AttributeIds.EventNotifier }, { samplingInterval: 0, queueSize: 100, filter: constructEventFilter(fields) }, TimestampsToReturn.Neither);
  item.on('changed', (ev) => events.push(Object.fromEntries(fields.map((f, i) => [f, ev[i]?.value]))));
  await new Promise((r) => item.once('initialized', r));

  await put('Typed.LevelPct', DataType.Double, 50);
  await until(async () => (await value('Typed.Level')) === 50);
  assert.equal(await val(activeId), false);
  await put('Typed.LevelPct', DataType.Double, 85);
  await until(async () => (await val(activeId)) === true, 5000);
  assert.equal((await val(limitState)).text, 'High');
  assert.equal(await val(severity), 800);
  assert.equal(await val(ackedId), false);
  await until(() => events.some((e) => e.ConditionName === 'Typed.LevelAlarm' && e.Severity === 800 && /typed level: High/.test(e.Message?.text)), 3000);

  // Acknowledge, then Confirm (AcknowledgeableConditionType's methods).
  const comment = new Variant({ dataType: DataType.LocalizedText, value: new LocalizedText({ text: 'seen' }) });
  let eventId = await val(eventIdNode);
  let r = await ua.session.call({ objectId: coerceNodeId(cond), methodId: coerceNodeId('i=9111'), inputArguments: [new Variant({ dataType: DataType.ByteString, value: eventId }), comment] });
  assert.equal(r.statusCode.value, 0, `Acknowledge: ${r.statusCode.toString()}`);
  await until(async () => (await val(ackedId)) === true, 2000);
  eventId = await val(eventIdNode);
  r = await ua.session.call({ objectId: coerceNodeId(cond), methodId: coerceNodeId('i=9113'), inputArguments: [new Variant({ dataType: DataType.ByteString, value: eventId }), comment] });
  assert.equal(r.statusCode.value, 0, `Confirm: ${r.statusCode.toString()}`);
  await until(async () => (await val(confirmedId)) === true, 2000);

  // Shelving: OneShotShelve, then Unshelve.
  r = await ua.session.call({ objectId: shelving, methodId: shelve, inputArguments: [] });
  assert.equal(r.statusCode.value, 0, `OneShotShelve: ${r.statusCode.toString()}`);
  await until(async () => (await val(shelved)) === true, 2000);
  r = await ua.session.call({ objectId: shelving, methodId: unshelve, inputArguments: [] });
  assert.equal(r.statusCode.value, 0, `Unshelve: ${r.statusCode.toString()}`);
  await until(async () => (await val(shelved)) === false, 2000);

  // ConditionRefresh: the condition's state comes again.
  const n0 = events.length;
  r = await ua.session.call({ objectId: coerceNodeId('i=2782'), methodId: coerceNodeId('i=3875'), inputArguments: [new Variant({ dataType: DataType.UInt32, value: sub.subscriptionId })] });
  assert.equal(r.statusCode.value, 0, `ConditionRefresh: ${r.statusCode.toString()}`);
  await until(() => events.slice(n0).some((e) => e.ConditionName === 'Typed.LevelAlarm'), 3000);

  // The input goes Bad: the alarm's quality is no longer Good (and says which), Good again after.
  await put('Typed.LevelPct', DataType.Double, 60, VariantArrayType.Scalar, StatusCodes.BadSensorFailure);
  await until(async () => ((await read(ua.session, ns, 'Typed.Level')).statusCode.value >>> 0) === StatusCodes.BadSensorFailure.value);
  const code = (x) => (x && typeof x === 'object' ? x.value : x) >>> 0; // a StatusCode's number
  await until(async () => code(await val(quality)) === StatusCodes.BadSensorFailure.value, 3000);
  await until(() => events.some((e) => e.ConditionName === 'Typed.LevelAlarm' && code(e.Quality) === StatusCodes.BadSensorFailure.value), 3000);
  await put('Typed.LevelPct', DataType.Double, 50);
  await until(async () => code(await val(quality)) === 0, 3000);
  await until(async () => (await val(activeId)) === false, 3000);
  await sub.terminate();
});

test('a reload removes and adds alarms and retypes a source', { skip }, async () => {
  const cond = `ns=${ns};s=Alarm.Typed.LevelAlarm`;
  const browseName = async (n) => (await ua.session.read({ nodeId: n, attributeId: AttributeIds.BrowseName })).statusCode.value >>> 0;
  assert.equal(await browseName(cond), 0);
  const text = readFileSync(tags.file, 'utf8');
  // The alarm removed, the Window source retyped to Float[].
  const without = text.slice(0, text.indexOf('[[alarm]]\nid = "Typed.LevelAlarm"')).replace('id = "Typed.Window"\ntype = "Double[]"', 'id = "Typed.Window"\ntype = "Float[]"');
  assert.notEqual(without, text);
  writeFileSync(tags.file, without);
  process.kill(srv.pid, 'SIGHUP');
  await until(async () => (await browseName(cond)) === StatusCodes.BadNodeIdUnknown.value, 5000, 100);
  await until(async () => (await attr(`ns=${ns};s=Typed.Window`, AttributeIds.DataType))?.value === DataType.Float, 5000, 100);
  assert.equal((await put('Typed.Window', DataType.Double, [1, 2], VariantArrayType.Array)).value, StatusCodes.BadTypeMismatch.value);
  assert.equal((await put('Typed.Window', DataType.Float, [1, 2], VariantArrayType.Array)).value, 0);
  await until(async () => (await value('Typed.WindowSum')) === 3);
  // Back: the alarm again, working.
  writeFileSync(tags.file, text);
  process.kill(srv.pid, 'SIGHUP');
  await until(async () => (await browseName(cond)) === 0, 5000, 100);
  const activeId = await child(cond, ['ActiveState', 'Id']);
  await put('Typed.LevelPct', DataType.Double, 97);
  await until(async () => (await attr(activeId, AttributeIds.Value)) === true, 5000);
});

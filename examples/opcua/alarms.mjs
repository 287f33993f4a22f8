// Alarms declared in the tags file ([[alarm]], design/tags.md "Sources and alarms"), as OPC UA
// Part 9 conditions: an ExclusiveLevelAlarm for a limit alarm on a numeric tag, an
// OffNormalAlarm for a Boolean one. Each has Acknowledge, Confirm and Shelving (node-opcua's),
// answers ConditionRefresh, takes its input tag's quality, and follows reloads (syncAlarms).
import { DataType, StatusCodes, ConditionInfo } from 'node-opcua';

const GOOD = StatusCodes.Good;

/** The condition's node id (`Alarm.` + its id) and its source object's (`Alarms.` + its tag). */
export const alarmNodeId = (id) => `s=Alarm.${id}`;
const sourceNodeId = (tag) => `s=Alarms.${tag}`;

function inputOf(state, tag) {
  return state.virtual.get(tag)?.variable ?? state.sources.get(tag)?.variable ?? null;
}

/** The quality a condition takes from its input's StatusCode: Good, or the input's own code. */
const qualityOf = (sc) => (sc.value >>> 30 === 0 ? GOOD : sc);

function addAlarm(state, decl) {
  const input = inputOf(state, decl.tag);
  if (!input) {
    state.log(`alarm '${decl.id}': no tag '${decl.tag}' in the address space; not created`);
    return null;
  }
  const ns = state.ns;
  const as = state.server.engine.addressSpace;
  let source = as.findNode(`ns=${state.nsIndex};${sourceNodeId(decl.tag)}`);
  if (!source) {
    source = ns.addObject({
      organizedBy: state.alarmsFolder,
      browseName: decl.tag,
      nodeId: sourceNodeId(decl.tag),
      eventSourceOf: as.rootFolder.objects.server,
      eventNotifier: 1,
    });
  }
  const common = {
    browseName: decl.id,
    nodeId: alarmNodeId(decl.id),
    componentOf: source,
    conditionSource: source,
    conditionName: decl.id,
    inputNode: input,
    optionals: ['ConfirmedState', 'Confirm', 'ShelvingState'],
    maxTimeShelved: decl.max_shelved_ms ?? 3600000, // a one-shot shelve ends after it
  };
  let cond;
  let normal = null;
  if (decl.kind === 'limit') {
    const limits = {};
    if (decl.high_high !== undefined) limits.highHighLimit = decl.high_high;
    if (decl.high !== undefined) limits.highLimit = decl.high;
    if (decl.low !== undefined) limits.lowLimit = decl.low;
    if (decl.low_low !== undefined) limits.lowLowLimit = decl.low_low;
    cond = ns.instantiateExclusiveLimitAlarm('ExclusiveLevelAlarmType', { ...common, ...limits });
  } else {
    normal = ns.addVariable({
      componentOf: source,
      browseName: `${decl.id}.NormalState`,
      nodeId: `s=Alarm.${decl.id}.NormalState`,
      dataType: 'Boolean',
      accessLevel: 'CurrentRead',
      userAccessLevel: 'CurrentRead',
      value: { dataType: DataType.Boolean, value: decl.normal === true },
    });
    cond = ns.instantiateOffNormalAlarm({ ...common, normalState: normal });
  }
  const entry = { decl, key: JSON.stringify(decl), cond, normal, source, input, dead: false, quality: GOOD };
  // The message and severity are the declaration's; the quality is the input's.
  cond.calculateConditionInfo = (stateName, isActive, value) =>
    new ConditionInfo({
      message: isActive
        ? `${decl.message ?? decl.id}: ${stateName ?? 'active'}${value !== undefined && stateName ? ` (${value})` : ''}`
        : `${decl.message ?? decl.id}: back to normal`,
      quality: entry.quality,
      retain: isActive || cond.currentBranch().getAckedState() === false,
      severity: isActive ? decl.severity : 0,
    });
  // node-opcua raises from the input's value_changed listener, which also feeds subscribers: an
  // exception there (it throws when nothing changed, e.g. Bad after Bad) must not escape, nor may
  // a removed alarm react (its listener stays on the input).
  const onInput = cond._onInputDataValueChange.bind(cond);
  cond._onInputDataValueChange = (dv) => {
    if (entry.dead) return;
    try {
      onInput(dv);
    } catch {}
  };
  // node-opcua clears Retain on Confirm even while the alarm is active; an active alarm stays
  // retained (Part 9 5.5.2: ConditionRefresh must send it again).
  cond.on('confirmed', (_id, _comment, branch) => {
    if (!entry.dead && cond.activeState.getValue()) branch.setRetain(true);
  });
  cond.setEnabledState(true);
  cond.currentBranch().setSeverity(decl.severity);
  state.alarms.set(decl.id, entry);
  return entry;
}

function removeAlarm(state, entry) {
  entry.dead = true;
  const as = state.server.engine.addressSpace;
  try {
    as.deleteNode(entry.cond);
    if (entry.normal) as.deleteNode(entry.normal);
  } catch (e) {
    state.log(`alarm '${entry.decl.id}': ${e?.message ?? e} while removing it`);
  }
  state.alarms.delete(entry.decl.id);
  // The source object goes with its last alarm.
  if (![...state.alarms.values()].some((a) => a.source === entry.source)) {
    try {
      as.deleteNode(entry.source);
    } catch {}
  }
}

/**
 * Makes the alarms match the declarations (ListTags' `alarms`): a new one is created, a removed
 * one deleted, a changed one (or one whose input variable was made again) made again. Returns
 * the number of alarms added or removed.
 */
export function syncAlarms(state, decls) {
  let n = 0;
  const want = new Map((decls ?? []).map((a) => [a.id, a]));
  for (const [id, e] of [...state.alarms]) {
    const w = want.get(id);
    if (w && JSON.stringify(w) === e.key && inputOf(state, w.tag) === e.input) continue;
    removeAlarm(state, e);
    n++;
  }
  for (const decl of want.values()) {
    if (state.alarms.has(decl.id)) continue;
    try {
      if (addAlarm(state, decl)) n++;
    } catch (e) {
      state.log(`alarm '${decl.id}' not created: ${e?.message ?? e}`);
    }
  }
  return n;
}

/**
 * Before a tag's new DataValue is set: its alarms take its quality (Good, or its Uncertain/Bad
 * code; `statusCode`: a node-opcua StatusCode). A change of quality alone raises an event (the
 * limit alarm's own state change, when there is one, raises another with the same quality).
 */
export function alarmQuality(state, tag, statusCode) {
  if (!state.alarms.size) return;
  for (const e of state.alarms.values()) {
    if (e.decl.tag !== tag || e.dead) continue;
    const q = qualityOf(statusCode);
    if (q.value === e.quality.value) continue;
    e.quality = q;
    try {
      const branch = e.cond.currentBranch();
      branch.setQuality(q);
      e.cond.raiseNewBranchState(branch);
    } catch (err) {
      state.log(`alarm '${e.decl.id}': ${err?.message ?? err} while setting its quality`);
    }
  }
}

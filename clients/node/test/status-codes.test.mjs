// STATUS_CODES (generated at build time by scripts/status-codes.mjs) against the OPC Foundation's
// list it is generated from, host/tags/StatusCode.csv, read here directly.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { STATUS_CODES, statusCodeName, toStatusCode } from '../dist/index.js';

const csvPath = fileURLToPath(new URL('../../../host/tags/StatusCode.csv', import.meta.url));

test('every StatusCode of StatusCode.csv, by name and by code', () => {
  const csv = new Map([['Good', 0], ['Uncertain', 0x40000000], ['Bad', 0x80000000]]);
  for (const line of readFileSync(csvPath, 'utf8').split(/\r?\n/)) {
    if (line === '') continue;
    const [name, hex] = line.split(',');
    csv.set(name, Number.parseInt(hex, 16));
  }
  assert.ok(csv.size > 250);
  assert.equal(Object.keys(STATUS_CODES).length, csv.size);
  for (const [name, code] of csv) {
    assert.equal(STATUS_CODES[name], code, name);
    assert.equal(toStatusCode(name), code, name);
    assert.equal(statusCodeName(code), name, name);
  }
  assert.equal(toStatusCode('BadOutOfService'), 0x808d0000);
  assert.equal(toStatusCode('UncertainNoCommunicationLastUsableValue'), 0x408f0000);
  assert.equal(statusCodeName(0x808a0000), 'BadNotConnected');
  assert.equal(statusCodeName(0x808a0001), undefined);
  for (const notACode of ['NoSuchCode', 'toString', '__proto__', 'constructor', 'badtimeout'])
    assert.throws(() => toStatusCode(notACode), RangeError, notACode);
});

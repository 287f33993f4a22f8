// The security file of the OPC UA server (`server.mjs --security FILE`, README.md "Security"):
// its keys, their defaults, and the checks that turn a bad file into one clear message (exit 2)
// before anything starts. No node-opcua here: a bad file is refused in milliseconds.
import { existsSync, readFileSync } from 'node:fs';
import { dirname, resolve, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadUsersSync } from './users.mjs';

const here = dirname(fileURLToPath(import.meta.url));
export const DEFAULT_PKI_DIR = join(here, 'pki');

export const MODES = ['None', 'Sign', 'SignAndEncrypt'];
// The policies node-opcua 2.182 implements that are not deprecated (Basic128Rsa15 and Basic256
// use SHA-1; OPC UA 1.04 deprecated them).
export const POLICIES = ['Basic256Sha256', 'Aes128_Sha256_RsaOaep', 'Aes256_Sha256_RsaPss'];

/** The `limits` of a security file, with their defaults (also what applies without a file). */
export const DEFAULT_LIMITS = Object.freeze({
  // node-opcua's serverCapabilities.maxSessions: every session, whoever opened it.
  max_sessions: 100,
  // Of max_sessions, kept for authenticated users: anonymous sessions may take the rest only
  // (0 when there is no users_file).
  reserved_for_users: 10,
  // One address (a host, or a NAT in front of many) may hold this many sessions, activated or not.
  max_sessions_per_address: 50,
  // ... and this many activated anonymous ones.
  max_anonymous_sessions_per_address: 20,
  // The longest session timeout a client may ask for: a session silent this long is closed.
  // (node-opcua's own cap is 50 minutes.)
  max_session_timeout_ms: 120000,
  max_subscriptions_per_session: 10,
  // Monitored items per session and in all. The total stays below 5,000, the listener count at
  // which one node of node-opcua makes Node.js print a warning (that warning crashed the server
  // before: issue 29 item 15).
  max_monitored_items_per_session: 1000,
  max_monitored_items: 4000,
  // TCP connections (secure channels) on the endpoint; node-opcua closes the oldest one without a
  // session first when full.
  max_connections: 100,
  // ... of which one address may hold this many (a connection past it is closed at once).
  max_connections_per_address: 50,
});

/** Checks a `limits` object (unknown keys, non-integers); returns it with the defaults filled in. */
export function checkLimits(given) {
  if (!given || typeof given !== 'object' || Array.isArray(given)) throw new Error('"limits" must be an object');
  for (const k of Object.keys(given)) if (!Object.hasOwn(DEFAULT_LIMITS, k)) throw new Error(`unknown key "limits.${k}" (known: ${Object.keys(DEFAULT_LIMITS).join(', ')})`);
  const l = { ...DEFAULT_LIMITS, ...given };
  for (const [k, v] of Object.entries(l)) {
    const min = k === 'reserved_for_users' ? 0 : 1;
    if (!Number.isSafeInteger(v) || v < min) throw new Error(`"limits.${k}" must be an integer >= ${min} (got ${JSON.stringify(v)})`);
  }
  if (l.max_connections_per_address > l.max_connections) throw new Error('"limits.max_connections_per_address" must not be above "limits.max_connections"');
  if (l.max_session_timeout_ms < 1000) throw new Error('"limits.max_session_timeout_ms" must be at least 1000');
  if (l.max_monitored_items >= 5000) throw new Error('"limits.max_monitored_items" must be below 5000 (node-opcua warns past 5000 listeners on one node)');
  return l;
}

/** A security file that cannot be used: server.mjs prints the message and exits 2. */
export class SecurityConfigError extends Error {}

// A security file's keys and their defaults. A file states a choice, so what it leaves out is the
// secure choice: no None endpoint, no anonymous sessions, no anonymous writes, no client
// certificate trusted unless an operator moved it to trusted/.
const FILE_DEFAULTS = {
  pki_dir: null, // relative to the file; null: examples/opcua/pki
  modes: ['Sign', 'SignAndEncrypt'],
  policies: [...POLICIES],
  allow_anonymous: false,
  anonymous_write: false,
  users_file: null, // relative to the file
  auto_accept_client_certs: false,
  limits: {},
};

/** What the server does without --security: today's easy behaviour (and the limits' defaults). */
export const EASY = Object.freeze({
  easy: true,
  pkiDir: null, // node-opcua's own per-user folder, as before
  modes: null, // node-opcua's defaults: None, Sign, SignAndEncrypt
  policies: null,
  allowAnonymous: true,
  anonymousWrite: true,
  usersFile: null,
  autoAccept: false,
  limits: { ...DEFAULT_LIMITS, reserved_for_users: 0 }, // no users to keep sessions for
});

function fail(file, msg) {
  throw new SecurityConfigError(`security file ${file}: ${msg}`);
}

const isStringArray = (x) => Array.isArray(x) && x.every((s) => typeof s === 'string');

/** Reads and checks a security file; throws SecurityConfigError naming the first problem. */
export function loadSecurityFile(file) {
  let text;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    fail(file, `cannot read it (${e.code ?? e.message})`);
  }
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    fail(file, `not JSON (${e.message})`);
  }
  return checkSecurity(doc, file);
}

/** Checks a parsed security document (see FILE_DEFAULTS); returns the resolved configuration. */
export function checkSecurity(doc, file = '(inline)') {
  if (!doc || typeof doc !== 'object' || Array.isArray(doc)) fail(file, 'expected a JSON object');
  for (const k of Object.keys(doc)) if (!Object.hasOwn(FILE_DEFAULTS, k)) fail(file, `unknown key "${k}" (known: ${Object.keys(FILE_DEFAULTS).join(', ')})`);
  const d = { ...FILE_DEFAULTS, ...doc };
  const base = file === '(inline)' ? process.cwd() : dirname(resolve(file));
  for (const k of ['pki_dir', 'users_file']) if (d[k] !== null && (typeof d[k] !== 'string' || !d[k])) fail(file, `"${k}" must be a path (a non-empty string)`);
  for (const k of ['allow_anonymous', 'anonymous_write', 'auto_accept_client_certs']) if (typeof d[k] !== 'boolean') fail(file, `"${k}" must be true or false`);
  if (!isStringArray(d.modes) || !d.modes.length) fail(file, `"modes" must be a non-empty array of ${MODES.join(', ')}`);
  for (const m of d.modes) if (!MODES.includes(m)) fail(file, `unknown mode "${m}" in "modes" (known: ${MODES.join(', ')})`);
  if (new Set(d.modes).size !== d.modes.length) fail(file, '"modes" lists a mode twice');
  if (!isStringArray(d.policies)) fail(file, `"policies" must be an array of ${POLICIES.join(', ')}`);
  for (const p of d.policies) if (!POLICIES.includes(p)) fail(file, `unknown policy "${p}" in "policies" (supported: ${POLICIES.join(', ')})`);
  const secure = d.modes.some((m) => m !== 'None');
  if (secure && !d.policies.length) fail(file, '"policies" is empty but "modes" has Sign or SignAndEncrypt');
  if (d.users_file !== null && !d.policies.length) fail(file, '"users_file" needs a policy in "policies" (passwords are encrypted with one, even on a None endpoint)');
  if (!d.allow_anonymous && d.users_file === null) fail(file, 'nobody could open a session: "allow_anonymous" is false and there is no "users_file"');
  if (d.anonymous_write && !d.allow_anonymous) fail(file, '"anonymous_write" is true but "allow_anonymous" is false');
  let limits;
  try {
    limits = checkLimits(d.limits);
  } catch (e) {
    fail(file, e.message);
  }
  const usersFile = d.users_file === null ? null : resolve(base, d.users_file);
  if (usersFile) {
    if (!existsSync(usersFile)) fail(file, `"users_file" ${usersFile} does not exist (make it with: node users.mjs add ${usersFile} NAME)`);
    try {
      loadUsersSync(usersFile);
    } catch (e) {
      fail(file, e.message);
    }
  }
  // Sessions kept for authenticated users mean nothing without users.
  if (!usersFile) limits.reserved_for_users = 0;
  if (limits.reserved_for_users >= limits.max_sessions) fail(file, '"limits.reserved_for_users" must be below "limits.max_sessions"');
  return {
    easy: false,
    pkiDir: d.pki_dir === null ? DEFAULT_PKI_DIR : resolve(base, d.pki_dir),
    modes: d.modes,
    policies: d.policies,
    allowAnonymous: d.allow_anonymous,
    anonymousWrite: d.anonymous_write,
    usersFile,
    autoAccept: d.auto_accept_client_certs,
    limits,
  };
}


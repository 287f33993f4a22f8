// Security of the OPC UA server, chosen in a JSON file (`server.mjs --security FILE`, README.md
// "Security", design/decisions.md D-opcua-security): which endpoints exist (modes, policies),
// where the server's certificate and the trusted/rejected client certificates live (pki_dir), who
// may open a session (anonymous, users from a file of scrypt hashes) and who may write sources.
// Without a file the server keeps node-opcua's easy defaults (every endpoint, anonymous
// everywhere, anyone may write) on localhost only. The `limits` are limits.mjs's.
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { dirname, resolve, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { OPCUACertificateManager, MessageSecurityMode, SecurityPolicy } from 'node-opcua';
import { loadUsersSync, verifyUser } from './users.mjs';
import { DEFAULT_LIMITS, checkLimits } from './limits.mjs';

const here = dirname(fileURLToPath(import.meta.url));
export const DEFAULT_PKI_DIR = join(here, 'pki');

/** A security file that cannot be used: server.mjs prints the message and exits 2. */
export class SecurityConfigError extends Error {}

const MODES = { None: MessageSecurityMode.None, Sign: MessageSecurityMode.Sign, SignAndEncrypt: MessageSecurityMode.SignAndEncrypt };
// The policies node-opcua 2.182 implements that are not deprecated (Basic128Rsa15 and Basic256
// use SHA-1; OPC UA 1.04 deprecated them).
const POLICIES = {
  Basic256Sha256: SecurityPolicy.Basic256Sha256,
  Aes128_Sha256_RsaOaep: SecurityPolicy.Aes128_Sha256_RsaOaep,
  Aes256_Sha256_RsaPss: SecurityPolicy.Aes256_Sha256_RsaPss,
};

// A security file's keys and their defaults. A file states a choice, so what it leaves out is the
// secure choice: no None endpoint, no anonymous sessions, no anonymous writes, no client
// certificate trusted unless an operator moved it to trusted/.
const FILE_DEFAULTS = {
  pki_dir: null, // relative to the file; null: examples/opcua/pki
  modes: ['Sign', 'SignAndEncrypt'],
  policies: Object.keys(POLICIES),
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
  limits: { ...DEFAULT_LIMITS },
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
  if (!isStringArray(d.modes) || !d.modes.length) fail(file, `"modes" must be a non-empty array of ${Object.keys(MODES).join(', ')}`);
  for (const m of d.modes) if (!Object.hasOwn(MODES, m)) fail(file, `unknown mode "${m}" in "modes" (known: ${Object.keys(MODES).join(', ')})`);
  if (new Set(d.modes).size !== d.modes.length) fail(file, '"modes" lists a mode twice');
  if (!isStringArray(d.policies)) fail(file, `"policies" must be an array of ${Object.keys(POLICIES).join(', ')}`);
  for (const p of d.policies) if (!Object.hasOwn(POLICIES, p)) fail(file, `unknown policy "${p}" in "policies" (supported: ${Object.keys(POLICIES).join(', ')})`);
  const secure = d.modes.some((m) => m !== 'None');
  if (secure && !d.policies.length) fail(file, '"policies" is empty but "modes" has Sign or SignAndEncrypt');
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

/** Is this session's user anonymous (no user identity, or an anonymous token)? */
export function isAnonymous(session) {
  const t = session?.userIdentityToken;
  if (!t) return true;
  return t.constructor?.name === 'AnonymousIdentityToken';
}

/**
 * The OPCUAServer options of a configuration: endpoints, certificate manager (initialized here:
 * the server's certificate is made in pki_dir on the first start and kept there), users.
 */
export async function serverSecurityOptions(sec, log) {
  if (sec.easy) {
    // No PKI warm-up: node-opcua's defaults, as before.
    return { allowAnonymous: true };
  }
  mkdirSync(sec.pkiDir, { recursive: true, mode: 0o700 });
  const cm = new OPCUACertificateManager({ rootFolder: sec.pkiDir, automaticallyAcceptUnknownCertificate: sec.autoAccept, name: 'PKI' });
  await cm.initialize();
  const securityModes = sec.modes.map((m) => MODES[m]);
  // SecurityPolicy None goes with mode None and with nothing else.
  const securityPolicies = [...(sec.modes.includes('None') ? [SecurityPolicy.None] : []), ...sec.policies.map((p) => POLICIES[p])];
  const opts = {
    serverCertificateManager: cm,
    securityModes,
    securityPolicies,
    allowAnonymous: sec.allowAnonymous,
  };
  if (sec.usersFile) {
    const file = sec.usersFile;
    opts.userManager = {
      isValidUserAsync(userName, password, callback) {
        verifyUser(file, userName, password).then(
          (ok) => {
            if (!ok) log(`log-in refused for user ${JSON.stringify(String(userName).slice(0, 64))} from ${this.channel?.remoteAddress ?? '?'}`);
            callback(null, ok);
          },
          () => callback(null, false),
        );
      },
    };
  }
  log(`security: modes ${sec.modes.join(', ')}; policies ${sec.policies.join(', ') || '-'}; anonymous ${sec.allowAnonymous ? 'allowed' : 'refused'}; anonymous writes ${sec.anonymousWrite ? 'allowed' : 'refused'}; users ${sec.usersFile ?? 'none'}; PKI ${sec.pkiDir} (client certificates: ${sec.autoAccept ? 'accepted automatically' : 'trusted/ only; new ones land in rejected/'})`);
  return opts;
}

/** The source write gate of a configuration (lib.mjs addSource): may this session write? */
export function sourceWriteGate(sec) {
  if (sec.anonymousWrite) return null;
  return (session) => !isAnonymous(session);
}

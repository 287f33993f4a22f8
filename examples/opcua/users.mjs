#!/usr/bin/env node
// The users file of the OPC UA server (README.md "Security"): user names with salted scrypt
// hashes of their passwords, never the passwords. As a program:
//   node users.mjs add FILE NAME      (the password from the terminal, twice, or stdin's first line)
//   node users.mjs remove FILE NAME
//   node users.mjs list FILE
// File: {"version": 1, "users": {"NAME": {"salt": B64, "hash": B64, "N": 16384, "r": 8, "p": 1}}},
// written with mode 0600. The server reads it at every log-in: adding a user needs no restart.
import { scrypt as scryptCb, randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync, writeFileSync, renameSync, existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { resolve } from 'node:path';

const KEY_BYTES = 32;
const SALT_BYTES = 16;
// scrypt's cost: N=2^14, r=8 is 16 MiB and a CPU-bound fraction of a second a log-in (about
// 0.2 s measured on the shared 2-core VM); a guessing attacker pays the same per guess.
const COST = { N: 16384, r: 8, p: 1 };
const MAX_PASSWORD = 1024; // bytes; longer is refused, not truncated

const scrypt = (password, salt, cost) =>
  new Promise((res, rej) => scryptCb(password, salt, KEY_BYTES, { ...cost, maxmem: 64 * 1024 * 1024 }, (e, k) => (e ? rej(e) : res(k))));

/** A user name: printable, no spaces at either end, at most 128 characters. */
export function checkUserName(name) {
  if (typeof name !== 'string' || !name.length || name.length > 128 || name.trim() !== name || /[\u0000-\u001f\u007f]/.test(name))
    throw new Error(`bad user name ${JSON.stringify(name)}: 1-128 printable characters, no spaces at the ends`);
}

/** Parses and checks a users file's text; throws an Error naming what is wrong. */
export function parseUsers(text, file = 'users file') {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw new Error(`${file}: not JSON (${e.message})`);
  }
  if (!doc || typeof doc !== 'object' || doc.version !== 1 || !doc.users || typeof doc.users !== 'object' || Array.isArray(doc.users))
    throw new Error(`${file}: expected {"version": 1, "users": {...}} (made by "node users.mjs add FILE NAME")`);
  for (const [name, u] of Object.entries(doc.users)) {
    checkUserName(name);
    const ok = u && typeof u.salt === 'string' && typeof u.hash === 'string' && [u.N, u.r, u.p].every((x) => Number.isInteger(x) && x > 0);
    if (!ok || Buffer.from(u.hash, 'base64').length !== KEY_BYTES) throw new Error(`${file}: user ${JSON.stringify(name)}: expected {salt, hash, N, r, p}`);
  }
  return doc;
}

export function loadUsersSync(file) {
  return parseUsers(readFileSync(file, 'utf8'), file);
}

/** A new entry for `password`: a random salt of its own, the scrypt hash. */
export async function hashPassword(password) {
  if (Buffer.byteLength(password) > MAX_PASSWORD) throw new Error(`password longer than ${MAX_PASSWORD} bytes`);
  const salt = randomBytes(SALT_BYTES);
  const hash = await scrypt(password, salt, COST);
  return { salt: salt.toString('base64'), hash: hash.toString('base64'), ...COST };
}

// An unknown user costs one scrypt too, so the time does not say whether the name exists.
const DUMMY = { salt: Buffer.alloc(SALT_BYTES).toString('base64'), hash: Buffer.alloc(KEY_BYTES).toString('base64'), ...COST };

/** Is `password` the one of `name` in `file`? Reads the file each time; false on any error. */
export async function verifyUser(file, name, password) {
  let users;
  try {
    users = parseUsers(await readFile(file, 'utf8'), file).users;
  } catch {
    return false;
  }
  const known = typeof name === 'string' && Object.hasOwn(users, name);
  const u = known ? users[name] : DUMMY;
  if (typeof password !== 'string' || Buffer.byteLength(password) > MAX_PASSWORD) return false;
  const got = await scrypt(password, Buffer.from(u.salt, 'base64'), { N: u.N, r: u.r, p: u.p }).catch(() => null);
  const want = Buffer.from(u.hash, 'base64');
  return known && got !== null && got.length === want.length && timingSafeEqual(got, want);
}

function writeUsers(file, doc) {
  const tmp = `${file}.tmp-${process.pid}`;
  writeFileSync(tmp, `${JSON.stringify(doc, null, 2)}\n`, { mode: 0o600 });
  renameSync(tmp, file);
}

/** Adds or replaces `name` in `file` (made if missing). */
export async function addUser(file, name, password) {
  checkUserName(name);
  if (!password) throw new Error('empty password');
  const doc = existsSync(file) ? loadUsersSync(file) : { version: 1, users: {} };
  doc.users[name] = await hashPassword(password);
  writeUsers(file, doc);
}

// ---- the command line ----

/** The password: typed twice without echo on a terminal, else stdin's first line. */
async function readPassword() {
  const stdin = process.stdin;
  if (!stdin.isTTY) {
    const chunks = [];
    for await (const c of stdin) chunks.push(c);
    return Buffer.concat(chunks).toString('utf8').split(/\r?\n/)[0];
  }
  const ask = (prompt) =>
    new Promise((res, rej) => {
      process.stderr.write(prompt);
      stdin.setRawMode(true);
      stdin.resume();
      let s = '';
      const onData = (d) => {
        for (const ch of d.toString('utf8')) {
          if (ch === '\r' || ch === '\n') {
            stdin.setRawMode(false);
            stdin.pause();
            stdin.removeListener('data', onData);
            process.stderr.write('\n');
            return res(s);
          }
          if (ch === '\u0003') {
            stdin.setRawMode(false);
            return rej(new Error('interrupted'));
          }
          if (ch === '\u007f' || ch === '\b') s = s.slice(0, -1);
          else s += ch;
        }
      };
      stdin.on('data', onData);
    });
  const a = await ask('password: ');
  const b = await ask('again: ');
  if (a !== b) throw new Error('the passwords differ');
  return a;
}

async function main(argv) {
  const [cmd, file, name] = argv;
  const usage = 'usage: node users.mjs add FILE NAME | remove FILE NAME | list FILE';
  if (cmd === 'add' && file && name) {
    checkUserName(name);
    await addUser(file, name, await readPassword());
    process.stderr.write(`users.mjs: ${name} added to ${file}\n`);
  } else if (cmd === 'remove' && file && name) {
    const doc = loadUsersSync(file);
    if (!Object.hasOwn(doc.users, name)) throw new Error(`no user ${name} in ${file}`);
    delete doc.users[name];
    writeUsers(file, doc);
  } else if (cmd === 'list' && file) {
    for (const n of Object.keys(loadUsersSync(file).users)) process.stdout.write(`${n}\n`);
  } else {
    process.stderr.write(`${usage}\n`);
    process.exit(2);
  }
}

if (process.argv[1] && fileURLToPath(import.meta.url) === resolve(process.argv[1])) {
  main(process.argv.slice(2)).catch((e) => {
    process.stderr.write(`users.mjs: ${e.message}\n`);
    process.exit(1);
  });
}

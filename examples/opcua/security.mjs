// Security of the OPC UA server at run time (design/decisions.md D-opcua-security): the
// endpoints (modes, policies) a checked configuration (security-config.mjs) asks for, the
// server's certificate and the trusted/rejected client certificates in pki_dir (node-opcua's
// OPCUACertificateManager), users checked against the users file (users.mjs), and who may write
// sources. Without --security the server keeps node-opcua's easy defaults (every endpoint,
// anonymous everywhere, anyone may write) on localhost only.
import { mkdirSync } from 'node:fs';
import { OPCUACertificateManager, MessageSecurityMode, SecurityPolicy } from 'node-opcua';
import { verifyUser } from './users.mjs';

const MODE = { None: MessageSecurityMode.None, Sign: MessageSecurityMode.Sign, SignAndEncrypt: MessageSecurityMode.SignAndEncrypt };
const POLICY = {
  Basic256Sha256: SecurityPolicy.Basic256Sha256,
  Aes128_Sha256_RsaOaep: SecurityPolicy.Aes128_Sha256_RsaOaep,
  Aes256_Sha256_RsaPss: SecurityPolicy.Aes256_Sha256_RsaPss,
};

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
  const securityModes = sec.modes.map((m) => MODE[m]);
  // SecurityPolicy None goes with mode None and with nothing else.
  const securityPolicies = [...(sec.modes.includes('None') ? [SecurityPolicy.None] : []), ...sec.policies.map((p) => POLICY[p])];
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

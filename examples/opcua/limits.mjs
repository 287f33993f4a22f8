// What one OPC UA client may take of the server (README.md "Security", design/decisions.md
// D-opcua-limits): sessions in all, per client address and anonymous per address, a reserve of
// sessions only authenticated users may take, the session timeout a client may ask for,
// subscriptions per session, monitored items per session and in all. node-opcua enforces the
// server-wide counts itself (serverCapabilities); the per-address and per-session ones are
// enforced here, at CreateSession, ActivateSession and CreateMonitoredItems. The limits' keys and
// defaults: security-config.mjs DEFAULT_LIMITS.
import { inspect } from 'node:util';
import { StatusCodes, MonitoredItemCreateResult, ServiceFault } from 'node-opcua';

/** OPCUAServer options that carry the limits node-opcua enforces itself. */
export function serverLimitOptions(l) {
  return {
    maxConnectionsPerEndpoint: l.max_connections,
    serverCapabilities: {
      maxSessions: l.max_sessions,
      maxSubscriptionsPerSession: l.max_subscriptions_per_session,
      maxMonitoredItems: l.max_monitored_items,
      maxMonitoredItemsPerSubscription: l.max_monitored_items_per_session,
    },
  };
}

const addressOf = (session) => session?.channel?.remoteAddress ?? session?.$outrunAddress ?? '?';
const isAnonymousToken = (t) => !t || t.constructor?.name === 'AnonymousIdentityToken';

/**
 * Enforces the per-address, per-session and reserve limits on a constructed (not yet started)
 * node-opcua server. On this instance only, it wraps the CreateSession handler (node-opcua looks
 * handlers up by name per request: `this["_on_" + request name]`) and isUserAuthorized (which
 * ActivateSession calls with the user's token), and each new subscription's
 * preCreateMonitoredItem; every wrapper calls the original, so node-opcua's own checks still
 * run. `log(line)`: refusals, once per reason and address a minute.
 */
export function installLimits(server, l, log) {
  const sessions = () => Object.values(server.engine?._sessions ?? {}).filter((s) => s.status !== 'closed');
  const quiet = new Map();
  const refuse = (what, address) => {
    const key = `${what}|${address}`;
    const now = Date.now();
    if ((quiet.get(key) ?? 0) > now) return;
    quiet.set(key, now + 60000);
    if (quiet.size > 1000) quiet.clear();
    log(`refused ${what} from ${address}`);
  };

  // CreateSession: the session timeout asked for is capped; one address holds at most
  // max_sessions_per_address sessions.
  const createSession = server._on_CreateSessionRequest;
  server._on_CreateSessionRequest = async function (message, channel) {
    const request = message.request;
    const asked = request.requestedSessionTimeout;
    if (!(asked > 0) || asked > l.max_session_timeout_ms) request.requestedSessionTimeout = l.max_session_timeout_ms;
    const address = channel.remoteAddress ?? '?';
    if (sessions().filter((s) => addressOf(s) === address).length >= l.max_sessions_per_address) {
      refuse(`a session (${l.max_sessions_per_address} from this address already)`, address);
      return sendFault(channel, message, StatusCodes.BadTooManySessions);
    }
    return createSession.call(this, message, channel);
  };

  // ActivateSession: an anonymous session is activated only within max_anonymous_sessions_per_
  // address and within max_sessions - reserved_for_users anonymous sessions in all.
  const authorize = server.isUserAuthorized;
  server.isUserAuthorized = function (channel, session, token, callback) {
    if (isAnonymousToken(token)) {
      const others = sessions().filter((s) => s !== session && s.status === 'active' && isAnonymousToken(s.userIdentityToken));
      const address = channel.remoteAddress ?? '?';
      if (others.filter((s) => addressOf(s) === address).length >= l.max_anonymous_sessions_per_address) {
        refuse(`an anonymous session (${l.max_anonymous_sessions_per_address} from this address already)`, address);
        return setImmediate(() => callback(null, false, StatusCodes.BadTooManySessions));
      }
      if (others.length >= l.max_sessions - l.reserved_for_users) {
        refuse(`an anonymous session (the other ${l.reserved_for_users} are kept for users)`, address);
        return setImmediate(() => callback(null, false, StatusCodes.BadTooManySessions));
      }
    }
    return authorize.call(this, channel, session, token, callback);
  };

  // Monitored items per session: counted over the session's subscriptions at each creation.
  const countItems = (session) => {
    let n = 0;
    for (const s of session?.publishEngine?.subscriptions ?? []) n += s.monitoredItemCount ?? 0;
    return n;
  };
  server.on('create_session', (session) => {
    session.$outrunAddress = session.channel?.remoteAddress;
    session.on('new_subscription', (subscription) => {
      const pre = subscription.preCreateMonitoredItem;
      subscription.preCreateMonitoredItem = function (addressSpace, timestampsToReturn, request) {
        const owner = this.$session ?? session;
        if (countItems(owner) >= l.max_monitored_items_per_session) {
          refuse(`monitored items past ${l.max_monitored_items_per_session} in one session`, addressOf(owner));
          return { createResult: new MonitoredItemCreateResult({ statusCode: StatusCodes.BadTooManyMonitoredItems }), monitoredItemCreateRequest: request };
        }
        return pre.call(this, addressSpace, timestampsToReturn, request);
      };
    });
  });
}

/**
 * Bounds the TCP connections one address holds (max_connections_per_address) on every endpoint
 * of an initialized, not yet started server: a connection past the bound is closed before
 * node-opcua sees it. (node-opcua's maxConnectionsPerEndpoint counts every address together.)
 * node-opcua's connection handler is the net server's first 'connection' listener; it is
 * replaced by one that counts and then calls it.
 */
export function limitConnections(server, l, log) {
  const open = new Map(); // address -> open sockets, over all endpoints
  let lastLog = 0;
  for (const endpoint of server.endpoints ?? []) {
    const net = endpoint._server;
    const [accept] = net?.listeners('connection') ?? [];
    if (!accept) continue;
    net.removeListener('connection', accept);
    net.prependListener('connection', (socket) => {
      const address = socket.remoteAddress ?? '?';
      const n = open.get(address) ?? 0;
      if (n >= l.max_connections_per_address) {
        if (Date.now() - lastLog > 60000) {
          lastLog = Date.now();
          log(`refused a connection from ${address} (${n} open from this address already)`);
        }
        socket.destroy();
        return;
      }
      open.set(address, n + 1);
      socket.once('close', () => {
        const m = (open.get(address) ?? 1) - 1;
        if (m > 0) open.set(address, m);
        else open.delete(address);
      });
      accept(socket);
    });
  }
}

function sendFault(channel, message, statusCode) {
  // A ServiceFault for the request: what node-opcua's own refusals send.
  channel.send_response('MSG', new ServiceFault({ responseHeader: { serviceResult: statusCode } }), message);
}

/**
 * Makes node-opcua's address-space nodes safe to inspect(). Node.js inspects an event emitter
 * when it warns about too many listeners; node-opcua's custom inspect of a node threw there (a
 * chalk proxy), inside a client's CreateMonitoredItems, and the process died (issue 29 item 15).
 * Every custom inspect on the prototype chains of `nodes` now falls back to a plain string.
 */
export function hardenInspect(nodes) {
  const sym = inspect.custom;
  for (const node of nodes) {
    for (let p = Object.getPrototypeOf(node); p && p !== Object.prototype; p = Object.getPrototypeOf(p)) {
      const own = Object.getOwnPropertyDescriptor(p, sym);
      if (!own || typeof own.value !== 'function' || own.value.$outrunSafe) continue;
      const original = own.value;
      const safe = function (...args) {
        try {
          return original.apply(this, args);
        } catch {
          return `${this?.constructor?.name ?? 'Node'}<${this?.nodeId?.toString?.() ?? '?'}>`;
        }
      };
      safe.$outrunSafe = true;
      Object.defineProperty(p, sym, { ...own, value: safe });
    }
  }
}

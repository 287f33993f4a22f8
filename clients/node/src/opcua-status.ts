// OPC UA StatusCodes by name: every one the specification names, generated at build time from
// the same list as outrun's (host/tags/StatusCode.csv; scripts/status-codes.mjs).
import { STATUS_CODES } from './generated/status-codes';

export { STATUS_CODES };

const BY_CODE = new Map<number, string>(Object.entries(STATUS_CODES).map(([k, v]) => [v, k]));

/** The name of a StatusCode ("BadTimeout"), or undefined when the specification does not name it. */
export function statusCodeName(code: number): string | undefined {
  return BY_CODE.get(code >>> 0);
}

/** A StatusCode from a number or a name; throws RangeError for an unknown name. */
export function toStatusCode(s: number | string | undefined): number {
  if (s === undefined) return 0;
  if (typeof s === 'number') {
    if (!Number.isInteger(s) || s < 0 || s > 0xffffffff) throw new RangeError(`StatusCode ${s} is not a uint32`);
    return s >>> 0;
  }
  const c = Object.hasOwn(STATUS_CODES, s) ? STATUS_CODES[s] : undefined;
  if (c === undefined) throw new RangeError(`unknown StatusCode name '${s}'`);
  return c;
}

export function isGood(code: number): boolean {
  return code >>> 30 === 0;
}
export function isUncertain(code: number): boolean {
  return code >>> 30 === 1;
}
export function isBad(code: number): boolean {
  return code >>> 30 >= 2;
}

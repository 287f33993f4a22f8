// OPC UA StatusCodes by name: the ones outrun's tags engine uses (host/include/outrun/tags.h).
export const STATUS_CODES: { readonly [name: string]: number } = {
  Good: 0x00000000,
  Uncertain: 0x40000000,
  UncertainLastUsableValue: 0x40900000,
  UncertainSubstituteValue: 0x40910000,
  UncertainInitialValue: 0x40920000,
  UncertainSensorNotAccurate: 0x40930000,
  UncertainEngineeringUnitsExceeded: 0x40940000,
  Bad: 0x80000000,
  BadInternalError: 0x80020000,
  BadOutOfMemory: 0x80030000,
  BadResourceUnavailable: 0x80040000,
  BadTimeout: 0x800a0000,
  BadTooManyOperations: 0x80100000,
  BadNoCommunication: 0x80310000,
  BadWaitingForInitialData: 0x80320000,
  BadOutOfRange: 0x803c0000,
  BadTypeMismatch: 0x80740000,
  BadConfigurationError: 0x80890000,
  BadInvalidArgument: 0x80ab0000,
  BadSensorFailure: 0x808c0000,
  BadDeviceFailure: 0x808b0000,
};

const BY_CODE = new Map<number, string>(Object.entries(STATUS_CODES).map(([k, v]) => [v, k]));

/** The name of a StatusCode ("BadTimeout"), or undefined when outrun does not name it. */
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
  const c = STATUS_CODES[s];
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

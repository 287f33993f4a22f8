// JavaScript values <-> wire Values (design/protocol.md "Values"; README "Value mapping").
import { ValueKind } from './generated/outrun_generated';
import { MAX_DECODED_NODES, MAX_INPUTS, MAX_INPUT_BYTES, MAX_VALUE_DEPTH } from './constants';

/**
 * Marks a number to be sent as a Lua float (`Double`) even when it is integral:
 * `double(2)` arrives in Lua as `2.0`, a plain `2` as the integer `2`.
 */
export class Double {
  readonly value: number;
  constructor(value: number) {
    this.value = value;
  }
}
export function double(value: number): Double {
  return new Double(value);
}

/** What may be passed as an input value. */
export type InputValue =
  | null
  | undefined
  | boolean
  | number
  | bigint
  | string
  | Uint8Array
  | ArrayBuffer
  | Double
  | readonly InputValue[]
  | ReadonlyMap<string, InputValue>
  | { readonly [key: string]: InputValue };

/** What a result value decodes to. */
export type OutputValue = null | boolean | number | bigint | string | Buffer | OutputValue[] | { [key: string]: OutputValue };

export type Inputs = { readonly [name: string]: InputValue };

/** A snapshot of an input value, taken when evaluate() is called and encoded when it is sent. */
export type WireValue =
  | { k: ValueKind.Nil }
  | { k: ValueKind.Boolean; v: boolean }
  | { k: ValueKind.Int; v: bigint }
  | { k: ValueKind.Double; v: number }
  | { k: ValueKind.String; v: string }
  | { k: ValueKind.Bytes; v: Uint8Array }
  | { k: ValueKind.Array; v: WireValue[] }
  | { k: ValueKind.Map; keys: string[]; v: WireValue[] }
  /** Tag values only (source updates): OPC UA ticks. */
  | { k: ValueKind.DateTime; v: bigint };

export type WireInputs = Array<[string, WireValue]>;

/** An input that cannot be sent: the evaluation ends `invalid_argument` with this message. */
export class InvalidInput extends Error {}

const I64_MIN = -(1n << 63n);
const I64_MAX = (1n << 63n) - 1n;
const NIL: WireValue = { k: ValueKind.Nil };
const VALUE_COST = 16; // bytes the daemon counts per value (kMaxInputBytes accounting)

function isPlainObject(x: object): boolean {
  const p = Object.getPrototypeOf(x);
  return p === Object.prototype || p === null;
}

/** Converts `inputs` to wire form; throws InvalidInput for anything that has no wire kind. */
export function toWireInputs(inputs: Inputs | null | undefined): WireInputs {
  if (inputs === null || inputs === undefined) return [];
  if (typeof inputs !== 'object' || Array.isArray(inputs) || !isPlainObject(inputs))
    throw new InvalidInput('inputs must be a plain object {name: value}');
  const names = Object.keys(inputs);
  if (names.length > MAX_INPUTS) throw new InvalidInput(`more than ${MAX_INPUTS} inputs`);
  const budget = { bytes: 0 };
  const out: WireInputs = [];
  for (const name of names) {
    budget.bytes += Buffer.byteLength(name);
    out.push([name, toWire((inputs as Record<string, InputValue>)[name], 1, budget, name)]);
  }
  if (budget.bytes > MAX_INPUT_BYTES)
    throw new InvalidInput(`inputs larger than ${MAX_INPUT_BYTES} bytes (16 per value plus strings, bytes and keys)`);
  return out;
}

/**
 * What toWire counts: 16 bytes per value plus strings, bytes and keys, refused past `limit`
 * (default MAX_INPUT_BYTES, an evaluation's inputs; tag values are bounded by their frame instead).
 */
export interface WireBudget {
  bytes: number;
  limit?: number;
  /** The strings, bytes and keys alone: a lower bound of what they take in a frame. */
  payload?: number;
}

function payload(budget: WireBudget, n: number): void {
  budget.bytes += n;
  if (budget.payload !== undefined) budget.payload += n;
}

export function toWire(x: InputValue, depth: number, budget: WireBudget, path: string): WireValue {
  if (depth > MAX_VALUE_DEPTH) throw new InvalidInput(`input '${path}' nests deeper than ${MAX_VALUE_DEPTH} levels`);
  budget.bytes += VALUE_COST;
  if (budget.bytes > (budget.limit ?? MAX_INPUT_BYTES))
    throw new InvalidInput(`inputs larger than ${MAX_INPUT_BYTES} bytes (16 per value plus strings, bytes and keys)`);
  switch (typeof x) {
    case 'undefined':
      return NIL;
    case 'boolean':
      return { k: ValueKind.Boolean, v: x };
    case 'number':
      if (Number.isSafeInteger(x) && !Object.is(x, -0)) return { k: ValueKind.Int, v: BigInt(x) };
      return { k: ValueKind.Double, v: x };
    case 'bigint':
      if (x < I64_MIN || x > I64_MAX) throw new InvalidInput(`input '${path}': bigint outside the 64-bit range`);
      return { k: ValueKind.Int, v: x };
    case 'string':
      payload(budget, Buffer.byteLength(x));
      return { k: ValueKind.String, v: x };
    case 'object': {
      if (x === null) return NIL;
      if (x instanceof Double) {
        if (typeof x.value !== 'number') throw new InvalidInput(`input '${path}': double() needs a number`);
        return { k: ValueKind.Double, v: x.value };
      }
      if (x instanceof Uint8Array) {
        payload(budget, x.length);
        return { k: ValueKind.Bytes, v: Uint8Array.from(x) };
      }
      if (x instanceof ArrayBuffer) {
        payload(budget, x.byteLength);
        return { k: ValueKind.Bytes, v: new Uint8Array(x.slice(0)) };
      }
      if (Array.isArray(x)) {
        const items: WireValue[] = new Array(x.length);
        for (let i = 0; i < x.length; i++) items[i] = toWire(x[i], depth + 1, budget, `${path}[${i}]`);
        return { k: ValueKind.Array, v: items };
      }
      if (x instanceof Map) {
        const keys: string[] = [];
        const items: WireValue[] = [];
        for (const [key, v] of x) {
          if (typeof key !== 'string') throw new InvalidInput(`input '${path}': Map keys must be strings`);
          payload(budget, Buffer.byteLength(key));
          keys.push(key);
          items.push(toWire(v, depth + 1, budget, `${path}.${key}`));
        }
        return { k: ValueKind.Map, keys, v: items };
      }
      if (isPlainObject(x)) {
        const keys = Object.keys(x);
        const items: WireValue[] = new Array(keys.length);
        for (let i = 0; i < keys.length; i++) {
          payload(budget, Buffer.byteLength(keys[i]));
          items[i] = toWire((x as Record<string, InputValue>)[keys[i]], depth + 1, budget, `${path}.${keys[i]}`);
        }
        return { k: ValueKind.Map, keys, v: items };
      }
      throw new InvalidInput(`input '${path}': ${x.constructor?.name ?? 'object'} has no wire value kind`);
    }
    default:
      throw new InvalidInput(`input '${path}': a ${typeof x} has no wire value kind`);
  }
}

/** A value in a result that breaks the Value rules: the evaluation ends `runtime_error`. */
export class InvalidValue extends Error {}

/** Counts what one frame decodes to, shared subtrees counted per use. */
export class DecodeBudget {
  nodes = MAX_DECODED_NODES;
}

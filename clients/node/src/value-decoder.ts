// The one decoder of a wire Value (design/protocol.md "Values"), for evaluation results and for
// tag values alike. Tag values may also carry the kinds only tags use (UInt, Float, DateTime);
// an evaluation result that carries one is invalid, as outrund never sends it.
import * as w from './generated/outrun_generated';
import { CheckedByteBuffer, MalformedFrame } from './checked-buffer';
import { MAX_VALUE_DEPTH } from './constants';
import { ticksToDate } from './ticks';
import { DecodeBudget, InvalidValue } from './values';

/** Any decoded value: the result mapping plus Date (DateTime, tag values only). */
export type AnyOutputValue =
  | null
  | boolean
  | number
  | bigint
  | string
  | Buffer
  | Date
  | AnyOutputValue[]
  | { [key: string]: AnyOutputValue };

/**
 * Decodes `v`. Throws InvalidValue for a value that breaks the rules (unknown kind, a tag-only
 * kind outside tags, depth > MAX_VALUE_DEPTH, map keys/items mismatch, a missing or duplicate
 * key, missing fields); MalformedFrame (from the checked buffer, or when `budget` runs out) for a
 * frame that cannot be read.
 */
export function decodeAnyValue(v: w.Value, budget: DecodeBudget, tagKinds: boolean, depth = 1): AnyOutputValue {
  if (--budget.nodes < 0) throw new MalformedFrame('frame decodes to too many values');
  if (depth > MAX_VALUE_DEPTH) throw new InvalidValue(`value nests deeper than ${MAX_VALUE_DEPTH} levels`);
  const kind = v.kind();
  switch (kind) {
    case w.ValueKind.Nil:
      return null;
    case w.ValueKind.Boolean:
      return v.boolValue();
    case w.ValueKind.Int: {
      const i = v.intValue();
      return i >= BigInt(Number.MIN_SAFE_INTEGER) && i <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(i) : i;
    }
    case w.ValueKind.Double:
      return v.doubleValue();
    case w.ValueKind.String: {
      const s = v.stringValue();
      if (s === null) throw new InvalidValue('String value without a string');
      return s;
    }
    case w.ValueKind.Bytes: {
      const n = v.bytesValueLength();
      const a = v.bytesValueArray();
      if (n > 0 && (!a || a.length !== n)) throw new MalformedFrame('bytes vector runs past the frame');
      if (v.bb instanceof CheckedByteBuffer) v.bb.charge(n);
      return Buffer.from(a ? Uint8Array.from(a) : new Uint8Array(0));
    }
    case w.ValueKind.Array: {
      const n = v.itemsLength();
      const out: AnyOutputValue[] = new Array(n);
      const item = new w.Value();
      for (let i = 0; i < n; i++) {
        const x = v.items(i, item);
        out[i] = x ? decodeAnyValue(x, budget, tagKinds, depth + 1) : null;
      }
      return out;
    }
    case w.ValueKind.Map: {
      const n = v.itemsLength();
      if (v.keysLength() !== n) throw new InvalidValue('map keys and items differ in length');
      const out: { [key: string]: AnyOutputValue } = {};
      const item = new w.Value();
      for (let i = 0; i < n; i++) {
        const key = v.keys(i);
        if (key === null || key === undefined) throw new InvalidValue('map key missing');
        if (Object.prototype.hasOwnProperty.call(out, key)) throw new InvalidValue(`duplicate map key '${key}'`);
        const x = v.items(i, item);
        const val = x ? decodeAnyValue(x, budget, tagKinds, depth + 1) : null;
        // defineProperty: a key '__proto__' is an own property, never the prototype.
        Object.defineProperty(out, key, { value: val, enumerable: true, writable: true, configurable: true });
      }
      return out;
    }
  }
  if (tagKinds) {
    switch (kind) {
      case w.ValueKind.UInt: {
        const u = v.uintValue();
        return u <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(u) : u;
      }
      case w.ValueKind.Float:
        return v.doubleValue();
      case w.ValueKind.DateTime:
        return ticksToDate(v.intValue());
    }
  }
  throw new InvalidValue(`unknown value kind ${kind}`);
}

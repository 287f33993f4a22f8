// OPC UA DateTime ticks (100 ns since 1601-01-01 UTC) to and from Date.
import { InvalidInput } from './values';

/** Ticks (100 ns since 1601-01-01 UTC) at the Unix epoch. */
export const EPOCH_TICKS = 116444736000000000n;

export function dateToTicks(d: Date): bigint {
  const ms = d.getTime();
  if (!Number.isFinite(ms)) throw new InvalidInput('invalid Date');
  return BigInt(Math.round(ms)) * 10000n + EPOCH_TICKS;
}
/** Ticks -> Date, rounded to the nearest millisecond (a Date has no finer precision). */
export function ticksToDate(t: bigint): Date {
  const d = t - EPOCH_TICKS;
  const ms = d >= 0n ? (d + 5000n) / 10000n : -((-d + 5000n) / 10000n);
  return new Date(Number(ms));
}

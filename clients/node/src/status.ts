// Status names, as outrun::Status spells them (host/include/outrun/status.h). The numbering is
// the wire enum `Status` of protocol/outrun.fbs: the names are derived from the generated enum.
import { Status as WireStatus } from './generated/outrun_generated';

/** Every status an evaluation or a call can end with. */
export type StatusName =
  | 'ok'
  | 'compile_error'
  | 'runtime_error'
  | 'timeout'
  | 'killed'
  | 'memory_limit'
  | 'busy'
  | 'worker_lost'
  | 'unavailable'
  | 'cancelled'
  | 'invalid_argument';

function snake(camel: string): string {
  return camel.replace(/[A-Z]/g, (c, i: number) => (i ? '_' : '') + c.toLowerCase());
}

/** Wire number -> name, for the statuses a client may receive (NeedSource is worker-internal). */
export const STATUS_NAMES: readonly StatusName[] = (() => {
  const names: StatusName[] = [];
  for (let i = 0; i <= WireStatus.InvalidArgument; i++) names.push(snake(WireStatus[i]) as StatusName);
  return names;
})();

/** Name of wire status `n`, or undefined when a client must not receive it. */
export function statusName(n: number): StatusName | undefined {
  return n >= 0 && n < STATUS_NAMES.length ? STATUS_NAMES[n] : undefined;
}

/**
 * The error of a call that is not an evaluation (connect, register, control) or of a connection.
 * Evaluations never reject: their outcome, good or bad, is a Result.
 */
export class OutrunError extends Error {
  readonly status: StatusName;
  constructor(status: StatusName, message: string) {
    super(message);
    this.name = 'OutrunError';
    this.status = status;
  }
}

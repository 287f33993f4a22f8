// The daemon's JSON documents (ControlReply, TagsReply), parsed within bounds.
//
// A reply frame may carry a JSON text of up to 16 MiB, and JSON.parse makes one JavaScript object
// per `{` or `[`: 16 MiB of `[[[[...` cost about 500 MB, of `{},{},...` about 375 MB, and block
// the event loop for seconds. Scalars cost at most a few times their text. So before parsing, one
// pass over the text (strings skipped whole) counts the objects and arrays and their nesting, and
// a document past either bound is refused: no daemon document comes near them (a ListTags
// document of a full frame holds some 350,000 objects and arrays, nested under 40 deep: values nest
// at most 32 levels, plus the document's own 4 and a `$bytes` object).
import { OutrunError } from './status';

/** Deepest nesting of objects and arrays a document may have. */
export const MAX_JSON_DEPTH = 64;
/** Most objects and arrays, together, a document may hold. */
export const MAX_JSON_CONTAINERS = 1_000_000;

/** Why `text` is past the bounds (MAX_JSON_DEPTH, MAX_JSON_CONTAINERS), or null. Not a validator. */
export function jsonShapeError(text: string): string | null {
  let depth = 0;
  let containers = 0;
  const n = text.length;
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22 /* " */) {
      // To the closing quote: the first one not escaped by an odd run of backslashes.
      for (;;) {
        const j = text.indexOf('"', i + 1);
        if (j < 0) return null; // unterminated: JSON.parse says so
        let k = j - 1;
        while (text.charCodeAt(k) === 0x5c /* \ */) k--;
        i = j;
        if ((j - 1 - k) % 2 === 0) break;
      }
    } else if (c === 0x5b /* [ */ || c === 0x7b /* { */) {
      if (++depth > MAX_JSON_DEPTH) return `nests deeper than ${MAX_JSON_DEPTH} levels`;
      if (++containers > MAX_JSON_CONTAINERS) return `holds more than ${MAX_JSON_CONTAINERS} objects and arrays`;
    } else if (c === 0x5d /* ] */ || c === 0x7d /* } */) {
      depth--;
    }
  }
  return null;
}

/**
 * Parses a document the daemon sent as the reply to `what`; rejects (OutrunError
 * `runtime_error`) a text that is not JSON or is past MAX_JSON_DEPTH / MAX_JSON_CONTAINERS,
 * without building it. The connection is not at fault: the frame was read.
 */
export function parseDocument(text: string, what: string): any {
  const why = jsonShapeError(text);
  if (why !== null) throw new OutrunError('runtime_error', `outrund sent a ${what} reply whose JSON ${why}; it was not parsed`);
  try {
    return JSON.parse(text);
  } catch {
    throw new OutrunError('runtime_error', `outrund sent a ${what} reply that is not JSON`);
  }
}

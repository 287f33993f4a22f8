// Buffered frame reader: 4-byte little-endian length + FlatBuffer, reassembled across any split
// of the byte stream, any number of frames per chunk (design/protocol.md "Frame").
import { LENGTH_PREFIX_SIZE, MAX_FRAME_SIZE, MIN_FRAME_SIZE } from './constants';

/** Why a byte stream was abandoned (mirrors outrun::protocol::FrameError). */
export type FrameErrorKind = 'oversized' | 'undersized' | 'malformed';

export class FrameError extends Error {
  readonly kind: FrameErrorKind;
  constructor(kind: FrameErrorKind, message: string) {
    super(message);
    this.name = 'FrameError';
    this.kind = kind;
  }
}

/**
 * Feed it chunks with push(); it returns the complete frames they finish, each as its own
 * Uint8Array (length prefix included) over an ArrayBuffer of exactly that size, so a reader that
 * strays past the frame fails instead of reading a neighbour's bytes.
 *
 * A length outside [MIN_FRAME_SIZE, maxFrame] throws FrameError; the stream cannot be
 * resynchronised, so every later push() throws too.
 */
export class FrameReader {
  private readonly maxFrame: number;
  private header = new Uint8Array(LENGTH_PREFIX_SIZE);
  private headerFill = 0;
  private frame: Uint8Array | null = null; // frame being filled, prefix included
  private frameFill = 0;
  private broken: FrameError | null = null;

  constructor(maxFrame: number = MAX_FRAME_SIZE) {
    this.maxFrame = maxFrame;
  }

  /** Bytes received that are not yet part of a returned frame. */
  get buffered(): number {
    return this.frame ? this.frameFill : this.headerFill;
  }

  push(chunk: Uint8Array): Uint8Array[] {
    if (this.broken) throw this.broken;
    const out: Uint8Array[] = [];
    let pos = 0;
    const n = chunk.length;
    while (pos < n) {
      if (!this.frame) {
        // Fast path: a whole frame inside the chunk with no partial header pending.
        if (this.headerFill === 0 && n - pos >= LENGTH_PREFIX_SIZE) {
          const len = readU32(chunk, pos);
          this.check(len);
          const total = LENGTH_PREFIX_SIZE + len;
          if (n - pos >= total) {
            out.push(new Uint8Array(chunk.subarray(pos, pos + total))); // a copy (Buffer#slice would not be)
            pos += total;
            continue;
          }
          this.start(len);
        } else {
          const take = Math.min(LENGTH_PREFIX_SIZE - this.headerFill, n - pos);
          this.header.set(chunk.subarray(pos, pos + take), this.headerFill);
          this.headerFill += take;
          pos += take;
          if (this.headerFill < LENGTH_PREFIX_SIZE) break;
          const len = readU32(this.header, 0);
          this.check(len);
          this.start(len);
          this.frameFill = LENGTH_PREFIX_SIZE;
          this.headerFill = 0;
          continue;
        }
      }
      const f = this.frame!;
      const take = Math.min(f.length - this.frameFill, n - pos);
      f.set(chunk.subarray(pos, pos + take), this.frameFill);
      this.frameFill += take;
      pos += take;
      if (this.frameFill === f.length) {
        out.push(f);
        this.frame = null;
        this.frameFill = 0;
      }
    }
    return out;
  }

  private start(len: number): void {
    this.frame = new Uint8Array(LENGTH_PREFIX_SIZE + len);
    this.frame[0] = len & 0xff;
    this.frame[1] = (len >>> 8) & 0xff;
    this.frame[2] = (len >>> 16) & 0xff;
    this.frame[3] = (len >>> 24) & 0xff;
    this.frameFill = 0;
  }

  private check(len: number): void {
    if (len > this.maxFrame) {
      this.broken = new FrameError('oversized', `frame length ${len} exceeds the maximum ${this.maxFrame}`);
      throw this.broken;
    }
    if (len < MIN_FRAME_SIZE) {
      this.broken = new FrameError('undersized', `frame length ${len} is below the minimum ${MIN_FRAME_SIZE}`);
      throw this.broken;
    }
  }
}

function readU32(b: Uint8Array, at: number): number {
  return (b[at] | (b[at + 1] << 8) | (b[at + 2] << 16) | (b[at + 3] << 24)) >>> 0;
}

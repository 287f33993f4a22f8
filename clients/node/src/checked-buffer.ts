// The JavaScript FlatBuffers runtime has no Verifier, and its ByteBuffer reads past the end of
// its bytes as zeros. CheckedByteBuffer makes every read bounds-checked (all scalar reads go
// through readUint8/readUint16/readInt32; strings through __string), so a malformed frame makes
// an accessor throw instead of returning garbage. Together with the structural checks in
// wire.ts (body type known, required fields, depth and node budget) this stands in for
// VerifySizePrefixedFrameBuffer.
import * as flatbuffers from 'flatbuffers';
import { MAX_DECODED_BYTES } from './constants';

export class MalformedFrame extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'MalformedFrame';
  }
}

export class CheckedByteBuffer extends flatbuffers.ByteBuffer {
  private readonly size: number;
  private readonly decoder = new TextDecoder('utf-8');
  // Bytes of strings and byte vectors this frame may decode to, each read counted: a frame that
  // shares one large string among many values or map keys is refused, not copied again and
  // again (design/decisions.md D-result-budget).
  private decodeLeft = MAX_DECODED_BYTES;

  constructor(bytes: Uint8Array) {
    super(bytes);
    this.size = bytes.length;
  }

  private need(offset: number, n: number): void {
    if (!(offset >= 0 && offset + n <= this.size) || !Number.isInteger(offset))
      throw new MalformedFrame(`read of ${n} bytes at ${offset} is outside the ${this.size}-byte frame`);
  }

  override readUint8(offset: number): number {
    this.need(offset, 1);
    return super.readUint8(offset);
  }
  override readUint16(offset: number): number {
    this.need(offset, 2);
    return super.readUint16(offset);
  }
  override readInt32(offset: number): number {
    this.need(offset, 4);
    return super.readInt32(offset);
  }

  // Strings: length in range and NUL-terminated, as the C++ Verifier requires.
  override __string(offset: number, optEncoding?: flatbuffers.Encoding): string | Uint8Array {
    offset += this.readInt32(offset);
    const length = this.readInt32(offset);
    offset += 4;
    if (length < 0) throw new MalformedFrame('negative string length');
    this.need(offset, length + 1);
    if (this.bytes()[offset + length] !== 0) throw new MalformedFrame('string is not NUL-terminated');
    this.charge(length);
    const bytes = this.bytes().subarray(offset, offset + length);
    if (optEncoding === flatbuffers.Encoding.UTF8_BYTES) return bytes;
    return this.decoder.decode(bytes);
  }

  /** Takes `n` bytes from this frame's decode budget; throws MalformedFrame once it is spent. */
  charge(n: number): void {
    this.decodeLeft -= n;
    if (this.decodeLeft < 0)
      throw new MalformedFrame(`frame decodes to more than ${MAX_DECODED_BYTES} bytes (a shared string counts each time it is read)`);
  }

  // Vectors: the length word and the elements must lie inside the frame (elements are at least
  // one byte, so a length larger than what is left is always malformed).
  override __vector_len(offset: number): number {
    const start = offset + this.readInt32(offset);
    const len = this.readInt32(start);
    if (len < 0 || start + 4 + len > this.size) throw new MalformedFrame('vector runs past the frame');
    return len;
  }
}

// Constants of the wire protocol (design/protocol.md; protocol/include/outrun/protocol/frame.h).
// These are framing rules, not part of the FlatBuffers schema, so they are repeated here; a unit
// test checks them against frame.h.

/** Bumped by the daemon when a peer could misread a frame; sent in ClientHello/ServerHello. */
export const PROTOCOL_VERSION = 2;
/** Largest FlatBuffer (after the 4-byte length) a peer may send: 16 MiB. */
export const MAX_FRAME_SIZE = 16 * 1024 * 1024;
/** Smallest FlatBuffer that can hold a root offset and a table. */
export const MIN_FRAME_SIZE = 8;
/** Size of the little-endian length prefix. */
export const LENGTH_PREFIX_SIZE = 4;
/** Deepest Value nesting the daemon accepts or sends (kMaxValueDepth). */
export const MAX_VALUE_DEPTH = 32;
/** Script keys are 1..256 bytes, sources at most 1 MiB (outrun/runner.h). */
export const MAX_KEY_BYTES = 256;
export const MAX_SOURCE_BYTES = 1024 * 1024;
/** Inputs per evaluation (kMaxInputs) and their decoded size (kMaxInputBytes). */
export const MAX_INPUTS = 4096;
export const MAX_INPUT_BYTES = 8 * 1024 * 1024;
/** Tag ids are 1..256 bytes (tags::kMaxTagIdSize); at most 4096 per ReadTags, Subscribe or RemoveTags, 65,536 updates per SourceUpdates (tags_wire.h). */
export const MAX_TAG_ID_BYTES = 256;
export const MAX_TAG_IDS = 4096;
export const MAX_SOURCE_UPDATES = 65536;
/** An Evaluate frame is split once its FlatBuffer passes this size (as outrun::Client does). */
export const EVALUATE_SPLIT_BYTES = 4 * 1024 * 1024;
/** Tables/values one received frame may decode to (the C++ verifier's kVerifierMaxTables). */
export const MAX_DECODED_NODES = 4_000_000;
/** String and byte-vector bytes one received frame may decode to, each use counted (4 × MAX_FRAME_SIZE, as kMaxResultsDecodeBytes). */
export const MAX_DECODED_BYTES = 4 * MAX_FRAME_SIZE;
/**
 * What one TagValue entry of a received TagChanges/TagValues frame counts against that frame's
 * MAX_DECODED_BYTES, besides its strings (counted as read) and its value's nodes: about what a
 * decoded change costs in JavaScript (the object, two Dates, the value). So a frame decodes to at
 * most 131,072 changes, however many entries point at one TagValue; outrund splits TagChanges
 * at about 4 MiB (under 120,000 of the smallest entries) and answers at most 4096 per ReadTags.
 */
export const DECODED_TAG_ENTRY_BYTES = 512;

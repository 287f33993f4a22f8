// @outrun/client: a Node.js client for outrund (README.md).
export { connect, defaultSocketPath, Client, Script, Subscription, PUSHED_BODIES } from './client';
export type { DefineResult, LogLevel, LogLine, LogRecord, LogPage } from './client';
export { dateToTicks, ticksToDate, EPOCH_TICKS } from './tags';
export type { TagChange, SourceUpdate, TagOutputValue, TagInputValue } from './tags';
export { STATUS_CODES, statusCodeName, toStatusCode, isGood, isUncertain, isBad } from './opcua-status';
export type { Result, Request, ConnectOptions, ServerInfo, ClientEvents, RegisterOptions } from './client';
export { OutrunError, STATUS_NAMES, statusName } from './status';
export type { StatusName } from './status';
export { Double, double } from './values';
export type { InputValue, OutputValue, Inputs } from './values';
export { FrameReader, FrameError } from './frame-reader';
export type { FrameErrorKind } from './frame-reader';
export * as constants from './constants';
export { MAX_JSON_DEPTH, MAX_JSON_CONTAINERS } from './json';
/** Low-level frame encoding/decoding (tests, tools, fake servers). */
export * as wire from './wire';

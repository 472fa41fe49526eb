#!/usr/bin/env node
/*
 * runcell's in-sandbox JavaScript kernel (Node.js built-ins only).
 *
 * Runs code cells in one persistent global scope, REPL style, and reports on a
 * framed-JSON channel to the host, exactly like ../python/runcell_kernel.py:
 *
 * - fd 3: the protocol channel (bidirectional Unix stream socket). Each frame is
 *   a 4-byte big-endian length followed by one UTF-8 JSON object (<= 64 MiB).
 * - fds 1 and 2: the user's stdout and stderr, read raw by the host.
 *   process.stdout/process.stderr (and so console.*) are replaced by streams
 *   that write synchronously, so everything a cell printed is in the pipes
 *   before its `done` frame. Nothing the user prints travels on fd 3.
 *
 * Start it as `node runcell_js_kernel.js` with the channel on fd 3 and
 * runcell_js_source.js (the source adjustments below) beside it.
 *
 * How cells run
 * -------------
 * Each cell is evaluated by V8 itself in "REPL mode", the mode Chrome DevTools'
 * console uses, reached through an in-process inspector session
 * (`inspector.Session`, `Runtime.evaluate` with `replMode: true`; no port is
 * opened). That gives, without rewriting the user's code:
 *   - one global scope: `let`/`const`/`class`/`function` of one cell are seen by
 *     later cells; the code runs in the main realm (no vm-context realm issues);
 *   - top-level `await`, and declarations in such a cell persist too;
 *   - re-running a cell works: `let x` may be declared again with `let`, `const`
 *     with `const`, `class` with `class` (changing the kind, e.g. `let x` then
 *     `const x`, stays a SyntaxError, as in DevTools);
 *   - the value of the last expression statement (the completion value) is the
 *     result: `1 + 1` -> 2, `let x = 1` -> nothing.
 *
 * Interrupts (SIGINT from the host; details at SigintControl):
 *   - the synchronous part of a cell runs inside `vm.Script#runInThisContext(
 *     {breakOnSigint: true})`: SIGINT terminates it at once;
 *   - while a cell awaits, SIGINT ends it at once; what it awaited may still
 *     finish (and print) later, as nothing can cancel a pending promise;
 *   - synchronous code that keeps the main thread busy outside such a run (a
 *     loop after an `await`, in a timer or I/O callback) is terminated through
 *     the inspector by a watcher thread if SIGINT has not been taken after
 *     300 ms;
 * in each case the cell reports a KeyboardInterrupt error and status
 * "interrupted", and the session and its state live on.
 *
 * Small source adjustments (line numbers are kept; in runcell_js_source.js):
 *   - a cell that starts with `{` and parses as an expression is wrapped in
 *     parentheses, so `{a: 1}` is an object, as in the Node REPL;
 *   - `import()` (which Node does not allow in inspector-evaluated code) calls a
 *     helper that imports relative to the working directory, and static
 *     `import x from 'm'` / `import {a as b} from 'm'` / `import * as n from 'm'` /
 *     `import 'm'` statements become `const ... = await import('m')`.
 *
 * Limits
 * ------
 * - Interrupts: a terminated callback drops the promise reactions queued at
 *   that moment (V8 empties its microtask queue), so promises of the
 *   interrupted code may never settle; blocking calls in C++ (execSync,
 *   Atomics.wait) end only when they return; user code that adds its own
 *   process.on('SIGINT') listener takes SIGINT over while it has one.
 * - An exception thrown from a callback (timer, I/O) while a cell is awaiting
 *   ends that cell with the exception (status "error"); at any other time it is
 *   written to stderr. Unhandled promise rejections are written to stderr.
 *   Neither ends the kernel.
 * - process.exit() throws a SystemExit error instead of ending the session.
 * - Child processes inherit fd 3 (Node.js cannot mark it close-on-exec).
 * - Without the inspector (a Node built with --without-inspector) cells run as
 *   plain `vm.Script`s: no redeclaration, and a cell with top-level `await` runs
 *   in an async function whose declarations do not persist.
 */
'use strict';

const fs = require('fs');
const net = require('net');
const path = require('path');
const util = require('util');
const vm = require('vm');
const Module = require('module');
const { Writable } = require('stream');
// Beside this file in the kernel directory, as in the source tree.
const { IMPORT_HELPER, prepareSource } = require('./runcell_js_source.js');
// Snapshots of the session's bindings (issue 17), beside this file too.
const snapshots = require('./runcell_js_snapshot.js');

const CHANNEL_FD = 3;
const MAX_FRAME = 64 * 1024 * 1024;
const MAX_TEXT = 1024 * 1024; // characters per text MIME string
const MAX_IMAGE = 16 * 1024 * 1024; // characters per base64 image string
// What one cell's displays and results may take, as frames (the host enforces the same
// limits, crates/kernel/src/process.rs; checking here first saves sending what it drops).
const MAX_RESULT = 8 * 1024 * 1024; // bytes per display, result or error frame
const MAX_RESULTS = 64; // displays and results per cell
const MAX_RESULTS_BYTES = 16 * 1024 * 1024; // bytes of them per cell
const KERNEL_FILE = __filename;
const SOURCE_FILE = require.resolve('./runcell_js_source.js');
const RUNNER_FILE = '[runcell-kernel]';
const HOOKS = Symbol.for('runcell.kernel');
const MIMEBUNDLE = Symbol.for('runcell.mimebundle');
const OBJECT_GROUP = 'runcell';
const SIGINT_POLL_MS = 20; // how often a pending SIGINT is looked for
const STUCK_MS = 300; // a SIGINT not taken in this long: the main thread is stuck in JS
// Shared with the SIGINT watcher thread: [ACK] counts the watcher's pings the main
// thread answered; [CRITICAL] > 0 while the main thread writes a frame.
// [TERMINATED] is set by the watcher when it has terminated main-thread code.
const ACK = 0;
const CRITICAL = 1;
const TERMINATED = 2;
const shared = new Int32Array(new SharedArrayBuffer(12));

// What the kernel uses, kept before user code can replace the globals.
const jsonStringify = JSON.stringify;
const jsonParse = JSON.parse;
const bufferFrom = Buffer.from.bind(Buffer);
const bufferAlloc = Buffer.alloc.bind(Buffer);
const bufferConcat = Buffer.concat.bind(Buffer);
const isBuffer = Buffer.isBuffer.bind(Buffer);
const inspect = util.inspect;
const setImmediateK = setImmediate;
const setIntervalK = setInterval;
const clearIntervalK = clearInterval;
const queueMicrotaskK = queueMicrotask;
const utf8Decoder = new util.TextDecoder('utf-8', { fatal: true });
const sleepCell = new Int32Array(new SharedArrayBuffer(4));

const toWellFormed =
  typeof String.prototype.toWellFormed === 'function'
    ? (s) => String.prototype.toWellFormed.call(s)
    : (s) => s.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, '\ufffd');

// --------------------------------------------------------------------------
// Synchronous writes
// --------------------------------------------------------------------------

class ChannelClosed extends Error {
  constructor(exitCode) {
    super('channel closed');
    this.exitCode = exitCode;
  }
}

class FrameTooLarge extends Error {}

/** Writes all of buf to fd, waiting out EAGAIN (the fd may be non-blocking). */
function writeAll(fd, buf) {
  let offset = 0;
  while (offset < buf.length) {
    try {
      offset += fs.writeSync(fd, buf, offset, buf.length - offset);
    } catch (err) {
      if (err && err.code === 'EAGAIN') {
        Atomics.wait(sleepCell, 0, 0, 1);
        continue;
      }
      if (err && err.code === 'EINTR') continue;
      throw err;
    }
  }
}

function toBuffer(chunk, encoding) {
  if (typeof chunk === 'string') {
    const enc = typeof encoding === 'string' && Buffer.isEncoding(encoding) ? encoding : 'utf8';
    return bufferFrom(chunk, enc);
  }
  if (isBuffer(chunk)) return chunk;
  if (ArrayBuffer.isView(chunk)) return bufferFrom(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  const err = new TypeError(
    'The "chunk" argument must be of type string or an instance of Buffer or Uint8Array. Received ' +
      inspect(chunk),
  );
  err.code = 'ERR_INVALID_ARG_TYPE';
  throw err;
}

/** User output: to the pipe now; a host that went away is not the user's problem. */
function writeOutput(fd, chunk, encoding) {
  const buf = toBuffer(chunk, encoding);
  try {
    writeAll(fd, buf);
  } catch (_) {
    // EPIPE and friends: nobody is reading any more.
  }
}

function warn(message) {
  writeOutput(2, `runcell: ${message}\n`);
}

/** A Writable whose write() has reached the fd when it returns. */
function syncStdio(fd) {
  const stream = new Writable({
    decodeStrings: false,
    write(chunk, encoding, callback) {
      writeOutput(fd, chunk, encoding);
      callback();
    },
    destroy(err, callback) {
      callback(err); // never closes fd 1 or 2
    },
  });
  stream.write = function write(chunk, encoding, callback) {
    if (typeof encoding === 'function') {
      callback = encoding;
      encoding = undefined;
    }
    writeOutput(fd, chunk, encoding);
    if (typeof callback === 'function') process.nextTick(callback, null);
    return true;
  };
  stream.fd = fd;
  stream.isTTY = false;
  stream._type = 'pipe';
  stream._isStdio = true;
  stream.destroySoon = stream.destroy;
  stream.getColorDepth = () => 1;
  stream.hasColors = () => false;
  return stream;
}

// --------------------------------------------------------------------------
// The protocol channel
// --------------------------------------------------------------------------

/** The body of message's frame; FrameTooLarge if it is over `limit` bytes. */
function encodeFrame(message, limit = MAX_FRAME) {
  const body = bufferFrom(
    jsonStringify(message, (key, value) => (typeof value === 'string' ? toWellFormed(value) : value)),
    'utf8',
  );
  if (body.length > limit) {
    throw new FrameTooLarge(`message of ${body.length} bytes is over the ${limit}-byte limit`);
  }
  return body;
}

function sendFrame(message) {
  writeFrame(encodeFrame(message));
}

/** Writes one frame of an encoded body. */
function writeFrame(body) {
  const header = bufferAlloc(4);
  header.writeUInt32BE(body.length, 0);
  // Half a frame would desynchronise the host: no forced termination meanwhile.
  Atomics.add(shared, CRITICAL, 1);
  try {
    writeAll(CHANNEL_FD, bufferConcat([header, body]));
  } catch (err) {
    if (err && (err.code === 'EPIPE' || err.code === 'ECONNRESET')) throw new ChannelClosed(0);
    warn(`protocol channel unwritable: ${err && err.message}`);
    throw new ChannelClosed(1);
  } finally {
    Atomics.sub(shared, CRITICAL, 1);
  }
}

/**
 * Runs fn as kernel bookkeeping the SIGINT watcher must not terminate (it only
 * terminates code that kept the main thread busy for STUCK_MS; user code runs
 * inside such sections only within breakOnSigint runs, which SIGINT stops).
 */
function critical(fn) {
  Atomics.add(shared, CRITICAL, 1);
  try {
    return fn();
  } finally {
    Atomics.sub(shared, CRITICAL, 1);
  }
}

/** Splits the bytes read from the channel into messages. */
class FrameReader {
  constructor() {
    this.chunks = [];
    this.length = 0;
  }

  push(chunk) {
    this.chunks.push(chunk);
    this.length += chunk.length;
  }

  /** The next message, null if incomplete; throws a string for a protocol violation. */
  next() {
    if (this.length < 4) return null;
    const buf = this.chunks.length === 1 ? this.chunks[0] : bufferConcat(this.chunks);
    this.chunks = [buf];
    const size = buf.readUInt32BE(0);
    if (size > MAX_FRAME) throw `frame of ${size} bytes is over the ${MAX_FRAME}-byte limit`;
    if (buf.length < 4 + size) return null;
    const body = buf.subarray(4, 4 + size);
    const rest = buf.subarray(4 + size);
    this.chunks = rest.length ? [rest] : [];
    this.length = rest.length;
    let message;
    try {
      message = jsonParse(utf8Decoder.decode(body));
    } catch (err) {
      throw `frame is not UTF-8 JSON: ${err && err.message}`;
    }
    if (message === null || typeof message !== 'object' || Array.isArray(message)) {
      throw 'frame is not a JSON object';
    }
    return message;
  }
}

// --------------------------------------------------------------------------
// Client tools (issue 22; python/runcell_tools.py is the Python side, docs/tools.md)
// --------------------------------------------------------------------------

// The largest arguments a call may send, as JSON (the host checks the same bound).
const MAX_TOOL_INPUT = 1024 * 1024;
const promiseK = Promise;

/** A failed tool call; `kind` is error, timeout, refused, too_large or cancelled. */
class ToolError extends Error {
  constructor(message, kind = 'error', tool = null) {
    super(message);
    this.name = { error: 'ToolError', timeout: 'ToolTimeout', refused: 'ToolRefused', too_large: 'ToolTooLarge', cancelled: 'ToolCancelled' }[kind] || 'ToolError';
    this.kind = kind;
    this.tool = tool;
  }
}

function jsonTypeOf(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'array';
  if (typeof value === 'number') return Number.isInteger(value) ? 'integer' : 'number';
  if (typeof value === 'object') return 'object';
  return typeof value; // string, boolean, ...
}

function isJsonType(value, kind) {
  const actual = jsonTypeOf(value);
  if (kind === 'number') return actual === 'number' || actual === 'integer';
  if (!['string', 'integer', 'boolean', 'array', 'object', 'null'].includes(kind)) return true;
  return actual === kind;
}

/**
 * Checks value against the JSON Schema subset tools use (as runcell_tools.validate does):
 * TypeError for a wrong type or a missing / unexpected field, RangeError for a value out of
 * bounds; the message names the field.
 */
function validateTool(schema, value, where) {
  if (schema === null || typeof schema !== 'object') return;
  let kinds = schema.type;
  if (typeof kinds === 'string') kinds = [kinds];
  if (Array.isArray(kinds) && kinds.length && !kinds.some((k) => isJsonType(value, k))) {
    throw new TypeError(`${where} must be ${kinds.join(' or ')}, not ${jsonTypeOf(value)}`);
  }
  if (Array.isArray(schema.enum) && !schema.enum.some((o) => jsonStringify(o) === jsonStringify(value))) {
    throw new RangeError(`${where} must be one of ${schema.enum.map((o) => jsonStringify(o)).join(', ')}, not ${jsonStringify(value)}`);
  }
  if (typeof value === 'number') {
    const checks = [['minimum', (v, b) => v >= b, '≥'], ['maximum', (v, b) => v <= b, '≤'],
      ['exclusiveMinimum', (v, b) => v > b, '>'], ['exclusiveMaximum', (v, b) => v < b, '<']];
    for (const [key, ok, word] of checks) {
      if (typeof schema[key] === 'number' && !ok(value, schema[key])) {
        throw new RangeError(`${where} must be ${word} ${schema[key]}, got ${value}`);
      }
    }
  }
  const length = (n, low, high, unit) => {
    if (Number.isInteger(schema[low]) && n < schema[low]) throw new RangeError(`${where} must have at least ${schema[low]} ${unit}, has ${n}`);
    if (Number.isInteger(schema[high]) && n > schema[high]) throw new RangeError(`${where} must have at most ${schema[high]} ${unit}, has ${n}`);
  };
  if (typeof value === 'string') length(value.length, 'minLength', 'maxLength', 'characters');
  if (Array.isArray(value)) {
    length(value.length, 'minItems', 'maxItems', 'items');
    if (schema.items && typeof schema.items === 'object') value.forEach((item, i) => validateTool(schema.items, item, `${where}[${i}]`));
  } else if (value !== null && typeof value === 'object') {
    const props = schema.properties && typeof schema.properties === 'object' ? schema.properties : {};
    for (const name of Array.isArray(schema.required) ? schema.required : []) {
      if (!Object.prototype.hasOwnProperty.call(value, name)) throw new TypeError(`${where} is missing the required field '${name}'`);
    }
    for (const [name, item] of Object.entries(value)) {
      if (Object.prototype.hasOwnProperty.call(props, name)) validateTool(props[name], item, where === 'arguments' ? `'${name}'` : `${where}.${name}`);
      else if (schema.additionalProperties === false) throw new TypeError(`${where} has an unexpected field '${name}'`);
      else if (schema.additionalProperties && typeof schema.additionalProperties === 'object') validateTool(schema.additionalProperties, item, `${where}.${name}`);
    }
  }
}

// --------------------------------------------------------------------------
// MIME bundles
// --------------------------------------------------------------------------

function isBinaryMime(mime) {
  if (mime.startsWith('image/')) return mime !== 'image/svg+xml';
  return mime === 'application/pdf' || mime === 'application/octet-stream';
}

function isJsonMime(mime) {
  return mime === 'application/json' || mime.endsWith('+json');
}

function truncate(text, limit) {
  return `${text.slice(0, limit)}\n… [truncated: ${text.length - limit} more characters]`;
}

function bounded(text) {
  return text.length > MAX_TEXT ? truncate(text, MAX_TEXT) : text;
}

function mimeString(mime, value) {
  if (typeof value === 'string') return value;
  if (value instanceof ArrayBuffer) value = new Uint8Array(value);
  if (ArrayBuffer.isView(value)) {
    const buf = bufferFrom(value.buffer, value.byteOffset, value.byteLength);
    return isBinaryMime(mime) ? buf.toString('base64') : buf.toString('utf8');
  }
  if (isJsonMime(mime) && value !== undefined) {
    try {
      return jsonStringify(value);
    } catch (err) {
      warn(`${mime} output is not valid JSON: ${err && err.message}`);
    }
  }
  return null;
}

/** Every value becomes a bounded string: base64 for binary data, JSON text for JSON types. */
function normaliseBundle(data) {
  const bundle = {};
  if (data === null || typeof data !== 'object') return bundle;
  for (const mime of Object.keys(data)) {
    let text = mimeString(mime, data[mime]);
    if (text === null) continue;
    const limit = isBinaryMime(mime) ? MAX_IMAGE : MAX_TEXT;
    if (text.length > limit) {
      if (mime !== 'text/plain') {
        warn(`${mime} output of ${text.length} characters dropped (limit ${limit})`);
        continue;
      }
      text = truncate(text, limit);
    }
    bundle[mime] = text;
  }
  return bundle;
}

function plainText(value) {
  let text;
  try {
    text = withoutKernelFrames(inspect(value));
  } catch (err) {
    warn(`util.inspect() failed: ${errorName(err)}: ${errorMessage(err)}`);
    text = Object.prototype.toString.call(value);
  }
  return bounded(text);
}

/** {mime: string} for any value; text/plain always comes back. */
function mimeBundle(value) {
  let data = {};
  if (value !== null && (typeof value === 'object' || typeof value === 'function')) {
    let method;
    try {
      method = value[MIMEBUNDLE];
    } catch (_) {
      method = undefined;
    }
    if (typeof method === 'function') {
      try {
        data = normaliseBundle(method.call(value));
      } catch (err) {
        warn(`[Symbol.for('runcell.mimebundle')]() failed: ${errorName(err)}: ${errorMessage(err)}`);
      }
    }
  }
  if (!('text/plain' in data)) data['text/plain'] = plainText(value);
  return data;
}

/** A value that displays as the given MIME data. */
function richValue(mime, data) {
  const bundle = { [mime]: data };
  return {
    [MIMEBUNDLE]: () => bundle,
    [util.inspect.custom]: () => `[${mime}]`,
  };
}

// --------------------------------------------------------------------------
// Errors and tracebacks
// --------------------------------------------------------------------------

function errorName(err) {
  try {
    if (err !== null && typeof err === 'object') {
      if (typeof err.name === 'string' && err.name) return err.name;
      if (err.constructor && typeof err.constructor.name === 'string') return err.constructor.name;
    }
  } catch (_) {
    // fall through
  }
  return 'Error';
}

function errorMessage(err) {
  try {
    if (err !== null && typeof err === 'object' && 'message' in err) return String(err.message);
    return String(err);
  } catch (_) {
    return '<the error cannot be shown>';
  }
}

function isKernelFrame(line) {
  return (
    line.includes('(node:inspector:') ||
    line.includes(' node:inspector:') ||
    line.includes(KERNEL_FILE) ||
    line.includes(SOURCE_FILE) ||
    line.includes(RUNNER_FILE)
  );
}

/**
 * The text of a stack (or util.inspect of an error) without the kernel: in each
 * block of `at` lines, the first kernel frame and everything below it go (they
 * are the kernel calling the cell), with node:vm frames just above them.
 * util.inspect's "... N lines matching cause stack trace ..." would count kernel
 * frames: it goes too.
 */
function userStack(text) {
  const out = [];
  let cutting = false;
  for (const line of text.split('\n')) {
    if (/^\s+\.\.\. \d+ lines? matching cause stack trace \.\.\.$/.test(line)) continue;
    const frame = /^\s+at /.test(line);
    if (!frame) {
      cutting = false;
      out.push(line);
      continue;
    }
    if (cutting || isKernelFrame(line)) {
      if (!cutting) {
        cutting = true;
        while (out.length && /^\s+at .*\bnode:vm:/.test(out[out.length - 1])) out.pop();
      }
      // util.inspect opens the error's own properties at the end of its last frame.
      if (line.endsWith(' {') && out.length && !out[out.length - 1].endsWith(' {')) out[out.length - 1] += ' {';
      continue;
    }
    out.push(line);
  }
  return out.join('\n');
}

/** Stacks inside shown values lose the kernel's frames too. */
function withoutKernelFrames(text) {
  return text.includes('node:inspector') || text.includes(KERNEL_FILE) || text.includes(SOURCE_FILE)
    ? userStack(text)
    : text;
}

function isErrorLike(value) {
  return util.types.isNativeError(value) || value instanceof Error;
}

function describeThrown(value) {
  if (isErrorLike(value)) {
    let text;
    try {
      text = inspect(value);
    } catch (_) {
      text = typeof value.stack === 'string' ? value.stack : `${errorName(value)}: ${errorMessage(value)}`;
    }
    return { name: errorName(value), value: errorMessage(value), traceback: userStack(text) };
  }
  const shown = plainText(value);
  return { name: 'Uncaught', value: shown, traceback: `Uncaught ${shown}` };
}

/** Where a SyntaxError is, as Node prints it: "<cell-3>:2\n  source\n     ^\n\n". */
function syntaxLocation(filename, source, details) {
  if (!details || typeof details.lineNumber !== 'number') return '';
  const line = source.split('\n')[details.lineNumber];
  if (line === undefined) return '';
  const column = Math.max(0, Math.min(details.columnNumber || 0, line.length));
  return `${filename}:${details.lineNumber + 1}\n${line}\n${' '.repeat(column)}^\n\n`;
}

// --------------------------------------------------------------------------
// SIGINT
// --------------------------------------------------------------------------

/**
 * How SIGINT reaches the kernel.
 *
 * vm's breakOnSigint is built on Node's SigintWatchdogHelper: while a script
 * runs, SIGINT goes to a C++ handler that terminates it. Used on its own, each
 * run swaps the process's SIGINT disposition several times (a `process.on
 * ('SIGINT')` listener is removed, the watchdog's handler installed, then a
 * reset-and-exit handler, then the listener again), and a SIGINT landing in
 * those gaps kills the process. So the kernel starts the watchdog helper once,
 * for good (the `contextify` binding's startSigintWatchdog, which the Node REPL
 * uses): runs then only nest inside it and the handler never changes. A SIGINT
 * while no script runs just sets the helper's "pending" flag, which the kernel
 * polls while a cell awaits, and clears (drops) when a cell starts.
 *
 * Without that binding (some future Node), a plain `process.on('SIGINT')`
 * listener plus breakOnSigint is used, with the small gaps described above.
 *
 * The pending flag is watched from a small worker thread (so an idle kernel
 * never wakes up for it). It pings the main thread, which takes the flag: a cell
 * that awaits ends as interrupted. If the main thread does not answer within
 * STUCK_MS it is stuck in synchronous JavaScript outside any vm run (code after
 * an `await`, a timer callback): the watcher then stops that code through the
 * inspector (`Runtime.terminateExecution` from a session connected to the main
 * thread), and the ping, answered now, ends the cell. Termination also drops the
 * promise reactions queued at that moment (V8 empties its microtask queue), so
 * promises of the interrupted code may never settle.
 *
 * User code that adds its own SIGINT listener takes SIGINT over (Node then
 * installs libuv's handler); while it has one, cells are not interruptible, and
 * when the last is removed the kernel puts its handler back.
 */
class SigintControl {
  constructor(onListenerSigint) {
    this.watchdog = null;
    this.watcher = null; // the watcher thread
    this.depth = 0; // nested interruptible runs
    this.repairPending = false;
    this.listenerFlag = false;
    const binding = contextifyBinding();
    if (binding) {
      try {
        if (binding.startSigintWatchdog()) this.watchdog = binding;
      } catch (_) {
        this.watchdog = null;
      }
    }
    if (this.watchdog) {
      process.on('removeListener', (event) => {
        if (event === 'SIGINT' && process.listenerCount('SIGINT') === 0) this.repair();
      });
    } else {
      process.on('SIGINT', () => {
        this.listenerFlag = true;
        onListenerSigint();
      });
    }
  }

  /**
   * Starts the watcher thread; onPing runs on the main thread for each of its
   * pings. Returns false without one (no watchdog, or no worker): the kernel
   * then polls the flag itself while a cell awaits.
   */
  startWatcher(onPing) {
    if (!this.watchdog) return false;
    try {
      const { Worker } = require('worker_threads');
      const worker = new Worker(WATCHER_SOURCE, {
        eval: true,
        workerData: {
          state: shared,
          ACK,
          CRITICAL,
          TERMINATED,
          POLL_MS: SIGINT_POLL_MS,
          STUCK_MS,
          canTerminate: this.prepareForTermination(),
        },
        stdout: true, // not piped into the user's output
        stderr: true,
        resourceLimits: { maxOldGenerationSizeMb: 32, maxYoungGenerationSizeMb: 8 },
        name: 'runcell-sigint',
      });
      worker.on('message', () =>
        critical(() => {
          if (Atomics.exchange(shared, TERMINATED, 0) === 1) this.afterTermination();
          Atomics.add(shared, ACK, 1);
          onPing();
        }),
      );
      worker.on('error', (err) => {
        warn(`the SIGINT watcher failed: ${err && err.message}`);
        this.watcher = null;
      });
      worker.on('exit', () => {
        this.watcher = null;
      });
      worker.unref();
      this.watcher = worker;
      return true;
    } catch (err) {
      warn(`no SIGINT watcher: ${err && err.message}`);
      return false;
    }
  }

  /**
   * Terminating a callback skips the `finally` blocks of Node's own callback
   * machinery, which leaves its async-context stack unbalanced; with Node's
   * consistency check on, that aborts the process. The check is turned off
   * (what `--no-force-async-hooks-checks` does; user code enabling async_hooks
   * turns it back on) and the stack is reset after a termination, as Node does
   * after an uncaught exception. Without that binding, no terminations.
   */
  prepareForTermination() {
    const restore = silenceWarning('process.binding');
    try {
      const asyncWrap = process.binding('async_wrap');
      const fields = asyncWrap.async_hook_fields;
      const kCheck = asyncWrap.constants && asyncWrap.constants.kCheck;
      if (!fields || typeof kCheck !== 'number' || typeof asyncWrap.clearAsyncIdStack !== 'function') return false;
      if (fields[kCheck] > 1) return false; // async_hooks are in use already
      fields[kCheck] = 0;
      this.asyncWrap = asyncWrap;
      return true;
    } catch (_) {
      return false;
    } finally {
      restore();
    }
  }

  afterTermination() {
    // The terminated code may have been leaving a critical section (its finally
    // blocks did not run); only the caller's own section is open now.
    Atomics.store(shared, CRITICAL, 1);
    try {
      this.asyncWrap.clearAsyncIdStack();
    } catch (err) {
      warn(`could not reset the async context after an interrupt: ${err && err.message}`);
    }
  }

  /** Whether a SIGINT came while no script ran; clears it. */
  takePending() {
    if (!this.watchdog) {
      const flag = this.listenerFlag;
      this.listenerFlag = false;
      return flag;
    }
    // A nested start/stop: stop returns the pending flag and clears it.
    this.watchdog.startSigintWatchdog();
    return this.watchdog.stopSigintWatchdog();
  }

  /** Whether SIGINT can stop a script now (not while user listeners own SIGINT). */
  get breakOnSigint() {
    return !this.watchdog || process.listenerCount('SIGINT') === 0;
  }

  enter() {
    this.depth++;
  }

  leave() {
    this.depth--;
    if (this.depth === 0 && this.repairPending) this.repair();
  }

  /** Puts the watchdog's handler back after user listeners left SIG_DFL behind. */
  repair() {
    if (this.depth > 0) {
      this.repairPending = true;
      return;
    }
    this.repairPending = false;
    this.watchdog.stopSigintWatchdog();
    this.watchdog.startSigintWatchdog();
  }
}

/** The SIGINT watcher thread's code (see SigintControl). */
const WATCHER_SOURCE = `
'use strict';
const { parentPort, workerData } = require('worker_threads');
const { state, ACK, CRITICAL, TERMINATED, POLL_MS, STUCK_MS, canTerminate } = workerData;
const binding = process.binding('contextify');
let inspector = null;
if (canTerminate) {
  try {
    inspector = require('inspector');
  } catch (_) {
    inspector = null; // pings only
  }
}
// A session only while it is needed: one still open when the process exits
// makes Node print "Waiting for the debugger to disconnect...".
function terminateMain() {
  let session;
  try {
    session = new inspector.Session();
    session.connectToMainThread();
  } catch (_) {
    return;
  }
  session.post('Runtime.terminateExecution', () => {
    try {
      session.disconnect();
    } catch (_) {
      // gone already
    }
  });
}
let since = 0;
let ack = 0;
let attempts = 0; // terminations the main thread has not answered yet
setInterval(() => {
  if (!binding.watchdogHasPendingSigint()) {
    since = 0;
    attempts = 0;
    return;
  }
  const now = Date.now();
  const answered = Atomics.load(state, ACK);
  if (answered !== ack) attempts = 0;
  if (since === 0 || answered !== ack) {
    since = now;
    ack = answered;
    parentPort.postMessage('sigint');
  } else if (now - since >= STUCK_MS && inspector && attempts < 3 && Atomics.load(state, CRITICAL) === 0) {
    // Stuck: stop the main thread's JavaScript (the host kills the sandbox otherwise).
    attempts++;
    Atomics.store(state, TERMINATED, 1);
    terminateMain();
    since = 0;
  }
}, POLL_MS);
`;

function contextifyBinding() {
  const restore = silenceWarning('process.binding');
  try {
    const binding = process.binding('contextify');
    const names = ['startSigintWatchdog', 'stopSigintWatchdog'];
    return names.every((name) => typeof binding[name] === 'function') ? binding : null;
  } catch (_) {
    return null;
  } finally {
    restore();
  }
}

// --------------------------------------------------------------------------
// The kernel
// --------------------------------------------------------------------------

class Kernel {
  constructor() {
    this.executionCount = 0;
    this.current = null; // the cell being run: {id, count, filename, source, settled}
    this.queue = [];
    this.busy = false;
    this.hooks = { pending: null, captured: undefined, invoke: () => this.invokePending(), capture: (v) => (this.hooks.captured = v) };
    this.runner = new vm.Script(`globalThis[Symbol.for('runcell.kernel')].invoke()`, { filename: RUNNER_FILE });
    this.session = null;
    this.importers = new Map();
    this.declared = new Map(); // this cell's client tools: name -> spec
    this.toolCalls = new Map(); // call number -> {resolve, reject, name}
    this.nextCall = 0;
    this.baseline = new Set(); // globalThis's own names before any cell: not the session's
    this.imported = new Map(); // namespace -> {specifier, cwd}, for snapshots
  }

  /** The global `tools`: `await tools.lookup({id: 3})`, `await tools.call(name, input)`. */
  makeTools() {
    const kernel = this;
    const target = Object.create(null);
    return new Proxy(target, {
      get(_, name) {
        if (typeof name !== 'string' || name === 'then') return undefined;
        if (name === 'call') return (tool, input) => kernel.callTool(String(tool), input, false);
        if (name === 'ToolError') return ToolError;
        return (input = {}) => kernel.callTool(name, input, true);
      },
      has(_, name) {
        return typeof name === 'string' && kernel.declared.has(name);
      },
      ownKeys() {
        return [...kernel.declared.keys()];
      },
      getOwnPropertyDescriptor(_, name) {
        if (typeof name !== 'string' || !kernel.declared.has(name)) return undefined;
        return { value: (input = {}) => kernel.callTool(name, input, true), enumerable: true, configurable: true };
      },
    });
  }

  /** Sends one call of the running cell; a promise of its answer. */
  callTool(name, input, declaredOnly) {
    try {
      const cell = this.current;
      if (cell === null || cell.settled) throw new ToolError(`${name}(): tools can be called only while a cell runs`, 'cancelled', name);
      if (declaredOnly) {
        const spec = this.declared.get(name);
        if (!spec) throw new ToolError(`${name}() is not a tool declared for this execution`, 'refused', name);
        try {
          validateTool(spec.input_schema && typeof spec.input_schema === 'object' ? spec.input_schema : {}, input, 'arguments');
        } catch (err) {
          err.message = `${name}(): ${err.message}`;
          throw err;
        }
      }
      let text;
      try {
        text = jsonStringify(input === undefined ? {} : input);
      } catch (err) {
        throw new TypeError(`${name}(): the arguments are not JSON: ${err && err.message}`);
      }
      const size = bufferFrom(text, 'utf8').length;
      if (size > MAX_TOOL_INPUT) throw new ToolError(`${name}(): the arguments are ${size} bytes as JSON, over the ${MAX_TOOL_INPUT}-byte limit`, 'too_large', name);
      this.nextCall += 1;
      const call = this.nextCall;
      const answer = new promiseK((resolve, reject) => this.toolCalls.set(call, { resolve, reject, name }));
      writeFrame(bufferFrom(`{"type":"tool_call","id":${jsonStringify(cell.id)},"call":${call},"name":${jsonStringify(name)},"input":${text}}`, 'utf8'));
      return answer;
    } catch (err) {
      if (err instanceof ChannelClosed) throw err;
      return promiseK.reject(err);
    }
  }

  /** A `tool_result` frame: the call's promise settles. */
  toolResult(message) {
    const waiting = this.toolCalls.get(message.call);
    if (!waiting) return; // a call of an ended cell
    this.toolCalls.delete(message.call);
    const error = message.error;
    if (error !== undefined && error !== null) {
      const text = typeof error === 'object' ? error.message : error;
      waiting.reject(new ToolError(typeof text === 'string' ? text : jsonStringify(text), (typeof error === 'object' && error.kind) || 'error', waiting.name));
    } else {
      waiting.resolve(message.output);
    }
  }

  /** The cell ended: calls still waiting fail, and its tools go. */
  endTools() {
    const waiting = [...this.toolCalls.values()];
    this.toolCalls.clear();
    this.declared = new Map();
    for (const w of waiting) w.reject(new ToolError('the cell ended before the tool answered', 'cancelled', w.name));
  }

  // ---- set-up ----

  install() {
    Object.defineProperty(globalThis, HOOKS, { value: this.hooks, enumerable: false, writable: false, configurable: false });
    const cwd = process.cwd();
    const filename = path.join(cwd, '<runcell>');
    const userModule = new Module(filename, null);
    userModule.filename = filename;
    userModule.paths = Module._nodeModulePaths(cwd);
    userModule.loaded = true;
    const userRequire = Module.createRequire(filename);
    userModule.require = userRequire;
    const display = this.makeDisplay();
    const globals = {
      require: userRequire,
      module: userModule,
      exports: userModule.exports,
      __filename: filename,
      __dirname: cwd,
      display,
      [IMPORT_HELPER]: (specifier, options) => this.importModule(specifier, options),
      tools: this.makeTools(),
    };
    for (const [name, value] of Object.entries(globals)) {
      Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });
    }
    try {
      const inspector = require('inspector');
      const session = new inspector.Session();
      session.connect();
      this.session = session;
    } catch (err) {
      warn(`no inspector (${err && err.message}): top-level await declarations will not persist`);
    }
    this.baseline = new Set(Object.getOwnPropertyNames(globalThis));
    this.startEnv = { ...process.env };
    this.userRequire = userRequire;
  }

  makeDisplay() {
    const kernel = this;
    function display(...values) {
      for (const value of values) kernel.emitDisplay(mimeBundle(value));
    }
    const raw = (mime) => (data) => display(richValue(mime, data));
    display.html = raw('text/html');
    display.markdown = raw('text/markdown');
    display.svg = raw('image/svg+xml');
    display.png = raw('image/png');
    display.jpeg = raw('image/jpeg');
    display.latex = raw('text/latex');
    display.json = raw('application/json');
    /** A raw MIME bundle, e.g. display.mime({'text/html': '<b>hi</b>'}). */
    display.mime = (bundle) => {
      const data = normaliseBundle(bundle);
      if (!('text/plain' in data)) data['text/plain'] = '';
      kernel.emitDisplay(data);
    };
    return display;
  }

  emitDisplay(bundle) {
    const cell = this.current;
    if (cell === null || cell.settled) {
      // Outside a running cell (a timer): there is no cell to attach it to.
      writeOutput(1, `${bundle['text/plain'] || ''}\n`);
      return;
    }
    this.sendBundle('display', cell, bundle);
  }

  importModule(specifier, options, from) {
    const cwd = from === undefined ? process.cwd() : from;
    let importer = this.importers.get(cwd);
    if (!importer) {
      const loader = vm.constants && vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER;
      if (loader) {
        // Node calls this loader experimental and says so at the first import: not news for the user.
        if (!this.loaderWarningSilenced) silenceWarning('USE_MAIN_CONTEXT_DEFAULT_LOADER');
        this.loaderWarningSilenced = true;
        importer = new vm.Script('(specifier, options) => import(specifier, options)', {
          filename: path.join(cwd, '<runcell>.js'),
          importModuleDynamically: loader,
        }).runInThisContext();
      } else {
        const req = Module.createRequire(path.join(cwd, '<runcell>'));
        importer = (spec, opts) => {
          let target = String(spec);
          if (!target.startsWith('node:') && !Module.isBuiltin(target) && !/^[a-z][a-z0-9+.-]*:/i.test(target)) {
            target = require('url').pathToFileURL(req.resolve(target)).href;
          }
          return import(target, opts);
        };
      }
      this.importers.set(cwd, importer);
    }
    const loading = options === undefined ? importer(specifier) : importer(specifier, options);
    // What was imported from where, so a snapshot can import it again by name.
    return promiseK.resolve(loading).then((ns) => {
      if (ns !== null && typeof ns === 'object' && !this.imported.has(ns)) this.imported.set(ns, { specifier: String(specifier), cwd });
      return ns;
    });
  }

  /** Runs fn() with SIGINT able to stop it (vm's breakOnSigint). */
  interruptible(fn) {
    this.hooks.pending = fn;
    this.sigint.enter();
    try {
      return this.runner.runInThisContext({ breakOnSigint: this.sigint.breakOnSigint, displayErrors: false });
    } finally {
      this.hooks.pending = null;
      this.sigint.leave();
    }
  }

  invokePending() {
    const fn = this.hooks.pending;
    this.hooks.pending = null;
    return fn();
  }

  // ---- the main loop ----

  serve() {
    this.sigint = new SigintControl(() => this.onSigint());
    process.on('uncaughtException', (err) => this.onUncaught(err));
    process.on('unhandledRejection', (reason) => {
      writeOutput(2, `Uncaught (in promise) ${describeThrown(reason).traceback}\n`);
    });
    this.send({ type: 'ready', language: 'javascript', version: process.versions.node, pid: process.pid });
    this.sigint.startWatcher(() => {
      if (this.sigint.takePending()) this.onSigint();
    });
    const reader = new FrameReader();
    const socket = new net.Socket({ fd: CHANNEL_FD, readable: true, writable: false });
    socket.on('data', (chunk) => critical(() => {
      reader.push(chunk);
      for (;;) {
        let message;
        try {
          message = reader.next();
        } catch (violation) {
          warn(`malformed frame on the protocol channel: ${violation}`);
          exit(3);
        }
        if (message === null) break;
        // Answers to the running cell's tool calls are taken at once (the cell awaits them).
        if (message.type === 'tool_result') this.toolResult(message);
        else this.queue.push(message);
      }
      this.pump();
    }));
    socket.on('end', () => {
      if (reader.length) {
        warn('malformed frame on the protocol channel: channel closed in the middle of a frame');
        exit(3);
      }
      exit(0);
    });
    socket.on('error', (err) => {
      if (err && err.code === 'ECONNRESET') exit(0);
      warn(`protocol channel unreadable: ${err && err.message}`);
      exit(1);
    });
  }

  /**
   * Handles the next message one check-phase later, outside the socket's
   * callback (and, with the listener fallback, after a SIGINT aimed at the cell
   * that just ended, already in libuv's signal pipe, has been seen and dropped).
   */
  pump() {
    if (this.busy || this.queue.length === 0) return;
    this.busy = true;
    setImmediateK(() => critical(() => {
      const message = this.queue.shift();
      try {
        this.dispatch(message);
      } catch (err) {
        this.fatal(err);
      }
    }));
  }

  /** The current message is completely handled. */
  idle() {
    this.busy = false;
    this.pump();
  }

  dispatch(message) {
    const kind = message.type;
    try {
      if (kind === 'execute') {
        this.handleExecute(message);
        return;
      }
      if ((kind === 'snapshot' || kind === 'restore') && typeof message.id === 'string') {
        this.handleSnapshot(kind, message);
        return;
      } else {
        this.sendProtocolError(null, `unknown message type ${jsonStringify(kind === undefined ? null : kind)}`);
      }
    } catch (err) {
      if (err instanceof ChannelClosed) throw err;
      warn(`kernel error:\n${err && err.stack}`);
      this.trySend(this.kernelErrorMessage(null, err));
    }
    this.idle();
  }

  handleExecute(message) {
    const { id, code } = message;
    if (typeof id !== 'string') {
      this.sendProtocolError(null, "execute needs a string 'id'");
      this.idle();
    } else if (typeof code !== 'string') {
      this.sendProtocolError(id, "execute needs a string 'code'");
      this.send({ type: 'done', id, status: 'error', execution_count: this.executionCount });
      this.idle();
    } else {
      // Output from here on is this cell's (the host holds what came before).
      if (message.ack === true) this.send({ type: 'started', id });
      this.declared = new Map();
      for (const spec of Array.isArray(message.tools) ? message.tools : []) {
        if (spec && typeof spec === 'object' && typeof spec.name === 'string') this.declared.set(spec.name, spec);
      }
      this.execute(id, code);
    }
  }

  /**
   * `snapshot` or `restore` {id, path} (issue 17; runcell_js_snapshot.js holds what is
   * saved and how): answered like a cell, outside the execution count — the report, or an
   * error (a refused file as `snapshot_refused`), then `done`.
   */
  handleSnapshot(kind, message) {
    const { id, path: file } = message;
    const end = (status) => {
      this.send({ type: 'done', id, status, execution_count: this.executionCount });
      this.idle();
    };
    const failed = (err) => {
      try {
        if (err instanceof ChannelClosed) throw err;
        if (err instanceof snapshots.Refused) {
          this.send({ type: 'snapshot_refused', id, refusal: err.refusal() });
          end('error');
        } else if (err && err.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') {
          this.send({ type: 'error', id, name: 'KeyboardInterrupt', value: '', traceback: 'KeyboardInterrupt' });
          end('interrupted');
        } else {
          this.send({ type: 'error', id, name: 'SnapshotError', value: `${errorName(err)}: ${errorMessage(err)}`, traceback: bounded(String((err && err.stack) || err)) });
          end('error');
        }
      } catch (error) {
        this.fatal(error);
      }
    };
    const succeeded = (report) => {
      try {
        this.send({ type: kind === 'snapshot' ? 'snapshotted' : 'restored', id, ...report });
        end('ok');
      } catch (error) {
        this.fatal(error);
      }
    };
    if (typeof file !== 'string' || !file) {
      this.sendProtocolError(id, `${kind} needs a string 'path'`);
      end('error');
      return;
    }
    if (!this.session) {
      failed(new Error('this Node.js has no inspector: the session keeps only its files'));
      return;
    }
    const ctx = {
      hooks: this.hooks,
      baseline: this.baseline,
      env: this.startEnv,
      imports: this.imported,
      kernelFile: KERNEL_FILE,
      require: this.userRequire,
      importModule: (specifier, cwd) => this.importModule(specifier, undefined, cwd),
      postSync: (method, params) => {
        let answer;
        let failure;
        this.session.post(method, params, (err, res) => {
          if (err) failure = err;
          else answer = res;
        });
        if (failure) throw failure;
        if (answer === undefined) throw new Error(`the inspector did not answer ${method} at once`);
        return answer;
      },
      evaluateRepl: (expression) =>
        new promiseK((resolve) =>
          this.session.post('Runtime.evaluate', { expression, replMode: true, silent: true }, (err, res) =>
            resolve(err ? { exceptionDetails: { text: err.message } } : res),
          ),
        ),
    };
    if (kind === 'snapshot') {
      let report;
      try {
        report = this.interruptible(() => snapshots.save(ctx, file));
      } catch (err) {
        failed(err);
        return;
      }
      succeeded(report);
    } else {
      let loading;
      try {
        loading = snapshots.load(ctx, file);
      } catch (err) {
        failed(err);
        return;
      }
      loading.then(succeeded, failed);
    }
  }

  sendProtocolError(id, text) {
    this.send({ type: 'error', id, name: 'ProtocolError', value: text, traceback: '' });
  }

  send(message) {
    sendFrame(message);
  }

  trySend(message) {
    try {
      this.send(message);
    } catch (err) {
      if (err instanceof ChannelClosed) throw err;
    }
  }

  fatal(err) {
    if (err instanceof ChannelClosed) exit(err.exitCode);
    warn(`kernel error:\n${err && err.stack}`);
    exit(1);
  }

  // ---- one cell ----

  execute(id, code) {
    this.executionCount += 1;
    const count = this.executionCount;
    const cell = {
      id,
      count,
      filename: `<cell-${count}>`,
      source: code,
      settled: false,
      // Displays and results sent, and dropped over the per-cell limits (told in `done`).
      sent: 0,
      sentBytes: 0,
      dropped: 0,
      droppedBytes: 0,
    };
    this.current = cell;
    let source;
    try {
      source = prepareSource(code);
    } catch (err) {
      warn(`could not prepare the cell: ${err && err.stack}`);
      source = code;
    }
    cell.source = source;
    this.sigint.takePending(); // an interrupt from before this cell is not for it
    try {
      this.interruptible(() => (this.session ? this.evaluate(cell) : this.evaluateWithoutInspector(cell)));
    } catch (err) {
      if (err instanceof ChannelClosed) throw err;
      if (err && err.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') this.interrupt(cell);
      else this.kernelFailure(cell, err);
    }
    if (!cell.settled && !this.sigint.watcher) {
      // Waiting (top-level await, or the answer's microtask): look for SIGINTs.
      cell.poll = setIntervalK(() => {
        if (!cell.settled && this.sigint.takePending()) this.onSigint();
      }, SIGINT_POLL_MS);
    }
  }

  evaluate(cell) {
    const expression = `${cell.source}\n//# sourceURL=${cell.filename}`;
    this.session.post(
      'Runtime.evaluate',
      { expression, replMode: true, objectGroup: OBJECT_GROUP },
      // Compile errors answer at once, inside this call: handle every answer later, outside it.
      (err, response) => queueMicrotaskK(() => this.evaluated(cell, err, response)),
    );
  }

  evaluated(cell, err, response) {
    critical(() => this.handleAnswer(cell, err, response));
  }

  handleAnswer(cell, err, response) {
    if (cell.settled) return; // interrupted meanwhile; its late answer is dropped
    try {
      if (err) throw err;
      const details = response.exceptionDetails;
      if (details) {
        const thrown = details.exception ? this.remoteValue(details.exception) : new Error(details.text);
        this.releaseObjects();
        this.failed(cell, thrown, details);
      } else {
        const value = this.remoteValue(response.result);
        this.releaseObjects();
        this.succeeded(cell, value);
      }
    } catch (error) {
      if (error instanceof ChannelClosed) this.fatal(error);
      else if (error && error.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') this.interrupt(cell);
      else this.kernelFailure(cell, error);
    }
  }

  /** The JavaScript value behind an inspector RemoteObject. */
  remoteValue(remote) {
    if (remote.objectId) {
      this.hooks.captured = undefined;
      let failure = null;
      let answered = false;
      this.session.post(
        'Runtime.callFunctionOn',
        {
          objectId: remote.objectId,
          functionDeclaration: `function () { 'use strict'; globalThis[Symbol.for('runcell.kernel')].capture(this); }`,
          silent: true,
        },
        (err, res) => {
          answered = true;
          if (err) failure = err;
          else if (res && res.exceptionDetails) failure = new Error(res.exceptionDetails.text);
        },
      );
      const value = this.hooks.captured;
      this.hooks.captured = undefined;
      if (!answered || failure) throw failure || new Error('the inspector did not hand the value over');
      return value;
    }
    if ('unserializableValue' in remote) {
      const text = remote.unserializableValue;
      if (remote.type === 'bigint' || /n$/.test(text)) return BigInt(text.slice(0, -1));
      return { NaN: NaN, Infinity: Infinity, '-Infinity': -Infinity, '-0': -0 }[text];
    }
    if (remote.type === 'undefined') return undefined;
    return remote.value;
  }

  releaseObjects() {
    try {
      this.session.post('Runtime.releaseObjectGroup', { objectGroup: OBJECT_GROUP });
    } catch (_) {
      // nothing to free
    }
  }

  /** Fallback without an inspector: plain scripts; top-level await in an async function. */
  evaluateWithoutInspector(cell) {
    // Like the inspector's answers, outcomes are handled after the run.
    const later = (fn) =>
      queueMicrotaskK(() =>
        critical(() => {
          if (cell.settled) return;
          try {
            fn();
          } catch (error) {
            if (error instanceof ChannelClosed) this.fatal(error);
            else if (error && error.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') this.interrupt(cell);
            else this.kernelFailure(cell, error);
          }
        }),
      );
    let script;
    let isAsync = false;
    try {
      script = new vm.Script(cell.source, { filename: cell.filename });
    } catch (err) {
      if (!(err instanceof SyntaxError) || !/\bawait\b/.test(cell.source)) {
        later(() => this.failed(cell, err, null));
        return;
      }
      try {
        script = new vm.Script(`(async () => {\n${cell.source}\n})()`, { filename: cell.filename });
        isAsync = true;
      } catch (_) {
        later(() => this.failed(cell, err, null));
        return;
      }
    }
    let value;
    try {
      value = script.runInThisContext({ displayErrors: false });
    } catch (err) {
      if (err && err.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') throw err;
      later(() => this.failed(cell, err, null));
      return;
    }
    if (isAsync) {
      value.then(
        () => later(() => this.succeeded(cell, undefined)),
        (err) => later(() => this.failed(cell, err, null)),
      );
    } else {
      later(() => this.succeeded(cell, value));
    }
  }

  succeeded(cell, value) {
    if (value !== undefined) {
      const bundle = this.interruptible(() => mimeBundle(value));
      this.sendBundle('result', cell, bundle);
    }
    this.settle(cell, 'ok');
  }

  failed(cell, thrown, details) {
    const report = this.interruptible(() => describeThrown(thrown));
    if (isErrorLike(thrown) && report.name === 'SyntaxError' && !report.traceback.includes('<cell-')) {
      report.traceback = syntaxLocation(cell.filename, cell.source, details) + report.traceback;
    }
    this.sendError(cell, report);
    this.settle(cell, 'error');
  }

  interrupt(cell) {
    if (cell.settled) return;
    this.sendError(cell, { name: 'KeyboardInterrupt', value: '', traceback: 'KeyboardInterrupt' });
    this.settle(cell, 'interrupted');
  }

  kernelFailure(cell, err) {
    if (cell.settled) return;
    warn(`kernel error:\n${err && err.stack}`);
    this.trySend(this.kernelErrorMessage(cell.id, err));
    this.settle(cell, 'error');
  }

  kernelErrorMessage(id, err) {
    return {
      type: 'error',
      id,
      name: 'KernelError',
      value: `${errorName(err)}: ${errorMessage(err)}`,
      traceback: bounded(String((err && err.stack) || err)),
    };
  }

  sendError(cell, report) {
    const message = {
      type: 'error',
      id: cell.id,
      name: String(report.name),
      value: bounded(String(report.value)),
      traceback: bounded(String(report.traceback)),
    };
    // An error must reach the host whole: a frame over the per-result limit is not read.
    let body;
    try {
      body = encodeFrame(message, MAX_RESULT);
    } catch (err) {
      if (!(err instanceof FrameTooLarge)) throw err;
      for (const key of ['value', 'traceback']) {
        if (message[key].length > MAX_TEXT / 8) message[key] = truncate(message[key], MAX_TEXT / 8);
      }
      body = encodeFrame(message);
    }
    writeFrame(body);
  }

  /**
   * Sends a display or result of `cell`; one over the per-result limit falls back to its
   * text/plain. Past the cell's limits it is not sent but counted, for `done`.
   */
  sendBundle(kind, cell, bundle) {
    let body;
    try {
      body = encodeFrame({ type: kind, id: cell.id, data: bundle }, MAX_RESULT);
    } catch (err) {
      if (!(err instanceof FrameTooLarge)) throw err;
      warn(`${kind} output dropped to text/plain: ${err.message}`);
      const text = (bundle['text/plain'] || '').slice(0, MAX_TEXT / 8);
      body = encodeFrame({ type: kind, id: cell.id, data: { 'text/plain': text } });
    }
    if (cell.sent >= MAX_RESULTS || cell.sentBytes + body.length > MAX_RESULTS_BYTES) {
      cell.dropped += 1;
      cell.droppedBytes += body.length;
      return;
    }
    cell.sent += 1;
    cell.sentBytes += body.length;
    writeFrame(body);
  }

  /**
   * The cell has its outcome. `done` goes out one check-phase later, so that
   * rejections left unhandled by the cell are reported (on stderr) before it.
   */
  settle(cell, status) {
    if (cell.settled) return;
    cell.settled = true;
    if (cell.poll) clearIntervalK(cell.poll);
    this.endTools();
    setImmediateK(() => critical(() => {
      try {
        const done = { type: 'done', id: cell.id, status, execution_count: cell.count };
        if (cell.dropped) {
          done.dropped_results = cell.dropped;
          done.dropped_bytes = cell.droppedBytes;
        }
        this.send(done);
      } catch (err) {
        this.fatal(err);
      }
      if (this.current === cell) this.current = null;
      this.idle();
    }));
  }

  onSigint() {
    const cell = this.current;
    if (cell === null || cell.settled) return; // between cells, interrupts mean nothing
    try {
      this.interrupt(cell);
    } catch (err) {
      this.fatal(err);
    }
  }

  onUncaught(err) {
    if (err instanceof ChannelClosed) exit(err.exitCode);
    const cell = this.current;
    if (cell !== null && !cell.settled) {
      // Thrown by a callback while the cell awaits: most likely what it waits for.
      try {
        this.sendError(cell, describeThrown(err));
        this.settle(cell, 'error');
        return;
      } catch (error) {
        this.fatal(error);
      }
    }
    writeOutput(2, `Uncaught ${describeThrown(err).traceback}\n`);
  }
}

/** Drops process warnings whose message contains text; returns the undo. */
function silenceWarning(text) {
  const original = process.emitWarning;
  const wrapper = function emitWarning(warning, ...rest) {
    const message = typeof warning === 'string' ? warning : warning && warning.message;
    if (typeof message === 'string' && message.includes(text)) return undefined;
    return original.call(this, warning, ...rest);
  };
  process.emitWarning = wrapper;
  return () => {
    if (process.emitWarning === wrapper) process.emitWarning = original;
  };
}

const processExit = process.exit.bind(process);

function exit(code) {
  processExit(code);
}

/**
 * process.exit() in a cell must not end the session (Python's kernel turns
 * SystemExit into the cell's error too): it throws a SystemExit error instead,
 * which ends the cell when thrown in it, or goes to stderr from a callback.
 */
function userExit(code) {
  const shown = code === undefined ? (process.exitCode === undefined ? 0 : process.exitCode) : code;
  const err = new Error(`process.exit(${shown}) was called; the session goes on`);
  err.name = 'SystemExit';
  err.code = shown;
  Error.captureStackTrace(err, userExit);
  throw err;
}

// --------------------------------------------------------------------------
// Process set-up
// --------------------------------------------------------------------------

function prepareProcess() {
  const stdout = syncStdio(1);
  const stderr = syncStdio(2);
  Object.defineProperty(process, 'stdout', { configurable: true, enumerable: true, get: () => stdout });
  Object.defineProperty(process, 'stderr', { configurable: true, enumerable: true, get: () => stderr });
  try {
    // The global console binds its streams lazily; make sure they are these.
    console._stdout = stdout;
    console._stderr = stderr;
  } catch (_) {
    // an older console: it reads process.stdout on first use
  }
  // Like the REPL: no script arguments.
  process.argv.splice(1);
  process.exit = userExit;
}

function main() {
  try {
    fs.fstatSync(CHANNEL_FD);
  } catch (_) {
    fs.writeSync(2, 'runcell kernel: fd 3 (the protocol channel) is not open\n');
    process.exit(2);
  }
  prepareProcess();
  const kernel = new Kernel();
  kernel.install();
  try {
    kernel.serve();
  } catch (err) {
    kernel.fatal(err);
  }
}

main();

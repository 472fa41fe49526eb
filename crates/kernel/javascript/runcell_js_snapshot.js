/*
 * The JavaScript kernel's language-state snapshots (issue 17, durable sessions), inside the
 * sandbox. runcell_js_kernel.js requires it from beside itself; the host only moves the
 * file's bytes (crates/kernel/src/snapshot.rs).
 *
 * What a snapshot holds: the session's global bindings made by cells, found the way V8
 * itself sees them — `let`/`const`/`class` in the global lexical scope (the inspector's
 * Runtime.globalLexicalScopeNames) and `var`/`function`/implicit globals as properties
 * of globalThis that were not there when the kernel started. Each becomes one of:
 *
 *   value   structured clone (`v8.serialize`): numbers, strings, BigInt, Date, RegExp, Map,
 *           Set, ArrayBuffer and typed arrays, Buffers, Errors, plain objects and arrays,
 *           nested and cyclic. All the values go in ONE serialization, so two names that
 *           hold the same object hold one object again after the restore. Instances of a
 *           class declared in a cell get their class's prototype back (V8 keeps only their
 *           own enumerable fields; the kernel records which objects had which class);
 *   source  a function or class whose source text stands alone (its only scopes are the
 *           script's and the global one: it closes over nothing but other globals) is
 *           re-created by evaluating `fn.toString()`; its own enumerable properties
 *           (static fields, `f.cache = ...`) are restored as values;
 *   module  `require('fs')`, a module from require.cache, an `import`ed namespace or its
 *           default export, or one member of one of those: loaded again by name;
 *   alias   the same function as an earlier name: that name's value again.
 *
 * Anything else is skipped with its reason (a socket, a timer, a promise, a stream, a
 * function closing over local state, a Proxy, a WeakMap, an instance of a library class,
 * a symbol-keyed or non-enumerable property V8 would silently drop, ...): never dropped
 * without saying so.
 *
 * The file has the layout runcell_snapshot.py writes (magic, format 1, length, crc32,
 * then a JSON header and pieces); the header names node's version and V8's serializer
 * format version, and a snapshot of another node major, or of a newer V8 format, is
 * refused as incompatible before anything in it is deserialized.
 */
'use strict';

const fs = require('fs');
const path = require('path');
const util = require('util');
const v8 = require('v8');
const zlib = require('zlib');
const Module = require('module');
const net = require('net');
const stream = require('stream');
const EventEmitter = require('events');

const MAGIC = Buffer.from('\x93RUNCELL-SNAP\r\n\x1a', 'latin1');
const FORMAT_VERSION = 1;
const PREFIX_SIZE = 32; // magic 16, format u32, body length u64, crc32 u32
const MAX_HEADER = 64 * 1024 * 1024;
const MAX_REPORT_NAMES = 4096; // runcell-protocol's MAX_REPORT_NAMES
const MAX_REASON = 300;
// V8's serializer writes its format version as the second byte (after 0xFF).
const V8_FORMAT = v8.serialize(0)[1];
const NODE_MAJOR = process.versions.node.split('.')[0];

class Refused extends Error {
  constructor(reason, message, field, found, expected) {
    super(message || `${field}: ${found} is not ${expected}`);
    this.reason = reason; // missing | truncated | corrupt | incompatible
    this.refusalMessage = message;
    this.field = field;
    this.found = found;
    this.expected = expected;
  }

  refusal() {
    if (this.reason === 'incompatible') {
      return { reason: 'incompatible', field: this.field, found: String(this.found), expected: String(this.expected) };
    }
    return { reason: this.reason, message: this.refusalMessage };
  }
}

// --------------------------------------------------------------------------
// The file
// --------------------------------------------------------------------------

const CRC_TABLE = (() => {
  const t = new Int32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c;
  }
  return t;
})();

/** zlib's crc32 (Node >= 20.15 has it built in; the same function in JS before). */
function crc32(buf, crc = 0) {
  if (typeof zlib.crc32 === 'function') return zlib.crc32(buf, crc);
  let c = ~crc;
  for (let i = 0; i < buf.length; i++) c = CRC_TABLE[(c ^ buf[i]) & 0xff] ^ (c >>> 8);
  return ~c >>> 0;
}

/** Writes a snapshot atomically (a temporary file renamed over `file`); its size. */
function writeFile(file, header, pieces) {
  const headerBytes = Buffer.from(JSON.stringify(header), 'utf8');
  const head = Buffer.alloc(4);
  head.writeUInt32BE(headerBytes.length, 0);
  let crc = crc32(headerBytes, crc32(head));
  let length = 4 + headerBytes.length;
  for (const p of pieces) {
    crc = crc32(p, crc);
    length += p.length;
  }
  const prefix = Buffer.alloc(PREFIX_SIZE);
  MAGIC.copy(prefix, 0);
  prefix.writeUInt32BE(FORMAT_VERSION, 16);
  prefix.writeBigUInt64BE(BigInt(length), 20);
  prefix.writeUInt32BE(crc >>> 0, 28);
  const tmp = path.join(path.dirname(file), `.${path.basename(file)}.tmp-${process.pid}`);
  const fd = fs.openSync(tmp, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_TRUNC, 0o600);
  try {
    for (const b of [prefix, head, headerBytes, ...pieces]) {
      let off = 0;
      while (off < b.length) off += fs.writeSync(fd, b, off, b.length - off);
    }
    fs.closeSync(fd);
    fs.renameSync(tmp, file);
  } catch (err) {
    try {
      fs.closeSync(fd);
    } catch (_) {
      // closed already
    }
    try {
      fs.unlinkSync(tmp);
    } catch (_) {
      // never made
    }
    throw err;
  }
  return PREFIX_SIZE + length;
}

/** (header, pieces per entry) of the snapshot at `file`; Refused if it cannot be trusted. */
function readFile(file) {
  let data;
  try {
    data = fs.readFileSync(file);
  } catch (err) {
    if (err && err.code === 'ENOENT') throw new Refused('missing', `${file} does not exist`);
    if (err && err.code === 'EISDIR') throw new Refused('corrupt', `${file} is a directory, not a snapshot`);
    throw err;
  }
  if (data.length < PREFIX_SIZE) {
    if (data.length && MAGIC.subarray(0, Math.min(data.length, 16)).equals(data.subarray(0, Math.min(data.length, 16)))) {
      throw new Refused('truncated', `${data.length} bytes, shorter than the ${PREFIX_SIZE}-byte prefix`);
    }
    throw new Refused('corrupt', `not a runcell snapshot (${data.length} bytes)`);
  }
  if (!data.subarray(0, 16).equals(MAGIC)) throw new Refused('corrupt', "not a runcell snapshot (its first bytes are not runcell's)");
  const version = data.readUInt32BE(16);
  if (version !== FORMAT_VERSION) throw new Refused('incompatible', '', 'format_version', version, FORMAT_VERSION);
  const length = Number(data.readBigUInt64BE(20));
  const crc = data.readUInt32BE(28);
  if (data.length < PREFIX_SIZE + length) throw new Refused('truncated', `${data.length} bytes, the header says ${PREFIX_SIZE + length}`);
  if (data.length > PREFIX_SIZE + length) throw new Refused('corrupt', `${data.length - PREFIX_SIZE - length} bytes after the end the header gives`);
  const body = data.subarray(PREFIX_SIZE);
  // The checksum first: nothing of a damaged file is parsed, let alone deserialized.
  if (crc32(body) >>> 0 !== crc) throw new Refused('corrupt', 'its checksum does not match its content');
  const headerLength = body.readUInt32BE(0);
  if (headerLength > Math.min(body.length - 4, MAX_HEADER)) throw new Refused('corrupt', `header length ${headerLength} is out of bounds`);
  let header;
  let sizes;
  try {
    header = JSON.parse(body.subarray(4, 4 + headerLength).toString('utf8'));
    sizes = header.entries.map((e) => e.sizes.map((n) => Number(n)));
  } catch (err) {
    throw new Refused('corrupt', `the header is damaged (${err && err.name})`);
  }
  let offset = 4 + headerLength;
  const total = sizes.reduce((a, s) => a + s.reduce((x, y) => x + y, 0), 0);
  if (sizes.some((s) => s.some((n) => !Number.isInteger(n) || n < 0)) || total !== body.length - offset) {
    throw new Refused('corrupt', "the header's sizes do not add up to the file's length");
  }
  const pieces = sizes.map((s) =>
    s.map((n) => {
      const piece = body.subarray(offset, offset + n);
      offset += n;
      return piece;
    }),
  );
  return { header, pieces };
}

function check(header, field, expected, same = (a, b) => a === b) {
  const found = header[field];
  if (!same(found, expected)) throw new Refused('incompatible', '', field, found, expected);
}

function skip(name, reason) {
  let text = String(reason);
  if (text.length > MAX_REASON) text = `${text.slice(0, MAX_REASON)}…`;
  return { name, reason: text };
}

function reportLists(names, skipped) {
  const keepNames = names.slice(0, MAX_REPORT_NAMES);
  const keepSkipped = skipped.slice(0, Math.max(0, MAX_REPORT_NAMES - keepNames.length));
  return { names: keepNames, skipped: keepSkipped, omitted: names.length + skipped.length - keepNames.length - keepSkipped.length };
}

// --------------------------------------------------------------------------
// What a value is
// --------------------------------------------------------------------------

const TYPED_ARRAYS = [
  Int8Array, Uint8Array, Uint8ClampedArray, Int16Array, Uint16Array, Int32Array, Uint32Array,
  Float32Array, Float64Array, BigInt64Array, BigUint64Array,
];
// Prototypes V8's structured clone gives back as they were.
const PLAIN_PROTOTYPES = new Set([
  Object.prototype, Array.prototype, Map.prototype, Set.prototype, Date.prototype, RegExp.prototype,
  ArrayBuffer.prototype, DataView.prototype, Buffer.prototype, Number.prototype, String.prototype,
  Boolean.prototype, BigInt.prototype, ...TYPED_ARRAYS.map((t) => t.prototype),
]);

function describe(value) {
  try {
    const ctor = value && value.constructor;
    if (ctor && typeof ctor.name === 'string' && ctor.name) return ctor.name;
  } catch (_) {
    // a hostile getter
  }
  return Object.prototype.toString.call(value).slice(8, -1);
}

/** Why a value of this kind can never be saved, or null. */
function unsaveable(value) {
  const t = util.types;
  if (typeof value === 'symbol') return 'a symbol';
  if (typeof value === 'function') return null; // the caller decides
  if (value === null || typeof value !== 'object') return null;
  if (t.isProxy(value)) return 'a Proxy';
  if (t.isPromise(value)) return 'a promise (its outcome cannot be saved)';
  if (t.isWeakMap(value) || t.isWeakSet(value) || (typeof WeakRef === 'function' && value instanceof WeakRef)) return `a ${describe(value)} (weak references cannot be saved)`;
  if (t.isGeneratorObject(value)) return 'a generator (its suspended state cannot be saved)';
  if (t.isSharedArrayBuffer(value)) return 'a SharedArrayBuffer';
  if (t.isExternal(value)) return 'a native handle';
  const name = describe(value);
  if (value instanceof net.Socket) return `a socket (${name})`;
  if (value instanceof net.Server) return `a server socket (${name})`;
  if ((name === 'Timeout' || name === 'Immediate') && typeof value.hasRef === 'function') return `a timer (${name})`;
  if (name === 'FileHandle' && typeof value.fd === 'number') return 'an open file';
  if (value instanceof stream.Stream) return `a stream (${name})`;
  if (value instanceof EventEmitter) return `an event emitter (${name})`;
  return null;
}

// --------------------------------------------------------------------------
// Walking values: what V8 would silently drop, and which objects have a class
// --------------------------------------------------------------------------

/**
 * Walks the objects of `root` depth-first, in the order the children come back after a
 * structured clone (own enumerable string keys; Map keys and values; Set values), each
 * once. `visit(obj, where)` for each object; it returns false to not look inside. The
 * same walk over a deserialized copy meets the same objects in the same order.
 */
function walk(root, seen, visit) {
  const stack = [[root, '']];
  while (stack.length) {
    const [value, where] = stack.pop();
    if (value === null || typeof value !== 'object' || seen.has(value)) continue;
    seen.add(value);
    if (visit(value, where) === false) continue;
    const children = [];
    if (value instanceof Map) {
      let i = 0;
      for (const [k, v] of value) {
        children.push([k, `${where}.<key ${i}>`], [v, `${where}.get(${i})`]);
        i++;
      }
    } else if (value instanceof Set) {
      let i = 0;
      for (const v of value) children.push([v, `${where}.<value ${i++}>`]);
    }
    if (!ArrayBuffer.isView(value)) {
      for (const k of Object.keys(value)) children.push([value[k], Array.isArray(value) ? `${where}[${k}]` : `${where}.${k}`]);
    }
    for (let i = children.length - 1; i >= 0; i--) stack.push(children[i]);
  }
}

function isLeaf(value) {
  return (
    value instanceof Date || value instanceof RegExp || value instanceof ArrayBuffer || ArrayBuffer.isView(value) ||
    util.types.isNativeError(value) || util.types.isBoxedPrimitive(value)
  );
}

/**
 * Checks one value before it is serialized: why it cannot be saved (null if it can), and
 * the objects in it that have a class, as [walk index, class name] (index from `base`,
 * counting every object the walk meets). `classes` maps a prototype to its class's name.
 */
function inspectValue(root, classes, seen, base) {
  let problem = null;
  const protos = [];
  let index = base;
  const top = unsaveable(root);
  if (top) return { problem: top, protos, count: 0 };
  if (typeof root === 'function') return { problem: 'a function', protos, count: 0 };
  walk(root, seen, (obj, where) => {
    if (problem) return false;
    const at = where ? ` at ${where}` : '';
    const i = index++;
    const why = unsaveable(obj);
    if (why) {
      problem = `it holds ${why}${at}`;
      return false;
    }
    // V8 saves an error's kind, message, stack and cause, and nothing more.
    if (util.types.isNativeError(obj)) return false;
    const proto = Object.getPrototypeOf(obj);
    if (proto === null) protos.push([i, null]);
    else if (!PLAIN_PROTOTYPES.has(proto)) {
      const cls = classes.get(proto);
      if (cls === undefined) {
        problem = `it holds an instance of ${describe(obj)}${at}, a class not declared in a cell`;
        return false;
      }
      if (cls.privateFields) {
        problem = `it holds an instance of ${cls.name}${at}, whose private fields (#) cannot be saved`;
        return false;
      }
      protos.push([i, cls.name]);
    }
    if (isLeaf(obj)) return false;
    if (Object.getOwnPropertySymbols(obj).length) {
      problem = `it holds an object with symbol-keyed properties${at}`;
      return false;
    }
    for (const k of Object.getOwnPropertyNames(obj)) {
      if (Array.isArray(obj) && k === 'length') continue;
      const d = Object.getOwnPropertyDescriptor(obj, k);
      if (!d.enumerable) {
        problem = `it holds an object with a non-enumerable property ${JSON.stringify(k)}${at}`;
        return false;
      }
      if (d.get || d.set) {
        problem = `it holds an accessor property ${JSON.stringify(k)}${at}`;
        return false;
      }
      if (typeof d.value === 'function') {
        problem = `it holds a function${where || k ? ` at ${where}${Array.isArray(obj) ? `[${k}]` : `.${k}`}` : ''}`;
        return false;
      }
      if (typeof d.value === 'symbol') {
        problem = `it holds a symbol at ${where}.${k}`;
        return false;
      }
    }
    if (obj instanceof Map) {
      for (const [k, v] of obj) {
        for (const x of [k, v]) {
          if (typeof x === 'function' || typeof x === 'symbol') {
            problem = `it holds a ${typeof x} in the Map${at}`;
            return false;
          }
        }
      }
    } else if (obj instanceof Set) {
      for (const x of obj) {
        if (typeof x === 'function' || typeof x === 'symbol') {
          problem = `it holds a ${typeof x} in the Set${at}`;
          return false;
        }
      }
    }
    return true;
  });
  return { problem, protos, count: index - base };
}

// --------------------------------------------------------------------------
// Functions, classes and modules
// --------------------------------------------------------------------------

/**
 * The scopes of a function beyond the script's and the global one (the inspector's
 * [[Scopes]]), as "Kind (names)" strings; null for a bound function. A class's own scope
 * (its name, seen from its methods) is the class's, re-made with it: not counted.
 */
function foreignScopes(ctx, fn, name) {
  ctx.hooks.probe = fn;
  try {
    const r = ctx.postSync('Runtime.evaluate', {
      expression: `globalThis[Symbol.for('runcell.kernel')].probe`,
      objectGroup: 'runcell-snapshot',
      silent: true,
    });
    const props = ctx.postSync('Runtime.getProperties', { objectId: r.result.objectId, ownProperties: true });
    const internal = props.internalProperties || [];
    const scopes = internal.find((p) => p.name === '[[Scopes]]');
    if (!scopes || internal.some((p) => p.name === '[[TargetFunction]]')) return null;
    const list = ctx.postSync('Runtime.getProperties', { objectId: scopes.value.objectId, ownProperties: true });
    const foreign = [];
    for (const s of list.result) {
      const kind = (s.value && s.value.description) || '';
      if (kind === 'Script' || kind === 'Global') continue;
      const vars = ctx
        .postSync('Runtime.getProperties', { objectId: s.value.objectId, ownProperties: true })
        .result.map((v) => v.name);
      if (kind === 'Block' && vars.every((v) => v === name)) continue;
      foreign.push(vars.length ? `${kind}: ${vars.slice(0, 5).join(', ')}${vars.length > 5 ? ', …' : ''}` : kind);
    }
    return foreign;
  } finally {
    ctx.hooks.probe = undefined;
    ctx.postSync('Runtime.releaseObjectGroup', { objectGroup: 'runcell-snapshot' });
  }
}

/** The source that re-creates fn as an expression, or why there is none. */
function functionSource(ctx, fn) {
  const text = Function.prototype.toString.call(fn);
  if (/\{\s*\[native code\]\s*\}\s*$/.test(text)) return { why: 'a built-in or bound function (it has no JavaScript source)' };
  let foreign;
  try {
    foreign = foreignScopes(ctx, fn, fn.name);
  } catch (err) {
    return { why: `its scopes cannot be read (${err && err.message})` };
  }
  if (foreign === null) return { why: 'a bound function' };
  if (foreign.length) return { why: `a function closing over local state (${foreign.join('; ')}): its source alone cannot re-create it` };
  const vm = require('vm');
  for (const candidate of [`(${text}\n)`, `({${text}\n})`]) {
    try {
      new vm.Script(candidate, { filename: '[runcell-kernel]' });
      return { source: text, method: candidate.startsWith('({') };
    } catch (_) {
      // the next form
    }
  }
  return { why: 'its source text does not stand alone' };
}

/** Where a loaded module's exports came from: Map of exports -> {module, how}, members too. */
function moduleIndex(ctx) {
  const index = new Map();
  const add = (value, spec) => {
    if (value !== null && (typeof value === 'object' || typeof value === 'function') && !index.has(value)) index.set(value, spec);
  };
  const members = (exports, spec) => {
    if (exports === null || (typeof exports !== 'object' && typeof exports !== 'function')) return;
    let descriptors;
    try {
      descriptors = Object.getOwnPropertyDescriptors(exports);
    } catch (_) {
      return;
    }
    for (const [key, d] of Object.entries(descriptors)) {
      if ('value' in d && key !== 'default') add(d.value, { ...spec, member: key });
    }
  };
  const loaded = new Set((process.moduleLoadList || []).filter((m) => m.startsWith('NativeModule ')).map((m) => m.slice(13)));
  const tops = [];
  for (const name of Module.builtinModules) {
    if (!loaded.has(name) || name.startsWith('_')) continue;
    try {
      const exports = require(name);
      add(exports, { module: name, how: 'require' });
      tops.push([exports, { module: name, how: 'require' }]);
    } catch (_) {
      // not loadable here
    }
  }
  for (const [file, m] of Object.entries(require.cache)) {
    if (!m || file === ctx.kernelFile || path.dirname(file) === path.dirname(ctx.kernelFile)) continue;
    add(m.exports, { module: file, how: 'require' });
    tops.push([m.exports, { module: file, how: 'require' }]);
  }
  for (const [ns, rec] of ctx.imports) {
    add(ns, { module: rec.specifier, how: 'import', cwd: rec.cwd });
    try {
      add(ns.default, { module: rec.specifier, how: 'import', cwd: rec.cwd, member: 'default' });
    } catch (_) {
      // an uninitialised default
    }
    tops.push([ns, { module: rec.specifier, how: 'import', cwd: rec.cwd }]);
  }
  for (const [exports, spec] of tops) members(exports, spec);
  return index;
}

// --------------------------------------------------------------------------
// The session's bindings
// --------------------------------------------------------------------------

/** [{name, binding: let|const|var, value?, uninitialised?, descriptor?}] in declaration order. */
function bindings(ctx) {
  const vm = require('vm');
  const out = [];
  const seen = new Set();
  const names = ctx.postSync('Runtime.globalLexicalScopeNames', {}).names || [];
  for (const name of names) {
    if (seen.has(name)) continue;
    seen.add(name);
    let value;
    try {
      value = vm.runInThisContext(name, { filename: '[runcell-kernel]' });
    } catch (_) {
      out.push({ name, binding: 'let', uninitialised: true });
      continue;
    }
    let binding = 'let';
    try {
      // Assigning a binding its own value changes nothing, except for a const: it throws.
      ctx.hooks.probe = value;
      vm.runInThisContext(`${name} = globalThis[Symbol.for('runcell.kernel')].probe`, { filename: '[runcell-kernel]' });
    } catch (_) {
      binding = 'const';
    } finally {
      ctx.hooks.probe = undefined;
    }
    out.push({ name, binding, value });
  }
  for (const name of Object.getOwnPropertyNames(globalThis)) {
    if (ctx.baseline.has(name) || seen.has(name)) continue;
    seen.add(name);
    const d = Object.getOwnPropertyDescriptor(globalThis, name);
    if (!d) continue;
    if (d.get || d.set) {
      out.push({ name, binding: 'var', accessor: true });
      continue;
    }
    out.push({ name, binding: 'var', value: d.value, descriptor: { writable: d.writable, enumerable: d.enumerable, configurable: d.configurable } });
  }
  return out;
}

/** Writes the session's bindings to `file`; the `snapshotted` message's fields. */
function save(ctx, file) {
  const started = process.hrtime.bigint();
  const all = bindings(ctx);
  const names = [];
  const skipped = [];
  const entries = [];
  const values = []; // serialized together: shared objects stay shared
  const modules = moduleIndex(ctx);
  const fnNames = new Map(); // function -> the first name holding it
  const classes = new Map(); // prototype -> {name, privateFields}
  const sources = new Map(); // binding name -> functionSource result
  // Functions and classes first: instances anywhere are recorded by their class's name.
  for (const b of all) {
    if (typeof b.value !== 'function' || modules.has(b.value) || fnNames.has(b.value)) continue;
    const src = functionSource(ctx, b.value);
    sources.set(b.name, src);
    if (src.source === undefined) continue;
    fnNames.set(b.value, b.name);
    let proto;
    try {
      proto = b.value.prototype;
    } catch (_) {
      proto = undefined;
    }
    if (proto !== null && typeof proto === 'object' && !classes.has(proto)) {
      classes.set(proto, { name: b.name, privateFields: /^class\b/.test(src.source) && /#[A-Za-z_$]/.test(src.source) });
    }
  }
  const seen = new Set();
  let walked = 0;
  for (const b of all) {
    const entry = { name: b.name, binding: b.binding, sizes: [] };
    if (b.descriptor) entry.descriptor = b.descriptor;
    if (b.uninitialised) {
      skipped.push(skip(b.name, 'never initialised (its cell failed before the declaration ran)'));
      continue;
    }
    if (b.accessor) {
      skipped.push(skip(b.name, 'a global accessor property (getter/setter)'));
      continue;
    }
    const value = b.value;
    if (value !== null && (typeof value === 'object' || typeof value === 'function') && modules.has(value)) {
      Object.assign(entry, { kind: 'module' }, modules.get(value));
    } else if (typeof value === 'function') {
      const first = fnNames.get(value);
      if (first !== undefined && first !== b.name) {
        Object.assign(entry, { kind: 'alias', of: first });
      } else {
        const src = sources.get(b.name) || functionSource(ctx, value);
        if (src.source === undefined) {
          skipped.push(skip(b.name, src.why));
          continue;
        }
        // Its own fields (static fields of a class, properties set on a function).
        const props = {};
        for (const k of Object.keys(value)) props[k] = value[k];
        const checked = inspectValue(props, classes, new Set(), 0);
        if (checked.problem) {
          skipped.push(skip(b.name, `its properties cannot be saved: ${checked.problem}`));
          continue;
        }
        Object.assign(entry, { kind: 'source', source: src.source, method: src.method });
        if (Object.keys(props).length) {
          entry.props = values.length;
          const before = walked;
          const r = inspectValue(props, classes, seen, walked);
          walked += r.count;
          entry.walk = [before, r.count];
          entry.protos = r.protos;
          values.push(props);
        }
      }
    } else {
      const r = inspectValue(value, classes, new Set(), 0);
      if (r.problem) {
        skipped.push(skip(b.name, r.problem));
        continue;
      }
      const before = walked;
      const counted = inspectValue(value, classes, seen, walked);
      walked += counted.count;
      Object.assign(entry, { kind: 'value', index: values.length, walk: [before, counted.count], protos: counted.protos });
      values.push(value);
    }
    entries.push(entry);
    names.push(b.name);
  }
  let blob;
  try {
    blob = v8.serialize(values);
  } catch (err) {
    // Something the checks missed: found name by name, and left out.
    const keep = [];
    for (const e of entries) {
      if (e.kind === 'value' || e.props !== undefined) {
        try {
          v8.serialize(values[e.kind === 'value' ? e.index : e.props]);
        } catch (error) {
          skipped.push(skip(e.name, `cannot be saved (${error && error.message})`));
          names.splice(names.indexOf(e.name), 1);
          continue;
        }
      }
      keep.push(e);
    }
    return saveAgain(file, keep, values, classes, names, skipped, started, ctx);
  }
  return finish(file, entries, blob, names, skipped, started, ctx);
}

/** What cells changed in process.env since the kernel started: {set, unset}. */
function envChanges(ctx) {
  const set = {};
  const unset = [];
  for (const [k, v] of Object.entries(process.env)) if (ctx.env[k] !== v) set[k] = v;
  for (const k of Object.keys(ctx.env)) if (!(k in process.env)) unset.push(k);
  return { set, unset };
}

/** After a binding failed in the shared serialization: the rest, walked anew. */
function saveAgain(file, entries, oldValues, classes, names, skipped, started, ctx) {
  const values = [];
  const seen = new Set();
  let walked = 0;
  for (const e of entries) {
    const slot = e.kind === 'value' ? 'index' : e.props !== undefined ? 'props' : null;
    if (slot === null) continue;
    const value = oldValues[e[slot]];
    const r = inspectValue(value, classes, seen, walked);
    e.walk = [walked, r.count];
    e.protos = r.protos;
    walked += r.count;
    e[slot] = values.length;
    values.push(value);
  }
  return finish(file, entries, v8.serialize(values), names, skipped, started, ctx);
}

function finish(file, entries, blob, names, skipped, started, ctx) {
  const env = envChanges(ctx);
  const changed = Object.keys(env.set).length > 0 || env.unset.length > 0;
  const header = {
    language: 'javascript',
    language_version: process.versions.node,
    serializer: 'v8',
    serializer_version: V8_FORMAT,
    entries: [{ kind: 'values', sizes: [blob.length] }, ...entries],
    // Like the Python kernel's os.environ: the changes, not the whole (the rest is the
    // session's create env, which the host gives the new kernel).
    environ: env,
  };
  if (changed) names.push('process.env');
  const bytes = writeFile(file, header, [blob]);
  return {
    bytes,
    ...reportLists(names, skipped),
    duration_us: Number((process.hrtime.bigint() - started) / 1000n),
  };
}

/** Reads the snapshot at `file` back into the session; the `restored` message's fields. */
async function load(ctx, file) {
  const started = process.hrtime.bigint();
  const { header, pieces } = readFile(file);
  check(header, 'language', 'javascript');
  check(header, 'language_version', process.versions.node, (found) => typeof found === 'string' && found.split('.')[0] === NODE_MAJOR);
  check(header, 'serializer', 'v8');
  // V8 reads every older format of its serializer, never a newer one.
  check(header, 'serializer_version', V8_FORMAT, (found) => Number.isInteger(found) && found <= V8_FORMAT);
  const [valuesEntry, ...entries] = header.entries;
  if (!valuesEntry || valuesEntry.kind !== 'values') throw new Refused('corrupt', 'the header has no values entry');
  let values;
  try {
    values = v8.deserialize(pieces[0][0]);
  } catch (err) {
    throw new Refused('corrupt', `its values cannot be read (${err && err.message})`);
  }
  const names = [];
  const skipped = [];
  const failed = new Set();
  const restored = new Map(); // name -> value
  const pending = [];

  const declare = async (entry, value) => {
    if (entry.binding === 'var') {
      const d = entry.descriptor || { writable: true, enumerable: true, configurable: true };
      Object.defineProperty(globalThis, entry.name, { value, writable: !!d.writable, enumerable: !!d.enumerable, configurable: !!d.configurable });
      return;
    }
    if (!/^[\p{L}\p{Nl}$_][\p{L}\p{Nl}\p{Mn}\p{Mc}\p{Nd}\p{Pc}$_\u200c\u200d]*$/u.test(entry.name)) throw new Error('not an identifier');
    ctx.hooks.restoring = value;
    try {
      const kind = entry.binding === 'const' ? 'const' : 'let';
      const r = await ctx.evaluateRepl(`${kind} ${entry.name} = globalThis[Symbol.for('runcell.kernel')].restoring;`);
      if (r && r.exceptionDetails) {
        const ex = r.exceptionDetails.exception;
        throw new Error((ex && ex.description) || r.exceptionDetails.text);
      }
    } finally {
      ctx.hooks.restoring = undefined;
    }
  };
  const fail = (entry, err) => {
    failed.add(entry.name);
    skipped.push(skip(entry.name, `cannot be restored (${err && err.name ? `${err.name}: ` : ''}${err && err.message ? String(err.message).split('\n')[0] : err})`));
  };
  const done = async (entry, value) => {
    await declare(entry, value);
    restored.set(entry.name, value);
    names.push(entry.name);
  };

  // Modules and values first, then functions and classes (which may extend or read them
  // when they are evaluated), each pass retrying what needed a name not yet back.
  for (const entry of entries) {
    if (typeof entry.name !== 'string') continue;
    try {
      if (entry.kind === 'module') {
        let exports;
        if (entry.how === 'import') exports = await ctx.importModule(entry.module, entry.cwd);
        else exports = ctx.require(entry.module);
        const value = entry.member === undefined ? exports : exports[entry.member];
        if (value === undefined) throw new Error(`${entry.module} has no ${entry.member}`);
        await done(entry, value);
      } else if (entry.kind === 'value') {
        await done(entry, values[entry.index]);
      } else if (entry.kind === 'source' || entry.kind === 'alias') {
        pending.push(entry);
      } else {
        throw new Error(`unknown entry kind ${JSON.stringify(entry.kind)}`);
      }
    } catch (err) {
      fail(entry, err);
    }
  }
  const vm = require('vm');
  let left = pending;
  for (let pass = 0; left.length && pass < 8; pass++) {
    const next = [];
    const errors = new Map();
    for (const entry of left) {
      try {
        if (entry.kind === 'alias') {
          if (!restored.has(entry.of)) {
            if (failed.has(entry.of)) throw new Error(`it is ${entry.of}, which could not be restored`);
            next.push(entry);
            continue;
          }
          await done(entry, restored.get(entry.of));
          continue;
        }
        const code = entry.method ? `({${entry.source}\n})` : `(${entry.source}\n)`;
        let value = vm.runInThisContext(code, { filename: `<restored ${entry.name}>` });
        if (entry.method) value = Object.values(Object.getOwnPropertyDescriptors(value))[0].value;
        if (typeof value !== 'function') throw new Error('its source did not make a function');
        if (entry.props !== undefined) Object.assign(value, values[entry.props]);
        await done(entry, value);
      } catch (err) {
        errors.set(entry, err);
        next.push(entry);
      }
    }
    if (next.length === left.length) {
      for (const entry of next) fail(entry, errors.get(entry) || new Error(`it is ${entry.of}, which could not be restored`));
      left = [];
      break;
    }
    left = next;
  }
  for (const entry of left) fail(entry, new Error('it depends on names that could not be restored'));

  // Instances get their classes back.
  const byIndex = new Map();
  for (const entry of entries) {
    for (const [i, cls] of entry.protos || []) byIndex.set(i, { entry, cls });
  }
  if (byIndex.size) {
    const seen = new Set();
    let index = 0;
    const broken = new Set();
    for (const entry of entries) {
      const slot = entry.kind === 'value' ? entry.index : entry.props;
      if (slot === undefined || !entry.walk) continue;
      const start = index;
      walk(values[slot], seen, (obj) => {
        const want = byIndex.get(index++);
        if (!want) return !isLeaf(obj);
        if (want.cls === null) Object.setPrototypeOf(obj, null);
        else {
          const cls = restored.get(want.cls);
          if (typeof cls === 'function' && cls.prototype) Object.setPrototypeOf(obj, cls.prototype);
          else broken.add(entry.name);
        }
        return !isLeaf(obj);
      });
      if (index - start !== entry.walk[1]) broken.add(entry.name);
    }
    for (const name of broken) {
      skipped.push(skip(name, 'restored, but an object in it did not get its class back (its class could not be restored)'));
    }
  }
  const env = header.environ;
  if (env && typeof env === 'object') {
    let changed = false;
    for (const [k, v] of Object.entries(env.set || {})) {
      if (typeof v === 'string') {
        process.env[k] = v;
        changed = true;
      }
    }
    for (const k of Array.isArray(env.unset) ? env.unset : []) {
      if (typeof k === 'string') {
        delete process.env[k];
        changed = true;
      }
    }
    if (changed) names.push('process.env');
  }
  return {
    ...reportLists(names, skipped),
    duration_us: Number((process.hrtime.bigint() - started) / 1000n),
  };
}

module.exports = { save, load, Refused };

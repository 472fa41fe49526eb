'use strict';
/*
 * Tests for runcell_js_kernel.js: each starts the kernel as a child process with
 * the protocol channel on fd 3 and speaks the protocol, as the host does.
 *
 * Run: node --test test_runcell_js_kernel.js   (Node.js built-ins only)
 *
 * A `pipe` in spawn's stdio array is a Unix socketpair on Linux, so the
 * kernel's fd 3 is a bidirectional stream socket, like the sandbox's channel
 * (checked by the first test).
 */

const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { test } = require('node:test');

const KERNEL = path.join(__dirname, 'runcell_js_kernel.js');
const TIMEOUT_MS = 30000;

function frame(message) {
  const body = Buffer.from(JSON.stringify(message), 'utf8');
  const header = Buffer.alloc(4);
  header.writeUInt32BE(body.length, 0);
  return Buffer.concat([header, body]);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

class Outcome {
  constructor(messages, stdout, stderr) {
    this.messages = messages;
    this.stdout = stdout;
    this.stderr = stderr;
    this.done = messages[messages.length - 1];
    this.displays = messages.filter((m) => m.type === 'display').map((m) => m.data);
    const results = messages.filter((m) => m.type === 'result').map((m) => m.data);
    const errors = messages.filter((m) => m.type === 'error');
    assert.ok(results.length <= 1 && errors.length <= 1, JSON.stringify(messages));
    this.result = results[0] || null;
    this.error = errors[0] || null;
  }

  get status() {
    return this.done.status;
  }

  get text() {
    return this.result ? this.result['text/plain'] : null;
  }
}

/** A kernel child process plus readers of its channel and pipes. */
class KernelProcess {
  static async start(nodeArgs = []) {
    const kernel = new KernelProcess(nodeArgs);
    kernel.ready = await kernel.recv();
    return kernel;
  }

  constructor(nodeArgs) {
    this.workdir = fs.mkdtempSync(path.join(os.tmpdir(), 'runcell-js-kernel-test-'));
    this.child = spawn(process.execPath, [...nodeArgs, KERNEL], {
      cwd: this.workdir,
      env: { ...process.env, HOME: this.workdir, NODE_OPTIONS: '' },
      stdio: ['ignore', 'pipe', 'pipe', 'pipe'],
    });
    this.channel = this.child.stdio[3];
    this.stdout = '';
    this.stderr = '';
    this.messages = [];
    this.waiters = [];
    this.buffer = Buffer.alloc(0);
    this.channelEnded = false;
    this.child.stdout.setEncoding('utf8');
    this.child.stderr.setEncoding('utf8');
    this.child.stdout.on('data', (text) => (this.stdout += text));
    this.child.stderr.on('data', (text) => (this.stderr += text));
    this.channel.on('data', (chunk) => {
      this.buffer = Buffer.concat([this.buffer, chunk]);
      while (this.buffer.length >= 4) {
        const size = this.buffer.readUInt32BE(0);
        if (this.buffer.length < 4 + size) break;
        this.messages.push(JSON.parse(this.buffer.subarray(4, 4 + size).toString('utf8')));
        this.buffer = this.buffer.subarray(4 + size);
      }
      this.wake();
    });
    this.channel.on('end', () => {
      this.channelEnded = true;
      this.wake();
    });
    this.channel.on('error', () => {});
    this.exited = new Promise((resolve) => this.child.on('exit', (code, signal) => resolve({ code, signal })));
    this.exited.then(() => this.wake());
  }

  wake() {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }

  /** Waits until predicate() is true, or fails after the timeout. */
  async until(predicate, what, timeout = TIMEOUT_MS) {
    const deadline = Date.now() + timeout;
    while (!predicate()) {
      if (Date.now() > deadline) {
        throw new Error(`timed out waiting for ${what}; stderr: ${this.stderr}`);
      }
      await new Promise((resolve) => {
        this.waiters.push(resolve);
        setTimeout(resolve, 50);
      });
    }
  }

  async recv(timeout = TIMEOUT_MS) {
    await this.until(() => this.messages.length > 0 || this.channelEnded, 'a message', timeout);
    if (this.messages.length === 0) throw new Error(`channel closed; stderr: ${this.stderr}`);
    return this.messages.shift();
  }

  send(message) {
    this.channel.write(frame(message));
  }

  /** Takes the output so far (waiting a moment for what is already in the pipes). */
  async takeOutput() {
    // The kernel writes output synchronously before `done`: it is already in the
    // pipes; a few loop turns let this process read it.
    await sleep(30);
    const out = [this.stdout, this.stderr];
    this.stdout = '';
    this.stderr = '';
    return out;
  }

  /** Sends an execute; returns a promise of its Outcome. */
  start(code, id = `ex_${Math.random().toString(36).slice(2)}`) {
    this.stdout = '';
    this.stderr = '';
    this.send({ type: 'execute', id, code });
    return this.collect(id);
  }

  async collect(id, timeout = TIMEOUT_MS) {
    const messages = [];
    for (;;) {
      const message = await this.recv(timeout);
      assert.equal(message.id, id, JSON.stringify(message));
      messages.push(message);
      if (message.type === 'done') break;
    }
    const [stdout, stderr] = await this.takeOutput();
    return new Outcome(messages, stdout, stderr);
  }

  run(code) {
    return this.start(code);
  }

  async ok(code) {
    const outcome = await this.run(code);
    assert.equal(outcome.status, 'ok', JSON.stringify(outcome.messages) + outcome.stderr);
    return outcome;
  }

  interrupt() {
    this.child.kill('SIGINT');
  }

  async close() {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      this.channel.end();
      const timer = setTimeout(() => this.child.kill('SIGKILL'), 5000);
      await this.exited;
      clearTimeout(timer);
    }
    fs.rmSync(this.workdir, { recursive: true, force: true });
  }
}

async function withKernel(fn, nodeArgs = []) {
  const kernel = await KernelProcess.start(nodeArgs);
  try {
    await fn(kernel);
  } finally {
    await kernel.close();
  }
}

test('ready, and the channel is a socket on fd 3', () =>
  withKernel(async (k) => {
    assert.deepEqual(k.ready, {
      type: 'ready',
      language: 'javascript',
      version: process.versions.node,
      pid: k.child.pid,
    });
    const outcome = await k.ok("require('fs').fstatSync(3).isSocket()");
    assert.equal(outcome.text, 'true');
  }));

test('let, const, function and class persist across cells', () =>
  withKernel(async (k) => {
    await k.ok('let a = 1; const b = 2; function f(x) { return x * 10 } class C { get v() { return 7 } }');
    assert.equal((await k.ok('a + b + f(3) + new C().v')).text, '40');
    assert.equal((await k.ok('a = 5; a')).text, '5');
    // Re-running a declaring cell works, as in a REPL.
    await k.ok('let a = 100; const b = 200; class C { get v() { return 8 } }');
    assert.equal((await k.ok('a + b + new C().v')).text, '308');
    // Changing the kind of a declaration is not allowed (as in Chrome DevTools).
    const changed = await k.run('const a = 1');
    assert.equal(changed.error.name, 'SyntaxError');
    assert.equal((await k.ok('a')).text, '100');
    assert.equal((await k.ok('var v = 3; globalThis.v')).text, '3');
  }));

test('top-level await, and its declarations persist', () =>
  withKernel(async (k) => {
    const started = Date.now();
    const outcome = await k.ok('await new Promise(r => setTimeout(r, 100)); const x = await Promise.resolve(41); x + 1');
    assert.ok(Date.now() - started >= 100);
    assert.equal(outcome.text, '42');
    assert.equal((await k.ok('x')).text, '41');
    await k.ok('async function g() { return 9 } let y = await g()');
    assert.equal((await k.ok('y * 2')).text, '18');
  }));

test('the last expression is the result', () =>
  withKernel(async (k) => {
    assert.equal((await k.ok('1 + 1')).text, '2');
    assert.equal((await k.ok('let x = 1')).result, null);
    assert.equal((await k.ok("'abc'")).text, "'abc'");
    assert.equal((await k.ok('{a: 1, b: [1, 2]}')).text, '{ a: 1, b: [ 1, 2 ] }');
    assert.equal((await k.ok('undefined')).result, null);
    assert.equal((await k.ok('null')).text, 'null');
    assert.equal((await k.ok('10n ** 20n')).text, '100000000000000000000n');
    assert.equal((await k.ok('-0')).text, '-0');
    assert.equal((await k.ok("Symbol('s')")).text, 'Symbol(s)');
    assert.equal((await k.ok('new Map([[1, 2]])')).text, 'Map(1) { 1 => 2 }');
    assert.equal((await k.ok('console.log(1)')).result, null);
  }));

test('console.log goes to stdout, console.error to stderr, in order and complete', () =>
  withKernel(async (k) => {
    const outcome = await k.ok(
      "console.log('a'); console.error('b'); process.stdout.write('c\\n'); console.warn('d'); console.log({ e: 1 })",
    );
    assert.equal(outcome.stdout, 'a\nc\n{ e: 1 }\n');
    assert.equal(outcome.stderr, 'b\nd\n');
    // Far more than a pipe holds: all of it is out before `done`.
    const big = await k.ok("for (let i = 0; i < 2000; i++) console.log(String(i).padStart(500, '.')); 'end'");
    assert.equal(big.text, "'end'");
    const lines = big.stdout.split('\n');
    assert.equal(lines.length, 2001);
    assert.equal(lines[1999], '1999'.padStart(500, '.'));
  }));

test('a TypeError keeps the output before it, and its stack shows no kernel frames', () =>
  withKernel(async (k) => {
    await k.ok('function boom(o) { return o.x }');
    const outcome = await k.run("console.log('before'); boom(undefined)");
    assert.equal(outcome.status, 'error');
    assert.equal(outcome.stdout, 'before\n');
    assert.equal(outcome.error.name, 'TypeError');
    assert.equal(outcome.error.value, "Cannot read properties of undefined (reading 'x')");
    const tb = outcome.error.traceback;
    assert.match(tb, /^TypeError: Cannot read properties of undefined \(reading 'x'\)/);
    assert.match(tb, /at boom \(<cell-1>:1:29\)/);
    assert.match(tb, /at <cell-2>:1:/);
    assert.doesNotMatch(tb, /runcell_js_kernel|runcell_js_source|node:inspector|runcell-kernel|node:vm/);
    // Thrown after an await, and a thrown non-Error.
    const late = await k.run('await null; null.y');
    assert.equal(late.error.name, 'TypeError');
    assert.doesNotMatch(late.error.traceback, /runcell_js_kernel|runcell_js_source|node:inspector/);
    const odd = await k.run('throw 5');
    assert.equal(odd.status, 'error');
    assert.equal(odd.error.value, '5');
    // Node's own error properties are part of the traceback.
    const enoent = await k.run("require('fs').readFileSync('/nonexistent')");
    assert.equal(enoent.error.name, 'Error');
    assert.match(enoent.error.traceback, /code: 'ENOENT'/);
    assert.equal((await k.ok('1')).text, '1');
  }));

test('a SyntaxError says where', () =>
  withKernel(async (k) => {
    const outcome = await k.run('let ok = 1\nlet = = 2');
    assert.equal(outcome.status, 'error');
    assert.equal(outcome.error.name, 'SyntaxError');
    assert.match(outcome.error.traceback, /^<cell-1>:2\nlet = = 2\n +\^\n\nSyntaxError: /);
  }));

test('SIGINT stops a synchronous infinite loop; the session lives on', () =>
  withKernel(async (k) => {
    await k.ok('let kept = 42');
    for (let round = 0; round < 3; round++) {
      const pending = k.start(`let n${round} = 1; console.log('looping'); while (true) {}`);
      await k.until(() => k.stdout.includes('looping'), 'the loop to start');
      await sleep(50);
      k.interrupt();
      const outcome = await pending;
      assert.equal(outcome.status, 'interrupted');
      assert.equal(outcome.error.name, 'KeyboardInterrupt');
      assert.equal((await k.ok(`kept + n${round}`)).text, '43');
    }
    // Stuck in a getter while the result is shown: interruptible too.
    const pending = k.start("console.log('inspecting'); ({ [require('util').inspect.custom]() { while (true) {} } })");
    await k.until(() => k.stdout.includes('inspecting'), 'the cell to start');
    await sleep(100);
    k.interrupt();
    assert.equal((await pending).status, 'interrupted');
    assert.equal((await k.ok('kept')).text, '42');
  }));

test('SIGINT ends a cell waiting on a promise', () =>
  withKernel(async (k) => {
    await k.ok('const before = 1');
    const started = Date.now();
    const pending = k.start("console.log('waiting'); await new Promise(r => setTimeout(r, 30000)); 'never'");
    await k.until(() => k.stdout.includes('waiting'), 'the cell to start');
    await sleep(100);
    k.interrupt();
    const outcome = await pending;
    assert.equal(outcome.status, 'interrupted');
    assert.equal(outcome.error.name, 'KeyboardInterrupt');
    assert.equal(outcome.result, null);
    assert.ok(Date.now() - started < 10000);
    assert.equal((await k.ok('before + 1')).text, '2');
  }));

test('SIGINT stops synchronous code after an await, and in a timer', () =>
  withKernel(async (k) => {
    await k.ok('const kept = 7');
    const pending = k.start("await null; console.log('spinning'); while (true) {}");
    await k.until(() => k.stdout.includes('spinning'), 'the loop to start');
    k.interrupt();
    const outcome = await pending;
    assert.equal(outcome.status, 'interrupted');
    assert.equal(outcome.error.name, 'KeyboardInterrupt');
    assert.equal((await k.ok('kept')).text, '7');
    const timer = k.start("setTimeout(() => { console.log('in timer'); while (true) {} }, 10); await new Promise(r => setTimeout(r, 30000))");
    await k.until(() => k.stdout.includes('in timer'), 'the timer to start');
    k.interrupt();
    assert.equal((await timer).status, 'interrupted');
    assert.equal((await k.ok("await new Promise(r => setTimeout(r, 20)); 'timers work'")).text, "'timers work'");
  }));

test('SIGINT at any moment of short cells never kills the kernel', () =>
  withKernel(async (k) => {
    const seen = new Set();
    for (let i = 0; i < 60; i++) {
      const pending = k.start(`const t = Date.now(); while (Date.now() - t < ${i % 4}) {} ${i}`);
      setTimeout(() => k.interrupt(), i % 6);
      const outcome = await pending;
      seen.add(outcome.status);
      assert.ok(['ok', 'interrupted'].includes(outcome.status), JSON.stringify(outcome.messages));
    }
    assert.equal((await k.ok("'alive'")).text, "'alive'");
    assert.equal(k.child.exitCode, null);
  }));

test('SIGINT between cells is ignored', () =>
  withKernel(async (k) => {
    k.interrupt();
    await sleep(200);
    assert.equal((await k.ok('3')).text, '3');
  }));

test('unhandled rejections and late errors do not kill the kernel', () =>
  withKernel(async (k) => {
    const outcome = await k.ok("Promise.reject(new Error('nobody listens')); 1");
    assert.equal(outcome.text, '1');
    assert.match(outcome.stderr, /Uncaught \(in promise\) Error: nobody listens/);
    await k.ok("setTimeout(() => { throw new Error('later') }, 300); undefined");
    await k.until(() => k.stderr.includes('later'), 'the late error');
    assert.equal((await k.ok('2')).text, '2');
    // Thrown by a callback while the cell waits: the cell's error.
    const waiting = await k.run("setTimeout(() => { throw new RangeError('in callback') }, 10); await new Promise(() => {})");
    assert.equal(waiting.status, 'error');
    assert.equal(waiting.error.name, 'RangeError');
    assert.equal((await k.ok('3')).text, '3');
  }));

test('require of built-ins, files in the working directory', () =>
  withKernel(async (k) => {
    const outcome = await k.ok(
      "const fs = require('fs'); const path = require('path'); fs.writeFileSync('out.txt', 'hello'); path.join(process.cwd(), 'out.txt')",
    );
    const file = path.join(fs.realpathSync(k.workdir), 'out.txt');
    assert.equal(outcome.text, `'${file}'`);
    assert.equal(fs.readFileSync(path.join(k.workdir, 'out.txt'), 'utf8'), 'hello');
    fs.writeFileSync(path.join(k.workdir, 'helper.js'), 'module.exports = { twice: (x) => 2 * x };');
    assert.equal((await k.ok("require('./helper').twice(21)")).text, '42');
  }));

test('import statements and import()', () =>
  withKernel(async (k) => {
    fs.writeFileSync(path.join(k.workdir, 'm.mjs'), 'export const q = 5; export default 7;');
    await k.ok("import path from 'path'; import { readFileSync as rf } from 'node:fs'; import * as m from './m.mjs'");
    assert.equal((await k.ok("[path.join('a', 'b'), typeof rf, m.q, m.default]")).text, "[ 'a/b', 'function', 5, 7 ]");
    assert.equal((await k.ok("(await import('./m.mjs')).q")).text, '5');
  }));

test('display() sends display messages in order with the result', () =>
  withKernel(async (k) => {
    const outcome = await k.ok("display({ a: 1 }); display.html('<b>x</b>'); 'last'");
    assert.deepEqual(outcome.displays, [{ 'text/plain': '{ a: 1 }' }, { 'text/html': '<b>x</b>', 'text/plain': '[text/html]' }]);
    assert.deepEqual(
      outcome.messages.map((m) => m.type),
      ['display', 'display', 'result', 'done'],
    );
  }));

test('results over the per-cell limits are counted in done, not sent', () =>
  withKernel(async (k) => {
    // ~1 MB each: 16 fit in 16 MiB; the small main result after them still fits.
    const outcome = await k.ok("for (let i = 0; i < 300; i++) display.mime({ 'text/html': 'x'.repeat(1000000), 'text/plain': String(i) }); 7");
    assert.equal(outcome.displays.length, 16);
    assert.equal(outcome.text, '7');
    assert.equal(outcome.done.dropped_results, 284);
    assert.ok(outcome.done.dropped_bytes > 284000000, outcome.done.dropped_bytes);
    const many = await k.ok('for (let i = 0; i < 70; i++) display(i)');
    assert.equal(many.displays.length, 64);
    assert.equal(many.done.dropped_results, 6);
    assert.equal((await k.ok('display(1)')).done.dropped_results, undefined);
  }));

test('execution_count counts executes', () =>
  withKernel(async (k) => {
    assert.equal((await k.ok('1')).done.execution_count, 1);
    assert.equal((await k.run('throw new Error()')).done.execution_count, 2);
    assert.equal((await k.ok('3')).done.execution_count, 3);
  }));

test('unknown messages and bad executes are protocol errors', () =>
  withKernel(async (k) => {
    k.send({ type: 'bogus' });
    const error = await k.recv();
    assert.equal(error.type, 'error');
    assert.equal(error.id, null);
    assert.equal(error.name, 'ProtocolError');
    k.send({ type: 'execute', id: 'ex_x' });
    const bad = await k.recv();
    assert.equal(bad.id, 'ex_x');
    assert.equal(bad.name, 'ProtocolError');
    assert.deepEqual(await k.recv(), { type: 'done', id: 'ex_x', status: 'error', execution_count: 0 });
    assert.equal((await k.ok('7')).text, '7');
  }));

/** Sends a snapshot or restore request; its messages up to `done`. */
async function snapshotRequest(k, type, file, id = `${type}-${Math.random().toString(36).slice(2)}`) {
  k.send({ type, id, path: file });
  const messages = [];
  for (;;) {
    const m = await k.recv();
    assert.equal(m.id, id, JSON.stringify(m));
    messages.push(m);
    if (m.type === 'done') return messages;
  }
}

const STATE = `
import * as osns from 'os';
import { EventEmitter as Emitter } from 'events';
const m = new Map([['a', 1], ['b', { deep: [1, 2, 3] }]]);
const typed = new Float64Array([1.5, 2.5, 3.5]);
const when = new Date(86400000);
const nested = { big: 12345678901234567890n, re: /ab+c/gi, set: new Set([1, 'two']), buf: Buffer.from('hi') };
nested.self = nested;
const sameMap = m;
let counter = 41;
var legacy = 'var';
implicit = 'implicit global';
function add(a, b) { return a + b + counter; }
const twice = (x) => x * 2;
class Point {
  static made = 0;
  constructor(x, y) { this.x = x; this.y = y; Point.made++; }
  norm() { return Math.hypot(this.x, this.y); }
}
class Point3 extends Point {
  constructor(x, y, z) { super(x, y); this.z = z; }
}
const p = new Point(3, 4);
const pts = [new Point3(1, 2, 2), p];
const bare = Object.create(null); bare.k = 'v';
function makeCounter() { let n = 0; return () => ++n; }
const tick = makeCounter();
const timer = setInterval(() => {}, 100000);
const server = require('net').createServer();
const pending = new Promise(() => {});
const withFn = { f() { return 1; } };
const fs = require('fs');
const { join } = require('path');
class Secret { #hidden = 1; }
const secret = new Secret();
process.env.RUNCELL_ADDED = 'in a cell';
delete process.env.HOME;
`;

test('snapshot and restore: values, functions, classes and instances come back; the rest is named', () =>
  withKernel(async (a) => {
    await a.ok(STATE);
    await a.ok('tick(); tick(); clearInterval(timer)');
    const file = path.join(a.workdir, 'state.snap');
    const saved = await snapshotRequest(a, 'snapshot', file);
    const report = saved[0];
    assert.equal(report.type, 'snapshotted', JSON.stringify(saved));
    assert.deepEqual(saved[1].status, 'ok');
    const skipped = Object.fromEntries(report.skipped.map((s) => [s.name, s.reason]));
    assert.deepEqual(Object.keys(skipped).sort(), ['pending', 'secret', 'server', 'tick', 'timer', 'withFn']);
    assert.deepEqual(skipped, {
      tick: 'a function closing over local state (Closure (makeCounter): n): its source alone cannot re-create it',
      timer: 'a timer (Timeout)',
      server: 'a server socket (Server)',
      pending: 'a promise (its outcome cannot be saved)',
      withFn: 'it holds a function at .f',
      secret: 'it holds an instance of Secret, whose private fields (#) cannot be saved',
    });
    assert.deepEqual(report.names.sort(), [
      'Emitter', 'Point', 'Point3', 'Secret', 'add', 'bare', 'counter', 'fs', 'implicit', 'join', 'legacy', 'm', 'makeCounter',
      'nested', 'osns', 'p', 'process.env', 'pts', 'sameMap', 'twice', 'typed', 'when',
    ]);
    assert.ok(report.bytes > 0 && fs.statSync(file).size === report.bytes);

    await withKernel(async (b) => {
      fs.copyFileSync(file, path.join(b.workdir, 'state.snap'));
      const back = await snapshotRequest(b, 'restore', path.join(b.workdir, 'state.snap'));
      assert.equal(back[0].type, 'restored', JSON.stringify(back));
      assert.deepEqual(back[0].names.sort(), report.names.sort());
      assert.deepEqual(back[0].skipped, []);
      const check = await b.ok(`JSON.stringify([
        m.get('b').deep, sameMap === m, m instanceof Map, Array.from(typed), typed instanceof Float64Array,
        when.getTime(), String(nested.big), nested.re.flags, [...nested.set], nested.buf.toString(), Buffer.isBuffer(nested.buf),
        nested.self === nested, counter, legacy, implicit, add(1, 2), twice(5), p.norm(), p instanceof Point,
        pts[0] instanceof Point3, pts[0] instanceof Point, pts[0].z + pts[0].x, pts[1] === p, Point.made,
        Object.getPrototypeOf(bare) === null, typeof fs.readFileSync, join('a', 'b'),
        typeof osns.cpus, Emitter === require('events').EventEmitter, process.env.RUNCELL_ADDED, 'HOME' in process.env,
      ])`);
      assert.equal(check.text, "'" + JSON.stringify([
        [1, 2, 3], true, true, [1.5, 2.5, 3.5], true, 86400000, '12345678901234567890', 'gi', [1, 'two'], 'hi', true,
        true, 41, 'var', 'implicit global', 44, 10, 5, true, true, true, 3, true, 2, true, 'function', 'a/b',
        'function', true, 'in a cell', false,
      ]) + "'");
      // The restored bindings behave as declared: a const stays const, cells may declare again.
      assert.equal((await b.run('counter = 1; counter')).text, '1');
      assert.equal((await b.run('typed = 1')).error.name, 'TypeError');
      await b.ok('const typed = 2; let counter = 5; class Point {}');
      assert.equal((await b.ok('[typed, counter]')).text, '[ 2, 5 ]');
      // The skipped ones are not there.
      assert.equal((await b.run('tick')).error.name, 'ReferenceError');
    });
  }));

test('a damaged, truncated, foreign or missing snapshot is refused and nothing is loaded', () =>
  withKernel(async (a) => {
    await a.ok('const kept = { v: 1 }');
    const file = path.join(a.workdir, 'state.snap');
    assert.equal((await snapshotRequest(a, 'snapshot', file))[0].type, 'snapshotted');
    const good = fs.readFileSync(file);
    await withKernel(async (b) => {
      const target = path.join(b.workdir, 'state.snap');
      const refusal = async (bytes) => {
        if (bytes === null) fs.rmSync(target, { force: true });
        else fs.writeFileSync(target, bytes);
        const messages = await snapshotRequest(b, 'restore', target);
        assert.equal(messages[0].type, 'snapshot_refused', JSON.stringify(messages));
        assert.equal(messages[1].status, 'error');
        return messages[0].refusal;
      };
      const flipped = Buffer.from(good);
      flipped[flipped.length - 3] ^= 0xff;
      assert.equal((await refusal(flipped)).reason, 'corrupt');
      assert.equal((await refusal(good.subarray(0, good.length - 10))).reason, 'truncated');
      assert.equal((await refusal(Buffer.from('not a snapshot at all, not at all.'))).reason, 'corrupt');
      assert.equal((await refusal(null)).reason, 'missing');
      // Another node major: incompatible, named.
      const headerLength = good.readUInt32BE(32);
      const header = JSON.parse(good.subarray(36, 36 + headerLength).toString('utf8'));
      header.language_version = '1.0.0';
      const headerBytes = Buffer.from(JSON.stringify(header));
      const rest = good.subarray(36 + headerLength);
      const head = Buffer.alloc(4);
      head.writeUInt32BE(headerBytes.length);
      const body = Buffer.concat([head, headerBytes, rest]);
      const prefix = Buffer.from(good.subarray(0, 32));
      prefix.writeBigUInt64BE(BigInt(body.length), 20);
      prefix.writeUInt32BE(require('zlib').crc32(body) >>> 0, 28);
      assert.deepEqual(await refusal(Buffer.concat([prefix, body])), {
        reason: 'incompatible', field: 'language_version', found: '1.0.0', expected: process.versions.node,
      });
      assert.equal((await b.run('kept')).error.name, 'ReferenceError');
      // Control: the intact file restores.
      fs.writeFileSync(target, good);
      assert.equal((await snapshotRequest(b, 'restore', target))[0].type, 'restored');
      assert.equal((await b.ok('kept.v')).text, '1');
    });
    // A directory that is not there: the kernel's error, named.
    const failed = await snapshotRequest(a, 'snapshot', '/nonexistent-dir/state.snap');
    assert.equal(failed[0].name, 'SnapshotError');
    assert.match(failed[0].value, /ENOENT/);
    assert.equal(failed[1].status, 'error');
    assert.equal((await a.ok('kept.v')).text, '1');
  }));

test('process.exit() is an error, not the end of the session', () =>
  withKernel(async (k) => {
    await k.ok('const before = 1');
    const outcome = await k.run("console.log('bye'); process.exit(3)");
    assert.equal(outcome.status, 'error');
    assert.equal(outcome.stdout, 'bye\n');
    assert.equal(outcome.error.name, 'SystemExit');
    assert.equal((await k.ok('before')).text, '1');
  }));

test('without the inspector, cells still run (plain scripts)', () => {
  const preload = path.join(os.tmpdir(), `runcell-no-inspector-${process.pid}.js`);
  fs.writeFileSync(
    preload,
    `const Module = require('module');
const load = Module._load;
Module._load = function (request, ...rest) {
  if (request === 'inspector' || request === 'node:inspector') throw new Error('no inspector here');
  return load.call(this, request, ...rest);
};`,
  );
  return withKernel(async (k) => {
    assert.equal((await k.ok('let a = 1; a + 1')).text, '2');
    assert.equal((await k.ok('a')).text, '1');
    assert.equal((await k.ok("await null; 'awaited'")).result, null); // no value from an async cell
    assert.equal((await k.run('undefined.x')).error.name, 'TypeError');
    const pending = k.start("console.log('looping'); while (true) {}");
    await k.until(() => k.stdout.includes('looping'), 'the loop to start');
    k.interrupt();
    assert.equal((await pending).status, 'interrupted');
    assert.equal((await k.ok('a')).text, '1');
  }, ['--require', preload]).finally(() => fs.rmSync(preload, { force: true }));
});

test('EOF on the channel ends the kernel with status 0', async () => {
  const k = await KernelProcess.start();
  try {
    await k.ok('setInterval(() => {}, 1000); 1'); // a busy event loop does not keep it alive
    k.channel.end();
    assert.deepEqual(await k.exited, { code: 0, signal: null });
  } finally {
    await k.close();
  }
});

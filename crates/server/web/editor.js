// A small code editor: a transparent <textarea> (which keeps native editing, selection, undo
// and IME) laid exactly over a highlighted <pre> with the same font, padding and wrapping, so
// the caret stays aligned. Python is highlighted by a hand-written tokenizer.

import { h } from './render.js';

const KEYWORDS = new Set(
  ('False None True and as assert async await break class continue def del elif else except ' +
    'finally for from global if import in is lambda nonlocal not or pass raise return try ' +
    'while with yield match case').split(' '),
);
const BUILTINS = new Set(
  ('abs all any bin bool bytes callable chr dict dir divmod enumerate eval filter float format ' +
    'frozenset getattr globals hasattr hash help hex id input int isinstance issubclass iter ' +
    'len list locals map max min next object oct open ord pow print property range repr ' +
    'reversed round set setattr slice sorted staticmethod str sum super tuple type vars zip ' +
    'self cls Exception ValueError TypeError KeyError IndexError').split(' '),
);

const TOKEN = new RegExp(
  [
    '(?<comment>#[^\\n]*)',
    '(?<string>(?:[rRbBuUfF]{1,2})?(?:\'\'\'[\\s\\S]*?(?:\'\'\'|$)|"""[\\s\\S]*?(?:"""|$)|\'(?:\\\\.|[^\'\\\\\\n])*\'?|"(?:\\\\.|[^"\\\\\\n])*"?))',
    '(?<number>\\b(?:0[xXoObB][\\da-fA-F_]+|\\d[\\d_]*\\.?[\\d_]*(?:[eE][+-]?\\d+)?[jJ]?)|\\.\\d[\\d_]*(?:[eE][+-]?\\d+)?)',
    '(?<decorator>@[A-Za-z_][\\w.]*)',
    '(?<name>[A-Za-z_]\\w*)',
    '(?<op>[-+*/%=<>!&|^~:]+)',
  ].join('|'),
  'g',
);

/** `code` as highlighted nodes (Python; other languages plain). */
export function highlight(code, language = 'python') {
  const frag = document.createDocumentFragment();
  if (language !== 'python') {
    frag.append(code);
    return frag;
  }
  let at = 0;
  let prev = '';
  TOKEN.lastIndex = 0;
  for (let m = TOKEN.exec(code); m; m = TOKEN.exec(code)) {
    if (m[0] === '') {
      TOKEN.lastIndex++;
      continue;
    }
    if (m.index > at) frag.append(code.slice(at, m.index));
    const g = m.groups;
    let cls = null;
    if (g.comment) cls = 'tok-comment';
    else if (g.string) cls = 'tok-string';
    else if (g.number) cls = 'tok-number';
    else if (g.decorator) cls = 'tok-decorator';
    else if (g.op) cls = 'tok-op';
    else if (g.name) {
      if (prev === 'def' || prev === 'class') cls = 'tok-def';
      else if (KEYWORDS.has(g.name)) cls = 'tok-keyword';
      else if (BUILTINS.has(g.name)) cls = 'tok-builtin';
    }
    frag.append(cls ? h('span', { class: cls }, m[0]) : m[0]);
    prev = g.name || (g.op || g.comment || g.string || g.number ? m[0] : prev);
    at = m.index + m[0].length;
  }
  if (at < code.length) frag.append(code.slice(at));
  return frag;
}

/** A read-only highlighted block (audit log, chat steps). */
export function codeBlock(code, language = 'python') {
  return h('pre', { class: 'code-block' }, h('code', {}, highlight(code, language)));
}

const INDENT = '    ';

// Keys that arrive faster than anyone types (a test driver, a typing tool, a password
// manager) are text being entered verbatim: their newlines get no automatic indent, which
// would double the indent the text already carries.
const MACHINE_GAP_MS = 50;

export class Editor {
  /** onRun('next' | 'stay'): Shift+Enter runs and moves on, Ctrl/Cmd+Enter runs in place. */
  constructor({ value = '', language = 'python', onRun = () => {}, label = 'Code' } = {}) {
    this.language = language;
    this.onRun = onRun;
    this.code = h('code');
    this.pre = h('pre', { class: 'editor-hl', 'aria-hidden': 'true' }, this.code);
    this.input = h('textarea', {
      class: 'editor-input',
      spellcheck: 'false',
      autocapitalize: 'off',
      autocomplete: 'off',
      autocorrect: 'off',
      'aria-label': label,
      rows: '1',
    });
    this.input.value = value;
    this.el = h('div', { class: 'editor' }, this.pre, this.input);
    this.input.addEventListener('input', () => this.paint());
    this.lastKey = 0;
    this.input.addEventListener('keydown', (e) => {
      const now = performance.now();
      const burst = now - this.lastKey < MACHINE_GAP_MS;
      this.lastKey = now;
      this.key(e, burst);
    });
    this.paint();
  }

  get value() {
    return this.input.value;
  }

  set value(v) {
    this.input.value = v;
    this.paint();
  }

  focus(options) {
    this.input.focus(options);
  }

  paint() {
    const v = this.input.value;
    // A trailing newline needs a character after it to take up its line in the <pre>.
    this.code.replaceChildren(highlight(v, this.language), v.endsWith('\n') || v === '' ? ' ' : '');
  }

  /** Replaces [start, end) with `text`, through the browser's editing so undo still works. */
  replace(start, end, text, selStart, selEnd) {
    const ta = this.input;
    ta.focus();
    ta.setSelectionRange(start, end);
    const ok = text === '' ? document.execCommand('delete') : document.execCommand('insertText', false, text);
    if (!ok) {
      ta.setRangeText(text, start, end, 'end');
      this.paint();
    }
    if (selStart !== undefined) ta.setSelectionRange(selStart, selEnd ?? selStart);
  }

  key(e, burst) {
    const ta = this.input;
    if (e.key === 'Enter' && e.shiftKey && !e.ctrlKey && !e.metaKey) {
      e.preventDefault();
      this.onRun('next');
      return;
    }
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      this.onRun('stay');
      return;
    }
    if (e.key === 'Escape') {
      ta.blur();
      return;
    }
    const { selectionStart: s, selectionEnd: t, value: v } = ta;
    if (e.key === 'Enter' && !e.altKey && s === t && !burst) {
      // Keep the line's indent, one more level after a colon.
      const lineStart = v.lastIndexOf('\n', s - 1) + 1;
      const line = v.slice(lineStart, s);
      let indent = /^[ \t]*/.exec(line)[0];
      if (this.language === 'python' && /:\s*(#.*)?$/.test(line)) indent += INDENT;
      e.preventDefault();
      this.replace(s, t, `\n${indent}`);
      return;
    }
    if (e.key === 'Tab' && !e.ctrlKey && !e.metaKey && !e.altKey) {
      e.preventDefault();
      const lineStart = v.lastIndexOf('\n', s - 1) + 1;
      if (s === t && !e.shiftKey) {
        const col = s - lineStart;
        this.replace(s, t, ' '.repeat(4 - (col % 4)));
        return;
      }
      // Indent or dedent every selected line.
      const endBase = t > s && v[t - 1] === '\n' ? t - 1 : t;
      let lineEnd = v.indexOf('\n', endBase);
      if (lineEnd < 0) lineEnd = v.length;
      const lines = v.slice(lineStart, lineEnd).split('\n');
      const changed = lines.map((l) =>
        e.shiftKey ? l.replace(/^( {1,4}|\t)/, '') : l === '' ? l : INDENT + l,
      );
      const text = changed.join('\n');
      const firstDelta = changed[0].length - lines[0].length;
      this.replace(
        lineStart,
        lineEnd,
        text,
        Math.max(lineStart, s + firstDelta),
        s === t ? Math.max(lineStart, s + firstDelta) : lineStart + text.length,
      );
    }
  }
}

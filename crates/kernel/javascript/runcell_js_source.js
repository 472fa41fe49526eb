/*
 * The JavaScript kernel's source adjustments (see "Small source adjustments" in
 * runcell_js_kernel.js, which requires this file from beside it; both are written into the
 * kernel directory every sandbox binds). Pure functions of a cell's text; line numbers are
 * kept, so stack traces point at the user's lines.
 */
'use strict';

const vm = require('vm');

// Compiled here only to see whether it parses, never run: named like the kernel's own scripts.
const CHECK_FILE = '[runcell-kernel]';

const REGEX_AFTER_WORD = new Set([
  'return', 'typeof', 'instanceof', 'in', 'of', 'new', 'delete', 'void', 'throw', 'case',
  'do', 'else', 'yield', 'await',
]);
// The global the kernel installs for `import()`, which Node does not allow in code the
// inspector evaluates.
const IMPORT_HELPER = '__runcellImport';
const ID = '[A-Za-z_$][\\w$]*';
// A quoted module specifier, as the named groups q (the quote) and spec.
const SPEC = `(?<q>['"])(?<spec>(?:\\\\.|(?!\\k<q>)[^\\\\\\n])*)\\k<q>`;
const STATIC_IMPORTS = [
  // import 'm'
  [`\\s*${SPEC}`, (m, load) => `await ${load};`],
  // import d, * as ns from 'm'
  [`\\s+(?<def>${ID})\\s*,\\s*\\*\\s*as\\s+(?<ns>${ID})\\s+from\\s*${SPEC}`,
    (m, load) => `const ${m.groups.ns} = await ${load}, ${m.groups.def} = ${m.groups.ns}.default;`],
  // import d, {a, b as c} from 'm'
  [`\\s+(?<def>${ID})\\s*,\\s*\\{(?<names>[^}]*)\\}\\s*from\\s*${SPEC}`, (m, load) => {
    const names = namedImports(m.groups.names);
    return names === null ? null : `const { ${['default: ' + m.groups.def, ...names].join(', ')} } = await ${load};`;
  }],
  // import * as ns from 'm'
  [`\\s*\\*\\s*as\\s+(?<ns>${ID})\\s+from\\s*${SPEC}`, (m, load) => `const ${m.groups.ns} = await ${load};`],
  // import {a, b as c} from 'm'
  [`\\s*\\{(?<names>[^}]*)\\}\\s*from\\s*${SPEC}`, (m, load) => {
    const names = namedImports(m.groups.names);
    return names === null ? null : `const { ${names.join(', ')} } = await ${load};`;
  }],
  // import d from 'm'
  [`\\s+(?<def>${ID})\\s+from\\s*${SPEC}`, (m, load) => `const ${m.groups.def} = (await ${load}).default;`],
].map(([body, build]) => [new RegExp(`^import${body}[ \\t]*;?`), build]);

function isIdStart(ch) {
  return /[A-Za-z_$#]/.test(ch) || ch > '\u007f';
}

function isIdPart(ch) {
  return /[\w$]/.test(ch) || ch > '\u007f';
}

/** `a, b as c, default as d` as destructuring properties, or null if it is something else. */
function namedImports(list) {
  const parts = [];
  for (const raw of list.replace(/\/\/[^\n]*|\/\*[\s\S]*?\*\//g, '').split(',')) {
    const item = raw.trim();
    if (!item) continue;
    const m = new RegExp(`^(${ID}|'[^'\\\\]*'|"[^"\\\\]*")(?:\\s+as\\s+(${ID}))?$`).exec(item);
    if (!m) return null;
    if (!m[2] && !/^[A-Za-z_$]/.test(m[1])) return null; // a string name needs `as`
    parts.push(m[2] ? `${m[1]}: ${m[2]}` : m[1]);
  }
  return parts;
}

/** `const ... = await import(...)` for the static import at the start of text, or null. */
function staticImport(text) {
  for (const [re, build] of STATIC_IMPORTS) {
    const m = re.exec(text);
    if (!m) continue;
    const load = `${IMPORT_HELPER}(${m.groups.q}${m.groups.spec}${m.groups.q})`;
    const replacement = build(m, load);
    if (replacement === null) return null;
    // Keep the line count, so later line numbers in stack traces stay right.
    const newlines = (m[0].match(/\n/g) || []).length;
    return { length: m[0].length, text: replacement + '\n'.repeat(newlines) };
  }
  return null;
}

/**
 * Rewrites `import(...)` and top-level static imports. A small tokenizer skips
 * strings, template literals, comments and regular expression literals, so only
 * real `import` keywords are touched.
 */
function rewriteImports(src) {
  if (!src.includes('import')) return src;
  const n = src.length;
  const edits = [];
  const templates = []; // brace depth at each open `${`
  let depth = 0; // (), [] and {} together
  let prev = ''; // previous significant token: '', a punctuator, 'word:<w>', 'value'
  let i = 0;

  const skipSpace = (j) => {
    for (;;) {
      while (j < n && /\s/.test(src[j])) j++;
      if (src.startsWith('//', j)) {
        while (j < n && src[j] !== '\n') j++;
      } else if (src.startsWith('/*', j)) {
        const end = src.indexOf('*/', j + 2);
        j = end < 0 ? n : end + 2;
      } else {
        return j;
      }
    }
  };
  // Scans template characters from j; returns the index after the closing ` or ${.
  const scanTemplate = (j) => {
    while (j < n) {
      const ch = src[j];
      if (ch === '\\') j += 2;
      else if (ch === '`') return j + 1;
      else if (ch === '$' && src[j + 1] === '{') {
        templates.push(depth);
        depth++;
        return j + 2;
      } else j++;
    }
    return n;
  };
  const matchingParen = (j) => {
    // j is at '('; a rough scan (strings skipped) for the matching ')'.
    let level = 0;
    while (j < n) {
      const ch = src[j];
      if (ch === '"' || ch === "'" || ch === '`') {
        const q = ch;
        j++;
        while (j < n && src[j] !== q) j += src[j] === '\\' ? 2 : 1;
      } else if (ch === '(') level++;
      else if (ch === ')' && --level === 0) return j;
      j++;
    }
    return -1;
  };

  while (i < n) {
    i = skipSpace(i);
    if (i >= n) break;
    const ch = src[i];
    if (ch === '"' || ch === "'") {
      i++;
      while (i < n && src[i] !== ch && src[i] !== '\n') i += src[i] === '\\' ? 2 : 1;
      i++;
      prev = 'value';
    } else if (ch === '`') {
      i = scanTemplate(i + 1);
      prev = 'value';
    } else if (ch === '}' && templates.length && templates[templates.length - 1] === depth - 1) {
      templates.pop();
      depth--;
      i = scanTemplate(i + 1);
      prev = 'value';
    } else if (ch === '/') {
      const regexAllowed =
        prev === '' ||
        (prev.startsWith('word:') ? REGEX_AFTER_WORD.has(prev.slice(5)) : prev !== 'value' && !')]}'.includes(prev));
      if (!regexAllowed) {
        i++;
        prev = '/';
        continue;
      }
      let j = i + 1;
      let inClass = false;
      while (j < n && src[j] !== '\n') {
        if (src[j] === '\\') j += 2;
        else if (src[j] === '[') (inClass = true), j++;
        else if (src[j] === ']') (inClass = false), j++;
        else if (src[j] === '/' && !inClass) break;
        else j++;
      }
      if (j >= n || src[j] !== '/') {
        i++;
        prev = '/';
        continue;
      }
      i = j + 1;
      while (i < n && isIdPart(src[i])) i++;
      prev = 'value';
    } else if (isIdStart(ch)) {
      let j = i + 1;
      while (j < n && isIdPart(src[j])) j++;
      const word = src.slice(i, j);
      if (word === 'import' && prev !== '.') {
        const after = skipSpace(j);
        if (src[after] === '(') {
          const close = matchingParen(after);
          const next = close < 0 ? -1 : skipSpace(close + 1);
          if (!(next >= 0 && src[next] === '{')) edits.push({ start: i, end: j, text: IMPORT_HELPER });
        } else if (src[after] !== '.' && depth === 0 && templates.length === 0) {
          const stmt = staticImport(src.slice(i));
          if (stmt) {
            edits.push({ start: i, end: i + stmt.length, text: stmt.text });
            i += stmt.length;
            prev = ';';
            continue;
          }
        }
      }
      i = j;
      prev = /^\d/.test(word) ? 'value' : `word:${word}`;
    } else if (/\d/.test(ch) || (ch === '.' && /\d/.test(src[i + 1] || ''))) {
      i++;
      while (i < n && (isIdPart(src[i]) || src[i] === '.')) i++;
      prev = 'value';
    } else {
      if ('([{'.includes(ch)) depth++;
      else if (')]}'.includes(ch)) depth = Math.max(0, depth - 1);
      prev = ch;
      i++;
    }
  }
  if (!edits.length) return src;
  let out = '';
  let last = 0;
  for (const edit of edits) {
    out += src.slice(last, edit.start) + edit.text;
    last = edit.end;
  }
  return out + src.slice(last);
}

/** `{a: 1}` alone is an object (as in the Node REPL), not a block. */
function wrapObjectLiteral(src) {
  if (!/^\s*\{/.test(src) || /;\s*$/.test(src)) return src;
  const candidate = `(${src}\n)`;
  try {
    // Compiled, never run: is the parenthesised cell one expression?
    new vm.Script(`(async () => ${candidate})`, { filename: CHECK_FILE });
    return candidate;
  } catch (_) {
    return src;
  }
}

function prepareSource(src) {
  return wrapObjectLiteral(rewriteImports(src));
}

module.exports = { IMPORT_HELPER, prepareSource };

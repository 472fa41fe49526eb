// DOM building and the rendering of what code produced: streams, MIME bundles (PNG charts,
// HTML tables, text), errors with tracebacks. Everything untrusted goes in as text nodes or
// through the allow-list sanitizer below; no markup string is ever assigned to the page.

/** h('div', {class: 'x', onclick: fn}, 'text', child) */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// eslint-disable-next-line no-control-regex
const ANSI = /\u001b\[[0-9;?]*[ -/]*[@-~]|\u001b\][^\u0007]*(\u0007|\u001b\\)/g;

export function stripAnsi(s) {
  return String(s || '').replace(ANSI, '');
}

export function formatBytes(n) {
  if (n == null) return '';
  if (n < 1024) return `${n} B`;
  const units = ['KB', 'MB', 'GB', 'TB'];
  let v = n;
  let i = -1;
  do {
    v /= 1024;
    i++;
  } while (v >= 1024 && i < units.length - 1);
  return `${v < 10 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

export function formatMs(ms) {
  if (ms == null) return '';
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
}

/** '3 min ago' / 'in 20 min' */
export function relTime(iso, now = Date.now()) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return '';
  const d = Math.round((t - now) / 1000);
  const a = Math.abs(d);
  // Clocks differ by a little: the last seconds either way are 'just now'.
  if (a < 10) return 'just now';
  let s;
  if (a < 45) s = `${a} s`;
  else if (a < 3600) s = `${Math.round(a / 60)} min`;
  else if (a < 86400) s = `${Math.round(a / 3600)} h`;
  else s = `${Math.round(a / 86400)} d`;
  return d < 0 ? `${s} ago` : `in ${s}`;
}

export function localTime(iso) {
  const t = new Date(iso);
  return Number.isNaN(t.getTime()) ? '' : t.toLocaleString();
}

// What HTML produced by code may keep: table markup and inline text formatting. Anything
// else is unwrapped (its text kept) or, for active content, dropped with its children.
const KEEP = new Set([
  'table', 'thead', 'tbody', 'tfoot', 'tr', 'th', 'td', 'caption', 'colgroup', 'col',
  'div', 'span', 'p', 'br', 'b', 'i', 'em', 'strong', 'code', 'pre', 'small', 'sub', 'sup',
  'ul', 'ol', 'li', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'hr',
]);
const DROP = new Set([
  'script', 'style', 'iframe', 'object', 'embed', 'svg', 'math', 'template', 'noscript',
  'link', 'meta', 'base', 'form', 'input', 'button', 'textarea', 'select', 'frame',
  'frameset', 'canvas', 'audio', 'video', 'img', 'picture', 'source', 'title', 'head',
]);
const ATTRS = new Set(['colspan', 'rowspan', 'align']);

/** Untrusted HTML as a fragment of allow-listed elements and attributes. */
export function sanitizeHtml(html) {
  // Style blocks and attributes would be refused by the page's CSP anyway (and logged as
  // violations): drop them first. The allow-list below is what keeps the page safe.
  const text = String(html)
    .replace(/<style\b[\s\S]*?<\/style\s*>/gi, '')
    .replace(/\sstyle\s*=\s*("[^"]*"|'[^']*'|[^\s>]+)/gi, '');
  // A DOMParser document is inert: its scripts never run and its images never load.
  const doc = new DOMParser().parseFromString(text, 'text/html');
  const out = document.createDocumentFragment();
  copyChildren(doc.body, out, 0);
  return out;
}

function copyChildren(from, to, depth) {
  if (depth > 64) return;
  for (const node of from.childNodes) {
    if (node.nodeType === Node.TEXT_NODE) {
      to.append(document.createTextNode(node.data));
      continue;
    }
    if (node.nodeType !== Node.ELEMENT_NODE) continue;
    const tag = node.localName;
    if (DROP.has(tag)) continue;
    if (!KEEP.has(tag)) {
      copyChildren(node, to, depth + 1);
      continue;
    }
    const el = document.createElement(tag);
    for (const a of node.attributes) {
      if (ATTRS.has(a.name) && /^[\w -]{0,16}$/.test(a.value)) el.setAttribute(a.name, a.value);
    }
    if (tag === 'table') el.className = 'data-table';
    copyChildren(node, el, depth + 1);
    to.append(el);
  }
}

/** One Jupyter MIME bundle: the richest type this page can show safely. */
export function renderBundle(data) {
  if (data['image/png']) {
    return h('img', {
      class: 'out-image',
      src: `data:image/png;base64,${data['image/png']}`,
      alt: data['text/plain'] || 'image output',
    });
  }
  if (data['image/jpeg']) {
    return h('img', {
      class: 'out-image',
      src: `data:image/jpeg;base64,${data['image/jpeg']}`,
      alt: data['text/plain'] || 'image output',
    });
  }
  if (data['text/html']) {
    return h('div', { class: 'out-html' }, sanitizeHtml(data['text/html']));
  }
  if (data['text/plain'] != null) return h('pre', { class: 'out-text' }, stripAnsi(data['text/plain']));
  const types = Object.keys(data).join(', ');
  return h('pre', { class: 'out-text muted' }, `[${types}]`);
}

export function renderError(err) {
  const tb = stripAnsi(err.traceback || '');
  return h(
    'div',
    { class: 'out-error', role: 'status' },
    h('div', { class: 'out-error-head' }, err.value ? `${err.name || 'Error'}: ${stripAnsi(err.value)}` : err.name || 'Error'),
    tb ? h('pre', { class: 'out-traceback' }, tb) : null,
  );
}

/** The output of one execution, appended to as events arrive. */
export class Output {
  constructor(el) {
    this.el = el;
    this.last = null;
    /** Called after anything is added (the owner fits its scroll box). */
    this.onGrow = null;
  }

  clear() {
    this.el.replaceChildren();
    this.last = null;
  }

  grew() {
    if (this.onGrow) this.onGrow();
  }

  stream(name, text) {
    if (!text) return;
    if (!this.last || this.last.dataset.stream !== name) {
      this.last = h('pre', { class: `out-stream out-${name}`, dataset: { stream: name } });
      this.el.append(this.last);
    }
    this.last.append(document.createTextNode(stripAnsi(text)));
    this.grew();
  }

  result(r) {
    this.last = null;
    this.el.append(h('div', { class: 'out-result' }, renderBundle(r.data || {})));
    this.grew();
  }

  error(e) {
    this.last = null;
    this.el.append(renderError(e));
    this.grew();
  }

  note(text, cls = 'out-note') {
    this.last = null;
    this.el.append(h('div', { class: cls }, text));
    this.grew();
  }

  /** A whole Execution (from the audit log or a non-streamed reply). */
  execution(ex) {
    this.stream('stdout', ex.stdout);
    this.stream('stderr', ex.stderr);
    for (const r of ex.results || []) this.result(r);
    if (ex.error) this.error(ex.error);
  }
}

export function statusBadge(status) {
  return h('span', { class: `badge badge-${status}` }, status);
}

/** The connections an execution made through the egress proxy, on one line ('' for none). */
export function networkText(list) {
  if (!list || !list.length) return '';
  return 'network: ' + list.map((c) => c.allowed
    ? `${c.domain}:${c.port} (${formatBytes(c.bytes_out)} out, ${formatBytes(c.bytes_in)} in)`
    : `${c.domain}:${c.port} refused`).join(', ');
}

export function usageText(u) {
  if (!u) return '';
  const parts = [`${formatMs(u.wall_ms)} wall`, `${formatMs(u.cpu_ms)} CPU`];
  if (u.peak_memory_bytes) parts.push(`${formatBytes(u.peak_memory_bytes)} peak`);
  if (u.killed_by) parts.push(`killed: ${u.killed_by}`);
  return parts.join(' · ');
}

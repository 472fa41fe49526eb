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

const VEGA_LITE = /^application\/vnd\.vegalite\.v\d+\+json$/;
const PLOTLY = 'application/vnd.plotly.v1+json';

/** One Jupyter MIME bundle: the richest type this page can show safely. Images, SVG included,
 * are `<img>`s of data URLs (an SVG in an image never runs script); HTML goes through the
 * sanitizer; Markdown is rebuilt as elements, never parsed as markup; JSON, LaTeX and the
 * specs of Vega-Lite and Plotly charts (whose libraries this offline page does not carry)
 * are shown as text and tables. */
export function renderBundle(data, chart) {
  const alt = data['text/plain'] || 'image output';
  for (const mime of ['image/png', 'image/jpeg']) {
    if (data[mime]) {
      const img = h('img', { class: 'out-image', src: `data:${mime};base64,${data[mime]}`, alt });
      return chart ? h('div', {}, img, renderChart(chart)) : img;
    }
  }
  if (data['image/svg+xml']) {
    return h('img', { class: 'out-image out-svg', src: `data:image/svg+xml;base64,${utf8Base64(data['image/svg+xml'])}`, alt });
  }
  if (data['text/html']) {
    return h('div', { class: 'out-html' }, sanitizeHtml(data['text/html']));
  }
  if (data['text/markdown'] != null) return h('div', { class: 'out-markdown' }, renderMarkdown(data['text/markdown']));
  if (data['text/latex'] != null) return h('pre', { class: 'out-latex', title: 'LaTeX' }, data['text/latex']);
  const vega = Object.keys(data).find((m) => VEGA_LITE.test(m));
  if (vega) return renderSpec('Vega-Lite chart', data[vega], (v) => v?.data?.values);
  if (data[PLOTLY]) return renderSpec('Plotly chart', data[PLOTLY], (v) => plotlyRows(v));
  if (data['application/json'] != null) return renderJson(data['application/json']);
  if (data['application/pdf']) return renderPdf(data['application/pdf']);
  if (data['text/plain'] != null) return h('pre', { class: 'out-text' }, stripAnsi(data['text/plain']));
  const types = Object.keys(data).join(', ');
  return h('pre', { class: 'out-text muted' }, `[${types}]`);
}

function utf8Base64(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

function parseJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function renderJson(text) {
  const v = parseJson(text);
  return h('pre', { class: 'out-json' }, v === undefined ? String(text) : JSON.stringify(v, null, 2));
}

function renderPdf(b64) {
  const bin = atob(b64);
  const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
  const url = URL.createObjectURL(new Blob([bytes], { type: 'application/pdf' }));
  return h('div', { class: 'out-pdf' }, h('a', { href: url, download: 'output.pdf' }, `PDF document (${formatBytes(bytes.length)})`));
}

/** Rows of records as a table (the first 50, columns of the first 20 keys). */
function recordsTable(rows) {
  const records = (Array.isArray(rows) ? rows : []).filter((r) => r && typeof r === 'object').slice(0, 50);
  if (!records.length) return null;
  const cols = [...new Set(records.flatMap((r) => Object.keys(r)))].slice(0, 20);
  const cell = (v) => (v !== null && typeof v === 'object' ? JSON.stringify(v) : String(v ?? ''));
  return h(
    'table',
    { class: 'data-table' },
    h('thead', {}, h('tr', {}, cols.map((c) => h('th', {}, c)))),
    h('tbody', {}, records.map((r) => h('tr', {}, cols.map((c) => h('td', {}, cell(r[c])))))),
  );
}

function plotlyRows(fig) {
  const rows = [];
  for (const t of fig?.data || []) {
    const xs = t.x || t.labels || [];
    const ys = t.y || t.values || [];
    for (let i = 0; i < Math.max(xs.length, ys.length) && rows.length < 50; i++) {
      rows.push({ trace: t.name ?? t.type ?? 'trace', x: xs[i], y: ys[i] });
    }
  }
  return rows;
}

function renderSpec(kind, text, rowsOf) {
  const v = parseJson(text);
  const title = typeof v?.title === 'string' ? v.title : v?.title?.text || v?.layout?.title?.text || '';
  const head = h('div', { class: 'out-spec-head' }, title ? `${kind}: ${title}` : kind);
  return h(
    'div',
    { class: 'out-spec' },
    head,
    recordsTable(rowsOf(v)),
    h('details', {}, h('summary', {}, 'specification'), renderJson(text)),
  );
}

/** A figure's chart data (results[].chart) as a table under its image. */
export function renderChart(chart) {
  const charts = chart.type === 'superchart' ? chart.elements || [] : [chart];
  const rows = [];
  charts.forEach((c, i) => {
    for (const e of c.elements || []) {
      if (rows.length >= 100) return;
      const where = charts.length > 1 ? `${i + 1}. ` : '';
      if (e.points) rows.push({ series: where + e.label, values: e.points.slice(0, 8).map((p) => `(${p[0]}, ${p[1]})`).join(' ') + (e.points.length > 8 ? ' …' : '') });
      else if (e.counts) rows.push({ series: where + e.label, values: e.counts.map((n, j) => `[${e.bin_edges[j]}, ${e.bin_edges[j + 1]}): ${n}`).slice(0, 8).join(' ') });
      else if ('angle' in e) rows.push({ series: where + e.label, values: `${((e.angle / 360) * 100).toFixed(1)}%` });
      else if ('median' in e) rows.push({ series: where + e.label, values: `min ${e.min} · q1 ${e.first_quartile} · median ${e.median} · q3 ${e.third_quartile} · max ${e.max}` });
      else if ('value' in e) rows.push({ series: where + (e.group ? `${e.group} · ` : '') + e.label, values: String(e.value) });
    }
  });
  const kinds = [...new Set(charts.map((c) => c.type))].join(', ');
  const title = chart.title ? ` “${chart.title}”` : '';
  return h(
    'details',
    { class: 'out-chart', dataset: { chartType: chart.type } },
    h('summary', {}, `chart data: ${kinds}${title}`),
    recordsTable(rows) || h('div', { class: 'muted' }, 'no values extracted'),
  );
}

/** Markdown as elements: headings, paragraphs, lists, quotes, fenced code, rules, and inline
 * code, emphasis and http(s) links. Inline HTML stays text. */
export function renderMarkdown(md) {
  const out = document.createDocumentFragment();
  const lines = String(md).replace(/\r\n?/g, '\n').split('\n');
  let i = 0;
  let para = [];
  const flush = () => {
    if (para.length) out.append(h('p', {}, inline(para.join(' '))));
    para = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = line.match(/^\s*(```|~~~)/))) {
      flush();
      const fence = m[1];
      const body = [];
      for (i++; i < lines.length && !lines[i].trim().startsWith(fence); i++) body.push(lines[i]);
      i++;
      out.append(h('pre', { class: 'md-code' }, h('code', {}, body.join('\n'))));
      continue;
    }
    if ((m = line.match(/^(#{1,6})\s+(.*?)\s*#*\s*$/))) {
      flush();
      out.append(h(`h${m[1].length}`, {}, inline(m[2])));
    } else if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flush();
      out.append(h('hr'));
    } else if (/^\s*>/.test(line)) {
      flush();
      const body = [];
      for (; i < lines.length && /^\s*>/.test(lines[i]); i++) body.push(lines[i].replace(/^\s*>\s?/, ''));
      out.append(h('blockquote', {}, renderMarkdown(body.join('\n'))));
      continue;
    } else if ((m = line.match(/^\s*([-*+]|\d+[.)])\s+/))) {
      flush();
      const ordered = /\d/.test(m[1]);
      const list = h(ordered ? 'ol' : 'ul');
      for (; i < lines.length && (m = lines[i].match(/^\s*([-*+]|\d+[.)])\s+(.*)$/)); i++) list.append(h('li', {}, inline(m[2])));
      out.append(list);
      continue;
    } else if (!line.trim()) {
      flush();
    } else {
      para.push(line.trim());
    }
    i++;
  }
  flush();
  return out;
}

function inline(text) {
  const out = [];
  const re = /`([^`]+)`|\*\*([^*]+)\*\*|__([^_]+)__|\*([^*]+)\*|_([^_]+)_|\[([^\]]+)\]\(([^)\s]+)\)/g;
  let at = 0;
  let m;
  while ((m = re.exec(text))) {
    if (m.index > at) out.push(text.slice(at, m.index));
    if (m[1] != null) out.push(h('code', {}, m[1]));
    else if (m[2] != null || m[3] != null) out.push(h('strong', {}, inline(m[2] ?? m[3])));
    else if (m[4] != null || m[5] != null) out.push(h('em', {}, inline(m[4] ?? m[5])));
    else if (/^https?:\/\//i.test(m[7])) out.push(h('a', { href: m[7], rel: 'noopener noreferrer', target: '_blank' }, m[6]));
    else out.push(m[6]);
    at = re.lastIndex;
  }
  if (at < text.length) out.push(text.slice(at));
  return out;
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
    this.el.append(h('div', { class: 'out-result' }, renderBundle(r.data || {}, r.chart)));
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

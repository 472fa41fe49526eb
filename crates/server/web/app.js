// The runcell web page: sessions as notebooks, their files, the audit log and the chat.
// Views are chosen by the URL fragment: #/ (sessions), #/s/ID (a session), #/audit, #/chat.

import * as api from './api.js';
import { Editor, codeBlock } from './editor.js';
import {
  h, Output, formatBytes, formatMs, localTime, networkText, relTime, renderError, statusBadge, usageText,
} from './render.js';

const main = document.getElementById('main');
const banner = document.getElementById('banner');
let dispose = () => {};

// ---------------------------------------------------------------- messages and the API key

function showError(err, context) {
  if (err && err.name === 'AbortError') return;
  const msg = err instanceof api.ApiError ? err.message : String((err && err.message) || err);
  banner.replaceChildren(
    h('span', { class: 'banner-text' }, context ? `${context}: ${msg}` : msg),
    h('button', { class: 'btn-plain', type: 'button', 'aria-label': 'Dismiss', onclick: () => hideBanner() }, '×'),
  );
  banner.className = 'banner banner-error';
  banner.hidden = false;
}

function showNote(text) {
  banner.replaceChildren(
    h('span', { class: 'banner-text' }, text),
    h('button', { class: 'btn-plain', type: 'button', 'aria-label': 'Dismiss', onclick: () => hideBanner() }, '×'),
  );
  banner.className = 'banner banner-note';
  banner.hidden = false;
}

function hideBanner() {
  banner.hidden = true;
  banner.replaceChildren();
}

/** Runs `fn`, showing what went wrong instead of failing silently. */
async function guarded(context, fn) {
  try {
    return await fn();
  } catch (e) {
    if (!(e instanceof api.ApiError && e.status === 401)) showError(e, context);
    return undefined;
  }
}

const keyPanel = document.getElementById('key-panel');

function askForKey(err) {
  const input = h('input', {
    type: 'password', id: 'api-key', name: 'api-key', autocomplete: 'off',
    placeholder: 'rk_…', 'aria-label': 'API key', value: api.apiKey(),
  });
  const form = h(
    'form',
    { class: 'key-form' },
    h('label', { for: 'api-key' }, 'API key'),
    input,
    h('button', { class: 'btn primary', type: 'submit' }, 'Save key'),
    api.apiKey() ? h('button', { class: 'btn', type: 'button', onclick: () => { api.setApiKey(''); input.value = ''; } }, 'Forget') : null,
  );
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    api.setApiKey(input.value.trim());
    keyPanel.hidden = true;
    hideBanner();
    route();
  });
  keyPanel.replaceChildren(
    h('p', { class: 'key-why' },
      h('strong', {}, 'This server needs an API key. '),
      'An operator creates one with ', h('code', {}, 'runcell keys create --name NAME'),
      '; it is kept in this browser only and sent as ', h('code', {}, 'Authorization: Bearer'), '.'),
    err ? h('p', { class: 'key-error' }, `The server said: ${err.message}`) : null,
    form,
  );
  keyPanel.hidden = false;
  input.focus();
}

api.onUnauthorized((err) => askForKey(err));
document.getElementById('key-button').addEventListener('click', () => {
  if (keyPanel.hidden) askForKey(null);
  else keyPanel.hidden = true;
});

// ---------------------------------------------------------------- routing

function route() {
  dispose();
  dispose = () => {};
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, query] = hash.split('?');
  const params = new URLSearchParams(query || '');
  for (const a of document.querySelectorAll('.nav a')) {
    a.classList.toggle('active', path.startsWith(a.dataset.view) && (a.dataset.view !== '/' || path === '/' || path.startsWith('/s/')));
  }
  main.replaceChildren();
  let m;
  if ((m = /^\/s\/([\w-]+)$/.exec(path))) dispose = sessionView(m[1]);
  else if (path === '/audit') dispose = auditView(params);
  else if (path === '/chat') dispose = chatView();
  else dispose = sessionsView();
}

window.addEventListener('hashchange', () => {
  hideBanner();
  route();
});

// ---------------------------------------------------------------- sessions list

function sessionsView() {
  const lang = h('select', { id: 'new-lang', 'aria-label': 'Language' },
    h('option', { value: 'python' }, 'Python'),
    h('option', { value: 'bash' }, 'Bash'),
    h('option', { value: 'javascript' }, 'JavaScript'));
  const create = h('button', { class: 'btn primary', type: 'button', id: 'new-session' }, 'New session');
  create.addEventListener('click', () => guarded('Cannot create a session', async () => {
    create.disabled = true;
    try {
      const s = await api.postJson('/v1/sessions', { language: lang.value });
      location.hash = `#/s/${s.id}`;
    } finally {
      create.disabled = false;
    }
  }));
  const list = h('div', { class: 'session-list', 'aria-live': 'polite' }, h('p', { class: 'muted' }, 'Loading sessions…'));
  main.append(
    h('div', { class: 'toolbar' }, h('h1', {}, 'Sessions'), h('div', { class: 'toolbar-actions' }, lang, create)),
    list,
  );

  async function load() {
    const { sessions } = await api.getJson('/v1/sessions');
    sessions.sort((a, b) => b.created_at.localeCompare(a.created_at));
    if (!sessions.length) {
      list.replaceChildren(h('p', { class: 'empty' }, 'No sessions yet. Press “New session” to start one: a notebook with its own sandbox, variables and files.'));
      return;
    }
    list.replaceChildren(...sessions.map((s) => {
      const del = h('button', { class: 'btn btn-small', type: 'button', 'aria-label': `Delete ${s.id}` }, 'Delete');
      del.addEventListener('click', () => guarded('Cannot delete the session', async () => {
        if (!confirm(`Delete session ${s.id} and its files?`)) return;
        await api.remove(api.sessionPath(s.id));
        await load();
      }));
      return h('div', { class: 'session-row' },
        h('a', { class: 'session-link', href: `#/s/${s.id}` },
          h('span', { class: 'session-id' }, s.id),
          h('span', { class: 'session-lang' }, s.language),
          s.metadata && s.metadata.source === 'chat' ? h('span', { class: 'tag' }, 'chat') : null),
        statusBadge(s.status),
        h('span', { class: 'session-age', title: localTime(s.created_at) }, `created ${relTime(s.created_at)}`),
        h('span', { class: 'session-age muted', title: localTime(s.last_active_at) }, `active ${relTime(s.last_active_at)}`),
        del);
    }));
  }
  guarded('Cannot list sessions', load);
  const timer = setInterval(() => guarded('Cannot list sessions', load), 10_000);
  return () => clearInterval(timer);
}

// ---------------------------------------------------------------- a session as a notebook

/** What a resume brought back, as the first cell after it says (Execution.restored). */
function restoredText(r) {
  const parts = [];
  if (r.files_only) parts.push(`Resumed with files only: ${r.files_only}.`);
  else parts.push(`Resumed: ${r.names.length} name${r.names.length === 1 ? '' : 's'} restored${r.names.length ? ` (${r.names.slice(0, 8).join(', ')}${r.names.length > 8 ? ', …' : ''})` : ''}.`);
  if (r.skipped && r.skipped.length) parts.push(`Not restored: ${r.skipped.map((s) => `${s.name} (${s.reason})`).join('; ')}.`);
  if (r.lost_executions && r.lost_executions.length) parts.push(`The effects on variables of ${r.lost_executions.length} execution(s) after the last snapshot were lost: ${r.lost_executions.join(', ')}.`);
  return parts.join(' ');
}

function sessionView(id) {
  let info = null;
  // Leaving the view does not cancel running cells (closing the request would interrupt
  // them); their replies land in detached elements and refresh nothing.
  let live = true;
  const status = h('span', { class: 'badge' }, '…');
  const title = h('h1', { class: 'session-title' }, id);
  const cellsEl = h('div', { class: 'cells' });
  const cells = [];

  const btn = (label, onclick, extra = {}) => h('button', { class: 'btn', type: 'button', onclick, ...extra }, label);
  const header = h('div', { class: 'toolbar' },
    h('div', { class: 'toolbar-title' }, h('a', { href: '#/', class: 'back' }, '← Sessions'), title, status),
    h('div', { class: 'toolbar-actions' },
      btn('Interrupt', () => guarded('Cannot interrupt', async () => {
        const r = await api.postJson(api.sessionPath(id, '/interrupt'));
        showNote(r.interrupted ? 'Interrupted the running cell.' : 'Nothing was running.');
      }), { id: 'interrupt' }),
      btn('Restart', () => guarded('Cannot restart', async () => {
        setStatus('starting');
        info = await api.postJson(api.sessionPath(id, '/restart'));
        setStatus(info.status);
        showNote('The kernel restarted: variables are gone, files are kept.');
      }), { id: 'restart' }),
      btn('Pause', () => guarded('Cannot pause', async () => {
        info = await api.postJson(api.sessionPath(id, '/pause'));
        setStatus(info.status);
        showNote('Paused: variables are saved to disk and the sandbox is freed. Running a cell resumes it.');
      }), { id: 'pause' }),
      h('a', { class: 'btn', href: `#/audit?session=${id}` }, 'Audit log'),
      btn('Delete', () => guarded('Cannot delete the session', async () => {
        if (!confirm(`Delete session ${id} and its files?`)) return;
        await api.remove(api.sessionPath(id));
        location.hash = '#/';
      }))));

  function setStatus(s) {
    status.className = `badge badge-${s}`;
    status.textContent = s;
  }

  // ---- cells
  function addCell(code = '', after = null) {
    const label = h('span', { class: 'cell-count', title: 'execution count' }, '[ ]');
    const outEl = h('div', { class: 'cell-output', 'aria-live': 'polite' });
    const foot = h('div', { class: 'cell-foot' });
    // The cell's state where it stays in view (the head sticks to the top while its long
    // output scrolls by): the time a running cell has taken, then its status.
    const state = h('span', { class: 'cell-state', 'aria-live': 'polite' });
    // Long output sits in a scroll box (the page stays short); this shows it all.
    const showAll = h('button', { class: 'btn btn-small show-all', type: 'button', hidden: true }, 'Show all output');
    const cell = { running: false };
    const editor = new Editor({
      value: code,
      language: info ? info.language : 'python',
      label: 'Cell code',
      onRun: (mode) => run(cell, mode),
    });
    const runBtn = h('button', { class: 'btn btn-small run', type: 'button', title: 'Run (Shift+Enter; Ctrl/Cmd+Enter runs in place)', 'aria-label': 'Run cell' }, '▶ Run');
    runBtn.addEventListener('click', () => run(cell, 'stay'));
    const delBtn = h('button', { class: 'btn-plain', type: 'button', title: 'Remove this cell from the page', 'aria-label': 'Remove cell' }, '×');
    delBtn.addEventListener('click', () => {
      cell.el.remove();
      cells.splice(cells.indexOf(cell), 1);
      if (!cells.length) addCell().editor.focus();
    });
    const output = new Output(outEl);
    output.onGrow = () => fitOutput(cell);
    showAll.addEventListener('click', () => {
      const all = outEl.classList.toggle('show-all');
      showAll.textContent = all ? 'Collapse output' : 'Show all output';
      if (!all) cell.el.scrollIntoView({ block: 'nearest' });
    });
    Object.assign(cell, {
      editor, label, foot, runBtn, state, showAll, output, outEl,
      el: h('section', { class: 'cell' },
        h('div', { class: 'cell-head' }, label, runBtn, state, delBtn),
        editor.el, outEl, showAll, foot),
    });
    if (after) {
      after.el.after(cell.el);
      cells.splice(cells.indexOf(after) + 1, 0, cell);
    } else {
      cellsEl.append(cell.el);
      cells.push(cell);
    }
    return cell;
  }

  async function run(cell, mode) {
    const code = cell.editor.value;
    if (mode === 'next') {
      const i = cells.indexOf(cell);
      const next = cells[i + 1] || addCell('', cell);
      next.editor.focus();
    }
    if (!code.trim() || cell.running) return;
    cell.running = true;
    cell.el.classList.add('running');
    cell.runBtn.disabled = true;
    cell.label.textContent = '[*]';
    cell.foot.replaceChildren();
    cell.output.clear();
    fitOutput(cell);
    const started = performance.now();
    const tick = () => {
      cell.state.replaceChildren(h('span', { class: 'badge badge-busy' }, 'running'), ` ${formatMs(Math.round(performance.now() - started))}`);
    };
    tick();
    const ticker = setInterval(tick, 100);
    setStatus('busy');
    try {
      const resp = await api.request('POST', api.sessionPath(id, '/execute'), {
        json: { code }, accept: 'application/x-ndjson',
      });
      for await (const ev of api.events(resp)) {
        if (ev.type === 'stdout' || ev.type === 'stderr') cell.output.stream(ev.type, ev.text);
        else if (ev.type === 'result') cell.output.result(ev);
        else if (ev.type === 'error') cell.output.error(ev);
        else if (ev.type === 'end') finish(cell, ev);
      }
    } catch (e) {
      cell.label.textContent = '[!]';
      cell.output.note(e.message || String(e), 'out-failure');
    } finally {
      clearInterval(ticker);
      // No end event (a failed request): no status to show.
      if (cell.state.querySelector('.badge-busy')) cell.state.replaceChildren();
      cell.running = false;
      cell.el.classList.remove('running');
      cell.runBtn.disabled = false;
    }
    if (!live) return;
    refreshInfo();
    loadFiles();
  }

  function finish(cell, ev) {
    if (ev.error) {
      cell.label.textContent = '[!]';
      cell.output.note(ev.error.message, 'out-failure');
      return;
    }
    const ex = ev.execution;
    cell.label.textContent = `[${ex.execution_count ?? ' '}]`;
    if (ex.truncated && (ex.truncated.stdout || ex.truncated.stderr)) {
      // The stream stopped at the cap's first half; the Execution keeps the head and the
      // tail (where the last lines, often the ones that matter, are): show that instead.
      if (ev.type === 'end') {
        cell.output.clear();
        cell.output.execution(ex);
      }
      cell.output.note('Output was truncated at the cap: its head and tail are shown.');
    }
    if (ex.restored) cell.output.note(restoredText(ex.restored));
    cell.foot.replaceChildren(statusBadge(ex.status), h('span', { class: 'muted' }, usageText(ex.usage)),
      ...(ex.network && ex.network.length ? [h('span', { class: 'muted' }, ' · ' + networkText(ex.network))] : []));
    cell.state.replaceChildren(statusBadge(ex.status), ex.usage ? ` ${formatMs(ex.usage.wall_ms)}` : '');
    cell.el.dataset.status = ex.status;
    fitOutput(cell);
  }

  // The scroll box and its button: shown when the output is taller than the box. Measured
  // once a frame at most, however many events arrive.
  function fitOutput(cell) {
    if (cell.fitting) return;
    cell.fitting = true;
    requestAnimationFrame(() => {
      cell.fitting = false;
      const el = cell.outEl;
      const long = el.classList.contains('show-all') || el.scrollHeight > el.clientHeight + 1;
      cell.showAll.hidden = !long;
      if (!long) return;
      // Following a running cell's output, unless the reader scrolled up in it.
      if (cell.running && !el.classList.contains('show-all') && el.scrollHeight - el.scrollTop - el.clientHeight < 80) {
        el.scrollTop = el.scrollHeight;
      }
    });
  }

  const addBtn = h('button', { class: 'btn add-cell', type: 'button' }, '+ Code cell');
  addBtn.addEventListener('click', () => addCell().editor.focus());

  // ---- files
  const fileInput = h('input', { type: 'file', multiple: true, id: 'file-input', class: 'file-input' });
  const fileList = h('ul', { class: 'file-list', 'aria-live': 'polite' });
  const uploadNote = h('div', { class: 'muted upload-note' });
  const drop = h('div', { class: 'dropzone', id: 'dropzone' },
    h('span', {}, 'Drop files here or '),
    h('label', { for: 'file-input', class: 'link-button' }, 'choose files'),
    fileInput);
  fileInput.addEventListener('change', () => {
    upload([...fileInput.files]);
    fileInput.value = '';
  });
  for (const t of ['dragenter', 'dragover']) {
    drop.addEventListener(t, (e) => {
      e.preventDefault();
      drop.classList.add('over');
    });
  }
  drop.addEventListener('dragleave', () => drop.classList.remove('over'));
  drop.addEventListener('drop', (e) => {
    e.preventDefault();
    drop.classList.remove('over');
    upload([...(e.dataTransfer ? e.dataTransfer.files : [])]);
  });

  async function upload(files) {
    if (!files.length) return;
    const form = new FormData();
    for (const f of files) form.append('file', f, f.name);
    uploadNote.textContent = `Uploading ${files.map((f) => f.name).join(', ')}…`;
    await guarded('Upload failed', async () => {
      await api.request('POST', api.sessionPath(id, '/files'), { body: form });
      uploadNote.textContent = `Uploaded ${files.map((f) => f.name).join(', ')}.`;
    });
    if (uploadNote.textContent.startsWith('Uploading')) uploadNote.textContent = '';
    await loadFiles();
  }

  async function loadFiles() {
    await guarded('Cannot list files', async () => {
      const { files } = await api.getJson(api.sessionPath(id, '/files'));
      files.sort((a, b) => a.path.localeCompare(b.path));
      if (!files.length) {
        fileList.replaceChildren(h('li', { class: 'muted' }, 'No files yet. Code writes to /workspace; uploads land there too.'));
        return;
      }
      fileList.replaceChildren(...files.map((f) => h('li', { class: 'file-row' },
        h('span', { class: 'file-name', title: f.path }, f.path),
        h('span', { class: 'file-size' }, formatBytes(f.size)),
        h('button', { class: 'btn btn-small', type: 'button', 'aria-label': `Download ${f.path}`, onclick: () => guarded('Download failed', () => api.download(id, f.path)) }, 'Download'),
        h('button', {
          class: 'btn-plain', type: 'button', title: 'Delete', 'aria-label': `Delete ${f.path}`,
          onclick: () => guarded('Cannot delete the file', async () => {
            if (!confirm(`Delete ${f.path}?`)) return;
            await api.remove(api.filePath(id, f.path));
            uploadNote.textContent = `Deleted ${f.path}.`;
            await loadFiles();
          }),
        }, '×'))));
    });
  }

  const filesPanel = h('aside', { class: 'files-panel', 'aria-label': 'Files' },
    h('div', { class: 'panel-head' }, h('h2', {}, 'Files'),
      h('button', { class: 'btn btn-small', type: 'button', onclick: () => loadFiles() }, 'Refresh')),
    h('p', { class: 'muted small' }, 'In /workspace, the working directory of the code.'),
    drop, uploadNote, fileList);

  main.append(header, h('div', { class: 'session-layout' }, h('div', { class: 'notebook' }, cellsEl, addBtn), filesPanel));

  async function refreshInfo() {
    await guarded('Cannot read the session', async () => {
      info = await api.getJson(api.sessionPath(id));
      setStatus(info.status);
    });
  }

  // The notebook so far, rebuilt from the audit log; then an empty cell to type in.
  (async () => {
    await refreshInfo();
    if (!info) {
      cellsEl.append(h('p', { class: 'empty' }, 'This session cannot be shown. ', h('a', { href: '#/' }, 'Back to the sessions.')));
      addBtn.hidden = true;
      return;
    }
    title.append(h('span', { class: 'session-lang' }, info.language));
    await guarded('Cannot load the history', async () => {
      const { executions } = await api.getJson(`/v1/executions?session_id=${encodeURIComponent(id)}&limit=200`);
      for (const ex of executions.reverse()) {
        const c = addCell(ex.code || '');
        c.output.execution(ex);
        finish(c, { execution: ex });
      }
    });
    // A notebook opens at its top. With history, focusing the new cell at the bottom must not
    // scroll there (nor, on a phone, open the keyboard over the notebook).
    const fresh = addCell();
    if (!cells.some((c) => c !== fresh)) fresh.editor.focus();
    else if (!matchMedia('(max-width: 640px)').matches) fresh.editor.focus({ preventScroll: true });
    window.scrollTo(0, 0);
    loadFiles();
  })();
  return () => {
    live = false;
  };
}

// ---------------------------------------------------------------- the audit log

function auditView(params) {
  let next = null;
  let rows = [];
  const session = params.get('session') || '';
  const verify = h('div', { class: 'verify', id: 'verify', 'aria-live': 'polite' }, 'Checking the hash chain…');
  const sessionSel = h('select', { id: 'audit-session', 'aria-label': 'Session' }, h('option', { value: '' }, 'All sessions'));
  if (session) sessionSel.append(h('option', { value: session, selected: true }, session));
  const statusSel = h('select', { id: 'audit-status', 'aria-label': 'Status' },
    ...['', 'ok', 'error', 'timeout', 'interrupted', 'killed'].map((s) =>
      h('option', { value: s, selected: s === (params.get('status') || '') }, s || 'Any status')));
  const list = h('div', { class: 'audit-list', 'aria-live': 'polite' });
  const more = h('button', { class: 'btn', type: 'button', hidden: true }, 'Load older entries');

  function setParams() {
    const p = new URLSearchParams();
    if (sessionSel.value) p.set('session', sessionSel.value);
    if (statusSel.value) p.set('status', statusSel.value);
    const q = p.toString();
    location.hash = `#/audit${q ? `?${q}` : ''}`;
  }
  sessionSel.addEventListener('change', setParams);
  statusSel.addEventListener('change', () => render());

  async function checkChain() {
    verify.className = 'verify';
    verify.textContent = 'Checking the hash chain…';
    await guarded('Cannot verify the audit log', async () => {
      const r = await api.getJson('/v1/audit/verify');
      verify.className = `verify ${r.ok ? 'verify-ok' : 'verify-bad'}`;
      verify.replaceChildren(r.ok
        ? `✓ Hash chain verified: ${r.checked} record${r.checked === 1 ? '' : 's'}, none edited or deleted.`
        : `✗ Hash chain broken after ${r.checked} records: ${r.first_broken.execution_id}: ${r.first_broken.reason}`);
    });
  }

  function entry(ex) {
    const out = h('div', { class: 'entry-output' });
    new Output(out).execution(ex);
    const files = (ex.files || []).map((f) => `${f.path} (${f.change}, ${formatBytes(f.size)})`).join(', ');
    return h('article', { class: 'entry', dataset: { status: ex.status } },
      h('div', { class: 'entry-head' },
        statusBadge(ex.status),
        h('span', { class: 'entry-id' }, ex.id),
        ex.session_id ? h('a', { href: `#/s/${ex.session_id}`, class: 'entry-session' }, ex.session_id) : h('span', { class: 'muted' }, 'one-shot'),
        ex.execution_count != null ? h('span', { class: 'muted' }, `[${ex.execution_count}]`) : null,
        h('span', { class: 'muted' }, ex.language),
        h('time', { class: 'muted', datetime: ex.finished_at, title: localTime(ex.finished_at) }, relTime(ex.finished_at))),
      codeBlock(ex.code || '', ex.language),
      h('div', { class: 'entry-usage muted' }, usageText(ex.usage), files ? ` · files: ${files}` : '',
        ex.network && ex.network.length ? ` · ${networkText(ex.network)}` : ''),
      out.childNodes.length ? h('details', { open: true }, h('summary', {}, 'Output'), out) : null);
  }

  function render() {
    const shown = rows.filter((ex) => !statusSel.value || ex.status === statusSel.value);
    list.replaceChildren(...(shown.length ? shown.map(entry) : [h('p', { class: 'empty' }, rows.length ? 'No loaded entry has this status.' : 'No executions recorded yet.')]));
    more.hidden = !next;
  }

  async function load() {
    const q = new URLSearchParams({ limit: '50' });
    if (session) q.set('session_id', session);
    if (next) q.set('before', next);
    const page = await api.getJson(`/v1/executions?${q}`);
    rows = rows.concat(page.executions);
    next = page.next;
    for (const ex of page.executions) {
      if (ex.session_id && ![...sessionSel.options].some((o) => o.value === ex.session_id)) {
        sessionSel.append(h('option', { value: ex.session_id }, ex.session_id));
      }
    }
    render();
  }
  more.addEventListener('click', () => guarded('Cannot load the audit log', load));

  main.append(
    h('div', { class: 'toolbar' }, h('h1', {}, 'Audit log'),
      h('div', { class: 'toolbar-actions' }, sessionSel, statusSel,
        h('button', { class: 'btn', type: 'button', onclick: () => checkChain() }, 'Verify'))),
    verify, list, more);
  checkChain();
  guarded('Cannot load the audit log', async () => {
    const { sessions } = await api.getJson('/v1/sessions');
    for (const s of sessions) {
      if (![...sessionSel.options].some((o) => o.value === s.id)) sessionSel.append(h('option', { value: s.id }, s.id));
    }
    await load();
  });
  return () => {};
}

// ---------------------------------------------------------------- the chat

const chatLog = h('div', { class: 'chat-log', 'aria-live': 'polite' });
let chatBusy = false;

function chatView() {
  const notice = h('div', { class: 'chat-notice' });
  const question = h('textarea', {
    id: 'chat-question', class: 'chat-question', rows: '3', 'aria-label': 'Question',
    placeholder: 'Ask a question about your data, e.g. “Which month had the highest sales? Chart it.”',
  });
  const files = [];
  const chips = h('div', { class: 'chips' });
  const picker = h('input', { type: 'file', multiple: true, id: 'chat-files', class: 'file-input' });
  const ask = h('button', { class: 'btn primary', type: 'submit', id: 'chat-ask' }, 'Ask');
  const approve = h('input', { type: 'checkbox', id: 'chat-approve' });
  const form = h('form', { class: 'chat-form' },
    question,
    h('div', { class: 'chat-form-row' },
      h('label', { for: 'chat-files', class: 'btn' }, 'Attach files'), picker, chips,
      h('label', { for: 'chat-approve', class: 'small' }, approve, ' Approve each cell'), ask));

  function paintChips() {
    chips.replaceChildren(...files.map((f, i) => h('span', { class: 'chip' }, `${f.name} (${formatBytes(f.size)})`,
      h('button', { class: 'btn-plain', type: 'button', 'aria-label': `Remove ${f.name}`, onclick: () => { files.splice(i, 1); paintChips(); } }, '×'))));
  }
  picker.addEventListener('change', () => {
    files.push(...picker.files);
    picker.value = '';
    paintChips();
  });
  question.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    if (chatBusy || !question.value.trim()) return;
    const q = question.value;
    const attached = files.splice(0);
    question.value = '';
    paintChips();
    converse(q, attached, ask, approve.checked);
  });

  main.append(h('div', { class: 'toolbar' }, h('h1', {}, 'Chat')), notice, chatLog, form);
  guarded('Cannot read the chat configuration', async () => {
    const c = await api.getJson('/v1/chat');
    if (c.enabled) {
      notice.className = 'chat-notice muted';
      notice.textContent = `The agent answers with ${c.model} (${c.provider}), running its code in a new session of yours; up to ${c.max_steps} steps.`;
    } else {
      notice.className = 'chat-notice warn';
      notice.replaceChildren(h('strong', {}, 'The chat is off. '), c.message);
      ask.disabled = true;
      question.disabled = true;
    }
  });
  ask.disabled = ask.disabled || chatBusy;
  question.focus();
  return () => {};
}

async function converse(question, files, ask, approve) {
  chatBusy = true;
  ask.disabled = true;
  const turn = h('div', { class: 'turn' });
  turn.append(h('div', { class: 'msg-user' }, question,
    files.length ? h('div', { class: 'muted small' }, `Attached: ${files.map((f) => f.name).join(', ')}`) : null));
  const working = h('div', { class: 'muted working' }, 'Working…');
  turn.append(working);
  chatLog.append(turn);
  const form = new FormData();
  form.append('question', question);
  if (approve) form.append('approval', 'always');
  for (const f of files) form.append('file', f, f.name);
  let session = null;
  const steps = new Map();
  let lastOut = null;
  try {
    const resp = await api.request('POST', '/v1/chat', { body: form, accept: 'application/x-ndjson' });
    for await (const ev of api.events(resp)) {
      if (ev.type === 'session') {
        session = ev.session.id;
      } else if (ev.type === 'model') {
        working.before(h('div', { class: 'msg-thought' }, ev.text));
      } else if (ev.type === 'tool_call') {
        const out = h('div', { class: 'step-output' }, h('div', { class: 'muted small' }, 'Running…'));
        const step = h('div', { class: 'step' },
          h('div', { class: 'step-head' }, `Step ${ev.step} · ${ev.tool}`),
          codeBlock(ev.code, ev.tool === 'python' ? 'python' : 'plain'), out);
        steps.set(ev.id, out);
        lastOut = out;
        working.before(step);
      } else if (ev.type === 'approval' && lastOut) {
        lastOut.replaceChildren(approvalControls(ev.approval, lastOut));
      } else if (ev.type === 'tool_result') {
        const out = steps.get(ev.id) || h('div', { class: 'step-output' });
        out.replaceChildren();
        if (ev.execution) {
          const o = new Output(out);
          o.execution(ev.execution);
          if (!out.childNodes.length) o.note('(no output)');
          out.append(h('div', { class: 'muted small' }, statusBadge(ev.execution.status), ' ', usageText(ev.execution.usage)));
        } else {
          out.append(h('pre', { class: `out-text${ev.is_error ? ' out-stderr' : ''}` }, ev.text));
        }
      } else if (ev.type === 'end') {
        working.remove();
        turn.append(ev.error ? renderError({ name: 'The chat failed', value: ev.error.message }) : answer(ev));
      }
    }
  } catch (e) {
    working.remove();
    if (!(e instanceof api.ApiError && e.status === 401)) turn.append(renderError({ name: 'The chat failed', value: e.message }));
  } finally {
    chatBusy = false;
    ask.disabled = false;
    if (working.isConnected) working.remove();
    if (session) turn.append(h('div', { class: 'small' }, h('a', { href: `#/s/${session}` }, `Open session ${session} as a notebook`)));
  }
}

// A cell waiting for a decision (`approval: always`): Run, Edit (then run the edited code) or
// Decline (with an optional reason the model is told).
function approvalControls(pending, out) {
  // The note goes up before the answer is sent: the cell's result can stream in before the
  // POST's reply arrives, and must not be covered by "Running…" afterwards.
  const decide = (body) => guarded('Cannot answer the approval', async () => {
    const before = [...out.childNodes];
    const note = h('div', { class: 'muted small' }, body.decision === 'decline' ? 'Declined.' : 'Running…');
    out.replaceChildren(note);
    try {
      await api.postJson(`/v1/approvals/${encodeURIComponent(pending.id)}`, body);
    } catch (e) {
      if (out.firstChild === note) out.replaceChildren(...before);
      throw e;
    }
  });
  const run = h('button', { class: 'btn btn-small primary', type: 'button', 'data-approval': 'run', onclick: () => decide({ decision: 'approve' }) }, 'Run');
  const edit = h('button', {
    class: 'btn btn-small', type: 'button', 'data-approval': 'edit',
    onclick: () => {
      const area = h('textarea', { class: 'chat-question', rows: '6', 'aria-label': 'Edited code' });
      area.value = pending.code;
      out.replaceChildren(area, h('button', {
        class: 'btn btn-small primary', type: 'button', 'data-approval': 'run-edited',
        onclick: () => decide({ decision: 'edit', code: area.value }),
      }, 'Run edited'));
      area.focus();
    },
  }, 'Edit');
  const decline = h('button', {
    class: 'btn btn-small', type: 'button', 'data-approval': 'decline',
    onclick: () => {
      const reason = window.prompt('Why not? (sent to the model; optional)') || undefined;
      decide({ decision: 'decline', reason });
    },
  }, 'Decline');
  return h('div', { class: 'approval' }, h('div', { class: 'muted small' }, 'Waiting for your approval'), run, ' ', edit, ' ', decline);
}

function answer(ev) {
  const el = h('div', { class: 'msg-answer' });
  el.append(h('div', { class: 'answer-text' }, ev.answer || '(no answer)'));
  if (ev.stop !== 'answer') {
    el.append(h('div', { class: 'warn small' }, ev.stop === 'max_steps'
      ? `Stopped after ${ev.steps} steps without a final answer.`
      : 'Stopped after too many failed steps in a row.'));
  }
  if (ev.files && ev.files.length) {
    const list = h('ul', { class: 'file-list' });
    for (const f of ev.files) {
      const li = h('li', { class: 'file-row' },
        h('span', { class: 'file-name' }, f.path),
        h('span', { class: 'file-size' }, formatBytes(f.size)),
        h('button', { class: 'btn btn-small', type: 'button', onclick: () => guarded('Download failed', () => api.download(ev.session_id, f.path)) }, 'Download'));
      list.append(li);
      if (f.mime === 'image/png' || f.mime === 'image/jpeg') {
        const img = h('img', { class: 'out-image', alt: f.path });
        guarded('Cannot load a chart', async () => { img.src = await api.fileUrl(ev.session_id, f.path); });
        el.append(img);
      }
    }
    el.append(h('div', { class: 'small' }, 'Files produced:'), list);
  }
  return el;
}

route();

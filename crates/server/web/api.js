// The HTTP API as the page uses it: the API key kept in this browser, errors made into
// messages from the API's envelope ({"error":{"code","message"}}), NDJSON streams read as
// they arrive.

const KEY = 'runcell.apiKey';

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function apiKey() {
  try {
    return localStorage.getItem(KEY) || '';
  } catch {
    return '';
  }
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY, key);
  else localStorage.removeItem(KEY);
}

let unauthorized = () => {};

/** `fn(error)` runs on every 401: the page asks for a key. */
export function onUnauthorized(fn) {
  unauthorized = fn;
}

function headers() {
  const h = new Headers();
  const key = apiKey();
  if (key) h.set('Authorization', `Bearer ${key}`);
  return h;
}

async function errorOf(resp) {
  let code = `http_${resp.status}`;
  let message = `the server answered ${resp.status} ${resp.statusText}`.trim();
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) {
      code = body.error.code;
      message = body.error.message;
    }
  } catch {
    // Not the envelope (a proxy's page, say): the status line is all there is.
  }
  const err = new ApiError(resp.status, code, message);
  if (resp.status === 401) unauthorized(err);
  return err;
}

/** A request with the key; any non-2xx reply becomes an ApiError. */
export async function request(method, path, { json, body, accept, signal } = {}) {
  const init = { method, headers: headers(), signal };
  if (json !== undefined) {
    init.headers.set('Content-Type', 'application/json');
    init.body = JSON.stringify(json);
  } else if (body !== undefined) {
    init.body = body;
  }
  if (accept) init.headers.set('Accept', accept);
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, 'network', `cannot reach the runcell server (${e.message})`);
  }
  if (!resp.ok) throw await errorOf(resp);
  return resp;
}

export async function getJson(path) {
  return (await request('GET', path)).json();
}

export async function postJson(path, json = {}) {
  const resp = await request('POST', path, { json });
  return resp.status === 204 ? null : resp.json();
}

export async function remove(path) {
  await request('DELETE', path);
}

/** The events of an NDJSON reply, one object per line, as they arrive. */
export async function* events(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (line) yield JSON.parse(line);
    }
  }
  buf += decoder.decode();
  if (buf.trim()) yield JSON.parse(buf);
}

export function sessionPath(id, rest = '') {
  return `/v1/sessions/${encodeURIComponent(id)}${rest}`;
}

export function filePath(session, path) {
  const enc = path.split('/').map(encodeURIComponent).join('/');
  return sessionPath(session, `/files/${enc}`);
}

/** A file of a session as an object URL (downloads need the key, so no plain links). */
export async function fileUrl(session, path) {
  const blob = await (await request('GET', filePath(session, path))).blob();
  return URL.createObjectURL(blob);
}

export async function download(session, path) {
  const url = await fileUrl(session, path);
  const a = document.createElement('a');
  a.href = url;
  a.download = path.split('/').pop();
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

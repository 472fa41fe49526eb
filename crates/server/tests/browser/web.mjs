// The web page as an analyst uses it, in headless Chromium (driven by playwright-core).
// Run by tests/browser.rs with RUNCELL_URL, PHASE (analyst | keys | long | rich), ARTIFACTS, CHROMIUM and
// PLAYWRIGHT_DIR (where npm installed the pinned playwright-core). Exits non-zero on the first
// failed check; screenshots go to ARTIFACTS either way.

import { createRequire } from 'node:module';
import path from 'node:path';
import assert from 'node:assert/strict';

const require = createRequire(path.join(process.env.PLAYWRIGHT_DIR, 'package.json'));
const { chromium } = require('playwright-core');

const BASE = process.env.RUNCELL_URL;
const ARTIFACTS = process.env.ARTIFACTS;
const PHASE = process.env.PHASE;
const LONG = 90_000; // the first cell of a session may wait for the runtime to warm up

const PLOT = [
  'import matplotlib.pyplot as plt',
  'xs = [1, 2, 3, 4, 5]',
  'for x in xs[:2]:',
  '    print("square of", x, "is", x * x)',
  'print("sum of squares:", sum(x * x for x in xs))',
  'plt.plot(xs, [x * x for x in xs], marker="o")',
  "plt.title('squares')",
  'plt.show()',
].join('\n');

const READ_CSV = [
  'import pandas as pd',
  "sales = pd.read_csv('sales.csv')",
  'print("total:", sales.amount.sum())',
  'sales',
].join('\n');

const SALES = 'month,amount\nJan,120\nFeb,135\nMar,142\n';

const problems = [];

function watch(page) {
  page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`console error: ${m.text()}`);
  });
}

async function shot(page, name) {
  const file = path.join(ARTIFACTS, `${name}.png`);
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: file, fullPage: true });
  console.log(`screenshot ${file}`);
}

async function noHorizontalScroll(page, where) {
  const { scroll, client } = await page.evaluate(() => ({
    scroll: document.documentElement.scrollWidth,
    client: document.documentElement.clientWidth,
  }));
  assert.ok(scroll <= client, `${where}: the page scrolls sideways (${scroll} > ${client} px)`);
}

/** Types `code` into the cell's editor key by key, as fast as a test driver types (so the
 * editor takes it verbatim: no automatic indent on top of the code's own). */
async function typeInto(page, cell, code) {
  const input = cell.locator('textarea.editor-input');
  await input.click();
  await page.keyboard.type(code);
  assert.equal(await input.inputValue(), code, 'the editor holds exactly what was typed');
}

async function analyst(browser) {
  const context = await browser.newContext({ viewport: { width: 1366, height: 900 } });
  const page = await context.newPage();
  watch(page);
  const resp = await page.goto(BASE + '/');
  assert.equal(resp.status(), 200);
  const csp = resp.headers()['content-security-policy'] || '';
  assert.match(csp, /script-src 'self'/, 'the page is served with a strict CSP');
  await page.getByRole('heading', { name: 'Sessions' }).waitFor();
  await page.getByText('No sessions yet').waitFor();
  await shot(page, '01-sessions-empty-1366');

  // A new session, from the button.
  await page.getByRole('button', { name: 'New session' }).click();
  await page.waitForURL(/#\/s\/ses_/);
  const cell1 = page.locator('.cell').first();
  await cell1.locator('textarea.editor-input').waitFor();
  await page.locator('.session-title .badge-ready, .toolbar .badge-ready').first().waitFor();

  // A plotting cell, Shift+Enter: the printed text and the chart appear, a new cell follows.
  await typeInto(page, cell1, PLOT);
  // The highlighter colours keywords as they are typed.
  assert.ok(await cell1.locator('.editor-hl .tok-keyword', { hasText: 'import' }).count() >= 1, 'keywords are highlighted');
  await page.keyboard.press('Shift+Enter');
  await cell1.locator('.out-stdout', { hasText: 'sum of squares: 55' }).waitFor({ timeout: LONG });
  assert.match(await cell1.locator('.out-stdout').first().textContent(), /^square of 1 is 1\nsquare of 2 is 4\nsum/);
  const img = cell1.locator('img.out-image');
  await img.waitFor({ timeout: LONG });
  const size = await img.evaluate((i) => ({ w: i.naturalWidth, h: i.naturalHeight, done: i.complete }));
  assert.ok(size.done && size.w > 100 && size.h > 100, `the chart is a real image: ${JSON.stringify(size)}`);
  await cell1.locator('.cell-count', { hasText: '[1]' }).waitFor();
  await cell1.locator('.cell-foot .badge-ok').waitFor();
  assert.equal(await page.locator('.cell').count(), 2, 'Shift+Enter opened a new cell');
  const focused = await page.evaluate(() => document.activeElement === document.querySelectorAll('.cell textarea')[1]);
  assert.ok(focused, 'the new cell has the focus');

  // Upload a CSV with the picker, and another by drag and drop.
  await page.setInputFiles('#file-input', { name: 'sales.csv', mimeType: 'text/csv', buffer: Buffer.from(SALES) });
  await page.locator('.file-row .file-name', { hasText: 'sales.csv' }).waitFor();
  const dt = await page.evaluateHandle(() => {
    const d = new DataTransfer();
    d.items.add(new File(['a,b\n1,2\n'], 'dropped.csv', { type: 'text/csv' }));
    return d;
  });
  await page.dispatchEvent('#dropzone', 'drop', { dataTransfer: dt });
  await page.locator('.file-row .file-name', { hasText: 'dropped.csv' }).waitFor();
  const sizeText = await page.locator('.file-row', { hasText: 'sales.csv' }).locator('.file-size').textContent();
  assert.equal(sizeText, `${SALES.length} B`);

  // Read it with pandas in the second cell, run in place with Ctrl+Enter: a table.
  const cell2 = page.locator('.cell').nth(1);
  await typeInto(page, cell2, READ_CSV);
  await page.keyboard.press('Control+Enter');
  await cell2.locator('.out-stdout', { hasText: 'total: 397' }).waitFor({ timeout: LONG });
  const table = cell2.locator('.out-html table.data-table');
  await table.waitFor();
  assert.equal(await table.locator('tbody tr').count(), 3, 'the DataFrame is a 3-row table');
  assert.ok((await table.textContent()).includes('Mar'), 'the table shows the data');
  assert.equal(await page.locator('.cell').count(), 2, 'Ctrl+Enter ran in place');

  // An error: the traceback, and the status.
  const cell3 = page.locator('.cell').nth(2);
  await page.getByRole('button', { name: '+ Code cell' }).click();
  // Enter after a colon indents, the next line keeps the indent, Shift+Tab takes it back.
  await cell3.locator('textarea.editor-input').click();
  // At a person's pace, 80 ms a key.
  await page.keyboard.type('def ratio(a, b):\nreturn a / b\n', { delay: 80 });
  await page.keyboard.press('Shift+Tab');
  await page.keyboard.type('ratio(1, 0)', { delay: 80 });
  assert.equal(await cell3.locator('textarea.editor-input').inputValue(), 'def ratio(a, b):\n    return a / b\nratio(1, 0)');
  await page.keyboard.press('Shift+Enter');
  await cell3.locator('.out-error-head', { hasText: 'ZeroDivisionError' }).waitFor({ timeout: LONG });
  assert.match(await cell3.locator('.out-traceback').textContent(), /ratio/);
  await cell3.locator('.cell-foot .badge-error').waitFor();

  // Output streams while the cell runs.
  const cell4 = page.locator('.cell').nth(3);
  await typeInto(page, cell4, 'import time\nprint("first", flush=True)\ntime.sleep(2)\nprint("second")');
  await page.keyboard.press('Control+Enter');
  await cell4.locator('.out-stdout', { hasText: 'first' }).waitFor({ timeout: LONG });
  assert.equal(await cell4.locator('.cell-count').textContent(), '[*]', 'still running when the first line shows');
  // A running cell says for how long, and cannot be started again.
  assert.ok(await cell4.locator('button.run').isDisabled(), 'Run is disabled while the cell runs');
  const elapsed = async () => {
    const m = (await cell4.locator('.cell-state').textContent()).match(/running ([\d.]+) (ms|s)/);
    assert.ok(m, 'a running cell shows its elapsed time');
    return Number(m[1]) * (m[2] === 's' ? 1000 : 1);
  };
  const t1 = await elapsed();
  await page.waitForTimeout(400);
  const t2 = await elapsed();
  assert.ok(t1 >= 0 && t2 > t1, `the elapsed time runs: ${t1} then ${t2} ms`);
  assert.ok(!(await cell4.locator('.cell-output').textContent()).includes('second'), 'the second line is not there yet');
  await cell4.locator('.out-stdout', { hasText: 'second' }).waitFor({ timeout: LONG });
  await cell4.locator('.cell-count', { hasText: '[4]' }).waitFor();
  await cell4.locator('.cell-state .badge-ok').waitFor();
  assert.ok(await cell4.locator('button.run').isEnabled(), 'Run is enabled again once the cell is done');

  // Interrupt a long cell; the state survives it.
  await page.getByRole('button', { name: '+ Code cell' }).click();
  const cell5 = page.locator('.cell').nth(4);
  await typeInto(page, cell5, 'import time\nprint("sleeping", flush=True)\ntime.sleep(60)');
  await page.keyboard.press('Control+Enter');
  await cell5.locator('.out-stdout', { hasText: 'sleeping' }).waitFor({ timeout: LONG });
  await page.click('#interrupt');
  await cell5.locator('.cell-foot .badge-interrupted').waitFor({ timeout: LONG });
  await cell5.locator('.out-error-head', { hasText: 'KeyboardInterrupt' }).waitFor();

  // Restart: variables are gone, files are kept.
  await page.click('#restart');
  await page.locator('#banner', { hasText: 'The kernel restarted' }).waitFor({ timeout: LONG });
  await page.getByRole('button', { name: '+ Code cell' }).click();
  const cell6 = page.locator('.cell').nth(5);
  await typeInto(page, cell6, 'import os\nprint(sorted(os.listdir()))\nxs');
  await page.keyboard.press('Control+Enter');
  await cell6.locator('.out-error-head', { hasText: "NameError: name 'xs' is not defined" }).waitFor({ timeout: LONG });
  await cell6.locator('.out-stdout', { hasText: "'sales.csv'" }).waitFor();

  // Pause: the badge says so; running a cell resumes the session with its variables.
  await page.getByRole('button', { name: '+ Code cell' }).click();
  const cellP = page.locator('.cell').nth(6);
  await typeInto(page, cellP, 'kept = 41');
  await page.keyboard.press('Control+Enter');
  await cellP.locator('.cell-foot .badge-ok').waitFor({ timeout: LONG });
  await page.click('#pause');
  await page.locator('.toolbar-title .badge-paused', { hasText: 'paused' }).waitFor({ timeout: LONG });
  await page.getByRole('button', { name: '+ Code cell' }).click();
  const cellR = page.locator('.cell').nth(7);
  await typeInto(page, cellR, 'kept + 1');
  await page.keyboard.press('Control+Enter');
  await cellR.locator('.cell-output', { hasText: '42' }).waitFor({ timeout: LONG });
  await cellR.locator('.cell-output', { hasText: 'Resumed: ' }).waitFor();
  await page.locator('.toolbar-title .badge-ready').waitFor({ timeout: LONG });

  // Download a file (fetched with the key, saved under its name); delete another.
  const [download] = await Promise.all([
    page.waitForEvent('download'),
    page.getByRole('button', { name: 'Download sales.csv' }).click(),
  ]);
  assert.equal(download.suggestedFilename(), 'sales.csv');
  const chunks = [];
  for await (const c of await download.createReadStream()) chunks.push(c);
  assert.equal(Buffer.concat(chunks).toString(), SALES, 'the download is the uploaded file');
  page.once('dialog', (d) => d.accept());
  await page.getByRole('button', { name: 'Delete dropped.csv' }).click();
  await page.locator('.file-row', { hasText: 'dropped.csv' }).waitFor({ state: 'detached' });
  await page.locator('.file-row', { hasText: 'sales.csv' }).waitFor();
  await shot(page, '02-notebook-1366');

  // Narrow: a phone.
  await page.setViewportSize({ width: 390, height: 844 });
  await noHorizontalScroll(page, 'notebook at 390 px');
  await shot(page, '03-notebook-390');
  await page.setViewportSize({ width: 1366, height: 900 });

  // The audit log: the entries, the chain's state, the filters.
  await page.getByRole('link', { name: 'Audit log' }).first().click();
  await page.locator('#verify.verify-ok').waitFor();
  assert.match(await page.locator('#verify').textContent(), /verified: 8 records/);
  const plotEntry = page.locator('.entry', { hasText: "plt.title('squares')" });
  await plotEntry.waitFor();
  await plotEntry.locator('.badge-ok').waitFor();
  await plotEntry.locator('img.out-image').waitFor();
  await plotEntry.locator('summary', { hasText: 'Output' }).click();
  assert.ok(await plotEntry.locator('img.out-image').isHidden(), 'the output folds away');
  assert.equal(await page.locator('.entry').count(), 8);
  await page.selectOption('#audit-status', 'error');
  assert.equal(await page.locator('.entry').count(), 2, 'the status filter keeps the failed cells');
  assert.equal(await page.locator('.entry .badge-error').count(), 2);
  await page.selectOption('#audit-status', 'interrupted');
  assert.equal(await page.locator('.entry').count(), 1);
  await page.selectOption('#audit-status', '');
  assert.equal(await page.locator('.entry').count(), 8);
  await shot(page, '04-audit-1366');
  await page.setViewportSize({ width: 390, height: 844 });
  await noHorizontalScroll(page, 'audit at 390 px');
  await shot(page, '05-audit-390');
  await page.setViewportSize({ width: 1366, height: 900 });

  // The sessions list shows the session with its state and age.
  await page.getByRole('link', { name: 'Sessions', exact: true }).click();
  const row = page.locator('.session-row').first();
  await row.locator('.badge-ready').waitFor();
  assert.match(await row.textContent(), /created (just now|\d+ s ago)/);
  await shot(page, '06-sessions-1366');

  // The chat: a question with a file; the step's code and output, then the answer.
  await page.getByRole('link', { name: 'Chat' }).click();
  await page.getByText('The agent answers with test-model').waitFor();
  await page.setInputFiles('#chat-files', { name: 'sales.csv', mimeType: 'text/csv', buffer: Buffer.from(SALES) });
  await page.locator('.chip', { hasText: 'sales.csv' }).waitFor();
  await page.fill('#chat-question', 'Which month sold most? Chart it.');
  await page.getByRole('button', { name: 'Ask' }).click();
  const step = page.locator('.step').first();
  await step.locator('.code-block', { hasText: "read_csv('sales.csv')" }).waitFor({ timeout: LONG });
  await step.locator('.out-stdout', { hasText: 'BEST=Mar' }).waitFor({ timeout: LONG });
  await step.locator('img.out-image').waitFor();
  const answer = page.locator('.msg-answer');
  await answer.waitFor({ timeout: LONG });
  assert.match(await answer.textContent(), /The best month is Mar/);
  await answer.locator('.file-row', { hasText: 'by_month.png' }).waitFor();
  const chart = answer.locator('img.out-image');
  await chart.waitFor();
  await page.waitForFunction((el) => el.complete && el.naturalWidth > 100, await chart.elementHandle());
  await shot(page, '07-chat-1366');
  await page.setViewportSize({ width: 390, height: 844 });
  await noHorizontalScroll(page, 'chat at 390 px');
  await shot(page, '08-chat-390');
  await page.getByRole('link', { name: 'Sessions', exact: true }).click();
  await page.locator('.session-row').first().waitFor();
  await noHorizontalScroll(page, 'sessions at 390 px');
  await shot(page, '09-sessions-390');
  await context.close();
}

async function keys(browser) {
  const context = await browser.newContext({ viewport: { width: 390, height: 844 } });
  const page = await context.newPage();
  watch(page);
  // The 401 is expected here: the page must ask for a key rather than break.
  page.removeAllListeners('console');
  page.on('console', (m) => {
    if (m.type() === 'error' && !/401/.test(m.text())) problems.push(`console error: ${m.text()}`);
  });
  await page.goto(BASE + '/');
  await page.locator('#key-panel:not([hidden])').waitFor();
  assert.match(await page.locator('#key-panel .key-error').textContent(), /an API key is required/);
  await shot(page, '10-key-required-390');
  await page.fill('#api-key', process.env.RUNCELL_KEY);
  await page.getByRole('button', { name: 'Save key' }).click();
  await page.getByText('No sessions yet').waitFor();
  assert.equal(await page.evaluate(() => localStorage.getItem('runcell.apiKey')), process.env.RUNCELL_KEY);
  // The key works for the notebook too.
  await page.getByRole('button', { name: 'New session' }).click();
  const cell = page.locator('.cell').first();
  await cell.locator('textarea.editor-input').waitFor();
  await typeInto(page, cell, '6 * 7');
  await page.keyboard.press('Control+Enter');
  await cell.locator('.out-text', { hasText: '42' }).waitFor({ timeout: LONG });
  // No model configured: the chat says so.
  await page.getByRole('link', { name: 'Chat' }).click();
  await page.locator('.chat-notice.warn', { hasText: 'chat is not configured' }).waitFor();
  assert.ok(await page.locator('#chat-ask').isDisabled());
  await noHorizontalScroll(page, 'chat without a model at 390 px');
  await shot(page, '11-chat-off-390');
  // A wrong key is refused with the server's message.
  await page.evaluate(() => localStorage.setItem('runcell.apiKey', 'rk_wrong'));
  await page.goto(BASE + '/#/');
  await page.locator('#key-panel .key-error', { hasText: 'invalid or revoked API key' }).waitFor();
  await context.close();
}

/** Whether `locator`'s box is inside the viewport. */
async function inView(page, locator) {
  const box = await locator.boundingBox();
  const vp = page.viewportSize();
  return !!box && box.y >= 0 && box.y + box.height <= vp.height;
}

async function pageHeight(page) {
  return page.evaluate(() => document.documentElement.scrollHeight);
}

// A cell with 300,000 lines of output (1 MiB after the server's cap): the page stays a page,
// the output scrolls in a box with "Show all", the cell's status stays in view; on a phone,
// the notebook opens at its top.
async function long(browser) {
  const context = await browser.newContext({ viewport: { width: 1366, height: 900 } });
  const page = await context.newPage();
  watch(page);
  await page.goto(BASE + '/');
  await page.getByRole('button', { name: 'New session' }).click();
  await page.waitForURL(/#\/s\/ses_/);
  const url = page.url();
  for (let i = 0; i < 4; i++) {
    const cell = page.locator('.cell').nth(i);
    await typeInto(page, cell, `print("cell ${i}")`);
    await page.keyboard.press('Shift+Enter');
    await cell.locator('.cell-foot .badge-ok').waitFor({ timeout: LONG });
  }
  const cell = page.locator('.cell').nth(4);
  await typeInto(page, cell, 'for i in range(300_000):\n    print("line", i)');
  await page.keyboard.press('Control+Enter');
  await cell.locator('.cell-foot .badge-ok').waitFor({ timeout: LONG });
  await cell.locator('.out-stdout', { hasText: 'line 299999' }).waitFor();
  const printed = await cell.locator('.out-stdout').evaluate((el) => el.textContent.length);
  assert.ok(printed > 1_000_000, `the page holds the whole (capped) 1 MiB output: ${printed} characters`);
  const out = cell.locator('.cell-output');
  const inner = await out.evaluate((el) => el.scrollHeight);
  assert.ok(inner > 100_000, `the output is all there, in its box: ${inner} px`);
  const height = await pageHeight(page);
  assert.ok(height < 6000, `the page stays short with a 300,000-line output: ${height} px`);
  // The status is in view with the cell, below the box.
  await cell.scrollIntoViewIfNeeded();
  await cell.locator('.cell-head').evaluate((el) => el.scrollIntoView({ block: 'start' }));
  assert.ok(await inView(page, cell.locator('.cell-foot .badge-ok')), 'the status under the box is in view');
  await shot(page, '12-long-output-1366');

  // Show all: the whole output in the page; the head (count, Run, status) sticks in view.
  const showAll = cell.getByRole('button', { name: 'Show all output' });
  assert.ok(await showAll.isVisible(), 'a long output offers "Show all"');
  await showAll.click();
  const full = await pageHeight(page);
  assert.ok(full > 100_000, `"Show all" shows it all: ${full} px`);
  await page.evaluate((y) => window.scrollTo(0, y), Math.round(full / 2));
  assert.ok(await inView(page, cell.locator('.cell-state .badge-ok')), 'the status stays in view mid-output');
  await cell.getByRole('button', { name: 'Collapse output' }).click();
  const again = await pageHeight(page);
  assert.ok(again < 6000, `collapsed again: ${again} px`);

  // A phone opens the notebook (history, then a new cell) at its top.
  const phone = await browser.newContext({ viewport: { width: 390, height: 844 } });
  const p2 = await phone.newPage();
  watch(p2);
  await p2.goto(url);
  await p2.locator('.cell .out-stdout', { hasText: 'line 299999' }).waitFor({ timeout: LONG });
  await p2.locator('.cell').nth(5).waitFor();
  await p2.waitForTimeout(300);
  assert.equal(await p2.evaluate(() => window.scrollY), 0, 'the notebook opens at its top');
  assert.ok(await inView(p2, p2.locator('.cell').first().locator('.cell-head')), 'the first cell is in view');
  const phoneHeight = await pageHeight(p2);
  assert.ok(phoneHeight < 8000, `the page stays short on a phone: ${phoneHeight} px`);
  await noHorizontalScroll(p2, 'long output at 390 px');
  await shot(p2, '13-long-output-390');
  await phone.close();
  await context.close();
}


// Every rich MIME type a cell can show, each rendered safely: the SVG's script, the
// Markdown's inline HTML and javascript: link never run.
const RICH = [
  'import matplotlib.pyplot as plt',
  'from IPython.display import SVG, Markdown, JSON, Latex',
  `display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="120" height="60"><rect width="120" height="60" fill="teal"/><script>window.top.pwned=1</script></svg>'))`,
  `display(Markdown('# Report\\n\\n**bold** and \`code\` <img src=x onerror="window.pwned=2"> [safe](https://example.com/) [bad](javascript:window.pwned=3)\\n\\n- one\\n- two'))`,
  "display(JSON({'answer': 42}))",
  "display(Latex('$e^{i\\\\pi}+1=0$'))",
  "display({'application/vnd.vegalite.v5+json': {'mark': 'bar', 'title': 'poll', 'data': {'values': [{'a': 'x', 'b': 3}]}}, 'text/plain': 'vega'}, raw=True)",
  "display({'application/pdf': b'%PDF-1.4 tiny', 'text/plain': 'pdf'}, raw=True)",
  "plt.bar(['p', 'q'], [3, 5])",
  "plt.title('votes')",
  'plt.show()',
].join('\n');

async function rich(browser) {
  const context = await browser.newContext({ viewport: { width: 1366, height: 900 } });
  const page = await context.newPage();
  watch(page);
  await page.goto(BASE + '/');
  await page.getByRole('button', { name: 'New session' }).click();
  await page.waitForURL(/#\/s\/ses_/);
  const cell = page.locator('.cell').first();
  await typeInto(page, cell, RICH);
  await page.keyboard.press('Control+Enter');
  await cell.locator('.cell-foot .badge-ok').waitFor({ timeout: LONG });

  const svg = cell.locator('img.out-svg');
  await svg.waitFor();
  assert.match(await svg.getAttribute('src'), /^data:image\/svg\+xml;base64,/);
  await page.waitForFunction((el) => el.complete && el.naturalWidth === 120, await svg.elementHandle());

  const md = cell.locator('.out-markdown');
  assert.equal(await md.locator('h1').textContent(), 'Report');
  assert.equal(await md.locator('strong').textContent(), 'bold');
  assert.equal(await md.locator('code').textContent(), 'code');
  assert.equal(await md.locator('li').count(), 2);
  assert.equal(await md.locator('img').count(), 0, 'inline HTML stays text');
  assert.match(await md.textContent(), /<img src=x onerror=/);
  const links = await md.locator('a').evaluateAll((as) => as.map((a) => a.getAttribute('href')));
  assert.deepEqual(links, ['https://example.com/'], 'only the http(s) link is a link');

  assert.deepEqual(JSON.parse(await cell.locator('.out-json').first().textContent()), { answer: 42 });
  assert.equal(await cell.locator('.out-latex').textContent(), '$e^{i\\pi}+1=0$');
  const spec = cell.locator('.out-spec');
  assert.equal(await spec.locator('.out-spec-head').textContent(), 'Vega-Lite chart: poll');
  assert.deepEqual(await spec.locator('tbody td').allTextContents(), ['x', '3']);
  const pdf = cell.locator('.out-pdf a');
  assert.equal(await pdf.getAttribute('download'), 'output.pdf');
  assert.match(await pdf.getAttribute('href'), /^blob:/);

  const chart = cell.locator('details.out-chart');
  assert.equal(await chart.getAttribute('data-chart-type'), 'bar');
  assert.match(await chart.locator('summary').textContent(), /chart data: bar “votes”/);
  await chart.locator('summary').click();
  assert.deepEqual(await chart.locator('tbody td').allTextContents(), ['Group 1 · p', '3', 'Group 1 · q', '5']);

  assert.equal(await page.evaluate(() => window.pwned), undefined, 'no output ran script');
  await shot(page, '13-rich-outputs-1366');
  await context.close();
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM,
  headless: true,
  // Running as root in CI: Chromium's own sandbox needs user namespaces it cannot have here.
  args: ['--no-sandbox', '--disable-dev-shm-usage'],
});
let failed = null;
try {
  if (PHASE === 'analyst') await analyst(browser);
  else if (PHASE === 'keys') await keys(browser);
  else if (PHASE === 'long') await long(browser);
  else if (PHASE === 'rich') await rich(browser);
  else throw new Error(`unknown PHASE ${PHASE}`);
} catch (e) {
  failed = e;
  for (const ctx of browser.contexts()) {
    for (const p of ctx.pages()) await shot(p, `failure-${PHASE}`).catch(() => {});
  }
} finally {
  await browser.close();
}
if (failed) {
  console.error(failed);
  if (problems.length) console.error(problems.join('\n'));
  process.exit(1);
}
assert.deepEqual(problems, [], 'no page errors and no console errors');
console.log(`${PHASE}: ok`);

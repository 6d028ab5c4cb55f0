// kforge dashboard: a read-only single page over the server's /api. No
// library and nothing fetched from elsewhere: the page must work offline.
// Every text from the server goes into the page as text (textContent),
// never as HTML: worker messages and kernel sources are not trusted.
'use strict';

const TOKEN_KEY = 'kforge-token';
const REFRESH_MS = 5000;

const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || '',
  open: false,        // the server needs no token (local development)
  timer: null,
  lastBody: '',       // the JSON the current view was drawn from
  renders: 0,         // renders started; only the latest may draw
};

// ------------------------------------------------------------ helpers ---

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function link(href, text) { return el('a', { href }, text); }

function us(v) {
  if (v === null || v === undefined || !(v > 0)) return '-';
  return v >= 1000 ? (v / 1000).toFixed(3) + ' ms' : v.toFixed(1) + ' \u00b5s';
}

function bytes(n) {
  if (!(n >= 0)) return '-';
  if (n < 1024) return n + ' B';
  if (n < 1 << 20) return (n / 1024).toFixed(1) + ' KiB';
  if (n < 1 << 30) return (n / (1 << 20)).toFixed(1) + ' MiB';
  return (n / (1 << 30)).toFixed(2) + ' GiB';
}

function when(ms) {
  if (!ms) return '-';
  return new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

function ago(ms, now) {
  if (!ms) return '-';
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 120) return s + ' s ago';
  if (s < 7200) return Math.round(s / 60) + ' min ago';
  return Math.round(s / 3600) + ' h ago';
}

function table(headers, rows, attrs) {
  return el('table', attrs || {},
    el('thead', {}, el('tr', {}, headers.map(h =>
      el('th', { class: h.num ? 'num' : null }, h.label || h)))),
    el('tbody', {}, rows));
}

function td(value, attrs) { return el('td', attrs || {}, value); }
function num(value, key) { return el('td', { class: 'num', 'data-k': key }, value); }

function cards(items) {
  return el('div', { class: 'cards' }, items.map(([k, v, key]) =>
    el('div', { class: 'card', 'data-card': key },
      el('div', { class: 'v', 'data-k': key }, v), el('div', { class: 'k' }, k))));
}

function stateText(s) { return el('span', { class: 'state-' + s, 'data-k': 'state' }, s); }

// ---------------------------------------------------------------- api ---

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path) {
  const headers = {};
  if (state.token) headers['Authorization'] = 'Bearer ' + state.token;
  const r = await fetch(path, { headers, cache: 'no-store' });
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) throw new ApiError(r.status, (body && body.error) || r.statusText);
  return body;
}

// --------------------------------------------------------------- plot ---

// A step line of the best time so far over time, the results as dots and
// the served best as a dashed line. Hand-drawn SVG: x is seconds since the
// first point, y is microseconds.
function plot(points, line, servedUs, title) {
  const W = 640, H = 240, L = 64, R = 16, T = 20, B = 34;
  const NS = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('class', 'plot');
  svg.setAttribute('width', W);
  svg.setAttribute('height', H);
  svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  svg.setAttribute('role', 'img');
  svg.setAttribute('aria-label', title);
  const add = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.appendChild(e);
    return e;
  };
  if (!points.length) {
    add('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle' }, 'no verified results yet');
    return svg;
  }
  const t0 = Math.min(...points.map(p => p.t));
  const t1 = Math.max(...points.map(p => p.t), t0 + 1000);
  const ys = points.map(p => p.us).concat(servedUs > 0 ? [servedUs] : []);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (y1 - y0 < y0 * 0.02) { y0 *= 0.98; y1 *= 1.02; }
  const pad = (y1 - y0) * 0.08;
  y0 = Math.max(0, y0 - pad); y1 += pad;
  const X = t => L + (t - t0) / (t1 - t0) * (W - L - R);
  const Y = v => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const v = y0 + (y1 - y0) * i / 4;
    add('line', { class: 'grid', x1: L, x2: W - R, y1: Y(v), y2: Y(v) });
    add('text', { x: L - 6, y: Y(v) + 4, 'text-anchor': 'end' }, v.toFixed(v < 100 ? 1 : 0));
  }
  const span = (t1 - t0) / 1000;
  for (let i = 0; i <= 4; i++) {
    const t = t0 + (t1 - t0) * i / 4;
    const s = (t - t0) / 1000;
    const label = span >= 600 ? (s / 60).toFixed(span >= 6000 ? 0 : 1) + ' min'
                              : s.toFixed(span >= 20 ? 0 : 1) + ' s';
    add('text', { x: X(t), y: H - B + 16, 'text-anchor': 'middle' }, label);
  }
  add('line', { class: 'axis', x1: L, x2: L, y1: T, y2: H - B });
  add('line', { class: 'axis', x1: L, x2: W - R, y1: H - B, y2: H - B });
  add('text', { x: 4, y: 12 }, '\u00b5s');
  if (servedUs > 0) {
    add('line', { class: 'served', x1: L, x2: W - R, y1: Y(servedUs), y2: Y(servedUs) });
  }
  if (line.length) {
    let d = `M ${X(line[0].t)} ${Y(line[0].us)}`;
    for (let i = 1; i < line.length; i++) d += ` H ${X(line[i].t)} V ${Y(line[i].us)}`;
    d += ` H ${X(t1)}`;
    add('path', { class: 'best', d });
  }
  for (const p of points) {
    const c = add('circle', { class: 'pt-' + (p.kind || 'evaluate'), cx: X(p.t), cy: Y(p.us), r: 3.5 });
    const tip = document.createElementNS(NS, 'title');
    tip.textContent = `${p.variant} ${p.kind}: ${us(p.us)}`;
    c.appendChild(tip);
  }
  return svg;
}

// -------------------------------------------------------------- pages ---

function usageCell(u, now) {
  if (!u) return td('not reported', { class: 'muted', 'data-k': 'gpu-usage' });
  const mem = u.memory_total_bytes > 0 ? ` \u00b7 ${bytes(u.memory_used_bytes)} of ${bytes(u.memory_total_bytes)}` : '';
  return td(Math.round(u.utilization * 100) + '%' + mem,
            { 'data-k': 'gpu-usage', title: 'reported ' + ago(u.at_unix_ms, now) });
}

function overviewPage(o) {
  const now = o.now_unix_ms;
  const j = o.jobs;
  const parts = [
    el('h2', {}, 'Overview'),
    cards([
      ['running jobs', j.running + j.queued, 'jobs-active'],
      ['succeeded', j.succeeded, 'jobs-succeeded'],
      ['failed', j.failed, 'jobs-failed'],
      ['cancelled', j.cancelled, 'jobs-cancelled'],
      ['tasks queued', o.tasks.queued, 'tasks-queued'],
      ['tasks leased', o.tasks.leased, 'tasks-leased'],
      ['tuned buckets', o.tuned_buckets, 'tuned-buckets'],
      ['verified in the last minute', o.verified_last_minute ?? '-', 'verified-minute'],
      ['database', bytes(o.database_bytes), 'database'],
      ['server', o.version, 'version'],
    ]),
  ];
  if (o.waiting_jobs.length) {
    parts.push(el('h3', {}, 'Waiting for workers'),
      el('ul', { id: 'waiting' }, o.waiting_jobs.map(w =>
        el('li', {}, link('#/jobs/' + w.job, w.job), ' ', el('span', { class: 'waiting' }, w.waiting_for)))));
  }
  parts.push(el('h2', {}, 'Workers'));
  if (!o.workers.length) {
    parts.push(el('p', { class: 'muted' }, 'No worker has registered.'));
  } else {
    parts.push(table(
      ['ID', 'Name', 'GPU', 'Arch', 'Kind', 'State', 'Current task', 'Last heartbeat',
       'GPU utilisation', 'Also compiles for', 'Sanitizers'],
      o.workers.map(w => el('tr', { 'data-worker': w.id },
        td(w.id), td(w.name), td(w.gpu.name || '-'), td(w.arch, { 'data-k': 'arch' }),
        td(w.compile_only ? 'compile only' : 'gpu'), td(stateText(w.state)),
        td(w.current_tasks.length ? w.current_tasks.map(t =>
          el('div', {}, t.task + ' ' + t.kind + ' ', link('#/variants/' + t.variant, t.variant),
             ' (', link('#/jobs/' + t.job, t.job), ')')) : '-', { 'data-k': 'task' }),
        td(ago(w.last_seen_unix_ms, now), { title: when(w.last_seen_unix_ms) }),
        usageCell(w.gpu_usage, now),
        td((w.compile_archs || []).join(' ') || '-'),
        td((w.sanitizer_tools || []).join(', ') || 'none'))),
      { id: 'workers' }));
  }
  return parts;
}

function progressCell(done, total) {
  const pct = total > 0 ? Math.min(100, Math.round(100 * done / total)) : 0;
  const bar = el('span', { class: 'bar' }, el('span', {}));
  bar.firstChild.style.width = pct + '%';
  return el('td', {}, bar, `${done}/${total}`);
}

function jobTotals(job) {
  const t = { proposed: 0, evaluated: 0, verified: 0, failed: 0, compiled: 0 };
  for (const p of job.progress) for (const k of Object.keys(t)) t[k] += p[k];
  return t;
}

function jobsPage(d) {
  const rows = d.jobs.map(j => {
    const t = jobTotals(j);
    const budget = j.budget.max_variants * Math.max(1, j.progress.length);
    return el('tr', { 'data-job': j.id },
      td(link('#/jobs/' + j.id, j.id)), td(j.name), td(stateText(j.state)),
      td(j.compile_only ? 'compile only' : j.proposer),
      progressCell(t.evaluated, budget),
      num(t.proposed, 'proposed'), num(t.evaluated, 'evaluated'),
      num(j.compile_only ? t.compiled : t.verified, j.compile_only ? 'compiled' : 'verified'),
      num(t.failed, 'failed'), num(j.tokens_used, 'tokens'),
      td(j.waiting_for ? el('span', { class: 'waiting', 'data-k': 'waiting' }, j.waiting_for) : j.message,
         { class: 'msg' }),
      td(when(j.created_unix_ms)));
  });
  return [el('h2', {}, 'Jobs'), d.jobs.length ? table(
    ['ID', 'Name', 'State', 'Proposer', 'Progress', { label: 'Proposed', num: 1 },
     { label: 'Evaluated', num: 1 }, { label: 'Verified / compiled', num: 1 },
     { label: 'Failed', num: 1 }, { label: 'Tokens', num: 1 }, 'Note', 'Created'],
    rows, { id: 'jobs' }) : el('p', { class: 'muted' }, 'No jobs yet.')];
}

function anchorsList(anchors) {
  if (!anchors.length) return el('span', { class: 'muted' }, 'no anchor figures for this bucket');
  return el('span', { 'data-k': 'anchors' }, anchors.map((a, i) => el('span', { 'data-anchor': a.name },
    (i ? '; ' : '') + `${a.name} ${us(a.us)}: `,
    el('b', { 'data-k': 'speedup' }, a.speedup ? a.speedup.toFixed(2) + 'x' : '-'))));
}

function jobPage(j) {
  const parts = [
    el('h2', {}, `Job ${j.id} `, el('span', { class: 'muted' }, j.name)),
    el('p', {}, 'State ', stateText(j.state), ` \u00b7 proposer ${j.proposer}`,
      j.compile_only ? ' \u00b7 compile only' : '', ` \u00b7 ${j.tokens_used} tokens \u00b7 created ${when(j.created_unix_ms)}`),
  ];
  if (j.waiting_for) parts.push(el('p', { class: 'waiting', id: 'waiting-for' }, j.waiting_for));
  if (j.message) parts.push(el('p', { id: 'job-message' }, j.message));
  parts.push(table(
    ['Bucket', { label: 'Proposed', num: 1 }, { label: 'Evaluated', num: 1 },
     { label: 'Verified', num: 1 }, { label: 'Compiled', num: 1 }, { label: 'Failed', num: 1 },
     'Best candidate', 'Best time'],
    j.progress.map(p => el('tr', { 'data-bucket': p.bucket },
      td(link('#/buckets/' + encodeURIComponent(p.bucket), p.bucket)),
      num(p.proposed, 'proposed'), num(p.evaluated, 'evaluated'), num(p.verified, 'verified'),
      num(p.compiled, 'compiled'), num(p.failed, 'failed'),
      td(p.best_variant ? link('#/variants/' + p.best_variant, p.best_variant) : '-'),
      num(us(p.best_us), 'best'))),
    { id: 'progress' }));
  for (const b of j.buckets) {
    const served = b.served ? b.served.us : 0;
    parts.push(el('div', { class: 'bucket', 'data-bucket': b.bucket },
      el('h3', {}, b.bucket),
      el('p', {}, 'Served best: ', b.served
        ? el('span', { 'data-k': 'served' }, link('#/variants/' + b.served.variant, b.served.variant), ' ' + us(b.served.us))
        : el('span', { class: 'muted' }, 'none'),
        ' \u00b7 speedup against anchors: ', anchorsList(b.anchors)),
      plot(b.points, b.best_so_far, served, 'best time over time for ' + b.bucket)));
  }
  return parts;
}

function bucketsPage(d) {
  return [el('h2', {}, 'Buckets'), d.buckets.length ? table(
    ['Bucket', 'Arch', 'Op', 'Best', { label: 'Time', num: 1 }, 'Measured by', 'Against anchors', 'Jobs'],
    d.buckets.map(b => el('tr', { 'data-bucket': b.bucket },
      td(link('#/buckets/' + encodeURIComponent(b.bucket), b.bucket)), td(b.arch), td(b.op),
      td(b.best ? link('#/variants/' + b.best.variant, b.best.variant) : '-'),
      num(us(b.best && b.best.us), 'best'),
      td(b.best ? b.best.measured_by : '', { class: 'msg' }),
      td(anchorsList(b.anchors)),
      td(b.jobs.map((id, i) => [i ? ' ' : '', link('#/jobs/' + id, id)])))),
    { id: 'buckets' }) : el('p', { class: 'muted' }, 'No buckets yet.')];
}

function evaluationsTable(evals, withVariant) {
  return table(
    ['ID', 'When', withVariant ? 'Variant' : null, 'Task', 'Outcome', { label: 'Median', num: 1 },
     { label: 'Regs', num: 1 }, { label: 'Spill B', num: 1 }, { label: 'Static smem', num: 1 },
     { label: 'Dyn smem', num: 1 }, { label: 'Compile ms', num: 1 }, 'Worker', 'GPU', 'Message']
      .filter(h => h !== null),
    evals.map(e => el('tr', { 'data-evaluation': e.id, class: e.served ? 'served' : null },
      td(String(e.id) + (e.served ? ' (served)' : '')), td(when(e.created_unix_ms)),
      withVariant ? td(link('#/variants/' + e.variant, e.variant)) : null,
      td(`${e.task} ${e.kind}`),
      td(el('span', { class: 'outcome-' + e.outcome, 'data-k': 'outcome' }, e.outcome)),
      num(us(e.timing && e.timing.median_us), 'median'), num(e.registers, 'registers'),
      num(e.spill_bytes, 'spill'), num(e.static_smem_bytes, 'static_smem'),
      num(e.dynamic_smem_bytes, 'dynamic_smem'), num(e.compile_ms.toFixed(0), 'compile_ms'),
      td(e.worker), td(e.gpu || '-'), td(e.message, { class: 'msg' }))),
    { class: 'evaluations' });
}

function bucketPage(b) {
  const parts = [el('h2', {}, 'Bucket ', el('span', { id: 'bucket-id' }, b.bucket))];
  if (b.best) {
    const v = b.best.verified;
    parts.push(el('p', { id: 'best' }, 'Best kernel ',
      link('#/variants/' + b.best.variant, b.best.variant),
      ': ', el('b', { 'data-k': 'best' }, us(b.best.timing.median_us)),
      ` (${b.best.measured_by || 'measured before this was recorded'}) \u00b7 served up to batch ${v.batch}, ` +
      `max_len_q ${v.max_len_q}, total_q ${v.total_q} \u00b7 updated ${when(b.best.updated_unix_ms)}`));
  } else {
    parts.push(el('p', { id: 'best', class: 'muted' }, 'No best: nothing verified has been promoted.'));
  }
  parts.push(el('p', {}, 'Against anchors: ', anchorsList(b.anchors)));
  parts.push(el('h3', {}, 'Fastest verified time over time'),
    plot(b.history, b.history, b.best ? b.best.timing.median_us : 0, 'history of ' + b.bucket));
  parts.push(el('h3', {}, 'Outcomes'), el('p', { id: 'outcomes' },
    Object.entries(b.outcomes).map(([k, n], i) =>
      el('span', { 'data-outcome': k }, (i ? ', ' : '') + `${k} `, el('b', {}, String(n))))));
  parts.push(el('h3', {}, `Evaluations (${b.evaluations.length})`), evaluationsTable(b.evaluations, true));
  parts.push(el('h3', {}, `Variants (${b.variants.length})`), table(
    ['ID', 'Origin', 'Template', 'Knobs', 'Model', 'Parent', 'Job', 'Created'],
    b.variants.map(v => el('tr', { 'data-variant': v.id },
      td(link('#/variants/' + v.id, v.id)), td(v.origin), td(v.template || '-'),
      td(v.knobs || '-', { class: 'msg' }), td(v.model || '-'), td(v.parent || '-'),
      td(v.job ? link('#/jobs/' + v.job, v.job) : '-'), td(when(v.created_unix_ms)))),
    { id: 'variants' }));
  return parts;
}

function variantPage(v) {
  return [
    el('h2', {}, 'Variant ', el('span', { id: 'variant-id' }, v.id)),
    table(['Origin', 'Template', 'Knobs', 'Model', 'Prompt hash', 'Parent', 'Job', 'Source hash', 'Created'],
      [el('tr', { id: 'provenance' }, td(v.origin), td(v.template || '-'), td(v.knobs || '-', { class: 'msg' }),
        td(v.model || '-'), td(v.prompt_hash || '-'),
        td(v.parent ? link('#/variants/' + v.parent, v.parent) : '-'),
        td(v.job ? link('#/jobs/' + v.job, v.job) : '-'), td(v.source_hash), td(when(v.created_unix_ms)))]),
    el('h3', {}, 'Evaluations (ptxas resources, outcome, timing)'), evaluationsTable(v.evaluations, false),
    el('h3', {}, 'Launch manifest'), el('pre', { id: 'manifest' }, v.manifest),
    el('h3', {}, 'Source'), el('pre', { id: 'source' }, v.source),
  ];
}

function spendPage(s) {
  return [
    el('h2', {}, 'Model spend'),
    el('p', { class: 'muted' }, 'Tokens are what the agent records of its spend; it records no price.'),
    cards([['tokens, all jobs', s.total_tokens, 'total-tokens']]),
    el('h3', {}, 'By proposer'),
    table(['Proposer', { label: 'Jobs', num: 1 }, { label: 'Tokens', num: 1 }],
      s.by_proposer.map(p => el('tr', { 'data-proposer': p.proposer },
        td(p.proposer), num(p.jobs, 'jobs'), num(p.tokens_used, 'tokens'))), { id: 'by-proposer' }),
    el('h3', {}, 'By job'),
    table(['Job', 'Name', 'State', 'Proposer', 'Models', { label: 'Variants', num: 1 },
           { label: 'From a model', num: 1 }, { label: 'Tokens', num: 1 }, { label: 'Token budget', num: 1 }],
      s.jobs.map(j => el('tr', { 'data-job': j.id },
        td(link('#/jobs/' + j.id, j.id)), td(j.name), td(stateText(j.state)), td(j.proposer),
        td(j.models.join(', ') || '-'), num(j.variants, 'variants'), num(j.model_variants, 'model_variants'),
        num(j.tokens_used, 'tokens'), num(j.max_tokens || 'none', 'max_tokens'))), { id: 'spend-jobs' }),
  ];
}

// ------------------------------------------------------------- router ---

const ROUTES = [
  [/^#\/overview$/, () => '/api/overview', overviewPage, 'overview'],
  [/^#\/jobs$/, () => '/api/jobs?limit=200', jobsPage, 'jobs'],
  [/^#\/jobs\/([A-Za-z0-9]+)$/, m => '/api/jobs/' + m[1], jobPage, 'jobs'],
  [/^#\/buckets$/, () => '/api/buckets', bucketsPage, 'buckets'],
  [/^#\/buckets\/(.+)$/, m => '/api/bucket?id=' + encodeURIComponent(decodeURIComponent(m[1])), bucketPage, 'buckets'],
  [/^#\/variants\/([A-Za-z0-9]+)$/, m => '/api/variants/' + m[1], variantPage, 'buckets'],
  [/^#\/spend$/, () => '/api/spend', spendPage, 'spend'],
];

function showLogin(message) {
  document.getElementById('login').hidden = false;
  document.getElementById('view').replaceChildren();
  document.getElementById('login-error').textContent = message || '';
  document.getElementById('token').focus();
}

async function render(refresh) {
  const hash = location.hash || '#/overview';
  const route = ROUTES.find(r => r[0].test(hash));
  const view = document.getElementById('view');
  if (!route) {
    view.replaceChildren(el('p', { class: 'error' }, 'No such page: ' + hash));
    return;
  }
  for (const a of document.querySelectorAll('nav a'))
    a.classList.toggle('active', a.dataset.page === route[3]);
  if (!state.open && !state.token) return showLogin('');
  const path = route[1](hash.match(route[0]));
  // Renders overlap: the refresh timer's fetch for the page left can answer
  // after the fetch for the page opened since, and would draw the old page
  // over the new one. Only the render started last may draw.
  const mine = ++state.renders;
  try {
    const data = await api(path);
    if (mine !== state.renders) return;
    const body = JSON.stringify(data);
    document.getElementById('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
    // A refresh redraws only what changed, so a reader is not disturbed.
    if (refresh && body === state.lastBody) return;
    state.lastBody = body;
    document.getElementById('login').hidden = true;
    view.replaceChildren(...route[2](data));
    view.dataset.loaded = hash;
  } catch (e) {
    if (mine !== state.renders) return;
    if (e instanceof ApiError && e.status === 401) {
      state.token = '';
      sessionStorage.removeItem(TOKEN_KEY);
      return showLogin('The server refused the token: ' + e.message);
    }
    view.replaceChildren(el('p', { class: 'error', id: 'error' }, String(e.message || e)));
  }
}

function schedule() {
  clearInterval(state.timer);
  state.timer = setInterval(() => { if (!document.hidden) render(true); }, REFRESH_MS);
}

async function start() {
  try {
    state.open = (await api('/api/auth')).open === true;
  } catch (e) {
    state.open = false;
  }
  document.getElementById('forget').hidden = state.open;
  document.getElementById('forget').addEventListener('click', () => {
    state.token = '';
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin('');
  });
  document.getElementById('token-form').addEventListener('submit', ev => {
    ev.preventDefault();
    const t = document.getElementById('token').value.trim();
    if (!t) return showLogin('Enter a token.');
    state.token = t;
    sessionStorage.setItem(TOKEN_KEY, t);
    document.getElementById('token').value = '';
    state.lastBody = '';
    render(false);
  });
  window.addEventListener('hashchange', () => { state.lastBody = ''; render(false); });
  if (!location.hash) history.replaceState(null, '', '#/overview');
  await render(false);
  schedule();
}

start();

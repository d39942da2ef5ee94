// tether operator console (SPEC U4): a page of plain JavaScript that calls
// the executor's public API over the Connect protocol on the same origin,
// with the user's bearer token. It decides nothing about who may see what:
// every call is authorized by the executor exactly as on the gRPC port, so
// a company's user sees only that company and an operator sees all.
'use strict';

const EXECUTOR = 'tether.executor.v1.ExecutorService';
const REGISTRY = 'tether.executor.v1.GatewayRegistry';
const TOKEN_KEY = 'tether.console.token';

// ---- API -------------------------------------------------------------

class APIError extends Error {
  constructor(code, message, reason) {
    super(message || code);
    this.code = code;       // Connect code: not_found, unauthenticated, …
    this.reason = reason;   // tether's stable code (ErrorInfo reason)
  }
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ''; }

function headers(contentType) {
  const h = { 'Content-Type': contentType, 'Connect-Protocol-Version': '1' };
  const t = token();
  if (t) h.Authorization = 'Bearer ' + t;
  return h;
}

function errorOf(body, status) {
  const e = body && typeof body === 'object' ? body : {};
  let reason = '';
  for (const d of e.details || []) {
    if (d.type === 'google.rpc.ErrorInfo' && d.debug && d.debug.reason) reason = d.debug.reason;
  }
  return new APIError(e.code || 'http_' + status, e.message || 'HTTP ' + status, reason);
}

// call makes a unary call in the Connect protocol's JSON form.
async function call(service, method, req) {
  const resp = await fetch('/' + service + '/' + method, {
    method: 'POST', headers: headers('application/json'), body: JSON.stringify(req || {}),
  });
  const text = await resp.text();
  let body = {};
  try { body = text ? JSON.parse(text) : {}; } catch (_) { body = { message: text }; }
  if (!resp.ok) throw errorOf(body, resp.status);
  return body;
}

// stream makes a server-streaming call (Connect streaming, JSON): each
// message is enveloped as a flag byte, a big-endian uint32 length and the
// message; the flag 0x02 marks the end of the stream, with its error.
async function* stream(service, method, req, signal) {
  const msg = new TextEncoder().encode(JSON.stringify(req || {}));
  const body = new Uint8Array(5 + msg.length);
  new DataView(body.buffer).setUint32(1, msg.length);
  body.set(msg, 5);
  const resp = await fetch('/' + service + '/' + method, {
    method: 'POST', headers: headers('application/connect+json'), body, signal,
  });
  if (!resp.ok) {
    let b = {};
    try { b = await resp.json(); } catch (_) { /* not JSON */ }
    throw errorOf(b, resp.status);
  }
  const reader = resp.body.getReader();
  let buf = new Uint8Array(0);
  const dec = new TextDecoder();
  for (;;) {
    while (buf.length >= 5) {
      const n = new DataView(buf.buffer, buf.byteOffset, 5).getUint32(1);
      if (buf.length < 5 + n) break;
      const flags = buf[0];
      const payload = JSON.parse(dec.decode(buf.subarray(5, 5 + n)) || '{}');
      buf = buf.slice(5 + n);
      if (flags & 0x02) {
        if (payload.error) throw errorOf(payload.error, 0);
        return;
      }
      yield payload;
    }
    const { done, value } = await reader.read();
    if (done) throw new APIError('unavailable', 'the stream was cut', '');
    const next = new Uint8Array(buf.length + value.length);
    next.set(buf);
    next.set(value, buf.length);
    buf = next;
  }
}

// ---- DOM helpers (text only: nothing from the API is parsed as HTML) ----

function el(tag, attrs, ...children) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) n.addEventListener(k.slice(2), v);
    else if (k === 'className') n.className = v;
    else n.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    n.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return n;
}

function table(id, columns, rows) {
  return el('table', { id },
    el('thead', {}, el('tr', {}, columns.map((c) => el('th', {}, c)))),
    el('tbody', {}, rows));
}

function when(ts) { return ts ? new Date(ts).toLocaleString() : ''; }
function short(s, n) { s = String(s || ''); return s.length > n ? s.slice(0, n - 1) + '…' : s; }

const view = () => document.getElementById('view');
// show replaces the page's content (null and false children are left out).
function show(...nodes) { view().replaceChildren(...nodes.flat().filter((n) => n !== null && n !== undefined && n !== false)); }
let pageGeneration = 0; // a page's async work checks it is still current

function notice(text, info) {
  const n = document.getElementById('notice');
  n.textContent = text || '';
  n.className = info ? 'info' : '';
}

function showError(e) {
  if (e instanceof APIError) {
    let hint = '';
    if (e.code === 'unauthenticated') hint = ' — enter a bearer token above';
    if (e.code === 'permission_denied') hint = ' — your token does not allow this';
    notice((e.reason || e.code) + ': ' + e.message + hint);
  } else {
    notice(String(e));
  }
}

function params() {
  const h = location.hash.replace(/^#/, '');
  const i = h.indexOf('?');
  return new URLSearchParams(i < 0 ? '' : h.slice(i + 1));
}

// ---- pages ------------------------------------------------------------

const RUN_STATES = ['', 'RUN_STATE_QUEUED', 'RUN_STATE_RUNNING', 'RUN_STATE_SUCCEEDED', 'RUN_STATE_FAILED', 'RUN_STATE_CANCELLED'];

function companyOf(run) { return ((run.input || {}).binding || {}).companyId || ''; }
function sessionOf(run) { return ((run.input || {}).session || {}).normalizedSessionId || ''; }
function runLink(id, company) {
  const q = company ? '?company=' + encodeURIComponent(company) : '';
  return el('a', { href: '#/run/' + encodeURIComponent(id) + q }, id);
}

// Runs: filters, paging (page tokens), and a submit form.
async function runsPage(gen) {
  const p = params();
  const filters = { state: p.get('state') || '', session: p.get('session') || '', company: p.get('company') || '' };
  const tokens = (p.get('pages') || '').split(',').filter(Boolean); // tokens of the pages before this one
  const pageToken = p.get('page') || '';
  const go = (f, page, pages) => {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(f)) if (v) q.set(k, v);
    if (p.get('size')) q.set('size', p.get('size'));
    if (page) q.set('page', page);
    if (pages && pages.length) q.set('pages', pages.join(','));
    location.hash = '#/runs?' + q.toString();
  };
  const form = el('form', { className: 'filters', id: 'run-filters', onsubmit: (ev) => {
    ev.preventDefault();
    const fd = new FormData(ev.target);
    go({ state: fd.get('state'), session: fd.get('session').trim(), company: fd.get('company').trim() });
  } },
  el('label', {}, 'State', el('select', { name: 'state' }, RUN_STATES.map((s) => el('option', { value: s, selected: s === filters.state }, s ? s.replace('RUN_STATE_', '').toLowerCase() : 'any')))),
  el('label', {}, 'Session', el('input', { name: 'session', value: filters.session })),
  el('label', {}, 'Company', el('input', { name: 'company', value: filters.company })),
  el('button', { type: 'submit' }, 'Filter'));
  const size = Math.min(Math.max(Number(p.get('size')) || 20, 1), 500);
  const req = { pageSize: size, pageToken, normalizedSessionId: filters.session, companyId: filters.company };
  if (filters.state) req.state = filters.state;
  const resp = await call(EXECUTOR, 'ListRuns', req);
  if (gen !== pageGeneration) return;
  // companyId is a filter of newer executors; older ones ignore it, so it
  // is applied to what was listed too.
  const runs = (resp.runs || []).filter((r) => !filters.company || companyOf(r) === filters.company);
  const rows = runs.map((r) => el('tr', { 'data-run-id': r.runId },
    el('td', { className: 'mono' }, runLink(r.runId, companyOf(r))),
    el('td', {}, companyOf(r)),
    el('td', { className: 'mono' }, sessionOf(r)),
    el('td', { className: 'state-' + r.state }, (r.state || '').replace('RUN_STATE_', '').toLowerCase()),
    el('td', {}, r.attempt || ''),
    el('td', {}, when(r.createdAt)),
    el('td', {}, short((r.result || {}).finalMessage || (r.failure || {}).code || '', 80))));
  const pager = el('div', { className: 'pager' },
    el('button', { type: 'button', id: 'runs-prev', disabled: !pageToken && !tokens.length, onclick: () => {
      const prev = tokens.slice();
      const page = prev.pop() || '';
      go(filters, page === '-' ? '' : page, prev);
    } }, 'Previous'),
    el('button', { type: 'button', id: 'runs-next', disabled: !resp.nextPageToken, onclick: () => go(filters, resp.nextPageToken, tokens.concat([pageToken || '-'])) }, 'Next'));
  show(
    el('h2', {}, 'Runs'), form,
    table('runs-table', ['Run', 'Company', 'Session', 'State', 'Attempt', 'Created', 'Result'], rows),
    rows.length ? null : el('p', { className: 'muted' }, 'No runs.'),
    pager,
    submitForm());
}

function submitForm() {
  return el('form', { className: 'inline card', id: 'submit-run', onsubmit: async (ev) => {
    ev.preventDefault();
    const fd = new FormData(ev.target);
    const runId = fd.get('runId').trim() || 'console-' + Date.now().toString(36);
    const input = {
      provider: { kind: 'codex' },
      binding: { companyId: fd.get('company').trim(), agentId: fd.get('agent').trim() || 'console' },
      task: { prompt: fd.get('prompt') },
      session: { normalizedSessionId: fd.get('session').trim(), lifecycle: { mode: 'LIFECYCLE_MODE_WARM' } },
    };
    try {
      const resp = await call(EXECUTOR, 'SubmitRun', { runId, input });
      location.hash = '#/run/' + encodeURIComponent(resp.run.runId) + '?company=' + encodeURIComponent(input.binding.companyId);
    } catch (e) { showError(e); }
  } },
  el('strong', {}, 'Submit a run'),
  el('label', {}, 'Run id', el('input', { name: 'runId', placeholder: '(generated)' })),
  el('label', {}, 'Company', el('input', { name: 'company', required: true })),
  el('label', {}, 'Agent', el('input', { name: 'agent', value: 'agent-1' })),
  el('label', {}, 'Session', el('input', { name: 'session', required: true })),
  el('label', {}, 'Prompt', el('input', { name: 'prompt', required: true, size: 40 })),
  el('button', { type: 'submit', className: 'primary' }, 'Submit'));
}

function kv(pairs) {
  return el('dl', { className: 'kv' }, pairs.filter(([, v]) => v !== undefined && v !== '' && v !== null)
    .map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
}

function runDetails(run) {
  const res = run.result || {};
  const f = run.failure || {};
  const c = run.cancellation;
  return kv([
    ['State', el('span', { id: 'run-state', className: 'state-' + run.state }, run.state)],
    ['Phase', run.phase], ['Attempt', run.attempt], ['Company', companyOf(run)], ['Session', sessionOf(run)],
    ['Agent', ((run.input || {}).binding || {}).agentId], ['Submitted by', run.submittedBy],
    ['Created', when(run.createdAt)], ['Started', when(run.startedAt)], ['Ended', when(run.endedAt)],
    ['Runner', run.runnerInstanceId], ['Events', run.eventCount],
    ['Waiting', run.queuedReason ? run.queuedReason.code + ': ' + run.queuedReason.message : ''],
    ['Failure', f.code ? f.code + ': ' + (f.message || '') : ''],
    ['Summary', res.summary], ['Final message', res.finalMessage],
    ['Cancellation', c ? c.scope + ' ' + c.dispatchState + ' (intent audit ' + c.intentAuditId + (c.acknowledgementAuditId ? ', ack audit ' + c.acknowledgementAuditId : '') + ')' : ''],
  ]);
}

function eventText(ev) {
  const p = ev.payload || {};
  if (typeof p.delta === 'string') return p.delta;
  if (typeof p.text === 'string') return p.text;
  const s = JSON.stringify(p);
  return s === '{}' ? '' : short(s, 240);
}

// Run: details, its interactions, and its live event stream, which resumes
// from the last seq it showed after a dropped connection.
async function runPage(gen, id) {
  const company = params().get('company') || '';
  const ref = company ? { runId: id, companyId: company } : { runId: id };
  const details = el('div', { id: 'run-details' });
  const state = el('span', { id: 'stream-state', 'data-state': 'connecting' }, 'connecting');
  const lastSeq = el('span', { id: 'last-seq' }, '0');
  const events = el('ol', { id: 'events' });
  const interactions = el('div', { id: 'run-interactions' });
  show(
    el('h2', {}, 'Run ', el('span', { className: 'mono' }, id)),
    details,
    el('div', { className: 'inline' },
      el('button', { type: 'button', className: 'danger', id: 'cancel-run', onclick: async () => {
        try {
          await call(EXECUTOR, 'CancelRun', Object.assign({ scope: 'CANCELLATION_SCOPE_RUN', reason: 'cancelled from the console' }, ref));
          notice('cancellation recorded', true);
          refresh();
        } catch (e) { showError(e); }
      } }, 'Cancel run')),
    el('h3', {}, 'Pending interactions'), interactions,
    el('h3', {}, 'Events ', el('span', { className: 'muted' }, '(stream: '), state, el('span', { className: 'muted' }, ', last seq '), lastSeq, el('span', { className: 'muted' }, ')')),
    events);
  const refresh = async () => {
    try {
      const r = await call(EXECUTOR, 'GetRun', ref);
      if (gen === pageGeneration) details.replaceChildren(runDetails(r.run));
      const ia = await call(EXECUTOR, 'ListInteractions', { runId: id, status: 'pending' });
      if (gen === pageGeneration) interactions.replaceChildren(...interactionCards(ia.interactions || [], refresh));
    } catch (e) { showError(e); }
  };
  await refresh();
  follow(gen, ref, events, state, lastSeq, refresh);
}

async function follow(gen, ref, list, state, lastSeq, refresh) {
  let last = 0;
  let delay = 250;
  const set = (s) => { state.textContent = s; state.setAttribute('data-state', s); };
  while (gen === pageGeneration) {
    const ctl = new AbortController();
    currentAbort = ctl;
    try {
      set(last ? 'reconnecting' : 'connecting');
      for await (const m of stream(EXECUTOR, 'WatchRun', Object.assign({ afterSeq: String(last) }, ref), ctl.signal)) {
        if (gen !== pageGeneration) return;
        set('live');
        delay = 250;
        const seq = Number(m.seq);
        if (seq <= last) continue; // never shown twice
        last = seq;
        lastSeq.textContent = String(seq);
        const ev = m.event || {};
        list.append(el('li', { 'data-seq': seq, 'data-type': ev.eventType },
          el('span', {}, seq), el('span', {}, ev.eventType), el('span', {}, eventText(ev))));
        list.scrollTop = list.scrollHeight;
        if (ev.eventType === 'run.terminal' || ev.eventType === 'turn.completed' || ev.eventType === 'interaction.created') refresh();
      }
      set('ended');
      refresh();
      return;
    } catch (e) {
      if (gen !== pageGeneration) return;
      if (e instanceof APIError && !['unavailable', 'deadline_exceeded', 'internal', 'unknown', 'aborted', 'http_0'].includes(e.code)) {
        set('error');
        showError(e);
        return;
      }
      // A network error or an Unavailable: reconnect from the last seq.
      set('reconnecting');
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 5000);
    }
  }
}

let currentAbort = null;

function interactionCards(list, after) {
  if (!list.length) return [el('p', { className: 'muted' }, 'None pending.')];
  return list.map((ia) => interactionCard(ia, after));
}

function interactionCard(ia, after) {
  const pending = ia.status === 'pending';
  const questions = (ia.questions || []).map((q) => {
    const multi = q.selectionMode === 'multiple';
    return el('fieldset', { 'data-question-id': q.id },
      el('legend', {}, q.prompt || q.id),
      (q.options || []).map((o) => el('label', { className: 'option' },
        el('span', {},
          el('input', { type: multi ? 'checkbox' : 'radio', name: 'q-' + q.id, value: o.id, disabled: !pending }),
          ' ', o.label || o.id, o.description ? el('span', { className: 'muted' }, ' — ' + o.description) : null),
        o.freeText ? el('input', { type: 'text', name: 'text-' + q.id, disabled: !pending }) : null)));
  });
  const form = el('form', { className: 'card', 'data-interaction-id': ia.interactionId, onsubmit: async (ev) => {
    ev.preventDefault();
    const fd = new FormData(ev.target);
    const answers = (ia.questions || []).map((q) => {
      const a = { questionId: q.id, optionIds: fd.getAll('q-' + q.id) };
      const text = fd.get('text-' + q.id);
      if (text) a.text = text;
      return a;
    }).filter((a) => a.optionIds.length);
    try {
      const resp = await call(EXECUTOR, 'AnswerInteraction', { interactionId: ia.interactionId, answers });
      const next = resp.continuationRun ? resp.continuationRun.runId : '';
      notice('answered ' + ia.interactionId + (next ? '; continuation run ' + next : ''), true);
      if (after) after();
    } catch (e) { showError(e); }
  } },
  el('div', {}, el('strong', {}, ia.title || ia.kind), ' ', el('span', { className: 'muted' }, ia.kind + ' · ' + ia.status + ' · ' + ia.companyId + ' · run '), runLink(ia.sourceRunId, ia.companyId)),
  ia.summary ? el('p', {}, ia.summary) : null,
  questions,
  pending ? el('button', { type: 'submit', className: 'primary' }, 'Answer') :
    el('p', { className: 'muted' }, 'answered by ' + (ia.answeredBy || '?') + ' ' + when(ia.answeredAt) + (ia.continuationRunId ? ' → run ' + ia.continuationRunId : '')));
  return form;
}

// Interactions: pending (or all) with an answer form each.
async function interactionsPage(gen) {
  const status = params().get('status') ?? 'pending';
  const resp = await call(EXECUTOR, 'ListInteractions', { status, pageSize: 100 });
  if (gen !== pageGeneration) return;
  const reload = () => { if (gen === pageGeneration) route(true); };
  show(
    el('h2', {}, 'Interactions'),
    el('form', { className: 'filters' },
      el('label', {}, 'Status', el('select', { id: 'interaction-status', onchange: (ev) => { location.hash = '#/interactions?status=' + ev.target.value; } },
        [['pending', 'pending'], ['answered', 'answered'], ['', 'any']].map(([v, t]) => el('option', { value: v, selected: v === status }, t))))),
    el('div', { id: 'interactions' }, interactionCards(resp.interactions || [], reload)));
}

// Sessions: the warm sessions of the newest runs, each with its gateway
// (GetSession per session; the API has no session listing).
async function sessionsPage(gen) {
  const resp = await call(EXECUTOR, 'ListRuns', { pageSize: 200 });
  const seen = new Map();
  for (const r of resp.runs || []) {
    const key = companyOf(r) + '\u0000' + sessionOf(r);
    if (sessionOf(r) && !seen.has(key)) seen.set(key, { companyId: companyOf(r), normalizedSessionId: sessionOf(r) });
  }
  const sessions = [];
  for (const ref of seen.values()) {
    try {
      const s = await call(EXECUTOR, 'GetSession', ref);
      sessions.push(...(s.sessions || []));
    } catch (e) {
      if (!(e instanceof APIError) || e.code !== 'not_found') throw e;
    }
  }
  if (gen !== pageGeneration) return;
  const rows = sessions.map((s) => el('tr', { 'data-session': s.normalizedSessionId, 'data-gateway-id': s.gatewayId },
    el('td', {}, s.companyId), el('td', { className: 'mono' }, s.normalizedSessionId), el('td', {}, s.agentId),
    el('td', {}, s.lifecycle), el('td', { className: 'mono' }, s.gatewayId || ''),
    el('td', {}, s.runnerConnected ? 'connected' : 'no'),
    el('td', { className: 'mono' }, s.activeRunId ? runLink(s.activeRunId, s.companyId) : ''),
    el('td', { className: 'mono' }, s.lastRunId ? runLink(s.lastRunId, s.companyId) : ''),
    el('td', {}, (s.lastRunState || '').replace('RUN_STATE_', '').toLowerCase()),
    el('td', {}, s.runCount || ''),
    el('td', { className: 'mono' }, s.checkpoint ? short(s.checkpoint.checkpointId, 24) : '')));
  show(el('h2', {}, 'Sessions'),
    el('p', { className: 'muted' }, 'The sessions of the newest 200 runs you can read, with the gateway each is placed on.'),
    table('sessions-table', ['Company', 'Session', 'Agent', 'Lifecycle', 'Gateway', 'Runner', 'Active run', 'Last run', 'Last state', 'Runs', 'Checkpoint'], rows),
    rows.length ? null : el('p', { className: 'muted' }, 'No sessions.'));
}

// Gateways: the registry, with a drain action (operators only: the
// executor refuses it to anyone else).
async function gatewaysPage(gen) {
  const resp = await call(REGISTRY, 'ListGateways', {});
  if (gen !== pageGeneration) return;
  const rows = (resp.gateways || []).map((g) => {
    const d = g.drain;
    const reason = el('input', { name: 'reason', placeholder: 'reason', size: 14 });
    return el('tr', { 'data-gateway-id': g.gatewayId },
      el('td', { className: 'mono' }, g.gatewayId), el('td', { className: 'mono' }, g.address),
      el('td', { className: 'gateway-state' }, (g.state || '').replace('GATEWAY_STATE_', '').toLowerCase()),
      el('td', {}, (g.sessions || 0) + ' / ' + (g.capacity || 0)), el('td', {}, g.placedScopes || 0),
      el('td', {}, Object.entries(g.labels || {}).map(([k, v]) => k + '=' + v).join(', ')),
      el('td', {}, when(g.lastHeartbeatAt)),
      el('td', { className: 'drain-progress' }, d ? 'by ' + (d.requestedBy || '?') + ': moved ' + (d.movedScopes || 0) + ', remaining ' + (d.remainingScopes || 0) + ', busy ' + (d.busyScopes || 0) + (d.done ? ' — done' : '') : ''),
      el('td', {}, d ? null : el('form', { className: 'inline', onsubmit: async (ev) => {
        ev.preventDefault();
        try {
          await call(REGISTRY, 'DrainGateway', { gatewayId: g.gatewayId, reason: reason.value || 'drained from the console' });
          notice('drain of ' + g.gatewayId + ' requested', true);
          route(true);
        } catch (e) { showError(e); }
      } }, reason, el('button', { type: 'submit', className: 'danger drain' }, 'Drain'))));
  });
  show(el('h2', {}, 'Gateways'),
    table('gateways-table', ['Gateway', 'Address', 'State', 'Sessions', 'Scopes', 'Labels', 'Heartbeat', 'Drain', ''], rows),
    rows.length ? null : el('p', { className: 'muted' }, 'No registered gateways (a single static gateway serves every session).'));
}

// Audit: the audit records the API returns — cancellation intents and
// acknowledgements of runs, answers of interactions, requested drains.
// The exactly-once audit of the event history (tetherctl audit) reads the
// database and has no API call yet.
async function auditPage(gen) {
  const [runs, answered] = await Promise.all([
    call(EXECUTOR, 'ListRuns', { pageSize: 200 }),
    call(EXECUTOR, 'ListInteractions', { status: 'answered', pageSize: 200 }),
  ]);
  let gateways = [];
  try { gateways = (await call(REGISTRY, 'ListGateways', {})).gateways || []; } catch (e) { /* operators only */ }
  if (gen !== pageGeneration) return;
  const rows = [];
  for (const r of runs.runs || []) {
    const c = r.cancellation;
    if (c) rows.push(el('tr', {}, el('td', {}, 'cancellation'), el('td', { className: 'mono' }, runLink(r.runId, companyOf(r))), el('td', {}, companyOf(r)),
      el('td', {}, c.scope + ' · ' + c.dispatchState + (c.reason ? ' · ' + c.reason : '')), el('td', { className: 'mono' }, [c.intentAuditId, c.acknowledgementAuditId].filter(Boolean).join(' / '))));
  }
  for (const ia of answered.interactions || []) {
    rows.push(el('tr', {}, el('td', {}, 'answer'), el('td', { className: 'mono' }, runLink(ia.sourceRunId, ia.companyId)), el('td', {}, ia.companyId),
      el('td', {}, (ia.title || ia.kind) + ' answered by ' + (ia.answeredBy || '?') + ' ' + when(ia.answeredAt)), el('td', { className: 'mono' }, ia.interactionId)));
  }
  for (const g of gateways) {
    if (g.drain) rows.push(el('tr', {}, el('td', {}, 'drain'), el('td', { className: 'mono' }, g.gatewayId), el('td', {}, ''),
      el('td', {}, 'requested by ' + (g.drain.requestedBy || '?') + ' ' + when(g.drain.requestedAt) + (g.drain.reason ? ' · ' + g.drain.reason : '')), el('td', {}, '')));
  }
  show(el('h2', {}, 'Audit'),
    el('p', { className: 'muted' }, 'Audited actions the API reports for what you can read: cancellations (intent and acknowledgement audit ids), answered interactions and gateway drains. The exactly-once check of the event history is `tetherctl audit -database-url …`.'),
    table('audit-table', ['Action', 'Subject', 'Company', 'Record', 'Audit id'], rows),
    rows.length ? null : el('p', { className: 'muted' }, 'No audited actions.'));
}

// ---- routing and the token ----------------------------------------------

const pages = { runs: runsPage, run: runPage, interactions: interactionsPage, sessions: sessionsPage, gateways: gatewaysPage, audit: auditPage };

// route shows the page the location names; a reload (keep) keeps the
// notice a just-finished action wrote.
async function route(keep) {
  const gen = ++pageGeneration;
  if (currentAbort) { currentAbort.abort(); currentAbort = null; }
  const path = location.hash.replace(/^#\/?/, '').split('?')[0].split('/');
  const name = pages[path[0]] ? path[0] : 'runs';
  for (const a of document.querySelectorAll('nav a')) a.classList.toggle('active', a.dataset.nav === name || (name === 'run' && a.dataset.nav === 'runs'));
  if (keep !== true) notice('');
  show(el('p', { className: 'muted' }, 'Loading…'));
  try {
    await pages[name](gen, decodeURIComponent(path[1] || ''));
  } catch (e) {
    if (gen === pageGeneration) { show(); showError(e); }
  }
}

function whoami() {
  const t = token();
  const w = document.getElementById('whoami');
  if (!t) { w.textContent = 'no token (loopback development mode only)'; return; }
  try {
    const claims = JSON.parse(atob(t.split('.')[1].replace(/-/g, '+').replace(/_/g, '/')));
    w.textContent = (claims.sub || '?') + ' · ' + (claims.tether_roles || []).join(', ');
  } catch (_) {
    w.textContent = 'token set';
  }
}

document.getElementById('auth').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const input = document.getElementById('token');
  const t = input.value.trim();
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
  input.value = '';
  whoami();
  route();
});
document.getElementById('token-clear').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN_KEY);
  whoami();
  route();
});
window.addEventListener('hashchange', () => route());
whoami();
route();

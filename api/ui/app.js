// Leasehold web console. Plain JavaScript, no dependencies: it reads the
// v1 JSON API of the server that served it and the /v1/events stream.
//
// The bearer token the user enters is kept in sessionStorage (this tab
// only) and sent in the Authorization header; it is never written into the
// page. Data is always inserted as text, never as HTML.
'use strict';

(function () {
  const TOKEN_KEY = 'leasehold.token';
  const POLL_MS = 2000;
  const FEED_MAX = 200;
  const TIMELINE_MAX = 500;

  const $ = (id) => document.getElementById(id);

  // ---- state ----
  const st = {
    scope: null, // "read" | "write" | "admin" once known
    holders: null, // a scoped token's holders ({names, prefixes}); null: every holder
    leases: [], // last listing, each with _deadline (performance.now() based)
    leaseNext: '',
    sessions: [],
    control: null,
    controlDeadline: 0,
    authFailed: false,
    feedCtl: null,
    historyCtl: null,
    historyKey: '',
    refreshTimer: 0,
    refreshDue: 0,
    refreshing: false,
    refreshAgain: false,
    banners: new Map(), // source -> message
  };

  // ---- small helpers ----
  function token() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch (e) { return ''; }
  }
  function authHeaders() {
    const t = token();
    return t ? { Authorization: 'Bearer ' + t } : {};
  }
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else if (k.startsWith('data-') || k.startsWith('aria-')) e.setAttribute(k, v);
      else e[k] = v;
    }
    for (const k of kids) {
      if (k === null || k === undefined) continue;
      e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return e;
  }
  function td(label, content, cls) {
    const c = el('td', { class: cls, 'data-label': label });
    if (content instanceof Node) c.append(content); else c.textContent = content === undefined || content === null ? '' : String(content);
    return c;
  }
  function setText(id, v) { $(id).textContent = v; }
  function fmtMS(ms) {
    if (ms <= 0) return '0.0 s';
    if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
    const s = Math.floor(ms / 1000);
    if (s < 3600) return Math.floor(s / 60) + ' m ' + String(s % 60).padStart(2, '0') + ' s';
    return Math.floor(s / 3600) + ' h ' + String(Math.floor(s / 60) % 60).padStart(2, '0') + ' m';
  }
  function fmtTime(iso) {
    if (!iso) return '';
    const d = new Date(iso);
    if (isNaN(d)) return '';
    return d.toLocaleTimeString([], { hour12: false }) + '.' + String(d.getMilliseconds()).padStart(3, '0');
  }
  function sleep(ms, signal) {
    return new Promise((resolve) => {
      const t = setTimeout(resolve, ms);
      if (signal) signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
    });
  }

  // ---- banners: one message per source, shown together ----
  function banner(source, msg) {
    if (msg) st.banners.set(source, msg); else st.banners.delete(source);
    const b = $('banner');
    b.textContent = '';
    for (const [src, m] of st.banners) {
      b.append(el('div', { class: 'msg' }, el('span', { text: m }),
        el('button', { type: 'button', class: 'dismiss', title: 'dismiss', 'aria-label': 'dismiss', text: '×', onclick: () => banner(src, null) })));
    }
    b.hidden = st.banners.size === 0;
  }

  // ---- the API ----
  class APIError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }
  async function readError(res) {
    let code = 'HTTP_' + res.status, message = res.statusText || 'request failed';
    try {
      const b = await res.json();
      if (b && b.error) { code = b.error.code || code; message = b.error.message || message; }
    } catch (e) { /* not JSON */ }
    return new APIError(res.status, code, message);
  }
  async function api(method, path, body) {
    const opts = { method, headers: authHeaders(), cache: 'no-store' };
    if (body !== undefined) {
      opts.headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    const res = await fetch(path, opts);
    if (!res.ok) throw await readError(res);
    const data = await res.json();
    return { data, res };
  }
  // explain turns an API error into a sentence for the user.
  function explain(err, what) {
    if (!(err instanceof APIError)) return what + ': ' + (err && err.message ? err.message : err);
    switch (err.status) {
      case 401: return 'This server requires a bearer token with at least the read scope: enter one above (' + err.message + ').';
      case 403:
        if (err.code === 'PERMISSION_DENIED') return what + ': your token lacks the scope for this (' + err.message + ').';
        return what + ': refused (' + err.code + ': ' + err.message + ').';
      case 428: return what + ': the control lease is active; admin actions need its holder (X-Control-Lease), which this console is not.';
    }
    return what + ': ' + err.code + ': ' + err.message;
  }
  function authProblem(err) {
    if (err instanceof APIError && err.status === 401) {
      st.authFailed = true;
      banner('auth', explain(err, ''));
      return true;
    }
    return false;
  }

  // ---- auth ----
  async function loadWhoami() {
    try {
      const { data } = await api('GET', '/v1/whoami');
      st.scope = data.scope;
      st.holders = data.holders || null;
      st.authFailed = false;
      banner('auth', null);
      setText('whoami', data.auth ? 'token ' + (data.name || '') + ' · ' + data.scope + scopeText(data) : 'auth off · ' + data.scope);
    } catch (err) {
      st.scope = null;
      st.holders = null;
      if (err instanceof APIError && err.status === 404) {
        setText('whoami', token() ? 'token set' : 'no token');
        return;
      }
      setText('whoami', token() ? 'token rejected' : 'no token');
      if (!authProblem(err)) banner('auth', explain(err, 'Checking the token'));
    }
    document.body.classList.toggle('admin', st.scope === 'admin');
    // The tables' actions follow the scope: drawn again at once, not at the
    // next read, so that no action of the previous token stays offered.
    renderLeases();
    renderSessions();
  }
  function isAdmin() { return st.scope === 'admin'; }
  // scopeText describes a scoped token's restrictions for the header.
  function scopeText(w) {
    if (!w.restricted) return '';
    const parts = [];
    if (w.keys) {
      const list = (ps) => ps.map((p) => p === '' ? '(every key)' : p + '*').join(', ');
      if (w.keys.write.length) parts.push('writes ' + list(w.keys.write));
      if (w.keys.read.length) parts.push('reads ' + list(w.keys.read));
    }
    if (w.holders) parts.push('as ' + w.holders.names.concat(w.holders.prefixes.map((p) => p + '*')).join(', '));
    return ' · ' + parts.join(' · ');
  }
  // canReleaseHolder: an admin releases any holder; a write token scoped
  // to some holders releases those (POST /v1/holders/:holder/release).
  function canReleaseHolder(h) {
    if (isAdmin()) return true;
    if (st.scope !== 'write' || !st.holders) return false;
    return st.holders.names.includes(h) || st.holders.prefixes.some((p) => h.startsWith(p));
  }

  function setupAuth() {
    $('auth').addEventListener('submit', (e) => {
      e.preventDefault();
      const v = $('token-input').value.trim();
      $('token-input').value = '';
      if (!v) return;
      try { sessionStorage.setItem(TOKEN_KEY, v); } catch (err) { banner('auth', 'This browser refuses sessionStorage; the token cannot be kept.'); }
      restartAll();
    });
    $('token-forget').addEventListener('click', () => {
      try { sessionStorage.removeItem(TOKEN_KEY); } catch (err) { /* nothing kept */ }
      $('token-input').value = '';
      restartAll();
    });
  }

  // ---- cluster ----
  async function refreshCluster() {
    try {
      const { data, res } = await api('GET', '/v1/cluster');
      banner('cluster', null);
      const serverNow = Date.parse(res.headers.get('Date') || '') || Date.now();
      setText('c-leader', data.leader ? data.leader + (data.leader_addr ? ' (' + data.leader_addr + ')' : '') : 'none (no quorum?)');
      $('c-leader').classList.toggle('bad', !data.leader);
      setText('c-term', data.term);
      setText('c-tick', data.tick + ' (every ' + data.tick_period_ms + ' ms)');
      setText('c-index', data.commit_index + ' / ' + data.applied_index);
      setText('c-active', data.active_leases + ' / ' + data.active_sessions);
      // The server this console talks to may be a follower, whose reads
      // the leader answers: ask it for its own view too.
      api('GET', '/v1/cluster?stale=true').then(({ data: local }) => {
        setText('c-node', local.node_id + ' (' + local.state.toLowerCase() + ', applied ' + local.applied_index + ')');
      }, () => setText('c-node', '–'));
      const tb = $('members').tBodies[0];
      tb.textContent = '';
      for (const m of data.members || []) {
        let contact = '–';
        if (m.last_contact) {
          const age = Math.max(0, serverNow - Date.parse(m.last_contact));
          contact = age < 1000 ? '< 1 s ago' : fmtMS(age) + ' ago';
        }
        const actions = el('td', { class: 'actions', 'data-label': '' });
        if (isAdmin() && m.voter && !m.leader && data.leader) {
          actions.append(el('button', { class: 'admin-only', text: 'Make leader', onclick: () => adminAction(
            'Transfer leadership to ' + m.id + '?', 'POST', '/v1/cluster/transfer-leadership', { id: m.id }, 'Leadership transfer') }));
        }
        tb.append(el('tr', { 'data-member': m.id },
          td('Member', m.id),
          td('HTTP', m.http_addr || ''),
          td('Role', (m.leader ? 'leader' : 'follower') + (m.voter ? '' : ' (non-voter)')),
          td('Health', el('span', { class: 'health ' + m.health, text: m.health })),
          td('Last contact', contact),
          td('Gossip', m.gossip),
          actions));
      }
    } catch (err) {
      if (!authProblem(err)) banner('cluster', explain(err, 'Cluster status'));
    }
  }

  // ---- control lease ----
  async function refreshControl() {
    try {
      const { data } = await api('GET', '/v1/control/status');
      banner('control', null);
      st.control = data;
      st.controlDeadline = performance.now() + (data.active ? data.remainingMs : 0);
      setText('ctl-state', data.active ? 'held' : 'free');
      $('ctl-state').className = data.active ? 'held' : '';
      setText('ctl-owner', data.active ? (data.ownerClientName || '(unnamed client)') + (data.ownerInstanceId ? ' · ' + data.ownerInstanceId : '') : '–');
      setText('ctl-lease', data.active ? data.leaseId || '' : '–');
      setText('ctl-ttl', data.ttlMs ? fmtMS(data.ttlMs) + ' / ' + fmtMS(data.heartbeatIntervalMs) : '–');
    } catch (err) {
      st.control = null;
      if (err instanceof APIError && err.status === 404) {
        setText('ctl-state', 'not served by this server');
        banner('control', null);
        return;
      }
      if (!authProblem(err)) banner('control', explain(err, 'Control lease status'));
    }
  }

  // ---- leases and sessions ----
  function filters() {
    return { prefix: $('f-prefix').value, holder: $('f-holder').value, state: $('f-state').value };
  }
  function qs(obj) {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(obj)) if (v !== '' && v !== undefined && v !== null) p.set(k, v);
    const s = p.toString();
    return s ? '?' + s : '';
  }
  const stateOrder = { active: 0, expired: 1, revoked: 2, released: 3 };

  async function refreshLeases() {
    const f = filters();
    try {
      const { data } = await api('GET', '/v1/leases' + qs({ prefix: f.prefix, holder: f.holder, state: f.state, limit: 500 }));
      banner('leases', null);
      const now = performance.now();
      st.leases = (data.leases || []).map((l) => Object.assign(l, { _deadline: now + (l.remaining_ms || 0) }));
      st.leases.sort((a, b) => (stateOrder[a.state] - stateOrder[b.state]) || (a.key < b.key ? -1 : a.key > b.key ? 1 : 0) || (a.fencing_token - b.fencing_token));
      st.leaseNext = data.next || '';
      renderLeases();
    } catch (err) {
      if (!authProblem(err)) banner('leases', explain(err, 'Leases'));
    }
  }
  function renderLeases() {
    const tb = $('lease-table').tBodies[0];
    tb.textContent = '';
    for (const l of st.leases) {
      const actions = el('td', { class: 'actions', 'data-label': '' });
      if (l.state === 'active' && isAdmin()) {
        actions.append(el('button', { class: 'danger', text: 'Revoke', 'data-revoke': l.lease_id, onclick: () => adminAction(
          'Revoke lease ' + l.lease_id + ' on "' + l.key + '" held by "' + l.holder + '"?\nIts holder loses it at once.',
          'POST', '/v1/leases/' + encodeURIComponent(l.lease_id) + '/revoke', { reason: 'revoked from the console' }, 'Revoke') }));
      }
      const remaining = el('span', { class: 'countdown' });
      if (l.state === 'active') remaining.dataset.deadline = String(l._deadline);
      else remaining.textContent = l.end_reason ? 'ended: ' + l.end_reason : '–';
      tb.append(el('tr', { 'data-lease': l.lease_id, 'data-state': l.state, class: 'state-' + l.state },
        td('Key', el('a', { href: '#', class: 'key', text: l.key, title: 'show this key\'s history', onclick: (e) => { e.preventDefault(); showHistory(l.key); } })),
        td('Holder', l.holder),
        td('State', el('span', { class: 'state ' + l.state, text: l.state })),
        td('Fencing token', l.fencing_token, 'num'),
        td('Remaining', remaining, 'num remaining'),
        td('Lease', l.lease_id, 'mono'),
        td('Session', l.session_id || '–', 'mono'),
        actions));
    }
    $('lease-empty').hidden = st.leases.length > 0;
    setText('lease-count', st.leases.length + (st.leaseNext ? '+ (first 500)' : ''));
    tick();
  }

  async function refreshSessions() {
    const f = filters();
    try {
      const { data } = await api('GET', '/v1/sessions' + qs({ holder: f.holder, limit: 500 }));
      banner('sessions', null);
      const now = performance.now();
      st.sessions = (data.sessions || []).map((s) => Object.assign(s, { _deadline: now + (s.remaining_ms || 0) }));
      renderSessions();
    } catch (err) {
      if (!authProblem(err)) banner('sessions', explain(err, 'Sessions'));
    }
  }
  function renderSessions() {
    const byID = new Map(st.leases.map((l) => [l.lease_id, l]));
    const tb = $('session-table').tBodies[0];
    tb.textContent = '';
    for (const s of st.sessions) {
      const leases = el('ul', { class: 'plain' });
      for (const id of s.lease_ids || []) {
        const l = byID.get(id);
        leases.append(el('li', null, l ? l.key + ' ' : '', el('span', { class: 'mono muted', text: id })));
      }
      if (!(s.lease_ids || []).length) leases.append(el('li', { class: 'muted', text: 'none' }));
      const remaining = el('span', { class: 'countdown' });
      if (s.state === 'active') remaining.dataset.deadline = String(s._deadline);
      else remaining.textContent = s.end_reason ? 'ended: ' + s.end_reason : '–';
      const actions = el('td', { class: 'actions', 'data-label': '' });
      if (s.state === 'active' && isAdmin()) {
        actions.append(el('button', { class: 'danger', text: 'End session', onclick: () => adminAction(
          'End session ' + s.session_id + ' of "' + s.holder + '"?\nEvery lease bound to it ends.',
          'DELETE', '/v1/sessions/' + encodeURIComponent(s.session_id), undefined, 'End session') }));
      }
      if (s.state === 'active' && canReleaseHolder(s.holder)) {
        actions.append(el('button', { class: 'danger', text: 'Release holder', 'data-release-holder': s.holder, onclick: () => confirmedAction(
          'End every lease and session of holder "' + s.holder + '"?',
          'POST', '/v1/holders/' + encodeURIComponent(s.holder) + '/release', { reason: 'released from the console' }, 'Release holder') }));
      }
      tb.append(el('tr', { 'data-session': s.session_id, class: 'state-' + s.state },
        td('Session', s.session_id, 'mono'),
        td('Holder', s.holder),
        td('State', el('span', { class: 'state ' + s.state, text: s.state })),
        td('Remaining', remaining, 'num remaining'),
        td('Leases', leases),
        actions));
    }
    $('session-empty').hidden = st.sessions.length > 0;
    setText('session-count', String(st.sessions.length));
    tick();
  }

  // adminAction asks first, then calls the API and refreshes.
  async function adminAction(question, method, path, body, what) {
    if (!isAdmin()) { banner('action', what + ': needs a token with the admin scope.'); return; }
    return confirmedAction(question, method, path, body, what);
  }
  // confirmedAction asks first, then calls the API and refreshes; the
  // server decides whether the token may.
  async function confirmedAction(question, method, path, body, what) {
    if (!window.confirm(question)) return;
    try {
      await api(method, path, body);
      banner('action', null);
    } catch (err) {
      banner('action', explain(err, what));
    }
    scheduleRefresh(0);
  }

  // ---- live countdowns ----
  function tick() {
    const now = performance.now();
    for (const e of document.querySelectorAll('[data-deadline]')) {
      e.textContent = fmtMS(Math.max(0, Number(e.dataset.deadline) - now));
    }
    if (st.control && st.control.active) setText('ctl-remaining', fmtMS(Math.max(0, st.controlDeadline - now)));
    else setText('ctl-remaining', '–');
  }

  // ---- refresh scheduling ----
  async function refreshAll() {
    if (st.refreshing) { st.refreshAgain = true; return; }
    st.refreshing = true;
    try {
      do {
        st.refreshAgain = false;
        await Promise.all([refreshCluster(), refreshControl(), refreshLeases()]);
        await refreshSessions(); // after the leases: it shows their keys
      } while (st.refreshAgain);
    } finally {
      st.refreshing = false;
    }
  }
  // scheduleRefresh reads everything again after delay ms, or sooner if a
  // read is already due sooner: a burst of events cannot keep putting the
  // next read off.
  function scheduleRefresh(delay) {
    const due = performance.now() + delay;
    if (st.refreshTimer && st.refreshDue <= due) return;
    clearTimeout(st.refreshTimer);
    st.refreshDue = due;
    st.refreshTimer = setTimeout(() => {
      st.refreshTimer = 0;
      refreshAll().finally(() => scheduleRefresh(POLL_MS));
    }, delay);
  }

  // ---- Server-Sent Events through fetch (an EventSource cannot send the
  // Authorization header) ----
  function parseBlock(block) {
    const ev = { id: '', event: 'message', data: [] };
    for (const line of block.split(/\r?\n/)) {
      if (line === '' || line.startsWith(':')) continue;
      const i = line.indexOf(':');
      const field = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? '' : line.slice(i + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'id') ev.id = value;
      else if (field === 'event') ev.event = value;
      else if (field === 'data') ev.data.push(value);
    }
    return ev;
  }
  // stream follows /v1/events with the given query until signal aborts,
  // reconnecting after Last-Event-ID. onEvent gets each decoded event.
  async function stream(query, onEvent, onState, signal) {
    let lastID = '';
    let backoff = 500;
    let q = Object.assign({}, query);
    while (!signal.aborted) {
      try {
        const headers = Object.assign({ Accept: 'text/event-stream' }, authHeaders());
        if (lastID) headers['Last-Event-ID'] = lastID;
        const res = await fetch('/v1/events' + qs(q), { headers, signal, cache: 'no-store' });
        if (res.status === 410) {
          // The history no longer reaches back: carry on from now.
          lastID = '';
          q = Object.assign({}, q, { from: 'now' });
          onState('compacted');
          continue;
        }
        if (!res.ok) {
          const err = await readError(res);
          onState('error', err);
          if (err.status === 401 || err.status === 403) return; // a new token restarts the streams
        } else {
          onState('live');
          backoff = 500;
          const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
          let buf = '';
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buf += value;
            let i;
            while ((i = buf.search(/\r?\n\r?\n/)) >= 0) {
              const block = buf.slice(0, i);
              buf = buf.slice(i).replace(/^\r?\n\r?\n/, '');
              const ev = parseBlock(block);
              if (!ev.data.length) continue;
              if (ev.id) lastID = ev.id;
              let data;
              try { data = JSON.parse(ev.data.join('\n')); } catch (e) { continue; }
              if (ev.event === 'stream_error') { onState('error', new APIError(0, data.error && data.error.code, data.error && data.error.message)); continue; }
              onEvent(data);
            }
          }
        }
      } catch (e) {
        if (signal.aborted) return;
      }
      if (signal.aborted) return;
      onState('reconnecting');
      await sleep(backoff, signal);
      backoff = Math.min(backoff * 2, 10000);
    }
  }

  // describe names an event as the timeline shows it: an acquire that took
  // the slot of a lease that ended involuntarily is "stolen".
  function describe(ev) {
    if (ev.type === 'acquired' && ev.previous) return 'stolen';
    return ev.type;
  }
  function eventItem(ev, forTimeline) {
    const l = ev.lease, s = ev.session;
    const kind = describe(ev);
    const parts = [];
    if (l) {
      if (!forTimeline) parts.push(el('span', { class: 'key', text: l.key }));
      parts.push(el('span', { text: l.holder }));
      parts.push(el('span', { class: 'mono muted', text: l.lease_id }));
      parts.push(el('span', { class: 'muted', text: 'token ' + l.fencing_token }));
    } else if (s) {
      parts.push(el('span', { text: s.holder }));
      parts.push(el('span', { class: 'mono muted', text: s.session_id }));
    } else if (ev.key) {
      parts.push(el('span', { class: 'key', text: ev.key }));
    }
    if (ev.previous) parts.push(el('span', { class: 'muted', text: 'from ' + ev.previous }));
    if (ev.reason) parts.push(el('span', { class: 'muted', text: '“' + ev.reason + '”' }));
    return el('li', { class: 'ev ' + kind, 'data-type': kind, 'data-lease': l ? l.lease_id : null, 'data-index': ev.index },
      el('time', { text: fmtTime(ev.time), title: 'raft index ' + ev.index + ', tick ' + ev.tick }),
      el('span', { class: 'type', text: kind.replace(/_/g, ' ') }),
      el('span', { class: 'what' }, ...parts));
  }

  function startFeed() {
    if (st.feedCtl) st.feedCtl.abort();
    const ctl = new AbortController();
    st.feedCtl = ctl;
    const f = filters();
    const pill = $('stream-state');
    stream({ prefix: f.prefix, holder: f.holder }, (ev) => {
      const feed = $('feed');
      feed.prepend(eventItem(ev, false));
      while (feed.children.length > FEED_MAX) feed.lastChild.remove();
      if (ev.lease || ev.session) scheduleRefresh(100);
    }, (state, err) => {
      if (ctl.signal.aborted) return;
      pill.textContent = state === 'error' ? 'stream error' : state;
      pill.className = 'pill ' + state;
      if (state === 'error' && err && !authProblem(err)) banner('feed', explain(err, 'Event stream'));
      else if (state === 'live') banner('feed', null);
      if (state === 'live') scheduleRefresh(0); // catch up on what happened while away
    }, ctl.signal);
  }

  // ---- key history ----
  function showHistory(key) {
    $('h-key').value = key;
    startHistory();
  }
  function startHistory() {
    if (st.historyCtl) st.historyCtl.abort();
    st.historyCtl = null;
    const key = $('h-key').value;
    const tl = $('timeline');
    tl.textContent = '';
    st.historyKey = key;
    if (!key) { setText('history-note', ''); return; }
    const ctl = new AbortController();
    st.historyCtl = ctl;
    setText('history-note', 'Every event the server still keeps for "' + key + '", then live.');
    stream({ key, from: 'start' }, (ev) => {
      if (ev.session && !ev.lease) return;
      tl.append(eventItem(ev, true));
      while (tl.children.length > TIMELINE_MAX) tl.firstChild.remove();
    }, (state, err) => {
      if (ctl.signal.aborted) return;
      if (state === 'compacted') setText('history-note', 'The server no longer keeps the start of this key\'s history; showing from now on.');
      if (state === 'error' && err && !authProblem(err)) setText('history-note', explain(err, 'History'));
    }, ctl.signal);
    $('history').scrollIntoView({ behavior: 'smooth', block: 'nearest' });
  }

  // ---- wiring ----
  function restartAll() {
    $('feed').textContent = '';
    st.banners.clear();
    banner('', null);
    loadWhoami().then(() => {
      startFeed();
      if ($('h-key').value) startHistory();
      scheduleRefresh(0);
    });
  }

  function init() {
    setupAuth();
    let filterTimer = 0;
    const onFilter = () => {
      clearTimeout(filterTimer);
      filterTimer = setTimeout(() => { $('feed').textContent = ''; startFeed(); scheduleRefresh(0); }, 300);
    };
    $('f-prefix').addEventListener('input', onFilter);
    $('f-holder').addEventListener('input', onFilter);
    $('f-state').addEventListener('change', () => scheduleRefresh(0));
    $('filters').addEventListener('submit', (e) => { e.preventDefault(); onFilter(); });
    $('history-form').addEventListener('submit', (e) => { e.preventDefault(); startHistory(); });
    setInterval(tick, 200);
    restartAll();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init);
  else init();
})();

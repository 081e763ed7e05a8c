// The page of `celldialog serve` (docs/web.md): a view of one session's cells, kept in step
// by a snapshot and then patches over Server-Sent Events. Text from the model or the user
// is only ever put in the page as text nodes (textContent), never parsed as HTML.
'use strict';
(() => {
  const ERROR_PREFIX = 'I encountered an error generating a response';
  const CUT = 240; // characters of a tool's arguments or result shown before "…"
  const $ = (id) => document.getElementById(id);
  const ui = {
    app: $('app'), sessions: $('sessions'), newChat: $('new-chat'), pattern: $('pattern'),
    title: $('title'), status: $('status'), banner: $('banner'), log: $('log'),
    empty: $('empty'), messages: $('messages'), live: $('live'), composer: $('composer'),
    alert: $('alert'), input: $('input'), stop: $('stop'), send: $('send'),
    panel: $('panel'), state: $('state'), emptyHint: $('empty-hint'),
  };
  const match = /^\/c\/([^/]+)\/?$/.exec(location.pathname);
  const session = match ? decodeURIComponent(match[1]) : null;
  const base = session ? `/api/sessions/${encodeURIComponent(session)}` : null;

  let S = null; // the snapshot as patched: {cells, streams, chat, state, pattern}
  let shown = 0; // messages rendered into ui.messages
  let results = new Map(); // tool_use id -> the element its result goes in
  let stream = null; // the streaming reply: {el, text (a Text node), thinking}
  let stopped = false; // Stop was clicked: the running reply no longer grows here
  let sending = false;
  let follow = true; // keep the newest message in view (false once the user scrolls up)
  let es = null;
  let wasPending = false;
  let untitled = false; // the session has no title yet: the first message will give it one

  // -- small helpers ------------------------------------------------------------------
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  const cut = (s, n = CUT) => (s.length > n ? s.slice(0, n - 1) + '…' : s);
  const compact = (v) => (typeof v === 'string' ? v : JSON.stringify(v) ?? String(v));
  const name = (part) => (S && S.chat ? S.chat[part] || null : null);
  function cell(part, fallback) {
    const n = name(part) || fallback;
    return n && S && S.cells ? S.cells[n] : undefined;
  }
  const pending = () => Boolean(cell('pending'));
  function words(key) { // a cell's name as a label: "stop_reason", "stopReason" -> "Stop reason"
    const w = String(key).replace(/([a-z0-9])([A-Z])/g, '$1 $2').split(/[\s_.-]+/).filter(Boolean)
      .map((x) => (x.length > 1 && x === x.toUpperCase() ? x : x.toLowerCase())).join(' ');
    return w ? w[0].toUpperCase() + w.slice(1) : String(key);
  }
  function ago(created) { // "just now", "5 min ago", "3 h ago", else the date
    const t = created * (created < 1e12 ? 1000 : 1);
    const s = (Date.now() - t) / 1000;
    if (s < 60) return 'just now';
    if (s < 3600) return `${Math.floor(s / 60)} min ago`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
    return new Date(t).toLocaleDateString();
  }
  const textOf = (blocks) => blocks.filter((b) => b && b.kind === 'text')
    .map((b) => String(b.text ?? '')).join('');

  async function api(method, url, body) {
    const opts = { method, credentials: 'same-origin', headers: { Accept: 'application/json' } };
    if (body !== undefined) {
      opts.headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    let r;
    try { r = await fetch(url, opts); } catch (e) { throw new Error('The server cannot be reached.'); }
    let data = null;
    try { data = await r.json(); } catch (e) { /* not JSON */ }
    if (!r.ok) {
      const why = data && typeof data.error === 'string' ? data.error : `${r.status} ${r.statusText}`;
      const err = new Error(why);
      err.status = r.status;
      throw err;
    }
    return data;
  }
  function showAlert(text) {
    ui.alert.textContent = text || '';
    ui.alert.hidden = !text;
  }
  function showBanner(text, bad) {
    ui.banner.textContent = text || '';
    ui.banner.hidden = !text;
    ui.banner.classList.toggle('bad', Boolean(bad));
  }
  function scrollDown() {
    if (follow) ui.log.scrollTop = ui.log.scrollHeight;
  }

  // -- sessions (the sidebar) -----------------------------------------------------------
  async function loadSessions() {
    let data;
    try { data = await api('GET', '/api/sessions'); } catch (e) { showBanner(e.message, true); return; }
    ui.pattern.textContent = data.pattern ? `Pattern: ${data.pattern}` : '';
    ui.sessions.replaceChildren();
    let current = null;
    for (const s of data.sessions || []) {
      const li = el('li');
      const a = el('a', 'session', s.title || 'Untitled');
      if (!s.title && s.created) a.append(el('span', 'session-time', ` · ${ago(s.created)}`));
      a.href = `/c/${encodeURIComponent(s.id)}`;
      if (s.created) a.title = new Date(s.created * (s.created < 1e12 ? 1000 : 1)).toLocaleString();
      if (s.id === session) { a.setAttribute('aria-current', 'page'); current = s; }
      li.append(a);
      ui.sessions.append(li);
    }
    untitled = Boolean(current && !current.title);
    const title = current ? current.title || 'New conversation' : 'Chat';
    ui.title.textContent = title;
    document.title = `${title} · celldialog`;
  }
  ui.newChat.addEventListener('click', async () => {
    ui.newChat.disabled = true;
    try {
      const { id } = await api('POST', '/api/sessions');
      location.assign(`/c/${encodeURIComponent(id)}`);
    } catch (e) { showAlert(e.message); ui.newChat.disabled = false; }
  });

  // -- messages ---------------------------------------------------------------------------
  function rich(parent, text) {
    // the only formatting: ``` fenced blocks, `inline code` and **bold**, built as nodes
    const parts = text.split('```');
    parts.forEach((part, i) => {
      if (i % 2) {
        const pre = el('pre');
        pre.append(el('code', null, part.replace(/^[\w+.-]*\n/, '').replace(/\n$/, '')));
        parent.append(pre);
        return;
      }
      if (i > 0) part = part.replace(/^\n/, ''); // the fence's own line break
      if (i < parts.length - 1) part = part.replace(/\n$/, '');
      part.split(/(`[^`\n]+`|\*\*[^*\n]+\*\*)/).forEach((s, j) => {
        if (!s) return;
        if (j % 2 === 0) parent.append(document.createTextNode(s));
        else parent.append(s[0] === '`' ? el('code', null, s.slice(1, -1)) : el('strong', null, s.slice(2, -2)));
      });
    });
  }
  function messageEl(role) {
    const m = el('div', `msg ${role}`);
    m.dataset.role = role;
    return m;
  }
  function toolEl(block) {
    const t = el('div', 'tool');
    const head = el('div', 'tool-head');
    head.append(el('span', 'tool-name', block.name || 'tool'));
    const args = compact(block.input ?? {});
    const a = el('code', 'tool-args', cut(args));
    if (args.length > CUT) a.title = args;
    head.append(a);
    const res = el('div', 'tool-result waiting', pending() ? 'Running…' : 'No result');
    t.append(head, res);
    if (block.id) results.set(block.id, res);
    return t;
  }
  function fillResult(target, block) {
    const content = compact(block.content ?? '');
    target.className = `tool-result${block.is_error ? ' failed' : ' ok'}`;
    target.textContent = cut(content);
    if (block.is_error) target.prepend(el('strong', null, 'Error: '));
    if (content.length > CUT) target.title = content;
  }
  function renderMessage(msg) {
    if (!msg || typeof msg !== 'object') return null;
    const blocks = Array.isArray(msg.blocks) ? msg.blocks : [];
    const text = textOf(blocks);
    if (msg.role === 'user') {
      let orphan = null;
      for (const b of blocks) {
        if (!b || b.kind !== 'tool_result') continue;
        const target = results.get(b.tool_use_id);
        if (target) { fillResult(target, b); continue; }
        orphan = orphan || messageEl('assistant');
        const r = el('div', 'tool-result');
        fillResult(r, b);
        orphan.append(r);
      }
      if (!text) return orphan;
      const m = messageEl('user');
      m.append(el('div', 'bubble', text));
      return m;
    }
    const m = messageEl('assistant');
    if (text.startsWith(ERROR_PREFIX)) {
      m.classList.add('error');
      const b = el('div', 'bubble');
      b.append(el('strong', 'error-label', 'Error'), document.createTextNode(' ' +
        text.slice(ERROR_PREFIX.length).replace(/^[:\s]+/, '')));
      m.append(b);
    } else if (text) {
      const b = el('div', 'bubble');
      rich(b, text);
      m.append(b);
    }
    for (const b of blocks) if (b && b.kind === 'tool_use') m.append(toolEl(b));
    return m.childElementCount ? m : null;
  }
  function renderMessages(all) {
    const list = Array.isArray(cell('messages')) ? cell('messages') : [];
    if (all || list.length < shown) {
      ui.messages.replaceChildren();
      results = new Map();
      shown = 0;
    }
    for (; shown < list.length; shown++) {
      const m = renderMessage(list[shown]);
      if (m) ui.messages.append(m);
    }
    ui.empty.hidden = list.length > 0 || pending() || !name('messages');
    ui.emptyHint.hidden = !(S && Array.isArray(S.state) && S.state.length);
  }

  // -- the running reply, errors and notes under the messages -------------------------
  function renderLive() {
    const busy = pending();
    if (busy && !stream) {
      const m = messageEl('assistant');
      m.classList.add('streaming');
      m.dataset.streaming = 'true';
      m.setAttribute('aria-busy', 'true');
      const b = el('div', 'bubble');
      const text = document.createTextNode('');
      const thinking = el('span', 'thinking', 'thinking…');
      b.append(text, thinking);
      m.append(b);
      stream = { el: m, text, thinking };
      stopped = false; // a new turn
      ui.live.prepend(m);
    } else if (!busy && stream) {
      stream.el.remove();
      stream = null;
    }
    if (stream && !stopped) {
      const partial = typeof cell('partial') === 'string' ? cell('partial') : '';
      const now = stream.text.data;
      if (partial.startsWith(now)) stream.text.appendData(partial.slice(now.length));
      else stream.text.data = partial;
      stream.el.classList.toggle('typing', partial.length > 0);
      if (partial) stream.thinking.remove(); else if (!stream.thinking.isConnected) stream.text.after(stream.thinking);
    }
    for (const n of ui.live.querySelectorAll('.note, .error-box')) n.remove();
    const list = cell('messages') || [];
    const last = list.length ? textOf(list[list.length - 1].blocks || []) : '';
    const error = cell('error');
    if (error && !(last.startsWith(ERROR_PREFIX) && last.includes(String(error)))) {
      const e = el('div', 'error-box');
      e.append(el('strong', 'error-label', 'Error'), document.createTextNode(' ' + compact(error)));
      ui.live.append(e);
    }
    if (!busy && stopped) ui.live.append(el('div', 'note', 'Stopped: the reply was cancelled.'));
    if (!busy && cell('stop_reason', 'stop_reason') === 'max_tokens') {
      ui.live.append(el('div', 'note', 'Reply cut short: it reached the model’s max_tokens limit.'));
    }
    if (!busy) for (const r of ui.messages.querySelectorAll('.tool-result.waiting')) r.textContent = 'No result';
  }
  function renderControls() {
    const busy = pending();
    const canChat = Boolean(S && name('send') && name('messages'));
    ui.composer.hidden = Boolean(S) && !canChat;
    if (S && !canChat && !ui.app.classList.contains('no-chat')) { // the state alone, in the middle
      ui.app.classList.add('no-chat');
      ui.messages.before(ui.panel);
    }
    ui.send.disabled = !canChat || busy || sending;
    ui.stop.hidden = !busy || !name('cancel');
    ui.stop.disabled = stopped;
    ui.status.textContent = busy ? (stopped ? 'stopping…' : 'replying…') : '';
    if (wasPending && !busy) loadSessions(); // a finished turn may have titled the session
    wasPending = busy;
  }

  // -- the state panel: each cell under its name in words; a short value beside it --------
  const short = (v) => v === null || v === undefined || typeof v === 'number' ||
    typeof v === 'boolean' || (typeof v === 'string' && v.length <= 40 && !v.includes('\n'));
  function renderValue(v) {
    if (Array.isArray(v)) {
      if (!v.length) return el('span', 'muted', 'Nothing yet');
      const checklist = v.every((x) => x && typeof x === 'object' && typeof x.title === 'string');
      const ul = el('ul', checklist ? 'checklist' : 'list');
      for (const x of v) {
        const li = el('li');
        if (checklist) { // read-only: the page has no generic way to edit a list
          const label = el('label', x.done === true ? 'done' : 'open');
          const box = el('input');
          box.type = 'checkbox';
          box.checked = x.done === true;
          box.disabled = true;
          label.append(box, el('span', 'item-title', x.title));
          li.append(label);
        } else li.append(renderValue(x));
        ul.append(li);
      }
      return ul;
    }
    if (v && typeof v === 'object') {
      const dl = el('dl', 'kv');
      for (const [k, x] of Object.entries(v)) {
        const dd = el('dd');
        dd.append(renderValue(x));
        dl.append(el('dt', null, words(k)), dd);
      }
      return dl;
    }
    if (v === null || v === undefined || v === '') return el('span', 'muted', v === '' ? 'Nothing yet' : '—');
    if (typeof v === 'boolean') return el('span', 'value', v ? 'Yes' : 'No');
    return el('span', 'value', typeof v === 'number' ? v.toLocaleString() : v);
  }
  function renderState(key) {
    const names = (S && Array.isArray(S.state) ? S.state : []);
    ui.panel.hidden = names.length === 0;
    ui.app.classList.toggle('no-state', names.length === 0);
    if (key === undefined) {
      ui.state.replaceChildren();
      for (const n of names) {
        const sec = el('section', 'state-item');
        sec.dataset.name = n;
        sec.append(el('h3', null, words(n)), el('div', 'state-body'));
        ui.state.append(sec);
        renderState(n);
      }
      return;
    }
    const sec = [...ui.state.children].find((s) => s.dataset.name === key);
    if (!sec) return;
    const stream = S.edit && S.edit[key];
    if (stream) { renderEditor(sec, key, stream); return; }
    sec.classList.toggle('stat', short(S.cells[key])); // "Open 1" on one line
    sec.lastChild.replaceChildren(renderValue(S.cells[key]));
  }
  // a text cell the pattern lets the user set (set_<name> taking a string): edited in place
  function renderEditor(sec, key, stream) {
    const value = typeof S.cells[key] === 'string' ? S.cells[key] : '';
    let box = sec.querySelector('textarea');
    if (!box) {
      box = el('textarea', 'editor');
      box.rows = 3;
      box.setAttribute('aria-label', words(key));
      const save = el('button', 'save', 'Save');
      save.type = 'button';
      save.setAttribute('aria-label', `Save ${words(key)}`);
      save.addEventListener('click', async () => {
        save.disabled = true;
        try {
          await api('POST', `${base}/streams/${encodeURIComponent(stream)}`, box.value);
          box.dataset.dirty = '';
        } catch (e) { showAlert(`Not saved: ${e.message}`); } finally { save.disabled = false; }
      });
      box.addEventListener('input', () => { box.dataset.dirty = '1'; });
      const body = el('div', 'state-body editing');
      body.append(box, save);
      sec.lastChild.replaceWith(body);
    }
    if (!box.dataset.dirty) box.value = value; // what the user is typing is not overwritten
  }

  // -- the wire format: snapshot and patches ---------------------------------------
  const pointer = (path) => path.split('/').slice(1).map((k) => k.replace(/~1/g, '/').replace(/~0/g, '~'));
  function applyOp(op) {
    const keys = pointer(op.path);
    if (!keys.length) { S.cells = op.value; return; }
    let parent = S.cells;
    for (const k of keys.slice(0, -1)) parent = parent[Array.isArray(parent) ? Number(k) : k];
    const last = keys[keys.length - 1];
    const at = Array.isArray(parent) && last !== '-' ? Number(last) : last;
    if (op.op === 'replace') parent[at] = op.value;
    else if (op.op === 'add') {
      if (Array.isArray(parent)) {
        if (last === '-') parent.push(op.value); else parent.splice(at, 0, op.value);
      } else parent[at] = op.value;
    } else if (op.op === 'append') parent[at] = (typeof parent[at] === 'string' ? parent[at] : '') + op.value;
    else if (op.op === 'remove') {
      if (Array.isArray(parent)) parent.splice(at, 1); else delete parent[at];
    } else throw new Error(`unknown patch op ${op.op}`);
  }
  function onPatch(ops) {
    const touched = new Set();
    let rebuild = false;
    for (const op of ops) {
      applyOp(op);
      const keys = pointer(op.path);
      touched.add(keys[0]);
      const push = op.op === 'add' && keys.length === 2 && keys[1] === '-';
      if (!keys.length || (keys[0] === name('messages') && !push)) rebuild = true;
    }
    if (rebuild) { renderMessages(true); renderState(); } else {
      if (touched.has(name('messages'))) renderMessages(false);
      for (const k of touched) if (S.state && S.state.includes(k)) renderState(k);
    }
    renderLive();
    renderControls();
    scrollDown();
  }
  function onSnapshot(snap) {
    S = snap;
    S.cells = S.cells || {};
    showBanner('');
    if (!pending()) stopped = false;
    if (stream) { stream.el.remove(); stream = null; }
    renderMessages(true);
    renderState();
    renderLive();
    renderControls();
    follow = true;
    scrollDown();
  }

  function connect() {
    es = new EventSource(`${base}/events`);
    es.addEventListener('snapshot', (ev) => onSnapshot(JSON.parse(ev.data)));
    es.addEventListener('patch', (ev) => {
      if (!S) return;
      try { onPatch(JSON.parse(ev.data)); } catch (e) {
        console.warn('celldialog: a patch did not apply; starting again from a snapshot', e);
        es.close();
        connect();
      }
    });
    es.addEventListener('error', () => {
      if (es.readyState === EventSource.CLOSED) { es.close(); diagnose(); } else showBanner('Connection lost — reconnecting…');
    });
  }
  async function diagnose() {
    // the EventSource gave up (an error status): ask again to read the server's reason
    showBanner('Connection lost — reconnecting…');
    const ctl = new AbortController();
    let wait = 3;
    try {
      const r = await fetch(`${base}/events`, { credentials: 'same-origin', signal: ctl.signal });
      if (r.ok) ctl.abort();
      else {
        let why = `${r.status} ${r.statusText}`;
        try { why = (await r.json()).error || why; } catch (e) { /* not JSON */ }
        if ([401, 403, 404].includes(r.status)) { showBanner(why, true); ui.composer.hidden = true; return; }
        wait = Number(r.headers.get('Retry-After')) || 5;
        showBanner(`${why} — retrying in ${wait} s`, true);
      }
    } catch (e) { /* unreachable: try again */ }
    setTimeout(connect, wait * 1000);
  }

  // -- sending and stopping ---------------------------------------------------------------
  async function send() {
    const text = ui.input.value;
    if (!text.trim() || !S || sending || pending() || !name('send')) return;
    sending = true;
    stopped = false;
    renderControls();
    try {
      const answer = await api('POST', `${base}/streams/${encodeURIComponent(name('send'))}`, text);
      if (answer && answer.dropped) throw new Error('a reply is still running in this session');
      ui.input.value = '';
      showAlert('');
      if (untitled) loadSessions(); // the first message names it
      follow = true;
      renderLive();
    } catch (e) { showAlert(`Not sent: ${e.message}`); }
    sending = false;
    renderControls();
    scrollDown();
  }
  ui.composer.addEventListener('submit', (ev) => { ev.preventDefault(); send(); });
  ui.input.addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); send(); }
  });
  ui.stop.addEventListener('click', async () => {
    stopped = true; // at once: nothing more of the reply shows here
    if (stream) { stream.el.classList.add('stopped'); stream.thinking.remove(); }
    renderControls();
    try { await api('POST', `${base}/streams/${encodeURIComponent(name('cancel'))}`, null); } catch (e) {
      stopped = false; // the reply goes on: show it again, and Stop again
      if (stream) stream.el.classList.remove('stopped');
      renderLive();
      renderControls();
      showAlert(`Not stopped: ${e.message}`);
    }
  });
  new ResizeObserver(scrollDown).observe(ui.log); // the sidebar or composer grew: stay at the end
  ui.log.addEventListener('scroll', () => {
    follow = ui.log.scrollHeight - ui.log.scrollTop - ui.log.clientHeight < 48;
  });

  if (matchMedia('(max-width: 860px)').matches) $('panel-details').open = false;
  loadSessions();
  if (base) connect();
  else {
    ui.composer.hidden = true;
    showBanner('No conversation in this address: pick one, or start a new chat.', true);
  }
})();

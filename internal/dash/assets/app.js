// dlock dash: polls /api/state every 500 ms and /api/timeline every second,
// and draws them. Every value from the server is set with textContent, never
// as HTML: names and owner strings come from whoever took a lock.
'use strict';
(function () {
  const $ = (id) => document.getElementById(id);
  const colors = { grant: '#2e9d4c', release: '#3b6fd1', loss: '#d13b3b', held: '#444444', queued: '#e08a00' };
  // selected is the name of the lock whose detail is shown; #lock=NAME in
  // the address selects one, so that a lock's detail can be linked to.
  let selected = null;
  const fromHash = () => {
    const h = location.hash.startsWith('#lock=') ? location.hash.slice(6) : '';
    try { selected = h ? decodeURIComponent(h) : null; } catch (e) { selected = null; }
  };
  // token is the force-release secret dlock dash --allow-release printed,
  // given in the address as #token=TOKEN (when the page loads, or later in
  // the same tab); kept in memory only, and taken out of the address.
  let token = null;
  const takeToken = () => {
    if (!location.hash.startsWith('#token=')) return false;
    try { token = decodeURIComponent(location.hash.slice(7)); } catch (e) { token = null; }
    history.replaceState(null, '', location.pathname);
    return true;
  };
  takeToken();
  fromHash();
  window.addEventListener('hashchange', () => { if (!takeToken()) fromHash(); if (state) render(); });
  let state = null;
  // resultFor is the lock whose detail shows the last release's answer.
  let resultFor = null;

  function cell(tr, text) {
    const td = document.createElement('td');
    td.textContent = text === undefined || text === null ? '-' : String(text);
    tr.appendChild(td);
    return td;
  }

  function dur(ms) {
    if (ms === null || ms === undefined) return '-';
    ms = Math.max(ms, 0);
    if (ms < 1000) return ms + 'ms';
    if (ms < 60000) return (Math.floor(ms / 100) / 10).toFixed(1) + 's';
    const s = Math.floor(ms / 1000);
    if (s < 3600) return Math.floor(s / 60) + 'm' + String(s % 60).padStart(2, '0') + 's';
    return Math.floor(s / 3600) + 'h' + String(Math.floor(s % 3600 / 60)).padStart(2, '0') + 'm';
  }

  function holds(l) {
    if (l.kind === 'permits') return l.holds + '/' + l.limit;
    return String(l.holds);
  }

  function holder(l) {
    if (l.kind === 'exclusive') return l.owner || '-';
    const more = l.shared.length - 1;
    return l.shared[0].owner + (more > 0 ? ' (+' + more + ' more)' : '');
  }

  function waiters(l) {
    const parts = [];
    if (l.queued > 0) parts.push(l.queued + ' queued');
    if (l.writer_waiting) parts.push('writer');
    return parts.length ? parts.join(', ') : '-';
  }

  function expires(l) {
    return (l.delayed ? 'expired, free in ' : '') + dur(l.expires_in_ms);
  }

  function render() {
    $('store').textContent = state.store;
    const status = $('status');
    if (state.error) {
      status.textContent = 'store error: ' + state.error + ' (showing the last good sample)';
      status.className = 'error';
    } else {
      status.textContent = state.sampled_at ? 'sampled ' + state.sampled_at.slice(11, 23) + ' UTC every ' + state.interval_ms + 'ms' +
        (state.notifications ? ' and at each release the store announces' : '') : 'first sample...';
      status.className = '';
    }
    const t = state.totals, c = state.counts;
    $('t-locks').textContent = t.locks;
    $('t-exclusive').textContent = t.exclusive;
    $('t-shared').textContent = t.shared;
    $('t-queued').textContent = t.queued;
    $('t-grants').textContent = c.grants;
    $('t-releases').textContent = c.releases;
    $('t-losses').textContent = c.losses;

    const locks = state.locks.slice().sort((a, b) => (b.held_for_ms || 0) - (a.held_for_ms || 0) || (a.name < b.name ? -1 : 1));
    const body = document.createElement('tbody');
    for (const l of locks) {
      const tr = document.createElement('tr');
      tr.dataset.name = l.name; // dataset values are attributes: text, never markup
      if (l.delayed) tr.className = 'delayed';
      if (l.name === selected) tr.classList.add('selected');
      cell(tr, l.name);
      cell(tr, l.kind);
      cell(tr, holds(l));
      cell(tr, holder(l));
      cell(tr, dur(l.held_for_ms));
      cell(tr, expires(l));
      cell(tr, waiters(l)).className = 'waiters';
      tr.addEventListener('click', () => { selected = l.name; history.replaceState(null, '', '#lock=' + encodeURIComponent(l.name)); render(); });
      body.appendChild(tr);
    }
    $('locks').replaceChild(body, $('locks').tBodies[0]);
    $('empty').hidden = locks.length > 0;
    detail(locks.find((l) => l.name === selected));
  }

  function detail(l) {
    const box = $('detail');
    if (!l) { box.hidden = true; return; }
    box.hidden = false;
    $('d-name').textContent = l.name;
    const dl = $('d-fields');
    dl.replaceChildren();
    const field = (k, v) => {
      const dt = document.createElement('dt'); dt.textContent = k;
      const dd = document.createElement('dd'); dd.textContent = String(v);
      dl.append(dt, dd);
    };
    field('kind', l.kind);
    if (l.kind === 'exclusive') {
      field('owner', l.owner || '-');
      field('fence', l.fence);
      field('hold count', l.holds);
      field('held for', dur(l.held_for_ms));
    } else if (l.kind === 'permits') {
      field('permits in use', l.holds + ' of ' + l.limit);
    } else {
      field('readers', l.holds);
    }
    field('expires in', expires(l));
    field('queued waiters', l.queued);
    field('writer waiting', l.writer_waiting ? 'yes' : 'no');
    const table = $('d-shared');
    table.hidden = l.shared.length === 0;
    $('d-who').textContent = l.kind === 'permits' ? 'permit holder' : 'reader';
    const body = document.createElement('tbody');
    for (const h of l.shared) {
      const tr = document.createElement('tr');
      cell(tr, h.owner); cell(tr, h.fence); cell(tr, dur(h.held_for_ms)); cell(tr, dur(h.expires_in_ms));
      body.appendChild(tr);
    }
    table.replaceChild(body, table.tBodies[0]);
    // The button breaks the grant shown (its fence) and no other: an
    // exclusive holder outside its lock-delay. Shared holds have no single
    // grant, and a lock-delay is its holder's wish: no button for them.
    const act = $('d-release'), note = $('d-release-note');
    const offered = !!(state.release && token);
    const breakable = l.kind === 'exclusive' && !!l.fence_dec && !l.delayed;
    act.hidden = !(offered && breakable);
    act.onclick = () => forceRelease(l);
    note.hidden = !offered || breakable;
    note.textContent = l.kind !== 'exclusive' ? 'shared holds have no single grant to break: the button is for exclusive holds (dlock release --force breaks them all)'
      : l.delayed ? 'in its lock-delay: the button does not break it (dlock release --force does)'
        : 'no fence known: the button breaks a grant named by its fence only';
    if (resultFor !== l.name) { $('d-release-result').textContent = ''; resultFor = l.name; }
  }

  // forceRelease asks the server to break l's grant as shown (its fence),
  // after the user confirms; if the lock changed hands since, the server
  // breaks nothing and says so.
  function forceRelease(l) {
    if (!window.confirm('Force release ' + l.name + ' from its holder ' + (l.owner || '-') + ' (fence ' + l.fence_dec + ')? ' +
      'That holder goes on working, unaware, until its next renewal fails. If the lock changed hands since, nothing is released.')) return;
    const out = $('d-release-result');
    out.textContent = '...';
    fetch('/api/release', {
      method: 'POST',
      headers: { 'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json' },
      body: JSON.stringify({ key_hex: l.key_hex, fence: l.fence_dec }),
    }).then((r) => r.ok ? r.json().then((j) => { out.textContent = j.released ? 'released' : 'not released: nobody holds it any more'; })
      : r.text().then((t) => { out.textContent = (r.status === 409 ? '' : 'refused: ') + t.trim(); }))
      .catch((e) => { out.textContent = 'failed: ' + e; });
  }

  // draw plots the timeline: per second, stacked bars of grants, releases
  // and losses (left scale), and lines of locks held and queued waiters
  // (right scale).
  function draw(buckets) {
    const cv = $('timeline');
    const ctx = cv.getContext('2d');
    const W = cv.width, H = cv.height, left = 40, right = 40, top = 10, bottom = 24;
    const pw = W - left - right, ph = H - top - bottom;
    const span = 300;
    ctx.clearRect(0, 0, W, H);
    const end = buckets.length ? buckets[buckets.length - 1].t : Math.floor(Date.now() / 1000);
    let maxEv = 1, maxLevel = 1;
    for (const b of buckets) {
      maxEv = Math.max(maxEv, b.grants + b.releases + b.losses);
      maxLevel = Math.max(maxLevel, b.held, b.queued);
    }
    ctx.strokeStyle = '#ccc'; ctx.fillStyle = '#666'; ctx.font = '11px sans-serif'; ctx.lineWidth = 1;
    ctx.strokeRect(left + 0.5, top + 0.5, pw, ph);
    for (let m = 0; m <= 5; m++) {
      const x = left + Math.round(pw * (1 - m * 60 / span));
      ctx.fillText(m === 0 ? 'now' : '-' + m + 'm', x - 10, H - 8);
    }
    ctx.fillText(String(maxEv), 4, top + 10);
    ctx.fillText('0', 4, top + ph);
    ctx.fillText(String(maxLevel), W - right + 4, top + 10);
    const bw = Math.max(1, Math.floor(pw / span));
    const xOf = (t) => left + Math.round(pw * (1 - (end - t + 1) / span));
    const yEv = (n) => Math.round(ph * n / maxEv);
    for (const b of buckets) {
      if (end - b.t >= span) continue;
      const x = xOf(b.t);
      let y = top + ph;
      for (const [n, color] of [[b.grants, colors.grant], [b.releases, colors.release], [b.losses, colors.loss]]) {
        if (n <= 0) continue;
        const h = Math.max(1, yEv(n));
        ctx.fillStyle = color;
        ctx.fillRect(x, y - h, bw, h);
        y -= h;
      }
    }
    for (const [key, color] of [['held', colors.held], ['queued', colors.queued]]) {
      ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
      let started = false;
      for (const b of buckets) {
        if (end - b.t >= span) continue;
        const x = xOf(b.t) + bw / 2, y = top + ph - Math.round(ph * b[key] / maxLevel);
        if (started) ctx.lineTo(x, y); else { ctx.moveTo(x, y); started = true; }
      }
      ctx.stroke();
    }
  }

  async function pollState() {
    try {
      const r = await fetch('api/state', { cache: 'no-store' });
      if (!r.ok) throw new Error('HTTP ' + r.status);
      state = await r.json();
      render();
    } catch (e) {
      $('status').textContent = 'dlock dash unreachable: ' + e.message;
      $('status').className = 'error';
    } finally {
      setTimeout(pollState, 500);
    }
  }

  async function pollTimeline() {
    try {
      const r = await fetch('api/timeline', { cache: 'no-store' });
      if (r.ok) draw(await r.json());
    } catch (e) {
      // pollState reports the dashboard unreachable
    } finally {
      setTimeout(pollTimeline, 1000);
    }
  }

  pollState();
  pollTimeline();
})();

// Live updates: the page lists the topics it shows (main[data-live]); the
// server sends an event when one of them changed, and the page fetches its
// main part again (?fragment=1), rendered by the server like the rest. The
// page works without this script: it is only a reload of that part.
(function () {
  'use strict';
  var main = document.getElementById('main');
  var badge = document.getElementById('livebadge');
  if (!main || !main.dataset.live || !window.EventSource || !window.fetch) return;
  var busy = false, again = false, count = 0;

  function typing() {
    var a = document.activeElement;
    return a && main.contains(a) && /^(INPUT|TEXTAREA|SELECT)$/.test(a.tagName) && a.type !== 'submit';
  }

  function refresh() {
    if (busy || typing()) { again = true; return; }
    busy = true;
    var u = new URL(window.location.href);
    u.searchParams.set('fragment', '1');
    fetch(u.toString(), { credentials: 'same-origin', headers: { 'Accept': 'text/html' } })
      .then(function (r) { if (!r.ok) throw new Error('status ' + r.status); return r.text(); })
      .then(function (html) {
        if (typing()) { again = true; return; }
        main.innerHTML = html;
        count++;
        main.dataset.refreshed = String(count);
      })
      .catch(function () { again = true; })
      .then(function () {
        busy = false;
        if (again) { again = false; setTimeout(refresh, 1000); }
      });
  }

  main.addEventListener('focusout', function () { if (again) { again = false; setTimeout(refresh, 300); } });
  var es = new EventSource('/live?topics=' + encodeURIComponent(main.dataset.live));
  // On every (re)connection, refresh once: what changed between the page's
  // rendering (or the lost connection) and now reached no one.
  es.addEventListener('hello', function () {
    if (badge) { badge.hidden = false; badge.textContent = 'live'; badge.className = 'livebadge'; }
    main.dataset.live_connected = 'yes';
    refresh();
  });
  es.addEventListener('refresh', refresh);
  es.onerror = function () {
    if (badge) { badge.textContent = 'reconnecting'; badge.className = 'livebadge off'; }
  };
})();

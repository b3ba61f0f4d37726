// The Kanal console's only script: live regions. An element with data-refresh="<url>" and
// data-every="<seconds>" has its content replaced by that URL's HTML fragment (rendered and
// escaped on the server) every so often, while the page is visible. Pages work without it.
"use strict";
(function () {
  function refresh(element) {
    if (document.hidden) return;
    fetch(element.dataset.refresh, { credentials: "same-origin", headers: { "X-Console-Fragment": "1" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").body;
        element.replaceChildren.apply(element, Array.from(fresh.childNodes));
        element.dataset.refreshed = String(Date.now());
      })
      .catch(function () { /* the next round tries again */ });
  }
  document.querySelectorAll("[data-refresh]").forEach(function (element) {
    var seconds = Number(element.dataset.every || "5");
    setInterval(function () { refresh(element); }, Math.max(1, seconds) * 1000);
  });
})();

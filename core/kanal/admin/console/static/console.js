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
  // A form with data-live="<url>" and data-live-target="<selector>": as the user types, the form
  // is posted there (with a "fragment" field) and the target shows the answer (a preview).
  function live(form) {
    var target = document.querySelector(form.dataset.liveTarget);
    var timer = null;
    form.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () {
        var data = new FormData(form);
        data.set("fragment", "1");
        fetch(form.dataset.live, { method: "POST", body: data, credentials: "same-origin" })
          .then(function (response) { return response.ok ? response.text() : null; })
          .then(function (html) {
            if (html === null || target === null) return;
            var fresh = new DOMParser().parseFromString(html, "text/html").body;
            target.replaceChildren.apply(target, Array.from(fresh.childNodes));
            target.dataset.refreshed = String(Date.now());
          })
          .catch(function () { /* the Preview button still works */ });
      }, 400);
    });
  }
  document.querySelectorAll("form[data-live]").forEach(live);
  document.querySelectorAll("[data-refresh]").forEach(function (element) {
    var seconds = Number(element.dataset.every || "5");
    setInterval(function () { refresh(element); }, Math.max(1, seconds) * 1000);
  });
})();

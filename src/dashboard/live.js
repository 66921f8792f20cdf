// ringwork dashboard: live pages. Every few seconds the page's own URL is read again and its
// <main> replaced by the new one, so counts, lists and a job's state update without a reload.
// The pages work without this script; the Content-Security-Policy allows only this file (no inline
// script, no eval), and the new <main> is the server's escaped HTML, parsed, never executed.
// Updates pause while the operator is busy on the page (typing in a field, a box ticked), while
// the tab is hidden, and whenever they press "pause" (remembered in this browser).
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  var control = document.getElementById("live");
  if (!main || !control) {
    return;
  }
  var every = Math.max(1, parseInt(main.getAttribute("data-live"), 10) || 5) * 1000;
  var button = control.querySelector("button");
  var status = control.querySelector("span");
  var stopped = false;

  function paused() {
    return window.localStorage.getItem("ringwork-live") === "paused";
  }

  function show(text) {
    status.textContent = text;
    button.textContent = paused() ? "resume" : "pause";
  }

  // the operator is in the middle of something on the page: never replace it under them
  function busy() {
    var active = document.activeElement;
    if (active && main.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) {
      return true;
    }
    return main.querySelector("input[type=checkbox]:checked") !== null;
  }

  function refresh() {
    return fetch(window.location.href, {
      credentials: "same-origin",
      headers: { Accept: "text/html" },
      cache: "no-store"
    }).then(function (response) {
      if (!response.ok || response.redirected) {
        // signed out, refused or failing: say so and stop rather than show another page here
        stopped = true;
        show("live updates stopped (" + response.status + "): reload the page");
        return;
      }
      return response.text().then(function (html) {
        var next = new DOMParser().parseFromString(html, "text/html").querySelector("main[data-live]");
        if (!next) {
          return;
        }
        if (busy() || paused()) {
          return;
        }
        main.replaceWith(document.importNode(next, true));
        main = document.querySelector("main[data-live]");
        show("live · updated " + new Date().toLocaleTimeString());
        document.dispatchEvent(new CustomEvent("ringwork:updated"));
      });
    }).catch(function () {
      show("live · the server did not answer; trying again");
    });
  }

  function tick() {
    if (stopped || paused() || busy() || document.visibilityState !== "visible") {
      return Promise.resolve();
    }
    return refresh();
  }

  button.addEventListener("click", function () {
    if (paused()) {
      window.localStorage.removeItem("ringwork-live");
      show("live");
      tick();
    } else {
      window.localStorage.setItem("ringwork-live", "paused");
      show("paused");
    }
  });
  control.hidden = false;
  show(paused() ? "paused" : "live");
  // for the browser tests: one tick now, as the timer would make it
  window.ringworkLive = { tick: tick };
  window.setInterval(tick, every);
})();

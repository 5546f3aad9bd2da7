// shardctl dashboard: the live parts of pages (see service/api/ui/live.py for the message contract).
// An element with data-live="<url>" gets an EventSource; each `html` message swaps server-rendered
// HTML into the element it names; `end` closes the stream; `signed-out` reloads (to the sign-in page).
(function () {
  "use strict";
  function place(msg) {
    var target = document.getElementById(msg.target);
    if (!target) return;
    if (msg.swap === "inner") target.innerHTML = msg.html;
    else if (msg.swap === "append") target.insertAdjacentHTML("beforeend", msg.html);
    else if (msg.swap === "prepend") target.insertAdjacentHTML("afterbegin", msg.html);
    else target.outerHTML = msg.html;
    if (msg.swap === "append" && target.dataset.follow !== undefined) target.scrollTop = target.scrollHeight;
    if (window.htmx) window.htmx.process(document.getElementById(msg.target) || document.body);
  }
  function open(el) {
    if (el.dataset.liveOpen) return;
    el.dataset.liveOpen = "1";
    var source = new EventSource(el.dataset.live);
    source.addEventListener("html", function (e) { place(JSON.parse(e.data)); });
    source.addEventListener("end", function () { source.close(); el.dataset.liveState = "ended"; });
    source.addEventListener("signed-out", function () { source.close(); window.location.reload(); });
    source.addEventListener("open", function () { el.dataset.liveState = "open"; });
    el.liveSource = source;
  }
  function scan(root) {
    (root.querySelectorAll ? root : document).querySelectorAll("[data-live]").forEach(open);
  }
  document.addEventListener("DOMContentLoaded", function () { scan(document); });
  document.addEventListener("htmx:afterSettle", function (e) { scan(e.target); });
  document.addEventListener("htmx:beforeSwap", function (e) {
    // streams inside content that htmx replaces are closed with it
    var old = e.detail.target;
    if (old && old.querySelectorAll) old.querySelectorAll("[data-live]").forEach(function (el) {
      if (el.liveSource) el.liveSource.close();
    });
  });
})();

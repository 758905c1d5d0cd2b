"""The head's page: its inline CSS and JavaScript, and the Content-Security-Policy that
allows exactly them (by hash) and nothing from anywhere but the head.

Python strings, not files beside the module: the single-file build packs ``.py`` files only.
"""

import base64
import hashlib

CSS = """
:root{--b0:#2f6db5;--b1:#5c93d6;--b2:#1f4f8a;--b3:#7fb0e8;--h:#2a9d8f;--s:#8e5bb5;--u:#d9822b;--lane:#e6e8eb;
--bad:#c0392b;--warn:#b7791f;--ink:#1d2733;--dim:#5d6b7a}
*{box-sizing:border-box}
body{margin:0;font:13px/1.35 system-ui,sans-serif;color:var(--ink);background:#f6f7f9}
header{display:flex;gap:1em;align-items:baseline;padding:6px 12px;background:#1d2733;color:#fff}
header h1{font-size:15px;margin:0}header .where{color:#c9d3dd}#age{margin-left:auto;color:#c9d3dd}
main{padding:8px 12px}body.old main{opacity:.55}
.banner{padding:6px 10px;margin:4px 0;border-left:4px solid var(--bad);background:#fdecea}
.note{color:var(--dim);margin:2px 0}
.totals{display:flex;flex-wrap:wrap;gap:8px;margin:6px 0}
.tile{background:#fff;border:1px solid #d5dae0;border-radius:4px;padding:3px 8px;font-size:12px}
.tile b{display:block;font-size:15px}.tile span{color:var(--dim);font-size:11px}
.line{font-family:ui-monospace,monospace;white-space:pre-wrap;margin:4px 0}
h2{font-size:14px;margin:10px 0 4px}
details.node{background:#fff;border:1px solid #d5dae0;border-radius:4px;margin:4px 0;padding:2px 8px}
details.node>summary{cursor:pointer;font-family:ui-monospace,monospace;white-space:pre-wrap}
details.node.marked{border-left:4px solid var(--warn)}
.gpus{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:2px 8px;margin:2px 0 4px}
.gpus.few{grid-template-columns:repeat(auto-fit,minmax(320px,1fr));gap:4px 16px}
.gpus.few .gpu{display:flex;flex-wrap:wrap;align-items:baseline;column-gap:16px}
.gpus.few svg.bar{order:1;flex-basis:100%}
.gpu{padding:1px 3px}.gpu.marked{background:#fff3d6}
.gpu .t{font-size:12px}
.gpu .n{font-size:10.5px;color:var(--dim);font-variant-numeric:tabular-nums;white-space:nowrap;
overflow:hidden;text-overflow:ellipsis}
.gpu .n span{color:var(--ink)}.gpu .n span.free{color:var(--dim)}.gpus:not(.few) .n span.free{display:none}
.gpus.few .gpu .n{font-size:11.5px}
.gpus.apps{grid-template-columns:repeat(auto-fill,minmax(340px,1fr));gap:4px 16px}
.gpus.apps .gpu .n{white-space:normal}
svg.bar{display:block;width:100%;height:22px}
.gpus.few svg.bar{height:30px}
.lane{fill:var(--lane)}.seg{stroke:#fff;stroke-width:.3}
.s0{fill:var(--b0)}.s1{fill:var(--b1)}.s2{fill:var(--b2)}.s3{fill:var(--b3)}.f0{fill:var(--h)}.f1{fill:#5cc2b5}
.handles{fill:var(--h)}.suggest{fill:var(--s)}.used{fill:var(--u)}.old{fill:#a9b1ba}.untrusted{fill:url(#hatch)}
.mark{font:11px system-ui,sans-serif;padding:0 4px;border-radius:3px;background:var(--warn);color:#fff;
white-space:nowrap}
.mark.unhealthy,.mark.unmeasured,.mark.full{background:var(--bad)}
.mark.unreliable{background:#6b4fa0}
.labels{font-size:11px;opacity:.75}.who{font-size:12px;color:var(--dim)}.actors{color:var(--dim)}
ul.cpu{list-style:none;padding:0;margin:0;font-family:ui-monospace,monospace}
nav.pages a{margin-right:6px}nav.pages a.here{font-weight:bold;text-decoration:none;color:var(--ink)}
.legend{display:flex;flex-wrap:wrap;gap:2px 14px;color:var(--dim);font-size:12px;margin:6px 0}
.legend span{display:inline-flex;align-items:center;white-space:nowrap}
.key{flex:none;display:inline-block;width:10px;height:10px;margin-right:4px}
.kb{background:var(--b0)}.kh{background:var(--h)}.ks{background:var(--s)}.ku{background:var(--u)}.kf{background:var(--lane)}
.pending li{margin:2px 0}.pending .why{color:var(--dim)}
form.login{max-width:420px;margin:60px auto;background:#fff;padding:16px;border:1px solid #d5dae0}
form.login input[type=password]{width:100%;padding:4px;margin:6px 0}
""".strip()

JS = """
(function () {
  var KEY = "rayscope_session", HEADER = "X-Rayscope-Session";
  var given = document.getElementById("session");
  if (given) {  /* a login's answer: the session stays in this tab, for this origin only */
    sessionStorage.setItem(KEY, given.dataset.value);
    location.replace("/");
    return;
  }
  var view = document.getElementById("view"), age = document.getElementById("age");
  var form = view.querySelector("form.login");
  var every = 1000 * Number(view.dataset.refresh), last = Date.now(), failed = "", tried = false;
  function get(fragment) {
    var url = new URL(location.href), headers = {}, session = sessionStorage.getItem(KEY);
    if (fragment) { url.searchParams.set("fragment", "1"); } else { url.searchParams.delete("fragment"); }
    if (session) { headers[HEADER] = session; }
    return fetch(url, {headers: headers, credentials: "same-origin", cache: "no-store"}).then(function (r) {
      if (r.status === 401) { sessionStorage.removeItem(KEY); }
      if (!r.ok) { throw new Error("HTTP " + r.status + (r.status === 401 ? ", reload to log in" : "")); }
      return r.text();
    });
  }
  function tick() {
    if (!tried) { return; }
    var s = Math.round((Date.now() - last) / 1000);
    age.textContent = failed ? "refresh failed (" + failed + "): view " + s + " s old"
                             : "updated " + s + " s ago";
    document.body.classList.toggle("old", Date.now() - last > 3 * every);
  }
  function refresh() {
    var shut = Array.prototype.map.call(view.querySelectorAll("details.node:not([open])"),
                                        function (d) { return d.id; });
    get(true).then(function (text) {
      view.innerHTML = text;
      shut.forEach(function (id) { var d = document.getElementById(id); if (d) { d.open = false; } });
      last = Date.now(); failed = "";
    }).catch(function (err) { failed = err.message; }).finally(function () {
      tried = true; tick(); setTimeout(refresh, every);
    });
  }
  function start() {
    setInterval(tick, 1000);
    setTimeout(refresh, every);
  }
  if (!form) { start(); return; }
  if (!sessionStorage.getItem(KEY) || location.pathname !== "/") { return; }
  form.hidden = true;  /* the login form in a tab that holds a session: the page, read with it */
  get(false).then(function (text) {
    var page = new DOMParser().parseFromString(text, "text/html"), main = page.getElementById("view");
    document.title = page.title;
    document.querySelector("header").innerHTML = page.querySelector("header").innerHTML;
    age = document.getElementById("age");
    every = 1000 * Number(main.dataset.refresh);
    view.innerHTML = main.innerHTML;
    last = Date.now();
    start();
  }).catch(function (err) {
    var said = document.createElement("p");
    said.className = "banner";
    said.textContent = "session not taken (" + err.message + "): log in again";
    form.insertBefore(said, form.querySelector("label"));
    form.hidden = false;
  });
})();
""".strip()

HATCH = (
    '<svg width="0" height="0" aria-hidden="true"><defs><pattern id="hatch" width="2" height="2"'
    ' patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="1" height="2"'
    ' fill="#6b4fa0"/></pattern></defs></svg>'
)
"""The fill of NVML's used memory where rayscope does not trust it (``.untrusted``)."""


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


CSP = "; ".join(
    (
        "default-src 'none'",
        f"style-src {_hash(CSS)}",
        f"script-src {_hash(JS)}",
        "connect-src 'self'",
        "img-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    )
)
"""The page's policy: its own CSS and script (by hash), requests to the head only, never framed."""

PAGE_HEADERS = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),  # no-referrer would send Origin: null on the login
    ("Cache-Control", "no-store"),
)
"""Headers of every HTML answer (the page, its refresh, the login form)."""

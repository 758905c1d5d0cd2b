"""The head's page read back: its GPU cells' fields from the HTML, and the scripts a live test
evaluates in the browser (the node badges, the layout at the window's width)."""

from html.parser import HTMLParser
from typing import Optional


class Cells(HTMLParser):
    """Per GPU cell (``data-gpu``): the text of its ``booked``, ``fraction``, ``measured``
    spans, its marks, and every hover title inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[str, dict[str, list[str]]] = {}
        self._cell: Optional[str] = None
        self._depth = 0
        self._field: Optional[str] = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, Optional[str]]]) -> None:
        a = dict(attrs)
        if tag == "div" and a.get("data-gpu"):
            self._cell, self._depth = a["data-gpu"], 0
            self.cells[str(self._cell)] = {
                "booked": [],
                "fraction": [],
                "measured": [],
                "mark": [],
                "title": [],
            }
        if self._cell is None:
            return
        self._depth += tag == "div"
        classes = (a.get("class") or "").split()
        self._field = next((c for c in ("booked", "fraction", "measured", "mark") if c in classes), None)
        if tag == "title":
            self._field = "title"

    def handle_endtag(self, tag: str) -> None:
        if self._cell is not None and tag == "div":
            self._depth -= 1
            if self._depth == 0:
                self._cell = None
        self._field = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None and self._field is not None:
            self.cells[self._cell][self._field].append(data)


def cells(html: str) -> dict[str, dict[str, list[str]]]:
    parser = Cells()
    parser.feed(html)
    return parser.cells


BADGES = """Array.from(document.querySelectorAll('.mark.node'))
  .map(function (b) { return [b.textContent, b.closest('[id^="n-"]').id.slice(2)]; })"""
"""Every node badge and its node's id."""
LAYOUT = """(function () {
  var cell = document.querySelector('.gpus.few .gpu svg.bar'), node = cell.closest('details.node');
  var keysOff = Array.from(document.querySelectorAll('.legend span')).filter(function (span) {
    var key = span.querySelector('.key').getBoundingClientRect(), words = span.getBoundingClientRect();
    var wrapped = words.height > 1.5 * parseFloat(getComputedStyle(span).lineHeight || "16");
    return wrapped || Math.abs((key.top + key.bottom) / 2 - (words.top + words.bottom) / 2) > 3;
  }).map(function (span) { return span.textContent; });
  var cut = Array.from(document.querySelectorAll('[data-app] .n')).filter(function (n) {
    return n.scrollWidth > n.clientWidth + 1;
  }).map(function (n) { return n.textContent; });
  return {bar: cell.getBoundingClientRect().width, node: node.getBoundingClientRect().width,
          keys_off: keysOff, cut: cut};
})()"""
"""What the page's layout gives at the window's width: the first one-GPU bar's width and its
node's, the legend's items whose words wrap or whose key is off their line's middle (700 px
before this: three of four), app lines wider than their cell."""

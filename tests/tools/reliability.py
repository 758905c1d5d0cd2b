"""RELIABILITY.md from a real run: the fault tests' rows, the fuzz run's figures, the soak's.

``python -m tests.tools.reliability --faults FAULTS.jsonl --fuzz FUZZ.json --soak SOAK.json --out
RELIABILITY.md`` writes the whole file; ``make reliability`` runs the fault tests (``pytest -m
fault`` with ``$RAYSCOPE_RELIABILITY_JSON``, see tests/reliability_plugin.py), the fuzz run
(tests/tools/fuzz_wire.py) and the soak (tests/tools/soak.py) first. With ``--fuzz`` alone (``make fuzz``)
only the Fuzz section of the existing file is replaced; the other sections stay as the run
that wrote them left them. A file that is missing is said to be missing, never filled in.
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Optional


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def fault_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["test"])


def fault_table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return ["No fault test ran (no rows were recorded).", ""]
    lines = ["| Fault | Expected | Observed | Result | Test |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        result = {"passed": "pass", "failed": "**FAIL**", "skipped": "skipped"}.get(
            r["outcome"], r["outcome"]
        )
        test = r["test"].split("::", 1)
        name = f"`{test[-1]}` ({test[0]})" if len(test) == 2 else f"`{r['test']}`"
        lines.append(
            f"| {_cell(r['fault'])} | {_cell(r['expected'])} | {_cell(r['observed'])} | {result} | {name} |"
        )
    passed = sum(1 for r in rows if r["outcome"] == "passed")
    return [*lines, "", f"{passed} of {len(rows)} fault tests passed.", ""]


def _ms(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.2f} ms"


def _s(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def fuzz_section(path: Optional[Path]) -> list[str]:
    if path is None or not path.exists():
        return ["No fuzz figures: the fuzz run did not run (`make fuzz`).", ""]
    f = json.loads(path.read_text())
    lines = [
        f"{f['inputs']:,} generated inputs (seed {f['seed']}) on {f['finished_at']}"
        f" (Python {f['python']}, {f['machine']}, {f['seconds']:g} s),"
        " by `make fuzz` (tests/tools/fuzz_wire.py):"
        f"{_targets(f.get('target', 'report'))} Checked on each report stream: nothing escapes the"
        " protocol, every connection the head closes has exactly one counted rejection, every frame"
        " it took was acknowledged, the decoder raises nothing but a rejection. On each head holding"
        " hostile reports: every view answers 200 with no node unreadable. On each HTTP request"
        " (rows `http ...`: the answer's status, `refused` when the port refused it before any route):"
        " nothing escapes, nothing reaches the port's catch-all, one answer with a status line for a"
        " complete request, each counted once.",
        "",
        "| Input -> what the head did | Inputs |",
        "| --- | --- |",
        *(f"| {_cell(outcome)} | {n:,} |" for outcome, n in f["outcomes"].items()),
        "",
        f"{f['handled']:,} of {f['inputs']:,} inputs handled, {f['unhandled']} unhandled.",
        "",
    ]
    if f["unhandled_examples"]:
        lines += ["Unhandled (the first 20):", "", *(f"- `{_cell(x)}`" for x in f["unhandled_examples"]), ""]
    return lines


def _targets(target: str) -> str:
    """What the inputs were, by ``tests/tools/fuzz_wire.py --target`` (before the HTTP target:
    ``report``)."""
    report = (
        "byte streams fed in random chunks to the head's report port (authentic version-1 and"
        " version-2 frames, then mutated, replayed, reordered, with a wrong token or generated"
        " payloads)"
    )
    http = (
        "requests fed in random chunks to the head's HTTP port (its clients' requests, then mutated,"
        " with hostile request lines and headers: non-ASCII and 5,000-digit `Content-Length`, two"
        " lengths, transfer codings, NULs, folded and colon-less lines, huge lines)"
    )
    decoder = "a payload fed to the report decoder alone"
    views = (
        "one in a hundred reports with non-ASCII digits in every string field (or mutated ones) held by"
        " a head whose views are then asked"
    )
    if target == "http":
        return f" every one of them {http}."
    if target == "all":
        return f" seven in ten are {report}, two in ten {http}, one in ten {decoder}; {views}."
    return f" nine in ten are {report}, one in ten {decoder}; {views}."


def replace_section(document: str, title: str, body: list[str]) -> str:
    """``document`` with the body of its ``## title`` section replaced by ``body`` (the
    section added before ``## Soak``, or at the end, where it has none)."""
    lines = document.rstrip("\n").split("\n")
    heading = f"## {title}"
    new = [heading, "", *body]
    if heading in lines:
        start = lines.index(heading)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    else:
        start = end = lines.index("## Soak") if "## Soak" in lines else len(lines)
    return "\n".join([*lines[:start], *new, *lines[end:]]).rstrip("\n") + "\n"


def soak_section(path: Path) -> list[str]:
    if not path.exists():
        return ["No soak figures: the soak did not run (`make soak`).", ""]
    s = json.loads(path.read_text())
    ratio = (
        f"{s['status_head_median_s'] / s['ray_status_median_s']:.2f}"
        if s.get("status_head_median_s") and s.get("ray_status_median_s")
        else "n/a"
    )
    return [
        f"{s['agents']} simulated agents (asyncio, {s['client_processes']} client processes),"
        f" each sending one report a second for {s['seconds']:g} s to one head agent on 127.0.0.1;"
        f" {s['cpus']} CPUs,"
        f" load average {s['load_1m_at_end']} at the end (the machine is shared).",
        "",
        "| Figure | Value |",
        "| --- | --- |",
        f"| agents that sent / frames sent (of {s.get('frames_scheduled', 'n/a')} scheduled) / send errors"
        f" | {s['agents_that_sent']} / {s['frames_sent']} / {s['send_errors']} |",
        "| lost latest reports (last `collected_at` sent ≠ the one the head holds)"
        f" | {s['lost_latest_reports']} |",
        f"| head CPU (CPU seconds per second) | {s['head_cpu_per_s']} |",
        f"| head peak RSS | {s['head_rss_peak_mib']} MiB |",
        "| ingest latency p50 / p99 (head `received_at` − agent `collected_at`,"
        f" {s['ingest_samples']} samples)"
        f" | {_ms(s['ingest_latency_p50_ms'])} / {_ms(s['ingest_latency_p99_ms'])} |",
        f"| `rayscope status --head` under load, median of {len(s['status_head_s'])}"
        f" | {_s(s['status_head_median_s'])} |",
        f"| `ray status` in the same run, median of {len(s['ray_status_s'])}"
        f" | {_s(s['ray_status_median_s'])} |",
        f"| ratio status --head / ray status | {ratio} |",
        "",
    ]


def render(faults: Path, fuzz: Optional[Path], soak: Path) -> str:
    lines = [
        "# RELIABILITY",
        "",
        f"Generated by `make reliability` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        f" (Python {platform.python_version()}, {platform.machine()}). Every row is a test that injects"
        " the fault into live parts and asserts the outcome; *Observed* is what that run saw.",
        "",
        "## Faults",
        "",
        *fault_table(fault_rows(faults)),
        "## Fuzz",
        "",
        *fuzz_section(fuzz),
        "## Soak",
        "",
        *soak_section(soak),
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", help="the fault tests' rows (JSON lines)")
    parser.add_argument("--fuzz", help="the fuzz run's figures (tests/tools/fuzz_wire.py --json)")
    parser.add_argument("--soak", help="the soak's figures (tests/tools/soak.py --out)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    if args.faults and args.soak:
        out.write_text(render(Path(args.faults), Path(args.fuzz) if args.fuzz else None, Path(args.soak)))
    elif args.fuzz and not (args.faults or args.soak):
        current = out.read_text() if out.exists() else "# RELIABILITY\n"
        out.write_text(replace_section(current, "Fuzz", fuzz_section(Path(args.fuzz))))
    else:
        parser.error("--faults and --soak (with --fuzz): the whole file; --fuzz alone: its section")
    return 0


if __name__ == "__main__":
    sys.exit(main())

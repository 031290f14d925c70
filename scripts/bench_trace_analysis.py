"""Speed and peak memory of ``smolfsdp.traces.analysis`` beside HolisticTraceAnalysis (HTA), with spread.

Chapter "Reading the profiler"; the README's trace-speed table. Traces: every real trace in the folder of
``--source`` (../shared/traces) and one large NCCL-heavy trace synthesised at run time in a temporary
folder (never in the repo) from the real 2-rank DDP trace: its steps repeated ``--copies`` times back to
back (each copy shifted past the previous one, steps renumbered +100, correlation ids offset), and every
NCCL kernel of 100 µs or more split into back-to-back pieces, each with its own launch
(``cudaLaunchKernelExC``, same CPU time, new correlation id) inside the same ``nccl:*`` range, as DDP
with a smaller bucket size launches more, shorter all-reduces. Piece boundaries fall on whole µs, so
HTA's rounding of ns timestamps opens no gap between pieces. Defaults: 3 copies, >= 2,000 NCCL kernels.

Each measurement is a whole fresh process (so its peak memory is its own): A = smolfsdp ``load_trace`` +
``analyze`` (the whole ``analyze-trace`` report), B = HTA ``TraceAnalysis`` (parse, with HTA's default
json parser unless ``--hta-parser ijson``) + ``get_comm_comp_overlap``. ``--repeats`` pairs per trace,
alternated A,B then B,A, so a drift in the machine's load falls on both sides. Printed per trace and
side: min / median / max seconds, peak RSS (the peak count restarted after the imports), the overlap %
each found (HTA drops the last step; ours is over the same steps) and the ratio of the medians, under a
line with the date, commit and machine (CPU, cores, memory, load average).

    .venv/bin/python scripts/bench_trace_analysis.py [--repeats 5] [--markdown] [--copies 3] [--source PATH]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT.parent / "shared" / "traces" / "ddp_2rank_a100_rank0.json.gz"


def _split_nccl(xs: list[dict], pieces: int, next_corr: int) -> tuple[list[dict], int]:
    """Split each NCCL kernel of >= ``pieces`` µs into ``pieces`` kernels, each with its own launch."""
    launches = {
        e["args"]["correlation"]: e
        for e in xs
        if e.get("cat") == "cuda_runtime" and "correlation" in (e.get("args") or {})
    }
    out = []
    for e in xs:
        nccl = e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()
        launch = launches.get((e.get("args") or {}).get("correlation"))
        if not nccl or launch is None or e["dur"] < max(pieces, 100):
            out.append(e)
            continue
        start, end = e["ts"], e["ts"] + e["dur"]
        inner = [math.floor(start + i * e["dur"] / pieces) for i in range(1, pieces)]
        cuts = [start, *inner, end]
        out.append({**e, "dur": cuts[1] - start})  # the first piece keeps the original launch
        for a, b in zip(cuts[1:-1], cuts[2:], strict=True):
            corr, next_corr = next_corr, next_corr + 1
            out.append({**e, "ts": a, "dur": b - a, "args": {**e["args"], "correlation": corr}})
            out.append({**launch, "args": {**launch["args"], "correlation": corr}})
            flow = {"cat": "ac2g", "name": "ac2g", "id": corr}
            out.append({"ph": "s", "pid": launch["pid"], "tid": launch["tid"], "ts": launch["ts"], **flow})
            out.append({"ph": "f", "pid": e["pid"], "tid": e["tid"], "ts": a, "bp": "e", **flow})
    return out, next_corr


def synthesize(source: Path, copies: int, nccl_kernels: int, out: Path) -> dict[str, int]:
    raw = json.loads(gzip.open(source).read() if source.suffix == ".gz" else source.read_text())
    meta = [e for e in raw["traceEvents"] if e.get("ph") == "M"]
    xs = [e for e in raw["traceEvents"] if e.get("ph") != "M"]
    timed = [e for e in xs if "ts" in e]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed)
    corrs = [(e.get("args") or {}).get("correlation", 0) or 0 for e in xs] + [e.get("id", 0) for e in xs]
    max_corr = max(c for c in corrs if isinstance(c, int)) + 1
    big = sum(1 for e in xs if e.get("cat") == "kernel" and "nccl" in e["name"].lower() and e["dur"] >= 100)
    pieces = max(1, math.ceil(nccl_kernels / max(1, big * copies)))
    step = re.compile(r"ProfilerStep#(\d+)")
    events, next_corr = list(meta), max_corr * copies
    for k in range(copies):
        copy = []
        for e in xs:
            e2 = dict(e)
            if "ts" in e2:  # shifted by whole µs: the ns fractions stay as they were
                e2["ts"] = e2["ts"] + k * math.ceil(span + 1000.0)
            a = e2.get("args")
            if a and "correlation" in a:
                e2["args"] = {**a, "correlation": a["correlation"] + k * max_corr}
            if e2.get("ph") in ("s", "f") and "id" in e2:
                e2["id"] = e2["id"] + k * max_corr
            if e2.get("name", "").startswith("ProfilerStep#"):
                e2["name"] = step.sub(lambda m, k=k: f"ProfilerStep#{int(m.group(1)) + 100 * k}", e2["name"])
            copy.append(e2)
        copy, next_corr = _split_nccl(copy, pieces, next_corr)
        events.extend(copy)
    raw["traceEvents"] = events
    out.write_text(json.dumps(raw))
    n_nccl = sum(1 for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower())
    return {"copies": copies, "pieces": pieces, "events": len(events), "nccl_kernels": n_nccl}


def _rss_mb(field: str) -> float:
    """This process's resident memory (``VmRSS``) or its peak (``VmHWM``), MB, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # elsewhere: the peak so far


def _reset_peak() -> None:
    """Restart the peak count (Linux >= 4.0), so the peak is the measured work's, not the imports'."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def worker(tool: str, path: Path) -> dict:
    """One measured run in this (fresh) process; prints nothing but its result."""
    if tool == "smolfsdp":
        from smolfsdp.traces import analysis as ta

        base = _rss_mb("VmRSS")
        _reset_peak()
        t0 = time.perf_counter()
        df = ta.load_trace(path)
        t1 = time.perf_counter()
        report = ta.analyze(df)
        t2 = time.perf_counter()
        pct = report.complete_steps["overlap_pct"]
        extra = {"events": len(df), "steps": len(report.steps)}
    else:
        import logging

        from hta.common.trace_parser import set_default_trace_parsing_backend
        from hta.configs.parser_config import ParserBackend
        from hta.trace_analysis import TraceAnalysis

        logging.getLogger("hta").setLevel(logging.ERROR)
        backend = {"hta-json": ParserBackend.JSON, "hta-ijson": ParserBackend.IJSON_BATCH_AND_COMPRESS}[tool]
        set_default_trace_parsing_backend(backend)
        base = _rss_mb("VmRSS")
        _reset_peak()
        t0 = time.perf_counter()
        hta = TraceAnalysis(trace_dir=str(path.parent))
        t1 = time.perf_counter()
        pct = float(hta.get_comm_comp_overlap(visualize=False)["comp_comm_overlap_pctg"].iloc[0])
        t2 = time.perf_counter()
        extra = {}
    return {
        "load_s": t1 - t0,
        "analyze_s": t2 - t1,
        "total_s": t2 - t0,
        "overlap_pct": pct,
        "rss_after_imports_mb": base,
        "peak_rss_mb": _rss_mb("VmHWM"),
        **extra,
    }


def _run(tool: str, path: Path) -> dict:
    cmd = [sys.executable, __file__, "--worker", tool, str(path)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode:
        raise SystemExit(f"{tool} failed on {path.name}:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _machine() -> str:
    """CPU model, cores, memory and the load average: the context a reader needs to weigh the times."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next(
        (ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?"
    )
    mem = Path("/proc/meminfo").read_text().split()[1] if Path("/proc/meminfo").is_file() else "0"
    return (
        f"{model}, {os.cpu_count()} CPUs, {int(mem) / 2**20:.0f} GiB, load average "
        f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} at the end"
    )


def _commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return (out.stdout.strip() or "?") + (" + uncommitted changes" if dirty else "")


def _spread(xs: list[float]) -> tuple[float, float, float]:
    return min(xs), statistics.median(xs), max(xs)


def _rows(results: dict[str, dict[str, list[dict]]], events: dict[str, int]) -> list[list[str]]:
    """One row per (trace, side): min/median/max seconds, median and max peak RSS, the ratio of medians."""
    rows = []
    for name, sides in results.items():
        med = {side: statistics.median(r["total_s"] for r in runs) for side, runs in sides.items()}
        pct = {side: statistics.median(r["overlap_pct"] for r in runs) for side, runs in sides.items()}
        for side, runs in sides.items():
            lo, mid, hi = _spread([r["total_s"] for r in runs])
            rss = [r["peak_rss_mb"] for r in runs]
            ratio = f"{med['hta'] / med['smolfsdp']:.2f}x" if side == "hta" and "hta" in med else ""
            rows.append([
                name, f"{events[name]:,}", side, str(len(runs)), f"{lo:.2f}", f"{mid:.2f}", f"{hi:.2f}",
                f"{statistics.median(rss):,.0f} / {max(rss):,.0f}", f"{pct[side]:.2f}", ratio,
            ])  # fmt: skip
    return rows


HEAD = ["trace", "events", "side", "runs", "min s", "median s", "max s", "peak RSS MB (median / max)",
        "overlap %", "HTA / smolfsdp (medians)"]  # fmt: skip


def _print_table(rows: list[list[str]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(HEAD) + " |\n|" + "---|" * len(HEAD))
        print("\n".join("| " + " | ".join(r) + " |" for r in rows))
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEAD)]
    for r in [HEAD, ["-" * w for w in widths], *rows]:
        print(
            "  ".join(
                c.rjust(w) if i > 2 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=3)
    ap.add_argument("--nccl-kernels", type=int, default=2000, help="at least this many NCCL kernels")
    ap.add_argument("--source", type=Path, default=SOURCE)
    ap.add_argument("--repeats", "-n", type=int, default=5, help="alternated A/B process pairs per trace")
    ap.add_argument("--hta-parser", choices=("json", "ijson"), default="json",
                    help="HTA's parser backend (json: HTA's default)")  # fmt: skip
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the README)")
    ap.add_argument("--worker", nargs=2, metavar=("TOOL", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], Path(args.worker[1]))))
        return
    if not args.source.is_file():
        raise SystemExit(f"{args.source}: no such trace (the real traces live in ../shared/traces/)")
    try:
        import hta  # noqa: F401 (only to say whether it is there)
    except ImportError:
        raise SystemExit("HTA is not installed (pip install -e .[dev]): nothing to compare with") from None
    hta_tool = f"hta-{args.hta_parser}"
    with tempfile.TemporaryDirectory() as tmp:
        traces = {}
        for src in sorted(args.source.parent.glob("*.json*")):  # HTA reads a folder: one trace per folder
            (Path(tmp) / src.name).mkdir()
            traces[src.name] = Path(tmp) / src.name / src.name
            shutil.copy(src, traces[src.name])
        (Path(tmp) / "synth").mkdir()
        path = Path(tmp) / "synth" / "synthesised.json"
        info = synthesize(args.source, args.copies, args.nccl_kernels, path)
        traces["synthesised"] = path
        print(
            f"synthesised: {path.stat().st_size / 1e6:.1f} MB, {info['events']:,} events, {info['nccl_kernels']:,} "
            f"NCCL kernels ({info['copies']} copies of {args.source.name}, NCCL kernels split in {info['pieces']})",
            flush=True,
        )
        results = {name: {"smolfsdp": [], "hta": []} for name in traces}
        events = {}
        for rep in range(args.repeats):
            for name, p in traces.items():
                # whole processes, alternated A/B then B/A: drift in the machine's load falls on both sides
                order = [("smolfsdp", "smolfsdp"), ("hta", hta_tool)][:: 1 if rep % 2 == 0 else -1]
                for side, tool in order:
                    r = _run(tool, p)
                    results[name][side].append(r)
                    events.setdefault(name, r.get("events"))
            print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    events = {k: v or 0 for k, v in events.items()}
    print(
        f"smolfsdp load_trace + analyze vs HTA TraceAnalysis ({args.hta_parser} parser) + get_comm_comp_overlap, "
        f"each a fresh process, {args.repeats} alternated pairs per trace; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {_commit()}; {_machine()}"
    )
    _print_table(_rows(results, events), args.markdown)


if __name__ == "__main__":
    main()

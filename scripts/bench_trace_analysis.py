"""Speed and peak memory of ``smolfsdp.traces.analysis`` beside HolisticTraceAnalysis, on one NCCL-heavy trace.

Chapter "Reading the profiler". The trace is built at run time in a temporary folder (never in the
repo) from the real 2-rank DDP trace of ../shared/traces (or --source): its steps repeated
``--copies`` times back to back (each copy shifted past the previous one, steps renumbered +100,
correlation ids offset), and every NCCL kernel of 100 µs or more split into back-to-back pieces,
each with its own launch (``cudaLaunchKernelExC``, same CPU time, new correlation id) inside the
same ``nccl:*`` range, as DDP with a smaller bucket size launches more, shorter all-reduces. Piece
boundaries fall on whole µs, so HTA's rounding of ns timestamps opens no gap between pieces, and the
union of communication time is unchanged. Defaults: 3 copies, >= 2,000 NCCL kernels, ~130k events.

Each side runs in its own fresh process (so peak memory is its own): smolfsdp ``load_trace`` +
``analyze`` (the whole ``analyze-trace`` report: steps, rows, collective kernels, all-gathers), HTA
``TraceAnalysis`` (parse) + ``get_comm_comp_overlap``, once with each of HTA's parsers (json, ijson).
Printed: times, the ratio HTA (its faster parser) / smolfsdp, overlap % on the steps HTA keeps (all
but the last), each process's peak RSS during the work (the peak count is restarted after the
imports) and the machine's load average (the ratio is of two runs on the same machine, one after
the other: a loaded machine makes it noisy).

    .venv/bin/python scripts/bench_trace_analysis.py [--copies 3] [--nccl-kernels 2000] [--source PATH]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import resource
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
        extra = {"steps": len(report.steps), "nccl_attributed": int(len(ta.collective_kernels(df)))}
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
        raise SystemExit(f"{tool} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=3)
    ap.add_argument("--nccl-kernels", type=int, default=2000, help="at least this many NCCL kernels")
    ap.add_argument("--source", type=Path, default=SOURCE)
    ap.add_argument("--skip-hta", action="store_true", help="time smolfsdp only (e.g. on --copies 12)")
    ap.add_argument("--worker", nargs=2, metavar=("TOOL", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], Path(args.worker[1]))))
        return
    if not args.source.is_file():
        raise SystemExit(f"{args.source}: no such trace (the real traces live in ../shared/traces/)")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "t").mkdir()  # HTA reads every trace of a folder: give it one with only ours
        path = Path(tmp) / "t" / "big_trace.json"
        info = synthesize(args.source, args.copies, args.nccl_kernels, path)
        print(
            f"trace: {path.stat().st_size / 1e6:.1f} MB, {info['events']:,} events, {info['nccl_kernels']:,} "
            f"NCCL kernels ({info['copies']} copies of {args.source.name}, NCCL kernels split in {info['pieces']})"
        )
        ours = _run("smolfsdp", path)
        print(
            f"smolfsdp: load {ours['load_s']:.2f} s + analyze {ours['analyze_s']:.2f} s = {ours['total_s']:.2f} s; "
            f"overlap {ours['overlap_pct']:.2f} % (all steps but the last); peak RSS {ours['peak_rss_mb']:.0f} MB "
            f"({ours['rss_after_imports_mb']:.0f} MB after imports); {ours['nccl_attributed']:,} NCCL kernels attributed"
        )
        try:
            import hta  # noqa: F401 (only to say whether it is there)
        except ImportError:
            print("HTA: not installed (pip install -e .[dev]); no ratio")
            return
        if args.skip_hta:
            return
        # HTA has two parsers (json.loads of the whole file; ijson, used when installed): time both and
        # compare with the faster one
        runs = {tool: _run(tool, path) for tool in ("hta-json", "hta-ijson")}
        for tool, r in runs.items():
            print(
                f"HTA ({tool[4:]:5}): parse {r['load_s']:.2f} s + get_comm_comp_overlap {r['analyze_s']:.2f} s = "
                f"{r['total_s']:.2f} s; overlap {r['overlap_pct']:.2f} % (last step dropped); "
                f"peak RSS {r['peak_rss_mb']:.0f} MB ({r['rss_after_imports_mb']:.0f} MB after imports)"
            )
        theirs = min(runs.values(), key=lambda r: r["total_s"])
        gap = abs(ours["overlap_pct"] - theirs["overlap_pct"])
        print(
            f"ratio HTA (faster parser) / smolfsdp: {theirs['total_s'] / ours['total_s']:.2f}x; overlap "
            f"difference {gap:.2f} points; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs "
            f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})"
        )


if __name__ == "__main__":
    main()

"""Speed of ``smolfsdp.trace_analysis`` on a ~100 MB trace, beside HolisticTraceAnalysis on the same file.

Chapter "Reading the profiler". The big trace is the real 2-rank DDP trace from ../shared/traces
(or any trace given with --source) repeated back to back, each copy shifted past the previous one
(steps renumbered, correlation ids offset), written to a temporary folder, never into the repo.

    .venv/bin/python scripts/bench_trace_analysis.py [--mb 100] [--source PATH]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def synthesize(source: Path, target_mb: float, out: Path) -> tuple[int, int]:
    raw = json.loads(gzip.open(source).read() if source.suffix == ".gz" else source.read_text())
    events = raw["traceEvents"]
    xs = [e for e in events if e.get("ph") != "M"]
    meta = [e for e in events if e.get("ph") == "M"]
    one_mb = len(json.dumps(xs)) / 1e6
    copies = max(1, round(target_mb / one_mb))
    span = max(e["ts"] + e.get("dur", 0) for e in xs if "ts" in e) - min(e["ts"] for e in xs if "ts" in e)
    max_corr = max((e.get("args", {}).get("correlation", 0) or 0) for e in xs) + 1
    step = re.compile(r"ProfilerStep#(\d+)")
    out_events = list(meta)
    for k in range(copies):
        for e in xs:
            e2 = dict(e)
            if "ts" in e2:
                e2["ts"] = e2["ts"] + k * (span + 1000.0)
            a = e2.get("args")
            if a and "correlation" in a:
                e2["args"] = {**a, "correlation": a["correlation"] + k * max_corr}
            if e2.get("name", "").startswith("ProfilerStep#"):
                e2["name"] = step.sub(lambda m, k=k: f"ProfilerStep#{int(m.group(1)) + 100 * k}", e2["name"])
            out_events.append(e2)
    raw["traceEvents"] = out_events
    out.write_text(json.dumps(raw))
    return copies, len(out_events)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=float, default=100.0)
    ap.add_argument(
        "--source", type=Path, default=ROOT.parent / "shared" / "traces" / "ddp_2rank_a100_rank0.json.gz"
    )
    args = ap.parse_args()
    from smolfsdp import trace_analysis as ta

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big_trace.json"
        copies, n = synthesize(args.source, args.mb, path)
        size = path.stat().st_size / 1e6
        print(f"trace: {size:.1f} MB, {n:,} events ({copies} copies of {args.source.name})")
        t0 = time.perf_counter()
        df = ta.load_trace(path)
        t1 = time.perf_counter()
        report = ta.analyze(df)
        t2 = time.perf_counter()
        print(
            f"smolfsdp: load {t1 - t0:.1f} s + analyze {t2 - t1:.1f} s = {t2 - t0:.1f} s "
            f"({len(report.steps)} steps, overlap {report.overall['overlap_pct']:.2f} %)"
        )
        try:
            from hta.trace_analysis import TraceAnalysis
        except ImportError:
            print("HTA: not installed")
            return
        hdir = Path(tmp) / "hta"
        hdir.mkdir()
        shutil.move(path, hdir / path.name)
        t0 = time.perf_counter()
        hta = TraceAnalysis(trace_dir=str(hdir))
        t1 = time.perf_counter()
        pct = float(hta.get_comm_comp_overlap(visualize=False)["comp_comm_overlap_pctg"].iloc[0])
        t2 = time.perf_counter()
        print(
            f"HTA     : parse {t1 - t0:.1f} s + get_comm_comp_overlap {t2 - t1:.1f} s = {t2 - t0:.1f} s "
            f"(overlap {pct:.2f} %, last step dropped)"
        )


if __name__ == "__main__":
    main()

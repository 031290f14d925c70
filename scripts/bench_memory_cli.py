"""How long `smolfsdp memory` takes beyond `import torch`, and which imports the rest goes to.

Issue 42 asks for under 2 s beyond `import torch` (the CLI's parser answers before torch loads; the estimate needs
torch and transformers' config classes, not a model). Wall-clock times of fresh interpreters, the median of
``--repeat`` runs each, then the ``python -X importtime`` imports of one run that torch does not already bring,
largest first. A timing of this machine, printed, not a test: another process on the same cores slows it.

    .venv/bin/python scripts/bench_memory_cli.py [--repeat 5] [--config configs/runs/smollm3_3b_medical.yaml]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(args: list[str], repeat: int) -> tuple[float, float]:
    """Median (wall-clock, CPU) seconds of ``python args`` over ``repeat`` fresh interpreters (output discarded).
    CPU time (user + system of the child) moves less than wall time when other processes share the cores."""
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, *args], cwd=ROOT, check=True, capture_output=True)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def import_times(args: list[str]) -> dict[str, int]:
    """``{module: self µs}`` from ``python -X importtime args`` (stderr): the time each module's own code took."""
    err = subprocess.run(
        [sys.executable, "-X", "importtime", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stderr
    out = {}
    for line in err.splitlines():
        parts = line[len("import time:") :].split("|") if line.startswith("import time:") else []
        if len(parts) == 3 and parts[0].strip().isdigit():
            out[parts[2].strip()] = int(parts[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--config", default="configs/runs/smollm3_3b_medical.yaml")
    ap.add_argument("--gpu", default="H100 SXM")
    a = ap.parse_args()
    memory = ["-m", "smolfsdp.cli", "memory", "--config", a.config, "--gpu", a.gpu]
    torch_s = timed(["-c", "import torch"], a.repeat)
    memory_s = timed(memory, a.repeat)
    print(f"median of {a.repeat} runs; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"{'':<40} {'wall s':>7} {'CPU s':>7}")
    print(f"{'python -c import torch':<40} {torch_s[0]:7.2f} {torch_s[1]:7.2f}")
    print(f"{'smolfsdp memory --config ... --gpu ...':<40} {memory_s[0]:7.2f} {memory_s[1]:7.2f}")
    print(
        f"{'beyond import torch (issue 42: < 2 s)':<40} {memory_s[0] - torch_s[0]:7.2f} {memory_s[1] - torch_s[1]:7.2f}"
    )
    base = import_times(["-c", "import torch"])
    by_package: dict[str, int] = {}
    for name, us in import_times(memory).items():
        if name not in base:
            by_package[name.split(".")[0]] = by_package.get(name.split(".")[0], 0) + us
    print("\nimports torch does not bring, by package (their modules' own time, one run):")
    for name, us in sorted(by_package.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {us / 1e6:6.3f} s  {name}")
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, io, contextlib; from smolfsdp.cli import main\n"
         f"with contextlib.redirect_stdout(io.StringIO()): main({memory[3:]!r})\n"
         "print(' '.join(m for m in ('transformers.modeling_utils', 'peft', 'accelerate', 'trl') if m in sys.modules))"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    heavy = loaded
    print(f"\nloaded although the estimate needs none of them: {', '.join(heavy) or 'none'}")


if __name__ == "__main__":
    main()

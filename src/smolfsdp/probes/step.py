"""One FSDP2 training step recorded four ways on 2 CPU ranks: who all-gathers what, when, and what it costs.

Chapter "FSDP mechanics" (``notebooks/02_fsdp_mechanics.ipynb``). ``measure_step_variants`` launches this
module with torchrun (a subprocess, never a process group in the notebook kernel). Each rank builds the
tiny SmolLM3 (4 decoder layers), shards it with ``smolfsdp.sharding.fsdp2.apply_fsdp2`` in each of
:data:`VARIANTS` (layers and root resharded after forward or not; explicit prefetch), takes a warm-up
step, then profiles one step with ``record_shapes`` and ``profile_memory``: the FSDP annotations, the
c10d collectives with their sizes (read back by ``smolfsdp.traces.collective_sizes``), and the CPU allocator's
running total (the memory of the step over time); four more steady steps give the spread of the step's
peak, the yardstick for any memory difference between variants. The loss of every variant is recorded too: they
must be equal, since resharding and prefetching change when bytes move, never what is computed.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m smolfsdp.probes.step --out DIR
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile, record_function
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from smolfsdp.launch.probe import probe_main, read_results, run_probe
from smolfsdp.models.modeling import build_model, load_tokenizer, resolve_wrap_class
from smolfsdp.sharding.distributed import init_distributed, teardown
from smolfsdp.sharding.fsdp2 import apply_fsdp2, build_mesh
from smolfsdp.traces.classify import collective_kind
from smolfsdp.traces.collective_sizes import trace_collectives

#: name -> (layers reshard after forward, root reshards after forward, explicit prefetch)
VARIANTS: dict[str, tuple[bool, bool, bool]] = {
    "root resharded": (True, True, False),
    "root kept (default)": (True, False, False),
    "nothing resharded": (False, False, False),
    "explicit prefetch": (True, False, True),
}
PHASES = ("forward", "loss", "backward", "optimizer")
#: steady steps profiled per variant with the allocator on: the first is drawn; all give the peak's spread
MEMORY_STEPS = 5
#: FSDP2's per-group ``record_function`` names, which it writes without a module name for the root
#: group (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, ``_with_fqn``)
ROOT_GROUP_ANNOTATIONS = (
    "FSDP::pre_forward", "FSDP::post_forward", "FSDP::pre_backward", "FSDP::post_backward_reduce",
    "FSDP::all_gather", "FSDP::post_backward_reshard",
)  # fmt: skip
_UNIT = re.compile(r"\((?P<unit>[^()]*)\)\s*$")


def unit_of(name: str) -> str | None:
    """The FSDP unit an annotation names: ``FSDP::all_gather (model.layers.1)`` -> ``model.layers.1``. The
    root group's annotations carry no name (``FSDP::pre_forward``, ``FSDP::post_backward_reduce``) ->
    ``root``; None for annotations about no single group (``FSDP::root_pre_forward``, prefetch ranges)."""
    m = _UNIT.search(name)
    if m is not None:
        return m.group("unit") or "root"
    return "root" if name in ROOT_GROUP_ANNOTATIONS else None


def _batch(tok) -> dict[str, torch.Tensor]:
    ids = list(range(1, 65))
    return DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)(
        [{"input_ids": ids, "labels": ids}] * 2
    )


def _set_explicit_prefetch(layers: list) -> None:
    """torch's explicit prefetch API (FSDP2 ``FSDPModule.set_modules_to_{forward,backward}_prefetch``):
    each layer issues the next layer's all-gather in forward, the previous one's in backward."""
    for i, layer in enumerate(layers):
        if i + 1 < len(layers):
            layer.set_modules_to_forward_prefetch([layers[i + 1]])
        if i > 0:
            layer.set_modules_to_backward_prefetch([layers[i - 1]])


def _trace_rows(path: Path) -> tuple[list[dict], list[list[float]]]:
    """FSDP annotations, collectives and step phases (start/duration in µs from the first event), and the
    allocator's running total ``[[t_us, bytes], ...]`` from an exported chrome trace."""
    events = json.loads(path.read_text())["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X" and "dur" in e]
    mem = [e for e in events if e.get("name") == "[memory]"]
    t0 = min(e["ts"] for e in xs + mem)
    rows = []
    for e in xs:
        name = e["name"]
        kind = (
            "phase"
            if name in PHASES
            else "annotation"
            if name.startswith("FSDP::")
            else collective_kind(name)
        )
        if kind is None:
            continue
        rows.append(
            {"name": name, "kind": kind, "unit": unit_of(name), "start_us": e["ts"] - t0, "dur_us": e["dur"]}
        )
    curve = [[e["ts"] - t0, e["args"]["Total Allocated"]] for e in sorted(mem, key=lambda e: e["ts"])]
    return sorted(rows, key=lambda r: r["start_us"]), curve


def record_variant(name: str, out_dir: Path, rank: int, world: int) -> dict[str, Any]:
    """Shard the tiny model as ``VARIANTS[name]`` says, profile one step, and return what it did."""
    layers_reshard, root_reshard, prefetch = VARIANTS[name]
    tok = load_tokenizer("tiny")
    model = build_model("tiny", tok, seed=0)
    apply_fsdp2(
        model, build_mesh("cpu", world), resolve_wrap_class(model),
        reshard_after_forward=layers_reshard, root_reshard_after_forward=root_reshard,
    )  # fmt: skip
    if prefetch:
        _set_explicit_prefetch(list(model.model.layers))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = _batch(tok)
    facts: dict[str, Any] = {}

    def step() -> float:
        with record_function("forward"):
            out = model(**batch)
        with record_function("loss"):
            # after forward, before backward: is the root group still gathered? (registered parameters
            # are plain tensors while a group is unsharded, DTensor shards once it is resharded)
            facts["root_sharded_between"] = isinstance(model.lm_head.weight, DTensor)
            loss = out.loss
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    step()  # warm-up: AdamW state exists from here on, so the profiled steps are steady ones
    dist.barrier()
    stem = re.sub(r"[^a-z]+", "_", name)
    trace = out_dir / f"{stem}_rank{rank}.json"
    peaks = []
    for i in range(MEMORY_STEPS):  # the first is the step drawn and counted; all give the peak's spread
        path = trace if i == 0 else out_dir / f"{stem}_rank{rank}_step{i}.json"
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
            loss_i = step()
        prof.export_chrome_trace(str(path))
        rows_i, curve_i = _trace_rows(path)
        peaks.append(max(b for _, b in curve_i) - curve_i[0][1] if curve_i else 0)
        if i == 0:
            loss, events, curve = loss_i, rows_i, curve_i
        else:
            path.unlink()
    sized = trace_collectives(trace)
    return {
        "variant": name,
        "rank": rank,
        "layers_reshard_after_forward": layers_reshard,
        "root_reshard_after_forward": root_reshard,
        "explicit_prefetch": prefetch,
        "loss": loss,
        "root_sharded_between_forward_and_backward": facts["root_sharded_between"],
        "events": events,
        "memory": curve,
        "peak_above_start_bytes": peaks[0],
        # the same peak over MEMORY_STEPS steady steps of one run: gloo's threads allocate beside the
        # step, so the allocator's total moves from step to step; a difference between variants smaller
        # than this spread is not one
        "peak_above_start_range_bytes": [min(peaks), max(peaks)],
        "collectives": sized[["kind", "numel", "bytes", "ts_us"]].to_dict(orient="records"),
        "trace": str(trace),
    }


def record(out_dir: Path) -> list[dict[str, Any]]:
    """Body of one rank (inside torchrun): every variant, written to ``step_probe_rank{r}.json``."""
    info = init_distributed()
    out_dir.mkdir(parents=True, exist_ok=True)
    results = [record_variant(v, out_dir, info.rank, info.world_size) for v in VARIANTS]
    (out_dir / f"step_probe_rank{info.rank}.json").write_text(json.dumps(results))
    teardown()
    return results


def measure_step_variants(out_dir: str | Path, nproc: int = 2, timeout: float = 900) -> list[list[dict]]:
    """Launch :func:`record` on ``nproc`` CPU processes; returns ``[rank][variant]`` results.

    Raises RuntimeError with the ranks' output tails when the run fails.
    """
    run_probe("step probe", "smolfsdp.probes.step", ["--out", str(out_dir)], nproc, timeout)
    return read_results(out_dir, "step_probe_rank{rank}.json", nproc)


def main() -> None:
    probe_main(record, __doc__)


if __name__ == "__main__":
    main()

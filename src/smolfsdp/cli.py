"""``smolfsdp`` command line.

    smolfsdp train [--config configs/runs/smoke.yaml] [--<field> <value> ...]

Any ``TrainConfig`` field can be overridden (``--max_steps 20`` or ``--max-steps=20``). Outside
torchrun/accelerate the command checks the configuration, then starts ``nproc`` processes itself;
inside them (``RANK`` set) it trains.
"""

from __future__ import annotations

import argparse
import sys

import yaml

from smolfsdp.config import ConfigError, load_config


def parse_overrides(tokens: list[str]) -> dict:
    """``["--max-steps", "20", "--cpu_offload=true"]`` -> ``{"max_steps": 20, "cpu_offload": True}``."""
    out, i = {}, 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            raise ConfigError(f"Unexpected argument {tok!r}; overrides look like --field value.")
        key, eq, value = tok[2:].partition("=")
        if not eq:
            if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                value = "true"  # a bare flag
            else:
                i += 1
                value = tokens[i]
        out[key.replace("-", "_")] = yaml.safe_load(value) if value != "" else ""
        i += 1
    return out


def cmd_train(args: argparse.Namespace, rest: list[str]) -> int:
    from smolfsdp.distributed import is_launched

    cfg = load_config(args.config, **parse_overrides(rest))
    if is_launched():
        from smolfsdp.sft import train

        train(cfg)
        return 0
    from smolfsdp.launch import launch
    from smolfsdp.sft import preflight

    found = preflight(cfg)
    print(
        f"[smolfsdp] {cfg.name}: engine={cfg.engine} fsdp_version={cfg.fsdp_version} nproc={cfg.nproc} "
        f"model={cfg.model} wrap={found['wrap_class']} data={found['data']}",
        flush=True,
    )
    proc = launch(cfg)
    if proc.returncode == 0:
        print(f"[smolfsdp] run folder: {cfg.run_dir}", flush=True)
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="smolfsdp", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_train = sub.add_parser("train", help="fine-tune (launches nproc processes unless already launched)")
    p_train.add_argument("--config", default=None, help="a run recipe, e.g. configs/runs/smoke.yaml")
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command == "train":
            return cmd_train(args, rest)
    except ConfigError as err:
        print(f"smolfsdp: error: {err}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())

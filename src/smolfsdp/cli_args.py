"""The command line's ``--<field>`` options, generated from :class:`smolfsdp.config.TrainConfig`.

transformers' ``HfArgumentParser`` (the parser TRL users know) turns each field into an option with
its type (``--max_steps 20``, ``--max-steps=20``, ``--lora`` / ``--lora false`` / ``--no_lora`` for
booleans, ``--lora_target_modules q_proj v_proj``); the help line and the help section come from the
field's metadata (``config._field``), the one source of ``smolfsdp train --help``. Only the options given
on the command line become overrides (defaults are suppressed), so a ``--config`` YAML keeps every value
the command line does not name; :func:`smolfsdp.config.load_config` validates the result.

This module imports only the standard library, yaml and ``smolfsdp.config``: a misspelt flag is
refused in well under a second, before torch or transformers is imported (``tests/test_cli_output.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
import typing
from pathlib import Path
from typing import Any

import yaml

from smolfsdp.config import GROUPS, TrainConfig
from smolfsdp.errors import ConfigError, did_you_mean
from smolfsdp.lora_options import QUANTISED_LOADING, QUANTISED_REFUSAL

METAVARS = {int: "INT", float: "FLOAT", str: "TEXT"}


def hf_argument_parser() -> type[argparse.ArgumentParser]:
    """transformers' ``HfArgumentParser`` class, loaded without importing the ``transformers`` package.

    ``transformers/hf_argparser.py`` (5.24) imports only the standard library and yaml, but
    ``import transformers.hf_argparser`` first runs ``transformers/__init__`` (numpy, huggingface_hub,
    httpx: 1.6 s of CPU, 5 to 27 s of wall time measured on the loaded 2-core CI machine), which a
    misspelt flag would wait for. So the file is executed on its own, as the private module
    ``smolfsdp._hf_argparser``. Where transformers is already imported, or a later version gives the
    file a package-relative import, the regular import is used instead.
    """
    spec = importlib.util.find_spec("transformers")  # finds the package without importing it
    path = Path(spec.submodule_search_locations[0]) / "hf_argparser.py" if spec else None
    if "transformers" not in sys.modules and path is not None and path.is_file():
        file_spec = importlib.util.spec_from_file_location("smolfsdp._hf_argparser", path)
        module = importlib.util.module_from_spec(file_spec)
        try:
            file_spec.loader.exec_module(module)
            return module.HfArgumentParser
        except ImportError:
            pass
    from transformers.hf_argparser import HfArgumentParser  # heavy (see above): only as a fallback

    return HfArgumentParser


def yaml_mapping(text: str) -> dict:
    """``--extra '{team: a, budget: 3}'`` -> a dict (argparse ``type`` for mapping fields)."""
    value = yaml.safe_load(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a YAML mapping, e.g. '{{note: first run}}'")
    return value


def _cli_field(f: dataclasses.Field, hint: Any) -> tuple[str, Any, dataclasses.Field]:
    """The (name, type, field) that HfArgumentParser turns into the option for TrainConfig field ``f``."""
    meta = {"help": f.metadata["help"].replace("%", "%%")}  # argparse %-formats help strings
    base = typing.get_args(hint)[0] if type(None) in typing.get_args(hint) else hint
    if typing.get_origin(base) is list:
        base = typing.get_args(base)[0]
    if base in METAVARS:
        meta["metavar"] = METAVARS[base]
    if typing.get_origin(hint) is dict:
        hint, meta["metavar"] = yaml_mapping, "YAML"  # HfArgumentParser hands a non-class type to argparse
    if f.default_factory is not dataclasses.MISSING:
        return f.name, hint, dataclasses.field(default_factory=f.default_factory, metadata=meta)
    return f.name, hint, dataclasses.field(default=f.default, metadata=meta)


def field_parser(defaults: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """A parent parser (``add_help=False``) with one option per TrainConfig field, in the help sections
    of ``config.GROUPS``. Defaults are shown in the help but suppressed in the parsed namespace, so only
    the options given appear there; ``defaults`` are a command's own (``bench``), shown instead."""
    hints = typing.get_type_hints(TrainConfig)
    classes = []
    for i, title in enumerate(GROUPS):
        group = [
            _cli_field(f, hints[f.name])
            for f in dataclasses.fields(TrainConfig)
            if f.metadata["group"] == title
        ]
        # HfArgumentParser puts each dataclass in the argument group named by _argument_group_name
        classes.append(
            dataclasses.make_dataclass(f"Group{i}", group, namespace={"_argument_group_name": title})
        )
    parser = hf_argument_parser()(classes, add_help=False, allow_abbrev=False, exit_on_error=False)
    # argparse keeps its actions in _actions (no public accessor): show each default in the help text
    # rather than in the namespace, and make HfArgumentParser's --no_<flag> say what it does
    for action in parser._actions:
        action.default = (defaults or {}).get(action.dest, action.default)
        if action.option_strings[0].startswith("--no_"):
            action.help = f"same as --{action.dest} false"
        elif action.default not in (None, [], {}):
            action.help += f" (default: {_shown(action.default)})"
        if action.const is True:  # booleans: --flag, --flag true/false
            action.metavar = "true|false"
        action.default = argparse.SUPPRESS
    return parser


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig fields given on the command line, as typed values. List options accept
    ``a b`` and ``a,b`` alike."""
    out = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    for key, value in out.items():
        if isinstance(value, list):
            out[key] = [part.strip() for v in value for part in str(v).split(",") if part.strip()]
    return out


def refuse_unknown(tokens: list[str], command: str, valid: list[str]) -> None:
    """Raise ConfigError for the first unknown ``--option`` in ``tokens``, naming the nearest valid one;
    a quantised-loading option of TRL (:data:`QUANTISED_LOADING`) gets the reason it is not supported.

    Raises:
        ConfigError: always when ``tokens`` is not empty (a stray value names itself).
    """
    if not tokens:
        return
    flag = next((t for t in tokens if t.startswith("-")), tokens[0])
    name = flag.lstrip("-").partition("=")[0]
    what = "option" if flag.startswith("-") else "argument"
    if what == "option" and name.replace("-", "_") in QUANTISED_LOADING:
        raise ConfigError(f"{flag.partition('=')[0]}: {QUANTISED_REFUSAL}")
    options = [v.lstrip("-").replace("-", "_") for v in valid]
    hint = did_you_mean(name.replace("-", "_"), options, show="--{}".format) if what == "option" else ""
    raise ConfigError(
        f"unknown {what} {flag!r} for {command}.{hint} `smolfsdp {command} --help` lists every option."
    )


def command_hint(err: argparse.ArgumentError, argv: list[str], commands) -> str:
    """`` Did you mean 'train'?`` for a misspelt command (argparse names only the valid choices)."""
    if getattr(err, "argument_name", None) != "COMMAND" or not argv:
        return ""
    return did_you_mean(argv[0], commands)


def option_names(parser: argparse.ArgumentParser) -> list[str]:
    """Every ``--option`` a parser accepts (argparse's ``_option_string_actions``: no public accessor)."""
    return [o for o in parser._option_string_actions if o.startswith("--")]


def parse_overrides(tokens: list[str]) -> dict[str, Any]:
    """``["--max-steps", "20", "--cpu_offload"]`` -> ``{"max_steps": 20, "cpu_offload": True}``.

    Raises:
        ConfigError: an unknown option (with the nearest one) or a value of the wrong type.
    """
    parser = field_parser()
    try:
        args, rest = parser.parse_known_args(tokens)
    except argparse.ArgumentError as err:
        raise ConfigError(str(err)) from err
    refuse_unknown(rest, "train", option_names(parser))
    return overrides_from(args)

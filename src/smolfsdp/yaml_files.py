"""YAML that comes from elsewhere (run recipes, a checkpoint's ``config.yaml``): plain values only, read in
bounded time and memory, every refusal one line naming the file, the line and the fix.

``yaml.safe_load`` already refuses tags such as ``!!python/object``, but with a multi-line
``ConstructorError``; it also expands aliases, so ~600 bytes of nested ``*name`` references become hundreds of
millions of values once copied (the "billion laughs"). :func:`read_recipe` refuses both, and files over
:data:`MAX_RECIPE_BYTES`. Used by :func:`smolfsdp.config.load_config` and ``smolfsdp.checkpoint.dcp``.

    python -c "from smolfsdp.yaml_files import read_recipe; print(read_recipe('configs/runs/smoke.yaml'))"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from smolfsdp.errors import ConfigError

#: A run recipe is a screenful of fields; a file larger than this is not one (and is refused unread).
MAX_RECIPE_BYTES = 1 << 20


class _RecipeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases (``*name``): a few hundred bytes of nested aliases expand
    to gigabytes when the values are copied (the "billion laughs"); a recipe never needs one."""

    def compose_node(self, parent, index):  # PyYAML's signature
        if self.check_event(yaml.AliasEvent):
            raise yaml.MarkedYAMLError(
                problem="an alias (*name): nested aliases expand without bound",
                problem_mark=self.peek_event().start_mark,
            )
        return super().compose_node(parent, index)


def read_recipe(p: Path) -> Any:
    """The YAML of recipe ``p``, plain values only, in bounded time and memory.

    Raises:
        ConfigError: ``p`` is over :data:`MAX_RECIPE_BYTES`, uses an alias, a tag ``yaml.safe_load`` refuses
            (``!!python/object``), or is not YAML; one line naming the file, the line and the fix.
    """
    size = p.stat().st_size
    if size > MAX_RECIPE_BYTES:
        raise ConfigError(
            f"{p} is {size:,} bytes; a run recipe is a short YAML file of TrainConfig fields (at most "
            f"{MAX_RECIPE_BYTES:,} bytes). Check the path."
        )
    text = p.read_text(errors="replace")
    try:
        return yaml.load(text, Loader=_RecipeLoader)  # safe: SafeLoader without aliases
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if "alias" in problem:
            fix = "write the value out instead of referring to an anchor"
        elif "tag" in problem or "constructor" in problem:
            fix = "remove the tag: a recipe holds plain values (yaml.safe_load's types)"
        else:
            fix = "fix the YAML syntax there"
        raise ConfigError(
            f"{p}{where}: not a plain YAML recipe ({' '.join(problem.split())}); {fix}."
        ) from err


def coerce_value(key: str, type_name: str, value: Any) -> Any:
    """YAML reads ``1e-4`` as a string and ``3`` where a float is meant; convert to the field's type."""
    base = type_name.replace(" | None", "")
    if value is None or not isinstance(value, str | int | float) or isinstance(value, bool):
        return value
    try:
        if base == "float":
            return float(value)
        if base == "int" and not isinstance(value, float):
            return int(value)
    except ValueError as err:
        raise ConfigError(f"{key}={value!r} is not a valid {base}.") from err
    if base == "str":
        return str(value)
    if base == "list[str]" and isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value

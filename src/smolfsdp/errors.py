"""The package's one error type for bad input, and the one did-you-mean helper every message uses.

Bottom layer: imports nothing of ours, so every module can raise :class:`ConfigError` and suggest the
nearest valid spelling the same way.

    >>> did_you_mean("trll", ("native", "trl"))
    " Did you mean 'trl'?"
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable


class ConfigError(ValueError):
    """A run configuration that cannot work; the message names the problem and the fix."""


def nearest(name: str, options: Iterable, n: int = 1) -> list[str]:
    """Closest spellings of ``name`` among ``options`` (case-insensitive, difflib ratio >= 0.5), best first."""
    by_lower = {str(o).lower(): str(o) for o in options}
    hits = difflib.get_close_matches(str(name).lower(), list(by_lower), n=n, cutoff=0.5)
    return [by_lower[h] for h in hits]


def did_you_mean(
    name: str,
    options: Iterable,
    n: int = 1,
    *,
    form: str = " Did you mean {}?",
    hits: list[str] | None = None,
    show: Callable[[str], str] = repr,
) -> str:
    """``form`` filled with the nearest option(s) to ``name`` (``'A' or 'B'``), or ``""`` when none is close.

    ``hits`` replaces the difflib search when the caller found candidates its own way (a prefix match);
    ``form`` keeps each message's wording: ``" Did you mean {}?"`` after a sentence, ``" (did you mean {}?)"``
    inside one. ``show`` writes each option (``repr``: quoted; ``"--{}".format``: a command-line flag).
    """
    hits = nearest(name, options, n) if hits is None else hits
    return form.format(" or ".join(show(h) for h in hits)) if hits else ""

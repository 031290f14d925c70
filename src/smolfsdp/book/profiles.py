"""The book's two profiles and the check every chapter runs right after its parameters cell.

Light on purpose (no nbformat, no pandas): each chapter imports it before anything else.
``papermill -p PROFILE ...`` and ``quarto render -P PROFILE:...`` pass any value, so a chapter given an
unknown profile stops at :func:`check_profile` in one line, instead of a ``KeyError`` later or a run in
neither profile.

    python -c "from smolfsdp.book.profiles import check_profile; check_profile('bogus')"
"""

from __future__ import annotations

from smolfsdp.errors import ConfigError

#: smoke: CPU, minutes (CI and readers without GPUs); full: the GPU runs.
PROFILES = ("smoke", "full")


def check_profile(profile: str) -> str:
    """``profile`` when it is one of :data:`PROFILES`.

    Raises:
        ConfigError: one line naming the value and the two profiles.
    """
    if profile not in PROFILES:
        raise ConfigError(
            f"PROFILE={profile!r} is not a profile of this book: use smoke (CPU, minutes) or full (GPUs), e.g. "
            "papermill -p PROFILE smoke, or quarto render -P PROFILE:smoke."
        )
    return profile

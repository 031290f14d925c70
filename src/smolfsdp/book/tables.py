"""Tables shaped for a reader of the book: units in the headers, thousands separators, fixed decimals
per column, long text wrapped (never cut), wide tables split, and no ``NaN``/dict/list reprs.

Every chapter that shows a DataFrame passes it through :func:`show` (or :func:`reader_frame` first when
the columns carry units in their names, as the package's frames do: ``step_time_ms``, ``rss_bytes``,
``overlap_pct``). Pure functions over pandas; the only output is a pandas ``Styler`` (HTML in the page).

    from smolfsdp.book.tables import show, reader_frame
    show(reader_frame(report.steps))                 # "dur (ms)", "overlap (%)", 1,296.97 -> 1,297.0
    python -c "from smolfsdp.book import tables; print(tables.cell_text({'a': [1, 2]}))"
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping, Sequence

import pandas as pd
from pandas.io.formats.style import Styler

MISSING = "—"  # what a reader sees for None/NaN: an em dash, explained by the sentence under the table
MAX_COLUMNS = 7  # more columns than this overflow the book's text column: split them (split_wide)

# Column-name suffix -> (unit shown in the header, factor applied to the values). Bytes are scaled per
# column by the largest value (see _bytes_unit), so a column reads "(MiB)" or "(GiB)", not raw bytes.
SUFFIX_UNITS: dict[str, tuple[str, float]] = {  # first match wins: "_per_s" before "_s"
    "_pct_of_step": ("% of step", 1.0),  # a share of the step's wall time, beside shares of something else
    "_per_s": ("/s", 1.0),
    "_us": ("ms", 1e-3),  # trace times are µs; a step is read in ms
    "_ms": ("ms", 1.0),
    "_s": ("s", 1.0),
    "_pct": ("%", 1.0),
    "_gib": ("GiB", 1.0),
}
BYTE_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("bytes", 1))
#: The book's one rule for memory in tables and prose. A full-size model's memory (SmolLM3-3B, the seeds' models)
#: is in GiB (2**30 bytes), the unit in the column name ("peak per GPU (GiB)"), with :data:`GIB_DECIMALS`
#: decimals, or 3 for a value under 0.1 GiB (LoRA's adapter state), so no value reads 0.00 (:func:`gib_text`).
#: The tiny CPU model's measured storage, where GiB would read 0.000, is in bytes with separators or in the
#: per-column unit :func:`reader_frame` picks (KiB/MiB, named in the header). GB (10**9) only where a source
#: says GB, and then named GB.
UNIT_RULE = (
    "GiB for full-size models (2 decimals, 3 under 0.1 GiB); the tiny CPU model in bytes/KiB/MiB, named"
)
GIB_DECIMALS = 2
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
WORDS = {
    "rss": "RSS",
    "mfu": "MFU",
    "tflops": "TFLOP/s",
    "gpu": "GPU",
    "cpu": "CPU",
    "fsdp": "FSDP",
    "fsdp1": "FSDP1",
    "fsdp2": "FSDP2",
}


def _is_missing(value) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # arrays and containers are not "missing"
        return False


def number_text(value: float, decimals: int = 2) -> str:
    """``1296.968774 -> "1,296.97"`` (thousands separators, ``decimals`` fixed); ints stay whole."""
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    if value and abs(value) < 0.5 * 10**-decimals:  # would read 0.00: say its size instead
        return scientific_text(value)
    return f"{value:,.{decimals}f}"


def scientific_text(value: float, digits: int = 1) -> str:
    """``0.004172 -> "4.2 × 10⁻³"`` (``digits`` after the point of the mantissa); ``0.0 -> "0"``."""
    if not value:
        return "0"
    mantissa, exponent = f"{value:.{digits}e}".split("e")
    return f"{mantissa} × 10{str(int(exponent)).translate(SUPERSCRIPT)}"


def gib_text(value: float) -> str:
    """A GiB value by :data:`UNIT_RULE`: ``"31.77"``, ``"0.007"`` (3 decimals under 0.1), separators."""
    return f"{value:,.{GIB_DECIMALS if abs(value) >= 0.1 or value == 0 else 3}f}"


def cell_text(value, decimals: int = 2) -> str:
    """One cell as a reader reads it: no ``NaN``, no ``{...}``/``[...]`` reprs.

    None/NaN -> ``—``; bool -> ``yes``/``no``; numbers -> :func:`number_text`; a list or tuple ->
    items joined by ``, ``; a mapping -> ``key: value`` pairs joined by ``; `` (nested the same way).
    """
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return "; ".join(f"{readable_name(str(k))}: {cell_text(v, decimals)}" for k, v in value.items())
    if isinstance(value, Sequence) and not isinstance(value, str):
        return ", ".join(cell_text(v, decimals) for v in value) if len(value) else MISSING
    if _is_missing(value):
        return MISSING
    if isinstance(value, numbers.Number):
        return number_text(value, decimals)
    return str(value)


def readable_name(name: str) -> str:
    """``"step_time_ms" -> "step time"``: snake_case to words (unit suffixes are left to reader_frame)."""
    words = [WORDS.get(w.lower(), w) for w in re.split(r"[_\s]+", name) if w]
    return " ".join(words)


def _bytes_unit(values: pd.Series) -> tuple[str, float]:
    top = values.abs().max()
    for unit, size in BYTE_UNITS:
        if not _is_missing(top) and top >= size:
            return unit, 1 / size
    return "bytes", 1.0


def column_unit(name: str, values: pd.Series) -> tuple[str, str | None, float]:
    """``(words, unit or None, factor)`` for a column whose name ends in a unit suffix."""
    if name.endswith("_bytes") and pd.api.types.is_numeric_dtype(values):
        unit, factor = _bytes_unit(values)
        return readable_name(name.removesuffix("_bytes")), unit, factor
    for suffix, (unit, factor) in SUFFIX_UNITS.items():
        if name.endswith(suffix):
            words = name.removesuffix(suffix)
            # text columns (e.g. "1,290 – 1,310") keep their values; only the header gets the unit
            factor = factor if pd.api.types.is_numeric_dtype(values) else 1.0
            if suffix == "_per_s":
                return readable_name(words) + "/s", None, factor
            return readable_name(words), unit, factor
    return readable_name(name), None, 1.0


def reader_frame(df: pd.DataFrame, rename: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Columns named with units (``dur_us``, ``rss_bytes``) -> values scaled, headers ``"dur (ms)"``.

    ``rename`` gives a column its own words (the unit is still appended). Bytes become KiB/MiB/GiB
    (2**10/2**20/2**30, chosen per column by its largest value); ``_us`` becomes ms. Columns without a
    unit suffix keep their values and get words for a name. Returns a new frame; ``df`` is not changed.
    """
    rename = rename or {}
    out = {}
    for col in df.columns:
        words, unit, factor = column_unit(str(col), df[col])
        words = rename.get(col, words)
        header = f"{words} ({unit})" if unit else words
        out[header] = df[col] * factor if factor != 1.0 else df[col]
    frame = pd.DataFrame(out, index=df.index)
    frame.index.names = [readable_name(str(n)) if n is not None else None for n in df.index.names]
    return frame


def column_decimals(values: pd.Series) -> int:
    """Fixed decimals for a numeric column, from its typical size: >= 100 -> 0, >= 10 -> 1, else 2."""
    finite = pd.to_numeric(values, errors="coerce").abs()
    finite = finite[finite.notna() & (finite != math.inf)]
    if finite.empty:
        return 2
    typical = finite.median()
    return 0 if typical >= 100 else 1 if typical >= 10 else 2


def is_plain_range(index: pd.Index) -> bool:
    """True for the 0..n-1 positions pandas gives a frame without an index: an unnamed ``RangeIndex``
    from 0 by 1. Step numbers 2, 3, 4 are a ``RangeIndex(start=2)`` too (pandas makes consecutive ints
    one), and a named index is data: both are shown."""
    return isinstance(index, pd.RangeIndex) and index.name is None and index.start == 0 and index.step == 1


def _is_number_column(values: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)


def format_frame(df: pd.DataFrame, decimals: Mapping[str, int] | int | None = None) -> pd.DataFrame:
    """Every cell as text (:func:`cell_text`), one fixed number of decimals per column.

    ``decimals``: one int for all float columns, or per column (the others chosen by
    :func:`column_decimals`). Integer columns keep whole numbers with separators.
    """
    out = {}
    for col in df.columns:
        values = df[col]
        if isinstance(decimals, int):
            d = decimals
        elif decimals and col in decimals:
            d = decimals[col]
        else:
            d = column_decimals(values) if pd.api.types.is_float_dtype(values) else 2
        out[col] = [cell_text(v, d) for v in values]
    frame = pd.DataFrame(out, index=df.index)
    if not (is_plain_range(df.index) or isinstance(df.index, pd.MultiIndex)):
        frame.index = pd.Index([cell_text(v) for v in df.index], name=df.index.name)
    return frame


TABLE_STYLES = [
    # wrap long text between words, never inside one (a squeezed column must not read "outcom e"); numbers
    # stay on one line and align right; a table wider than the page scrolls inside itself, never the page
    {
        "selector": "td, th",
        "props": "white-space: normal; overflow-wrap: normal; word-break: normal; "
        "hyphens: manual; vertical-align: top;",
    },
    {"selector": "td.num", "props": "white-space: nowrap; text-align: right;"},
    {
        "selector": "",
        "props": "border-collapse: collapse; display: block; overflow-x: auto; max-width: 100%;",
    },
]


def show(
    df: pd.DataFrame,
    *,
    decimals: Mapping[str, int] | int | None = None,
    caption: str | None = None,
    index: bool | None = None,
) -> Styler:
    """``df`` as an HTML table for the page: text cells (:func:`format_frame`), wrapped, not cut.

    ``index``: show the index (default: unless it is a plain 0..n-1 range, :func:`is_plain_range`). Raises ValueError
    when ``df`` has more than :data:`MAX_COLUMNS` columns: split it (:func:`split_wide`) or pivot it
    (:func:`to_long`) so it fits the page.
    """
    if len(df.columns) > MAX_COLUMNS:
        raise ValueError(
            f"{len(df.columns)} columns overflow the page (at most {MAX_COLUMNS}): "
            "split them with tables.split_wide or pivot with tables.to_long."
        )
    text = format_frame(df, decimals)
    if index is None:
        index = not is_plain_range(df.index)
    if index:  # the index becomes the first column(s): Styler styles cells only under unique labels
        text.index.names = [n if n is not None else "" for n in text.index.names]
        text = text.reset_index()
    else:
        text = text.reset_index(drop=True)
    numeric = {c for c in df.columns if _is_number_column(df[c])}
    classes = pd.DataFrame({c: ["num" if c in numeric else ""] * len(text) for c in text.columns})
    styler = text.style.set_table_styles(TABLE_STYLES).set_td_classes(classes).hide(axis="index")
    if caption:
        styler = styler.set_caption(caption)
    return styler


def split_wide(
    df: pd.DataFrame, keep: Sequence[str] = (), max_columns: int = MAX_COLUMNS
) -> list[pd.DataFrame]:
    """Cut a wide frame into frames of at most ``max_columns`` columns, each repeating ``keep`` first.

    Raises ValueError if ``keep`` names a missing column or leaves no room for another column.
    """
    missing = [c for c in keep if c not in df.columns]
    if missing:
        raise ValueError(f"split_wide: keep names columns that are not there: {missing}")
    room = max_columns - len(keep)
    if room < 1:
        raise ValueError(f"split_wide: keep has {len(keep)} columns, max_columns={max_columns} leaves none")
    rest = [c for c in df.columns if c not in keep]
    return [df[[*keep, *rest[i : i + room]]] for i in range(0, len(rest), room)]


def to_long(df: pd.DataFrame, label: str, name: str = "quantity") -> pd.DataFrame:
    """Pivot a few-rows, many-columns frame: one row per column of ``df``, one column per ``label`` value.

    ``label``: the column whose values become the new headers (e.g. the run or the strategy).
    Cells keep their values (format them with :func:`show`). Raises KeyError naming ``label``.
    """
    if label not in df.columns:
        raise KeyError(f"to_long: no column {label!r} among {list(df.columns)}")
    out = df.set_index(label).T
    out.index.name = name
    out.columns.name = None
    return out


_SHARD_DIM = re.compile(r"Shard\(dim=(\d+)\)")


def placement_text(placements: str) -> str:
    """A DTensor's placements as the docs write them: ``"(Shard(dim=0),)" -> "Shard(0)"``,
    ``"(Replicate(), Shard(dim=0))" -> "(Replicate(), Shard(0))"``; empty stays empty (a plain tensor)."""
    text = _SHARD_DIM.sub(r"Shard(\1)", placements)
    one = re.fullmatch(r"\((.*),\)", text)  # a 1-D mesh: a one-element tuple
    return one.group(1) if one else text


def difference_text(diff: float) -> str:
    """A weight difference exactly: ``0.0 -> "0 (bitwise identical)"``, ``0.00417 -> "4.17 × 10⁻³"``
    (never rounded to ``0.00``, which cannot tell identical from close)."""
    return "0 (bitwise identical)" if diff == 0.0 else scientific_text(diff, digits=2)

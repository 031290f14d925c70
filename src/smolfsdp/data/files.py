"""Raw rows from the bundled sample, a local file or a hub data set, with errors that name the file.

``smolfsdp.data.prepare`` turns these rows into tokens. Local layouts, by extension:

* ``.jsonl``: one JSON object per line (``{"Question": ..., "Answer": ...}``);
* ``.json``: a list of such objects (``[{...}, {...}]``), an object of columns
  (``{"Question": [...], "Answer": [...]}``, converted to rows), or an object with one key holding the
  list of rows (``{"data": [{...}, ...]}``, read from that key); anything else is refused naming its
  layout;
* ``.csv`` with a header row; ``.parquet``.

Text files must be UTF-8: a file that is not is refused naming the line and byte where decoding fails
(and the fix, ``iconv``), instead of a bare ``UnicodeDecodeError`` from inside ``datasets``.

    python -c "from smolfsdp.data.files import load_rows; print(load_rows('bundled'))"
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from smolfsdp.errors import ConfigError
from smolfsdp.paths import bundled_data_path

log = logging.getLogger(__name__)

FILE_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
TEXT_SUFFIXES = (".jsonl", ".json", ".csv")


def find_bad_utf8(path: Path) -> tuple[int, int, bytes] | None:
    """The first place ``path`` is not UTF-8: ``(line number from 1, byte column from 1, the bad bytes)``,
    or None when the whole file decodes. Reads the file line by line (constant memory)."""
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                return lineno, err.start + 1, line[err.start : err.end + 3]
    return None


def check_utf8(path: Path) -> None:
    """Raise ConfigError naming the line and byte where ``path`` stops being UTF-8, and the fix."""
    bad = find_bad_utf8(path)
    if bad is not None:
        lineno, col, raw = bad
        raise ConfigError(
            f"Data file {str(path)!r} is not UTF-8: line {lineno}, byte {col} holds {raw!r}. Re-encode the "
            f"file, e.g. iconv -f latin1 -t utf-8 {path.name} > fixed{path.suffix} (if it is Latin-1), or fix "
            "that row."
        )


def _json_rows(path: Path):
    """A ``.json`` file's rows, whatever its top-level layout, as a ``datasets.Dataset``; None when the file
    is not one JSON document (e.g. JSON lines saved as .json: ``datasets`` reads those)."""
    import datasets  # deferred: datasets takes seconds to import; only loading rows needs it

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError:
        return None
    if isinstance(doc, list):
        if not all(isinstance(r, dict) for r in doc):
            kinds = sorted({type(r).__name__ for r in doc if not isinstance(r, dict)})
            raise ConfigError(
                f"{str(path)!r} is a JSON list whose items are not all objects (found {kinds}); each row must "
                'be an object like {"Question": ..., "Answer": ...}.'
            )
        return datasets.Dataset.from_list(doc)
    if isinstance(doc, dict):
        lists = {k: v for k, v in doc.items() if isinstance(v, list)}
        lengths = {len(v) for v in lists.values()}
        if lists and len(lists) == len(doc) and len(lengths) == 1:
            if len(doc) == 1:
                ((key, rows),) = doc.items()
                if rows and all(isinstance(r, dict) for r in rows):
                    log.info("%s: rows read from its key %r (an object holding a list of rows)", path, key)
                    return datasets.Dataset.from_list(rows)
            log.info("%s: an object of columns %s, converted to rows", path, sorted(doc))
            return datasets.Dataset.from_dict(doc)
        shape = {
            k: (f"list of {len(v)}" if isinstance(v, list) else type(v).__name__) for k, v in doc.items()
        }
        raise ConfigError(
            f"{str(path)!r} is a JSON object of layout {shape}, which is not a data layout smolfsdp reads: use a "
            'list of row objects ([{"Question": ..., "Answer": ...}, ...]), an object of equal-length columns '
            '({"Question": [...], "Answer": [...]}), or JSON lines (.jsonl).'
        )
    raise ConfigError(
        f"{str(path)!r} holds a single JSON {type(doc).__name__}, not rows; use a list of row objects or .jsonl."
    )


def _load_local(path: Path):
    """Rows of an existing local file (see the module docstring for the layouts)."""
    import datasets  # deferred: datasets takes seconds to import; only loading rows needs it

    fmt = FILE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ConfigError(f"Unsupported data file type {path.suffix!r}; use one of {sorted(FILE_FORMATS)}.")
    if path.stat().st_size == 0:
        raise ConfigError(
            f"Data file {str(path)!r} is empty; it needs one question/answer row per line (jsonl)."
        )
    if path.suffix.lower() in TEXT_SUFFIXES:
        check_utf8(path)  # before datasets, whose UnicodeDecodeError names neither file nor line
    try:
        ds = _json_rows(path) if path.suffix.lower() == ".json" else None
        return ds if ds is not None else datasets.load_dataset(fmt, data_files=str(path), split="train")
    except ConfigError:
        raise
    except Exception as err:  # datasets' builders raise many types; name the file and the cause
        bad = find_bad_json_line(path) if path.suffix.lower() == ".jsonl" else None  # datasets names no line
        if bad is not None:
            raise ConfigError(
                f"Data file {str(path)!r}, line {bad[0]}: {bad[1]}; JSON lines hold one object per line "
                '({"Question": ..., "Answer": ...}): fix or remove that line.'
            ) from err
        cause = str(err).splitlines()[0] if str(err) else ""
        raise ConfigError(f"Could not read {str(path)!r} as {fmt}: {type(err).__name__}: {cause}") from err


def find_bad_json_line(path: Path) -> tuple[int, str] | None:
    """The first line of a JSON-lines file that is not one JSON object: ``(line number from 1, what it is)``,
    or None when every non-blank line is one. Read line by line (constant memory): called only after
    ``datasets`` failed, whose message ("An error occurred while generating the dataset") names neither."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip("\r\n"))  # columns of this line
            except json.JSONDecodeError as err:
                return lineno, f"not a JSON object ({err.msg} at column {err.colno})"
            if not isinstance(value, dict):
                kind = {list: "list", str: "string", bool: "boolean"}.get(type(value), type(value).__name__)
                return lineno, f"a JSON {kind}, not an object"
    return None


def load_rows(
    dataset: str = "bundled", *, config: str | None = None, split: str = "train", max_rows: int | None = None
):
    """Load raw rows as a ``datasets.Dataset``.

    Args:
        dataset: ``"bundled"``, a path to a .jsonl/.json/.csv/.parquet file, or a hub id.
        config: hub config name (hub ids only).
        split: hub split (hub ids only; local files are one split).
        max_rows: keep the first N rows (None: all).

    Raises:
        ConfigError: the file does not exist, has an unsupported extension or JSON layout, is not UTF-8
            (naming the line), or holds no rows.
    """
    import datasets  # deferred: datasets takes seconds to import; only loading rows needs it

    datasets.disable_progress_bars()  # row counts are logged instead; bars from every rank are noise
    if dataset == "bundled":
        dataset = str(bundled_data_path())
    path = Path(dataset).expanduser()
    looks_local = path.suffix.lower() in FILE_FORMATS or dataset.startswith((".", "/", "~")) or path.exists()
    if looks_local:
        if not path.is_file():
            raise ConfigError(
                f"Data file {str(path)!r} does not exist. Give an existing .jsonl/.json/.csv/.parquet file, "
                "a hub id (e.g. FreedomIntelligence/medical-o1-reasoning-SFT), or 'bundled'."
            )
        ds = _load_local(path)
    else:
        ds = datasets.load_dataset(dataset, config, split=split)
    if len(ds) == 0:
        raise ConfigError(f"{dataset!r} holds no rows.")
    if max_rows is not None:
        ds = ds.select(range(min(max_rows, len(ds))))
    return ds

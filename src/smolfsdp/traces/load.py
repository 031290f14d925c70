"""Read a PyTorch profiler (Kineto) Chrome trace into compact columns, streaming: CUDA and ROCm.

Chapter "Reading the profiler"; used by ``smolfsdp.traces.analysis`` (which re-exports
:func:`load_trace` and :class:`TraceError`). ``.json`` or ``.json.gz``, either an object with a
``traceEvents`` list (what Kineto writes) or a bare JSON array of events (Chrome's other form).

    python -c "from smolfsdp.traces.load import load_trace; print(load_trace('rank0.json.gz').head())"

Events are parsed one at a time by ijson's C (yajl2) backend (without ijson, as on the lent GPU
machine's image, by the standard-library scanner of ``smolfsdp.traces.json_stream``) and folded into numpy columns in
chunks, with repeated strings (names, categories, threads) stored once as pandas categoricals:
memory grows with the number of events (~60 bytes each), never with a tree of Python dicts. A
progress bar (stderr) appears when ``progress=True`` and reading takes more than 2 s. Input is bounded
(``limits``): past ``MAX_BYTES`` decompressed bytes or ``MAX_EVENTS`` events the read stops with a
TraceError naming the limit and the variable that raises it, so a gzip bomb costs seconds, not the machine.

What varies between the Kineto writers this reads (each has a test in tests/test_trace_analysis.py):

* ids (``args.stream``, ``args.correlation``): integers (CUDA), or strings, decimal (``"7"``) or hex
  (``"0x0"``, ROCm on MI250), or a label ending in a number (``"stream 7"``); absent: -1 (a GPU
  event then takes its stream from its ``tid``).
* ``pid``/``tid``: integers or strings (``"stream 0x1"``, ``"PyTorch Profiler (0)"``); kept as text.
* categories: ``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``gpu_user_annotation``, ``cuda_runtime``,
  ``cuda_driver`` (CUDA and ROCm alike; ROCm's runtime calls are named ``hip*``); the capitalised
  names of PyTorch 1.8-1.9 traces (``Kernel``, ``Memcpy``, ``Runtime``, ``Operator``) are mapped to them.
* timestamps in µs, integer or fractional (ns resolution), numbers or numeric strings.
"""

from __future__ import annotations

import gzip
import os
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from smolfsdp.traces import json_stream
from smolfsdp.traces.classify import classify, parse_id

try:
    import ijson
except ImportError:  # the lent GPU machine's image has none: json_stream reads instead (same contract)
    ijson = None
#: What a broken JSON raises: ijson's errors and the standard-library scanner's.
JSON_ERRORS = (json_stream.StreamError,) + ((ijson.JSONError,) if ijson else ())

PROGRESS_DELAY_S = 2.0  # the bar appears only on reads longer than this
# Input bounds (a trace is data from elsewhere: a gzip bomb must not take the machine). Memory: ~60 B
# per event in the columns; the header (held whole by the parser) has its own small bound.
MAX_BYTES = 4 * 2**30  # decompressed JSON bytes read; env SMOLFSDP_TRACE_MAX_BYTES raises or lowers it
MAX_HEADER_BYTES = 4 * 2**20  # before traceEvents (Kineto: a few KiB), held whole at ~4 B/byte
MAX_EVENTS = 20_000_000  # traceEvents items; env SMOLFSDP_TRACE_MAX_EVENTS
CHUNK = 16_384  # events folded into numpy columns at a time (bounds the Python objects alive)
# PyTorch 1.8-1.9 wrote capitalised categories; later Kineto (CUDA and ROCm) writes these
CAT_ALIASES = {
    "Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Runtime": "cuda_runtime",
    "Operator": "cpu_op", "Python": "python_function",
}  # fmt: skip


class Shared(dict):
    """A ``df.attrs`` value that derived frames share instead of copying. pandas deep-copies ``attrs``
    into every frame an operation returns (``NDFrame.__finalize__``); with a trace's thread names and
    device properties in them, those copies took more than half of ``analyze``'s time."""

    def __deepcopy__(self, memo: dict) -> Shared:
        return self


class SharedList(list):
    """The list form of :class:`Shared` (``deviceProperties``)."""

    def __deepcopy__(self, memo: dict) -> SharedList:
        return self


class TraceError(ValueError):
    """A file that is not a readable Chrome trace; the message names the file and where it broke."""


def limits() -> tuple[int, int]:
    """(max decompressed bytes, max events) for one trace: ``MAX_BYTES``/``MAX_EVENTS`` unless the
    environment sets ``SMOLFSDP_TRACE_MAX_BYTES``/``SMOLFSDP_TRACE_MAX_EVENTS`` (integers)."""
    out = []
    for var, default in (("SMOLFSDP_TRACE_MAX_BYTES", MAX_BYTES), ("SMOLFSDP_TRACE_MAX_EVENTS", MAX_EVENTS)):
        raw = os.environ.get(var, "").strip()
        try:
            out.append(int(float(raw)) if raw else default)
        except ValueError:
            raise TraceError(
                f"{var}={raw!r} is not a number: give a whole count, e.g. {var}={default}"
            ) from None
    return out[0], out[1]


def _over(path: Path, what: str, limit: int, var: str) -> TraceError:
    return TraceError(
        f"{path}: more than {limit:,} {what}; refused to bound memory and time (a trace this large, or a "
        f"compressed bomb): if the file is trusted, raise the limit, e.g. {var}={4 * limit}"
    )


# ------------------------------------------------------------------------------ reading
class _Reader:
    """File-like view of a (possibly gzip'd) trace that counts bytes and feeds the progress bar."""

    def __init__(self, path: Path, bar: tqdm | None = None, max_bytes: int | None = None, header=False):
        self.path, self.bar, self.pos, self.header = path, bar, 0, header
        self.max_bytes = limits()[0] if max_bytes is None else max_bytes
        self.raw = path.open("rb")
        gz = self.raw.read(2) == b"\x1f\x8b"
        self.raw.seek(0)
        self.stream = gzip.GzipFile(fileobj=self.raw) if gz else self.raw

    def read(self, n: int = -1) -> bytes:
        try:
            data = self.stream.read(n)
        except EOFError as err:  # gzip without its end marker
            raise TraceError(
                f"{self.path}: gzip stream ends after {self.raw.tell():,} compressed bytes ({self.pos:,} bytes "
                "decompressed) without its end marker: the file is truncated"
            ) from err
        except (gzip.BadGzipFile, zlib.error) as err:
            raise TraceError(
                f"{self.path}: gzip data is corrupt ({err}) near compressed byte "
                f"{self.raw.tell():,}; is it a .json.gz trace?"
            ) from err
        self.pos += len(data)
        if self.pos > self.max_bytes:  # checked per read (ijson asks for 64 KiB at a time)
            if self.header and self.max_bytes == MAX_HEADER_BYTES:  # else the user's lower limit stopped it
                raise TraceError(
                    f"{self.path}: more than {self.max_bytes:,} bytes before traceEvents (a profiler's header "
                    "is a few KiB of metadata); refused to bound memory: not a PyTorch profiler trace"
                )
            raise _over(self.path, "bytes once decompressed", self.max_bytes, "SMOLFSDP_TRACE_MAX_BYTES")
        if self.bar is not None:
            self.bar.update(self.raw.tell() - self.bar.n)
        return data

    def close(self) -> None:
        self.stream.close()
        self.raw.close()


def _json_error(reader: _Reader, err: Exception) -> TraceError:
    msg = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "premature EOF" in msg:
        return TraceError(
            f"{reader.path}: the JSON stops in the middle of a value at byte {reader.pos:,} (premature EOF): "
            "the file is truncated (was the profiler or the copy interrupted?)"
        )
    return TraceError(
        f"{reader.path}: invalid JSON within its first {reader.pos:,} bytes ({msg}); "
        "not a JSON trace: expected a PyTorch profiler (Chrome trace) .json or .json.gz file"
    )


def _header(reader: _Reader) -> tuple[dict[str, Any], str | None]:
    """Top-level keys before ``traceEvents`` (Kineto writes its metadata first) and the events' prefix."""
    if ijson is None:
        try:
            header, prefix, _ = json_stream.read_header(reader)
        except json_stream.StreamError as err:
            if str(err).startswith(("JSON ", "traceEvents is")):  # valid JSON, not a trace
                raise TraceError(f"{reader.path}: {err}") from err
            raise
        return header, prefix
    header: dict[str, Any] = {}
    events = ijson.parse(reader, use_float=True)
    prefix, event, value = next(events)
    if event == "start_array":
        return header, "item"
    if event != "start_map":
        raise TraceError(
            f"{reader.path}: JSON {event} {value!r} at the top, not a trace: expected an object "
            "with a traceEvents list (PyTorch profiler) or a list of events"
        )
    builder, key = None, None
    for prefix, event, value in events:
        if prefix == "" and event == "map_key":
            if builder is not None:
                header[key] = builder.value
            builder, key = ijson.ObjectBuilder(), value
            if value == "traceEvents":
                _, kind, _ = next(events)
                if kind != "start_array":
                    raise TraceError(
                        f"{reader.path}: traceEvents is a {kind.removeprefix('start_')}, "
                        "expected a list of events"
                    )
                return header, "traceEvents.item"
        elif builder is not None and prefix != "":
            builder.event(event, value)
    return {**header, **({key: builder.value} if builder else {})}, None


def read_trace(path: str | Path, progress: bool = False) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """(header, events): the top-level metadata and an iterator over ``traceEvents``, one dict at a time.

    Raises FileNotFoundError, or TraceError naming the file for truncated gzip or JSON (with the
    byte where it stops), invalid JSON, JSON that holds no ``traceEvents`` list, and (while iterating)
    list items that are not objects, or more bytes or events than :func:`limits` allows.
    """
    path = Path(path)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.json*"))[:3]
        hint = f"one .json/.json.gz trace in it, e.g. {path / found[0]}" if found else "a trace file"
        raise FileNotFoundError(f"{path} is a folder, not a trace file; give {hint}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such trace file")
    if path.stat().st_size == 0:
        raise TraceError(f"{path}: empty file (0 bytes), not a trace")
    first = _Reader(path, max_bytes=min(limits()[0], MAX_HEADER_BYTES), header=True)
    try:
        header, prefix = _header(first)
    except JSON_ERRORS as err:
        raise _json_error(first, err) from err
    finally:
        first.close()
    if prefix is None:
        keys = ", ".join(list(header)[:8]) or "none"
        raise TraceError(
            f"{path}: JSON object without a traceEvents list (keys: {keys}); is it a PyTorch profiler trace?"
        )
    return header, _events(path, prefix, progress)


def _events(path: Path, prefix: str, progress: bool) -> Iterator[dict[str, Any]]:
    size = path.stat().st_size
    bar = tqdm(
        total=size,
        unit="B",
        unit_scale=True,
        desc=f"reading {path.name}",
        delay=PROGRESS_DELAY_S,
        file=sys.stderr,
        disable=not progress,
        leave=False,
    )
    reader = _Reader(path, bar)
    max_events = limits()[1]
    try:
        items = ijson.items(reader, prefix, use_float=True) if ijson else _stdlib_items(reader)
        for i, e in enumerate(items):
            if i >= max_events:
                raise _over(path, "events", max_events, "SMOLFSDP_TRACE_MAX_EVENTS")
            if not isinstance(e, dict):
                raise TraceError(
                    f"{path}: traceEvents item {i} is a {type(e).__name__} ({str(e)[:40]!r}), not an event "
                    "object: expected a Chrome trace, a list of {'ph': ..., 'name': ..., 'ts': ...} objects"
                )
            yield e
    except JSON_ERRORS as err:
        raise _json_error(reader, err) from err
    finally:
        reader.close()
        bar.close()


def _stdlib_items(reader: _Reader) -> Iterator[Any]:
    """The events without ijson: the header is walked again, then the list read item by item."""
    _, _, scanner = json_stream.read_header(reader)
    return json_stream.iter_events(scanner)


# ------------------------------------------------------------------------------ columns
def _text(value: Any) -> str:
    """A name, category, pid or tid as text, whether written as 7, 7.0 or "7"."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)


class _Columns:
    """Accumulates complete events as numpy columns: values are kept raw for ``CHUNK`` events, then
    folded into arrays (text as codes into per-column tables of the distinct values seen)."""

    TEXT = ("name", "cat", "pid", "tid")

    def __init__(self) -> None:
        self.tables: dict[str, dict[Any, int]] = {c: {} for c in self.TEXT}
        self.parts: dict[str, list[np.ndarray]] = {}
        self.buf: dict[str, list] = {c: [] for c in (*self.TEXT, "ts", "dur", "stream", "corr")}

    def consume(self, events: Iterator[dict[str, Any]], names: dict[tuple[str, str], str]) -> None:
        """Fold every complete event into the columns and every thread name into ``names``.

        The hot loop of loading (one pass per event): bound ``append`` methods and no per-event call
        keep it at a fraction of ijson's own parsing time.
        """
        b = self.buf
        name, cat, pid, tid, ts, dur, stream, corr = (b[c].append for c in b)
        n = 0
        for e in events:
            ph = e.get("ph")
            if ph == "X":
                t = e.get("ts")
                if t is None:
                    continue
                args = e.get("args") or {}
                stream(args.get("stream", -1))  # AttributeError for non-dict args: the caller says so
                corr(args.get("correlation", -1))
                name(e.get("name", ""))
                cat(e.get("cat", ""))
                pid(e.get("pid", ""))
                tid(e.get("tid", ""))
                ts(t)
                dur(e.get("dur", 0))
                n += 1
                if n == CHUNK:
                    self.flush()
                    n = 0
            elif ph == "M" and e.get("name") == "thread_name":
                key = (_text(e.get("pid")), _text(e.get("tid")))
                new = str((e.get("args") or {}).get("name", ""))
                if key not in names or not new.endswith("(python)"):  # "pt_gloo_runloop" beats "python"
                    names[key] = new

    def flush(self) -> None:
        for col, values in self.buf.items():
            if col in self.TEXT:
                tbl = self.tables[col]
                arr = np.fromiter((tbl.setdefault(v, len(tbl)) for v in values), np.int32, len(values))
            elif col in ("ts", "dur"):
                arr = np.asarray(values, dtype=np.float64)  # numeric strings convert too
            else:  # ids: CUDA writes ints; ROCm hex strings ("0x0"), some writers decimal strings
                ints = all(type(v) is int for v in values)
                arr = np.asarray(values if ints else [parse_id(v) for v in values], dtype=np.int64)
            self.parts.setdefault(col, []).append(arr)
            values.clear()

    def _categorical(self, col: str) -> pd.Categorical:
        """Raw values -> text (7, 7.0 and "7" are one pid; old category names mapped), one category each."""
        texts = [_text(v) for v in self.tables[col]]
        if col == "cat":
            texts = [CAT_ALIASES.get(t, t) for t in texts]
        uniq, remap = np.unique(np.array(texts, dtype=object), return_inverse=True)
        codes = remap.astype(np.int32)[np.concatenate(self.parts[col])]
        return pd.Categorical.from_codes(codes, categories=list(uniq))

    def frame(self) -> pd.DataFrame:
        self.flush()
        cols = {c: np.concatenate(p) for c, p in self.parts.items() if c not in self.TEXT}
        text = {c: self._categorical(c) for c in self.TEXT}
        return pd.DataFrame(
            {
                **text,
                "ts": cols["ts"],
                "dur": cols["dur"],
                "stream": cols["stream"],
                "correlation": cols["corr"],
            }
        )


def load_trace(path: str | Path, *, progress: bool = False) -> pd.DataFrame:
    """One row per complete (``ph == "X"``) event of a ``.json`` or ``.json.gz`` Chrome trace.

    Columns: ``name, cat, pid, tid`` (categorical text), ``ts, dur, end`` (float64 µs), ``stream``
    (int64, -1 for CPU events), ``correlation`` (int64, -1 when absent), ``device`` ("cpu"/"gpu"),
    ``row`` (thread or stream label), ``category`` (one of ``CATEGORIES``), ``kind``
    (all-gather/reduce-scatter/all-reduce/broadcast/other for communication), ``layer`` (decoder
    layer in ``model.layers.N`` names, else -1), ``in_comm`` (a CPU event inside a communication op).
    ``df.attrs`` holds the path, the trace's ``distributedInfo``/``deviceProperties`` and thread names.
    ``progress``: a progress bar on stderr for reads longer than 2 s (the CLI sets it).

    Raises FileNotFoundError, or TraceError for truncated, non-JSON, non-trace or event-less files.
    """
    header, events = read_trace(path, progress)
    cols, names = _Columns(), {}
    try:
        cols.consume(events, names)
        if not cols.buf["ts"] and not cols.parts:
            raise TraceError(f"{path}: no complete ('X') events; nothing was recorded")
        df = cols.frame()
    except TraceError:
        raise
    except (AttributeError, TypeError, ValueError) as err:  # a field of the wrong type in some event
        raise TraceError(
            f"{path}: an event field is unreadable ({err}): expected numbers (or numeric "
            "strings) in ts/dur, text or numbers in name/cat/pid/tid, an object in args"
        ) from err
    df["end"] = df["ts"] + df["dur"]
    df = classify(df, names)
    df.attrs.update(
        path=str(path),
        distributed=Shared(header.get("distributedInfo") or {}),
        devices=SharedList(header.get("deviceProperties") or []),
        thread_names=Shared({f"{p}/{t}": n for (p, t), n in names.items()}),
    )
    return df

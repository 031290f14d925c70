"""Render the book with Quarto in one profile, from a scratch copy, so the committed notebooks stay clean.

    python scripts/render_book.py --profile smoke    # `make render`: site in _book/smoke/
    python scripts/render_book.py --profile full     # `make render PROFILE=full`, on 2 GPUs: _book/full/
    python scripts/render_book.py --executed _executed/smoke   # one execution: Quarto runs no cell

--executed DIR renders the notebooks `scripts/execute_notebooks.py --ipynb-dir DIR` executed (same profile),
`quarto render --no-execute`: the chapters run once, in Jupyter with papermill's parameters, and Quarto only
renders them (what the test suite does, tests/test_site.py; `make render EXECUTED=DIR`).

What it does and why: smolfsdp.book.chapters.render_book (Quarto writes executed .ipynb chapters over their
sources and `freeze: auto` ignores -P, so each profile renders in its own _render/<profile>/).

Two checks of its own before Quarto starts, and one pass over the site after (:func:`finish_site`):
- the full profile needs 2 CUDA GPUs and access to the full recipe's model and data set on the Hub; without
  them it stops in one line before the first chapter (instead of a traceback in chapter 01);
- `freeze: auto` re-executes a chapter only when the chapter's own source changed, not when what it reads
  did (the package, the committed GPU results, the real traces in ../shared/). So a stamp of those inputs is
  kept in _render/<profile>/; when it changes, that profile's _freeze/ is cleared and every chapter runs
  again. (By hand: delete _render/<profile>/_freeze/.)
- after Quarto: the CDN scripts Quarto adds that no page uses are dropped, then the site is checked (one
  plotly.js, loaded once per page that draws a figure; no page over 1 MB; no script or stylesheet from
  another host); a problem fails the render, naming the page.
"""

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from smolfsdp.book.chapters import PROFILES, chapters, render_book
from smolfsdp.paths import repo_root

FULL_RECIPE = "smollm3_3b_medical"  # what the full profile's chapters train and read
STAMP = ".smolfsdp-inputs.json"


def full_profile_problem() -> str | None:
    """Why the full profile cannot run here (one line), or None: fewer than 2 CUDA GPUs, or the full recipe's
    model or data set not reachable on the Hub (nor in its local cache)."""
    import torch  # deferred: only the full profile needs it, and it takes seconds to import

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        return (
            f"PROFILE=full needs 2 CUDA GPUs and this machine has {n}: render the smoke profile here "
            "(`make render`), or run PROFILE=full on a machine with 2 GPUs and Hub access"
        )
    from huggingface_hub import hf_hub_download  # deferred: as torch, only for the full profile

    from smolfsdp.config import load_config
    from smolfsdp.paths import recipe

    cfg = load_config(recipe(FULL_RECIPE))
    for repo_id, repo_type, filename in (
        (cfg.model, "model", "config.json"),
        (cfg.dataset, "dataset", "README.md"),
    ):
        try:
            hf_hub_download(repo_id, filename, repo_type=repo_type)
        except Exception as e:  # offline, gated, missing: each is the same answer for the reader
            return (
                f"PROFILE=full needs the {repo_type} {repo_id} from the Hugging Face Hub and it is not reachable "
                f"({type(e).__name__}): log in (`hf auth login`), allow network access, or render the smoke profile"
            )
    return None


def inputs_stamp(root: Path) -> dict[str, str]:
    """What the chapters read besides their own source: the package's code, the committed GPU results
    (``data/results/``) and the real inputs in ``../shared/`` (names and sizes), one digest each."""
    groups = {
        "package": sorted((root / "src" / "smolfsdp").rglob("*.py")),
        "results": sorted(p for p in (root / "data" / "results").rglob("*") if p.is_file()),
    }
    stamp = {
        k: hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest() for k, files in groups.items()
    }
    shared = root.parent / "shared"
    listing = sorted(
        f"{p.relative_to(shared)}:{p.stat().st_size}" for p in shared.rglob("*") if p.is_file()
    ) if shared.is_dir() else []  # fmt: skip
    stamp["shared"] = hashlib.sha256("\n".join(listing).encode()).hexdigest()
    return stamp


def stale_inputs(project: Path, stamp: dict[str, str]) -> list[str]:
    """The inputs (keys of :func:`inputs_stamp`) that changed since ``project`` last rendered; when any did
    and results are frozen, its ``_freeze/`` is cleared so every chapter runs again. A project with frozen
    results but no stamp (rendered before stamps existed) counts as changed in every input."""
    if not (project / "_freeze").exists():
        return []
    path = project / STAMP
    old = json.loads(path.read_text()) if path.is_file() else {}
    changed = sorted(k for k in stamp if old.get(k) != stamp[k])
    if changed:
        shutil.rmtree(project / "_freeze")
    return changed


# Quarto puts require.js, jQuery and a `define('jquery')` from a CDN into the head of every page with any
# text/html or application/javascript output (src/core/jupyter/widgets.ts: extractJupyterWidgetDependencies,
# `jsWidgets = haveOutputType(nb, [kApplicationJavascript, kTextHtml])`, written by
# includesForJupyterWidgetDependencies), for "javascript widgets" that assume them. Every table of the book
# is text/html (a pandas Styler), so the trigger is any table, not plotly; nothing the book shows uses
# require or jQuery (plotly.js 4 is no AMD module, the figures call Plotly directly). Quarto has no switch
# for it, so the render drops the three tags (Quarto 1.7 loaded them from cdnjs, 1.8+ from jsDelivr).
UNUSED_CDN_TAGS = re.compile(
    r'<script src="https://[^"]+/(?:require|jquery)\.min\.js"[^>]*></script>\n?'
    r"|<script[^>]*>define\('jquery', \[\],\s*function\(\) \{return window\.jQuery;\}\)</script>\n?"
)
PAGE_LIMIT_BYTES = 1_000_000  # a page's HTML, figures' data included (issue 26: "a page under 1 MB")
PLOTLY_SCRIPT = re.compile(r'<script\b[^>]*\bsrc="([^"]*/)?plotly(?:-[\w.]+)?\.min\.js"')
OUTSIDE = re.compile(r'<(?:script|link)\b[^>]*\b(?:src|href)="(?:https?:)?//[^"]*"[^>]*>')
CSS_OUTSIDE = re.compile(r"@import\s+url\(\s*[\"']?(?:https?:)?//")


# Long names in table cells (SmolLM3DecoderLayer, apply_lora, torch.bfloat16) are single words to the browser:
# a column of them made tables wider than the text column. A <wbr> after each '_' and '.' and between a word's
# lower-case letter and the next capitalised part lets a cell break there, only there (theme.scss keeps every
# other word whole). Text between tags only; a second pass adds nothing.
TABLE_CELL = re.compile(r"(<t[dh]\b[^>]*>)(.*?)(</t[dh]>)", re.S)
CELL_TEXT = re.compile(r"(?<=>)[^<]+|^[^<]+")
NAME_BREAK = re.compile(r"(?<=[a-z0-9])(?=[A-Z][a-z])|(?<=[a-z0-9]_)(?=[A-Za-z0-9])|(?<=[a-z]\.)(?=[a-z])")


def break_long_names(html: str) -> str:
    """``html`` with a ``<wbr>`` at each break point of :data:`NAME_BREAK` in the text of its table cells."""

    def cell(m):
        inner = CELL_TEXT.sub(lambda t: NAME_BREAK.sub("<wbr>", t.group()), m.group(2))
        return m.group(1) + inner + m.group(3)

    return TABLE_CELL.sub(cell, html)


def site_pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if "site_libs" not in p.relative_to(site).parts)


def finish_site(site: Path) -> list[str]:
    """Drop the unused CDN tags (:data:`UNUSED_CDN_TAGS`) from every page of ``site`` and let long names in
    table cells break (:func:`break_long_names`), then return what is
    wrong with it, one line per problem: a page over :data:`PAGE_LIMIT_BYTES`, a page with a figure that
    does not load plotly.js exactly once or carries it inline, more than one plotly.js in the site, a script
    or stylesheet from another host (pages and site_libs' CSS)."""
    problems = []
    for page in site_pages(site):
        html = break_long_names(UNUSED_CDN_TAGS.sub("", page.read_text()))
        page.write_text(html)
        name, size = page.relative_to(site), len(html.encode())
        if size > PAGE_LIMIT_BYTES:
            problems.append(f"{name}: {size:,} bytes of HTML (at most {PAGE_LIMIT_BYTES:,})")
        if "* plotly.js v" in html:
            problems.append(f"{name}: plotly.js inline (the site serves it once, scripts/quarto_plotly.lua)")
        loads = len(PLOTLY_SCRIPT.findall(html))
        if 'class="plotly-graph-div"' in html and loads != 1:
            problems.append(f"{name}: has figures and loads plotly.js {loads} times (once)")
        problems += [f"{name}: from another host: {tag[:120]}" for tag in OUTSIDE.findall(html)]
    copies = [p.relative_to(site) for p in site.rglob("plotly*.js")]
    if len(copies) > 1:
        problems.append(f"plotly.js {len(copies)} times in the site: {', '.join(map(str, copies))}")
    for css in site.rglob("*.css"):
        if CSS_OUTSIDE.search(css.read_text(errors="replace")):
            problems.append(f"{css.relative_to(site)}: imports a stylesheet from another host")
    return problems


def executed_notebooks(folder: Path, profile: str) -> dict:
    """The chapters executed into ``folder`` (``<stem>.ipynb``), by stem; ValueError, before Quarto starts,
    when a chapter is missing there or ran in another profile (its injected parameters say which)."""
    import nbformat  # deferred: the plain render does not need it

    out = {}
    for nb_path in chapters():
        path = folder / nb_path.name
        if not path.is_file():
            raise ValueError(
                f"{path} is missing: execute the chapters first "
                f"(`python scripts/execute_notebooks.py --profile {profile} --ipynb-dir {folder}`)"
            )
        nb = nbformat.read(path, as_version=4)
        ran = nb.metadata.get("papermill", {}).get("parameters", {}).get("PROFILE")
        if ran != profile:
            raise ValueError(f"{path} was executed in profile {ran!r}, not {profile!r}: execute it again")
        out[nb_path.stem] = nb
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default="smoke", choices=PROFILES)
    parser.add_argument("--quarto", default="quarto", help="the Quarto executable (default: quarto on PATH)")
    parser.add_argument(
        "--executed", metavar="DIR", help="render the executed notebooks in DIR, no execution"
    )
    args = parser.parse_args(argv)
    executed = None
    if args.executed:
        try:
            executed = executed_notebooks(Path(args.executed), args.profile)
        except ValueError as e:
            parser.exit(2, f"error: {e}\n")
    if args.profile == "full" and (problem := full_profile_problem()):
        parser.exit(2, f"error: {problem}\n")
    project = repo_root() / "_render" / ("executed" if executed else "") / args.profile
    stamp = inputs_stamp(repo_root())
    if changed := stale_inputs(project, stamp):
        print(f"{args.profile}: {', '.join(changed)} changed since the last render: every chapter runs again")
    try:
        site = render_book(args.profile, quarto=args.quarto, executed=executed)
    except FileNotFoundError as e:
        parser.exit(2, f"error: {e}\n")
    except subprocess.CalledProcessError as e:
        parser.exit(
            e.returncode or 1,
            f"error: quarto render failed in {project.relative_to(repo_root())}/ (see above)\n",
        )
    (project / STAMP).write_text(json.dumps(stamp, indent=1))
    if problems := finish_site(site):
        parser.exit(1, "error: the rendered site has problems:\n" + "".join(f"  {p}\n" for p in problems))
    print(f"{args.profile} profile rendered: {site}/index.html", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

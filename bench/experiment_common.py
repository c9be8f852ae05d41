"""Shared by the experiment scripts in bench/: where output goes, and the plotting dependency.

* Output defaults to build/experiments/<name> (ignored by git). The committed results under
  docs/results/ are written only when asked for twice: `--out docs/results/<name> --overwrite`.
* The raw runs of an earlier experiment (recovery_experiment.py's JSONL files) are not deleted
  without --overwrite either, wherever they are. Figures and tables are derived from them and
  are rewritten freely outside docs/.
* Plots need matplotlib. A script that plots checks for it before doing any work; when it is
  missing, the script installs Debian's package through the project's dependency script
  (`bash .ci/deps python3-matplotlib`, sudo when not root) and, when it was started by another
  interpreter, re-runs itself with /usr/bin/python3 (where that package lives). --no-plot
  skips the figures and the dependency.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
MATPLOTLIB_HINT = "bash .ci/deps python3-matplotlib"


def default_out(name: str) -> Path:
    """build/experiments/<name> in the repository: outside the committed docs/."""
    return REPO / "build" / "experiments" / name


def out_help(name: str) -> str:
    """--out's help text."""
    return (f"output folder (default: build/experiments/{name}); the committed results "
            f"(docs/results/{name}) are written only with --overwrite")


def overwrite_help() -> str:
    """--overwrite's help text."""
    return "allow writing into a folder under docs/ (the committed results)"


def is_committed(out: Path) -> bool:
    """Whether `out` lies under the repository's docs/ folder."""
    try:
        out.resolve().relative_to(DOCS)
        return True
    except ValueError:
        return False


def check_out(prog: str, out: Path, overwrite: bool, existing: list[Path]) -> None:
    """Exits with a one-line message unless writing into `out` is allowed: a folder under docs/
    needs --overwrite, and so does a folder holding `existing` files of an earlier run."""
    if overwrite:
        return
    if is_committed(out):
        sys.exit(f"{prog}: {out} holds committed results; pass --overwrite to replace them, or "
                 f"choose another --out")
    if existing:
        sys.exit(f"{prog}: {out} already holds {len(existing)} file(s) of an earlier run (e.g. "
                 f"{existing[0].name}); pass --overwrite to replace them, or choose another --out")


def require_matplotlib(prog: str):
    """Returns matplotlib.pyplot (Agg backend). When matplotlib is missing it is installed with
    `bash .ci/deps python3-matplotlib`, and the script re-runs itself under /usr/bin/python3
    when another interpreter started it; exits with a one-line message when that fails."""
    try:
        import matplotlib
    except ImportError:
        print(f"{prog}: matplotlib is missing; installing it: {MATPLOTLIB_HINT}", file=sys.stderr)
        if subprocess.call(["bash", str(REPO / ".ci" / "deps"), "python3-matplotlib"]) != 0:
            sys.exit(f"{prog}: `{MATPLOTLIB_HINT}` failed; install python3-matplotlib, or pass "
                     f"--no-plot")
        system_python = "/usr/bin/python3"
        if Path(sys.executable).resolve() != Path(system_python).resolve():
            os.execv(system_python, [system_python, *sys.argv])
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

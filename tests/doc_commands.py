"""Shell commands as the documentation shows them, and a fresh clone to run them in.

What counts as a command (tests/test_readme_commands.py and tests/test_examples.py):

- in a Markdown block fenced as ```bash, ```sh, ```shell or ```console: every line that
  is not blank and not a ``#`` comment, with lines ending in ``\\`` joined to the next;
  in ```console blocks only lines after a ``$ `` prompt, and the lines up to the next
  prompt are the output the documentation shows;
- in a Python module's docstring (examples/), the indented lines that start with
  ``.venv/bin/``, continuation lines joined the same way.

A command exits 0 unless its trailing comment says ``exit N``. Commands run in order,
in one copy of the repository's tracked files, as a reader following the text would.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELLS = ("bash", "sh", "shell", "console")
_EXIT = re.compile(r"#.*\bexit (\d+)\b")


@dataclass
class Command:
    text: str  # what bash runs, trailing comment included
    line: int  # 1-based line in the source where it starts
    exit_code: int = 0
    output: list[str] = field(default_factory=list)  # shown below a ``$ `` prompt

    @property
    def id(self) -> str:
        words = re.sub(r"\.venv/bin/", "", self.text.split("#")[0]).split()
        return f"L{self.line}-" + "-".join(w.strip("\"'") for w in words[:4])


def _join(lines: list[tuple[int, str]], prompt: str = "") -> list[Command]:
    """Commands in one block's ``(line number, text)`` lines: those starting with
    ``prompt`` (which is dropped when it is ``$ ``), or every line without one."""
    commands: list[Command] = []
    current: Command | None = None
    continued = False
    for number, raw in lines:
        text = raw.strip()
        if continued and current is not None:
            current.text = f"{current.text[:-1].rstrip()} {text}"
        elif not text.startswith(prompt) or not text or text.startswith("#"):
            if current is not None and text and prompt == "$ ":
                current.output.append(text)
            continue
        else:
            current = Command(text[2:] if prompt == "$ " else text, number)
            commands.append(current)
        continued = current.text.endswith("\\")
    for c in commands:
        m = _EXIT.search(c.text)
        c.exit_code = int(m.group(1)) if m else 0
    return commands


def markdown_commands(path: Path) -> list[Command]:
    """Every shell command in the fenced shell blocks of a Markdown file."""
    commands: list[Command] = []
    block: list[tuple[int, str]] | None = None
    lang = ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            if block is None:
                lang, block = line.strip()[3:].strip().lower(), []
            else:
                if lang in SHELLS:
                    commands += _join(block, "$ " if lang == "console" else "")
                block = None
        elif block is not None:
            block.append((number, line))
    return commands


def docstring_commands(path: Path) -> list[Command]:
    """The commands in the indented lines of a Python file's module docstring: those
    starting with ``.venv/bin/`` (indented Python in a docstring is not a command)."""
    import ast

    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
    lines = [(n, line) for n, line in enumerate(doc.splitlines(), 1)
             if line.startswith("    ")]
    return _join(lines, ".venv/bin/")


def fresh_clone(dest: Path) -> Path:
    """The repository's tracked files (as they are in the working tree) copied to
    ``dest``, with ``.venv`` linked to this checkout's, as after ``make setup``."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():  # tracked but deleted in the working tree: not in a clone either
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    return dest


def shell_env(clone: Path) -> dict[str, str]:
    """A reader's shell: the clone's ``.venv/bin`` first on PATH, and nothing this test
    process inherited from Ray or pytest (a subprocess must start its own Ray)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "PYTEST_")) and k != "VIRTUAL_ENV"}
    env["PATH"] = f"{clone / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(command: Command, clone: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run one command with bash in ``clone``, in a process group of its own.

    Raises:
        subprocess.TimeoutExpired: after the whole group was ended. Ending bash alone
            (what ``subprocess.run`` does) once left a timed-out ``trainthrough run``
            and its Ray cluster running for an hour and a half, measured.
    """
    p = subprocess.Popen(["bash", "-c", command.text], cwd=clone, env=shell_env(clone),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # every member already ended
            os.killpg(p.pid, signal.SIGKILL)  # the group this test started (bash leads it)
        p.communicate()
        raise
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def explain(command: Command, r: subprocess.CompletedProcess[str]) -> str:
    return (f"line {command.line}: {command.text}\nexit {r.returncode}, expected "
            f"{command.exit_code}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n"
            f"{r.stderr[-3000:]}")

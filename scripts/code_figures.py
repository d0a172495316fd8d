"""How the code reads, in numbers: module and class sizes, private names used across
modules, hasattr/getattr probing, and the calls one batch takes through process workers.

    python scripts/code_figures.py [SRC]          # SRC: a package folder, default src/conveyor
    python scripts/code_figures.py --no-trace     # the static figures only

Code lines are lines holding code: not blank, not only a comment, not in a docstring. A
class's attributes are the names it assigns on ``self`` in its methods plus those set in its
body. "One batch" is a steady-state ``next()`` of a loader with 2 persistent process
workers (fork) in the main process, plus what a worker runs between taking one batch's
order and the next's: the conveyor functions called, and the files they live in.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import sys
import tokenize
from collections import Counter
from pathlib import Path

MODULE_MAX = 450
CLASS_MAX = 25


def code_lines(text: str) -> int:
    """Lines with code on them (comments, blank lines and docstrings left out)."""
    doc_lines: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                doc_lines.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.ENDMARKER):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - doc_lines)


def class_attributes(cls: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                targets: list[ast.expr] = []
                if isinstance(sub, ast.Assign):
                    targets = list(sub.targets)
                elif isinstance(sub, (ast.AugAssign, ast.AnnAssign)):
                    targets = [sub.target]
                for t in targets:
                    for leaf in ast.walk(t):
                        if (isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name)
                                and leaf.value.id == "self"):
                            names.add(leaf.attr)
    return names


def private_imports(tree: ast.Module, path: Path, src: Path) -> list[str]:
    """Private names (``_x``, not dunders, not private modules such as ``_torch``) this module
    imports from another module of the package."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level > 0:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
        elif (node.module or "").split(".")[0] == src.name:
            base = src.parent
        else:
            continue
        where = base.joinpath(*(node.module or "").split(".")) if node.module else base
        for alias in node.names:
            name = alias.name
            is_module = (where / f"{name}.py").exists() or (where / name / "__init__.py").exists()
            if name.startswith("_") and not name.startswith("__") and not is_module:
                found.append(f"{'.' * node.level}{node.module or ''} import {name}")
    return found


def probes(tree: ast.Module) -> int:
    return sum(1 for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
               and node.func.id in ("hasattr", "getattr"))


def static(src: Path) -> dict[str, object]:
    modules, classes, private, probe_count, total = {}, {}, [], 0, 0
    for path in sorted(src.rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        rel = str(path.relative_to(src.parent))
        modules[rel] = n = code_lines(text)
        total += n
        probe_count += probes(tree)
        private += [f"{rel}: {name}" for name in private_imports(tree, path, src)]
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[f"{rel}:{node.name}"] = len(class_attributes(node))
    return {"modules": modules, "classes": classes, "private": private, "probes": probe_count, "total": total}


def trace_one_batch(src: Path) -> tuple[set[str], set[str]]:
    """The (file:function) names one steady-state batch calls in the main process and in a worker."""
    sys.path.insert(0, str(src.parent))
    import conveyor  # noqa: PLC0415 - from SRC

    root = str(src.resolve())
    out_main: set[str] = set()

    def profiler(into: set[str]):  # noqa: ANN202
        def hook(frame, event, arg):  # noqa: ANN001, ANN202
            if event == "call" and frame.f_code.co_filename.startswith(root):
                into.add(f"{os.path.relpath(frame.f_code.co_filename, root)}:{frame.f_code.co_qualname}")
        return hook

    import tempfile
    import warnings

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a SlowSettingWarning: these batches are cheap on purpose)
        record = Path(tmp) / "worker.txt"
        ds = _Marked(str(record), root)
        loader = conveyor.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True, output="numpy")
        try:
            it = iter(loader)
            for _ in range(12):
                next(it)
            sys.setprofile(profiler(out_main))
            next(it)
            sys.setprofile(None)
            for _ in it:
                pass
        finally:
            sys.setprofile(None)
            loader.close()
        worker = set(record.read_text().split()) if record.exists() else set()
    return out_main, worker


class _Marked:
    """Samples 0..63; the worker that makes the batch starting at 40 records every conveyor
    function it calls until it starts the batch at 48 (that worker's next one)."""

    def __init__(self, record: str, root: str) -> None:
        self.record, self.root = record, root

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        import conveyor

        info = conveyor.get_worker_info()
        if info is not None and info.id == 0 and i == 40:
            seen: set[str] = set()
            root = self.root

            def hook(frame, event, arg):  # noqa: ANN001, ANN202
                if event == "call" and frame.f_code.co_filename.startswith(root):
                    seen.add(f"{os.path.relpath(frame.f_code.co_filename, root)}:{frame.f_code.co_qualname}")
            self._seen = seen
            sys.setprofile(hook)
        elif info is not None and info.id == 0 and i == 48 and hasattr(self, "_seen"):
            sys.setprofile(None)
            Path(self.record).write_text("\n".join(sorted(self._seen)))
        return i


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", nargs="?", default=str(Path(__file__).resolve().parent.parent / "src" / "conveyor"))
    p.add_argument("--no-trace", action="store_true", help="skip the one-batch trace (it starts workers)")
    args = p.parse_args()
    src = Path(args.src)
    fig = static(src)
    modules: dict[str, int] = fig["modules"]  # type: ignore[assignment]
    classes: dict[str, int] = fig["classes"]  # type: ignore[assignment]
    big = {m: n for m, n in modules.items() if n > MODULE_MAX}
    wide = {c: n for c, n in classes.items() if n > CLASS_MAX}
    print(f"modules: {len(modules)}, {fig['total']} code lines; largest "
          + ", ".join(f"{m} {n}" for m, n in Counter(modules).most_common(3)))
    print(f"  over {MODULE_MAX} code lines: {len(big)}" + (" (" + ", ".join(f"{m} {n}" for m, n in big.items()) + ")"
                                                          if big else ""))
    print(f"classes: {len(classes)}; widest " + ", ".join(f"{c} {n}" for c, n in Counter(classes).most_common(3)))
    print(f"  over {CLASS_MAX} attributes: {len(wide)}")
    private: list[str] = fig["private"]  # type: ignore[assignment]
    print(f"private names imported across modules: {len(private)}")
    for line in private[:20]:
        print(f"  {line}")
    print(f"hasattr/getattr calls: {fig['probes']} ({1000 * fig['probes'] / max(1, fig['total']):.1f} per 1,000 "
          "code lines)")
    if not args.no_trace:
        main_calls, worker_calls = trace_one_batch(src)
        both = main_calls | worker_calls
        files = {name.split(":")[0] for name in both}
        print(f"one batch (2 persistent fork workers, steady state): {len(main_calls)} functions in the main "
              f"process, {len(worker_calls)} in the worker; {len(both)} over {len(files)} files")
        print("  files: " + ", ".join(sorted(files)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

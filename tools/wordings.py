"""Offline: list the error wordings an installed torch can print, and which no rule of ours covers yet.

Not part of triage (nothing imports it at runtime). Run it against a torch
installation (a venv with an older torch gives that release's wordings):

    python3 tools/wordings.py                       # the importable torch
    python3 tools/wordings.py --torch-dir PATH      # a torch package folder, e.g. an unpacked wheel
    python3 tools/wordings.py --write corpus/wordings/torch-2.13.tsv

Two sources, each giving a message's fixed text with its variable parts as `{}`:
- the Python `raise` sites under torch/ (f-strings and `%`/`.format` templates, read from the AST);
- the C++ messages compiled into torch/lib/*.so (TORCH_CHECK, AT_ERROR, TORCH_CHECK_INDEX ...): their
  literal pieces, as the binary stores them (c10::str splits a message at each variable part).
Only messages that bear on a triage category are kept (CATEGORY_WORDS). A wording is covered when one of
the knowledge base's message patterns matches it (variable parts filled with a number), or one of a rule's
tested examples contains its fixed text.
"""

from __future__ import annotations

import argparse
import ast
import csv
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from triage.kb import load_knowledge_base  # noqa: E402  (the checkout's triage, not an installed one)

# A kept message names one of these; the category is the first that matches.
CATEGORY_WORDS = [
    ("shape", r"shapes? cannot be multiplied|size mismatch|must match the size|Expected size|expected input\[|"
              r"cannot be broadcast|invalid for input of size|shape '\[|Expected \d*D|Expected .*dimensional input"),
    ("device", r"same device|Expected all tensors to be on|device type|on the wrong device|found at least two devices"),
    ("dtype", r"scalar type|dtype|expected scalar|type Long|type Float|Double but found|result type"),
    ("index", r"out of bounds|index out of range|out of range in self|Target .* is out of|Class values must"),
    ("inplace", r"modified by an inplace|in-place operation|leaf Variable that requires grad|a view of a leaf"),
    ("autograd", r"backward through the graph|does not require grad|grad can be implicitly created|"
                 r"does not have a grad_fn|Can't call numpy\(\) on Tensor that requires grad"),
    ("nan", r"returned nan|NaN|non-finite|returned an invalid gradient"),
    ("oom", r"out of memory|DefaultCPUAllocator|not enough memory"),
    ("dataloader", r"DataLoader worker|collate|default_collate|stack expects each tensor|shared memory|"
                   r"Can't pickle|unable to write to file"),
    ("checkpoint", r"state_dict|Missing key|Unexpected key|weights_only|PytorchStreamReader|"
                   r"invalid load key|deserializ"),
    ("distributed", r"ProcessGroup|NCCL|Gloo|collective|process group|world_size|init_process_group"),
    ("compile", r"Dynamo|dynamo|Inductor|inductor|fullgraph|graph break"),
]
_CATEGORIES = [(name, re.compile(words)) for name, words in CATEGORY_WORDS]
# Python modules whose raise sites a training script's user meets; the rest (inductor's codegen, tests, export,
# quantization, the FX and JIT front ends) raise mostly to torch's own developers.
_USER_FACING = re.compile(r"torch/(nn|optim|utils/data|autograd|amp|cuda|_dynamo/(exc|eval_frame)|"
                          r"distributed/(distributed_c10d|elastic/multiprocessing/errors)|[^/]+\.py$)")
_PIECE = re.compile(rb"[\x20-\x7e]{24,}")


@dataclass
class Wording:
    """One message's fixed text, where it comes from, and the rules that cover it."""

    category: str
    text: str  # variable parts as {}
    source: str  # py:torch/nn/functional.py:3504 or so:libtorch_cpu.so
    covered_by: str = ""


def python_wordings(torch_dir: Path) -> list[tuple[str, str]]:
    """(text, source) for each `raise X(<text>)` under torch/ whose text is a literal or a template."""
    found = []
    for path in sorted(torch_dir.rglob("*.py")):
        if not _USER_FACING.match(path.relative_to(torch_dir.parent).as_posix()):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                text = _template(node.exc.args[0])
                if text:
                    found.append((text, f"py:{path.relative_to(torch_dir.parent).as_posix()}:{node.lineno}"))
    return found


def _template(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
        return _template(node.left) + ("" if isinstance(node.op, ast.Mod) else "{}")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return re.sub(r"\{[^{}]*\}", "{}", _template(node.func.value))
    return ""


def binary_wordings(torch_dir: Path) -> list[tuple[str, str]]:
    """(text, source) for each printable piece of the shared libraries that reads as a message."""
    found = []
    for library in sorted((torch_dir / "lib").glob("*.so*")):
        data = library.read_bytes()
        for piece in _PIECE.findall(data):
            text = piece.decode("ascii")
            if " " in text and text[0].isalpha() and "/" not in text[:20]:
                found.append((text.rstrip() + " {}" if text.endswith((" ", "(", "[")) else text, f"so:{library.name}"))
    return found


_NEUTRAL = "lorem ipsum dolor sit amet 1"


def specific_rules(kb) -> list:
    """The rules that name a cause: not a category's generic fallback, nor one whose patterns match any text
    (an exception-type rule such as python.key-error)."""
    return [rule for rule in kb.rules if not rule.id.endswith(".generic") and rule.confidence >= 0.6
            and not any(pattern.search(_NEUTRAL) for pattern in rule.messages)]


def covered(text: str, rules: list) -> str:
    """The rules whose message patterns match the wording (with numbers for its variable parts), or whose
    tested examples contain its fixed text."""
    filled = text.replace("{}", "1")
    fixed = max(text.split("{}"), key=len).strip()
    found = []
    for rule in rules:
        if any(pattern.search(filled) for pattern in rule.messages) or (
            len(fixed) >= 20 and any(fixed in example.log for example in rule.matches)
        ):
            found.append(rule.id)
    return " ".join(found)


def collect(torch_dir: Path) -> list[Wording]:
    rules = specific_rules(load_knowledge_base())
    seen: set[str] = set()
    wordings = []
    for text, source in python_wordings(torch_dir) + binary_wordings(torch_dir):
        text = " ".join(text.split())
        category = next((name for name, words in _CATEGORIES if words.search(text)), None)
        if category is None or text in seen:
            continue
        seen.add(text)
        wordings.append(Wording(category, text, source, covered(text, rules)))
    return sorted(wordings, key=lambda w: (w.category, w.text))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tools/wordings.py", description=__doc__.splitlines()[0])
    parser.add_argument("--torch-dir", type=Path, help="a torch package folder (default: the importable torch's)")
    parser.add_argument("--write", type=Path, metavar="TSV", help="write the table here")
    parser.add_argument("--uncovered", action="store_true", help="print the uncovered wordings")
    args = parser.parse_args(argv)
    torch_dir = args.torch_dir
    if torch_dir is None:
        import torch

        torch_dir = Path(torch.__file__).parent
    version = (torch_dir / "version.py").read_text() if (torch_dir / "version.py").is_file() else ""
    release = re.search(r"__version__\s*=\s*'([^']+)'", version)
    wordings = collect(torch_dir)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        with args.write.open("w", newline="", encoding="utf-8") as handle:
            out = csv.writer(handle, delimiter="\t", lineterminator="\n")
            out.writerow(["torch", "category", "covered_by", "source", "wording"])
            for w in wordings:
                out.writerow([release.group(1) if release else "?", w.category, w.covered_by, w.source, w.text])
    for name, _ in CATEGORY_WORDS:
        group = [w for w in wordings if w.category == name]
        print(f"{name:<12} {len(group):>5} wordings, {sum(bool(w.covered_by) for w in group):>4} covered by a rule")
        if args.uncovered:
            for w in group:
                if not w.covered_by:
                    print(f"    {w.text[:150]}   [{w.source}]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""python.torch-attribute-missing: `module 'torch...' has no attribute 'X'`, its cause chosen by the attribute's name
and the traceback's files, never by a base rate; its version tables checked against the installed torch."""

import importlib
import re

import pytest

from triage.kb import load_knowledge_base
from triage.kb.matcher import diagnose
from triage.logparse import parse_text

RULE_ID = "python.torch-attribute-missing"
KB = load_knowledge_base()
RULE = next(rule for rule in KB.rules if rule.id == RULE_ID)


def _resolve(dotted: str):
    """The object `torch.a.b.c` names, importing the longest importable module prefix first."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            value = getattr(value, name)
        return value
    raise ImportError(dotted)


def _diagnosis(log: str):
    found = [d for d in diagnose(parse_text(log), KB) if d.rule == RULE_ID]
    assert found, f"{RULE_ID} did not match:\n{log}"
    return found[0]


def test_every_attribute_the_added_table_names_exists_in_the_installed_torch():
    # torch 2.13 is newer than every release in the table: a name it lacks is a typo the rule would never match.
    added = RULE.tables["added"]
    assert len(added) >= 40
    missing = []
    for dotted in added:
        try:
            _resolve(dotted)
        except (ImportError, AttributeError):
            missing.append(dotted)
    assert missing == []
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", version) for version in added.values())


def test_every_attribute_the_removed_table_names_is_gone_from_the_installed_torch():
    removed = RULE.tables["removed"]
    assert removed and all(len(entry) == 2 for entry in removed.values())  # [replacement, when it went]
    for dotted in removed:
        module, _, attr = dotted.rpartition(".")
        assert not hasattr(importlib.import_module(module), attr), dotted


def test_no_cause_leans_on_a_base_rate():
    assert all(cause.base_rate is None for cause in RULE.causes)


@pytest.mark.parametrize(
    "log, cause, said",
    [
        # a release older than the attribute: the fix names the release to install
        ("AttributeError: module 'torch' has no attribute 'inference_mode'", "torch-older-than-code", "torch>=1.9.0"),
        (
            "  File \"/srv/app/model.py\", line 9, in forward\n"
            "    y = F.silu(x)\n"
            "AttributeError: module 'torch.nn.functional' has no attribute 'silu'",
            "torch-older-than-code",
            "torch>=1.7.0",
        ),
        # removed: the fix names the replacement API
        ("AttributeError: module 'torch' has no attribute 'is_deterministic'", "torch-newer-than-code",
         "torch.are_deterministic_algorithms_enabled()"),
        # a torch.py of the user's in the traceback, without Python's "partially initialized" wording
        (
            "Traceback (most recent call last):\n"
            "  File \"C:\\Users\\me\\demo\\train.py\", line 4, in <module>\n"
            "    x = torch.zeros(3)\n"
            "  File \"C:\\Users\\me\\demo\\torch.py\", line 1, in <module>\n"
            "    print('helpers')\n"
            "AttributeError: module 'torch' has no attribute 'zeros'",
            "local-file-shadows-torch",
            "Rename your torch.py",
        ),
        # an attribute every release has, no torch.py in sight: the install itself
        ("AttributeError: module 'torch' has no attribute 'Tensor'", "torch-import-incomplete", "pip uninstall -y torch"),
        # neither table knows it: Python's own suggestion is passed on
        (
            "AttributeError: module 'torch' has no attribute 'concatenat'. Did you mean: 'concatenate'?",
            "not-a-torch-attribute",
            "dir(torch)",
        ),
    ],
)
def test_the_attribute_and_the_files_choose_the_cause(log, cause, said):
    diagnosis = _diagnosis(log)
    assert diagnosis.cause == f"{RULE_ID}/{cause}"
    assert diagnosis.cause_basis == "evidence"
    assert said in diagnosis.fix
    assert "{{" not in diagnosis.hypothesis + diagnosis.fix  # rendered, not the raw template


def test_the_fallback_passes_on_python_s_suggestion():
    diagnosis = _diagnosis("AttributeError: module 'torch' has no attribute 'concatenat'. Did you mean: 'concatenate'?")
    assert "'concatenate'?" in diagnosis.hypothesis


@pytest.mark.parametrize(
    "log",
    [
        "AttributeError: module 'torch._C' has no attribute '_cuda_getDeviceCount'",
        "AttributeError: module 'torchvision.transforms' has no attribute 'v2'",
        "AttributeError: 'Tensor' object has no attribute 'compile'",
    ],
)
def test_other_modules_and_objects_are_left_to_other_rules(log):
    assert RULE_ID not in [d.rule for d in diagnose(parse_text(log), KB)]

"""Kinds of paste batch4's first look found the parser and rules missing, each tested on a variant written for the
test (the batch4 logs themselves stay a held-out measure, scored by `triage eval`)."""

import pytest
from conftest import ROOT

from triage.explain import explain_log
from triage.kb import load_knowledge_base
from triage.logparse import parse_text

# Windows' spawn start method: the parent fails to pickle the worker's state, and the child it had started dies
# reading nothing (`EOFError: Ran out of input`); PyCharm prints `python-BaseException` under each traceback.
SPAWN_PARENT = """Traceback (most recent call last):
  File "C:\\Users\\me\\envs\\t\\lib\\multiprocessing\\popen_spawn_win32.py", line 65, in __init__
    reduction.dump(process_obj, to_child)
  File "C:\\Users\\me\\envs\\t\\lib\\multiprocessing\\reduction.py", line 60, in dump
    ForkingPickler(file, protocol).dump(obj)
{error}
python-BaseException
"""
SPAWN_CHILD = """Traceback (most recent call last):
  File "<string>", line 1, in <module>
  File "C:\\Users\\me\\envs\\t\\lib\\multiprocessing\\spawn.py", line 115, in _main
    self = pickle.load(from_parent)
EOFError: Ran out of input
python-BaseException
"""


@pytest.fixture(scope="module")
def kb():
    return load_knowledge_base(env={}, cwd=ROOT)


def explain_text(text, kb, tmp_path):
    path = tmp_path / "pasted.log"
    path.write_text(text)
    return explain_log(str(path), kb)


def test_pycharms_marker_line_is_not_part_of_the_message():
    incident = parse_text(SPAWN_PARENT.format(error="TypeError: can't pickle _thread.lock objects") + SPAWN_CHILD)
    assert [(e.type, e.message) for e in incident.exceptions] == [
        ("TypeError", "can't pickle _thread.lock objects"), ("EOFError", "Ran out of input")]


@pytest.mark.parametrize("error", [
    "TypeError: can't pickle _thread.lock objects",  # Python 3.7's wording
    "TypeError: cannot pickle 'Environment' object",  # 3.8+
])  # fmt: skip
def test_the_parents_pickling_error_leads_and_the_childs_echo_is_no_checkpoint(error, kb, tmp_path):
    report = explain_text(SPAWN_PARENT.format(error=error) + SPAWN_CHILD, kb, tmp_path)
    assert report.diagnoses[0].rule == "dataloader.spawn-unpicklable-object"
    assert report.incident.exception.short_type == "TypeError"
    assert not any(d.rule.startswith("checkpoint.") for d in report.diagnoses)


def test_an_echo_beside_an_error_no_rule_knows_is_still_no_checkpoint(kb, tmp_path):
    # the parent's error has no PyTorch rule: the fallback that looks for a known message elsewhere must not take
    # the child's "Ran out of input" for a truncated checkpoint
    error = "RecursionError: maximum recursion depth exceeded while pickling an object"
    report = explain_text(SPAWN_PARENT.format(error=error) + SPAWN_CHILD, kb, tmp_path)
    assert report.incident.exception.short_type == "RecursionError"
    assert not any(d.rule.startswith("checkpoint.") for d in report.diagnoses)


@pytest.mark.parametrize("text", [
    # the key lists run onto the header's line: an issue title, a paste whose newlines and tabs were collapsed
    'RuntimeError: Error(s) in loading state_dict for Decoder: Missing key(s) in state_dict: "encoder.fc.weight", '
    '"encoder.fc.bias". Unexpected key(s) in state_dict: "backbone.fc.weight", "backbone.fc.bias".',
    '`RuntimeError: Error(s) in loading state_dict for Decoder: \tMissing key(s) in state_dict: "encoder.fc.weight", '
    '"encoder.fc.bias".  \tUnexpected key(s) in state_dict: "backbone.fc.weight", "backbone.fc.bias". `',
])  # fmt: skip
def test_a_state_dict_error_on_one_line_reads_both_key_lists(text, kb, tmp_path):
    report = explain_text(text + "\n", kb, tmp_path)
    lead = report.diagnoses[0]
    assert lead.rule == "checkpoint.missing-unexpected-keys"
    assert (lead.values["missing"], lead.values["unexpected"]) == ("encoder.fc.weight", "backbone.fc.weight")
    assert lead.cause == "checkpoint.missing-unexpected-keys/renamed-submodule"


def test_a_loss_guard_names_the_loss_terms_that_are_not_finite(kb, tmp_path):
    # detectron2's check prints the step's loss dict, wrapped by the terminal (variant of detectron2#214's form)
    text = ("FloatingPointError: Loss became infinite or NaN at iteration=112!\n"
            "loss_dict = {'loss_cls': tensor(0.6931, device='cuda:0', grad_fn=<NllLossBackward0>), 'loss_box_reg': \n"
            "tensor(inf, device='cuda:0', grad_fn=<DivBackward0>), 'loss_rpn_cls': tensor(nan, device='cuda:0',\n"
            "grad_fn=<MulBackward0>)}\n")
    lead = explain_text(text, kb, tmp_path).diagnoses[0]
    assert lead.rule == "nan.loss-guard-raised"
    # the message names both "infinite or NaN": which one it was is not claimed
    assert "is not finite at iteration 112" in lead.title
    assert "not finite: loss_box_reg = inf, loss_rpn_cls = nan (any other" in lead.hypothesis
    assert "loss_cls =" not in lead.hypothesis

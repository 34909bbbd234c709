"""The corpus is the scoreboard: explain's accuracy on corpus/logs never drops below the committed figures."""

import yaml
from conftest import ROOT

from triage.evaluate import evaluate_logs, format_table, score
from triage.kb import load_knowledge_base


def test_log_accuracy_holds_the_committed_line():
    floor = yaml.safe_load((ROOT / "corpus" / "scoreboard.yaml").read_text())["logs"]
    results = evaluate_logs(ROOT / "corpus" / "logs", load_knowledge_base(env={}, cwd=ROOT))
    figures = score(results)
    table = format_table(results)
    assert figures.cases >= floor["min_cases"], table
    assert figures.top1 >= floor["top1"], table
    assert figures.top3 >= floor["top3"], table
    assert figures.rule_top1 >= floor["rule_top1"], table
    assert figures.facts >= floor["facts"], table
    assert figures.python_negatives_misread <= floor["python_negatives_misread"], table

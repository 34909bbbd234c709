"""Base rates: a cause's `base_rate` is recounted from its frozen sample of resolved public reports, and that
sample shares no thread with the logs we score (a base rate tuned on the scored logs would grade itself)."""

from collections import Counter
from pathlib import Path

import pytest
import yaml

from triage.kb import load_paths

ROOT = Path(__file__).resolve().parent.parent
PRIORS = ROOT / "corpus" / "priors"
KB = load_paths([ROOT / "knowledge_base"])
RATED = {rule.id: cause for rule in KB.rules for cause in rule.causes if cause.base_rate}
POPULATION_RATED = {f"{rule.id}/{cause.id}": cause for rule in KB.rules for cause in rule.causes if cause.population_rate}
MIN_SAMPLE = 10
MIN_SHARE = 0.4
MIN_LEAD = 2  # threads ahead of the next cause: a 10-to-9 split names no commonest cause


def scored_sources() -> set[str]:
    sources = set()
    for path in [*(ROOT / "corpus" / "logs").rglob("expected.yaml"), *(ROOT / "corpus" / "logs-fresh").rglob("expected.yaml")]:
        for label in (yaml.safe_load(path.read_text()) or {}).values():
            if isinstance(label, dict) and label.get("source"):
                sources.add(normalise(label["source"]))
    return sources


def normalise(url: str) -> str:
    return url.strip().split("#")[0].rstrip("/").lower()


def sample_problems(rule_id: str, sample: dict, base_rate: tuple[int, int] | None, cause_id: str | None,
                    scored: set[str]) -> list[str]:
    """What is wrong with a rule's sample and the base rate it claims, in words."""
    problems = []
    if sample.get("rule") != rule_id:
        problems.append(f"the sample is for {sample.get('rule')!r}")
    threads = sample.get("threads") or []
    sources = [normalise(t.get("source", "")) for t in threads]
    if any(not s.startswith("https://") for s in sources):
        problems.append("a thread without an https source")
    if len(set(sources)) != len(sources):
        problems.append("a thread counted twice")
    if overlap := sorted(set(sources) & scored):
        problems.append(f"threads also in the scored logs: {overlap}")
    causes = Counter(t.get("cause_id") for t in threads)
    if any(not str(c).startswith(rule_id + "/") for c in causes):
        problems.append(f"a cause_id outside {rule_id}: {sorted(map(str, causes))}")
    if any(not t.get("resolution") for t in threads):
        problems.append("a thread without the resolution that names its cause")
    if base_rate is not None:
        top = causes.most_common(2)
        seen = causes[cause_id]
        if base_rate != (seen, len(threads)):
            problems.append(f"base_rate says {base_rate[0]} of {base_rate[1]}, the sample has {seen} of {len(threads)}")
        if len(threads) < MIN_SAMPLE:
            problems.append(f"{len(threads)} threads: fewer than {MIN_SAMPLE}")
        if top[0][0] != cause_id or (len(top) > 1 and top[1][1] > seen - MIN_LEAD):
            problems.append(f"{cause_id} is not the sample's clear plurality ({MIN_LEAD} threads ahead): {top}")
        if seen / max(len(threads), 1) < MIN_SHARE:
            problems.append(f"{cause_id} is {seen} of {len(threads)}, under {MIN_SHARE:.0%}")
    return problems


@pytest.mark.parametrize("rule_id", sorted(RATED) or ["(none)"])
def test_each_base_rate_is_the_plurality_of_an_independent_sample(rule_id):
    if rule_id == "(none)":
        pytest.skip("no rule has a base rate yet")
    cause = RATED[rule_id]
    path = PRIORS / f"{rule_id}.yaml"
    assert path.is_file(), f"{rule_id}/{cause.id} has a base_rate but no sample at {path}"
    sample = yaml.safe_load(path.read_text())
    assert sample_problems(rule_id, sample, cause.base_rate, f"{rule_id}/{cause.id}", scored_sources()) == []


@pytest.mark.parametrize("cause_id", sorted(POPULATION_RATED) or ["(none)"])
def test_each_population_rate_is_the_plurality_of_its_populations_sample(cause_id):
    """A population's sample (corpus/priors/<rule>+<population>.yaml) may serve sibling rules (one failure's 1.x and
    2.x wordings): the cause is then counted under the sample's rule, by its slug."""
    if cause_id == "(none)":
        pytest.skip("no rule has a population rate yet")
    rate = POPULATION_RATED[cause_id].population_rate
    path = PRIORS / f"{rate.sample}.yaml"
    assert path.is_file(), f"{cause_id} has a population_rate but no sample at {path}"
    sample = yaml.safe_load(path.read_text())
    assert (sample.get("population") or {}).get("name") == rate.population
    sampled_rule = sample.get("rule")
    counted = f"{sampled_rule}/{cause_id.rsplit('/', 1)[1]}"
    assert sample_problems(sampled_rule, sample, (rate.seen, rate.of), counted, scored_sources()) == []


@pytest.mark.parametrize("path", sorted(PRIORS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_sample_is_well_formed_even_without_a_base_rate(path):
    rule_ids = {rule.id for rule in KB.rules}
    rule_id, _, population = path.stem.partition("+")
    assert rule_id in rule_ids, f"{path.name}: no rule {rule_id}"
    sample = yaml.safe_load(path.read_text())
    assert sample.get("message") and sample.get("gathered"), "say which wording was sampled, and how"
    if population:
        # a population's sample says what puts a report in it, and, for each thread, why it is in
        assert (sample.get("population") or {}).get("name") == population and sample["population"].get("fact")
        assert all(thread.get("member") for thread in sample.get("threads") or [])
    assert sample_problems(rule_id, sample, None, None, scored_sources()) == []


def test_the_check_catches_a_miscount_a_shared_thread_and_a_minority_pick():
    rule = "index.embedding-out-of-range"
    threads = [{"source": f"https://github.com/o/r/issues/{n}", "cause_id": f"{rule}/{'a' if n < 4 else 'b'}",
                "resolution": "x"} for n in range(11)]
    sample = {"rule": rule, "threads": threads}
    assert sample_problems(rule, sample, (7, 11), f"{rule}/b", set()) == []
    assert any("the sample has 7 of 11" in p for p in sample_problems(rule, sample, (8, 11), f"{rule}/b", set()))
    assert any("not the sample's clear plurality" in p for p in sample_problems(rule, sample, (4, 11), f"{rule}/a", set()))
    near_tie = [{**t, "cause_id": f"{rule}/{'a' if n < 5 else 'b'}"} for n, t in enumerate(threads[:10])]
    assert any("not the sample's clear plurality" in p
               for p in sample_problems(rule, {"rule": rule, "threads": near_tie}, (5, 10), f"{rule}/a", set()))
    assert any("also in the scored logs" in p
               for p in sample_problems(rule, sample, (7, 11), f"{rule}/b", {"https://github.com/o/r/issues/3"}))

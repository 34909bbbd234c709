"""Experiments run in a disposable child: real scripts with side effects in the code the probes replay, run under
plain `python` and under `python -m triage`. Every side effect happens as often under triage as under python, the
real parameters and gradients keep their values, and the exit status is python's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import triage_env
from triage.probes import sandbox

HEADER = '''
import atexit, functools, hashlib, logging, os, subprocess, sys
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
SIDE = os.path.join(HERE, "side.txt")


def side(text):
    with open(SIDE, "a") as f:
        f.write(text + "\\n")


def digest(*modules):
    h = hashlib.sha256()
    for module in modules:
        for p in module.parameters():
            h.update(p.detach().numpy().tobytes())
            h.update(b"none" if p.grad is None else p.grad.numpy().tobytes())
    return h.hexdigest()


torch.manual_seed(0)
'''

SCRIPTS = {
    # shape_trace and cpu_rerun replay a forward that appends to a file before it fails.
    "forward_append": '''
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(32, 2)

    def forward(self, x):
        side("forward")
        return self.fc2(self.fc1(x))

loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 8), torch.zeros(8).long()),
                                     batch_size=4)
model = Net()
for x, y in loader:
    nn.functional.cross_entropy(model(x), y).backward()
''',
    # workers0_rerun fetches the samples again in the main process: __getitem__ appends, and the last one fails.
    "getitem_append": '''
class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        side(f"getitem {index}")
        if index == 3:
            raise KeyError(index)
        return torch.randn(2)

if __name__ == "__main__":
    for batch in torch.utils.data.DataLoader(Data(), batch_size=1, num_workers=1):
        pass
''',
    # anomaly_rerun replays the loop's statements: a logger with a FileHandler, a subprocess, a closure over a
    # module, a bound method and a functools.partial, all in the failing step.
    "step_effects": '''
logging.basicConfig(filename=os.path.join(HERE, "train.log"), level=logging.INFO, format="%(message)s")
log = logging.getLogger("train")
head = nn.Linear(4, 1)
encoder = nn.Linear(3, 4)
judge = nn.Linear(4, 1)


def make_loss(module):
    def loss(features):
        return module(features).sum()
    return loss


class Trainer:
    def __init__(self, module):
        self.module = module

    def score(self, features):
        return self.module(features).sum()


def weighted(module, scale, features):
    return scale * module(features).sum()


closure_loss, trainer = make_loss(head), Trainer(judge)
partial_loss = functools.partial(weighted, nn.Linear(4, 1), 0.5)
atexit.register(lambda: side("hash " + digest(head, encoder, judge)))
for step, x in enumerate([torch.randn(2, 3)]):
    features = torch.sigmoid(encoder(x))
    log.info("step %d", step)
    if os.environ.get("NOTIFY", "1") == "1":
        subprocess.check_call([sys.executable, "-c", "open(%r, 'a').write('notified\\\\n')" % SIDE])
    features.mul_(2)
    loss = closure_loss(features) + trainer.score(features) + partial_loss(features)
    loss.backward()
''',
    # A forward that ends the process the second time it runs: only the replay reaches os._exit(0).
    "exit_in_replay": '''
CALLS = [0]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        side("forward")
        CALLS[0] += 1
        if CALLS[0] > 1:
            os._exit(0)
        return self.fc(x)

loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 5)), batch_size=4)
for (x,) in loader:
    Net()(x)
''',
}


def _run(tmp_path: Path, name: str, under_triage: bool, **env: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    folder = tmp_path / ("under_triage" if under_triage else "under_python")  # no "/triage/": not user code
    folder.mkdir()
    script = folder / f"{name}.py"
    script.write_text(textwrap.dedent(HEADER) + textwrap.dedent(SCRIPTS[name]))
    command = [sys.executable, "-m", "triage", "--report-dir", str(folder / "report"), str(script)] if under_triage \
        else [sys.executable, str(script)]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=triage_env(**env), timeout=180)
    effects = {p.name: p.read_text() for p in folder.iterdir() if p.suffix in (".txt", ".log")}
    return done, effects


def _report(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "under_triage" / "report" / "report.json").read_text())


def _probes(report: dict) -> dict[str, str]:
    return {p["name"]: p["status"] for d in report["diagnoses"] for p in d["probes"]}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_side_effects_happen_as_often_under_triage_as_under_python(tmp_path, name):
    python, python_effects = _run(tmp_path, name, under_triage=False)
    triaged, triage_effects = _run(tmp_path, name, under_triage=True)
    assert triaged.returncode == python.returncode == 1, triaged.stderr[-2000:]
    assert triage_effects == python_effects, triaged.stderr[-3000:]
    assert python_effects, "the script wrote nothing: the test would prove nothing"
    report = _report(tmp_path)
    assert report["incident"]["exit_code"] == 1
    probes = _probes(report)
    assert probes, "no experiment ran"
    assert "error" not in probes.values(), [(p["name"], p["detail"]) for d in report["diagnoses"]
                                            for p in d["probes"]]
    if name == "step_effects":  # the replay stopped where the step starts a subprocess, and says so
        anomaly = [p for d in report["diagnoses"] for p in d["probes"] if p["name"] == "anomaly_rerun"]
        assert "refused to start a subprocess" in anomaly[0]["detail"]
    if name == "exit_in_replay":
        replays = [p for d in report["diagnoses"] for p in d["probes"] if "refused" in p.get("facts", {})]
        assert replays and "end the process (os._exit(0))" in replays[0]["facts"]["refused"]


def test_the_step_with_side_effects_is_still_replayed_and_confirmed(tmp_path):
    """Without the subprocess, the logger's line, the closure, the bound method and the partial run in the replay."""
    _, python_effects = _run(tmp_path, "step_effects", under_triage=False, NOTIFY="0")
    _, triage_effects = _run(tmp_path, "step_effects", under_triage=True, NOTIFY="0")
    assert triage_effects == python_effects  # one log line; the same parameters and gradients at exit
    assert python_effects["train.log"] == "step 0\n" and python_effects["side.txt"].startswith("hash ")
    anomaly = [p for d in _report(tmp_path)["diagnoses"] for p in d["probes"] if p["name"] == "anomaly_rerun"]
    assert anomaly and anomaly[0]["status"] == "confirmed", anomaly
    assert "`features.mul_(2)`" in anomaly[0]["detail"]


def test_a_child_past_its_time_limit_is_killed_and_says_where_it_was():
    started = time.monotonic()
    outcome = sandbox.run(lambda: time.sleep(30), 0.3)
    assert time.monotonic() - started < 3
    assert outcome.stopped == "time"
    assert any(frame.name == "<lambda>" and frame.filename == __file__ for frame in outcome.stack)


def test_a_child_over_its_memory_budget_is_inconclusive_not_a_crash():
    import torch

    outcome = sandbox.run(lambda: torch.ones(2**31, dtype=torch.uint8).sum().item(), 20, memory_bytes=2**28)
    assert outcome.stopped == "memory" and "memory budget of 0.2 GB" in outcome.reason


def test_the_child_refuses_what_would_reach_outside(tmp_path):
    import socket

    target = tmp_path / "made.txt"

    def attempts():
        results = {}
        for label, action in [("subprocess", lambda: subprocess.run(["true"])), ("fork", os.fork),
                              ("kill", lambda: os.kill(os.getppid(), 0)), ("exit", lambda: os._exit(3)),
                              ("remove", lambda: os.remove(str(tmp_path))),
                              ("connect", lambda: socket.create_connection(("127.0.0.1", 9), timeout=1))]:
            try:
                action()
                results[label] = "allowed"
            except PermissionError as exc:
                results[label] = "refused" if "triage's experiment refused" in str(exc) else str(exc)
        with open(target, "w") as f:  # goes to the child's shadow copy
            f.write("x")
        print("to the captured stdout")
        return results

    outcome = sandbox.run(attempts, 20)
    assert outcome.value == dict.fromkeys(["subprocess", "fork", "kill", "exit", "remove", "connect"], "refused")
    assert not target.exists() and outcome.redirected == [str(target)]
    assert outcome.stdout == "to the captured stdout\n"


def test_an_open_file_of_the_parent_keeps_its_offset_and_its_contents(tmp_path):
    data, log = tmp_path / "data.bin", tmp_path / "log.txt"
    data.write_bytes(bytes(range(100)))
    reader, writer = open(data, "rb"), open(log, "a")
    reader.read(10)
    writer.write("buffered in the parent\n")  # not yet flushed when the child is forked

    def use_them():
        reader.seek(50)
        writer.write("from the child\n")
        writer.flush()
        return reader.read(1)

    outcome = sandbox.run(use_them, 20)
    assert outcome.value == bytes([50])
    assert reader.read(1) == bytes([10])  # the parent's position did not move
    writer.close()
    assert log.read_text() == "buffered in the parent\n"
    reader.close()


def test_the_child_runs_no_atexit_handler_and_writes_none_of_the_parents_buffered_output(tmp_path):
    marks = tmp_path / "atexit.txt"
    code = textwrap.dedent(f'''
        import atexit, sys
        from triage.probes import sandbox

        atexit.register(lambda: open({str(marks)!r}, "a").write("atexit\\n"))
        sys.stdout.write("pending in the parent's buffer\\n")  # a pipe: block-buffered, not yet written
        outcome = sandbox.run(lambda: print("from the child") or 7, 20)
        sys.stdout.write(f"{{outcome.value}} {{outcome.stdout!r}}\\n")
    ''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=triage_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "pending in the parent's buffer\n7 'from the child\\n'\n"
    assert marks.read_text() == "atexit\n"


def test_without_fork_experiments_that_run_user_code_are_skipped_with_a_reason(monkeypatch):
    from _probe_fixtures import diagnosis
    from triage.incident import Incident
    from triage.probes.context import ProbeContext
    from triage.probes.runner import run_probes

    monkeypatch.setattr(sandbox, "fork_available", lambda: False)
    d = diagnosis("shape", "shape_trace", "device_census")
    run_probes([d], ProbeContext(incident=Incident(source="run")))
    shape, census = d.probes
    assert shape.status == "skipped" and "need fork" in shape.detail
    assert census.status == "skipped" and "no live model" in census.detail  # runs here: it reads metadata only


def test_a_batch_in_shared_memory_is_copied_before_the_replay_writes_to_it():
    """Fork does not isolate shared memory (a DataLoader worker's batch lives there): the replay gets its own copy."""
    import torch
    from torch import nn

    from _probe_fixtures import diagnosis, isolated, live_context, raised
    from triage.probes.cpu_rerun import cpu_rerun

    class Doubling(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            x.mul_(2)
            return self.fc(x)

    model, batch = Doubling(), torch.ones(4, 5).share_memory_()
    exc = raised(model, batch)
    seen = batch.clone()
    ctx = live_context(exc, model=model, batch=(batch,))
    ctx.diagnosis = diagnosis("shape")
    outcome = isolated(cpu_rerun, ctx)
    assert outcome.status == "confirmed", outcome.detail
    assert torch.equal(batch, seen)  # python's one doubling, not a second one from the replay


def test_relative_paths_in_the_child_read_the_runs_files_and_writes_stay_in_the_child(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.csv").write_text("a,b\n1,2\n")
    (tmp_path / "log.txt").write_text("before\n")
    monkeypatch.chdir(tmp_path)

    def relative_io():
        with open("log.txt", "a") as f:  # an existing file of the run: its write goes to the shadow copy
            f.write("from the child\n")
        with open("made.txt", "w") as f:  # a new relative file: made in the child's own folder
            f.write("x")
        return open("data/train.csv").read(), os.path.exists("data/train.csv"), sorted(os.listdir("data"))

    outcome = sandbox.run(relative_io, 20)
    assert outcome.value == ("a,b\n1,2\n", True, ["train.csv"])
    assert (tmp_path / "log.txt").read_text() == "before\n" and not (tmp_path / "made.txt").exists()
    assert outcome.redirected == [str(tmp_path / "log.txt")]


def test_garbage_inherited_from_the_run_is_not_finalized_in_the_child():
    # A finalizer of the run's objects would act on the run's resources from the child, and one that raises is
    # reported through the run's unraisable hook (a test runner's formats a traceback, whose ast.parse inside
    # another parse's tree-building broke CPython 3.11's AST builder in CI: "recursion depth mismatch").
    import gc

    finalized: list[str] = []

    class Leftover:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector frees it

        def __del__(self) -> None:
            finalized.append("in the child")

    def experiment():
        gc.set_threshold(1)  # a collection at the next allocations, if collection were on
        made = [[n] for n in range(10_000)]
        return len(made), list(finalized), gc.isenabled(), sys.unraisablehook is sys.__unraisablehook__

    previous = gc.get_threshold()
    gc.set_threshold(10**6)  # keep the leftover alive in the parent until the fork
    try:
        Leftover()
        outcome = sandbox.run(experiment, 20)
    finally:
        gc.set_threshold(*previous)
        gc.collect()
    assert outcome.error is None, outcome.error
    assert outcome.value == (10_000, [], False, True)

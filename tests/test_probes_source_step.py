"""The failing step replayed from the user's source: loops that feed tensors without a DataLoader and fail outside
any model call (in backward(), a NaN guard), so that only the loop's own statements say what the step was."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest
import torch

from _probe_fixtures import StateGuard, diagnosis, isolated, live_context, raised
from triage.probes import source_step
from triage.probes._support import Unavailable
from triage.probes.anomaly_rerun import anomaly_rerun
from triage.probes.save_batch import save_batch
from triage.replay import ReplayError, load_replay, rerun_commands

SCRIPT = '''
import torch
from torch import nn

HEAD = nn.Linear(8, 1)


def build():
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(4, 8), nn.Sigmoid())
    params = [*encoder.parameters(), *HEAD.parameters()]
    return encoder, torch.optim.Adam(params, lr=1e-2)


def loss_of(features, y):
    return ((HEAD(features) - y) ** 2).mean()


def train(encoder, optimizer, data, history, fail_at):
    for step, (x, y) in enumerate(data):
        noise = torch.randn_like(x)
        features = encoder(x + 0.01 * noise)
        if step == fail_at:
            features.mul_(2)
        loss = loss_of(features, y)
        history.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def gan(discriminator, optimizer_d, data):
    for real in data:
        score = discriminator(real)
        optimizer_d.zero_grad()
        score.mean().backward(retain_graph=True)
        optimizer_d.step()
        (-score.mean()).backward()


def recurrent(cell, data):
    h = torch.zeros(1, 4)
    for x in data:
        h = cell(x, h)
        h.sum().backward()


class Holder:
    def __init__(self, model):
        self.model = model


def held(holder, data):
    for x in data:
        scale = 2.0
        gate = torch.sigmoid(holder.model(x))
        gate.mul_(scale)
        gate.sum().backward()


def watched(encoder, data, on_step):
    for x in data:
        loss = encoder(x).sum()
        on_step()
'''


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train_loop.py"
    path.write_text(textwrap.dedent(SCRIPT))
    spec = importlib.util.spec_from_file_location("train_loop", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_loop"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("train_loop", None)


def _line(module, text: str) -> int:
    lines = open(module.__file__).read().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _data(steps=4):
    torch.manual_seed(1)
    return [(torch.randn(5, 4), torch.randn(5, 1)) for _ in range(steps)]


def test_anomaly_rerun_replays_the_loop_statements_on_copies_and_names_the_in_place_line(script, tmp_path):
    encoder, optimizer = script.build()
    history: list[float] = []
    exc = raised(script.train, encoder, optimizer, _data(), history, fail_at=2)
    assert "modified by an inplace operation" in str(exc)
    guard = StateGuard(encoder, script.HEAD, optimizer=optimizer, folder=tmp_path)
    logged = list(history)
    ctx = live_context(exc)
    assert ctx.batch is None and ctx.model_args is None  # no DataLoader, and the failure is in backward()
    ctx.diagnosis = diagnosis("inplace", "anomaly_rerun")

    outcome = isolated(anomaly_rerun, ctx)

    assert outcome.status == "confirmed", outcome.detail
    assert f"train_loop.py:{_line(script, 'features.mul_(2)')}: `features.mul_(2)`" in outcome.detail
    assert f"replayed the step at {script.__file__}:{_line(script, 'features = encoder(')}-" \
           f"{_line(script, 'loss.backward()')}" in outcome.detail
    guard.assert_unchanged()  # the encoder, HEAD (reached through loss_of's globals), Adam's state, RNG
    assert history == logged  # the replayed history.append wrote to a copy


def test_a_global_of_another_user_file_reached_through_its_function_is_copied_too(tmp_path, monkeypatch):
    (tmp_path / "heads.py").write_text(textwrap.dedent('''
        from torch import nn

        HEAD = nn.Linear(3, 1)


        def loss_of(features):
            return HEAD(features).sum()
    '''))
    path = tmp_path / "train_split.py"
    path.write_text(textwrap.dedent('''
        import torch
        from heads import loss_of

        def train(encoder, data):
            for x in data:
                features = torch.sigmoid(encoder(x))
                features.mul_(2)
                loss_of(features).backward()
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "heads", raising=False)
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    heads = sys.modules["heads"]
    encoder = torch.nn.Linear(2, 3)
    exc = raised(namespace["train"], encoder, [torch.randn(4, 2)])
    heads.HEAD.zero_grad(set_to_none=True)  # the failed backward reached HEAD before the in-place check
    guard = StateGuard(encoder, heads.HEAD, folder=tmp_path)
    ctx = live_context(exc)
    ctx.diagnosis = diagnosis("inplace", "anomaly_rerun")

    outcome = isolated(anomaly_rerun, ctx)

    assert outcome.status == "confirmed", outcome.detail
    assert "`features.mul_(2)`" in outcome.detail
    guard.assert_unchanged()  # HEAD lives in heads.py's globals: the replay's loss_of read a copy of it


def test_steps_that_reach_global_modules_through_methods_are_replayed_in_the_child(tmp_path):
    """A method that reads a global module, a module's forward that does, a user object held by another: the replay
    runs them all, and the real modules keep their parameters and gradients (the child owns its own)."""
    path = tmp_path / "scored.py"
    path.write_text(textwrap.dedent('''
        import torch
        from torch import nn

        HEAD = nn.Linear(2, 1)


        class Judge:
            def score(self, features):
                return HEAD(features).sum()


        def run_score(judge, model, data):
            for x in data:
                features = torch.sigmoid(model(x))
                features.mul_(2)
                judge.score(features).backward()


        class Trainer:
            def __init__(self, model):
                self.model, self.judge = model, Judge()

            def loss(self, x):
                features = torch.sigmoid(self.model(x))
                return self.judge.score(features)


        def run_trainer(trainer, data):
            for x in data:
                loss = trainer.loss(x)
                loss.backward()
                loss.backward()


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Linear(2, 2)

            def forward(self, x):
                return HEAD(torch.sigmoid(self.body(x)))


        def run_net(net, data):
            for x in data:
                out = net(x)
                out.sum().backward()
                out.sum().backward()
    '''))
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    model, net = torch.nn.Linear(2, 2), namespace["Net"]()
    cases = [(namespace["run_score"], (namespace["Judge"](), model, [torch.randn(3, 2)]), "inplace"),
             (namespace["run_trainer"], (namespace["Trainer"](model), [torch.randn(3, 2)]), "autograd"),
             (namespace["run_net"], (net, [torch.randn(3, 2)]), "autograd")]
    for function, args, category in cases:
        exc = raised(function, *args)
        guard = StateGuard(model, net, namespace["HEAD"], folder=tmp_path)
        ctx = live_context(exc)
        ctx.diagnosis = diagnosis(category, "anomaly_rerun")
        outcome = isolated(anomaly_rerun, ctx)
        assert outcome.status == "confirmed", (function.__name__, outcome.detail)
        guard.assert_unchanged()


def test_an_optimizer_step_between_two_backward_passes_is_named_as_a_parameter_update(script, tmp_path):
    torch.manual_seed(0)
    discriminator = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(discriminator.parameters(), lr=0.1)
    exc = raised(script.gan, discriminator, optimizer, [torch.randn(6, 4)])
    guard = StateGuard(discriminator, optimizer=optimizer, folder=tmp_path)
    ctx = live_context(exc)
    ctx.diagnosis = diagnosis("inplace", "anomaly_rerun")

    outcome = isolated(anomaly_rerun, ctx)

    assert outcome.status == "confirmed", outcome.detail
    assert f"train_loop.py:{_line(script, 'optimizer_d.step()')}: `optimizer_d.step()` updated the parameter " \
           f"discriminator.1.weight [1, 3]" in outcome.detail
    guard.assert_unchanged()


def test_a_model_reached_through_an_object_of_a_user_class_is_copied_too(script, tmp_path):
    holder = script.Holder(torch.nn.Linear(3, 3))
    exc = raised(script.held, holder, [torch.randn(2, 3)])
    guard = StateGuard(holder.model, folder=tmp_path)
    ctx = live_context(exc)
    ctx.diagnosis = diagnosis("inplace", "anomaly_rerun")
    step = source_step.find(ctx.frames)
    assert step.lines[0] == _line(script, "gate = torch.sigmoid(holder.model(x))")  # `scale = 2.0` is not re-run

    outcome = isolated(anomaly_rerun, ctx)

    assert outcome.status == "confirmed", outcome.detail
    assert "`gate.mul_(scale)`" in outcome.detail
    guard.assert_unchanged()


def test_a_value_the_loop_carries_from_the_previous_step_cannot_be_replayed(script):
    cell = torch.nn.RNNCell(3, 4)
    exc = raised(script.recurrent, cell, [torch.randn(1, 3) for _ in range(3)])
    assert "backward through the graph a second time" in str(exc)
    with pytest.raises(Unavailable, match="reads h before it rebinds it"):
        source_step.find(source_step.user_frames(exc))


def test_an_incident_found_by_a_hook_reads_the_step_from_the_running_stack(script):
    encoder, _ = script.build()
    data = [torch.randn(2, 4) for _ in range(2)]
    found = []
    script.watched(encoder, data, lambda: found.append(source_step.find(source_step.user_frames(None))))
    step = found[-1]
    assert step.lines == (_line(script, "loss = encoder(x).sum()"), _line(script, "on_step()"))
    assert list(step.inputs()) == ["x"] and step.inputs()["x"] is data[-1]  # the running iteration's own tensor


def test_save_batch_keeps_the_steps_tensors_where_no_dataloader_gave_a_batch(script, tmp_path):
    encoder, optimizer = script.build()
    data = _data()
    exc = raised(script.train, encoder, optimizer, data, [], fail_at=1)
    ctx = live_context(exc, report_dir=tmp_path / "report")

    outcome = save_batch(ctx)

    assert outcome.status == "confirmed", outcome.detail
    saved = torch.load(tmp_path / "report" / "step_inputs.pt", weights_only=True)
    assert torch.equal(saved["batch"]["x"], data[1][0]) and torch.equal(saved["batch"]["y"], data[1][1])
    assert saved["batch"]["step"] == 1
    assert not (tmp_path / "report" / "batch.pt").exists()
    with pytest.raises(ReplayError, match="not a DataLoader's batch"):
        load_replay(tmp_path / "report")
    (tmp_path / "train.py").write_text("")
    assert rerun_commands("train.py", [], report_dir="report", cwd=str(tmp_path))["replay"] is None


def test_statements_that_cannot_run_outside_their_function_are_refused(tmp_path):
    path = tmp_path / "early_exit.py"
    path.write_text(textwrap.dedent('''
        import torch

        def run(model, data):
            for x in data:
                out = model(x)
                if out.isnan().any():
                    return
                out.sum().backward()
                out.sum().backward()
    '''))
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    exc = raised(namespace["run"], torch.nn.Linear(2, 2), [torch.randn(1, 2)])
    with pytest.raises(Unavailable, match="`return` statement"):
        source_step.find(source_step.user_frames(exc))


def test_a_step_that_writes_files_is_replayed_and_writes_nothing(tmp_path):
    """torch.save in the step, in a function it calls, in a method of an object it uses: python's run wrote each
    file once; the replay (in the child, where torch.save is stubbed) writes none again."""
    path = tmp_path / "saves.py"
    path.write_text(textwrap.dedent('''
        import torch

        def checkpoint(model, folder):
            torch.save(model.state_dict(), folder + "/last.pt")
            with open(folder + "/log.txt", "a") as log:
                log.write("saved\\n")

        def run_saving(model, data, folder):
            for x in data:
                out = model(x)
                torch.save(out, folder + "/out.pt")
                checkpoint(model, folder)
                out.sum().backward()
                out.sum().backward()
    '''))
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    model = torch.nn.Linear(2, 2)
    folder = tmp_path / "out"
    folder.mkdir()
    exc = raised(namespace["run_saving"], model, [torch.randn(1, 2)], str(folder))
    written = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert sorted(written) == ["last.pt", "log.txt", "out.pt"]
    ctx = live_context(exc)
    ctx.diagnosis = diagnosis("autograd", "anomaly_rerun")
    outcome = isolated(anomaly_rerun, ctx)
    assert outcome.status == "confirmed", outcome.detail
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == written
    assert outcome.facts["writes_kept_in_the_experiment"] == [f"{folder}/log.txt"]

"""The experiments of the silent-failure rules, each on a small model that has the cause and on one that has not."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from triage.context import ProbeContext  # noqa: E402
from triage.diagnosis import Diagnosis  # noqa: E402
from triage.incident import Incident  # noqa: E402


def _context(model, inputs, targets, loss_fn=None, **extra) -> ProbeContext:
    """The context the runner builds at the end of a run: the model's and the loss's last calls, by reference."""
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    output = model(inputs)
    return ProbeContext(incident=Incident(kind="silent"), model=model, model_args=(inputs,), loss_fn=loss_fn,
                        loss_args=(output, targets), batch=(inputs, targets), step=20, **extra)


def _diagnosis(**values) -> Diagnosis:
    return Diagnosis(rule="learning.x", category="learning", confidence=0.9, title="", hypothesis="", fix="",
                     values=values)


def _data(n=64, features=10, classes=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    return x, x[:, :classes].argmax(1)


# ---------------------------------------------------------------------------- softmax_rows


def test_softmax_rows_confirms_probabilities_and_refutes_logits():
    from triage.probes.step_measures import softmax_rows

    torch.manual_seed(0)
    x, y = _data()
    result = softmax_rows(_context(nn.Sequential(nn.Linear(10, 4), nn.Softmax(dim=1)), x, y))
    assert result.status == "confirmed", result.detail
    assert result.facts["classes"] == 4 and "sums to 1" in result.detail
    assert abs(result.facts["loss_floor"] - 0.7436) < 1e-3  # log(1 + 3/e)
    result = softmax_rows(_context(nn.Linear(10, 4), x, y))
    assert result.status == "refuted", result.detail
    assert "logits" in result.detail


def test_softmax_rows_measures_the_loss_input_itself_and_skips_an_output_without_classes():
    from triage.probes.step_measures import softmax_rows

    torch.manual_seed(0)
    x, y = _data()
    model = nn.Linear(10, 4)  # logits, softmaxed in the loop before the loss
    ctx = _context(model, x, y)
    ctx.loss_args = (torch.softmax(model(x), dim=1), y)
    assert softmax_rows(ctx).status == "confirmed"
    ctx.loss_args = None  # no loss module recorded: the model's logits cannot rule out a softmax after it
    result = softmax_rows(ctx)
    assert result.status == "inconclusive" and "not recorded" in result.detail
    result = softmax_rows(_context(nn.Sequential(nn.Linear(10, 1), nn.Flatten(0)), x, torch.zeros(64),
                                   loss_fn=nn.MSELoss()))
    assert result.status == "skipped" and "no class dimension" in result.detail


# ---------------------------------------------------------------------------- relu_activity


def test_relu_activity_confirms_units_dead_for_every_example():
    from triage.probes.step_measures import relu_activity

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(inplace=True), nn.Linear(16, 4))
    nn.init.constant_(model[0].bias, -20.0)
    x, y = _data()
    result = relu_activity(_context(model, x, y))
    assert result.status == "confirmed", result.detail
    assert result.facts["dead_fraction"] == 1.0
    assert result.facts["relus"][0]["largest_input"] < -10  # read before the inplace ReLU overwrote it
    assert "16 of 16 units of module 1 (ReLU)" in result.detail
    assert set(result.facts["zero_gradient"]) == {"0.weight", "0.bias", "2.weight"}


def test_relu_activity_refutes_working_relus_and_reads_functional_ones():
    from triage.probes.step_measures import relu_activity

    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(10, 16), nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    torch.manual_seed(0)
    x, y = _data()
    result = relu_activity(_context(Functional(), x, y))
    assert result.status == "refuted", result.detail
    assert "functional relu" in result.facts["where"]
    result = relu_activity(_context(nn.Linear(10, 4), x, y))
    assert result.status == "skipped" and "no ReLU" in result.detail


# ---------------------------------------------------------------------------- gradient_reach


class _Encoded(nn.Module):
    def __init__(self, cut: bool):
        super().__init__()
        self.cut = cut
        self.encoder = nn.Sequential(nn.Linear(10, 8), nn.Tanh())
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = self.encoder(x)
        return self.head(h.detach() if self.cut else h)


def test_gradient_reach_confirms_a_cut_and_names_the_module_it_follows():
    from triage.probes.step_measures import gradient_reach

    torch.manual_seed(0)
    x, y = _data()
    listed = "model.encoder.0.weight, model.encoder.0.bias"
    ctx = _context(_Encoded(cut=True), x, y, diagnosis=_diagnosis(params=listed))
    result = gradient_reach(ctx)
    assert result.status == "confirmed", result.detail
    assert result.facts["unreached"] == ["encoder.0.weight", "encoder.0.bias"]
    assert result.facts["cut_after"] == ("encoder", True)
    assert "cut after it, in _Encoded.forward" in result.detail


def test_gradient_reach_refutes_when_the_replay_reaches_the_parameters():
    from triage.probes.step_measures import gradient_reach

    torch.manual_seed(0)
    x, y = _data()
    ctx = _context(_Encoded(cut=False), x, y, diagnosis=_diagnosis(params="model.encoder.0.weight"))
    result = gradient_reach(ctx)
    assert result.status == "refuted", result.detail
    assert result.facts["reached"] == ["encoder.0.weight"]
    ctx = _context(_Encoded(cut=False), x, y, diagnosis=_diagnosis(params="model.decoder.weight"))
    assert gradient_reach(ctx).status == "skipped"


# ---------------------------------------------------------------------------- grad_carryover


def test_grad_carryover_confirms_gradients_summed_over_steps_and_refutes_one_step():
    from triage.probes.step_measures import grad_carryover

    torch.manual_seed(0)
    model = nn.Linear(10, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    criterion = nn.CrossEntropyLoss()
    batches = [_data(seed=s) for s in range(6)]
    for x, y in batches:  # no zero_grad: .grad keeps adding up
        criterion(model(x), y).backward()
        optimizer.step()
    x, y = batches[-1]
    result = grad_carryover(_context(model, x, y, loss_fn=criterion))
    assert result.status == "confirmed", result.detail
    assert result.facts["extra"] > 1

    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()
    result = grad_carryover(_context(model, x, y, loss_fn=criterion))
    assert result.status == "refuted", result.detail
    optimizer.zero_grad(set_to_none=True)
    result = grad_carryover(_context(model, x, y, loss_fn=criterion))
    assert result.status == "refuted" and "None" in result.detail


# ---------------------------------------------------------------------------- optimizer_stepped


def _backward(model, x, y):
    nn.CrossEntropyLoss()(model(x), y).backward()


def test_optimizer_stepped_confirms_an_adam_that_never_stepped_and_refutes_one_that_did():
    from triage.probes.optimizer_census import optimizer_stepped

    torch.manual_seed(0)
    x, y = _data()
    model = nn.Linear(10, 4)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    _backward(model, x, y)
    result = optimizer_stepped(_context(model, x, y, optimizer=adam))
    assert result.status == "confirmed", result.detail
    assert "Adam over 2 tensors has no per-parameter state" in result.detail

    model = nn.Linear(10, 4)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        adam.zero_grad()
        _backward(model, x, y)
        adam.step()
    result = optimizer_stepped(_context(model, x, y, optimizer=adam))
    assert result.status == "refuted", result.detail
    assert "after 3 steps" in result.detail


def test_optimizer_stepped_cannot_tell_for_an_optimizer_without_state():
    from triage.probes.optimizer_census import optimizer_stepped

    x, y = _data()
    model = nn.Linear(10, 4)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    _backward(model, x, y)
    result = optimizer_stepped(_context(model, x, y, optimizer=sgd))
    assert result.status == "inconclusive" and "keeps no per-parameter state" in result.detail


# ---------------------------------------------------------------------------- optimizer_membership


class _Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Linear(10, 8)
        self.fc = nn.Linear(8, 7)

    def forward(self, x):
        return self.fc(torch.relu(self.features(x)))


def test_optimizer_membership_confirms_a_head_replaced_after_the_optimizer():
    from triage.probes.optimizer_census import optimizer_membership

    torch.manual_seed(0)
    x, y = _data()
    model = _Backbone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.fc = nn.Linear(8, 4)
    _backward(model, x, y)
    result = optimizer_membership(_context(model, x, y, optimizer=optimizer))
    assert result.status == "confirmed", result.detail
    assert result.facts["outside"] == ["fc.weight", "fc.bias"]
    assert result.facts["not_in_model"] == [[7, 8], [7]]
    assert "left fc.weight, fc.bias unchanged" in result.detail


def test_optimizer_membership_refutes_when_every_trained_parameter_is_held():
    from triage.probes.optimizer_census import optimizer_membership

    x, y = _data()
    model = _Backbone()
    model.fc = nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.features.requires_grad_(False)  # frozen and not optimized: fine
    result = optimizer_membership(_context(model, x, y, optimizer=optimizer))  # no .grad yet: the probe replays
    assert result.status == "refuted", result.detail
    assert "gradients from a replay" in result.detail


# ---------------------------------------------------------------------------- requires_grad_flags


def test_requires_grad_flags_confirms_a_plain_attribute_and_the_fix_gives_gradients():
    from triage.probes.optimizer_census import requires_grad_flags

    x, y = _data()
    model = nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 4))
    model.requires_grad_(False)
    model[0].requires_grad = True  # meant: requires_grad_(True)
    model[2].requires_grad_(True)
    result = requires_grad_flags(_context(model, x, y))
    assert result.status == "confirmed", result.detail
    assert result.facts["module"] == "0" and result.facts["gradients_after_fix"] == ["0.weight", "0.bias"]


def test_requires_grad_flags_refutes_the_method_and_an_agreeing_attribute():
    from triage.probes.optimizer_census import requires_grad_flags

    x, y = _data()
    model = nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 4))
    model[0].requires_grad_(False)
    result = requires_grad_flags(_context(model, x, y))
    assert result.status == "refuted" and "no module" in result.detail
    model[0].requires_grad = False
    result = requires_grad_flags(_context(model, x, y))
    assert result.status == "refuted" and "agree" in result.detail


# ---------------------------------------------------------------------------- lr_replay


def _regression(seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(32, 3, generator=generator) * 50  # unscaled features, in the tens
    return x, x.sum(1, keepdim=True) * 0.1


def test_lr_replay_confirms_a_learning_rate_that_overshoots():
    from triage.probes.lr_replay import lr_replay

    torch.manual_seed(0)
    x, y = _regression()
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    result = lr_replay(_context(model, x, y, loss_fn=nn.MSELoss(), optimizer=optimizer))
    assert result.status == "confirmed", result.detail
    losses, tenth = result.facts["losses"], result.facts["losses_lr_tenth"]
    assert losses[-1] > losses[0] and tenth[-1] < tenth[0]


def test_lr_replay_refutes_a_loss_that_grows_at_a_tenth_too():
    from triage.probes.lr_replay import lr_replay

    torch.manual_seed(0)
    x, y = _regression()
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-5, maximize=True)  # climbs the loss at any rate
    result = lr_replay(_context(model, x, y, loss_fn=nn.MSELoss(), optimizer=optimizer))
    assert result.status == "refuted", result.detail
    assert "a tenth of the learning rate too" in result.detail


def test_lr_replay_skips_a_loss_it_cannot_replay():
    from triage.probes.lr_replay import lr_replay

    x, y = _regression()
    model = nn.Linear(3, 1)
    ctx = ProbeContext(incident=Incident(kind="silent"), model=model, model_args=(x,), batch=(x, y),
                       optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    result = lr_replay(ctx)
    assert result.status == "skipped" and "loss" in result.detail


# ---------------------------------------------------------------------------- graph_memory


def _main_with(monkeypatch, **names):
    import sys

    fake = types.ModuleType("__main__")
    for key, value in names.items():
        setattr(fake, key, value)
    monkeypatch.setitem(sys.modules, "__main__", fake)


def _silent_context(growth_mib: float, holder: str) -> ProbeContext:
    return ProbeContext(incident=Incident(kind="silent"), diagnosis=_diagnosis(holder=holder, growth=str(growth_mib)))


def test_graph_memory_confirms_graphs_that_keep_activations(monkeypatch):
    from triage.probes.graph_memory import graph_memory

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1))
    val_x = torch.randn(64, 64)
    history = [model(val_x).pow(2).mean() for _ in range(20)]  # each keeps a [64, 1024] activation: 256 KiB
    _main_with(monkeypatch, val_history=history, model=model)
    result = graph_memory(_silent_context(6.0, "val_history"))
    assert result.status == "confirmed", result.detail
    assert result.facts["tensors"] == 20 and result.facts["held_bytes"] >= 20 * 64 * 1024 * 4


def test_graph_memory_refutes_graphs_that_hold_little(monkeypatch):
    from triage.probes.graph_memory import graph_memory

    scale = torch.ones(1, requires_grad=True)
    history = [scale * 2 for _ in range(20)]  # a grad_fn each, and nothing saved worth a byte of the growth
    _main_with(monkeypatch, history=history)
    result = graph_memory(_silent_context(100.0, "history"))
    assert result.status == "refuted", result.detail
    assert "something else holds the memory" in result.detail
    _main_with(monkeypatch, history=[t.detach() for t in history])
    assert graph_memory(_silent_context(100.0, "history")).status == "refuted"
    assert graph_memory(_silent_context(100.0, "absent")).status == "skipped"


# ---------------------------------------------------------------------------- heldout_learnability


def _loader_context(shuffle_labels: bool) -> ProbeContext:
    torch.manual_seed(0)
    x = torch.randn(800, 16)
    y = x[:, :4].argmax(1)
    if shuffle_labels:
        y = y[torch.randperm(len(y))]
    loader = DataLoader(TensorDataset(x, y), batch_size=50, shuffle=True)
    inputs, targets = next(iter(loader))
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    ctx = _context(model, inputs, targets)
    ctx.loader = loader
    return ctx


def test_heldout_learnability_confirms_labels_unrelated_to_their_inputs():
    from triage.probes.learnability import heldout_learnability

    result = heldout_learnability(_loader_context(shuffle_labels=True))
    assert result.status == "confirmed", result.detail
    before, after = result.facts["held_out_loss"]
    assert after >= before * 0.98 and result.facts["train_loss"][1] < result.facts["train_loss"][0] * 0.9


def test_heldout_learnability_refutes_labels_the_inputs_predict():
    from triage.probes.learnability import heldout_learnability

    result = heldout_learnability(_loader_context(shuffle_labels=False))
    assert result.status == "refuted", result.detail
    assert "the inputs do predict the labels" in result.detail


def test_heldout_learnability_skips_a_call_that_transforms_the_batch():
    from triage.probes.learnability import heldout_learnability

    ctx = _loader_context(shuffle_labels=False)
    ctx.model_args = (ctx.model_args[0] * 1.0,)
    result = heldout_learnability(ctx)
    assert result.status == "skipped" and "transforms" in result.detail


def test_gradient_reach_skips_parameters_no_module_holds():
    from triage.probes.step_measures import gradient_reach

    x, y = _data()
    listed = "a (100, 64) parameter no module holds any more, a (100,) parameter no module holds any more"
    result = gradient_reach(_context(_Encoded(cut=False), x, y, diagnosis=_diagnosis(params=listed)))
    assert result.status == "skipped" and "no module holds" in result.detail


# ---------------------------------------------------------------------------- in the child, under the runner


def test_an_experiment_that_steps_the_optimizer_leaves_the_users_objects_as_they_were():
    from triage.probes.runner import run_probe
    from triage.probes.sandbox import fork_available

    if not fork_available():
        pytest.skip("experiments need fork")
    x, y = _data()
    model = nn.Linear(10, 4)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    _backward(model, x, y)
    weights = model.weight.detach().clone()
    result = run_probe("optimizer_stepped", _context(model, x, y, optimizer=adam), 60)
    assert result.status == "confirmed", result.detail
    assert not adam.state and torch.equal(model.weight.detach(), weights)  # the step ran in the child only


def test_the_runner_confirms_the_lost_step_of_a_finished_run(tmp_path):
    import json
    import subprocess
    import sys

    from conftest import ROOT, triage_env

    script = ROOT / "corpus" / "scripts" / "learning" / "accumulation_step_never_reached.py"
    done = subprocess.run([sys.executable, "-m", "triage", "--report-dir", str(tmp_path / "r"), str(script)],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path, env=triage_env())
    assert done.returncode == 0, done.stderr[-2000:]
    leading = json.loads((tmp_path / "r" / "report.json").read_text())["diagnoses"][0]
    assert leading["rule"] == "learning.backward-without-step"
    (probe,) = leading["probes"]
    assert probe["name"] == "optimizer_stepped" and probe["status"] == "confirmed", probe["detail"]
    assert "Adam over 4 tensors has no per-parameter state" in probe["detail"]

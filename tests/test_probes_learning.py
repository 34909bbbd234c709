"""The training-health experiments on real small models: determinism (and compile_compare where torch.compile works)."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
from torch import nn  # noqa: E402

from triage.context import ProbeContext  # noqa: E402
from triage.incident import Incident  # noqa: E402
from triage.probes.determinism import determinism  # noqa: E402


class NumpyNoise(nn.Module):
    """Augmentation written with NumPy: torch.manual_seed does not fix it."""

    def forward(self, x):
        return x + torch.from_numpy(np.random.randn(*x.shape).astype("float32"))


class ClockJitter(nn.Module):
    """Scales by a factor drawn from Python's random, seeded from the clock."""

    def forward(self, x):
        return x * random.uniform(0.5, 1.5)


class ScatterLast(nn.Module):
    """Writes values through put_, which has no deterministic kernel under use_deterministic_algorithms."""

    def forward(self, x):
        noisy = x + torch.from_numpy(np.random.randn(*x.shape).astype("float32"))
        flat = noisy.reshape(-1).clone()
        return flat.put_(torch.tensor([0, 0]), noisy.reshape(-1)[:2] * 2).reshape(x.shape)


def _context(model: nn.Module, batch: tuple) -> ProbeContext:
    return ProbeContext(incident=Incident(kind="silent"), model=model, batch=batch, loss_fn=nn.CrossEntropyLoss(),
                        step=7)


def _batch() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(16, 8, generator=generator), torch.randint(0, 4, (16,), generator=generator)


def test_deterministic_step_with_dropout_is_refuted():
    # dropout draws from torch's generator, which the probe seeds: the same step replays bit for bit
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 4))
    result = determinism(_context(model, _batch()))
    assert result.status == "refuted", result.detail
    assert "bit-identical" in result.detail and "step 7" in result.detail


def test_numpy_noise_inside_the_model_is_confirmed_and_named():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), NumpyNoise(), nn.Linear(16, 4))
    result = determinism(_context(model, _batch()))
    assert result.status == "confirmed", result.detail
    assert result.facts["module"] == "2" and result.facts["differs"] == "the output"
    assert "the output of module 2 (NumpyNoise)" in result.detail
    assert result.facts["source"] == "np.random.randn"
    assert not torch.are_deterministic_algorithms_enabled()


def test_python_random_after_a_deterministic_layer_names_the_later_module():
    # the first layer's output is the same in both replays: the first difference is the jitter's, not the Linear's
    model = nn.Sequential(nn.Linear(8, 4), ClockJitter())
    random.seed()
    result = determinism(_context(model, _batch()))
    assert result.status == "confirmed", result.detail
    assert result.facts["module"] == "1"  # the jitter's output is the first that differs
    assert result.facts["source"] == "random.uniform"


def test_op_without_deterministic_kernel_is_named():
    model = nn.Sequential(nn.Linear(8, 4), ScatterLast())
    result = determinism(_context(model, _batch()))
    assert result.status == "confirmed", result.detail
    assert "put_ does not have a deterministic implementation" in result.facts["op"]
    assert not torch.are_deterministic_algorithms_enabled()


def test_no_model_is_skipped():
    result = determinism(ProbeContext(incident=Incident(kind="silent")))
    assert result.status == "skipped"


def test_model_found_from_optimizer_is_the_global_not_its_last_layer(monkeypatch):
    # Sequential(parameterless layer, Linear): both own every optimized parameter; the script's `model` is the model
    import sys

    from triage.probes.runner import _model_from_optimizer

    model = nn.Sequential(NumpyNoise(), nn.Linear(8, 4))
    monkeypatch.setattr(sys.modules["__main__"], "model", model, raising=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert _model_from_optimizer(optimizer) is model


def test_compile_compare_agrees_then_finds_a_hook_compiled_code_skips():
    from triage.probes.compile_compare import compile_compare

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    compiled = torch.compile(model)
    batch = _batch()
    try:
        compiled(batch[0])
    except Exception as exc:  # no C++ toolchain here: the probe must say so, not guess
        result = compile_compare(_context(compiled, batch))
        assert result.status == "inconclusive" and "compiled replay raised" in result.detail, (exc, result.detail)
        return
    assert compile_compare(_context(compiled, batch)).status == "refuted"
    # dynamo does not guard module hooks: one added after the first compiled call runs eagerly only
    model[1].register_forward_hook(lambda module, args, output: output * 0.5)
    result = compile_compare(_context(compiled, batch))
    assert result.status == "confirmed", result.detail
    assert result.facts["differs"] == ["the output", "the loss"]
    assert result.facts["modules"][0] == "0" and "module 0 (Linear)" in result.detail


def test_compile_compare_in_its_forked_child_replays_the_cached_code_not_a_recompile():
    # The experiment's child runs torch on one thread, which fails dynamo's guard on the thread count: a recompile
    # there would trace the late hook in and agree with eager (and inductor may not write its cache there at all).
    from triage.probes.runner import run_probe
    from triage.probes.sandbox import fork_available

    if not fork_available():
        pytest.skip("experiments need fork")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        compiled = torch.compile(model)
        batch = _batch()
        try:
            nn.CrossEntropyLoss()(compiled(batch[0]), batch[1]).backward()
        except Exception:
            pytest.skip("torch.compile does not work here (no C++ toolchain)")

        def standardise(module, args):
            return (args[0] * 3.0,)

        model.register_forward_pre_hook(standardise)
        result = run_probe("compile_compare", _context(compiled, batch), 60)
    finally:
        torch.set_num_threads(threads)
    assert result.status == "confirmed", result.detail
    assert "module 0 (Linear)" in result.detail
    assert "forward pre-hook " in result.detail and "standardise on the model" in result.detail


def test_compile_compare_refutes_an_eager_model():
    from triage.probes.compile_compare import compile_compare

    result = compile_compare(_context(nn.Linear(8, 4), _batch()))
    assert result.status == "refuted" and "not wrapped in torch.compile" in result.detail

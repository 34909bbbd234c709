"""`pytest --triage` (pytester): a test failing with a PyTorch error gets a triage section; others do not."""

import importlib.metadata
import importlib.util
import subprocess
import sys

import pytest

from conftest import ROOT, triage_env

pytest_plugins = ["pytester"]

FAILING_TESTS = '''
import torch
from torch import nn


def test_wrong_in_features():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(12, 2))
    model(torch.randn(3, 8))


def test_plain_assertion():
    assert torch.ones(2).sum().item() == 3


def test_close_values():
    torch.testing.assert_close(torch.ones(2), torch.zeros(2))


def test_plain_python_error():
    {}["learning_rate"]


def test_passes():
    assert torch.ones(1).item() == 1
'''


def needs(*modules):
    """Skip without importing: an import made under pytester is dropped when the test ends, and torch's extension
    modules crash when imported a second time."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")


def run(pytester, monkeypatch, *args):
    """pytest in a subprocess (an in-process run drops the modules it imported, torch's included, as it ends)
    that imports this checkout, with the plugin loaded by module unless its entry point is installed."""
    monkeypatch.setenv("PYTHONPATH", triage_env()["PYTHONPATH"])
    installed = any(ep.name == "triage" for ep in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "triage.integrations.pytest_plugin"]
    return pytester.runpytest_subprocess(*plugin, "-p", "no:cacheprovider", *args, timeout=300)


def sections(result):
    """The text of each failure's report, by test name."""
    text = result.stdout.str()
    out, name = {}, None
    for line in text.splitlines():
        if line.startswith("____") and line.endswith("____"):
            name = line.strip("_ ")
            out[name] = ""
        elif line.startswith("===") and name is not None:
            name = None
        elif name is not None:
            out[name] += line + "\n"
    return out


def test_triage_section_for_a_pytorch_error_only(pytester, monkeypatch):
    pytester.makepyfile(test_model=FAILING_TESTS)
    result = run(pytester, monkeypatch, "--triage")
    result.assert_outcomes(failed=4, passed=1)
    by_test = sections(result)
    torch_failure = by_test["test_wrong_in_features"]
    assert "- triage -" in torch_failure
    assert "Linear layer gets 16 input features but expects 12" in torch_failure
    assert "shape · shape.linear-in-features" in torch_failure
    assert "Experiment shape_trace: confirmed" in torch_failure
    assert "python -m triage" not in torch_failure  # no command to re-run "the script" (pytest itself)
    for name in ("test_plain_assertion", "test_close_values", "test_plain_python_error"):
        assert "- triage -" not in by_test[name], name


def test_without_the_option_nothing_is_added(pytester, monkeypatch):
    pytester.makepyfile(test_model=FAILING_TESTS)
    result = run(pytester, monkeypatch, "-k", "wrong_in_features")
    result.assert_outcomes(failed=1)
    assert "- triage -" not in result.stdout.str()
    assert not (pytester.path / "triage-reports").exists()


def test_a_lightning_callback_inside_a_test_reports_once(pytester, monkeypatch):
    needs("lightning")
    pytester.makepyfile(test_fit='''
        import torch
        from torch import nn
        import lightning.pytorch as pl
        from triage.integrations.lightning import TriageCallback


        class Module(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.head = nn.Linear(6, 3)

            def forward(self, x):
                return self.head(x)

            def training_step(self, batch, batch_idx):
                return nn.functional.cross_entropy(self(batch[0]), batch[1])

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)


        def test_fit():
            data = torch.utils.data.TensorDataset(torch.randn(8, 8), torch.zeros(8, dtype=torch.long))
            trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                                 enable_progress_bar=False, enable_model_summary=False, callbacks=[TriageCallback()])
            trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=4))
    ''')
    result = run(pytester, monkeypatch, "--triage")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert text.count("shape.linear-in-features") == 1  # in the triage section, not again in captured stderr
    assert "head receives [4, 8]" in sections(result)["test_fit"]


def test_the_plugin_imports_neither_torch_nor_the_knowledge_base():
    code = ("import sys, triage.integrations.pytest_plugin; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('triage.kb', 'triage.wrapper'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=triage_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_plugin_is_registered_as_a_pytest11_entry_point():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"triage": "triage.integrations.pytest_plugin"}
    extras = project["optional-dependencies"]
    assert {"ipython", "lightning", "transformers"} <= set(extras)


def test_a_transformers_trainer_failing_inside_a_test_is_diagnosed_with_its_batch(pytester, monkeypatch):
    needs("transformers", "accelerate")

    pytester.makepyfile(test_train='''
        import torch
        from torch import nn
        from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments
        from triage.integrations.transformers import TriageCallback


        class TinyConfig(PretrainedConfig):
            model_type = "triage-tiny-pytest"


        class TinyClassifier(PreTrainedModel):
            config_class = TinyConfig

            def __init__(self, config):
                super().__init__(config)
                self.classifier = nn.Linear(8, 3)
                self.post_init()

            def forward(self, features, labels=None):
                logits = self.classifier(features)
                return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


        class Samples(torch.utils.data.Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return {"features": torch.zeros(5), "labels": torch.tensor(i % 3)}


        def test_train(tmp_path):
            args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, num_train_epochs=1,
                                     report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
                                     disable_tqdm=True)
            Trainer(model=TinyClassifier(TinyConfig()), args=args, train_dataset=Samples(),
                    callbacks=[TriageCallback()]).train()
    ''')
    result = run(pytester, monkeypatch, "--triage")
    result.assert_outcomes(failed=1)
    section = sections(result)["test_train"]
    assert "shape · shape.linear-in-features" in section
    assert "features Float[4, 5], labels Long[4]" in section  # the batch the callback's hook recorded

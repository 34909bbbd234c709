"""TriageCallback on a real Hugging Face `Trainer.train()`, with a tiny PreTrainedModel made here (no downloads)."""

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import triage_env

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

MODEL = textwrap.dedent('''
    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments

    from triage.integrations.transformers import TriageCallback


    class TinyConfig(PretrainedConfig):
        model_type = "triage-tiny"

        def __init__(self, in_features=8, classes=3, **kwargs):
            super().__init__(**kwargs)
            self.in_features, self.classes = in_features, classes


    class TinyClassifier(PreTrainedModel):
        config_class = TinyConfig

        def __init__(self, config):
            super().__init__(config)
            self.classifier = nn.Linear(config.in_features, config.classes)
            self.post_init()

        def forward(self, features, labels=None):
            logits = self.classifier(features)
            return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


    class Samples(torch.utils.data.Dataset):
        def __init__(self, width):
            self.width = width

        def __len__(self):
            return 12

        def __getitem__(self, i):
            return {"features": torch.full((self.width,), float(i)), "labels": torch.tensor(i % 3)}


    def trainer(width, out):
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, num_train_epochs=1, report_to=[],
                                 save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True)
        return Trainer(model=TinyClassifier(TinyConfig()), args=args, train_dataset=Samples(width),
                       callbacks=[TriageCallback()])
''')


def run_script(tmp_path, body):
    script = tmp_path / "train.py"
    script.write_text(MODEL + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                          env=triage_env(), timeout=300)


def test_failing_train_is_diagnosed_with_the_live_model_and_batch(tmp_path):
    done = run_script(tmp_path, '''
        trainer(width=5, out="out").train()
    ''')
    assert done.returncode == 1  # python's status for an uncaught exception
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x5 and 8x3)" in done.stderr  # the traceback
    assert "Linear layer gets 5 input features but expects 8" in done.stderr  # then the diagnosis
    [report_json] = tmp_path.glob("triage-reports/*/report.json")
    report = json.loads(report_json.read_text())
    leading = report["diagnoses"][0]
    assert (leading["rule"], leading["category"]) == ("shape.linear-in-features", "shape")
    probes = {p["name"]: p for p in leading["probes"]}
    assert probes["shape_trace"]["status"] == "confirmed"
    assert "classifier receives [4, 5]" in probes["shape_trace"]["detail"]
    # The batch is the Trainer's collated inputs to the model, by name.
    assert probes["save_batch"]["status"] == "confirmed"
    assert "features Float[4, 5], labels Long[4]" in probes["save_batch"]["detail"]


def test_a_run_that_ends_normally_puts_everything_back(tmp_path):
    done = run_script(tmp_path, '''
        import sys
        import triage.wrapper
        from triage.tracking import TRACKER

        hook = sys.excepthook
        t = trainer(width=8, out="out")
        t.train()
        model = t.model
        print(sys.excepthook is hook, triage.wrapper.installed(), TRACKER.model is None, TRACKER.batch is None,
              model._forward_pre_hooks == {})
    ''')
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-5:] == ["True", "False", "True", "True", "True"]
    assert not (tmp_path / "triage-reports").exists()

"""`%load_ext triage` in a real IPython shell: a failing cell is diagnosed with its live state, `%triage` reprints."""

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import triage_env

pytest.importorskip("IPython")

# Cells run one by one in an InteractiveShell, each announced on both streams so the test can split the output.
SESSION = textwrap.dedent('''
    import sys
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    CELLS = {CELLS!r}
    for name, cell in CELLS:
        print(f"=== {{name}}", flush=True)
        print(f"=== {{name}}", file=sys.stderr, flush=True)
        shell.run_cell(cell)
    sys.stdout.flush()
    sys.stderr.flush()
''')

MODEL_CELL = """
import torch
from torch import nn
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(12, 2))
x = torch.randn(5, 8)
"""


def run_session(cells, tmp_path):
    script = tmp_path / "session.py"
    script.write_text(SESSION.format(CELLS=cells))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                          env=triage_env(), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return split(done.stdout), split(done.stderr)


def split(text):
    parts, name = {}, None
    for line in text.splitlines(keepends=True):
        if line.startswith("=== "):
            name = line[4:].strip()
            parts[name] = ""
        elif name is not None:
            parts[name] += line
    return parts


def test_failing_cell_is_diagnosed_and_triage_magic_reprints_it(tmp_path):
    out, err = run_session([
        ("load", "%load_ext triage"),
        ("model", MODEL_CELL),
        ("fails", "y = model(x)"),
        ("again", "%triage"),
        ("json", "%triage json"),
    ], tmp_path)
    assert "mat1 and mat2 shapes cannot be multiplied (5x16 and 12x2)" in out["fails"]  # IPython's traceback
    report = err["fails"]
    assert "shape.linear-in-features" in report
    assert "Linear layer gets 16 input features but expects 12" in report
    # The experiment ran on the cell's live model: it names the layer inside it.
    assert "Experiment shape_trace: confirmed" in report
    assert "nn.Linear(16, 2)" in report
    assert "shape.linear-in-features" in out["again"]
    assert out["again"].strip() == report.strip()
    data = json.loads(out["json"])
    assert data["diagnoses"][0]["rule"] == "shape.linear-in-features"
    assert data["diagnoses"][0]["category"] == "shape"
    assert {p["name"]: p["status"] for p in data["diagnoses"][0]["probes"]}["shape_trace"] == "confirmed"


def test_plain_python_error_prints_its_traceback_only_until_asked(tmp_path):
    out, err = run_session([
        ("load", "%load_ext triage"),
        ("torch", "import torch"),
        ("fails", "settings = {}\nsettings['lr']"),
        ("asked", "%triage"),
    ], tmp_path)
    assert "KeyError" in out["fails"]
    assert "triage" not in err["fails"]
    assert "python." in out["asked"]
    assert "an ordinary Python error, not a PyTorch one" in out["asked"]


def test_unload_puts_back_the_previous_handler_and_removes_the_magic(tmp_path):
    out, err = run_session([
        ("load", "%load_ext triage"),
        ("model", MODEL_CELL),
        ("unload", "%unload_ext triage"),
        ("fails", "y = model(x)"),
        ("magic", "%triage"),
        ("owner", "import triage.tracking; print(triage.tracking.capture_owner)"),
    ], tmp_path)
    assert "mat1 and mat2" in out["fails"]
    assert "shape.linear-in-features" not in err["fails"] + out["fails"]
    assert "Line magic function `%triage` not found" in err["magic"] + out["magic"]
    assert out["owner"].strip() == "None"


def test_magic_before_any_failure_says_so(tmp_path):
    out, err = run_session([("load", "%load_ext triage"), ("magic", "%triage"), ("bad", "%triage yaml")], tmp_path)
    assert err["magic"].strip() == "triage: no cell has failed since %load_ext triage"
    assert err["bad"].strip() == "triage: unknown format 'yaml'; use %triage [text|markdown|json]"


def test_import_triage_loads_neither_torch_nor_ipython():
    code = ("import sys, triage; assert callable(triage.load_ipython_extension); "
            "print(sorted(m for m in ('torch', 'IPython', 'triage.integrations.ipython') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=triage_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_lightning_failure_in_a_cell_is_reported_once(tmp_path):
    pytest.importorskip("lightning")
    fit_cell = '''
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

data = torch.utils.data.TensorDataset(torch.randn(8, 8), torch.zeros(8, dtype=torch.long))
trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=[TriageCallback()])
trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=4))
'''
    out, err = run_session([("load", "%load_ext triage"), ("fit", fit_cell), ("again", "%triage")], tmp_path)
    assert "mat1 and mat2 shapes cannot be multiplied (4x8 and 6x3)" in out["fit"]
    # The callback diagnosed it before Lightning's teardown; the extension shows that report, not a second one.
    assert (err["fit"] + out["fit"]).count("shape.linear-in-features") == 1
    assert "shape.linear-in-features" in out["again"]

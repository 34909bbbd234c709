"""`triage explain` end to end in a subprocess: contract, exit codes and hostile input."""

import json
import sys

import pytest
from conftest import FIXTURES, ROOT, run_triage

LINEAR = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x57600 and 64x128)\n"


def assert_one_line_error(done, *fragments):
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0]


def test_json_report_follows_the_contract(tmp_path):
    log = tmp_path / "err.log"
    log.write_text((FIXTURES / "ipython8.log").read_text())
    done = run_triage("explain", log, "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["schema"] == "triage.report/1"
    assert report["source"] == "log"
    incident = report["incident"]
    assert incident["kind"] == "exception"
    assert {"exit_code", "rank", "worker"} <= incident.keys()
    exception = incident["exception"]
    assert exception["type"] == "RuntimeError"
    assert set(exception["frames"][0]) >= {"file", "line", "function", "code", "user"}
    lead = report["diagnoses"][0]
    assert lead["rule"] == "shape.linear-in-features" and lead["category"] == "shape"
    assert set(lead) >= {"rule", "category", "confidence", "title", "hypothesis", "evidence", "fix", "probes"}
    assert "2704" in lead["title"] and "400" in lead["title"]
    assert set(report["environment"]) >= {"python", "torch", "cuda"}
    assert "artifacts" in report


def test_stdin_and_dash_read_the_same():
    from_stdin = run_triage("explain", "--format", "json", input=LINEAR.encode())
    from_dash = run_triage("explain", "-", "--format", "json", input=LINEAR.encode())
    assert from_stdin.returncode == from_dash.returncode == 0
    assert json.loads(from_stdin.stdout)["diagnoses"] == json.loads(from_dash.stdout)["diagnoses"]


def test_text_report_names_the_numbers_and_location():
    done = run_triage("explain", FIXTURES / "ipython8.log")
    out = done.stdout.decode()
    assert done.returncode == 0
    assert "\x1b[" not in out  # not a terminal: no colour codes
    assert "expects 400 input features but receives 2704" in out
    assert "Cell In[5]:14 in Net.forward" in out
    assert "nn.Linear(2704, 120)" in out


def test_markdown_report():
    done = run_triage("explain", FIXTURES / "ipython8.log", "--format", "markdown")
    out = done.stdout.decode()
    assert out.startswith("# triage report")
    assert "## 1. Linear layer gets 2704 input features but expects 400" in out
    assert "**Fix.**" in out


def test_unmatched_log_still_exits_zero():
    done = run_triage("explain", "-", input=b"ValueError: something nobody has seen before\n")
    assert done.returncode == 0
    assert "No rule in the knowledge base matched" in done.stdout.decode()


def test_empty_input_is_a_diagnosis_not_an_error(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    done = run_triage("explain", empty, "--format", "json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["diagnoses"] == []


def test_missing_file(tmp_path):
    assert_one_line_error(run_triage("explain", tmp_path / "nope.log"), "nope.log", "no such file")


def test_directory(tmp_path):
    assert_one_line_error(run_triage("explain", tmp_path), "is a directory")


def test_binary_garbage(tmp_path):
    garbage = tmp_path / "model.pt"
    garbage.write_bytes(bytes(range(256)) * 64)
    assert_one_line_error(run_triage("explain", garbage), "binary")


def test_bad_format_option():
    assert_one_line_error(run_triage("explain", "-", "--format", "yaml", input=b""), "--format")


@pytest.mark.parametrize(
    "payload",
    [
        LINEAR.replace("\n", "\x00\n").encode(),  # NUL bytes a crashed writer leaves behind
        ("# caf\xe9\n" + LINEAR).encode("latin-1"),  # not UTF-8
        LINEAR.encode("utf-16"),  # PowerShell's `>` writes UTF-16 with a BOM
    ],
    ids=["nul-bytes", "latin-1", "utf-16"],
)
def test_odd_encodings_still_diagnose(payload):
    done = run_triage("explain", "-", "--format", "json", input=payload)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["diagnoses"][0]["rule"] == "shape.linear-in-features"


def test_single_50mb_line_is_bounded(tmp_path):
    log = tmp_path / "oneline.log"
    with open(log, "wb") as handle:
        handle.write(b"x" * (50 * 1024 * 1024))
        handle.write(b"\n" + LINEAR.encode())
    done = run_triage("explain", log, "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["diagnoses"][0]["rule"] == "shape.linear-in-features"


def test_large_log_keeps_memory_well_below_its_size(tmp_path):
    """A 96 MB training log: the traceback at the end is found, peak RSS stays far below 96 MB of text."""
    log = tmp_path / "big.log"
    noise = b"".join(b"epoch 3 step %6d | loss 0.4123 | lr 3.0e-04 | 812 samples/s\n" % n for n in range(20000))
    with open(log, "wb") as handle:
        for _ in range(96 * 1024 * 1024 // len(noise)):
            handle.write(noise)
        handle.write((FIXTURES / "ipython8.log").read_bytes())
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork+exec, so it would report pytest's own peak.
    code = (
        "import sys, re; from triage.cli import main; rc = main(['explain', sys.argv[1], '--format', 'json']);"
        "sys.stderr.write(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)); sys.exit(rc)"
    )
    import subprocess

    from conftest import triage_env

    done = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, env=triage_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["diagnoses"][0]["rule"] == "shape.linear-in-features"
    peak_kib = int(done.stderr.decode().strip().splitlines()[-1])
    assert peak_kib < 64 * 1024, f"peak RSS {peak_kib} KiB"


@pytest.mark.parametrize("args", [["explain", str(FIXTURES / "ipython8.log")], ["rules", "list"], ["rules", "test"]])
def test_explain_and_rules_never_import_torch(args):
    code = "import sys, runpy; sys.argv = ['triage', *sys.argv[1:]]; from triage.cli import main; rc = main(); print('torch' in sys.modules, file=sys.stderr); sys.exit(rc)"
    import subprocess

    from conftest import triage_env

    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, env=triage_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.decode().strip().splitlines()[-1] == "False"


def test_internal_errors_are_one_line_without_debug(tmp_path):
    """With TRIAGE_DEBUG unset, an internal failure is one line and a distinct exit status."""
    import subprocess

    from conftest import triage_env

    code = (
        "import sys; import triage.explain as e\n"
        "def boom(*a, **k): raise RuntimeError('kaboom')\n"
        "e.parse_log = boom\n"
        "from triage.cli import main; sys.exit(main(['explain', '-']))\n"
    )
    env = triage_env()
    env.pop("TRIAGE_DEBUG")
    done = subprocess.run([sys.executable, "-c", code], input=LINEAR.encode(), capture_output=True, env=env, timeout=60)
    assert done.returncode == 70
    assert done.stderr.decode().strip() == "triage: internal error: RuntimeError: kaboom (set TRIAGE_DEBUG=1 for details)"


def test_json_never_overwrites_a_file_that_is_not_a_triage_report(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(LINEAR)
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit(0)\n")
    # `--json train.log`, meant as `--json out.json train.log`: the log is refused as the target, and kept
    for command in (["explain", "--json", log], ["--json", log, script]):
        done = run_triage(*command, input=b"")
        assert done.returncode == 2, done.stderr
        assert b"not a triage JSON report; not overwriting it" in done.stderr
        assert log.read_text() == LINEAR
    out = tmp_path / "out.json"
    for _ in range(2):  # an earlier report at that path is replaced
        done = run_triage("explain", log, "--json", out)
        assert done.returncode == 0, done.stderr
        assert json.loads(out.read_text())["schema"] == "triage.report/1"
    done = run_triage("explain", log, "--json", tmp_path)
    assert done.returncode == 2 and b"it is a folder" in done.stderr

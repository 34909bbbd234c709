"""`python -m triage SCRIPT`: real scripts in real subprocesses, each compared with plain `python SCRIPT`.

Most scripts here do not import torch (1-2 s per process); the ones about
DataLoader workers and hangs do, because torch is the point there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 60


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "PYTHONFAULTHANDLER")}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TRIAGE_DEBUG"] = "1"
    env.update(extra)
    return env


def plain(script: Path, *args: str, cwd: Path, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=cwd, capture_output=True, text=True,
        input=stdin, timeout=TIMEOUT, env=env or _env(),
    )  # fmt: skip


def triage(*argv: str, cwd: Path, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "triage", *argv], cwd=cwd, capture_output=True, text=True,
        input=stdin, timeout=TIMEOUT, env=env or _env(),
    )  # fmt: skip


def plain_and_triage(script: Path, triage_argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """Both at once (two cores): the scripts that import torch spend most of their time starting."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        expected = pool.submit(plain, script, cwd=cwd)
        result = pool.submit(triage, *triage_argv, cwd=cwd)
        return expected.result(), result.result()


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def report(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


def test_exception_same_traceback_and_status_then_report(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", """\
        def step(batch):
            scale = 0
            api_key = "sk-abcdefghijklmnopqrstuvwxyz012345"
            return batch / scale

        print("starting")
        step(3)
    """)
    expected = plain(script, cwd=tmp_path)
    result = triage("--report-dir", "out", "train.py", cwd=tmp_path)
    assert result.returncode == expected.returncode == 1
    assert result.stdout == expected.stdout == "starting\n"
    # The original traceback comes first, exactly as python prints it (no runpy or triage frames).
    assert expected.stderr.startswith("Traceback (most recent call last):")
    assert result.stderr.startswith(expected.stderr)
    summary = result.stderr[len(expected.stderr) :]
    assert "triage: ZeroDivisionError: division by zero" in summary
    assert "report written to out/report.md" in summary
    data = report(tmp_path / "out")
    assert data["schema"] == "triage.report/1" and data["source"] == "run"
    incident = data["incident"]
    assert incident["kind"] == "exception" and incident["exit_code"] == 1
    frames = incident["exception"]["frames"]
    assert [f["function"] for f in frames] == ["<module>", "step"]
    assert all(f["user"] and "triage" not in f["file"] for f in frames)
    locals_ = frames[-1]["locals"]
    assert locals_["batch"]["text"] == "3" and locals_["scale"]["text"] == "0"
    assert locals_["api_key"]["text"] == "[scrubbed]"
    assert "sk-abcdef" not in (tmp_path / "out" / "report.json").read_text()
    assert "sk-abcdef" not in (tmp_path / "out" / "report.md").read_text()
    assert set(data["environment"]) >= {"python", "torch", "cuda"}


def test_success_changes_nothing(tmp_path: Path) -> None:
    script = write(tmp_path, "ok.py", """\
        import sys
        data = sys.stdin.read()
        print("read", len(data), "bytes;", sys.argv[1:])
        sys.stderr.write("a warning on stderr\\n")
    """)
    expected = plain(script, "--lr", "0.1", cwd=tmp_path, stdin="x" * 1000)
    result = triage("ok.py", "--lr", "0.1", cwd=tmp_path, stdin="x" * 1000)
    assert (result.returncode, result.stdout, result.stderr) == (expected.returncode, expected.stdout, expected.stderr)
    assert result.stdout == "read 1000 bytes; ['--lr', '0.1']\n"
    assert not (tmp_path / "triage-reports").exists()


def test_script_sees_what_plain_python_gives(tmp_path: Path) -> None:
    probe = """\
        import json, os, sys
        print(json.dumps({
            "argv": sys.argv, "name": __name__, "path0": sys.path[0], "file": __file__,
            "cwd": os.getcwd(), "main_file": sys.modules["__main__"].__file__,
            "spec": repr(__spec__), "package": __package__, "cached": __cached__,
            "loader": type(__loader__).__name__, "globals": sorted(k for k in globals() if k.startswith("__")),
            "orig_argv_tail": sys.orig_argv[-3:],
        }))
    """
    write(tmp_path, "src/probe.py", probe)
    (tmp_path / "link.py").symlink_to(tmp_path / "src" / "probe.py")
    for target in ("src/probe.py", "link.py"):
        # Options after the script belong to the script, even ones triage also has.
        args = ("--report-dir", "x", "-m")
        expected = plain(Path(target), *args, cwd=tmp_path)
        result = triage(target, *args, cwd=tmp_path)
        assert result.returncode == expected.returncode == 0, result.stderr
        assert json.loads(result.stdout) == json.loads(expected.stdout)
        assert result.stderr == expected.stderr == ""


def test_module_mode_matches_python_m(tmp_path: Path) -> None:
    write(tmp_path, "pkg/__init__.py", "")
    write(tmp_path, "pkg/train.py", """\
        import json, sys
        print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0], "spec": __spec__.name,
                          "package": __package__}))
        if "--fail" in sys.argv:
            raise RuntimeError("failed in a module")
    """)
    expected = subprocess.run([sys.executable, "-m", "pkg.train", "--epochs", "2"], cwd=tmp_path, capture_output=True, text=True, env=_env())
    result = triage("-m", "pkg.train", "--epochs", "2", cwd=tmp_path)
    assert result.returncode == expected.returncode == 0
    assert json.loads(result.stdout) == json.loads(expected.stdout)
    failing = triage("--report-dir", "out", "-m", "pkg.train", "--fail", cwd=tmp_path)
    assert failing.returncode == 1
    assert "<frozen runpy>" not in failing.stderr and "RuntimeError: failed in a module" in failing.stderr
    assert report(tmp_path / "out")["incident"]["exception"]["frames"][-1]["file"].endswith("train.py")
    missing = triage("-m", "no_such_module_here", cwd=tmp_path)
    plain_missing = subprocess.run([sys.executable, "-m", "no_such_module_here"], cwd=tmp_path, capture_output=True, text=True, env=_env())
    assert missing.returncode == plain_missing.returncode == 1
    assert missing.stderr == plain_missing.stderr


@pytest.mark.parametrize("code", ["0", "3", "msg", "none"])
def test_system_exit_codes(tmp_path: Path, code: str) -> None:
    script = write(tmp_path, "exit.py", """\
        import sys
        code = sys.argv[1]
        print("before exit")
        raise SystemExit(None if code == "none" else int(code) if code.isdigit() else code)
    """)
    expected = plain(script, code, cwd=tmp_path)
    result = triage("exit.py", code, cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (expected.returncode, expected.stdout, expected.stderr)
    assert result.returncode == {"0": 0, "3": 3, "msg": 1, "none": 0}[code]
    assert not (tmp_path / "triage-reports").exists()


def test_keyboard_interrupt_dies_of_sigint(tmp_path: Path) -> None:
    script = write(tmp_path, "ctrlc.py", """\
        import atexit
        atexit.register(print, "atexit ran")
        def loop():
            raise KeyboardInterrupt
        loop()
    """)
    expected = plain(script, cwd=tmp_path)
    result = triage("ctrlc.py", cwd=tmp_path)
    assert result.returncode == expected.returncode == -signal.SIGINT  # the shell shows 130
    assert (result.stdout, result.stderr) == (expected.stdout, expected.stderr)
    assert result.stdout == "atexit ran\n"
    assert not (tmp_path / "triage-reports").exists()


def test_thread_exception_is_reported_and_status_unchanged(tmp_path: Path) -> None:
    script = write(tmp_path, "threads.py", """\
        import threading
        def prefetch(paths):
            return paths["missing"]
        worker = threading.Thread(target=prefetch, args=({"train": 1},), name="prefetcher")
        worker.start(); worker.join()
        print("main finished")
    """)
    expected = plain(script, cwd=tmp_path)
    result = triage("--report-dir", "out", "threads.py", cwd=tmp_path)
    assert result.returncode == expected.returncode == 0
    assert result.stdout == expected.stdout == "main finished\n"
    assert result.stderr.startswith(expected.stderr)
    data = report(tmp_path / "out")
    assert data["incident"]["exception"]["type"] == "KeyError"
    assert data["incident"]["facts"]["thread"] == "prefetcher"
    assert data["incident"]["exit_code"] is None
    assert data["incident"]["exception"]["frames"][-1]["locals"]["paths"]["text"] == "{train: 1}"


@pytest.mark.parametrize(
    ("name", "body", "signame"),
    [
        ("segv.py", "import ctypes\ndef read_header(address):\n    return ctypes.string_at(address)\nread_header(0)\n", "SIGSEGV"),
        ("abort.py", "import os\ndef give_up():\n    os.abort()\ngive_up()\n", "SIGABRT"),
    ],
)
def test_fatal_signal_in_c(tmp_path: Path, name: str, body: str, signame: str) -> None:
    script = write(tmp_path, name, body)
    expected = plain(script, cwd=tmp_path)
    result = triage("--report-dir", "out", name, cwd=tmp_path)
    number = getattr(signal, signame)
    assert result.returncode == expected.returncode == -number
    dump = result.stderr.split("\ntriage: ")[0]
    assert dump.startswith("Fatal Python error") and "/triage/" not in dump and "<frozen runpy>" not in dump
    data = report(tmp_path / "out")
    incident = data["incident"]
    assert incident["kind"] == "hard-crash" and incident["signal"] == signame and incident["exit_code"] == 128 + number
    frames = incident["exception"]["frames"]
    assert frames and all("/triage/" not in f["file"] and f["file"] != "<frozen runpy>" for f in frames)
    user = [f for f in frames if f["user"]]
    assert user[-1]["function"] in ("read_header", "give_up") and user[-1]["code"]
    assert (tmp_path / "out" / "crash.txt").exists()


def test_a_native_abort_is_explained_by_the_lines_it_wrote_to_the_stderr_log(tmp_path: Path) -> None:
    # c10's terminate handler writes the error to stderr and aborts; a job's log file holds it (a terminal or pipe
    # does not give it back). The log's lines from before the run (another run's) are not this run's.
    write(tmp_path, "abort.py", """\
        import os
        os.write(2, b"terminate called after throwing an instance of 'c10::Error'\\n"
                    b"  what():  CUDA error: device-side assert triggered (insert_events at "
                    b"/pytorch/c10/cuda/CUDACachingAllocator.cpp:569)\\n")
        os.abort()
    """)
    log = tmp_path / "job.log"
    log.write_text("[rank0]:[E816 01:45:40.183009389 ProcessGroupNCCL.cpp:607] an earlier run's error\n")
    with open(log, "a") as stderr:
        result = subprocess.run([sys.executable, "-m", "triage", "--report-dir", "out", "abort.py"], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=stderr, timeout=TIMEOUT, env=_env())
    assert result.returncode == -signal.SIGABRT
    data = report(tmp_path / "out")
    lines = data["incident"]["log_lines"]
    assert "terminate called after throwing an instance of 'c10::Error'" in lines
    assert not any("an earlier run" in line for line in lines)
    assert data["diagnoses"][0]["rule"] == "cuda-assert.device-side-assert-in-log"


def test_sigkill_of_the_script_reports_last_state(tmp_path: Path) -> None:
    script = write(tmp_path, "oom.py", """\
        import os, signal, time
        from triage.tracking import TRACKER   # stands in for the DataLoader/optimizer hooks
        hoard = [bytearray(1 << 20) for _ in range(64)]
        time.sleep(0.3)  # memory is sampled at most four times a second
        for step in range(5):
            TRACKER.on_step()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    expected = plain(script, cwd=tmp_path)
    result = triage("--report-dir", "out", "oom.py", cwd=tmp_path)
    assert result.returncode == expected.returncode == -signal.SIGKILL
    incident = report(tmp_path / "out")["incident"]
    assert incident["kind"] == "hard-crash" and incident["signal"] == "SIGKILL"
    state = incident["facts"]["last_state"]
    assert state["optimizer_steps"] == 5
    assert state["rss_bytes"] > 64 << 20
    assert any("died of SIGKILL after 0 batches and 5 optimizer steps" in note for note in incident["notes"])
    assert "Killed" in incident["log_lines"]


def test_hang_report_keeps_the_run_going(tmp_path: Path) -> None:
    script = write(tmp_path, "stall.py", """\
        import time
        from triage.tracking import TRACKER
        def wait_for_shard():
            time.sleep(2.5)
        TRACKER.on_step()
        wait_for_shard()
        print("finished after the stall")
    """)
    result = triage("--hang-timeout", "1", "--report-dir", "out", "stall.py", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout == "finished after the stall\n"
    assert "the run looks hung. It keeps running." in result.stderr
    incident = report(tmp_path / "out")["incident"]
    assert incident["kind"] == "hang"
    assert incident["exception"]["type"] == "Hang"
    assert "the main thread is blocked in wait_for_shard at stall.py:4 in `time.sleep(2.5)`" in incident["exception"]["message"]


def test_no_progress_before_any_batch_is_not_a_hang(tmp_path: Path) -> None:
    script = write(tmp_path, "slow_start.py", "import time\ntime.sleep(1.5)\nprint('done')\n")
    result = triage("--hang-timeout", "0.5", "slow_start.py", cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, "done\n", "")


def test_forwarded_signals(tmp_path: Path) -> None:
    write(tmp_path, "sleepy.py", """\
        import sys, time
        try:
            print("ready", flush=True)
            time.sleep(30)
        except KeyboardInterrupt:
            print("child got SIGINT", flush=True)
            raise
    """)
    for signum, expected_code in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, -signal.SIGINT)):
        process = subprocess.Popen(
            [sys.executable, "-m", "triage", "sleepy.py"], cwd=tmp_path, env=_env(),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert process.stdout.readline() == "ready\n"
        process.send_signal(signum)  # to the parent only, as `kill PID` does
        out, err = process.communicate(timeout=TIMEOUT)
        assert process.returncode == expected_code, err
        if signum == signal.SIGINT:
            assert out == "child got SIGINT\n" and err.rstrip().endswith("KeyboardInterrupt")


def test_internal_error_keeps_traceback_and_status(tmp_path: Path) -> None:
    script = write(tmp_path, "fail.py", "raise ValueError('the real failure')\n")
    (tmp_path / "blocker").write_text("a file where the report folder should go")
    env = {k: v for k, v in _env().items() if k != "TRIAGE_DEBUG"}
    expected = plain(script, cwd=tmp_path)
    result = triage("--report-dir", "blocker/report", "fail.py", cwd=tmp_path, env=env)
    assert result.returncode == expected.returncode == 1
    assert result.stderr.startswith(expected.stderr)
    extra = result.stderr[len(expected.stderr) :].strip().splitlines()
    assert extra[-1].startswith("triage: internal error while triaging the exception: NotADirectoryError")
    assert extra[-1].endswith("(TRIAGE_DEBUG=1 for details)")
    debug = triage("--report-dir", "blocker/report", "fail.py", cwd=tmp_path)
    assert debug.returncode == 70 and "Traceback" in debug.stderr.split("TRIAGE_DEBUG is set")[1]


def test_usage_errors_are_one_line(tmp_path: Path) -> None:
    for argv in (["--bogus", "x.py"], ["--hang-timeout", "soon", "x.py"], ["--on-hang", "panic", "x.py"], ["run"]):
        result = triage(*argv, cwd=tmp_path)
        assert result.returncode == 2, argv
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("triage: "), result.stderr
    missing = triage("not_there.py", cwd=tmp_path)
    expected = plain(Path("not_there.py"), cwd=tmp_path)
    assert missing.returncode == expected.returncode == 2
    assert missing.stderr == expected.stderr


def test_json_copy_and_default_folder(tmp_path: Path) -> None:
    write(tmp_path, "bad.py", "import json\njson.loads('{not json')\n")
    result = triage("--json", "copy/report.json", "bad.py", cwd=tmp_path)
    assert result.returncode == 1
    folders = list((tmp_path / "triage-reports").iterdir())
    assert len(folders) == 1 and folders[0].name.endswith("-bad")
    assert json.loads((tmp_path / "copy" / "report.json").read_text()) == report(folders[0])


def test_team_rules_and_rank(tmp_path: Path) -> None:
    write(tmp_path, "rules/team.yaml", """\
        - id: team.missing-shard
          category: python
          title: Shard {{ shard }} is missing from the data bucket
          confidence: 0.95
          match:
            exception: FileNotFoundError
            message: 'shard-(?P<shard>\\d+)\\.tar'
          hypothesis: The nightly sync did not copy shard {{ shard }}.
          fix: Re-run the sync job for shard {{ shard }}.
          examples:
            match: ["FileNotFoundError: [Errno 2] No such file or directory: 'shard-0042.tar'"]
            no_match: ["FileNotFoundError: [Errno 2] No such file or directory: 'config.yaml'"]
    """)
    write(tmp_path, "load.py", "open('shard-0042.tar')\n")
    result = triage("--rules", "rules", "--report-dir", "out", "load.py", cwd=tmp_path, env=_env(RANK="3"))
    assert result.returncode == 1
    assert "Shard 0042 is missing from the data bucket" in result.stderr
    data = report(tmp_path / "out")
    assert data["diagnoses"][0]["rule"] == "team.missing-shard" and data["incident"]["rank"] == 3
    default = triage("load.py", cwd=tmp_path, env=_env(RANK="3"))
    assert default.returncode == 1
    assert [p.name.split("-", 2)[-1] for p in (tmp_path / "triage-reports").iterdir()] == ["load-rank3"]


def test_a_probe_that_kills_the_process_does_not_change_the_exit_status(tmp_path: Path) -> None:
    write(tmp_path, "rules/triage.yaml", """\
        probes:
          rerun_the_step: team_probes:rerun_the_step
        python_path: [.]
    """)
    write(tmp_path, "rules/team_probes.py", """\
        import os, signal

        def rerun_the_step(ctx):  # re-runs user code that, this time, takes its whole process down
            os.abort()
    """)
    write(tmp_path, "rules/team.yaml", """\
        - id: team.flaky-step
          category: python
          title: The step failed
          confidence: 0.9
          match: {exception: ValueError, message: 'flaky'}
          hypothesis: The step is flaky.
          fix: Retry it.
          probes: [rerun_the_step]
          examples:
            match: ['ValueError: flaky step']
            no_match: ['ValueError: something else']
    """)
    script = write(tmp_path, "step.py", "raise ValueError('flaky step')\n")
    expected = plain(script, cwd=tmp_path)
    env = {k: v for k, v in _env().items() if k != "TRIAGE_DEBUG"}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    assert triage("trust", "rules", cwd=tmp_path, env=env).returncode == 0  # the probe is Python: it runs once trusted
    result = triage("--rules", "rules", "step.py", cwd=tmp_path, env=env)
    assert result.returncode == expected.returncode == 1
    assert result.stderr.startswith(expected.stderr)
    # The probe ran in a disposable child: the child died, the run's report did not.
    (report,) = tmp_path.glob("triage-reports/*/report.json")
    (probe,) = [p for d in json.loads(report.read_text())["diagnoses"] for p in d["probes"]]
    assert probe["status"] == "error" and probe["detail"] == "the experiment's process was killed by SIGABRT"


def test_the_parent_never_imports_torch() -> None:
    code = (
        "import sys; import triage.runner.supervisor, triage.runner.postmortem, triage.runner.pipeline, "
        "triage.capture.faultdump, triage.report_dir, triage.kb; print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=REPO)
    assert result.stdout == "False\n", result.stderr


def test_script_from_stdin_matches_python_dash(tmp_path: Path) -> None:
    source = textwrap.dedent("""\
        import json, sys
        print(json.dumps({"argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0],
                          "loader": repr(__loader__), "spec": repr(__spec__), "cached": __cached__}))
        print(repr(sys.stdin.read()))
        config = {}
        config["lr"]
    """)
    expected = subprocess.run([sys.executable, "-", "--lr", "0.1"], cwd=tmp_path, capture_output=True, text=True,
                              input=source, timeout=TIMEOUT, env=_env())  # fmt: skip
    result = triage("--no-probes", "-", "--lr", "0.1", cwd=tmp_path, stdin=source)
    assert result.returncode == expected.returncode == 1
    assert result.stdout == expected.stdout
    assert json.loads(result.stdout.splitlines()[0])["argv"] == ["-", "--lr", "0.1"]
    assert result.stderr.startswith(expected.stderr)
    [folder] = (tmp_path / "triage-reports").iterdir()
    assert folder.name.endswith("-stdin")
    assert report(folder)["diagnoses"][0]["rule"] == "python.key-error"


def test_triage_report_dir_moves_the_root_and_report_dir_wins(tmp_path: Path) -> None:
    write(tmp_path, "bad.py", "import json\njson.loads('{not json')\n")
    moved = triage("bad.py", cwd=tmp_path, env=_env(TRIAGE_REPORT_DIR="elsewhere/reports"))
    assert moved.returncode == 1
    [folder] = (tmp_path / "elsewhere" / "reports").iterdir()
    assert folder.name.endswith("-bad") and (folder / "report.json").is_file()
    assert (folder / ".gitignore").read_text().splitlines()[-1] == "*"
    assert "elsewhere/reports/" in moved.stderr.splitlines()[-1]
    named = triage("--report-dir", "mine", "bad.py", cwd=tmp_path, env=_env(TRIAGE_REPORT_DIR="elsewhere/reports"))
    assert named.returncode == 1
    assert (tmp_path / "mine" / "report.json").is_file()
    assert len(list((tmp_path / "elsewhere" / "reports").iterdir())) == 1
    assert not (tmp_path / "triage-reports").exists()


def test_report_dir_in_a_folder_of_the_users_files_writes_no_gitignore(tmp_path: Path) -> None:
    write(tmp_path, "bad.py", "raise ValueError('x')\n")
    result = triage("--report-dir", ".", "bad.py", cwd=tmp_path)
    assert result.returncode == 1
    assert (tmp_path / "report.json").is_file()
    assert not (tmp_path / ".gitignore").exists()


HIDE_TORCH = """\
\"\"\"Hide torch from this interpreter, as if it were not installed.\"\"\"
import sys
from importlib.machinery import PathFinder


class PathFinderWithoutTorch(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.split(".")[0] == "torch" else super().find_spec(name, path, target)


sys.meta_path[:] = [PathFinderWithoutTorch if finder is PathFinder else finder for finder in sys.meta_path]
"""


def test_without_torch_one_line_and_a_full_report(tmp_path: Path) -> None:
    write(tmp_path, "hide/sitecustomize.py", HIDE_TORCH)
    write(tmp_path, "train.py", "import torch\n")
    env = {k: v for k, v in _env().items() if k != "TRIAGE_DEBUG"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "hide"), env["PYTHONPATH"]])
    expected = plain(tmp_path / "train.py", cwd=tmp_path, env=env)
    assert "No module named 'torch'" in expected.stderr  # torch is really hidden
    result = triage("train.py", cwd=tmp_path, env=env)
    assert result.returncode == expected.returncode == 1
    first, *rest = result.stderr.splitlines()
    assert first.startswith("triage: torch is not installed for ") and "without triage's experiments" in first
    assert "\n".join(rest).startswith(expected.stderr.rstrip("\n"))
    assert "internal error" not in result.stderr
    [folder] = (tmp_path / "triage-reports").iterdir()
    data = report(folder)
    assert data["diagnoses"][0]["rule"] == "python.module-not-found"
    assert all(not diagnosis["probes"] for diagnosis in data["diagnoses"])


# --- DataLoader workers and hangs: these need torch ------------------------------------------

torch_needed = pytest.importorskip


def test_worker_exception_carries_worker_traceback(tmp_path: Path) -> None:
    torch_needed("torch")
    script = write(tmp_path, "workers.py", """\
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Records(Dataset):
            def __init__(self):
                self.rows = [{"x": [float(i)] * 4, "label": i % 3} for i in range(40)]
                del self.rows[13]["label"]
            def __len__(self):
                return len(self.rows)
            def __getitem__(self, i):
                row = self.rows[i]
                return torch.tensor(row["x"]), row["label"]

        if __name__ == "__main__":
            for x, y in DataLoader(Records(), batch_size=4, num_workers=2):
                pass
    """)
    expected, result = plain_and_triage(script, ["--report-dir", "out", "workers.py"], tmp_path)
    assert result.returncode == expected.returncode == 1
    assert "Original Traceback" in result.stderr and "triage: KeyError: 'label'" in result.stderr
    incident = report(tmp_path / "out")["incident"]
    root = incident["exception"]
    assert root["type"] == "KeyError" and root["message"] == "'label'"
    assert incident["worker"] == root["worker"] == 1  # sample 13 is in batch 3, worker 3 % 2
    assert root["frames"][-1]["function"] == "__getitem__" and root["frames"][-1]["code"] == 'return torch.tensor(row["x"]), row["label"]'
    wrapper = [e for e in incident["exceptions"] if e.get("wrapper")]
    assert wrapper and "Caught KeyError in DataLoader worker process 1" in wrapper[0]["message"]
    facts = incident["facts"]
    assert facts["loader"]["num_workers"] == 2 and facts["loader"]["dataset"] == "Records"
    assert facts["progress"]["batches"] == 3


def test_worker_killed_by_sigkill(tmp_path: Path) -> None:
    torch_needed("torch")
    script = write(tmp_path, "killed.py", """\
        import os, signal
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Images(Dataset):
            def __len__(self):
                return 64
            def __getitem__(self, i):
                if i == 21:
                    os.kill(os.getpid(), signal.SIGKILL)
                return torch.zeros(3, 8, 8)

        if __name__ == "__main__":
            for batch in DataLoader(Images(), batch_size=4, num_workers=2):
                pass
    """)
    expected, result = plain_and_triage(script, ["--report-dir", "out", "killed.py"], tmp_path)
    assert result.returncode == expected.returncode == 1
    incident = report(tmp_path / "out")["incident"]
    # torch raises ConnectionResetError, "is killed by signal" or "exited unexpectedly", depending on what it
    # notices first; when torch has not reaped the worker yet, the runner checks it and says how it died.
    text = " ".join([e["message"] for e in incident["exceptions"]] + incident["log_lines"])
    assert "is killed by signal: Killed" in text or "exited unexpectedly" in text
    for dead in incident["facts"].get("dead_workers", []):
        assert dead["worker"] == 1 and dead["signal"] == "SIGKILL"
    assert incident["facts"]["loader"]["num_workers"] == 2


def test_dataloader_hang_is_diagnosed_and_killed(tmp_path: Path) -> None:
    torch_needed("torch")
    script = write(tmp_path, "deadlock.py", """\
        import threading
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Shards(Dataset):
            def __init__(self):
                self.lock = threading.Lock()
            def __len__(self):
                return 64
            def __getitem__(self, i):
                if i == 40:
                    self.lock.acquire()
                    self.lock.acquire()
                return torch.full((2,), float(i))

        if __name__ == "__main__":
            for batch in DataLoader(Shards(), batch_size=4, num_workers=2):
                pass
    """)
    del script
    started = time.monotonic()
    result = triage("--hang-timeout", "2", "--on-hang", "kill", "--report-dir", "out", "deadlock.py", cwd=tmp_path)
    assert result.returncode == 124, result.stderr
    assert time.monotonic() - started < 30
    assert "the main thread waits for batch 11 (index 10) of the DataLoader, which DataLoader worker 0 is preparing" in result.stderr
    assert "DataLoader worker 0 (pid" in result.stderr and "is blocked in Shards.__getitem__ at deadlock.py:13 in `self.lock.acquire()`" in result.stderr
    data = report(tmp_path / "out")
    assert data["incident"]["kind"] == "hang"
    leading = data["diagnoses"][0]
    assert leading["rule"] == "dataloader.worker-blocked-waiting" and leading["category"] == "dataloader"
    assert data["incident"]["worker"] == 0
    pids = [p["pid"] for p in data["incident"]["facts"]["processes"]]
    assert len(pids) == 3
    for pid in pids:  # the child and its workers are gone
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    assert 'line 13 in __getitem__' in (tmp_path / "out" / "stacks.txt").read_text()


def test_an_inf_loss_becomes_an_incident_with_its_origin_and_training_goes_on(tmp_path: Path) -> None:
    torch_needed("torch")
    script = write(tmp_path, "saturate.py", """\
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(16, 4)
        for step in range(6):
            p = torch.sigmoid(model(x) + (100.0 if step == 3 else 0.0))  # saturates at step 3
            loss = -torch.log(1 - p).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print("finished at step", step)
    """)
    expected, result = plain_and_triage(script, ["--report-dir", "out", "saturate.py"], tmp_path)
    assert result.returncode == expected.returncode == 0
    assert result.stdout == expected.stdout == "finished at step 5\n"
    incident = report(tmp_path / "out")["incident"]
    assert incident["kind"] == "nan" and incident["facts"]["nan"]["step"] == 3
    # The loss check sees the inf loss before backward spreads it into the gradients, and names its origin.
    assert incident["facts"]["nan"]["what"] == "loss"
    origin = incident["facts"]["nan_origin"]
    assert (origin["op"], origin["site"], origin["cause"]) == ("log", "saturate.py:8", "log-of-zero")


def test_a_triaged_run_leaves_git_status_clean(tmp_path: Path) -> None:
    torch_needed("torch")
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    write(tmp_path, "train.py", """\
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        data = TensorDataset(torch.randint(0, 12, (16, 4)), torch.randint(0, 3, (16,)))
        model = nn.Sequential(nn.Embedding(10, 8), nn.Flatten(), nn.Linear(32, 3))
        for x, y in DataLoader(data, batch_size=4):
            nn.functional.cross_entropy(model(x), y).backward()
    """)
    subprocess.run([*git, "init", "-q", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "train.py"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "train"], cwd=tmp_path, check=True)
    result = triage("train.py", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    [folder] = (tmp_path / "triage-reports").iterdir()
    assert (folder / "batch.pt").is_file()  # user data, which must stay out of git
    status = subprocess.run([*git, "status", "--porcelain"], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert status.stdout == ""
    ignored = subprocess.run([*git, "status", "--porcelain", "--ignored"], cwd=tmp_path, capture_output=True, text=True)
    assert "triage-reports/" in ignored.stdout


def test_a_script_that_exhausts_its_address_space_still_gets_its_traceback_and_report(tmp_path):
    # The script fills its `ulimit -v` down to the last few KB and dies: without the reserve the child had no room
    # left to print the user's traceback, and ended with triage's own MemoryError instead.
    import resource

    script = write(tmp_path, "fill.py", """\
        blocks, size = [], 2**24
        while size >= 2**12:
            try:
                while True:
                    blocks.append(bytearray(size))
            except MemoryError:
                size //= 2
        raise MemoryError("the address space is full")
    """)
    limit = 1536 * 1024**2

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    result = subprocess.run([sys.executable, "-m", "triage", "--no-probes", str(script)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=TIMEOUT, env=_env(), preexec_fn=cap)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.startswith("Traceback (most recent call last):"), result.stderr[-2000:]
    assert "MemoryError: the address space is full" in result.stderr
    assert "internal error" not in result.stderr
    assert "oom.host-memory-error" in result.stderr  # and then the report, with the room given back

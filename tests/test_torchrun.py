"""Multi-rank jobs: one verdict per torchrun job, from its log (`triage explain`) and live (`python -m triage torchrun`).

The log tests read the real torchrun logs of corpus/logs/distributed-jobs/ and
small texts in the formats torchrun, SLURM and NCCL print; the live tests run
a few of the corpus jobs (gloo, CPU, two ranks, a few seconds each).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from triage.incident import ExceptionInfo, Frame
from triage.job_eval import load_labels
from triage.kb import load_knowledge_base
from triage.logparse import parse_text
from triage.ranks import ROOT as ROOT_ROLE
from triage.ranks import RankOutcome, choose_root
from triage.runner import jobdir
from triage.torchrun_log import read_job

JOBS = ROOT / "corpus" / "logs" / "distributed-jobs"
SCRIPTS = ROOT / "corpus" / "scripts" / "distributed"
LABELS = load_labels(ROOT / "corpus")


@pytest.fixture(scope="module")
def kb():
    return load_knowledge_base(env={}, cwd=ROOT)


def _explain(text: str, kb) -> dict:
    from triage.job_report import job_incident
    from triage.pipeline import triage_incident

    incident = job_incident(text, parse_text(text))
    assert incident is not None, "not read as a multi-rank job"
    return triage_incident(incident, kb, source="log").to_dict()


# --- choosing the root ------------------------------------------------------------------------------------------


def _error(type_: str, message: str, function: str = "<module>") -> ExceptionInfo:
    return ExceptionInfo(type_, message, [Frame("/home/ana/train.py", 10, function, user=True)])


PEER_LOST = "[pair.cc:553] Connection closed by peer [127.0.0.1]:1234. This is typically caused by a remote worker crashing."


def test_an_own_error_outranks_an_earlier_consequence():
    outcomes = [
        RankOutcome(0, exit_code=1, error=_error("RuntimeError", PEER_LOST), failed_at=10.0),
        RankOutcome(1, exit_code=1, error=_error("IndexError", "Target 10 is out of bounds."), failed_at=11.0),
    ]
    root = choose_root(outcomes)
    assert root.rank == 1 and root.role == ROOT_ROLE
    assert outcomes[0].consequence == "peer connection lost" and outcomes[0].role == "secondary"


def test_a_sigabrt_with_no_traceback_is_a_cause_and_terminate_without_exception_is_not():
    outcomes = [
        RankOutcome(0, exit_code=-6, signal="SIGABRT", error=ExceptionInfo("gloo::EnforceNotMet", "8 vs 4. Received data size "
                    "doesn't match expected size."), native_abort="terminate called after throwing an instance of 'gloo::EnforceNotMet'"),
        RankOutcome(1, exit_code=-6, signal="SIGABRT", order=1,
                    error=ExceptionInfo("RuntimeError", "terminate called without an active exception")),
    ]  # fmt: skip
    assert choose_root(outcomes).rank == 0


def test_a_rank_with_no_error_while_the_others_time_out_is_stuck():
    stacks = [Frame("/home/ana/train.py", 24, "flush_logs", user=True)]
    outcomes = [
        RankOutcome(0, exit_code=1, error=_error("RuntimeError", "[unbound_buffer.cc:81] Timed out waiting 5000ms for recv "
                    "operation to complete"), failed_at=5.0),
        RankOutcome(1, exit_code=-15, signal="SIGTERM", stacks=stacks, failed_at=6.0),
    ]  # fmt: skip
    root = choose_root(outcomes)
    assert root.rank == 1
    assert "stuck or busy in flush_logs (train.py:24)" in root.why


def test_the_rank_whose_collective_differs_is_the_root_when_all_time_out():
    def waiting(rank: int, call: str) -> RankOutcome:
        frames = [Frame("/home/ana/train.py", 12, "<module>", user=True),
                  Frame("/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 3252, call)]
        return RankOutcome(rank, exit_code=1, order=rank,
                           error=ExceptionInfo("RuntimeError", "Timed out waiting 5000ms for send operation", frames))

    outcomes = [waiting(0, "all_reduce"), waiting(1, "broadcast"), waiting(2, "all_reduce")]
    root = choose_root(outcomes)
    assert root.rank == 1 and "called broadcast while the others called all_reduce" in root.why


def test_no_failed_rank_means_no_root():
    assert choose_root([RankOutcome(0, exit_code=0), RankOutcome(1, exit_code=0)]) is None


# --- from a log -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LABELS))
def test_each_corpus_job_log_names_the_root_rank_and_error(name, kb):
    label = LABELS[name]
    report = _explain((JOBS / name).read_text(encoding="utf-8"), kb)
    root = [r for r in report["ranks"] if r["role"] == "root"]
    assert len(root) == 1 and report["incident"]["rank"] == root[0]["rank"]
    if isinstance(label["root_rank"], int):
        assert root[0]["rank"] == label["root_rank"], report["ranks"]
    said = " | ".join([root[0]["first_error"] or "", (report["diagnoses"] or [{}])[0].get("title", ""), root[0].get("why", "")])
    assert re.search(label["error"], said), said


def test_the_whole_failures_list_fills_ranks_not_only_the_root_cause_block(kb):
    report = _explain((JOBS / "label_out_of_range_rank3.log").read_text(encoding="utf-8"), kb)
    assert {r["rank"]: r["exit_code"] for r in report["ranks"]} == {0: -15, 1: -15, 2: -15, 3: 1}
    assert {r["rank"]: r["signal"] for r in report["ranks"]}[1] == "SIGTERM"
    assert report["incident"]["facts"]["torchrun_verdict"]["rank"] == 3
    assert report["diagnoses"][0]["rule"] == "index.class-label-out-of-range"


def test_a_c_plus_plus_abort_belongs_to_the_rank_that_died_of_sigabrt(kb):
    log = textwrap.dedent("""\
        terminate called after throwing an instance of 'gloo::EnforceNotMet'
          what():  [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match expected size. Is there a distributed collective mismatch in your code?
        W1125 18:58:36.729000 8680 site-packages/torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 8728 closing signal SIGTERM
        E1125 18:58:36.761000 8680 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) local_rank: 0 (pid: 8727) of binary: /usr/bin/python3
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
        ======================================================
        mismatch.py FAILED
        ------------------------------------------------------
        Failures:
        [1]:
          time      : 2026-11-25_18:58:36
          host      : localhost
          rank      : 1 (local_rank: 1)
          exitcode  : -15 (pid: 8728)  (SIGTERM)
          error_file: <N/A>
          traceback : Signal 15 (SIGTERM) received by PID 8728
        ------------------------------------------------------
        Root Cause (first observed failure):
        [0]:
          time      : 2026-11-25_18:58:36
          host      : localhost
          rank      : 0 (local_rank: 0)
          exitcode  : -6 (pid: 8727)  (SIGABRT)
          error_file: <N/A>
          traceback : Signal 6 (SIGABRT) received by PID 8727
        ======================================================
        """)  # a real run of a 2-rank all_reduce of 4 and 6 floats (torch 2.13.0, gloo)
    report = _explain(log, kb)
    assert report["incident"]["rank"] == 0
    assert report["incident"]["exception"]["type"] == "gloo::EnforceNotMet"
    assert "doesn't match expected size" in report["incident"]["exception"]["message"]
    assert {r["rank"]: r["role"] for r in report["ranks"]} == {0: "root", 1: "secondary"}


def test_a_rank_aborted_at_exit_without_destroying_its_process_group(kb):
    # A real run (torch 2.13, gloo, 2 ranks) of a script that never calls destroy_process_group: both ranks printed
    # their result, then one aborted as its interpreter exited (a race: 2 runs in 8 here)
    log = textwrap.dedent("""\
        sum [2.0, 2.0]
        sum [2.0, 2.0]
        terminate called without an active exception
        W1126 01:49:05.269000 11989 site-packages/torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 12034 closing signal SIGTERM
        E1126 01:49:05.285000 11989 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) local_rank: 1 (pid: 12035) of binary: /usr/bin/python3
        Traceback (most recent call last):
          File "/usr/bin/torchrun", line 8, in <module>
            sys.exit(main())
                     ^^^^^^
          File "/usr/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper
            return f(*args, **kwargs)
                   ^^^^^^^^^^^^^^^^^^
          File "/usr/lib/python3.11/site-packages/torch/distributed/run.py", line 1028, in main
            run(args)
          File "/usr/lib/python3.11/site-packages/torch/distributed/run.py", line 1019, in run
            elastic_launch(
          File "/usr/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 194, in __call__
            return launch_agent(
                   ^^^^^^^^^^^^^
          File "/usr/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
            raise ChildFailedError(
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
        =======================================================
        ok.py FAILED
        -------------------------------------------------------
        Failures:
        [1]:
          time      : 2026-11-26_01:49:05
          host      : localhost
          rank      : 0 (local_rank: 0)
          exitcode  : -15 (pid: 12034)  (SIGTERM)
          error_file: <N/A>
          traceback : Signal 15 (SIGTERM) received by PID 12034
        -------------------------------------------------------
        Root Cause (first observed failure):
        [0]:
          time      : 2026-11-26_01:49:05
          host      : localhost
          rank      : 1 (local_rank: 1)
          exitcode  : -6 (pid: 12035)  (SIGABRT)
          error_file: <N/A>
          traceback : Signal 6 (SIGABRT) received by PID 12035
        =======================================================
        """)
    report = _explain(log, kb)
    leading = report["diagnoses"][0]
    assert leading["rule"] == "distributed.process-group-not-destroyed" and report["incident"]["rank"] == 1
    assert "destroy_process_group()" in leading["fix"]
    # an exception thrown in C++ on another rank still wins over this weaker evidence
    thrown = log.replace("sum [2.0, 2.0]\n", "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
                         "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4.\n", 1)
    other = _explain(thrown, kb)
    assert other["incident"]["exception"]["type"] == "gloo::EnforceNotMet"
    assert "distributed.process-group-not-destroyed" not in [d["rule"] for d in other["diagnoses"][:1]]


def test_slurm_interleaved_rank_prefixes_without_a_torchrun_summary(kb):
    log = textwrap.dedent("""\
        1: Traceback (most recent call last):
        0: Traceback (most recent call last):
        1:   File "/home/ana/train.py", line 40, in <module>
        0:   File "/home/ana/train.py", line 44, in <module>
        1:     loss = criterion(model(x), y)
        0:     dist.all_reduce(loss)
        1: RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x130 and 128x64)
        0: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:5123
        srun: error: node-2: task 1: Exited with exit code 1
        """)
    report = _explain(log, kb)
    assert report["incident"]["rank"] == 1
    assert report["diagnoses"][0]["rule"] == "shape.linear-in-features"
    assert {r["rank"]: r["role"] for r in report["ranks"]} == {0: "secondary", 1: "root"}


def test_an_at_record_error_file_traceback_in_the_summary_is_the_ranks_error(kb):
    # Only torchrun's summary of a real @record job: the ranks' own `[rankN]:` tracebacks are cut away.
    text = (JOBS / "record_entry_point_rank1.log").read_text(encoding="utf-8")
    summary = "\n".join(line for line in text.splitlines() if not line.startswith("[rank"))
    report = _explain(summary, kb)
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert report["incident"]["rank"] == 1 and ranks[1]["role"] == "root"
    assert ranks[1]["first_error"].startswith("IndexError: index 12 is out of bounds")
    assert ranks[0]["first_error"].startswith("RuntimeError:") and ranks[0]["consequence_of"] == "peer connection lost"
    assert ranks[0]["exit_code"] == -15
    assert report["incident"]["exception"]["frames"][-1]["function"] == "main"


def test_nccl_watchdog_timeouts_name_the_rank_that_never_arrived(kb):
    # The watchdog lines are NCCL's (https://github.com/XPixelGroup/BasicSR/issues/737); rank 1 printed nothing.
    log = textwrap.dedent("""\
        [rank0]:[E626 06:24:44.159932949 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600030 milliseconds before timing out.
        [rank2]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.
        [rank0]:[E626 06:24:45.160000000 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 0] Exception (either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 808, last completed NCCL work: 807.
        [rank0]: RuntimeError: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600030 milliseconds before timing out.
        [rank2]: RuntimeError: [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
        Failures:
        [1]:
          time      : 2024-06-26_06:24:50
          host      : gpu-1
          rank      : 1 (local_rank: 1)
          exitcode  : -15 (pid: 2012)  (SIGTERM)
          error_file: <N/A>
          traceback : Signal 15 (SIGTERM) received by PID 2012
        [2]:
          time      : 2024-06-26_06:24:50
          host      : gpu-1
          rank      : 2 (local_rank: 2)
          exitcode  : -6 (pid: 2013)  (SIGABRT)
          error_file: <N/A>
          traceback : Signal 6 (SIGABRT) received by PID 2013
        ------------------------------------------------------------
        Root Cause (first observed failure):
        [0]:
          time      : 2024-06-26_06:24:49
          host      : gpu-1
          rank      : 0 (local_rank: 0)
          exitcode  : -6 (pid: 2011)  (SIGABRT)
          error_file: <N/A>
          traceback : Signal 6 (SIGABRT) received by PID 2011
        """)
    report = _explain(log, kb)
    assert report["incident"]["rank"] == 1
    assert report["diagnoses"][0]["rule"] == "distributed.rank-stuck"
    assert report["incident"]["facts"]["torchrun_verdict"]["rank"] == 0


def test_a_single_process_log_is_not_a_job():
    text = 'Traceback (most recent call last):\n  File "t.py", line 1, in <module>\nValueError: x\n'
    assert read_job(text, parse_text(text)) is None


# --- live ---------------------------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TRIAGE_DEBUG"] = "1"
    return env


def _processes_with(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if text.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _live(tmp_path: Path, launcher: list[str], script: str, nproc: int = 2) -> tuple[subprocess.CompletedProcess, dict]:
    pytest.importorskip("torch")
    command = [sys.executable, "-m", "triage", "--report-dir", str(tmp_path / "report"), "--json", str(tmp_path / "job.json"),
               *launcher, "--standalone", f"--nproc_per_node={nproc}", script]  # fmt: skip
    done = subprocess.run(command, cwd=SCRIPTS, env=_env(), capture_output=True, text=True, timeout=180)
    report = json.loads((tmp_path / "job.json").read_text()) if (tmp_path / "job.json").exists() else {}
    return done, report


def test_live_job_one_report_rooted_at_the_failing_rank(tmp_path):
    done, report = _live(tmp_path, ["torchrun"], "shape_bug_on_rank1.py")
    assert done.returncode == 1, done.stderr[-3000:]
    assert report["incident"]["rank"] == 1 and "4x17 and 16x8" in report["incident"]["exception"]["message"]
    assert report["diagnoses"][0]["rule"] == "shape.linear-in-features"
    roles = {r["rank"]: r["role"] for r in report["ranks"]}
    assert roles == {0: "secondary", 1: "root"}
    assert report["rerun"]["command"] == "python -m triage torchrun --standalone --nproc_per_node=2 shape_bug_on_rank1.py"
    folders = [p for p in (tmp_path / "report").rglob("*") if p.is_dir()]
    assert all(any(p.iterdir()) for p in folders), "an empty report folder"
    assert (tmp_path / "report" / "ranks" / "rank1" / "report.json").is_file()
    assert done.stderr.count("triage: job report written to") == 1
    assert not _processes_with("shape_bug_on_rank1.py")


def test_live_stuck_rank_is_dumped_on_the_agents_sigterm_and_keeps_its_exit_status(tmp_path):
    done, report = _live(tmp_path, ["-m", "torch.distributed.run"], "stuck_rank1_lock.py")
    assert done.returncode == 1, done.stderr[-3000:]
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert report["incident"]["rank"] == 1 and ranks[1]["role"] == "root"
    assert ranks[1]["exit_code"] == -signal.SIGTERM and ranks[1]["signal"] == "SIGTERM"
    frames = report["incident"]["exception"]["frames"]
    assert any(f["file"].endswith("stuck_rank1_lock.py") for f in frames)
    assert report["diagnoses"][0]["rule"] == "distributed.rank-stuck"
    assert not _processes_with("stuck_rank1_lock.py")


def test_ranks_started_by_torchrun_with_dash_m_triage_write_one_job_report(tmp_path):
    pytest.importorskip("torch")
    command = ["torchrun", "--standalone", "--nproc_per_node=2", "-m", "triage", "empty_shard_metric_rank2.py"]
    command[2] = "--nproc_per_node=3"
    env = _env()
    env["TMPDIR"] = str(tmp_path)  # the job folder, keyed by TORCHELASTIC_RUN_ID, goes here
    work = tmp_path / "work"
    work.mkdir()
    script = work / "empty_shard_metric_rank2.py"
    script.write_text((SCRIPTS / script.name).read_text())
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stderr[-3000:]
    reports = list((work / "triage-reports").glob("*-job/report.json"))
    assert len(reports) == 1, done.stderr[-3000:]
    report = json.loads(reports[0].read_text())
    assert report["incident"]["rank"] == 2 and report["incident"]["exception"]["type"] == "ZeroDivisionError"
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1, 2]
    assert not list(tmp_path.glob("triage-job-*")), "the job folder was not cleaned up"


def test_a_late_write_after_the_node_s_last_rank_cleaned_up_does_not_recreate_the_job_folder(tmp_path):
    # The race behind a job folder left in TMPDIR: a rank stopped by the agent writes its exit status, the node's
    # last rank then writes the report and removes the folder, and only then the first rank adds its stacks.
    folder = tmp_path / "triage-job-none-1"
    jobdir.update_record(folder, 0, exit_code=-15, exited_at=1.0)
    assert jobdir.read_records(folder)[0]["exit_code"] == -15
    shutil.rmtree(folder)
    jobdir.update_record(folder, 0, create=False, stacks=[{"file": "train.py", "line": 3}])
    assert not folder.exists()
    # An exit status is written with create=True (the default): the cleanup cannot have happened before it.
    jobdir.update_record(folder, 1, exit_code=1)
    assert [r["rank"] for r in jobdir.read_records(folder)] == [1]


def test_live_job_that_succeeds_leaves_no_report_and_exits_zero(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "ok.py"
    # One write per rank: two ranks' print() calls interleave word by word on the shared pipe. Without
    # destroy_process_group() a rank can abort as it exits (distributed.process-group-not-destroyed), on some runs.
    script.write_text("import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                      "x = torch.ones(2)\ndist.all_reduce(x)\nimport os\nos.write(1, f'sum {x.tolist()}\\n'.encode())\n"
                      "dist.destroy_process_group()\n")
    command = [sys.executable, "-m", "triage", "torchrun", "--standalone", "--nproc_per_node=2", "ok.py"]
    done = subprocess.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("sum [2.0, 2.0]") == 2
    assert not (tmp_path / "triage-reports").exists()
    assert "triage:" not in done.stderr


def test_live_abort_at_exit_with_a_process_group_left_initialized(tmp_path):
    # The race of a real job made deterministic: the script ends normally with its process group never destroyed,
    # and the process is then aborted while it shuts down (as Gloo's threads do on some runs)
    pytest.importorskip("torch")
    script = tmp_path / "one_rank.py"
    script.write_text(textwrap.dedent("""\
        import atexit, os, torch.distributed as dist
        dist.init_process_group('gloo', init_method='file://' + os.path.abspath('pg'), rank=0, world_size=1)
        atexit.register(os.abort)
        print('done')
        """))
    done = subprocess.run([sys.executable, "-m", "triage", "--json", "out.json", "one_rank.py"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == -6 or done.returncode == 134, done.stderr[-2000:]
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["diagnoses"][0]["rule"] == "distributed.process-group-not-destroyed", done.stderr[-2000:]
    assert report["incident"]["facts"]["process_group_alive_at_exit"] is True
    # a script that exits with an error status has not ended cleanly: the abort is not read as its shutdown's
    script.write_text(script.read_text().replace("print('done')", "raise SystemExit(3)"))
    (tmp_path / "pg").unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-m", "triage", "--json", "failed.json", "one_rank.py"], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=180)
    failed = json.loads((tmp_path / "failed.json").read_text())
    assert "died_at_exit" not in failed["incident"]["facts"], done.stderr[-2000:]
    assert "process_group_alive_at_exit" not in failed["incident"]["facts"]
    assert "distributed.process-group-not-destroyed" not in [d["rule"] for d in failed["diagnoses"]]


@pytest.mark.parametrize("script", ["missing.py", "folder"])
def test_a_script_python_cannot_run_is_one_line_and_launches_nothing(tmp_path, script):
    (tmp_path / "folder").mkdir()
    command = [sys.executable, "-m", "triage", "torchrun", "--standalone", "--nproc_per_node=2", script]
    done = subprocess.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith(f"triage: {script}: ") and done.stderr.count("\n") == 1, done.stderr
    assert "nothing was launched" in done.stderr and "torchrun" not in done.stderr.lower()

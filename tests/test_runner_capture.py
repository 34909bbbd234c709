"""Live capture in-process: summaries, secrets, faulthandler dumps, exception capture, report folders, options."""

from __future__ import annotations

import faulthandler
import json
import threading
import time
from pathlib import Path

import pytest

from triage.capture.faultdump import parse_dumps, without_hidden_frames
from triage.capture.secrets import SCRUBBED, is_secret_name, scrub_argv, scrub_text
from triage.capture.summarize import safe_repr, summarize
from triage.cli import UsageError
from triage.diagnosis import Report
from triage.incident import Incident
from triage.report_dir import claim_folder, write_report
from triage.runner.channel import PHASE_RUNNING, Beat
from triage.runner.cli import parse

torch = pytest.importorskip("torch")
nn = torch.nn


# --- secrets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("password", True), ("db_password", True), ("dbPassword", True), ("OPENAI_API_KEY", True), ("apikey", True),
        ("hf_token", True), ("access_token", True), ("AWS_SECRET_ACCESS_KEY", True), ("session_id", True),
        ("Authorization", True), ("private_key", True), ("cookie", True),
        ("tokens", False), ("tokenizer", False), ("max_tokens", False), ("num_tokens", False), ("author", False),
        ("key", False), ("keys", False), ("lr", False), ("passes", False),
    ],
)  # fmt: skip
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_secret_text_and_argv() -> None:
    assert scrub_text("Config(lr=0.1, hf_token='hf_abcdefghijklmnopqrstuvwx', tokens=5)") == (
        f"Config(lr=0.1, hf_token='{SCRUBBED}', tokens=5)"
    )
    assert scrub_text('{"password": "hunter2", "batch": 4}') == f'{{"password": "{SCRUBBED}", "batch": 4}}'
    assert scrub_text("postgres://trainer:s3cret@db:5432/runs") == f"postgres://trainer:{SCRUBBED}@db:5432/runs"
    assert scrub_text("key sk-proj-abcdefghijklmnopqrstuvwxyz in the log") == f"key {SCRUBBED} in the log"
    assert scrub_text("max_tokens=512 token count 3") == "max_tokens=512 token count 3"
    assert scrub_argv(["--lr", "0.1", "--hf-token", "abc", "--password=x", "--tokens", "5"]) == [
        "--lr", "0.1", "--hf-token", SCRUBBED, f"--password={SCRUBBED}", "--tokens", "5",
    ]  # fmt: skip


# --- summaries -------------------------------------------------------------------------------


def test_tensor_summary_small_cpu_has_statistics() -> None:
    weight = torch.tensor([[1.0, float("nan")], [float("inf"), -2.0]], requires_grad=True)
    scaled = weight * 2
    info = summarize(scaled)
    assert info["shape"] == [2, 2] and info["dtype"] == "float32" and info["device"] == "cpu"
    assert info["grad_fn"] == "MulBackward0" and info["is_leaf"] is False and info["requires_grad"] is True
    assert info["stats"] == {"nan": 1, "inf": 1, "min": -4.0, "max": 2.0, "mean": -1.0}
    assert info["text"] == "tensor[2, 2] float32 cpu grad_fn=MulBackward0 x∈[-4, 2] μ=-1 NaN×1 Inf×1"
    labels = torch.tensor([3, 9, 10])
    labels.add_(0)
    assert summarize(labels)["stats"] == {"min": 3, "max": 10} and summarize(labels)["version"] == 1
    assert summarize(torch.ones(3, 4).t())["contiguous"] is False


def test_tensor_summary_never_reads_large_or_device_tensors() -> None:
    big = torch.zeros(1000, 1000)
    assert "stats" not in summarize(big) and summarize(big)["numel"] == 1_000_000
    on_meta = torch.empty(8, 8, device="meta")
    info = summarize(on_meta)
    assert info["device"] == "meta" and "stats" not in info and info["text"] == "tensor[8, 8] float32 meta"


class PositionalEncoding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("pe", torch.zeros(16, 8))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.pos = PositionalEncoding()
        self.head = nn.Linear(8, 2)


def test_module_summary_names_the_part_on_another_device() -> None:
    model = Encoder()
    model.pos.pe = model.pos.pe.to("meta")  # a CPU-only stand-in for "the buffer stayed on cpu while the rest is on cuda"
    info = summarize(model)
    assert info["params"] == 10 * 8 + 8 * 2 + 2 and info["devices"] == {"cpu": 3, "meta": 1}
    assert info["outliers"] == ["buffer pe of PositionalEncoding (pos) is on meta; the other 3 parameters and buffers are on cpu"]
    model.head.half()
    dtypes = summarize(model)["outliers"]
    assert any(line.startswith("parameter weight of Linear (head) is of dtype float16") for line in dtypes)


def test_optimizer_loader_and_array_summaries() -> None:
    numpy = pytest.importorskip("numpy")
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    assert summarize(optimizer)["param_groups"][0] == {
        "params": 2, "lr": 0.05, "momentum": 0.9, "weight_decay": 0, "nesterov": False, "foreach": None, "fused": None,
    }  # fmt: skip
    dataset = torch.utils.data.TensorDataset(torch.zeros(10, 4))
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2, timeout=5, multiprocessing_context="spawn")
    info = summarize(loader)
    assert (info["batch_size"], info["num_workers"], info["timeout"], info["multiprocessing_context"]) == (4, 2, 5, "spawn")
    assert (info["dataset"], info["dataset_len"], info["sampler"]) == ("TensorDataset", 10, "SequentialSampler")
    array = numpy.array([[1.0, numpy.nan], [3.0, 4.0]])
    assert summarize(array)["text"] == "ndarray[2, 2] float64 x∈[1, 4] NaN×1"


def test_hostile_values_are_contained() -> None:
    class Raises:
        def __repr__(self):
            raise RuntimeError("no repr for you")

    class Hangs:
        def __repr__(self):
            while True:
                pass

    class BadLen(torch.utils.data.Dataset):
        def __len__(self):
            raise OSError("index not mounted")

        def __getitem__(self, i):
            return i

    assert safe_repr(Raises()) == "<Raises: repr() failed>"
    started = time.monotonic()
    assert safe_repr(Hangs()) == "<Hangs object>"
    assert time.monotonic() - started < 2
    assert summarize(torch.utils.data.DataLoader(BadLen(), batch_size=2))["dataset_len"] is None
    looped: list = [1]
    looped.append(looped)
    assert summarize(looped)["text"] == "[1, [1, list of 2 items]]"  # two levels deep, then a count
    many = summarize(list(range(10**6)))
    assert many["len"] == 10**6 and len(many["items"]) == 8 and many["text"].endswith("… 999992 more]")
    assert summarize({"api_key": "sk-abc", "lr": 0.1})["text"] == "{api_key: [scrubbed], lr: 0.1}"
    assert summarize("x" * 10_000)["len"] == 10_000 and len(summarize("x" * 10_000)["text"]) <= 120
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(text=safe_repr(Hangs())))
    thread.start()
    thread.join(5)
    assert result == {"text": "<Hangs object>"}  # no timer outside the main thread: the repr is not called


# --- faulthandler dumps ----------------------------------------------------------------------


def test_parse_a_real_faulthandler_dump(tmp_path: Path) -> None:
    release = threading.Event()

    def waiting_worker():
        release.wait()

    thread = threading.Thread(target=waiting_worker, daemon=True)
    thread.start()
    dump_file = tmp_path / "dump.txt"
    with open(dump_file, "w") as handle:
        faulthandler.dump_traceback(handle, all_threads=True)
    release.set()
    dumps = parse_dumps("Fatal Python error: Segmentation fault\n\n" + dump_file.read_text())
    assert len(dumps) == 1 and dumps[0].fatal == "Segmentation fault" and dumps[0].signal == "SIGSEGV"
    current = dumps[0].crashed_thread()
    assert current.current and current.ident == threading.get_ident()
    assert current.frames[-1].function == "test_parse_a_real_faulthandler_dump"
    assert current.frames[-1].code == "faulthandler.dump_traceback(handle, all_threads=True)"
    other = dumps[0].thread(thread.ident)
    assert other is not None and "waiting_worker" in [f.function for f in other.frames]
    assert dumps[0].main_thread(None) is dumps[0].threads[-1]
    from triage.capture.frames import _TRIAGE_DIR

    hidden = f'  File "{_TRIAGE_DIR}runner/child.py", line 9 in run_child\n  File "<frozen runpy>", line 88 in _run_code\n'
    kept = '  File "/home/u/train.py", line 3 in main\n'
    assert without_hidden_frames(kept + hidden) == kept


# --- live exceptions -------------------------------------------------------------------------


def _raise_and_capture(function):
    from triage.capture.live import capture_exception
    from triage.tracking import Tracker

    try:
        function()
    except Exception as exc:  # noqa: BLE001 - the point is to capture anything
        return capture_exception(exc, tracker=Tracker())
    raise AssertionError("did not raise")


def test_capture_finds_the_failing_module_and_its_input() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(64, 10))
    images = torch.randn(2, 3, 8, 8)

    def forward():
        logits = model(images)
        return logits

    live = _raise_and_capture(forward)
    incident = live.incident
    assert incident.exception.type == "RuntimeError"
    assert "mat1 and mat2 shapes cannot be multiplied (2x144 and 64x10)" in incident.exception.message
    assert isinstance(live.module, nn.Linear) and live.module_name == "2" and live.model is model
    assert live.module_args[0].shape == (2, 144)
    assert incident.facts["module"] == {"class": "Linear", "name": "2", "inputs": [summarize(live.module_args[0])["text"]]}
    assert incident.facts["model"]["params"] == sum(p.numel() for p in model.parameters())
    user = [f for f in incident.exception.frames if f.user]
    assert user[-1].function == "forward" and user[-1].locals["images"]["shape"] == [2, 3, 8, 8]
    assert not any("/triage/" in f.file for f in incident.exception.frames)
    assert incident.facts["cuda_poisoned"] is False and incident.environment["torch"] == torch.__version__


def test_capture_keeps_the_chain_and_unwraps_a_worker_traceback() -> None:
    from torch._utils import ExceptionWrapper

    def worker_failure():
        try:
            {"x": 1}["label"]
        except KeyError:  # in the worker process; the main process re-raises it from the wrapper
            wrapper = ExceptionWrapper(where="in DataLoader worker process 2")
        wrapper.reraise()

    live = _raise_and_capture(worker_failure)
    incident = live.incident
    kinds = [(e.type, e.wrapper, e.worker) for e in incident.exceptions]
    assert kinds == [("KeyError", True, None), ("KeyError", False, 2)]
    assert incident.exception.message == "'label'" and incident.worker == 2
    assert incident.exception.frames[-1].function == "worker_failure"

    def chained():
        try:
            int("seven")
        except ValueError as exc:
            raise RuntimeError("bad config value") from exc

    chain = _raise_and_capture(chained).incident.exceptions
    assert [(e.type, e.link) for e in chain] == [("ValueError", None), ("RuntimeError", "cause")]


def test_capture_attaches_anomaly_modes_forward_trace_from_the_recorded_warning() -> None:
    import warnings

    from triage.capture.live import capture_exception
    from triage.runner.hooks import _clip_warning

    weight = torch.zeros(3, requires_grad=True)

    def forward_and_backward():
        with torch.autograd.detect_anomaly(check_nan=True):
            logs = torch.log(weight * 0)  # log(0) = -inf: LogBackward0 returns NaN times a zero gradient
            (logs * 0).sum().backward()

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            forward_and_backward()
        except RuntimeError as exc:
            recorded = [_clip_warning(f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}") for w in seen]
            incident = capture_exception(exc, log_lines=recorded).incident
        else:
            raise AssertionError("backward did not raise")
    exc = incident.exception
    assert "returned nan values" in exc.message and exc.side_label == "forward call"
    side = exc.side_user_frame()
    assert (side.function, side.code) == ("forward_and_backward", "logs = torch.log(weight * 0)  # log(0) = -inf: LogBackward0 returns NaN times a zero gradient")
    assert not any("/triage/" in f.file or "runpy" in f.file for f in exc.side_frames)


def test_capture_reads_dynamos_user_code_from_the_message() -> None:
    message = (
        "Attempted to call function marked as skipped\n\nfrom user code:\n"
        '   File "/home/u/model.py", line 23, in forward\n    t0 = time.perf_counter()\n              ^^^^\n\n'
        "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace"
    )

    def compiled():
        raise RuntimeError(message)

    exc = _raise_and_capture(compiled).incident.exception
    assert exc.side_label == "user code"
    assert [(f.file, f.line, f.code) for f in exc.side_frames] == [("/home/u/model.py", 23, "t0 = time.perf_counter()")]


def test_a_long_warning_with_a_stack_keeps_its_innermost_frames() -> None:
    from triage.runner.hooks import MAX_STACK_WARNING_CHARS, MAX_WARNING_CHARS, _clip_warning

    frames = "".join(f'\n  File "/home/u/m{n}.py", line {n}, in f{n}\n    y = g{n}(x)' for n in range(400))
    text = _clip_warning("graph.py:979: UserWarning: Error detected in LogBackward0. Traceback of forward call that caused the error:" + frames)
    assert len(text) <= MAX_STACK_WARNING_CHARS
    lines = text.split("\n")
    assert lines[0].endswith("caused the error:") and lines[1].startswith('  File "')
    assert lines[-1] == "    y = g399(x)"
    assert _clip_warning("w" * 5000) == "w" * MAX_WARNING_CHARS


def test_cuda_errors_are_recognised_as_poisoning_the_context() -> None:
    from triage.capture.live import cuda_poisoned

    assert cuda_poisoned(["CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously reported"])
    assert cuda_poisoned(["CUDA error: an illegal memory access was encountered"])
    assert not cuda_poisoned(["CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity)"])


# --- hang descriptions -----------------------------------------------------------------------


def test_hang_descriptions_name_the_class_line_and_call(tmp_path: Path) -> None:
    from triage.incident import Frame
    from triage.runner.postmortem import ProcessStacks, _describe, hang_incident
    from triage.capture.faultdump import Dump, ThreadStack

    source = tmp_path / "data.py"
    source.write_text("import threading\n\nclass Shards:\n    def __getitem__(self, i):\n        self.lock.acquire()\n")
    worker_loop = "/venv/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py"
    blocked = [Frame(worker_loop, 374, "_worker_loop"), Frame(str(source), 5, "__getitem__", "self.lock.acquire()", True)]
    idle = [Frame(worker_loop, 334, "_worker_loop"), Frame("/usr/lib/python3.11/multiprocessing/queues.py", 113, "get")]
    assert _describe(blocked, "S").startswith("is blocked in Shards.__getitem__ at ")
    assert _describe(blocked, "S").endswith("data.py:5 in `self.lock.acquire()`")
    assert _describe(blocked, "R").startswith("is busy in Shards.__getitem__")
    assert _describe(idle, "S") == "is idle, waiting for indices to load"

    waiting = [Frame("/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1291, "_try_get_data")]
    beat = Beat(phase=PHASE_RUNNING, batches=12, epoch_batches=12, iterators=1, awaited_worker=1, main_thread=1)
    processes = [
        ProcessStacks(10, "main", dump=Dump(None, [ThreadStack(1, True, waiting)])),
        ProcessStacks(11, "worker", 0, dump=Dump(None, [ThreadStack(1, True, idle)])),
        ProcessStacks(12, "worker", 1, dump=Dump(None, [ThreadStack(1, True, blocked)])),
        ProcessStacks(13, "worker", 2, skipped="started by exec"),
    ]

    class NoFiles:
        def read_json(self, name):
            return None

    incident, texts = hang_incident(NoFiles(), processes, beat, 301.0, 300.0)
    assert incident.kind == "hang" and incident.exception.type == "Hang"
    assert incident.exception.message == (
        "no progress for 301 s: the main thread waits for batch 13 (index 12) of the DataLoader, "
        "which DataLoader worker 1 is preparing"
    )
    assert [e.worker for e in incident.exceptions] == [None, 0, 1]
    assert incident.facts["hang_summary"][-1] == "DataLoader worker 2 (pid 13): stack not read (started by exec)"
    assert "=== DataLoader worker 1 (pid 12) ===" in texts["stacks.txt"]


# --- report folders, options, heartbeat --------------------------------------------------------


def test_report_folders(tmp_path: Path) -> None:
    first = claim_folder(explicit=str(tmp_path / "out"), root="", label="train", run_id="run1")
    second = claim_folder(explicit=str(tmp_path / "out"), root="", label="train", run_id="run1")
    again = claim_folder(explicit=str(tmp_path / "out"), root="", label="train", run_id="run2")
    assert (first.name, second.name, again.name) == ("out", "out-2", "out")
    assert [p.name for p in again.glob(".triage-run-*")] == [".triage-run-run2"]
    a = claim_folder(explicit=None, root=str(tmp_path / "reports"), label="my train.py", run_id="r", when=0)
    b = claim_folder(explicit=None, root=str(tmp_path / "reports"), label="my train.py", run_id="r", when=0)
    assert a.name.endswith("-my_train.py") and b.name == a.name + "-2"
    report = Report(source="run", incident=Incident(kind="exception", source="run"))
    artifacts = write_report(report, a, texts={"stacks.txt": "x"}, json_copy=str(tmp_path / "copy.json"))
    assert json.loads((a / "report.json").read_text())["artifacts"] == artifacts
    assert (tmp_path / "copy.json").read_text() == (a / "report.json").read_text()


def test_run_options() -> None:
    options = parse(["--report-dir", "r", "--json=j.json", "--no-probes", "--hang-timeout", "2.5", "--on-hang", "kill",
                     "--rules", "a.yaml", "--rules", "b", "train.py", "--lr", "0.1", "--json", "x"])  # fmt: skip
    assert (options.target, options.module, options.args) == ("train.py", False, ["--lr", "0.1", "--json", "x"])
    assert (options.report_dir, options.json, options.probes) == ("r", "j.json", False)
    assert (options.hang_timeout, options.on_hang, options.rules, options.label) == (2.5, "kill", ["a.yaml", "b"], "train")
    module = parse(["-m", "pkg.train", "-m", "x"])
    assert (module.target, module.module, module.args, module.label) == ("pkg.train", True, ["-m", "x"], "train")
    assert parse(["--", "-weird-name.py", "a"]).target == "-weird-name.py"
    assert parse(["--help"]) is None
    for bad in (["--nope", "x.py"], [], ["--hang-timeout"], ["--hang-timeout", "-1", "x.py"], ["--on-hang", "x", "y.py"]):
        with pytest.raises(UsageError):
            parse(bad)


def test_heartbeat_layout_round_trips() -> None:
    beat = Beat(started_pid=7, phase=PHASE_RUNNING, seq=3, batches=12, steps=11, iterators=1, epoch_batches=12,
                awaited_worker=-1, main_thread=2**63, rss=1 << 30, peak_rss=2 << 30, progress_time=5.5)  # fmt: skip
    buffer = bytearray(4096)
    beat.pack_into(buffer)
    assert Beat.unpack(bytes(buffer)) == beat and beat.armed
    assert Beat.unpack(b"\0" * 4096) == Beat() and not Beat().armed


def test_live_state_in_markdown() -> None:
    from triage.report_dir import live_state_markdown

    incident = Incident(kind="exception", source="run")
    incident.facts = {"progress": {"batches": 3, "optimizer_steps": 2}, "device_outliers": ["buffer pe of X is on cpu"]}
    text = live_state_markdown(Report(source="run", incident=incident, environment={"python": "3.11.7", "torch": "2.13.0"}))
    assert "**Progress:** batches 3, optimizer steps 2" in text and "- buffer pe of X is on cpu" in text
    assert "- python 3.11.7, torch 2.13.0" in text


def test_spawned_workers_get_the_stack_dump_handler_through_worker_init(tmp_path: Path) -> None:
    import functools
    import os
    import signal as signals

    from triage.runner.channel import DUMP_SIGNAL, Channel, dump_ready_marker
    from triage.runner.hooks import TorchHooks, _UNCHANGED, worker_started
    from triage.tracking import Tracker

    channel = Channel(str(tmp_path))
    (tmp_path / "stacks.txt").write_text("")
    seen = []
    try:
        worker_started(seen.append, str(tmp_path), 3)  # what a spawned worker runs first
        assert seen == [3] and (tmp_path / dump_ready_marker(os.getpid())).exists()
        signals.raise_signal(DUMP_SIGNAL)  # the handler writes where the parent reads
        assert "test_spawned_workers_get_the_stack_dump_handler" in (tmp_path / "stacks.txt").read_text()
    finally:
        from triage.runner import hooks as runner_hooks

        faulthandler.unregister(DUMP_SIGNAL)
        while runner_hooks._kept_files:
            runner_hooks._kept_files.pop().close()

    def user_init(worker_id):
        return worker_id

    hooks = TorchHooks(Tracker(), None, channel, on_error=lambda exc: (_ for _ in ()).throw(exc))
    dataset = torch.utils.data.TensorDataset(torch.zeros(4, 2))
    spawned = torch.utils.data.DataLoader(dataset, num_workers=2, multiprocessing_context="spawn", worker_init_fn=user_init)
    original = hooks._lend_worker_init(spawned)
    assert original is user_init and isinstance(spawned.worker_init_fn, functools.partial)
    assert spawned.worker_init_fn.func is worker_started and spawned.worker_init_fn.args == (user_init, str(tmp_path))
    forked = torch.utils.data.DataLoader(dataset, num_workers=2, multiprocessing_context="fork")
    assert hooks._lend_worker_init(forked) is _UNCHANGED and forked.worker_init_fn is None

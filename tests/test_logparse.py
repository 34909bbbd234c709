"""The log parser on the formats users paste, built from real PyTorch output."""

import pytest
from conftest import FIXTURES

from triage.logparse import parse_text


def parse(name):
    # Bytes, not read_text(): universal newlines would turn progress-bar \r into line breaks.
    return parse_text((FIXTURES / name).read_bytes().decode("utf-8"))


def test_plain_traceback_frames_and_user_code():
    incident = parse("chained_cause.log")
    assert [e.type for e in incident.exceptions] == ["KeyError", "ValueError"]
    assert incident.exceptions[1].link == "cause"
    # The root cause is the first exception of the chain.
    assert incident.exception.type == "KeyError"
    assert incident.exception.message == "'batch_size'"
    frame = incident.exception.frames[-1]
    assert (frame.file, frame.line, frame.function, frame.code, frame.user) == (
        "/tmp/gen/chain.py", 4, "get", "return cfg[k]", True,
    )


def test_dataloader_worker_traceback_is_unwrapped():
    incident = parse("dataloader_worker_keyerror.log")
    outer, inner = incident.exceptions
    assert outer.wrapper and outer.message.startswith("Caught KeyError in DataLoader worker process 0.")
    assert incident.exception is inner
    assert (inner.type, inner.message, inner.worker) == ("KeyError", "'label'", 0)
    assert inner.user_frame().function == "__getitem__"
    assert inner.user_frame().line == 7
    assert not inner.frames[0].user  # torch's worker loop is library code
    assert incident.worker == 0


def test_ipython8_cells_and_arrows():
    incident = parse("ipython8.log")
    exc = incident.exception
    assert exc.type == "RuntimeError"
    assert exc.message == "mat1 and mat2 shapes cannot be multiplied (64x2704 and 400x120)"
    cells = [f for f in exc.frames if f.user]
    assert [(f.file, f.line, f.code) for f in cells] == [
        ("Cell In[7]", 12, "out = model(x)"),
        ("Cell In[5]", 14, "x = self.fc1(x)"),
    ]
    library = [f for f in exc.frames if not f.user]
    assert library[0].line == 1501 and library[0].code == "return forward_call(*args, **kwargs)"


def test_ipython7_input_frames():
    incident = parse("ipython7.log")
    exc = incident.exception
    assert exc.message.startswith("size mismatch, m1: [64 x 784], m2: [320 x 10]")
    user = exc.user_frame()
    assert (user.file, user.function, user.line, user.code) == ("<ipython-input-3-9c1e2d3f4a5b>", "forward", 12, "return self.fc(x)")


def test_vscode_exception_view():
    incident = parse("vscode.log")
    exc = incident.exception
    assert exc.type == "RuntimeError"
    assert exc.message == "mat1 and mat2 shapes cannot be multiplied (4x57600 and 64x128)"
    assert [f.line for f in exc.frames] == [31, 58]


def test_interleaved_ranks_are_pulled_apart():
    incident = parse("ranks_interleaved.log")
    ranks = sorted(e.rank for e in incident.exceptions)
    assert ranks == [0, 1]
    for exc in incident.exceptions:
        assert [f.line for f in exc.frames] == [77, 61, 19]
        assert exc.message == "mat1 and mat2 shapes cannot be multiplied (8x1024 and 512x10)"
    # rank 1's traceback starts first in the file: it is the first observed failure.
    assert incident.exception.rank == 1 and incident.rank == 1


def test_prefixes_ansi_and_progress_bars_are_cleaned():
    incident = parse("ranks_interleaved.log")
    assert "starting epoch 1" in incident.log_lines[1]
    assert not any("\x1b" in line for line in incident.log_lines)
    bar = [line for line in incident.log_lines if line.startswith("Epoch 1:")]
    assert bar == ["Epoch 1:  14%|█▍        | 14/100 [00:03<00:21]"]
    assert incident.log_lines[0] == "epoch 0 step 100 loss 2.301"


def test_markdown_fences_and_quotes():
    incident = parse("markdown_quoted.log")
    assert incident.exception.message == "shape '[3, -1]' is invalid for input of size 40"
    assert incident.exception.frames[0].code == "y = x.view(3, -1)"


def test_torchrun_summary_gives_rank_exit_code_and_signal():
    incident = parse("torchrun_sigkill.log")
    assert incident.kind == "hard-crash"
    assert incident.signal == "SIGKILL"
    assert incident.exit_code == -9
    assert incident.rank == 1
    assert incident.exception.short_type == "ChildFailedError"


def test_cuda_assertion_lines_are_kept_around_the_traceback():
    incident = parse("cuda_assert_indexing.log")
    assert incident.exception.message.startswith("CUDA error: device-side assert triggered\nCUDA kernel errors")
    assert any("Assertion `srcIndex < srcSelectDimSize` failed." in line for line in incident.log_lines)
    assert incident.exception.user_frame().code == "x = self.transformer.drop(tok_emb + pos_emb)"


def test_python2_era_traceback():
    incident = parse("python2.log")
    assert incident.exception.message.startswith("size mismatch, m1: [64 x 320], m2: [500 x 50]")
    assert incident.exception.user_frame().function == "forward"
    assert not incident.exception.frames[2].user  # dist-packages


def test_final_error_line_without_traceback():
    incident = parse_text(
        "Epoch 3/10\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.14 GiB\n"
    )
    assert incident.exception.type == "torch.OutOfMemoryError"
    assert incident.exception.short_type == "OutOfMemoryError"
    assert incident.exception.frames == []


def test_warnings_only_log_with_nan_loss_is_a_nan_incident():
    incident = parse_text(
        "epoch 1 step 10 loss=2.31\n"
        "/usr/lib/python3.11/site-packages/torch/autograd/graph.py:768: UserWarning: some warning\n"
        "epoch 1 step 20 loss=nan\n"
        "epoch 1 step 30 loss=nan\n"
    )
    assert incident.kind == "nan"
    assert incident.exception is None
    assert any("loss=nan" in line for line in incident.log_lines)


@pytest.mark.parametrize(("report", "signal", "exit_code"), [
    ("Killed", "SIGKILL", 137),
    # tqdm leaves its bar without a newline, so the shell's report lands on the bar's line (as in a model load's
    # "Loading checkpoint shards:   0%|          | 0/2 [00:00<?, ?it/s]Killed")
    ("Loading checkpoint shards:   0%|          | 0/4 [00:00<?, ?it/s]Killed", "SIGKILL", 137),
    ("Reading shards: 52113it [02:40, 325.10it/s]Killed", "SIGKILL", 137),
    # zsh's report names the command (macOS's default shell)
    ("zsh: killed     python3 train.py --epochs 20", "SIGKILL", 137),
    ("Generating:  40%|████      | 6/15 [01:12<01:48, 12.05s/it]zsh: killed     python3 generate.py", "SIGKILL", 137),
    # other signals, alone or after the job's pid or number, the command in its padded column
    ("Segmentation fault (core dumped)", "SIGSEGV", 139),
    ("./run.sh: line 3: 48213 Segmentation fault      (core dumped) python train.py", "SIGSEGV", 139),
    ("[2]-  Bus error               python train.py", "SIGBUS", 135),
    ("Aborted (core dumped)", "SIGABRT", 134),
])  # fmt: skip
def test_the_shells_report_of_a_signal_death_is_a_hard_crash(report, signal, exit_code):
    incident = parse_text(f"step 3 loss 0.9\n{report}\n")
    assert (incident.kind, incident.signal, incident.exit_code) == ("hard-crash", signal, exit_code)


@pytest.mark.parametrize("prose", [
    "the process got killed when I pressed ctrl-c, then I restarted it",
    "My training process got Killed after 3 epochs, what is wrong?",
    "Killed by ctrl-c, then I restarted it",
    "I get a Segmentation fault when importing torch after cv2",
])  # fmt: skip
def test_the_word_killed_in_prose_is_no_signal_death(prose):
    incident = parse_text(f"{prose}\n")
    assert incident.signal is None


@pytest.mark.parametrize(("text", "sigkilled"), [
    ("epoch 3 loss 0.41\nKilled\n", True),
    (" 12%|█▏        | 118/1000 [00:40<05:01,  2.93it/s]Killed\n", True),
    ("/var/spool/slurm/job42/slurm_script: line 9:  5120 Killed                  python train.py\n", True),
    ("[1]+  Killed                  python train.py --epochs 10\n", True),
    ("step 400 loss 1.92\nzsh: killed     python3 train.py --epochs 10\n", True),
    # the word in a sentence is what the reporter says happened, not the shell's report
    ("My training process got Killed after 3 epochs, what is wrong?\n", False),
    ("Killed by ctrl-c, then I restarted it\n", False),
])  # fmt: skip
def test_only_the_shells_report_of_a_kill_reads_as_sigkill_oom(tmp_path, text, sigkilled):
    from triage.explain import explain_log
    from triage.kb import load_builtin

    path = tmp_path / "pasted.log"
    path.write_text(text)
    report = explain_log(str(path), load_builtin())
    assert any(d.rule == "oom.process-sigkilled" for d in report.diagnoses) == sigkilled


def test_traceback_cut_off_mid_frame():
    incident = parse_text('Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n    model(x)\n  File "/x/site-packages/torch/nn/mod')
    assert incident.exception.type == ""
    assert incident.exception.frames[0].line == 3
    assert any("cut off" in note for note in incident.notes)


def test_huge_recursion_traceback_keeps_head_and_tail_only():
    frame = '  File "/home/u/rec.py", line 2, in f\n    return f(n + 1)\n'
    text = "Traceback (most recent call last):\n" + frame * 100_000 + "RecursionError: maximum recursion depth exceeded\n"
    incident = parse_text(text)
    assert incident.exception.type == "RecursionError"
    assert len(incident.exception.frames) == 250
    assert any("frames not shown" in note for note in incident.notes)


def test_windows_paths_and_crlf():
    text = (
        "Traceback (most recent call last):\r\n"
        '  File "C:\\Users\\me\\proj\\train.py", line 9, in <module>\r\n'
        "    out = net(x)\r\n"
        '  File "C:\\Users\\me\\miniconda3\\Lib\\site-packages\\torch\\nn\\modules\\module.py", line 1501, in _call_impl\r\n'
        "    return forward_call(*args, **kwargs)\r\n"
        "RuntimeError: shape '[3, -1]' is invalid for input of size 40\r\n"
    )
    exc = parse_text(text).exception
    assert [f.user for f in exc.frames] == [True, False]
    assert exc.message == "shape '[3, -1]' is invalid for input of size 40"


def test_rich_boxed_traceback():
    exc = parse("rich_traceback.log").exception
    assert exc.type == "RuntimeError"
    user = [f for f in exc.frames if f.user]
    assert [(f.line, f.function, f.code) for f in user] == [
        (15, "<module>", "loss = train_step(model, batch, nn.CrossEntropyLoss())"),
        (10, "train_step", "return criterion(logits, labels)"),
    ]
    wrapped = exc.frames[2]  # its header wraps: "...module.py:1778 in" then "_wrapped_call_impl"
    assert (wrapped.line, wrapped.function, wrapped.user) == (1778, "_wrapped_call_impl", False)


def test_traceback_printed_on_a_progress_bar_line():
    text = (
        "Epoch 1/3 [val]:   0%|          | 0/5 [00:00<00:00,  0.00it/s]Traceback (most recent call last):\n"
        '  File "/tmp/runs/train.py", line 23, in forward\n'
        "    x = self.fc(x)\n"
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (64x2048 and 1568x128)\n"
    )
    incident = parse_text(text)
    assert incident.exception.user_frame().line == 23
    assert incident.log_lines == ["Epoch 1/3 [val]:   0%|          | 0/5 [00:00<00:00,  0.00it/s]"]


def test_library_packages_outside_site_packages_are_not_user_code():
    from triage.incident import is_user_path

    assert not is_user_path("/workspace/pypacks/accelerate/state.py")
    assert is_user_path("/home/u/transformers/examples/pytorch/run_glue.py")
    assert is_user_path("/home/u/proj/train.py")


def test_logger_padded_traceback_without_its_header():
    text = (
        '2022-12-28 16:13:02 [ERROR]    File "/home/u/distill/basics.py", line 138, in evaluate_models\n'
        "2022-12-28 16:13:02 [ERROR]      losses[k] += task_loss(state, output, target).item()\n"
        "2022-12-28 16:13:02 [ERROR]  RuntimeError: CUDA error: device-side assert triggered\n"
    )
    exc = parse_text(text).exception
    assert exc.type == "RuntimeError" and exc.message == "CUDA error: device-side assert triggered"
    assert (exc.frames[0].line, exc.frames[0].code) == (138, "losses[k] += task_loss(state, output, target).item()")


def test_vllm_logger_prefix():
    exc = parse_text("ERROR 04-01 23:46:56 [engine.py:160] torch.OutOfMemoryError: CUDA out of memory.\n").exception
    assert exc.type == "torch.OutOfMemoryError"


def test_vscode_notebook_links_and_markdown_bold():
    text = (
        "Cell In[11], [line 13](vscode-notebook-cell:?execution_count=11&line=13)\n"
        "---> [13](vscode-notebook-cell:?execution_count=11&line=13) acc = model(x)\n"
    )
    incident = parse_text("RuntimeError                              Traceback (most recent call last)\n" + text + "RuntimeError: boom\n")
    assert (incident.exception.frames[0].line, incident.exception.frames[0].code) == (13, "acc = model(x)")
    bold = parse_text("**RuntimeError: CUDA error: device-side assert triggered**\n").exception
    assert bold.message == "CUDA error: device-side assert triggered"


def test_assertion_lines_after_the_message_stay_log_lines():
    text = (
        "RuntimeError: CUDA error: device-side assert triggered\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.\n"
        "/pytorch/aten/src/ATen/native/cuda/ScatterGatherKernel.cu:115: operator(): block: [0,0,0], thread: [1,0,0] "
        "Assertion `idx_dim >= 0 && idx_dim < index_size` failed.\n"
    )
    incident = parse_text('Traceback (most recent call last):\n  File "t.py", line 1, in <module>\n    f()\n' + text)
    assert "Assertion" not in incident.exception.message
    assert any("Assertion `idx_dim" in line for line in incident.log_lines)


def test_torchrun_root_cause_block_wins_over_ranks_it_killed():
    summary = (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "Failures:\n"
        "[1]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -15 (pid: 22615)\n  traceback : Signal 15 (SIGTERM) received by PID 22615\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n  rank      : 3 (local_rank: 3)\n  exitcode  : 1 (pid: 22617)\n  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
        "==========\n"
    )
    incident = parse_text("rank: 2, memory allocated: 0\n" + summary)
    assert (incident.rank, incident.exit_code, incident.signal) == (3, 1, None)


def test_error_glued_onto_a_code_line_is_split_off():
    text = '  File "/x/poisson.py", line 63, in log_prob\n    return value.xlogy(rate) - (value + 1).lgamma()RuntimeError: CUDA out of memory. Tried to allocate 9.28 GiB\n'
    exc = parse_text(text).exception
    assert exc.frames[0].code == "return value.xlogy(rate) - (value + 1).lgamma()"
    assert exc.message == "CUDA out of memory. Tried to allocate 9.28 GiB"


@pytest.mark.parametrize(
    "line",
    ["epoch 3 train_loss=nan", "step 4 | loss nan | lr 5.0", "[Loss] nan", "{'loss': 0.0, 'grad_norm': nan, 'epoch': 0.1}"],
)
def test_nan_loss_wordings_make_a_nan_incident(line):
    assert parse_text(f"step 1 loss 2.3\n{line}\n").kind == "nan"


def test_a_nan_learning_rate_is_not_a_nan_loss():
    assert parse_text("loss: 2.3 lr nan\n").kind == "exception"


def test_dynamo_logger_prefix_and_dotted_exception_names():
    text = "[2023-11-29 22:29:33,093] torch._dynamo.convert_frame: [WARNING] Traceback (most recent call last):\n"
    assert parse_text(text + '  File "a.py", line 1, in f\n    g()\nRuntimeError: x\n').exception.frames[0].line == 1
    assert parse_text("torch._dynamo.exc.Unsupported: data dependent operator\n").exception.short_type == "Unsupported"


# --- side stacks: anomaly mode's forward trace, Dynamo's "from user code:" ----------------------

CORPUS_LOGS = FIXTURES.parent.parent / "corpus" / "logs"


@pytest.mark.parametrize(
    ("log", "label", "side_user", "traceback_user"),
    [
        ("nan/anomaly_mulbackward_bare.log", "forward call", ("/tmp/rm/nan1.py", 8, "<module>", "probs = torch.sigmoid(model(x)) * 0"), ("/tmp/rm/nan1.py", 10)),
        ("nan/anomaly_logbackward_vae.log", "forward call", ("/home/ml/proj/train_vae.py", 18, "vae_loss", "bce = -(x * torch.log(recon) + (1 - x) * torch.log(1 - recon)).sum()"), ("/home/ml/proj/train_vae.py", 34)),
        ("inplace/anomaly_sigmoid_mul_inplace.log", "forward call", ("/tmp/rm/anomaly_inplace_sigmoid.py", 11, "forward", "h = model(x)"), ("/tmp/rm/anomaly_inplace_sigmoid.py", 17)),
        ("compile/fullgraph_skipped_builtin_listdir.log", "user code", ("/tmp/rm/compile_walk.py", 7, "normalize_batch", 'n_files = len(os.listdir("."))'), ("/tmp/rm/compile_walk.py", 11)),
        ("compile/fullgraph_data_dependent_branch.log", "user code", ("/tmp/rm/c1.py", 6, "step", "if y.sum() > 0:"), ("/tmp/rm/c1.py", 10)),
        # the traced stack ends in the standard library's copy.py: the user frame is the one before it
        ("compile/fullgraph_deepcopy_tensor.log", "user code", ("/tmp/rm/compile_deepcopy.py", 8, "snapshot", "saved = copy.deepcopy(x)"), ("/tmp/rm/compile_deepcopy.py", 12)),
    ],
)  # fmt: skip
def test_side_stacks_of_real_logs_attach_to_their_exception(log, label, side_user, traceback_user):
    incident = parse_text((CORPUS_LOGS / log).read_bytes().decode("utf-8"))
    # The side stack is no exception of its own: one exception, no "cut off" traceback.
    assert len(incident.exceptions) == 1 and incident.exception.type
    assert not any("cut off" in note for note in incident.notes)
    exc = incident.exception
    assert exc.side_label == label
    side = exc.side_user_frame()
    assert (side.file, side.line, side.function, side.code) == side_user
    # The traceback stays what Python printed: it starts at the call that raised, not at the side stack.
    assert (exc.frames[0].file, exc.frames[0].line) == traceback_user
    assert not any(frame.line == side.line and frame.file == side.file for frame in exc.frames)
    # Nothing of the stack is left for log rules to misread, but the warning line itself is.
    assert not any(line.lstrip().startswith('File "') for line in incident.log_lines)


def test_anomaly_forward_trace_keeps_every_frame_innermost_last():
    exc = parse_text((CORPUS_LOGS / "nan/anomaly_logbackward_vae.log").read_text()).exception
    assert [(f.line, f.function, f.user) for f in exc.side_frames] == [(31, "<module>", True), (18, "vae_loss", True)]
    assert len(exc.frames) == 4  # loss.backward() and torch's three frames, as printed


def test_dynamo_user_code_of_library_frames_only_has_no_user_frame():
    incident = parse_text((CORPUS_LOGS / "compile/fake_tensor_linear_shape.log").read_text())
    assert len(incident.exceptions) == 1
    exc = incident.exception
    assert exc.short_type == "TorchRuntimeError" and exc.side_label == "user code"
    assert [f.function for f in exc.side_frames] == ["inner", "forward", "forward"]
    assert exc.side_user_frame() is None


@pytest.mark.parametrize(
    ("log", "named"),
    [
        ("nan/anomaly_mulbackward_bare.log", ["forward call at /tmp/rm/nan1.py:8 in <module>", "the forward op is nan1.py:8"]),
        ("nan/anomaly_logbackward_vae.log", ["forward call at /home/ml/proj/train_vae.py:18 in vae_loss", "`bce = -(x * torch.log(recon)"]),
        ("inplace/anomaly_sigmoid_mul_inplace.log", ["forward call at /tmp/rm/anomaly_inplace_sigmoid.py:11 in forward", "`h = model(x)` at"]),
        ("compile/fullgraph_skipped_builtin_listdir.log", ["user code at /tmp/rm/compile_walk.py:7 in normalize_batch", "posix.listdir (compile_walk.py:7)", '`n_files = len(os.listdir("."))` at /tmp/rm/compile_walk.py:7']),
        ("compile/fullgraph_data_dependent_branch.log", ["user code at /tmp/rm/c1.py:6 in step", "`if y.sum() > 0:`"]),
        ("compile/fullgraph_deepcopy_tensor.log", ["user code at /tmp/rm/compile_deepcopy.py:8 in snapshot", "at `saved = copy.deepcopy(x)` (/tmp/rm/compile_deepcopy.py:8 in snapshot)"]),
    ],
)  # fmt: skip
def test_explain_names_the_side_stack_user_line(log, named):
    import io

    from triage.explain import explain_log
    from triage.kb import load_builtin
    from triage.render import to_terminal

    report = explain_log(str(CORPUS_LOGS / log), load_builtin())
    out = io.StringIO()
    to_terminal(report, out, color=False)
    text = out.getvalue()
    for words in named:
        assert words in text
    assert "cut off" not in text


ANOMALY_AFTER_OTHER_WARNING = (
    "/usr/lib/python3.11/site-packages/torch/utils/data/dataloader.py:617: UserWarning: This DataLoader will create 8 "
    "worker processes in total. Our suggested max number of worker in current system is 2.\n"
    "  warnings.warn(\n"
    "epoch 0 step 40 loss nan\n"
    "/usr/lib/python3.11/site-packages/torch/autograd/graph.py:979: UserWarning: Error detected in DivBackward0. "
    "Traceback of forward call that caused the error:\n"
    '  File "/home/u/train.py", line 40, in <module>\n'
    "    loss = criterion(out, y)\n"
    '  File "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1789, in _call_impl\n'
    "    return forward_call(*args, **kwargs)\n"
    '  File "/home/u/losses.py", line 12, in forward\n'
    "    return (x / x.norm(dim=1, keepdim=True)).sum()\n"
    "           ~~^~~~~~~~~~~~~~~~~~~~~~~~~~~~~\n"
    " (Triggered internally at /pytorch/torch/csrc/autograd/python_anomaly_mode.cpp:122.)\n"
    "  return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass\n"
    "Traceback (most recent call last):\n"
    '  File "/home/u/train.py", line 42, in <module>\n'
    "    loss.backward()\n"
    '  File "/usr/lib/python3.11/site-packages/torch/_tensor.py", line 623, in backward\n'
    "    torch.autograd.backward(\n"
    "RuntimeError: Function 'DivBackward0' returned nan values in its 0th output.\n"
)


def test_anomaly_warning_after_an_unrelated_warning():
    incident = parse_text(ANOMALY_AFTER_OTHER_WARNING)
    assert len(incident.exceptions) == 1
    exc = incident.exception
    assert exc.message == "Function 'DivBackward0' returned nan values in its 0th output."
    assert [(f.file, f.line) for f in exc.side_frames] == [
        ("/home/u/train.py", 40), ("/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", 1789), ("/home/u/losses.py", 12),
    ]
    assert exc.side_user_frame().code == "return (x / x.norm(dim=1, keepdim=True)).sum()"  # the carets are not code
    assert [f.line for f in exc.frames] == [42, 623]
    # The earlier warning, its source line and the lines after the trace stay log lines.
    assert "  warnings.warn(" in incident.log_lines
    assert any("This DataLoader will create 8 worker processes" in line for line in incident.log_lines)
    assert any(line.startswith(" (Triggered internally at") for line in incident.log_lines)
    assert any("Error detected in DivBackward0" in line for line in incident.log_lines)


def test_anomaly_warning_alone_attaches_to_nothing_and_stays_in_the_log():
    text = ANOMALY_AFTER_OTHER_WARNING.split("Traceback (most recent call last):")[0]
    incident = parse_text(text)
    assert incident.exceptions == [] and incident.exception is None
    assert incident.kind == "nan"  # "loss nan" in the log, and no exception made from the trace
    assert '  File "/home/u/losses.py", line 12, in forward' in incident.log_lines


def test_anomaly_trace_far_before_an_exception_is_not_attached():
    head, tail = ANOMALY_AFTER_OTHER_WARNING.split("Traceback (most recent call last):")
    filler = "".join(f"epoch 1 step {n} loss 0.5\n" for n in range(100))
    exc = parse_text(head + filler + "Traceback (most recent call last):" + tail).exception
    assert exc.type == "RuntimeError" and exc.side_frames == []


def test_dynamo_user_code_with_no_exception_before_it_stays_in_the_log():
    text = 'from user code:\n   File "/home/u/model.py", line 23, in forward\n    x = x.numpy()\n\nstep 3 loss 0.2\n'
    incident = parse_text(text)
    assert incident.exceptions == []
    assert '   File "/home/u/model.py", line 23, in forward' in incident.log_lines


def test_dynamo_user_code_inside_the_message_when_blank_lines_were_lost():
    text = (
        "Traceback (most recent call last):\n"
        '  File "/home/u/train.py", line 30, in <module>\n'
        "    out = compiled(x)\n"
        '  File "/usr/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py", line 1177, in compile_wrapper\n'
        "    raise e.with_traceback(\n"
        "torch._dynamo.exc.Unsupported: Attempted to call function marked as skipped\n"
        "from user code:\n"
        '   File "/home/u/model.py", line 23, in forward\n'
        "    t0 = time.perf_counter()\n"
    )
    exc = parse_text(text).exception
    assert exc.side_label == "user code"
    assert (exc.side_user_frame().line, exc.side_user_frame().code) == (23, "t0 = time.perf_counter()")
    assert [f.line for f in exc.frames] == [30, 1177]


def test_side_frames_round_trip_through_the_json_contract():
    from triage.incident import Incident

    incident = parse_text((CORPUS_LOGS / "compile/fullgraph_data_dependent_branch.log").read_text())
    data = incident.to_dict()
    assert data["exception"]["side_label"] == "user code"
    assert data["exception"]["side_frames"][0] == {"file": "/tmp/rm/c1.py", "line": 6, "function": "step", "code": "if y.sum() > 0:", "user": True}
    back = Incident.from_dict(data).exception
    assert back.side_label == "user code" and back.side_user_frame().line == 6
    # An exception without a side stack keeps the keys it always had.
    assert set(parse_text("RuntimeError: boom\n").to_dict()["exception"]) == {"type", "message", "frames"}


def test_a_conda_or_python_install_s_lowercase_lib_on_windows_is_the_stdlib_not_user_code():
    from triage.incident import is_user_path

    assert not is_user_path(r"E:\Anaconda3\envs\mutual\lib\multiprocessing\reduction.py")
    assert not is_user_path(r"C:\Users\a\AppData\Local\Programs\Python\Python36\lib\threading.py")
    assert not is_user_path(r"C:\Users\me\Miniconda3\lib\pickle.py")
    assert is_user_path(r"D:\proj\lib\utils.py") and is_user_path("/home/u/proj/lib/x.py")


UNTYPED_ERROR_THEN_ARCH_WARNING = (
    "CUDA error: no kernel image is available for execution on the device CUDA kernel errors might be asynchronously "
    "reported at some other API call, so the stacktrace below might be incorrect.\n"
    "Step 0 of 2000\n"
    "C:\\venv\\Lib\\site-packages\\torch\\cuda\\__init__.py:287: UserWarning: \n"
    "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch installation.\n"
    "The current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90.\n"
)
RANKS_REPEAT_WHAT_THE_LOG_RULE_READ = "".join(
    f"[rank{n}]:[E321 02:07:08.4 ProcessGroupNCCL.cpp:607] [Rank {n}] Watchdog caught collective operation timeout: "
    f"WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600060 "
    "milliseconds before timing out.\n" for n in range(3)
)


@pytest.mark.parametrize(
    ("text", "leading", "typed"),
    [
        # a log-line rule read the start-up warning; the untyped error on another line is still the failure
        (UNTYPED_ERROR_THEN_ARCH_WARNING, "cuda-env.no-kernel-image-arch", True),
        # every rank prints the line the log rule read: no copy of it becomes an exception
        (RANKS_REPEAT_WHAT_THE_LOG_RULE_READ, "distributed.nccl-watchdog-timeout-in-log", False),
        # a device-side assert pasted alone without its type (a title, a quote): it is the error itself, read as the
        # exception its rule knows, whose causes the assertion text and frames choose; no log rule reads it
        ('"CUDA error: device-side assert triggered"\n', "cuda-assert.device-side-assert", True),
        # thrust's wording in prose (MhLiao/DB#233), and the kernel's assertion printed after it names the cause
        ("运行报copy_if failed to synchronize: cudaErrorAssert: device-side assert triggered\n"
         "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:60: lambda []()->auto::operator()()->auto: block: [0,0,0], "
         'thread: [7,0,0] Assertion `index >= -sizes[i] && index < sizes[i] && "index out of bounds"` failed.\n',
         "cuda-assert.indexing-out-of-bounds", True),
        # a logger's device-side assert line, then the later error the paste ends with: the log rule explains it
        ("ERROR 05-01 10:00:00 [worker.py:88] CUDA error: device-side assert triggered\n"
         "RuntimeError: Worker process 3 died unexpectedly.\n", "cuda-assert.device-side-assert-in-log", True),
        # the allocator's message pasted without its type: its wording's rule, no log rule reads a lone OOM line
        ('"CUDA out of memory. Tried to allocate 1.79 GiB (GPU 0; 12.00 GiB total capacity; 8.93 GiB already allocated; '
         '0 bytes free; 11.21 GiB reserved in total by PyTorch)"\n', "oom.gpu-out-of-memory-legacy", True),
        # a logger's OOM line, then a later error of another kind: the log rule explains the OOM beside it
        ("ERROR [engine.py:160] CUDA out of memory. Tried to allocate 546.00 MiB. GPU 0 has a total capacity of 15.77 GiB "
         "of which 514.19 MiB is free.\nRuntimeError: Engine core initialization failed. See root cause above.\n",
         "oom.gpu-out-of-memory-in-log", True),
    ],
    ids=["error-beside-warning", "ranks-repeat-the-read-line", "dsa-alone-without-type", "dsa-thrust-in-prose-with-assertion",
         "dsa-line-beside-a-later-error", "oom-wording-without-type", "oom-line-beside-a-later-error"],
)  # fmt: skip
def test_untyped_message_beside_a_log_line_rule(tmp_path, text, leading, typed):
    from triage.explain import explain_log
    from triage.kb import load_builtin

    path = tmp_path / "pasted.log"
    path.write_text(text)
    report = explain_log(str(path), load_builtin())
    assert report.leading.rule == leading
    assert (report.incident.exception is not None) == typed


def test_error_glued_after_padding_onto_a_flush_code_line_is_split_off():
    # A wide paste lost the newline between the frame's code and the error, leaving the code line's padding between.
    text = ('File "/env/lib/python3.7/site-packages/seglib/metrics.py", line 69, in f_score\n'
            "tp = torch.sum(gt * pr)" + " " * 90 + "RuntimeError: expected backend CUDA and dtype Double but got backend"
            " CUDA and dtype Float\n")
    exc = parse_text(text).exception
    assert exc.type == "RuntimeError"
    assert exc.message == "expected backend CUDA and dtype Double but got backend CUDA and dtype Float"
    assert exc.frames[0].code == "tp = torch.sum(gt * pr)"


def test_a_cpp_exception_s_what_line_is_the_error_of_a_log_with_no_python_one():
    watchdog = ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, "
                "Timeout(ms)=600000) ran for 600042 milliseconds before timing out.")
    backtrace = ("Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:609 (most recent call first):\n"
                 "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f3079fb6f86 in libc10.so)\n")
    thrown = parse_text("step 120 loss 0.31\nterminate called after throwing an instance of 'c10::DistBackendError'\n"
                        f"  what():  {watchdog}\n{backtrace}")
    assert (thrown.exception.type, thrown.exception.message) == ("c10::DistBackendError", watchdog)
    # two threads dying at once print `what():` twice; a message wrapped onto the next line continues it
    wrapped = parse_text(f"  what():    what():  [PG 0 Rank 1] Process group watchdog thread terminated with exception:\n"
                         f" {watchdog}\n{backtrace}")
    assert wrapped.exception.type == "std::exception"
    assert wrapped.exception.message == f"[PG 0 Rank 1] Process group watchdog thread terminated with exception:\n {watchdog}"
    # a Python exception in the log stays the error
    python = parse_text(f"  what():  {watchdog}\nTraceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
                        "    dist.barrier()\nRuntimeError: NCCL communicator was aborted\n")
    assert python.exception.type == "RuntimeError"


def test_a_rule_matching_an_empty_message_adopts_nothing_beside_a_traceback(tmp_path):
    # dataloader.no-batch-arrives reads a bare KeyboardInterrupt by its empty message (\A\Z): an empty text
    # beside a typed error must not become a second, empty exception that outranks it
    log = tmp_path / "stack.log"
    log.write_text('Traceback (most recent call last):\n  File "train.py", line 40, in <module>\n    out = model(x)\n'
                   "RuntimeError: stack expects each tensor to be equal size, but got [4, 64] at entry 0 and [4, 32] "
                   "at entry 1\n")
    from triage.explain import explain_log
    from triage.kb import load_knowledge_base

    report = explain_log(str(log), load_knowledge_base([]))
    assert [exc.type for exc in report.incident.exceptions] == ["RuntimeError"]


def test_a_headline_ending_on_a_colon_goes_on_after_the_fences_a_paste_put_inside_it():
    bare = parse_text(
        "```\nRuntimeError: one of the variables needed for gradient computation has been modified by an inplace"
        " operation: \n```\n```\n[torch.FloatTensor [5, 6]], which is output 0 of TBackward, is at version 2;"
        " expected version 1 instead.\n```\n")
    assert bare.exception.message.splitlines()[1].startswith("[torch.FloatTensor [5, 6]]")
    traced = parse_text(
        'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n    loss.backward()\n'
        "RuntimeError: something went wrong in this step:\n\n[details] the tensor was [3, 4]\n")
    assert traced.exception.message == "something went wrong in this step:\n[details] the tensor was [3, 4]"


def test_a_blank_line_still_ends_a_message_that_does_not_end_on_a_colon_or_is_followed_by_an_error():
    plain = parse_text("RuntimeError: the step failed.\n\n[info] saving the checkpoint\n")
    assert plain.exception.message == "the step failed."
    then_error = parse_text("RuntimeError: the step failed here:\n\nValueError: another one\n")
    assert then_error.exceptions[0].message == "the step failed here:"


def test_a_forward_trace_just_before_an_error_line_without_its_traceback_belongs_to_it():
    incident = parse_text(
        "sys:1: RuntimeWarning: Traceback of forward call that caused the error:\n"
        '  File "train.py", line 40, in <module>\n    loss = criterion(out)\n'
        '  File "/home/me/proj/utils/dist.py", line 18, in pairwise\n    d = torch.sqrt(d2)\n'
        "RuntimeError: Function 'SqrtBackward' returned nan values in its 0th output.\n")
    assert incident.exception.side_label == "forward call"
    assert incident.exception.side_user_frame().code == "d = torch.sqrt(d2)"
    far = parse_text(
        "sys:1: RuntimeWarning: Traceback of forward call that caused the error:\n"
        '  File "train.py", line 40, in <module>\n    loss = criterion(out)\n'
        + "epoch 1 step 5 loss 0.3\n" * 70
        + "RuntimeError: Function 'SqrtBackward' returned nan values in its 0th output.\n")
    assert far.exception.side_frames == []


def test_a_paste_wrapped_at_80_columns_inside_a_path_before_its_extension_is_joined_again():
    # an 80-column terminal cut `.../torch/serialization` / `.py", line 135, in save`
    site = "/home/ec2-user/anaconda3/lib/python3.6/site-packages/torch/serialization"
    whole = ["Traceback (most recent call last):",
             '  File "train.py", line 169, in train', "    torch.save(model.state_dict(), checkpoint_path)",
             f'  File "{site}.py", line 135, in save',
             '    return _with_file_like(f, "wb", lambda f: _save(obj, f, pickle_module, pickle_protocol))',
             f'  File "{site}.py", line 115, in _with_file_like', "    f = open(f, mode)",
             "FileNotFoundError: [Errno 2] No such file or directory: 'log_st/model.pth'"]
    wrapped = [part for line in whole for part in (line[:80], line[80:]) if part]
    assert sum(len(line) == 80 for line in wrapped) == 3 and max(map(len, wrapped)) == 80
    exc = parse_text("\n".join(wrapped) + "\n").exception
    assert [f.function for f in exc.frames] == ["train", "save", "_with_file_like"]
    assert exc.frames[-1].file == f"{site}.py" and exc.frames[0].user and not exc.frames[-1].user


def test_frames_without_a_header_just_before_anomaly_mode_s_nan_error_are_its_forward_trace():
    frames = '....\n  File "main.py", line 374, in compute_plane\n    x, _ = torch.linalg.solve(A, B)\n\n'
    traceback = ('Traceback (most recent call last):\n  File "main.py", line 544, in train\n    loss.backward()\n'
                 "RuntimeError: Function '{}' returned nan values in its 0th output.\n")
    anomaly = parse_text(frames + traceback.format("LinalgSolveExBackward0"))
    assert len(anomaly.exceptions) == 1 and anomaly.exception.side_label == "forward call"
    assert anomaly.exception.side_user_frame().function == "compute_plane"
    assert not any("cut off" in note for note in anomaly.notes)
    other = parse_text(frames + 'Traceback (most recent call last):\n  File "main.py", line 544, in train\n'
                       "    loss.backward()\nRuntimeError: element 0 of tensors does not require grad\n")
    assert other.exception.side_frames == [] and len(other.exceptions) == 2


def test_progress_indices_are_the_step_batch_and_iteration_numbers_not_an_epoch_or_a_setting():
    from triage.logparse import progress_indices

    lines = [" Epoch 0 batch 0's average loss: 8.7", "Speed 2178 samples/sec Loss nan Epoch: 3 Global Step: 20",
             "E6 iter[ 14/ 15] | [Loss] nan | [step]    89", "Epoch [1][658/742] lr: 5e-05", "batch_size 32",
             "steps_per_epoch 100", "Iteration 7: loss 0.1"]
    assert progress_indices(lines) == [0, 20, 14, 89, 7]


def test_a_metrics_table_with_nan_under_its_loss_column_is_a_nan_incident():
    table = "epoch train loss valid loss accuracy_thresh f2_opt\n0 {} {} 0.997788 0.000000\n"
    assert parse_text(table.format("nan", "nan")).kind == "nan"
    assert parse_text(table.format("0.6931", "0.6812")).kind == "exception"


def test_a_worker_killed_by_a_signal_is_not_the_main_process_dying_of_it():
    from triage.logparse import parse_text

    worker = parse_text("RuntimeError: DataLoader worker (pid 25902) is killed by signal: Segmentation fault\n")
    assert worker.signal is None and worker.exit_code is None and worker.kind == "exception"
    shell = parse_text("epoch 3\nSegmentation fault (core dumped)\n")
    assert shell.signal == "SIGSEGV" and shell.exit_code == 139

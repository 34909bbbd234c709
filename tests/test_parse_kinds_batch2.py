"""The parser on the kinds of paste found in corpus/logs-fresh/batch2, each on a real log from a public thread.

As in test_parse_kinds.py, the parser is judged by kind of input, never by one log: each test names the way
the paste departs from a clean traceback, and most run on more than one log of that kind.
"""

import pytest
from conftest import ROOT

from triage.explain import explain_log
from triage.kb import load_knowledge_base
from triage.logparse import parse_text

BATCH2 = ROOT / "corpus" / "logs-fresh" / "batch2"


def parse(name: str):
    return parse_text((BATCH2 / name).read_bytes().decode("utf-8"))


@pytest.fixture(scope="module")
def kb():
    return load_knowledge_base(env={}, cwd=ROOT)


@pytest.mark.parametrize(("name", "exc_type", "message_start"), [
    # a space before the colon and runs of spaces inside the message (xuelunshen/rfnet#4)
    ("nan/anomaly_sqrt_runtimewarning_forward_trace_rfnet.log", "RuntimeError",
     "Function 'SqrtBackward' returned nan values in its 0th output."),
    # no space after the colon, inside backticks (chnsh/DCRNN_PyTorch#6)
    ("oom/cuda_oom_no_space_after_colon_backticked_dcrnn.log", "RuntimeError", "CUDA out of memory. Tried to allocate 20.00 MiB"),
    # a caught exception shown as its repr (PrateekMunjal/TorchAL#4)
    ("cuda-env/no_kernel_image_repr_in_trial_message_torchal.log", "RuntimeError",
     "CUDA error: no kernel image is available for execution on the device"),
])  # fmt: skip
def test_a_loosely_written_error_line_is_read(name, exc_type, message_start):
    exc = parse(name).exception
    assert (exc.type, exc.message[: len(message_start)]) == (exc_type, message_start)


@pytest.mark.parametrize(("name", "function", "code"), [
    # every line flush left (yunjey/pytorch-tutorial#131)
    ("checkpoint/invalid_load_key_x00_flattened_indent_pytorch_tutorial.log", "main",
     "encoder.load_state_dict(torch.load(args.encoder_path))"),
    # the same, without the traceback's header (NVIDIA/Megatron-LM#343)
    ("distributed/address_in_use_flattened_frames_megatron.log", "_tcp_rendezvous_handler",
     "store = TCPStore(result.hostname, result.port, world_size, start_daemon, timeout)"),
])  # fmt: skip
def test_frames_pasted_without_indentation_keep_their_code(name, function, code):
    exc = parse(name).exception
    assert exc.type and exc.message
    assert (exc.frames[-1].function if function == "_tcp_rendezvous_handler" else exc.user_frame().function) == function
    assert code in [frame.code for frame in exc.frames]


def test_frames_the_paster_elided_with_dots_are_skipped():
    # NetoPedro/Universal-Adversarial-Perturbations-Pytorch#1: `...` lines before and after the one frame kept
    exc = parse("device/input_cuda_weight_cpu_elided_frames_uap.log").exception
    frame = exc.user_frame()
    assert (exc.type, frame.function, frame.line, frame.code) == (
        "RuntimeError", "generate", 86, "r2 = (net(cur_img1).max(1)[1])")


def test_a_traceback_cut_before_its_error_reads_a_raise_with_an_f_string():
    # BuffMcBigHuge/ComfyUI-Zonos#7: the paste ends at `raise RuntimeError(f"Compiler: {compiler} is not found.")`
    incident = parse("compile/cl_not_found_double_spaced_no_error_line_zonos.log")
    assert (incident.exception.type, incident.exception.message) == ("RuntimeError", "Compiler: {compiler} is not found.")
    assert incident.exception.frames[-1].function == "check_compiler_exist_windows"


@pytest.mark.parametrize(("name", "message"), [
    # parent and child tracebacks interleaved line by line (thuml/Time-Series-Library#354)
    ("dataloader/unpicklable_lambda_interleaved_parent_child_windows_tslib.log",
     "Can't pickle local object 'data_provider.<locals>.<lambda>'"),
    # the child's EOFError first, then sacred's header over the parent's traceback (kkoutini/PaSST#48)
    ("dataloader/unpicklable_local_roll_func_eof_first_sacred_passt.log",
     "Can't pickle local object 'get_roll_func.<locals>.roll_func'"),
])  # fmt: skip
def test_a_spawned_childs_eof_echo_is_not_the_root(name, message):
    incident = parse(name)
    assert (incident.exception.type, incident.exception.message) == ("AttributeError", message)
    echo = next(exc for exc in incident.exceptions if exc.type == "EOFError")
    # The parent's frames printed after it end its message: the parent's error is not swallowed into it.
    assert echo.message.startswith("Ran out of input") and "Can't pickle" not in echo.message


def test_an_error_printed_above_its_traceback_gets_the_traceback_frames():
    # XPixelGroup/BasicSR#112: the error line, a blank line, then the log and the traceback (cut at its end)
    incident = parse("shape/conv_channels_error_before_log_windows_basicsr.log")
    exc = incident.exception
    assert exc.message.startswith("Given groups=1, weight of size [64, 3, 3, 3]")
    assert [f.function for f in exc.frames][:3] == ["<module>", "main", "optimize_parameters"]
    assert any("printed apart" in note for note in incident.notes)
    assert not any("cut off" in note for note in incident.notes)  # it found its error line


def test_a_workers_original_traceback_pasted_from_the_outer_error_line(kb, tmp_path):
    # sgrvinod/a-PyTorch-Tutorial-to-Transformers#1: the paste starts at `KeyError: Caught KeyError in DataLoader ...`
    incident = parse("dataloader/worker_keyerror_dict_index_srgan_colab.log")
    outer, inner = incident.exceptions
    assert outer.wrapper and outer.message.startswith("Caught KeyError in DataLoader worker process 0.")
    assert (incident.exception, inner.message, inner.worker, inner.user_frame().function) == (inner, "0", 0, "__getitem__")
    # The paste that lost the main process's traceback reads like one that kept it, with the same error (a numeric
    # key: the fixture's `'label'` would be a different diagnosis).
    kept = (ROOT / "tests" / "fixtures" / "dataloader_worker_keyerror.log").read_text().replace("KeyError: 'label'", "KeyError: 0")
    full_path = tmp_path / "kept.log"
    full_path.write_text(kept)
    full = explain_log(str(full_path), kb)
    cut = explain_log(str(BATCH2 / "dataloader/worker_keyerror_dict_index_srgan_colab.log"), kb)
    assert [d.rule for d in cut.diagnoses][:3] == [d.rule for d in full.diagnoses][:3]


_FORWARD = '''Traceback (most recent call last):
  File "train.py", line 40, in <module>
    loss = model(x)
  File "/usr/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1501, in _call_impl
    return forward_call(*args, **kwargs)
  File "model.py", line 12, in forward
    return self.fc(x)
  File "/usr/lib/python3.10/site-packages/torch/nn/modules/linear.py", line 114, in forward
    return F.linear(input, self.weight, self.bias)
RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x57600 and 64x128)
'''


def _reversed_paste(header: str) -> str:
    lines = _FORWARD.splitlines()
    frames = [lines[n : n + 2] for n in range(1, len(lines) - 1, 2)]
    return "\n".join([header, *(line for frame in reversed(frames) for line in frame), lines[-1]]) + "\n"


@pytest.mark.parametrize("header", [
    "Traceback (most recent call last):",  # frames copied from a viewer that lists them innermost first
    "Traceback (most recent call first):",  # ... and says so
])  # fmt: skip
def test_frames_pasted_innermost_first_are_read_in_pythons_order(header):
    forward = parse_text(_FORWARD).exception
    incident = parse_text(_reversed_paste(header))
    exc = incident.exception
    assert [(f.file, f.function, f.code) for f in exc.frames] == [(f.file, f.function, f.code) for f in forward.frames]
    # The error site is the innermost user frame, never the script's `<module>` line.
    assert (exc.user_frame().file, exc.user_frame().function) == ("model.py", "forward")
    assert any("innermost first" in note for note in incident.notes)


def test_a_module_level_import_error_is_not_read_as_reversed():
    text = ('Traceback (most recent call last):\n  File "/usr/lib/python3.10/site-packages/lib/a.py", line 3, in load\n'
            '    import plugin\n  File "/home/u/plugin.py", line 1, in <module>\n    from torch._six import inf\n'
            "ModuleNotFoundError: No module named 'torch._six'\n")
    exc = parse_text(text).exception
    # A cut traceback can end in user code at module level; only an innermost-first library frame tells.
    assert [f.function for f in exc.frames] == ["load", "<module>"]


def test_a_known_pytorch_message_beside_a_python_error_is_the_failure(tmp_path, kb):
    # A wrapper re-raises as a Python error; the PyTorch message it caught is logged above it.
    log = tmp_path / "job.log"
    log.write_text(
        "2024-05-01 10:00:01 ERROR step failed: Expected all tensors to be on the same device, but found at least"
        " two devices, cuda:0 and cpu!\n\n"
        "Traceback (most recent call last):\n  File \"runner.py\", line 8, in <module>\n    run()\n"
        "  File \"runner.py\", line 5, in run\n    raise ValueError('the training step failed')\n"
        "ValueError: the training step failed\n"
    )
    report = explain_log(str(log), kb)
    assert report.diagnoses[0].category == "device"
    assert any("not a PyTorch error" in note for note in report.incident.notes)


def test_a_python_error_with_no_pytorch_message_stays_python(tmp_path, kb):
    log = tmp_path / "job.log"
    log.write_text("epoch 1 loss 0.5\nTraceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
                   "    cfg['lr']\nKeyError: 'lr'\n")
    report = explain_log(str(log), kb)
    assert report.diagnoses[0].category == "python"


def test_a_frame_path_a_terminal_wrapped_is_joined_again():
    # pytorch/pytorch#33296: the wrapped frame line came back joined by the padding of the terminal's line
    text = ('Traceback (most recent call last):\n  File "/home/u/.local/lib/python3.6/site-packages/torch/utils/data/dataload'
            + " " * 150 + 'er.py", line 761, in _try_get_data\n    data = self._data_queue.get(timeout=timeout)\n'
            "RuntimeError: DataLoader worker (pid 123) is killed by signal: Killed.\n")
    frame = parse_text(text).exception.frames[0]
    assert (frame.file.endswith("torch/utils/data/dataloader.py"), frame.user) == (True, False)


def test_torch0_reraises_a_workers_error_with_its_traceback_as_the_message():
    # zijundeng/pytorch-semantic-segmentation#10: `TypeError: Traceback (most recent call last):` then the worker's
    incident = parse("dataloader/collate_pil_image_torch02_py27_semseg.log")
    outer, inner = incident.exceptions
    assert outer.wrapper and incident.exception is inner
    assert inner.message == "batch must contain tensors, numbers, dicts or lists; found <class 'PIL.Image.Image'>"
    assert [f.function for f in inner.frames] == ["_worker_loop", "default_collate", "default_collate"]


def test_an_old_mp_spawn_exception_wraps_the_childs_traceback():
    # pytorch/pytorch#50261 (torch < 1.8): `Exception:`, a blank line, `-- Process 0 terminated ...`, the child's
    incident = parse_text((ROOT / "corpus/logs-fresh/checkpoint/torchscript_loaded_with_torch_load_no_module_torch.log")
                          .read_text())
    outer, inner = incident.exceptions
    assert (outer.type, outer.wrapper) == ("Exception", True)
    assert (incident.exception, inner.type, inner.rank) == (inner, "ModuleNotFoundError", 0)


def test_a_traceback_after_ctrl_c_cut_before_its_error_is_a_keyboard_interrupt():
    # pytorch/pytorch#19258: `^CTraceback (most recent call last):`, the paste ends inside the last frame
    exc = parse_text((ROOT / "corpus/logs-fresh/dataloader/timeout_interrupted_get_batch_torch10.log").read_text()).exception
    assert (exc.type, exc.frames[3].function) == ("KeyboardInterrupt", "__next__")


def test_a_paste_hard_wrapped_at_a_fixed_width_is_joined_again(kb):
    # huggingface/open-r1#620: every line cut at 137 columns, inside words (`ran f` / `or 1800010 milliseconds`)
    log = ROOT / "corpus/logs-fresh/distributed/watchdog_broadcast_timeout_wrapped_open_r1.log"
    report = explain_log(str(log), kb)
    assert report.diagnoses[0].category == "distributed"
    assert any("OpType=BROADCAST" in line and "ran for 1800010 milliseconds" in line for line in report.incident.log_lines)


def test_repeated_lines_of_one_length_are_not_read_as_a_wrap():
    # CUDA assertion lines share their length but are whole: each stays its own line
    from triage.logclean import clean_lines

    text = (ROOT / "corpus/logs/cuda-assert/index_select_srcindex_lm_eval.log").read_text()
    assert len(clean_lines(text)) == len(text.split("\n"))


@pytest.mark.parametrize("name", [
    "cuda-env/driver_too_old_found_6050_duplicated.log",  # PyTorch's own message, broken at 65 columns
    "batch2/nan/apex_gradient_overflow_scale_underflow.log",  # lines of one length ending in a digit
])  # fmt: skip
def test_lines_broken_by_their_writer_are_not_joined(name):
    from triage.logclean import clean_lines

    text = (ROOT / "corpus" / "logs-fresh" / name).read_text()
    assert len(clean_lines(text)) == len(text.split("\n"))


def test_a_rich_box_pasted_from_its_middle_is_still_read():
    # FoNDUE-HTR/Documentation#13: no `╭─ Traceback` header, `path:1024` with `in _try_get_data` on the next line,
    # and the paste ends inside the box: the frame's `❱` line says what it raised
    exc = parse_text((ROOT / "corpus/logs-fresh/dataloader/worker_killed_rich_traceback_kraken.log").read_text()).exception
    assert (exc.type, exc.frames[-1].function, exc.frames[-1].line) == ("RuntimeError", "_try_get_data", 1024)
    assert exc.message == "DataLoader worker (pid(s) {}) exited unexpectedly"


def test_a_box_code_line_ending_in_a_slice_is_not_a_frame_header():
    text = "│   10 │ a = b[:3                                    │\n│   11 │ c = d                                       │\n"
    assert parse_text(text).exception is None


_PLAIN = ('Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n    main()\n'
          '  File "train.py", line 5, in main\n    loss = crit(out, y)\n'
          "RuntimeError: CUDA error: device-side assert triggered\n")


@pytest.mark.parametrize("paste", [
    "\n".join("    " + line for line in _PLAIN.splitlines()),  # the whole traceback indented (a list item, a quote)
    _PLAIN.replace("<module>", "&lt;module&gt;"),  # copied from a rendered page: HTML entities
    "\n".join(f"{n} {line}" for n, line in enumerate(_PLAIN.splitlines(), start=1)),  # an editor's line numbers
    "\n".join(f"[{n}] {line}" for n, line in enumerate(_PLAIN.splitlines(), start=1743)),  # a web UI's log lines
])  # fmt: skip
def test_a_traceback_inside_a_paste_format_reads_as_the_plain_one(paste):
    plain = parse_text(_PLAIN).exception
    exc = parse_text(paste).exception
    assert (exc.type, exc.message) == (plain.type, plain.message)
    assert [(f.function, f.line, f.code) for f in exc.frames] == [(f.function, f.line, f.code) for f in plain.frames]


def test_counting_numbers_at_the_margin_without_a_traceback_are_kept():
    table = "epoch loss\n" + "".join(f"{n} 0.{n}5\n" for n in range(1, 9))
    from triage.logclean import clean_lines

    assert [line.text for line in clean_lines(table)][1] == "1 0.15"


@pytest.mark.parametrize(("name", "code"), [
    # ipdb: the statement typed at the prompt, then `*** RuntimeError: ...` (modelscope/ms-swift#4613)
    ("inplace/leaf_inplace_ipdb_star_prompt_ms_swift.log", "inputs_embeds += image_embeds.mean() * 0."),
    # IPython's arrow line alone above the error (Atcold/NYU-DLSP20#765)
    ("inplace/view_of_leaf_positional_encoding_ipython_arrow.log", "E[:, 0::2] = torch.FloatTensor(np.sin(theta[:, 0::2]))"),
])  # fmt: skip
def test_the_statement_above_an_error_without_traceback_is_its_frame(name, code, kb):
    exc = parse_text((ROOT / "corpus" / "logs-fresh" / name).read_text()).exception
    assert (len(exc.frames), exc.frames[0].code, exc.frames[0].user) == (1, code, True)
    report = explain_log(str(ROOT / "corpus" / "logs-fresh" / name), kb)
    assert code in report.diagnoses[0].hypothesis  # the user's own line is named


def test_a_line_above_an_error_that_is_not_a_statement_gives_no_frame():
    exc = parse_text("epoch 3 loss 0.51\nRuntimeError: boom\n").exception
    assert exc.frames == []


def test_a_warning_glued_onto_the_error_line_is_split_off_and_its_forward_trace_attached():
    # WOW5678/CompNet#2: `...Good luck!/usr/local/.../__init__.py:175: UserWarning: Error detected in BmmBackward0. ...`
    incident = parse_text((ROOT / "corpus/logs-fresh/inplace/modified_inplace_asstrided_glued_warning_compnet.log").read_text())
    exc = incident.exception
    assert exc.message.endswith("Good luck!")
    assert exc.side_label == "forward call" and exc.side_frames
    assert any(line.startswith("/usr/local/lib/python3.7/dist-packages/torch/autograd/__init__.py:175: UserWarning: Error "
                               "detected in BmmBackward0") for line in incident.log_lines)

"""One test per kind of paste, each on a real log from a public issue thread (corpus/logs-fresh, with its source).

The parser is judged by kind of input, never by one log: every kind here is a way people paste errors
(a prefix before the error line, markup around it, a notebook's traceback format, a paste that wraps,
cuts or drops the exception type).
"""

import pytest
from conftest import ROOT

from triage.explain import explain_log
from triage.kb import load_knowledge_base
from triage.logclean import clean_lines
from triage.logparse import parse_text

FRESH = ROOT / "corpus" / "logs-fresh"


def parse(name: str):
    return parse_text((FRESH / name).read_bytes().decode("utf-8"))


def cleaned(name: str) -> list[str]:
    return [line.text for line in clean_lines((FRESH / name).read_bytes().decode("utf-8"))]


@pytest.fixture(scope="module")
def kb():
    return load_knowledge_base(env={}, cwd=ROOT)


@pytest.mark.parametrize(("name", "exc_type", "message_start"), [
    # prose before the error on its line (priya-dwivedi/Deep-Learning#136)
    ("shape/size_mismatch_m1_m2_torchsummary_crack.log", "RuntimeError", "size mismatch, m1: [2 x 12288], m2: [2048 x 128]"),
    # a word before the error: `actual error: ` (aks2203/deep-thinking#5)
    ("checkpoint/actual_error_prefix_module_keys_deep_thinking.log", "RuntimeError", "Error(s) in loading state_dict for DTNet:"),
    # ipdb's `*** ` (modelscope/ms-swift#4613)
    ("inplace/leaf_inplace_ipdb_star_prompt_ms_swift.log", "RuntimeError", "a leaf Variable that requires grad is being used"),
    # a markdown quote `> ` (xkiwilabs/DQN-using-PyTorch-and-ML-Agents#5)
    ("shape/size_mismatch_m1_m2_quoted_dqn_mlagents.log", "RuntimeError", "size mismatch, m1: [1 x 159], m2: [53 x 128]"),
    # markdown italics, bold and a heading around the error (innnky/so-vits-svc#169)
    ("checkpoint/zip_central_directory_spawn_bold_italic_so_vits.log", "RuntimeError", "PytorchStreamReader failed reading zip archive"),
    # a backtick opened on one line and closed on the next, around VS Code's view (Teoge/DMPR-PS#17)
    ("dataloader/unpicklable_lambda_vscode_exception_has_occurred_dmpr.log", "AttributeError", "Can't pickle local object 'train_detector"),
    # an indented error line (Bing-su/adetailer#346)
    ("cuda-assert/illegal_memory_access_indented_adetailer.log", "RuntimeError", "CUDA error: an illegal memory access was encountered"),
    # the error glued to the code line above it, across a run of spaces (qubvel-org/segmentation_models.pytorch#41)
    ("dtype/expected_backend_dtype_double_glued_smp_fscore.log", "RuntimeError", "expected backend CUDA and dtype Double but got"),
    # an error glued to CJK prose (JindongJiang/RedNet#13)
    ("index/target_minus_one_chinese_title_rednet.log", "IndexError", "Target -1 is out of bounds."),
    # a whole traceback flattened onto one line (svip-lab/FastMVSNet#17)
    ("python/no_module_torch_windows_chinese_path_title.log", "ModuleNotFoundError", "No module named 'torch'"),
    # a timestamp-and-logger prefix on every traceback line (marieai/marie-ai#94)
    ("compile/no_cxx_compiler_logger_warning_prefix_marie.log", "torch._dynamo.exc.BackendCompilerFailed", "backend='inductor' raised:"),
])  # fmt: skip
def test_the_error_line_is_found_after_any_prefix(name, exc_type, message_start):
    exc = parse(name).exception
    assert (exc.type, exc.message[: len(message_start)]) == (exc_type, message_start)


def test_a_pytest_E_prefix_is_stripped():
    # sktime/pytorch-forecasting#1998
    assert any(text.startswith("WeightsUnpickler error: Unsupported global: GLOBAL pytorch_forecasting")
               for text in cleaned("checkpoint/weights_only_pytest_E_prefix_pytorch_forecasting.log"))


def test_a_rank_and_glog_prefix_give_the_rank_and_the_text():
    # hiyouga/LlamaFactory#6269: `[rank6]:[E1206 18:44:16.997991020 ProcessGroupNCCL.cpp:1515] [PG 1 Rank 6] ...`
    first = clean_lines((FRESH / "distributed/watchdog_reduce_scatter_rank6_llamafactory.log").read_text())[0]
    assert (first.rank, first.text[:32]) == (6, "[PG 1 Rank 6] Process group watc")


def test_a_record_glued_to_the_progress_bar_it_interrupted_is_still_read(kb):
    # pytorch/pytorch#118369: the watchdog's first report sits at the end of a tqdm line
    report = explain_log(str(FRESH / "distributed/watchdog_tqdm_glued_allreduce_nemo.log"), kb)
    assert report.diagnoses[0].rule == "distributed.nccl-watchdog-timeout-in-log"
    assert report.diagnoses[0].values["seq"] == "96120"  # the glued, first report: not a later one


def test_old_ipython_message_comes_after_folded_frames_and_a_blank_line():
    # avisheknag17/public_ml_models#2: Colab's "4 frames" line sits between the cell and the library frame
    exc = parse("index/target_out_of_bounds_colab_ipython_frames.log").exception
    assert (exc.type, exc.message) == ("IndexError", "Target 5 is out of bounds.")
    assert [(f.function, f.line) for f in exc.frames] == [("<module>", 1), ("nll_loss", 1838)]


@pytest.mark.parametrize(("name", "line"), [
    ("index/embedding_index_ipython_old_factsumm.log", 1852),  # old IPython, header not pasted (Huffon/factsumm#34)
    ("index/embedding_index_ipython8_file_header_mutate.log", 2233),  # IPython 8 `File path:N, in f` (infinitylogesh/mutate#2)
])  # fmt: skip
def test_an_ipython_traceback_pasted_without_its_header(name, line):
    exc = parse(name).exception
    assert (exc.type, exc.frames[-1].function, exc.frames[-1].line) == ("IndexError", "embedding", line)
    assert exc.frames[-1].code.startswith("return torch.embedding(")


def test_colab_markdown_linked_frames_and_cell_lines():
    # rasbt/LLMs-from-scratch#365: `[<ipython-input-81-...>](https://localhost:8080/#) in <cell line: 7>()`
    frames = parse("dataloader/collate_stack_unequal_colab_llms_from_scratch.log").exception.frames
    assert (frames[0].function, frames[0].line) == ("<cell line: 7>", 7)
    assert frames[-1].file.endswith("torch/utils/data/_utils/collate.py") and frames[-1].function == "collate_tensor_fn"


def test_windows_paths_in_frames():
    # DEEP-PolyU/KEQA_WSDM19#26
    exc = parse("index/embedding_index_out_of_range_windows_keqa.log").exception
    user = exc.user_frame()
    assert (user.file, user.line, user.code) == ("C:\\Code\\KEQA_WSDM19-master\\entity_detection.py", 39, "x = self.embed(text)")


def test_a_wrapped_paste_still_gives_its_error():
    # ruotianluo/ImageCaptioning.pytorch#61: frame lines wrapped at 80 columns mid-path
    exc = parse("python/file_not_found_torch_save_dir_missing_quoted.log").exception
    assert (exc.type, exc.message.split("\n")[0]) == ("FileNotFoundError", "[Errno 2] No such file or directory: 'log_st/model.pth'")


def test_a_traceback_cut_off_before_its_error_keeps_what_its_last_frame_raises():
    # xxlong0/SparseNeuS#42: the paste ends at `raise RuntimeError("grad can be implicitly created ...")`
    incident = parse("autograd/nonscalar_backward_traceback_no_error_line_sparseneus.log")
    assert (incident.exception.type, incident.exception.message) == (
        "RuntimeError", "grad can be implicitly created only for scalar outputs")
    assert any("cut off" in note for note in incident.notes)


@pytest.mark.parametrize(("name", "rule"), [
    # the message alone, no exception type (BenMSK/trajectory_prediction_TraPHic#1)
    ("device/same_device_title_only_traphic.log", "device.mixed-devices"),
    # the message alone (zcablii/LSKNet#54)
    ("distributed/pg_not_initialized_syncbn_lsknet.log", "distributed.process-group-not-initialized"),
    # a driver message pasted twice, no type (rikdz/GraphWriter#6)
    ("cuda-env/driver_too_old_found_6050_duplicated.log", "cuda-env.driver-too-old"),
    # italic markdown around a message with no type (facebookresearch/detectron2#4191)
    ("distributed/ddp_unused_parameters_bold_detectron2.log", "distributed.ddp-unused-parameters"),
    # a notebook's JSON error view: the message is a JSON field apart from the traceback (Lightning-AI/pytorch-lightning#19910)
    ("autograd/no_grad_fn_lightning_jupyter_json_test_step.log", "autograd.no-grad-fn"),
    # THC's `THCudaCheck FAIL ... error=77` line before a cut-off traceback (sshaoshuai/Pointnet2.PyTorch#10)
    ("cuda-assert/illegal_memory_access_thcudacheck_77_pointnet2.log", "cuda-assert.illegal-memory-access"),
])  # fmt: skip
def test_a_known_pytorch_message_on_any_line_gets_a_pytorch_diagnosis(name, rule, kb):
    report = explain_log(str(FRESH / name), kb)
    assert report.diagnoses and report.diagnoses[0].rule == rule
    assert any("known message" in note for note in report.incident.notes)


@pytest.mark.parametrize("text", [
    # an issue's title, the message alone (I2-Multimedia-Lab/ProxyFormer#16)
    "No module named 'models'\n",
    # mid-sentence, after the reporter's words (the wording of WongKinYiu/yolov7#628, without its type)
    "when I run detect.py I got the error No module named 'utils.datasets'\n",
])
def test_a_python_message_pasted_without_its_type_reads_as_the_error_it_is(text, tmp_path, kb):
    # checkpoint.pickled-class-missing knows the same words, but only in torch.load's frames, which such a paste lacks
    log = tmp_path / "issue.log"
    log.write_text(text)
    report = explain_log(str(log), kb)
    assert report.incident.exception.type == "ModuleNotFoundError"
    assert report.diagnoses and report.diagnoses[0].rule == "python.module-not-found"


def test_a_known_message_ends_where_the_reporter_s_own_words_start(tmp_path, kb):
    # a bare message, then the reporter's prose in Chinese on the next line (FreedomIntelligence/HuatuoGPT-II style)
    log = tmp_path / "issue.log"
    log.write_text("fire.Fire(main)这一步报错\n\"addmm_impl_cpu_\" not implemented for 'Half'\n我尝试debug了一下没找到问题\n")
    report = explain_log(str(log), kb)
    assert report.incident.exception.message == "\"addmm_impl_cpu_\" not implemented for 'Half'"
    assert report.diagnoses[0].rule == "dtype.half-on-cpu"
    # a message that runs on over several ASCII lines (a state_dict key list) is still read whole
    log.write_text("Error(s) in loading state_dict for Net:\n\tMissing key(s) in state_dict: \"fc.weight\".\n")
    assert "fc.weight" in explain_log(str(log), kb).incident.exception.message


def test_the_known_message_fallback_never_reads_ordinary_lines_as_an_error(tmp_path, kb):
    log = tmp_path / "train.log"
    log.write_text("epoch 1 step 100 loss 0.73\nepoch 1 step 200 loss 0.61\nsaving checkpoint to runs/ckpt.pt\n")
    report = explain_log(str(log), kb)
    assert report.diagnoses == [] and report.incident.exception is None


def test_cjk_prose_glued_to_an_error_type_stays_out_of_the_type():
    # The error quoted first, its frame pasted below: the prose touching the type is not part of the name.
    text = ('训练时报错RuntimeError: CUDA error: out of memory\n\n报错位置:\n'
            '  File "main.py", line 30, in <module>\n    out = model(images)\n')
    incident = parse_text(text)
    assert [(e.type, [f.file for f in e.frames]) for e in incident.exceptions] == [("RuntimeError", ["main.py"])]
    assert incident.exception.message == "CUDA error: out of memory"

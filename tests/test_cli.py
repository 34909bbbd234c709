"""The command line's conventions: one parser per command, help, -V, one-line errors, --json -, colour, progress."""

from __future__ import annotations

import io
import json
import re

import pytest
from conftest import FIXTURES, run_triage

import triage
from triage import render
from triage.cli import main
from triage.cli_common import UsageError
from triage.diagnosis import Diagnosis, ProbeResult, Report
from triage.incident import ExceptionInfo, Frame, Incident
from triage.progress import ProgressBar
from triage.runner.cli import parse

RUN_OPTIONS = ("--report-dir", "--json", "--no-probes", "--hang-timeout", "--on-hang", "--rules", "--replay", "--color")
COLOUR = re.compile(r"\x1b\[[0-9;]*3[0-7]m|\x1b\[[0-9;]*;3[0-7]")  # a foreground colour, not bold or dim
ANY_STYLE = re.compile(r"\x1b\[")


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2, argv
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("triage: "), captured.err
    assert "usage:" not in captured.err and "Traceback" not in captured.err
    return lines[0]


# help and version


def test_top_level_help_lists_every_command_and_the_run_options(capsys):
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal's width
    for command in ("triage run", "triage explain", "triage rules", "triage eval"):
        assert command in out
    for option in RUN_OPTIONS + ("-m MODULE", "-V, --version"):
        assert option in out, option
    assert "--json FILE" in out and "standard output is the script's" in out  # what --json - does for a run


@pytest.mark.parametrize("command", [["run"], ["explain"], ["rules"], ["rules", "show"], ["eval"]])
def test_each_command_has_help(capsys, command):
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: triage {' '.join(command)}")


def test_run_help_is_the_run_options(capsys):
    assert main(["run", "-h"]) == 0
    out = capsys.readouterr().out
    assert all(option in out for option in RUN_OPTIONS)
    assert "triage explain" not in out


@pytest.mark.parametrize("argv", [["-V"], ["--version"], ["run", "-V"], ["explain", "-V"], ["rules", "--version"],
                                  ["eval", "-V"], ["--no-probes", "-V"]])  # fmt: skip
def test_version(capsys, argv):
    assert main(argv) == 0
    assert capsys.readouterr().out == f"triage {triage.__version__}\n"


def test_python_m_triage_names_itself_in_help():
    done = run_triage("--help")
    assert done.returncode == 0
    assert done.stdout.decode().startswith("usage: python -m triage [OPTIONS] SCRIPT [ARGS...]")


# one-line errors, exit status 2


@pytest.mark.parametrize(
    "argv, fragment",
    [
        ([], "no script or command given"),
        (["run"], "no script given"),
        (["--bogus", "x.py"], "unrecognized arguments: --bogus"),
        (["--rep", "out", "x.py"], "unrecognized arguments: --rep"),  # no abbreviations
        (["--hang-timeout", "soon", "x.py"], "takes seconds, not 'soon'"),
        (["--hang-timeout", "-1", "x.py"], "cannot be negative"),
        (["--hang-timeout"], "expected one argument"),
        (["--on-hang", "panic", "x.py"], "invalid choice: 'panic'"),
        (["--color", "sometimes", "x.py"], "invalid choice: 'sometimes'"),
        (["-m"], "-m needs a module name"),
        (["--json", "-", "x.py"], "standard output belongs to the script"),
        (["--replay", "nowhere", "x.py"], "nowhere/batch.pt does not exist"),
        (["explain", "a.log", "b.log"], "unrecognized arguments: b.log"),
        (["explain", "--format", "yaml"], "--format"),
        (["explain", "--json", "-", "--format", "markdown"], "choose one"),
        (["rules"], "required"),
        (["rules", "bogus"], "invalid choice: 'bogus'"),
        (["rules", "show"], "required: ID"),
        (["eval", "--jobs", "0"], "takes 1 or more"),
        (["eval", "--jobs", "many"], "takes a whole number"),
    ],
)
def test_bad_arguments_are_one_line_with_status_2(capsys, argv, fragment):
    assert fragment in one_line_error(capsys, argv)


def test_a_usage_error_points_to_the_commands_help(capsys):
    assert one_line_error(capsys, ["explain", "--format", "yaml"]).endswith("(see `triage explain --help`)")
    assert one_line_error(capsys, ["--bogus", "x.py"]).endswith("(see `triage --help`)")


# the run options end at SCRIPT


def test_everything_after_script_belongs_to_it():
    options = parse(["--no-probes", "--json=out.json", "train.py", "--json", "x", "--help", "-V", "--", "-m", "y"])
    assert (options.target, options.module) == ("train.py", False)
    assert options.args == ["--json", "x", "--help", "-V", "--", "-m", "y"]
    assert (options.json, options.probes) == ("out.json", False)


def test_module_and_double_dash_end_the_options():
    assert (parse(["-m", "pkg.train", "--json", "x"]).args) == ["--json", "x"]
    attached = parse(["--no-probes", "-mpkg.train", "-m", "x"])
    assert (attached.target, attached.module, attached.args, attached.probes) == ("pkg.train", True, ["-m", "x"], False)
    assert parse(["--", "--looks-like-an-option.py", "a"]).target == "--looks-like-an-option.py"
    assert parse(["--hang-timeout", "5", "train.py"]).hang_timeout == 5.0
    assert parse(["--rules", "a", "--rules=b", "train.py"]).rules == ["a", "b"]


def test_dash_is_the_script_read_from_stdin():
    options = parse(["--no-probes", "-", "a", "--json", "b"])
    assert (options.target, options.args, options.label) == ("-", ["a", "--json", "b"], "stdin")


def test_parse_reports_help_and_refuses_nonsense():
    assert parse(["--help"]) is None
    assert parse(["--no-probes", "-h"]) is None
    for bad in ([], ["--nope", "x.py"], ["--on-hang", "x", "y.py"], ["--color"]):
        with pytest.raises(UsageError):
            parse(bad)


# explain --json


def test_explain_json_dash_is_standard_output():
    done = run_triage("explain", FIXTURES / "ipython8.log", "--json", "-")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["schema"] == "triage.report/1"
    assert report["diagnoses"][0]["rule"] == "shape.linear-in-features"
    assert not (FIXTURES.parent.parent / "-").exists()


def test_explain_json_file_keeps_the_text_view(tmp_path):
    target = tmp_path / "out" / "report.json"
    target.parent.mkdir()
    done = run_triage("explain", FIXTURES / "ipython8.log", "--json", target)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().startswith("triage: RuntimeError")
    assert json.loads(target.read_text())["diagnoses"][0]["rule"] == "shape.linear-in-features"


def test_explain_json_to_an_unwritable_place_is_one_line(capsys, tmp_path):
    nowhere = str(tmp_path / "no" / "dir.json")
    line = one_line_error(capsys, ["explain", str(FIXTURES / "ipython8.log"), "--json", nowhere])
    assert "cannot write it" in line


# colour: rich decides, from the terminal, NO_COLOR, FORCE_COLOR and TERM; --color overrides


def _report(*diagnoses: Diagnosis, source: str = "log") -> Report:
    frame = Frame(file="train.py", line=3, function="forward", code="y = self.fc(x)", user=True)
    exc = ExceptionInfo(type="RuntimeError", message="mat1 and mat2 shapes cannot be multiplied (4x8 and 6x2)",
                        frames=[frame])  # fmt: skip
    return Report(source=source, incident=Incident(source=source, exception=exc, exceptions=[exc]),
                  diagnoses=list(diagnoses))  # fmt: skip


def _diagnosis(rule: str, confidence: float, **extra) -> Diagnosis:
    return Diagnosis(rule=rule, category=rule.split(".")[0], confidence=confidence, title=f"title of {rule}",
                     hypothesis="because", fix="change it", **extra)  # fmt: skip


def _terminal_text(color="auto", stream=None) -> str:
    stream = stream if stream is not None else FakeTerminal()
    render.to_terminal(_report(_diagnosis("shape.a", 0.9)), stream, color=color, width=100)
    return stream.getvalue()


def test_a_terminal_gets_colour():
    assert COLOUR.search(_terminal_text())


@pytest.mark.parametrize("value", ["1", "true", "0"])  # no-color.org: any non-empty value
def test_no_color_turns_colour_off(monkeypatch, value):
    monkeypatch.setenv("NO_COLOR", value)
    text = _terminal_text()
    assert not COLOUR.search(text)
    assert "title of shape.a" in text


def test_an_empty_no_color_is_not_set(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "")
    assert COLOUR.search(_terminal_text())


def test_force_color_colours_a_pipe(monkeypatch):
    assert not ANY_STYLE.search(_terminal_text(stream=io.StringIO()))
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert COLOUR.search(_terminal_text(stream=io.StringIO()))
    monkeypatch.setenv("FORCE_COLOR", "")  # force-color.org: empty means unset
    assert not ANY_STYLE.search(_terminal_text(stream=io.StringIO()))


def test_a_dumb_terminal_gets_plain_text(monkeypatch):
    monkeypatch.setenv("TERM", "dumb")
    assert not ANY_STYLE.search(_terminal_text())


def test_color_option_overrides_the_environment(monkeypatch):
    assert COLOUR.search(_terminal_text("always", stream=io.StringIO()))
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert not ANY_STYLE.search(_terminal_text("never"))


def test_plain_and_rich_output_carry_the_same_text(monkeypatch):
    plain = _terminal_text("never")
    monkeypatch.setenv("TERM", "dumb")  # rich's own path, with no escape codes
    assert _terminal_text("always") == plain


def test_explain_color_option_end_to_end():
    always = run_triage("explain", FIXTURES / "ipython8.log", "--color", "always")
    never = run_triage("explain", FIXTURES / "ipython8.log", "--color", "never", FORCE_COLOR="1")
    forced = run_triage("explain", FIXTURES / "ipython8.log", FORCE_COLOR="1")
    assert always.returncode == never.returncode == forced.returncode == 0
    assert COLOUR.search(always.stdout.decode()) and COLOUR.search(forced.stdout.decode())
    assert not ANY_STYLE.search(never.stdout.decode())
    # Piped output keeps whole lines (no wrap at 80 columns), coloured or not.
    assert "expects 400 input features but receives 2704" in always.stdout.decode()


# render: order of alternatives, Markdown code spans, the hint for an unmatched failure


def test_other_possibilities_are_sorted_by_confidence():
    report = _report(_diagnosis("shape.lead", 0.7), _diagnosis("dtype.low", 0.3), _diagnosis("device.high", 0.65),
                     _diagnosis("index.mid", 0.5))  # fmt: skip
    text = "".join("".join(piece for piece, _ in line) + "\n" for line in render.terminal_lines(report))
    order = [text.index(f"title of {rule}") for rule in ("shape.lead", "device.high", "index.mid", "dtype.low")]
    assert order == sorted(order)
    assert "  2. title of device.high" in text and "  4. title of dtype.low" in text
    markdown = render.to_markdown(report)
    assert markdown.index("device.high") < markdown.index("index.mid") < markdown.index("dtype.low")


@pytest.mark.parametrize("text", ["plain", "use `x.view(-1)`", "`starts", "ends`", "a ``double`` run", " spaced "])
def test_code_spans_survive_backticks(text):
    from markdown_it import MarkdownIt  # rich's own Markdown parser: a CommonMark one

    tokens = MarkdownIt().parseInline(render.code_span(text))[0].children
    assert [(token.type, token.content) for token in tokens] == [("code_inline", text)]


def test_markdown_report_keeps_a_backtick_message_in_one_code_span():
    from markdown_it import MarkdownIt

    message = "Expected `target` to be Long, got `Float` instead"
    report = _report(_diagnosis("dtype.target", 0.8, evidence=[f"RuntimeError: {message}"],
                                probes=[ProbeResult("dtype_census", "confirmed", "`target` is Float")]))  # fmt: skip
    report.incident.exception.message = message
    markdown = render.to_markdown(report)
    spans = [t.content for t in MarkdownIt().parse(markdown) if t.type == "inline" for t in t.children
             if t.type == "code_inline"]  # fmt: skip
    assert f"RuntimeError: {message}" in spans  # the Observed line and the evidence, each whole
    assert spans.count(f"RuntimeError: {message}") == 2


def test_the_unmatched_hint_names_an_option_the_command_has():
    for source, expected, wrong in (("log", "--format json", "report.json"), ("run", "report.json", "--format")):
        text = "".join(piece for line in render.terminal_lines(_report(source=source)) for piece, _ in line)
        assert expected in text and wrong not in text


# progress


def test_progress_bar_draws_on_a_terminal_and_goes_away():
    stream = FakeTerminal()
    with ProgressBar(3, "triage eval", stream=stream, delay=0) as bar:
        import time

        deadline = time.monotonic() + 5
        while bar._bar is None and time.monotonic() < deadline:  # the timer thread starts it
            time.sleep(0.01)
        for name in ("a.log", "b.log", "c.py"):
            bar.advance(name)
    assert bar.done == 3
    assert "triage eval" in stream.getvalue() and "3/3" in stream.getvalue()


def test_progress_bar_is_silent_off_a_terminal_or_when_quick():
    piped = io.StringIO()
    with ProgressBar(2, "triage eval", stream=piped, delay=0) as bar:
        bar.advance("a")
        bar.advance("b")
    quick = FakeTerminal()
    with ProgressBar(2, "triage eval", stream=quick, delay=30) as bar:
        bar.advance("a")
    assert piped.getvalue() == quick.getvalue() == ""


def test_eval_off_a_terminal_prints_no_progress(tmp_path):
    logs = tmp_path / "logs" / "shape"
    logs.mkdir(parents=True)
    (logs / "a.log").write_text("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x57600 and 64x128)\n")
    (logs / "expected.yaml").write_text("a.log: {category: shape, rule: shape.linear-in-features}\n")
    done = run_triage("eval", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert "ALL logs                     1 100.0%" in done.stdout.decode()

"""No planted secret reaches any byte triage writes: report folder, --json copy, stderr (runner and wrapper)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from triage.capture.secrets import SCRUBBED, is_secret_flag, scrub_argv, scrub_data, scrub_strings, scrub_text
from triage.capture.summarize import summarize

REPO = Path(__file__).resolve().parent.parent

# One value of every kind the issue names; each is unique, so a grep for it finds only a leak.
SECRETS = {
    "aws": "AKIAZ7QXW3RT5YU8PLMN",
    "github": "ghp_Zq8Xw2Lk5Jm9Nb3Vc7Hg1Df4Sa6Pt0Ry2Ue8Io",
    "github_pat": "github_pat_11AZQ8XW2L0k5Jm9Nb3Vc7_Hg1Df4Sa6Pt0Ry2Ue8IoQwErTy",
    "huggingface": "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",
    "openai": "sk-proj-Qz8Wx2Ec5Rv9Tb3Yn7Um1Io4Pl6Kj0Hg2Fd8Sa",
    "slack": "xoxb-2048-4096-AbCdEfGhIjKlMnOpQr",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0cmlhZ2UtdGVzdCJ9.c2lnbmF0dXJlLXRyaWFnZS10ZXN0",
    "pem_body": "MIIEpAIBAAKCAQEAtriagePEMbodyQz8Wx2Ec5Rv9",
    "url_password": "UrlPassw0rd77",
    "bearer": "BearerTok3nValue9876",
    "pair_equals": "PairPassw0rd55",
    "pair_colon": "ColonApiKey1234",
    "high_entropy": "7f3a9c2e8b1d4f6a0c5e9b7d",
    "dict_bearer": "DictBearer7777abc",
    "tuple_api_key": "TupleApiKey4321",
    "exception_password": "hunter2",
    "argv_db_pass": "ArgvDbPass11",
    "argv_wandb_key": "ArgvWandbKey22",
    "argv_short_p": "ArgvShortPw33",
    "env_url_password": "EnvUrlPass44",
    "env_secret_name": "EnvNcclSecret55",
}
ARGV = ["--db-pass", SECRETS["argv_db_pass"], f"--wandb-key={SECRETS['argv_wandb_key']}", "-p", SECRETS["argv_short_p"],
        "--lr", "0.1"]  # fmt: skip

PLANTED = textwrap.dedent('''\
    import os
    import sys

    def connect(settings, pairs, headers, argv):
        raise RuntimeError("login failed with password=" + settings["pw"])

    def main():
        aws = {aws!r}
        gh = [{github!r}, {github_pat!r}]
        hub = os.environ["HF_TOKEN"]
        llm = {openai!r}
        chat = {slack!r}
        session_blob = {jwt!r}
        pem = "-----BEGIN RSA PRIVATE KEY-----\\n" + {pem_body!r} + "\\n-----END RSA PRIVATE KEY-----\\n"
        dsn_url = "postgresql://admin:" + {url_password!r} + "@db.internal:5432/prod"
        header_line = "Authorization: Bearer " + {bearer!r}
        config_line = "db_password=" + {pair_equals!r} + " host=db"
        yaml_line = "api_key: " + {pair_colon!r}
        note = "the secret is " + {high_entropy!r}
        headers = {{"Accept": "json", "Authorization": "Bearer " + {dict_bearer!r}}}
        pairs = [("user", "ana"), ("api_key", {tuple_api_key!r})]
        argv = sys.argv[1:]
        {prelude}
        connect({{"pw": "hunter2", "host": "db"}}, pairs, headers, argv)

    main()
    ''')


def _script(tmp_path: Path, prelude: str = "") -> Path:
    path = tmp_path / "planted.py"
    path.write_text(PLANTED.format(prelude=prelude, **SECRETS))
    return path


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRIAGE_RULES", "TRIAGE_DEBUG", "NO_COLOR", "FORCE_COLOR")}
    env.update(HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "xdg"),
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
               HF_TOKEN=SECRETS["huggingface"],
               TORCHINDUCTOR_CACHE_URL=f"redis://cache:{SECRETS['env_url_password']}@cache.internal:6379",
               NCCL_IB_SECRET=SECRETS["env_secret_name"])  # fmt: skip
    return env


def _leaks(data: bytes) -> list[str]:
    return [kind for kind, value in SECRETS.items() if value.encode() in data]


def _written(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def _triage_stderr(under_triage: str, plain: str) -> bytes:
    """What triage added to stderr: the lines plain python does not print (its traceback is the user's own)."""
    plain_lines = set(plain.splitlines())
    return "\n".join(line for line in under_triage.splitlines() if line not in plain_lines).encode()


def test_the_planted_script_really_holds_every_secret(tmp_path):
    done = subprocess.run([sys.executable, str(_script(tmp_path)), *ARGV], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and "password=hunter2" in done.stderr


def test_no_planted_secret_in_any_byte_the_runner_writes(tmp_path):
    script = _script(tmp_path)
    env = _env(tmp_path)
    plain = subprocess.run([sys.executable, str(script), *ARGV], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "triage", "--report-dir", str(out / "report"),
                           "--json", str(out / "copy.json"), str(script), *ARGV],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr
    written = _written(out)
    assert {"report/report.json", "report/report.md", "copy.json"} <= set(written)
    report = written["report/report.json"].decode()
    # The capture really ran over these values: each is in the report, scrubbed.
    assert "password=[scrubbed]" in report and SCRUBBED in report and '"hub"' in report and '"pairs"' in report
    for name, data in written.items():
        assert _leaks(data) == [], name
    assert _leaks(_triage_stderr(done.stderr, plain.stderr)) == []
    assert _leaks(done.stdout.encode()) == []


def test_no_planted_secret_in_any_byte_the_wrapper_writes(tmp_path):
    reports = tmp_path / "reports"
    script = _script(tmp_path, prelude=f"import triage; triage.install(report_dir={str(reports)!r}, probes=False)")
    env = _env(tmp_path)
    plain = subprocess.run([sys.executable, str(_script(tmp_path / "..", prelude="pass")), *ARGV], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    done = subprocess.run([sys.executable, str(script), *ARGV], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1
    written = _written(reports)
    assert "report.json" in written and b"password=[scrubbed]" in written["report.json"]
    for name, data in written.items():
        assert _leaks(data) == [], name
    assert _leaks(_triage_stderr(done.stderr, plain.stderr)) == []


# --- the scrubber, kind by kind --------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("login failed with password=hunter2", "login failed with password=[scrubbed]"),
    ("{'Authorization': 'Bearer abcdefghijkl12345'}", "{'Authorization': 'Bearer [scrubbed]'}"),
    ("curl -H 'Authorization: Basic dXNlcjpwYXNz'", "curl -H 'Authorization: Basic [scrubbed]'"),
    ("sent bearer abcdefgh12345678 upstream", "sent bearer [scrubbed] upstream"),
    ("postgresql://admin:S3cret@host:5432/db", "postgresql://admin:[scrubbed]@host:5432/db"),
    ("python train.py --db-pass x1 --wandb-key=y2 -p z3 --lr 0.1",
     "python train.py --db-pass [scrubbed] --wandb-key=[scrubbed] -p [scrubbed] --lr 0.1"),
    ("mysql -uroot -phunter2 db", "mysql -uroot -p[scrubbed] db"),
    ("config: {'password': 'a', 'auth': ('u', 'p'), 'x': 1}", "config: {'password': '[scrubbed]', 'auth': [scrubbed], 'x': 1}"),
    ("my token is 9f8e7d6c5b4a39281706f5e4", "my token is [scrubbed]"),
    ("key=-----BEGIN PRIVATE KEY-----\\nMIIB\\n-----END PRIVATE KEY----- end", "key=[scrubbed] end"),
])  # fmt: skip
def test_scrub_text_by_value_and_by_name(text, expected):
    assert scrub_text(text) == expected


@pytest.mark.parametrize("text", [
    "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x400 and 256x120)",
    "tokens: 5, max_tokens=20, tokenizer=bert-base-uncased, author: ana",
    "checkpoint sha 9f8e7d6c5b4a39281706f5e4 loaded",  # random-looking, but nothing says it is a secret
    "python train.py --key-frames 4 --lr 0.1 -n 3",
    "raised at /home/ana/proj/float_token_ids_embedding.py:29 in forward",  # a source location, not name: value
    "first non-finite value in the forward pass: log at train.py:12",
])  # fmt: skip
def test_ordinary_text_is_left_alone(text):
    assert scrub_text(text) == text


def test_argv_pairs_and_flags():
    assert scrub_argv(["--db-pass", "a", "-pb", "--token", "--verbose"]) == ["--db-pass", SCRUBBED, f"-p{SCRUBBED}", "--token", "--verbose"]
    assert scrub_strings(("api_key", "abc")) == ["api_key", SCRUBBED]
    assert is_secret_flag("--wandb-key") and is_secret_flag("-p") and not is_secret_flag("--key-frames")


def test_summaries_scrub_string_locals_and_pairs():
    assert summarize("Authorization: Bearer abcdefgh12345678")["text"] == "'Authorization: Bearer [scrubbed]'"
    pairs = summarize([("user", "ana"), ("api_key", "abc123")])
    assert "abc123" not in str(pairs) and "ana" in pairs["text"]
    nested = summarize({"headers": {"Authorization": "Bearer abcdefgh12345678"}})
    assert "abcdefgh12345678" not in str(nested)


def test_scrub_data_walks_a_report():
    data = {"run": {"argv": ["--api-token", "t0k"]}, "locals": {"secret": "s3"}, "text": ["note password=p4"]}
    assert "t0k" not in str(scrub_data(data)) and "s3" not in str(scrub_data(data)) and "p4" not in str(scrub_data(data))

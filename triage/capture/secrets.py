"""Recognise values that look like secrets and replace them before anything is written or printed.

Two ways in, both needed. By name: a variable, key, flag or environment name is
checked word by word (`hf_token`, `dbPassword`, `OPENAI_API_KEY` are secrets;
`tokens`, `tokenizer`, `max_tokens`, `author` are not), with Sentry's default
denylist as the floor. By value: free text (a repr, a message, a log line, an
argument list) has self-identifying tokens (AWS, GitHub, Hugging Face, OpenAI,
Slack, JWT, PEM private keys), URL passwords, Authorization/Bearer credentials,
`name=value` / `name: value` pairs and `--flag value` options with a secret
name, and high-entropy strings next to a secret-like word replaced.

`scrub_text` is the one function for text; `scrub_argv` for an argument list,
`scrub_strings` for any list of strings (a copied argv, a list of pairs) and
`scrub_data` for a whole JSON-able structure about to be written.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

SCRUBBED = "[scrubbed]"

# Single words that make a name secret (Sentry's DEFAULT_DENYLIST plus a few of the same kind).
SECRET_WORDS = frozenset({
    "password", "passwd", "pwd", "pw", "passphrase", "secret", "secrets", "auth", "credential", "credentials",
    "token", "session", "sessionid", "cookie", "cookies", "authorization", "csrf", "xsrf", "csrftoken",
    "apikey", "privatekey", "bearer", "jwt", "dsn", "phpsessid", "symfony",
})  # fmt: skip
# Several-word entries, matched anywhere in the normalised name.
SECRET_PHRASES = (
    "api_key", "apikey", "access_key", "access_token", "refresh_token", "id_token", "private_key",
    "privatekey", "secret_key", "client_secret", "mysql_pwd", "set_cookie", "x_api_key", "connect_sid",
    "auth_token", "session_key", "signing_key", "encryption_key", "x_forwarded_for",
)  # fmt: skip
# A command-line flag whose last word is one of these holds a secret (`--db-pass`, `--wandb-key`);
# as a variable name, `key` alone is too common (a dict loop) to count.
SECRET_FLAG_WORDS = frozenset({"pass", "key", "pw", "pat", "passcode", "pin"})
# Short options that by convention take a password (mysql -pSECRET, sshpass -p SECRET).
PASSWORD_SHORT_FLAGS = frozenset({"-p"})

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[^a-z0-9]+")

# Token formats that identify themselves.
_TOKEN_VALUE = re.compile(
    r"\b(?:sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{20,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}|xox[abeoprs]-[A-Za-z0-9-]{10,}|eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]{8,}"
    r"|[rs]k_live_[A-Za-z0-9]{16,}|glpat-[\w-]{20,}|AIza[0-9A-Za-z_-]{35})"
)
# A PEM private key, whole or cut off (a repr shows its newlines as \n, which this also spans).
_PRIVATE_KEY = re.compile(
    r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)", re.DOTALL
)
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^/\s:@'\"]+:)(?P<password>[^@\s/'\"]+)(?P<tail>@)")
# `Authorization: Basic abc`, `authorization=Token abc`: the scheme stays, the credential goes.
_AUTHORIZATION = re.compile(
    r"(?P<head>\b(?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?(?:(?:bearer|basic|token|digest|negotiate)\s+)?)"
    r"(?P<value>[^\s'\",;)}\]]+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<head>\bbearer\s+)(?P<value>[A-Za-z0-9._~+/=-]{8,})", re.IGNORECASE)
# `name=value`, `name: value`, `"name": "value"` anywhere in a line; a value may be a tuple, list or dict.
_PAIR = re.compile(
    r"""(?P<name>(?<![\w-])[A-Za-z_][\w.-]*)(?P<sep>['"]?\s*[=:]\s*)(?P<value>\[scrubbed\]"""
    r"""|\([^()\n]{0,400}\)|\[[^\[\]\n]{0,400}\]|\{[^{}\n]{0,400}\}|'[^'\n]*'|"[^"\n]*"|[^\s,;)}\]]+)"""
)
# `--name value` / `--name=value` in a command line written into text.
_FLAG = re.compile(r"""(?P<name>(?<![\w-])--?[A-Za-z][\w-]*)(?P<sep>=|\s+)(?P<value>\[scrubbed\]|'[^'\n]*'|"[^"\n]*"|[^\s'"]+)""")
# `-pSECRET` / `-p SECRET` (mysql's convention) in a command line.
_SHORT_PASSWORD = re.compile(r"(?P<head>(?:^|(?<=\s))-p(?:\s+|(?=[^\s-])))(?P<value>[^\s'\"-][^\s'\"]*)")
# A high-entropy run of characters and the secret-like words that make it a credential when close by.
_CANDIDATE = re.compile(r"[A-Za-z0-9+/_.=~-]{16,}")
_NEARBY_SECRET_WORD = re.compile(
    r"(?:passw(?:or)?d|pwd|secret|token|api[_ -]?key|apikey|access[_ -]?key|private[_ -]?key|credential|auth|bearer)",
    re.IGNORECASE,
)
NEAR_CHARS = 40
MIN_ENTROPY_BITS = 3.0


def name_words(name: str) -> list[str]:
    return [w for w in _SEPARATORS.split(_CAMEL.sub("_", name).lower()) if w]


def is_secret_name(name: str) -> bool:
    """True when a variable, key, flag or environment name looks like it holds a secret."""
    if not name:
        return False
    words = name_words(name)
    # `pass` alone is a flag word (`--db-pass`), not a name: in prose, "the forward pass: log at ..." is no secret.
    if any(word in SECRET_WORDS for word in words):
        return True
    joined = "_".join(words)
    return any(phrase in joined for phrase in SECRET_PHRASES)


def is_secret_flag(flag: str) -> bool:
    """True for a command-line option whose value is a secret: `--db-pass`, `--wandb-key`, `--api-token`, `-p`."""
    if flag in PASSWORD_SHORT_FLAGS:
        return True
    name = flag.lstrip("-")
    if not name:
        return False
    words = name_words(name)
    return is_secret_name(name) or (bool(words) and words[-1] in SECRET_FLAG_WORDS)


def scrub_text(text: str) -> str:
    """Free text with every kind of secret this module knows replaced by [scrubbed]."""
    if not text or not isinstance(text, str):
        return text
    text = _PRIVATE_KEY.sub(SCRUBBED, text)
    text = _TOKEN_VALUE.sub(SCRUBBED, text)
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + SCRUBBED + m.group("tail"), text)
    text = _AUTHORIZATION.sub(_keep_head, text)
    text = _BEARER.sub(_keep_head, text)
    text = _PAIR.sub(_scrub_pair, text)
    text = _FLAG.sub(_scrub_flag, text)
    text = _SHORT_PASSWORD.sub(_keep_head, text)
    return _scrub_high_entropy(text)


def _keep_head(match: re.Match) -> str:
    return match.group("head") + (match.group("value") if match.group("value") == SCRUBBED else SCRUBBED)


def _replace_value(match: re.Match) -> str:
    value = match.group("value")
    quote = value[0] if value[:1] in "'\"" and len(value) > 1 and value[-1] == value[0] else ""
    return f"{match.group('name')}{match.group('sep')}{quote}{SCRUBBED}{quote}"


_AUTH_SCHEMES = frozenset({"basic", "bearer", "token", "digest", "negotiate"})


# `tokenizer_utils.py:29`: a source location (file name, line number), not a name and its value.
_FILE_NAME = re.compile(r"[\w.-]*\.[A-Za-z][A-Za-z0-9]{0,5}")


def _scrub_pair(match: re.Match) -> str:
    value = match.group("value")
    if value.isdigit() and match.group("sep").strip() == ":" and _FILE_NAME.fullmatch(match.group("name")):
        return match.group(0)
    if not is_secret_name(match.group("name")):
        if value[:1] in "([{" and value != SCRUBBED:  # `config: {'password': ...}`: look inside
            return match.group("name") + match.group("sep") + _PAIR.sub(_scrub_pair, value)
        return match.group(0)
    if SCRUBBED in value or value.lower() in _AUTH_SCHEMES:
        return match.group(0)  # `Authorization: Basic [scrubbed]`: the scheme is not the secret
    return _replace_value(match)


def _scrub_flag(match: re.Match) -> str:
    if not is_secret_flag(match.group("name")) or SCRUBBED in match.group("value"):
        return match.group(0)
    if match.group("sep").isspace() and match.group("value").startswith("-"):
        return match.group(0)  # `--token --verbose`: the next word is another option
    return _replace_value(match)


def _scrub_high_entropy(text: str) -> str:
    """Random-looking strings within a few words after a secret-like word ("my token is 9f8e...")."""
    if not _NEARBY_SECRET_WORD.search(text):
        return text

    def replace(match: re.Match) -> str:
        value = match.group(0)
        if SCRUBBED in value or not looks_random(value):
            return value
        before = text[max(0, match.start() - NEAR_CHARS) : match.start()]
        return SCRUBBED if _NEARBY_SECRET_WORD.search(before) else value

    return _CANDIDATE.sub(replace, text)


def looks_random(value: str) -> bool:
    """A credential-like string: letters and digits mixed, with high per-character entropy."""
    if not (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)):
        return False
    counts = Counter(value)
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return entropy >= MIN_ENTROPY_BITS


def scrub_argv(argv: list[str]) -> list[str]:
    """Command-line arguments with the values of secret-named options (and `-p`) replaced."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            hide_next = False
            if not (isinstance(arg, str) and arg.startswith("--")):
                out.append(SCRUBBED)
                continue
        if not isinstance(arg, str):
            out.append(arg)
            continue
        if arg.startswith("-") and "=" in arg:
            name, _, _value = arg.partition("=")
            out.append(f"{name}={SCRUBBED}" if is_secret_flag(name) else scrub_text(arg))
            continue
        if arg.startswith("-") and is_secret_flag(arg):
            hide_next = True
            out.append(arg)
            continue
        if arg[:2] in PASSWORD_SHORT_FLAGS and len(arg) > 2 and not arg.startswith("--"):
            out.append(arg[:2] + SCRUBBED)  # -pSECRET
            continue
        out.append(scrub_text(arg))
    return out


def scrub_strings(items: list[str] | tuple[str, ...]) -> list[str]:
    """A list of strings read as pairs as well as options: ("api_key", "abc") hides "abc" as --api-key abc would."""
    out = scrub_argv(list(items))
    for index in range(len(out) - 1):
        if is_secret_name(str(items[index]).strip()) and out[index + 1] != SCRUBBED:
            out[index + 1] = SCRUBBED
    return out


def scrub_data(value: Any, _depth: int = 0) -> Any:
    """A JSON-able structure with every string scrubbed and the values of secret-named keys replaced."""
    if _depth > 64:
        return value
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {key: (SCRUBBED if isinstance(key, str) and is_secret_name(key) and isinstance(item, (str, int, float))
                      else scrub_data(item, _depth + 1)) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(item, str) for item in value):
            return scrub_strings(list(value))
        return [scrub_data(item, _depth + 1) for item in value]
    return value

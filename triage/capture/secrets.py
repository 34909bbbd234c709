"""Recognise values that look like secrets and replace them before anything is written or printed.

Names are checked word by word (`hf_token`, `dbPassword`, `OPENAI_API_KEY` are
secrets; `tokens`, `tokenizer`, `max_tokens`, `author` are not), with Sentry's
default denylist as the floor. Free text (a repr, an environment value, an
argument list) has `name=value` pairs with a secret name and well-known token
formats replaced.
"""

from __future__ import annotations

import re

SCRUBBED = "[scrubbed]"

# Single words that make a name secret (Sentry's DEFAULT_DENYLIST plus a few of the same kind).
SECRET_WORDS = frozenset({
    "password", "passwd", "pwd", "passphrase", "secret", "secrets", "auth", "credential", "credentials",
    "token", "session", "sessionid", "cookie", "cookies", "authorization", "csrf", "xsrf", "csrftoken",
    "apikey", "privatekey", "bearer", "jwt", "dsn", "phpsessid", "symfony",
})  # fmt: skip
# Several-word entries, matched anywhere in the normalised name.
SECRET_PHRASES = (
    "api_key", "apikey", "access_key", "access_token", "refresh_token", "id_token", "private_key",
    "privatekey", "secret_key", "client_secret", "mysql_pwd", "set_cookie", "x_api_key", "connect_sid",
    "auth_token", "session_key", "signing_key", "encryption_key", "x_forwarded_for",
)  # fmt: skip

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[^a-z0-9]+")

# Token formats that identify themselves (OpenAI, Hugging Face, GitHub, AWS, Slack, JWT, Stripe, GitLab).
_TOKEN_VALUE = re.compile(
    r"\b(?:sk-(?:proj-)?[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{20,}"
    r"|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]{8,}|[rs]k_live_[A-Za-z0-9]{16,}"
    r"|glpat-[\w-]{20,})"
)
# `name=value`, `name: value`, `"name": "value"`, `--name value` in free text.
_PAIR = re.compile(
    r"""(?P<name>-{0,2}[A-Za-z_][\w.-]*)(?P<sep>['"]?\s*[=:]\s*|\s+)(?P<value>'[^'\n]*'|"[^"\n]*"|[^\s,;)}\]]+)"""
)
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)(?P<password>[^@\s/]+)(?P<tail>@)")


def name_words(name: str) -> list[str]:
    return [w for w in _SEPARATORS.split(_CAMEL.sub("_", name).lower()) if w]


def is_secret_name(name: str) -> bool:
    """True when a variable, key, flag or environment name looks like it holds a secret."""
    if not name:
        return False
    words = name_words(name)
    if any(word in SECRET_WORDS for word in words):
        return True
    joined = "_".join(words)
    return any(phrase in joined for phrase in SECRET_PHRASES)


def scrub_text(text: str) -> str:
    """Free text with secret-named values, URL passwords and self-identifying tokens replaced."""
    if not text:
        return text
    text = _TOKEN_VALUE.sub(SCRUBBED, text)
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + SCRUBBED + m.group("tail"), text)

    def pair(match: re.Match) -> str:
        name = match.group("name").lstrip("-")
        if not is_secret_name(name) or match.group("value") == SCRUBBED:
            return match.group(0)
        if match.group("sep").isspace() and not match.group("name").startswith("-"):
            return match.group(0)  # "token 5" in prose is not an assignment; "--token abc" is
        value = match.group("value")
        quote = value[0] if value[:1] in "'\"" else ""
        return f"{match.group('name')}{match.group('sep')}{quote}{SCRUBBED}{quote}"

    return _PAIR.sub(pair, text)


def scrub_argv(argv: list[str]) -> list[str]:
    """Command-line arguments with the values of secret-named options replaced."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(SCRUBBED)
            hide_next = False
            continue
        if arg.startswith("-") and "=" in arg:
            name, _, _value = arg.partition("=")
            out.append(f"{name}={SCRUBBED}" if is_secret_name(name.lstrip("-")) else scrub_text(arg))
            continue
        if arg.startswith("-") and is_secret_name(arg.lstrip("-")):
            hide_next = True
            out.append(arg)
            continue
        out.append(scrub_text(arg))
    return out

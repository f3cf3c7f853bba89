"""Secrets out of everything optagent prints or saves: one rule for transcripts, status, the deploy
diff, error messages, benchmark records and the endpoint.

What is hidden: the value of an option, variable or key *named* like a secret (`--api-key`,
`--admin-api-key`, `--ssl-keyfile-password`, `HF_TOKEN=`, `api_key='...'` in SGLang's dump of its
arguments, `"password": ...`), an `Authorization` header's credentials, tokens that look like keys
(`sk-...`, `hf_...`), the password of a URL (`http://user:[REDACTED]@host`) or its token alone
(`https://[REDACTED]@github.com`, see `looks_like_credential`), and the configured key and
secret-named environment variables' values wherever they appear. A secret-named variable's value
(`HF_TOKEN=...`, `API_KEY=abc.def.ghi`: capitals, `=` with no space) is hidden whatever it looks
like. What is never hidden: an ordinary flag or counter (`--speculative-num-draft-tokens 4`,
`--max-prefill-tokens 16384`, `max_tokens=256`, `input_tokens`, `TOKENIZERS_PARALLELISM=false`), a
user name (`root@127.0.0.1`, `ssh://ubuntu@gpu-host`), nor code quoted as evidence
(`api_key=args.api_key`, `next_token = tokens[pos]`).

The name rule (`is_secret_name`), read from SGLang 0.5.23's arguments (`api_key`, `admin_api_key`,
`ssl_keyfile_password`, `watermark_key`, `watermark_key_b` are secrets; `max_prefill_tokens`,
`speculative_token_map`, `ssl_keyfile`, `bucket_time_to_first_token`, `bot_token` are not): the last
word (a one-character suffix like `_b` aside) is password, passwd, passphrase, secret or
credential(s), or ends in one (`PGPASSWORD`); or it is key or token after a word that says what kind
(`api_key`, `hf_token`, `refresh_token`; any word for an environment variable in capitals,
`CI_JOB_TOKEN`). A name that counts or places tokens (a word such as num, max, min, per, first,
last) or names a vocabulary token (`eos_token`) never is; neither is a bare `key` or `token`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "REDACTED",
    "env_secrets",
    "is_secret_name",
    "looks_like_credential",
    "redact",
    "redact_flags",
    "redact_text",
]

REDACTED = "[REDACTED]"

_ALWAYS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "secret",
        "credential",
        "credentials",
        "apikey",
        "authtoken",
        "accesstoken",
    }
)
_ENDINGS = ("password", "passwd", "secret", "apikey")
_QUALIFIED = frozenset({"key", "token"})
"""Last words that make a secret only after a word saying what kind: `api_key`, `hf_token`, not
`cache_key`, `next_token` (code is full of those)."""
_QUALIFIERS = frozenset(
    {"api", "admin", "access", "auth", "bearer", "refresh", "session", "id", "hf", "hub", "github", "gh",
     "gitlab", "npm", "pypi", "slack", "oauth", "jwt", "csrf", "secret", "security", "private", "personal",
     "service", "client", "app", "user", "deploy", "registry", "vault", "ci", "job", "master", "signing",
     "encryption", "license", "ssh", "watermark", "hmac", "subscription", "account", "storage", "sas"}
)  # fmt: skip
_COUNT_WORDS = frozenset(
    {"num", "n", "max", "min", "per", "first", "last", "one", "bucket", "buckets", "count"}
)
_VOCABULARY = frozenset(
    {"bos", "eos", "pad", "unk", "sep", "cls", "mask", "special", "image", "video", "audio", "start", "end",
     "stop", "think", "placeholder", "vision", "added"}
)  # fmt: skip
_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
_CONFIGURED_ENV = "OPTAGENT_API_KEY"


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)  # apiKey -> api_Key
    return [w for w in re.split(r"[^a-z0-9]+", spaced.lower()) if w]


def is_secret_name(name: str, *, variable: bool = False) -> bool:
    """True for a flag, variable or key named like a secret (`--api-key`, `HF_TOKEN`,
    `ssl_keyfile_password`), False for a counter or an ordinary flag (`--max-prefill-tokens`,
    `--speculative-num-draft-tokens`, `TOKENIZERS_PARALLELISM`, `eos_token`, `cache_key`). An
    environment `variable` in capitals needs no qualifier (`HUGGING_FACE_HUB_TOKEN`, `SOME_KEY`)."""
    words = _words(name)
    if len(words) > 1 and len(words[-1]) == 1:  # watermark_key_b
        words = words[:-1]
    if not words or any(w in _COUNT_WORDS for w in words):
        return False
    last = words[-1]
    if last in _ALWAYS or last.endswith(_ENDINGS):
        return True
    if last not in _QUALIFIED or len(words) == 1 or words[-2] in _VOCABULARY:
        return False
    return words[-2] in _QUALIFIERS or (variable and name.isupper())


_TOKEN_PREFIXES = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "hf_", "sk-", "xox")
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~+=%-]{16,}")


def looks_like_credential(userinfo: str) -> bool:
    """True for a URL's userinfo that is a token, not a user name: it starts like a known token
    (`ghp_`, `github_pat_`, `glpat-`, `hf_`, `sk-`, Slack's `xox`), or it is 16 characters or more
    with letters and digits and no other separator than `._~+=%-` (a hex or base64 token, a JWT).
    A user name is short, or words without digits (`root`, `ubuntu`, `git`, `deploy`,
    `first.last`): it says where a request goes and stays. Only URLs with a scheme are read this
    way (`redact_text`); a bare `user@host` is an SSH target, never a secret."""
    if userinfo.lower().startswith(_TOKEN_PREFIXES):
        return True
    return (
        bool(_TOKEN_CHARS.fullmatch(userinfo))
        and any(c.isdigit() for c in userinfo)
        and any(c.isalpha() for c in userinfo)
    )


def _url_token(m: re.Match[str]) -> str:
    scheme, userinfo = m.groups()
    return f"{scheme}{REDACTED}@" if looks_like_credential(userinfo) else m.group(0)


def env_secrets() -> list[str]:
    """Values of environment variables named like secrets (long enough to be real), longest first."""
    values = {v for k, v in os.environ.items() if len(v) >= 6 and is_secret_name(k, variable=True)}
    return sorted(values, key=len, reverse=True)


def _known(secrets: Iterable[str | None]) -> list[str]:
    """The given secret values, `$OPTAGENT_API_KEY` and secret-named variables' values, longest first."""
    values = {v for v in (*secrets, os.environ.get(_CONFIGURED_ENV)) if v and len(v) >= 4}
    return sorted(values | set(env_secrets()), key=len, reverse=True)


# A name ending in a secret word (checked exactly by `is_secret_name`); a value quoted, or bare up to
# a space, quote, separator or closing bracket (a bare one stops at & for URLs, at \ for unit lines).
_NAME = (
    r"(?:[A-Za-z_][\w-]*?)?(?:key|token|password|passwd|passphrase|secret|credentials?)(?:[_-][A-Za-z0-9])?"
)
_VALUE = r"\[REDACTED\]|\"[^\"]*\"|'[^']*'|[^\s\"',;)&}\]\\]+"
_FLAG = re.compile(rf"(?i)(?<![\w-])(--{_NAME})(=|[ \t]+)({_VALUE})")
_ASSIGN = re.compile(rf"(?i)(?<![\w-])([\"']?)({_NAME})(\1)([ \t]*[:=][ \t]*)({_VALUE})")
_PATTERNS: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    (re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(bearer|basic|token)\s+[^\s\"',]+"), rf"\1\2 {REDACTED}"),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {REDACTED}"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"), f"sk-{REDACTED}"),
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}"), f"hf_{REDACTED}"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"(?i)([?&](?:key|token|sig|signature|auth)=)[^\s&#\"']+"), rf"\1{REDACTED}"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]*:)[^@\s/]+@"), rf"\1{REDACTED}@"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/\s:@\[\]]+)@"), _url_token),  # a token alone
]  # fmt: skip
_EMPTY = frozenset({"none", "null", "''", '""', "[redacted]", "'[redacted]'", '"[redacted]"'})


def _quoted(value: str) -> str:
    quote = value[0] if value[:1] in ("'", '"') and len(value) > 1 else ""  # JSON and shell stay well-formed
    return f"{quote}{REDACTED}{quote}"


def _flag(m: re.Match[str]) -> str:
    name, sep, value = m.groups()
    if not is_secret_name(name) or value.startswith("-") or value.lower() in _EMPTY | _CODE_WORDS:
        return m.group(0)
    return f"{name}{sep}{_quoted(value)}"


_CODE = re.compile(r"[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+")
"""A dotted name in code (`args.api_key`, `self.server_args.api_key`), not a secret's value."""


_CODE_WORDS = frozenset(
    {"true", "false", "bool", "str", "int", "float", "bytes", "dict", "list", "any", "optional",
     "to", "and", "or", "is", "in", "of", "on", "for", "with", "the", "a", "an", "has", "was"}
)  # fmt: skip
"""Bare values that are code or prose (`secret: bool = False`, `--admin-api-key to enable`)."""


def _is_code(name: str, value: str) -> bool:
    """A bare value that is an expression in quoted code or prose (research evidence, a traceback,
    a server's message), not a secret: a word of `_CODE_WORDS`, a call, subscript or literal, a
    dotted name, the name itself or another secret's name (`ssl_key_password=ssl_keyfile_password`)."""
    return (
        value.lower() in _CODE_WORDS or value == name or any(c in value for c in "([{")
        or bool(_CODE.fullmatch(value)) or (value.isidentifier() and is_secret_name(value))
    )  # fmt: skip


def _assign(m: re.Match[str]) -> str:
    open_quote, name, close_quote, sep, value = m.groups()
    variable = sep == "=" and not open_quote and name.isupper()  # HF_TOKEN=..., an environment line
    if not is_secret_name(name, variable=variable) or value.lower() in _EMPTY:
        return m.group(0)
    if value[:1] not in ("'", '"') and not variable and _is_code(name, value):  # a variable's value never is
        return m.group(0)
    return f"{open_quote}{name}{close_quote}{sep}{_quoted(value)}"


def redact_text(text: str, *, secrets: Iterable[str | None] = ()) -> str:
    """`text` with every secret replaced by `[REDACTED]`: the given values, `$OPTAGENT_API_KEY` and
    secret-named variables' values, secret-named flags and assignments, keys, bearer tokens, URL
    passwords and a URL's token alone."""
    return _redact_text(text, _known(secrets))


def _redact_text(text: str, known: list[str]) -> str:
    for value in known:
        if value in text:
            text = text.replace(value, REDACTED)
    text = _FLAG.sub(_flag, text)
    text = _ASSIGN.sub(_assign, text)
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


def _secret_key(key: Any) -> bool:
    return isinstance(key, str) and (is_secret_name(key, variable=key.isupper()) or key.lower() in _HEADERS)


def redact(value: Any, *, secrets: Iterable[str | None] = ()) -> Any:
    """A JSON-like value (dicts, lists, strings) with every secret redacted: the values under
    secret-named keys, and every string as `redact_text` has it."""
    return _redact(value, _known(secrets))


def _redact(value: Any, known: list[str]) -> Any:
    if isinstance(value, str):
        return _redact_text(value, known)
    if isinstance(value, dict):
        return {
            k: REDACTED
            if _secret_key(k) and isinstance(v, str | int) and not isinstance(v, bool) and v not in ("", None)
            else _redact(v, known)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact(v, known) for v in value]
    return value


def redact_flags(flags: Mapping[str, str | None], *, secrets: Iterable[str | None] = ()) -> dict[str, Any]:
    """A unit's `--flag: value` mapping with secret-named flags' values replaced and any secret in
    another value (a configured key, a URL's password) redacted."""
    known = _known(secrets)
    return {
        flag: value if value is None else REDACTED if is_secret_name(flag) else _redact_text(value, known)
        for flag, value in flags.items()
    }

"""Storage URIs as text: their accepted forms, their errors, and the one way
to show one (:func:`redact`). :mod:`.backend` opens them.

Accepted forms (anything else is a ``ValueError`` naming the URI and these):

- blob: ``file:///abs/dir``, ``s3://bucket[/prefix]?endpoint=http://127.0.0.1:PORT``
  (plus ``region``, ``access_key``, ``secret_key``; credentials default to the
  ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` environment), ``memory://NAME``
- consensus: ``sqlite:///abs/path.db``, ``postgresql://user@host:port/db``
  (``postgres://`` too), ``memory://NAME``

A URI may hold secrets (a password, an S3 secret key): anything that shows a
URI to a person (a log line, an error, a summary) shows :func:`redact` of it,
and a process hands one to a child in the environment (:data:`STORE_ENV`,
:data:`BLOB_ENV`), never on its command line, which any user can read (``ps``).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

BLOB_FORMS = (
    "file:///absolute/dir",
    "s3://bucket[/prefix]?endpoint=http://127.0.0.1:PORT",
    "memory://name",
)
#: The environment variables a command (``shardsink consensus serve``) takes
#: its consensus store and blob URIs from when they are not on its command line.
STORE_ENV = "SHARDSINK_STORE"
BLOB_ENV = "SHARDSINK_BLOB"

CONSENSUS_FORMS = (
    "sqlite:///absolute/path.db",
    "postgresql://user@host:port/dbname",
    "memory://name",
)


# The password of ``scheme://user:password@host``, in a URI anywhere in a text:
# up to the last "@" before the path, since libpq ends the user part at the
# first "@" and an unencoded "@" in the password would leave its tail showing.
_USERINFO_PASSWORD = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://[^/@:\s'\"]*:)([^/\s'\"]*)@")
# A secret parameter, as a URI query parameter or a libpq ``key=value`` pair
# (whose value may be single-quoted).
_SECRET_PARAM = re.compile(
    r"(?<![\w.-])((?:ssl)?password|secret_key)(\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&#'\"]*)",
    re.IGNORECASE,
)
REDACTED = "***"


def redact(text: str, *, uri: str | None = None) -> str:
    """``text`` with every secret masked as ``***``: in each URI or libpq
    ``key=value`` string it holds, the password of ``user:password@`` and the
    values of ``password``, ``sslpassword`` and ``secret_key``. Given ``uri``,
    the secrets of ``uri`` are also masked wherever else they appear (a
    parser's message may quote a malformed one). The one way a URI, or a
    message that may quote one, is shown to anyone."""
    text = str(text)
    if uri is not None:
        secrets = {m[2] for m in _USERINFO_PASSWORD.finditer(uri)}
        secrets.update(m[3].strip("'") for m in _SECRET_PARAM.finditer(uri))
        secrets.update([unquote(secret) for secret in secrets])
        for secret in sorted(filter(None, secrets), key=len, reverse=True):
            text = text.replace(secret, REDACTED)
    text = _USERINFO_PASSWORD.sub(rf"\1{REDACTED}@", text)
    return _SECRET_PARAM.sub(rf"\1\2{REDACTED}", text)


def bad_uri(uri: str, kind: str, why: str) -> ValueError:
    """A ``ValueError`` naming the URI (redacted), the problem and the accepted forms."""
    forms = BLOB_FORMS if kind == "blob" else CONSENSUS_FORMS
    return ValueError(
        f"invalid {kind} URI {redact(uri)!r}: {why}; accepted forms: {', '.join(forms)}"
    )

"""Credentials in what the kit prints, logs or writes, masked by one function: a URL's password
(``postgresql://ann:***@host/db``) and a password, key or token given as ``name=value`` (a URL's
query ``?password=***``, a setting ``settings.api_key=***``).

A storage URL reaches a sweep's trials through the environment (``projkit.TRIAL_ENV``), never
through their config; a setting of the experiment that holds a credential is refused
(``checks.config.check_credentials``): the run's ``config.yaml`` repeats the run, so it cannot
hold a mask, and it is copied to W&B and MLflow.
"""

from __future__ import annotations

import re

MASK = "***"

# `scheme://user:password@`, or `user:password@host` without a scheme (a mistyped URL): the
# password ends at the first `@`, as SQLAlchemy and urllib read it.
USERINFO = re.compile(
    r"(?P<head>(?:\b[A-Za-z][A-Za-z0-9+.\-]*://|(?<![^\s'\"=(]))[^\s:/@'\"]*:)(?P<secret>(?!//)[^\s@'\"]+)@"
)
# `password=value` in a query or a setting: the names libpq, MySQL, SQLAlchemy, MLflow and W&B read
# credentials under (not `*_token`: a tokenizer's `pad_token=<pad>` is none). The value ends before
# `&`, a space, a quote, `,` or `;`, and before a `:` that ends it (the one after it in `key=value: ...`).
NAMED = re.compile(
    r"(?i)(?P<head>(?<![\w-])(?:password|passwd|pwd|sslpassword|secret|client_secret|token|access_token"
    r"|auth_token|api_token|api_key|apikey|wandb_api_key)=)(?P<secret>[^&\s'\",;]+?)(?=:?(?:[&\s'\",;]|$))"
)


def masked(text: str) -> str:
    """``text`` with each credential in it replaced by ``***``; the rest as it was."""
    text = USERINFO.sub(lambda match: f"{match['head']}{MASK}@", text)
    return NAMED.sub(lambda match: f"{match['head']}{MASK}", text)


def holds_credential(text: str) -> bool:
    """Whether ``text`` holds a credential that ``masked`` would hide."""
    return masked(text) != text

"""Where streaming chunks live: a local folder or an S3 prefix (``s3://bucket/prefix``), listed,
read and written through one small interface, with an object store's failures said in one line.

S3 goes through boto3, as LitData's own reads do, so both follow the same settings: credentials
from the environment or ``~/.aws``, and an S3-compatible server (MinIO, Ceph, a cluster's own) from
``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from projkit.errors import ConfigError

# What boto3 and the server say, and what the user does about it.
S3_FIXES = {
    "NoSuchBucket": "the bucket does not exist: create it, or correct the URL",
    "InvalidAccessKeyId": "the access key is not known to the server: set AWS_ACCESS_KEY_ID (or ~/.aws)",
    "SignatureDoesNotMatch": "the secret key is wrong: set AWS_SECRET_ACCESS_KEY (or ~/.aws)",
    "AccessDenied": "these credentials may not use it: ask for access, or use credentials that have it",
    "403": "these credentials may not use it: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    "404": "the bucket does not exist: create it, or correct the URL",
}
# The bucket names boto3 sends (S3's own rules are stricter; S3-compatible servers' may be looser).
BUCKET = re.compile(r"[A-Za-z0-9._-]{1,255}")


def is_remote(url: str) -> bool:
    return url.startswith("s3://")


def join(url: str, *names: str) -> str:
    return "/".join([url.rstrip("/"), *names])


@contextlib.contextmanager
def said_in_one_line(url: str, field: str) -> Iterator[None]:
    """An object store's or a disk's failure under ``url`` as one line naming it, ``field`` and the fix."""
    import botocore.exceptions

    try:
        yield
    except botocore.exceptions.ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", ""))
        fix = S3_FIXES.get(code, f"the server refused it ({code}: {error.response['Error'].get('Message')})")
        raise ConfigError(f"{field}: '{url}': {fix}.") from None
    except botocore.exceptions.NoCredentialsError:
        raise ConfigError(
            f"{field}: '{url}': no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or ~/.aws)."
        ) from None
    except botocore.exceptions.EndpointConnectionError as error:
        raise ConfigError(
            f"{field}: '{url}': cannot reach the object store ({error}): check AWS_ENDPOINT_URL and "
            "the network."
        ) from None


def url_problem(url: str) -> str | None:
    """What is wrong with ``url`` as a store's place, None if nothing: said before any file or client
    is touched, where boto3 would raise its own error or a mistyped URL would become a local folder."""
    if not url:
        return "names no place"
    if not url.isprintable():
        return "holds a character that is not printable"
    if is_remote(url):
        bucket = url[len("s3://") :].partition("/")[0]
        if not bucket:
            return "names no bucket"
        if not BUCKET.fullmatch(bucket):
            return f"names the bucket {bucket!r}, which is no bucket name (letters, digits, '.', '-', '_')"
    elif "://" in url or url.lower().startswith("s3:"):
        return "is no folder and no s3:// URL"
    return None


class Store:
    """The files directly under ``url``, a local folder or ``s3://bucket/prefix``; ``field``: the
    setting it came from (``--output``, ``data.stream_from``), which its refusals name."""

    def __init__(self, url: str, field: str) -> None:
        if problem := url_problem(url):
            raise ConfigError(f"{field}: {url!r} {problem}: give a folder or s3://BUCKET/PREFIX.")
        self.url = url.rstrip("/") or url  # "/" stays the root
        self._client: Any = None
        if is_remote(url):
            bucket, _, prefix = self.url[len("s3://") :].partition("/")
            self.bucket, self.prefix = bucket, f"{prefix}/" if prefix else ""

    def client(self) -> Any:
        """This store's S3 client, of a session of its own: the settings are read when the store is
        first used, not frozen at the process's first S3 call (boto3's default session keeps those)."""
        if self._client is None:
            import boto3

            self._client = boto3.session.Session().client("s3")
        return self._client

    def plain_http(self) -> str | None:
        """The endpoint, when S3 is reached over plain HTTP (``AWS_ENDPOINT_URL=http://...``)."""
        endpoint = str(self.client().meta.endpoint_url) if is_remote(self.url) else ""
        return endpoint if endpoint.startswith("http://") else None

    def sizes(self) -> dict[str, int]:
        """Every file under the store (its path below ``url``) and its size in bytes."""
        if not is_remote(self.url):
            root = Path(self.url)
            if not root.is_dir():
                return {}
            files = (p for p in sorted(root.rglob("*")) if p.is_file())
            return {str(p.relative_to(root)): p.stat().st_size for p in files}
        found: dict[str, int] = {}
        listing = self.client().get_paginator("list_objects_v2")
        for page in listing.paginate(Bucket=self.bucket, Prefix=self.prefix):
            for entry in page.get("Contents", []):
                found[entry["Key"][len(self.prefix) :]] = entry["Size"]
        return found

    def read(self, name: str) -> bytes:
        if not is_remote(self.url):
            return Path(self.url, name).read_bytes()
        return self.client().get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read()

    def put(self, local: Path, name: str) -> None:
        """``local``'s file as ``name`` under the store."""
        if not is_remote(self.url):
            target = Path(self.url, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, target)
            return
        self.client().upload_file(str(local), self.bucket, self.prefix + name)

"""An S3 object store for the tests of streamed data: moto's S3 server on a free port of 127.0.0.1,
in a thread of the test's process, over HTTPS (a certificate of its own authority, made for the run)
and checking every request's signature against a user it made, as a real store does.

HTTPS because LitData downloads chunks with obstore, which speaks no plain HTTP; the authority is
trusted through ``AWS_CA_BUNDLE`` (boto3) and ``SSL_CERT_FILE`` (obstore). ``environment`` holds
those, the endpoint, the user's keys, and a chunk cache under the test's folder (``LITDATA_CACHE_DIR``),
not ~/.lightning. Here, not in ``projkit.testing``: moto is no dependency of the kit.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import ssl
import threading
import urllib.request
from pathlib import Path
from typing import Any

REGION = "us-east-1"
USER = "tests"
EVERY_S3_ACTION = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}


class S3Server:
    """moto's S3 server over HTTPS on 127.0.0.1 (``start``/``stop``, or a context manager), with one
    user allowed every S3 action; its files (certificates, chunk cache) under ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.server: Any = None
        self.environment: dict[str, str] = {}

    def start(self) -> S3Server:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
        authority, certificate, key = write_certificates(self.folder)
        app = DomainDispatcherApplication(create_backend_app)
        self.server = make_server(
            "127.0.0.1", 0, app, True, request_handler=MotoRequestHandler, ssl_context=(certificate, key)
        )
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.environment = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_CA_BUNDLE": authority,
            "SSL_CERT_FILE": authority,
            "LITDATA_CACHE_DIR": str(self.folder / "litdata-cache"),
            # Nothing of the user's own ~/.aws (a profile, other keys) is read.
            "AWS_CONFIG_FILE": str(self.folder / "aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(self.folder / "aws-credentials"),
        }
        self.environment.update(self.make_user())
        return self

    def make_user(self) -> dict[str, str]:
        """A user allowed every S3 action, its keys; then signatures are checked (moto's IAM mode)."""
        iam = self.client("iam", {"AWS_ACCESS_KEY_ID": "setup", "AWS_SECRET_ACCESS_KEY": "setup"})
        iam.create_user(UserName=USER)
        iam.put_user_policy(UserName=USER, PolicyName="s3", PolicyDocument=json.dumps(EVERY_S3_ACTION))
        keys = iam.create_access_key(UserName=USER)["AccessKey"]
        request = urllib.request.Request(
            f"{self.endpoint}/moto-api/reset-auth", b"0", {"Content-Type": "text/plain"}, method="POST"
        )
        context = ssl.create_default_context(cafile=self.environment["AWS_CA_BUNDLE"])
        with urllib.request.urlopen(request, context=context) as answer:
            answer.read()
        return {"AWS_ACCESS_KEY_ID": keys["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": keys["SecretAccessKey"]}

    def client(self, service: str = "s3", keys: dict[str, str] | None = None) -> Any:
        """A boto3 client of ``service`` on this server, as its user (or with ``keys``)."""
        import boto3

        keys = keys or self.environment
        return boto3.session.Session().client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            verify=self.environment["AWS_CA_BUNDLE"],
            aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix`` of ``bucket``, by its key below the prefix."""
        client = self.client()
        found = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for entry in page.get("Contents", []):
                body = client.get_object(Bucket=bucket, Key=entry["Key"])["Body"].read()
                found[entry["Key"][len(prefix) :].lstrip("/")] = body
        return found

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_certificates(folder: Path) -> tuple[str, str, str]:
    """An authority and the server certificate (for 127.0.0.1) it signed, with the server's key,
    written under ``folder``: their paths. rustls (obstore) takes no authority as a server's own
    certificate, hence two."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    authority_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "projkit test authority")])

    def signed(subject: x509.Name, public_key: Any, authority: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=authority, path_length=None), critical=True)
        )
        if not authority:
            address = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
            builder = builder.add_extension(x509.SubjectAlternativeName([address]), critical=False)
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
        return builder.sign(authority_key, hashes.SHA256())

    server = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / name for name in ("authority.pem", "server.pem", "server-key.pem")]
    pem = serialization.Encoding.PEM
    paths[0].write_bytes(signed(issuer, authority_key.public_key(), True).public_bytes(pem))
    paths[1].write_bytes(signed(server, key.public_key(), False).public_bytes(pem))
    paths[2].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(paths[0]), str(paths[1]), str(paths[2])

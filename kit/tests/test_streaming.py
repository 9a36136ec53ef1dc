"""Streamed data (`optimize`, `data.init_args.stream_from`): tinyproj's splits written as LitData
chunks to a folder and to an S3 store (moto's server on 127.0.0.1, ``s3_server``), read back and
trained on; and what a user gets wrong (a missing bucket, wrong keys, a chunk cut short, no record,
other data under a resumed run) refused in one line that names the place and the fix, nothing lost."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from litdata import StreamingDataset

from conftest import main, seeded
from object_store import S3Server
from projkit.errors import ConfigError
from projkit.testing import TINY_FIT, config
from tinyproj.data import Blobs

CLASSIFY = ("--config", config("classify.yaml"))
QUIET = ("--trainer.enable_progress_bar=false",)
# Two short epochs, whole evaluation splits, the warm-up shorter than the run.
TWO_EPOCHS = (
    "--trainer.max_epochs=2",
    "--trainer.limit_train_batches=4",
    "--model.init_args.scheduler.init_args.warmup_steps=2",
    *QUIET,
)
EXAMPLES = int(os.environ.get("PROJ_FUZZ_EXAMPLES", "300"))


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def fit_result(*args: str) -> tuple[dict[str, float], dict[str, list]]:
    """``fit`` of tinyproj's classifier with ``args``: its test metrics and its trained weights."""
    cli = main(["fit", *CLASSIFY, *args])
    metrics = {name: float(value) for name, value in cli.trainer.callback_metrics.items()}
    return metrics, {name: value.tolist() for name, value in cli.model.state_dict().items()}


def refused(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> str:
    """``args`` as a user runs them: exit 2 and one ``error:`` line, no traceback; that line."""
    monkeypatch.delenv("PROJ_DEBUG", raising=False)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert exit_info.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def chunks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """tinyproj's data optimized twice, into two new folders."""
    root = tmp_path_factory.mktemp("chunks")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        for name in ("a", "b"):
            main(["optimize", *CLASSIFY, "--output", name])
    return root / "a", root / "b"


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The S3 store, with a bucket ``data``, and the module's environment pointing boto3 and LitData
    at it (endpoint, keys, its certificate authority, a chunk cache of the tests' own)."""
    with S3Server(tmp_path_factory.mktemp("s3")) as server, pytest.MonkeyPatch.context() as patch:
        for name, value in server.environment.items():
            patch.setenv(name, value)
        server.create_bucket("data")
        yield server


@pytest.fixture(scope="module")
def s3_chunks(s3_server, tmp_path_factory: pytest.TempPathFactory) -> str:
    """tinyproj's data optimized into the S3 store."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("s3_chunks"))
        main(["optimize", *CLASSIFY, "--output", "s3://data/classify"])
    return "s3://data/classify"


def test_optimize_writes_the_same_bytes_twice_and_records_every_file(chunks):
    first, second = files(chunks[0]), files(chunks[1])
    assert first == second, "optimize of the same data wrote other bytes"
    record = json.loads(first["streaming.json"])
    assert set(record["files"]) == set(first) - {"streaming.json"}
    for name, entry in record["files"].items():
        assert entry == {"bytes": len(first[name]), "sha256": hashlib.sha256(first[name]).hexdigest()}, name
    assert record["items"] == {"train": 224, "val": 48, "test": 48}  # Blobs' 320 samples, 70/15/15
    assert any(name.startswith("train/chunk-") for name in record["files"])


@pytest.mark.parametrize("where", ["folder", "s3"])
def test_optimize_into_a_destination_that_holds_files_is_refused(
    where, workdir, monkeypatch, capsys, request
):
    """Nothing is written over or beside what the destination holds: a folder of the user's, or the
    S3 prefix optimize wrote before."""
    if where == "s3":
        server, output = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_chunks")
        held, before = 7, server.objects("data")
    else:
        (workdir / "taken").mkdir()
        (workdir / "taken" / "notes.txt").write_text("mine")
        output, held, before = "taken", 1, {"notes.txt": b"mine"}
    line = refused(["optimize", *CLASSIFY, "--output", output], monkeypatch, capsys)
    assert f"--output: '{output}' already holds {held} file(s)" in line, line
    assert "Choose a new one, or delete that one first." in line, line
    assert (server.objects("data") if where == "s3" else files(workdir / "taken")) == before


def test_fit_streams_from_s3_as_from_a_folder(s3_server, s3_chunks, chunks, tmp_path, monkeypatch):
    """The chunks on S3 are those written locally, LitData caches them where LITDATA_CACHE_DIR says
    (not in ~/.lightning), and two epochs learn exactly what the same seed learns from the folder."""
    stored = s3_server.objects("data", "classify")
    assert stored == files(chunks[0])
    runs = []
    for source in (str(chunks[0]), s3_chunks):  # each run in a folder of its own
        (tmp_path / f"run{len(runs)}").mkdir()
        monkeypatch.chdir(tmp_path / f"run{len(runs)}")
        runs.append(fit_result(*TWO_EPOCHS, f"--data.init_args.stream_from={source}"))
    (local_metrics, local_weights), (metrics, weights) = runs
    assert metrics == local_metrics and set(metrics) == {"test/acc", "test/loss"}, (metrics, local_metrics)
    assert weights == local_weights, "trained on other batches than from the folder"
    cache = Path(s3_server.environment["LITDATA_CACHE_DIR"])
    cached = sorted(path.read_bytes() for path in cache.rglob("chunk-*.bin"))
    assert cached == sorted(content for name, content in stored.items() if "/chunk-" in name)


def test_a_training_items_random_transform_repeats_and_leaves_torchs_rng_alone(chunks):
    """tinyproj's streamed training items flipped at random (``per_item``): an item's flip is drawn
    from its own seed, a function of the run's seed, the epoch and the item, so reading the split
    again draws the same flips whatever torch's RNG holds, which they leave as it was (dropout's),
    and another epoch draws others."""
    data = Blobs(stream_from=str(chunks[0]), per_item=True)
    data.setup("fit")
    train, stored = data.splits["train"], StreamingDataset(str(chunks[0] / "train"))

    def flips() -> list[bool]:
        return [not torch.equal(train[i][0], stored[i][0]) for i in range(len(stored))]

    torch.manual_seed(1)
    state = torch.get_rng_state()
    first = flips()
    assert torch.equal(torch.get_rng_state(), state), "the flips drew from torch's RNG"
    torch.manual_seed(2)
    assert flips() == first, "the same items, the same epoch: other flips"
    assert 0.3 < sum(first) / len(first) < 0.7, "about half of the images flipped"
    train.set_epoch(2)
    assert flips() != first, "another epoch drew the same flips"


def bucket_names(server) -> set[str]:
    return {bucket["Name"] for bucket in server.client().list_buckets()["Buckets"]}


@pytest.mark.parametrize("command", ["optimize", "fit"])
def test_a_missing_bucket_is_named_with_the_fix(command, s3_server, workdir, monkeypatch, capsys):
    url = "s3://no-such-bucket/classify"
    args = ["--output", url] if command == "optimize" else [f"--data.init_args.stream_from={url}", *TINY_FIT]
    line = refused([command, *CLASSIFY, *args], monkeypatch, capsys)
    assert f"'{url}': the bucket does not exist: create it, or correct the URL." in line, line
    assert bucket_names(s3_server) == {"data"}
    assert not (workdir / "runs").exists()


@pytest.mark.parametrize(
    ("command", "variable", "fix"),
    [
        ("optimize", "AWS_SECRET_ACCESS_KEY", "the secret key is wrong: set AWS_SECRET_ACCESS_KEY"),
        ("fit", "AWS_SECRET_ACCESS_KEY", "the secret key is wrong: set AWS_SECRET_ACCESS_KEY"),
        ("fit", "AWS_ACCESS_KEY_ID", "the access key is not known to the server: set AWS_ACCESS_KEY_ID"),
    ],
)
def test_wrong_keys_are_named_with_the_fix(
    command, variable, fix, s3_server, s3_chunks, workdir, monkeypatch, capsys
):
    """The server checks signatures: a wrong secret or an unknown key is refused, and said so."""
    before = s3_server.objects("data")
    monkeypatch.setenv(variable, "AKIAWRONGWRONGWRONG1" if variable.endswith("ID") else "wrong-secret")
    url = "s3://data/other" if command == "optimize" else s3_chunks
    args = ["--output", url] if command == "optimize" else [f"--data.init_args.stream_from={url}", *TINY_FIT]
    line = refused([command, *CLASSIFY, *args], monkeypatch, capsys)
    assert f"'{url}': {fix}" in line, line
    assert s3_server.objects("data") == before
    assert not (workdir / "runs").exists()


def cut_short(folder: Path) -> str:
    """``folder``'s training chunk, less its last 10 bytes: its name below the folder."""
    chunk = next((folder / "train").glob("chunk-*.bin"))
    chunk.write_bytes(chunk.read_bytes()[:-10])
    return str(chunk.relative_to(folder))


@pytest.mark.parametrize("where", ["folder", "s3"])
def test_a_chunk_cut_short_is_named_with_the_fix(where, chunks, s3_server, workdir, monkeypatch, capsys):
    shutil.copytree(chunks[0], workdir / "short")
    name = cut_short(workdir / "short")
    url = str(workdir / "short")
    if where == "s3":
        url, client = "s3://data/short", s3_server.client()
        for path, content in files(workdir / "short").items():
            client.put_object(Bucket="data", Key=f"short/{path}", Body=content)
    before = s3_server.objects("data", "short") if where == "s3" else files(workdir / "short")
    line = refused(["fit", *CLASSIFY, f"--data.init_args.stream_from={url}", *TINY_FIT], monkeypatch, capsys)
    assert f"'{url}/{name}' is " in line and "bytes of" in line, line
    assert "cut short or changed. Write the data again with optimize" in line, line
    after = s3_server.objects("data", "short") if where == "s3" else files(workdir / "short")
    assert after == before and not (workdir / "runs").exists()


def test_a_folder_without_the_record_is_named_with_the_fix(chunks, workdir, monkeypatch, capsys):
    shutil.copytree(chunks[0], workdir / "partial", ignore=shutil.ignore_patterns("streaming.json"))
    line = refused(["fit", *CLASSIFY, "--data.init_args.stream_from=partial", *TINY_FIT], monkeypatch, capsys)
    assert "data.stream_from: 'partial' holds no streaming.json" in line, line
    assert "optimize --config <experiment>.yaml --output partial" in line, line


def test_a_plain_http_endpoint_is_refused_before_loading(s3_server, s3_chunks, workdir, monkeypatch, capsys):
    """LitData downloads chunks with obstore, which takes no http:// endpoint: said before training,
    not as a download thread's traceback."""
    plain = s3_server.endpoint.replace("https://", "http://")
    monkeypatch.setenv("AWS_ENDPOINT_URL", plain)
    args = ["fit", *CLASSIFY, f"--data.init_args.stream_from={s3_chunks}", *TINY_FIT]
    line = refused(args, monkeypatch, capsys)
    assert f"'{s3_chunks}' is reached over plain HTTP ({plain}, AWS_ENDPOINT_URL)" in line, line
    assert "serve the store over HTTPS" in line and not (workdir / "runs").exists()


def test_a_resume_on_other_data_at_the_same_place_is_refused(chunks, workdir, monkeypatch, capsys):
    shutil.copytree(chunks[0], workdir / "data")
    stream = "--data.init_args.stream_from=data"
    main(["fit", *CLASSIFY, stream, *TINY_FIT, "--test_after_fit=false"])
    ckpts = {p: p.read_bytes() for p in workdir.rglob("*.ckpt")}
    assert ckpts
    shutil.rmtree(workdir / "data")
    main(["optimize", *CLASSIFY, "--output", "data", "--data.init_args.split_seed=7"])
    args = ["fit", *CLASSIFY, stream, *TINY_FIT, "--trainer.max_epochs=2", "--ckpt_path=last"]
    line = refused(args, monkeypatch, capsys)
    assert "--ckpt_path: the checkpoint was trained on other data than 'data' holds now" in line, line
    assert "resume with the data it was trained on, or start a new run" in line, line
    assert {p: p.read_bytes() for p in workdir.rglob("*.ckpt")} == ckpts


# LitData's traceback, and a size LitData takes but no chunk can have; the fuzzer below tries the rest.
@pytest.mark.parametrize("value", ["64XB", "-5MB"])
def test_a_chunk_size_litdata_cannot_take_is_refused_before_anything_is_written(
    value, workdir, monkeypatch, capsys
):
    line = refused(["optimize", *CLASSIFY, "--output", "out", f"--chunk_bytes={value}"], monkeypatch, capsys)
    assert line.startswith(f"error: --chunk_bytes: {value!r} ") and "(e.g. 64MB)" in line, line
    assert list(workdir.iterdir()) == []


def litdata_reads(value: str) -> int | None:
    """The chunk size LitData's writer takes ``value`` for, None where it refuses it."""
    from litdata.streaming.writer import BinaryWriter

    try:
        return BinaryWriter(os.devnull, chunk_bytes=value).get_config()["chunk_bytes"]
    except Exception:  # LitData's refusal, whatever its kind
        return None


# Numbers with LitData's units and others, spaces, signs, exponents: the forms its reading turns on.
SIZES = st.from_regex(
    r"\s?[-+]?[0-9_]{0,4}\.?[0-9]{0,2}(e-?[0-9])?\s?([KMGT]?B?|[kmgt]b?|X[Bb])?\s?", fullmatch=True
)


@seeded(EXAMPLES)
@given(value=st.one_of(st.text(max_size=12), SIZES, st.integers(-3, 10**12).map(str)))
@example("abc")
@example("0")
@example("-5MB")
@example("64XB")
@example("1e3")
@example("1000")
@example("infmb")
def test_fuzz_chunk_bytes_is_what_litdata_takes_or_one_line_naming_it(value):
    """Any ``--chunk_bytes``: a positive size LitData's writer takes as that size (a whole number of
    bytes, LitData's int form, else as LitData reads a unit), or one line naming the flag."""
    from projkit.data.streaming import chunk_size

    try:
        size = chunk_size(value)
    except ConfigError as error:
        assert str(error).startswith("--chunk_bytes: ") and "\n" not in str(error), str(error)
        plain = value.strip().isascii() and value.strip().isdigit()
        assert int(value) <= 0 if plain else (litdata_reads(value) or 0) <= 0, value
        return
    assert size > 0 and litdata_reads(size) == size, value
    if not (value.strip().isascii() and value.strip().isdigit()):
        assert litdata_reads(value) == size, value


# The fuzzer below tries the kind; these, that the refusal reaches the user from either field. (An
# empty stream_from is a data module's "not streamed"; an empty --output would be the working folder.)
@pytest.mark.parametrize(
    ("command", "url"), [("optimize", "s3:/x"), ("optimize", ""), ("fit", "s3:///prefix")]
)
def test_a_malformed_store_url_is_refused_naming_its_field(command, url, workdir, monkeypatch, capsys):
    if command == "optimize":
        field, args = "--output", ["--output", url]
    else:
        field, args = "data.stream_from", [f"--data.init_args.stream_from={url}", *TINY_FIT]
    line = refused([command, *CLASSIFY, *args], monkeypatch, capsys)
    assert line.startswith(f"error: {field}: {url!r} "), line
    assert "s3://BUCKET/PREFIX" in line, line
    assert list(workdir.iterdir()) == []


URLS = st.one_of(
    st.text(max_size=16),
    st.from_regex(r"[sS]3:?/{0,4}[a-zA-Z0-9._ :/-]{0,8}(/[^/]{0,4}){0,2}", fullmatch=True),
)


@seeded(EXAMPLES)
@given(url=URLS, field=st.sampled_from(["--output", "data.stream_from"]))
@example("s3://", "--output")
@example("s3:///prefix", "data.stream_from")
@example("s3:/x", "--output")
@example("", "data.stream_from")
@example("s3://a b/x", "--output")
@example("s3://bucket/prefix", "--output")
def test_fuzz_a_store_url_is_one_the_client_takes_or_one_line_naming_its_field(url, field):
    """No network: a URL is refused when the store is made, before any client exists; one it takes
    is a bucket boto3 sends (no ParamValidationError) or a plain path (not a mistyped URL)."""
    from botocore.handlers import validate_bucket_name

    from projkit.data.stores import Store

    try:
        store = Store(url, field)
    except ConfigError as error:
        assert str(error).startswith(f"{field}: ") and "\n" not in str(error), str(error)
        return
    if url.startswith("s3://"):
        validate_bucket_name({"Bucket": store.bucket})
    else:
        assert url and url.isprintable() and "://" not in url and not url.lower().startswith("s3:"), url

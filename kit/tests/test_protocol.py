"""What the kit asks of a project's classes (projkit.protocol) is listed where an owner reads it, and a
command that needs a member the owner's class lacks refuses in one line, naming the class, the member
and the page, rather than answering differently from the owner's own code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import KIT, main
from projkit.protocol import PROTOCOL
from projkit.testing import TINY_FIT, config
from tinyproj.data import Blobs

CLASSIFY = ("--config", config("classify.yaml"))


class NoPreprocessing(Blobs):
    """Blobs as an image data module written before the kit asked for ``preprocessing`` (kit 1.0.0)."""

    preprocessing = None


def test_every_member_the_kit_reads_is_listed_in_its_readme():
    text = (KIT / "README.md").read_text()
    section = text.split("## What a project provides", 1)[1].split("\n## ", 1)[0]
    missing = [m.name for m in PROTOCOL if f"`{m.name}" not in section]
    assert not missing, f"kit/README.md's 'What a project provides' does not list {missing}"
    for member in PROTOCOL:
        page, _, heading = member.page.partition(", ")
        assert (KIT.parent / page).is_file(), f"{member.name}: its page {page} does not exist"
        if heading:
            headings = re.findall(r"(?m)^#+ (.+)$", (KIT.parent / page).read_text())
            assert heading.strip("'") in headings, f"{member.name}: {page} has no heading {heading}"


@pytest.mark.slow
def test_export_of_an_image_model_whose_data_states_no_preprocessing_is_refused(workdir, capsys, monkeypatch):
    monkeypatch.delenv("PROJ_DEBUG")  # what a user sees
    fitted = main(["fit", *CLASSIFY, *TINY_FIT, "--test_after_fit=false"])
    ckpt = Path(fitted.trainer.checkpoint_callbacks[-1].dirpath) / "last.ckpt"
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        main(["export", *CLASSIFY, f"--data.class_path={__name__}.NoPreprocessing", f"--ckpt_path={ckpt}"])
    assert ended.value.code == 2
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(said) == 1, said
    assert re.search(rf"data class {__name__}\.NoPreprocessing has no `preprocessing`", said[0]), said
    assert "kit/docs/export.md" in said[0]
    assert not (ckpt.parent.parent / "export").exists(), "nothing is written for a refused export"

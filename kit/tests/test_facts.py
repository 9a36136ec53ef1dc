"""A fact a data module reads from its files comes from the command's checkpoint once the files are
gone, and only then: without a checkpoint the data's own refusal stands."""

import pytest

from projkit.data.facts import checkpoint_fact, file_fact, use_checkpoint_facts
from projkit.errors import ConfigError


class Folder:
    def __init__(self, classes: tuple[str, ...] | None) -> None:
        self.found = classes

    @file_fact
    def classes(self) -> tuple[str, ...]:
        if self.found is None:
            raise FileNotFoundError("data.root: no folder at 'gone'")
        return self.found

    @file_fact
    def input_shape(self) -> tuple[int, int, int]:
        raise ConfigError("data.root: fewer than two classes")


@pytest.fixture(autouse=True)
def no_checkpoint():
    yield
    use_checkpoint_facts(None)


def test_the_files_give_the_fact_while_they_are_there():
    use_checkpoint_facts({"hyper_parameters": {"classes": ["a", "b"]}})
    assert Folder(("x", "y")).classes == ("x", "y")


def test_files_gone_the_checkpoint_gives_the_model_s_and_the_network_s_facts():
    net = {"class_path": "tinyproj.MLP", "init_args": {"input_shape": [1, 8, 8], "num_classes": 2}}
    use_checkpoint_facts({"hyper_parameters": {"classes": ["a", "b"], "net": net}})
    assert Folder(None).classes == ("a", "b")
    assert Folder(None).input_shape == (1, 8, 8)


def test_without_a_checkpoint_or_its_fact_the_data_s_refusal_stands():
    use_checkpoint_facts(None)
    with pytest.raises(FileNotFoundError, match=r"data\.root: no folder"):
        _ = Folder(None).classes
    use_checkpoint_facts({"hyper_parameters": {"num_classes": 2}})
    with pytest.raises(ConfigError, match="fewer than two"):
        _ = Folder(None).input_shape


def test_checkpoint_fact_is_the_checkpoint_s_own_for_a_data_module_that_would_download():
    """What a data module that fetches its files asks before fetching: the checkpoint's fact (a list
    as a tuple, as the data module gives it), None without a checkpoint or that fact."""
    use_checkpoint_facts(None)
    assert checkpoint_fact("vocab") is None
    use_checkpoint_facts({"hyper_parameters": {"vocab": "ab", "classes": ["x", "y"]}})
    assert checkpoint_fact("vocab") == "ab" and checkpoint_fact("classes") == ("x", "y")
    assert checkpoint_fact("input_shape") is None

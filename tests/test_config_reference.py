"""docs/config.md, the config reference generated from the config classes
(``jaxdrive.runs.reference``), cannot drift: it equals the generator's output, lists
exactly the keys a config accepts, and every key has a description."""

import dataclasses
import os

import pytest

from jaxdrive.config import ConfigBase
from jaxdrive.runs import reference
from jaxdrive.runs.config import LR_SCHEDULES, RunConfig

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                   "config.md")


def _leaf_keys(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _leaf_keys(v, f"{prefix}{k}.")
        else:
            out.add(f"{prefix}{k}")
    return out


def test_docs_config_md_is_the_generators_output():
    with open(DOC, encoding="utf-8") as f:
        on_disk = f.read()
    assert on_disk == reference.markdown(), (
        "docs/config.md is out of date: run python -m jaxdrive.runs.reference docs/config.md")


def test_the_reference_lists_exactly_the_keys_a_config_holds_and_documents_each():
    keys = reference.keys()
    names = [k.name for k in keys]
    assert len(names) == len(set(names))
    # ConfigBase's to_dict: RunConfig's own leaves an empty population section out.
    assert set(names) == _leaf_keys(ConfigBase.to_dict(RunConfig()))
    undocumented = [k.name for k in keys if not k.doc]
    assert undocumented == [], f"add an Attributes: entry to the config class: {undocumented}"


def test_takes_is_what_the_checks_enforce():
    by_name = {k.name: k for k in reference.keys()}
    assert by_name["train.lr_schedule"].takes == ", ".join(f"`{s}`" for s in LR_SCHEDULES)
    assert by_name["checkpoint.keep_last"].takes == "integer in [1, 1000]"
    assert by_name["checkpoint.every"].takes == "integer >= 0"
    assert by_name["evaluation.subprocess_memory_fraction"].takes == "number in (0, 1]"
    assert by_name["train.num_envs"].default == "64"


@dataclasses.dataclass(frozen=True)
class _Example(ConfigBase):
    """An example.

    Attributes:
      alpha: the first
        line and its continuation.
      beta, gamma: shared.

    Args:
      nothing: not an attribute.
    """

    alpha: int = 1
    beta: float = 0.5
    gamma: str = "x"


@pytest.mark.parametrize("cls, want", [
    (_Example, {"alpha": "the first line and its continuation.", "beta": "shared.",
                "gamma": "shared."}),
])
def test_attribute_docs_are_read_from_the_docstring(cls, want):
    assert reference.attribute_docs(cls) == want


def test_the_command_writes_the_file_or_refuses_a_directory(tmp_path, capsys):
    out = tmp_path / "config.md"
    assert reference.main([str(out)]) == 0
    assert out.read_text(encoding="utf-8") == reference.markdown()
    assert reference.main([str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err

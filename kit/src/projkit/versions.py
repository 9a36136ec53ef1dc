"""The libraries whose internals the kit reaches into (``projkit.internals``), held to the ranges the
kit declares: a version outside one is refused when a command starts, before it is imported, in one
line naming the range and the fix, rather than failing later on a name that moved."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, requires, version

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

# The distributions held to their range: those the kit's seams use privately, and the serving stack,
# whose server the kit drives (its socket handed over, its exit and drain).
HELD = ("lightning", "jsonargparse", "torchmetrics", "uvicorn", "starlette")


def declared_ranges() -> dict[str, Requirement]:
    """The kit's requirement on each held distribution, as its installed metadata declares it."""
    try:
        listed = requires("projkit") or []
    except PackageNotFoundError:  # the kit's source on the path, not installed: no range is declared
        return {}
    found = {}
    for line in listed:
        requirement = Requirement(line)
        if requirement.name in HELD and (requirement.marker is None or requirement.marker.evaluate()):
            found[requirement.name] = requirement
    return found


def shown(requirement: Requirement) -> str:
    """``name>=low,<high``: the range as a pyproject.toml writes it, its floor first."""
    parts = sorted(map(str, requirement.specifier), key=lambda part: not part.startswith(">"))
    return requirement.name + ",".join(parts)


def unsupported() -> str | None:
    """The refusal for the first held distribution installed outside the kit's range, or None."""
    for name, requirement in declared_ranges().items():
        try:
            installed = version(name)
            ok = Version(installed) in requirement.specifier
        except PackageNotFoundError:
            installed, ok = "not installed", False
        except InvalidVersion:
            ok = False
        if not ok:
            kit = version("projkit")
            return (
                f"error: {name} {installed} is installed, but projkit {kit} supports {shown(requirement)}: "
                "run `make install` for the versions uv.lock names, or "
                f"`make upgrade-kit` for a kit that supports {name} {installed}."
            )
    return None


def check_supported_versions() -> None:
    """Refuse (exit 2) a command whose environment holds a distribution outside the kit's range."""
    refusal = unsupported()
    if refusal:
        print(refusal, file=sys.stderr)
        raise SystemExit(2)

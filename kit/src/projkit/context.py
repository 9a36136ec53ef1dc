"""The project this process runs commands for, set once by its package (``Project.run`` or
``Project.main``) and read by every part of the kit that names it: ``current().command`` in messages,
``current().defaults`` for the CLI, ``current().package`` for a sweep's trials. Imports nothing, so
that every module may import it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from projkit.project import Project

_current: Project | None = None


def use(project: Project) -> None:
    """Make ``project`` the one this process's commands run for."""
    global _current
    _current = project


def current() -> Project:
    """The project this process runs commands for (``Project.run`` or ``Project.main`` set it)."""
    if _current is None:
        raise RuntimeError(
            "No project is set: start commands through the project's package (`python -m <package>`, "
            "or `<package>.main([...])` in Python), which hands the kit its defaults."
        )
    return _current

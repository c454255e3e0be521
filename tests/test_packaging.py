"""hwgen installs like a real package: a wheel carries the templates, the board files and the
cocotb testbenches inside ``hwgen/`` (no top-level ``sim``), and an installed copy outside the
checkout finds them.

The wheel is built from a copy of the sources (so the checkout's ``build/`` and egg-info are left
alone) without build isolation (no index needed), installed with ``pip --target`` into a
temporary directory and imported from there by a Python started with ``-S`` and an explicit
``PYTHONPATH`` (that directory, then the venv's site-packages for the dependencies): ``-S`` skips
the ``.pth`` files, so the editable install's finder of ``make setup`` cannot serve the checkout.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "hwgen", "rtl_templates", "boards", "sim")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("setuptools") is None,
    reason="needs setuptools in the venv to build a wheel without build isolation")

CHECK = r"""
import importlib.util, json, sys
import hwgen, hwgen.boards, hwgen.flow.package, hwgen.flow.tools
board = hwgen.boards.load_board("u280")
clock = {"mhz": board.kernel_clock_mhz, "period_ns": "3.333"}
xdc = hwgen.flow.package.render("ooc.xdc.j2", top="demo_top", clock=clock, board=board)
print(json.dumps({
    "hwgen": hwgen.__file__,
    "boards_dir": str(hwgen.boards.BOARDS_DIR),
    "board_path": str(board.path),
    "board_names": hwgen.boards.board_names(),
    "templates_dir": str(hwgen.flow.package.TEMPLATES_DIR),
    "xdc": xdc,
    "testbenches": [importlib.util.find_spec("hwgen.sim." + m).origin
                    for m in ("stream_tb", "kernel_tb", "cluster_tb")],
    "top_level_sim": importlib.util.find_spec("sim") is not None,
    "checkout": str(hwgen.flow.tools.checkout_root()),
    "finders": [repr(f) for f in sys.meta_path],
}))
"""

#: The test's interpreter, absolute: the subprocesses run in other folders.
PYTHON = os.path.abspath(sys.executable)


def _pip(*args, cwd, quiet="-q"):
    return subprocess.run([PYTHON, "-m", "pip", "--disable-pip-version-check", quiet, *args],
                          cwd=cwd, check=True, capture_output=True, text=True)


def test_wheel_carries_data_and_installs_outside_checkout(tmp_path):
    src = tmp_path / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=IGNORE)
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    built = _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index",
                 "-w", str(tmp_path / "dist"), str(src), cwd=tmp_path, quiet="-v")
    # setuptools warns of each data folder it would treat as an undeclared package, and of a
    # deprecated license table: the build says neither
    said = built.stdout + built.stderr
    assert "would be ignored" not in said and "absent from the `packages`" not in said, said
    assert "project.license` as a TOML table is deprecated" not in said
    (wheel,) = (tmp_path / "dist").glob("hwgen-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"hwgen"}, tops
    # Every module and data file of the hwgen sources (a subpackage missing from the explicit
    # list in pyproject.toml would be dropped here), and the three mapped folders.
    expected = {p.relative_to(ROOT).as_posix() for p in (ROOT / "hwgen").rglob("*")
                if p.suffix in (".py", ".json", ".npz") and "__pycache__" not in p.parts}
    expected |= {f"hwgen/rtl_templates/{p.name}" for p in (ROOT / "rtl_templates").glob("*.j2")}
    expected |= {f"hwgen/board_files/{p.name}" for p in (ROOT / "boards").glob("*.toml")}
    expected |= {"hwgen/board_files/README.md", "hwgen/sim/__init__.py",
                 "hwgen/sim/stream_tb.py", "hwgen/sim/kernel_tb.py", "hwgen/sim/cluster_tb.py"}
    expected |= {f"hwgen/sim/models/{p.name}" for p in (ROOT / "sim" / "models").glob("*.v")}
    assert len(expected) > 20
    assert not expected - names, sorted(expected - names)

    site = tmp_path / "site"
    _pip("install", "--no-deps", "--no-index", "--target", str(site), str(wheel), cwd=tmp_path)
    assert not (site / "sim").exists()
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), *deps]),
               HWGEN_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([PYTHON, "-S", "-c", CHECK], cwd="/", env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)

    site = site.resolve()
    for key in ("hwgen", "boards_dir", "board_path", "templates_dir"):
        assert Path(got[key]).resolve().is_relative_to(site), (key, got[key])
    assert all(Path(tb).resolve().is_relative_to(site) for tb in got["testbenches"])
    assert not any("Editable" in f for f in got["finders"]), got["finders"]
    assert "u280" in got["board_names"]
    assert Path(got["board_path"]).name == "u280.toml"
    assert "create_clock -period 3.333 -name ap_clk" in got["xdc"]
    assert "demo_top" in got["xdc"]
    assert not got["top_level_sim"]
    assert got["checkout"] == "None"

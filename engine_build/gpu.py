"""Is there an NVIDIA GPU here? The one answer used by the build stages and the server launcher."""

from __future__ import annotations

import shutil
import subprocess


def gpu_available() -> bool:
    """An NVIDIA GPU this process can see: `nvidia-smi -L` lists one (torch is not imported for this:
    the container's torch may initialise CUDA, and the CPU venv's cannot answer)."""
    if shutil.which("nvidia-smi") is None:
        return False
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return listing.returncode == 0 and "GPU" in listing.stdout

"""The 26.07 container, rehearsed: the README's container commands, run as written, in a reproduction of the image's
layout on this machine (`make rehearse`; `make test` runs it).

What is reproduced (docs/container.md says what is not), inside a private mount namespace, so nothing on the host
changes but the empty mount points /work and /models:
- /opt/tritonserver/{bin,backends,include}: this machine's Triton 2.51 (the nvidia-pytriton wheel's server and Python
  backend), `tritonserver` on PATH, and Triton's headers where the image has them;
- python3 on PATH is a venv's, /opt/venv-tritonserver (the image's Python is a venv too), made from the distribution's
  python3 and holding what the image's holds for our models (engine_build/container_python.py; TensorRT-LLM and
  CUDA aside: IMAGE_PACKAGES);
- no `g++` (every name of it resolves to an empty, non-executable file), `clang++` there;
- the checkout at /work, a copy of this one's tracked and unignored files (`-v $PWD:/work`);
- the commands run in a network namespace of their own (loopback only: the README's ports 8000-8002 are free) with
  pip told there is no index, and the host's LD_LIBRARY_PATH already set, as the NVIDIA runtime sets it.

The README's container block is read from README.md; its `make` lines run in order, each as written, but the GPU
build (`make repo ENGINE=trtllm` without DRY_RUN), which needs TensorRT-LLM: in its place the embedded repository
this checkout built (`make repo`) is copied to build/model_repository, as a built repository is copied anywhere.
`make serve-only` runs in the background and `make test SERVER_URL=...` from "a second shell"; the test clients'
venv is made beforehand with the index, by the Makefile's own rule (its first run needs PyPI: docs/container.md).

    python -m tools.container_rehearsal            # as root; the whole rehearsal, exit 0 when every step did
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bls.contract import BLS_MODEL

PROJECT = Path(__file__).resolve().parents[1]
STAGE = PROJECT / "build" / "rehearsal"
README = PROJECT / "README.md"
# The image's Python packages our models and make targets import (engine_build/container_python.py has each one's
# build source): the versions its TensorRT-LLM 1.2.1 pins where the index has them; torch is this machine's CPU build.
# pyyaml: the image's (a tensorrt_llm requirement; its version there was not read), at this project's pin.
IMAGE_PACKAGES = ("numpy==1.26.4", "torch==2.13.0", "transformers==4.57.3", "tokenizers==0.22.1", "safetensors==0.7.0",
                  "huggingface_hub==0.36.2", "xgrammar==0.1.32", "jinja2==3.1.6", "protobuf==6.33.5",
                  "nvidia-modelopt[torch]==0.37.0", "accelerate==1.11.0", "requests==2.32.5", "pyyaml==6.0.4")
# What the NVIDIA container runtime and the image put on LD_LIBRARY_PATH before our launcher runs.
HOST_LD_LIBRARY_PATH = "/usr/local/nvidia/lib:/usr/local/nvidia/lib64:/usr/local/cuda/compat/lib"
IMAGE_PATH = ("/opt/venv-tritonserver/bin:/opt/tritonserver/bin:"
              "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
HF_MODEL = "/models/Meta-Llama-3-8B-Instruct"
# Meta-Llama-3-8B-Instruct's config.json (its shape is what the dry run plans for); the tokenizer is ours.
LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "hidden_act": "silu",
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128009,
}


def log(message: str) -> None:
    print(f"[rehearsal {time.strftime('%H:%M:%S')}] {message}", flush=True)


def readme_commands(readme: Path = README) -> list[str]:
    """The `make` lines of the README's container block (the fenced block that starts the 26.07 image), comments
    stripped."""
    blocks = re.findall(r"```bash\n(.*?)```", readme.read_text(), flags=re.S)
    container = [block for block in blocks if "26.07-trtllm-python-py3" in block]
    if len(container) != 1:
        raise SystemExit(f"{readme}: expected one bash block that runs the 26.07 image, found {len(container)}")
    lines = [line.split("#", 1)[0].rstrip() for line in container[0].splitlines()]
    commands = []
    for line in filter(str.strip, lines):
        if line.startswith("make ") and not line.endswith("\\"):
            commands.append(line.strip())
        elif not (line.startswith(("docker run ", "    nvcr.io/")) or line == "cd /work"):
            raise SystemExit(f"{readme}: the container block's line {line!r} is none the rehearsal runs (a one-line "
                             "`make` command) or stands in for (docker run, cd /work): extend the rehearsal first")
    return commands


def is_gpu_build(command: str) -> bool:
    words = shlex.split(command)
    return words[:2] == ["make", "repo"] and "ENGINE=trtllm" in words and not any(
        word.startswith("DRY_RUN=") for word in words)


# ---- on the host: stage, then enter the namespaces -------------------------------------------------------------
def stage_checkout(clone: Path) -> None:
    """This checkout's tracked and unignored files, as they are in the work tree (a clean clone of what is here)."""
    if clone.exists():
        shutil.rmtree(clone)
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=PROJECT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = PROJECT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name, follow_symlinks=False)


def stage_tritonserver(root: Path, wheel_site: Path, python_version: str) -> None:
    """/opt/tritonserver as the image lays it out, pointing into the wheel (mounted at wheel/ by the namespace
    script; relative links, so the binary's $ORIGIN finds the wheel's libraries)."""
    from serving.tritonserver import STUB_NAME

    if root.exists():
        shutil.rmtree(root)
    (root / "bin").mkdir(parents=True)
    (root / "wheel" / "pytriton").mkdir(parents=True)
    (root / "wheel" / "nvidia_pytriton.libs").mkdir()
    (root / "bin" / "tritonserver").symlink_to("../wheel/pytriton/tritonserver/bin/tritonserver")
    # The wheel's Python backend. TensorRT-LLM's C++ backend cannot be reproduced: its folder holds only empty
    # stand-ins of what check-repo looks for there (the folder, trtllmExecutorWorker); what needs it is checked, never
    # served.
    (root / "backends" / "python").mkdir(parents=True)
    wheel_python = Path("../../wheel/pytriton/tritonserver")
    for entry in (wheel_site / "pytriton" / "tritonserver" / "backends" / "python").iterdir():
        if entry.name != STUB_NAME:
            (root / "backends" / "python" / entry.name).symlink_to(wheel_python / "backends" / "python" / entry.name)
    # the stub built for the image's Python version (the wheel ships one per version), not the host venv's
    (root / "backends" / "python" / STUB_NAME).symlink_to(
        wheel_python / "python_backend_stubs" / python_version / STUB_NAME)
    (root / "backends" / "tensorrtllm").mkdir()
    (root / "backends" / "tensorrtllm" / "trtllmExecutorWorker").write_text("")
    shutil.copytree(PROJECT / "relay" / "include", root / "include")


def stage_model(model: Path) -> None:
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG, indent=2))
    for file in (PROJECT / "build" / "assets" / "tokenizer").iterdir():
        shutil.copy2(file, model / file.name)


def gpp_paths() -> list[str]:
    """Every file a g++ name resolves to (c++ and the triplet names share it)."""
    names = ("g++", "c++", "x86_64-linux-gnu-g++", "aarch64-linux-gnu-g++")
    return sorted({os.path.realpath(found) for name in names if (found := shutil.which(name))})


def namespace_script(wheel_site: Path, image_python: str) -> str:
    """Run inside `unshare --mount`: the image's filesystem, then the commands in a network namespace."""
    host_opt, venv, triton = STAGE / "host-opt", STAGE / "venv-tritonserver", STAGE / "opt-tritonserver"

    def q(path) -> str:
        return shlex.quote(str(path))

    hide_gpp = "\n".join(f"mount --bind /dev/null {q(path)}" for path in gpp_paths())
    packages = " ".join(shlex.quote(p) for p in IMAGE_PACKAGES)
    return f"""set -euo pipefail
mount --make-rprivate /
# /opt: the host's entries, plus the image's two
mount --rbind /opt {q(host_opt)}
mount -t tmpfs tmpfs /opt
for entry in {q(host_opt)}/*; do [ -d "$entry" ] || continue; mkdir /opt/"$(basename "$entry")"; \
mount --rbind "$entry" /opt/"$(basename "$entry")"; done
mkdir -p /opt/venv-tritonserver /opt/tritonserver
mount --bind {q(venv)} /opt/venv-tritonserver
mount --bind {q(triton)} /opt/tritonserver
mount --bind {q(wheel_site / "pytriton")} /opt/tritonserver/wheel/pytriton
mount --bind {q(wheel_site / "nvidia_pytriton.libs")} /opt/tritonserver/wheel/nvidia_pytriton.libs
if [ ! -f /opt/venv-tritonserver/.image-packages ] || \
   [ "$(cat /opt/venv-tritonserver/.image-packages)" != {shlex.quote(packages)} ]; then
  echo "[rehearsal] the image's Python: {image_python} -m venv /opt/venv-tritonserver + {packages}"
  rm -rf /opt/venv-tritonserver/* /opt/venv-tritonserver/.image-packages
  {q(image_python)} -m venv /opt/venv-tritonserver
  /opt/venv-tritonserver/bin/pip install -q {packages}
  echo {shlex.quote(packages)} > /opt/venv-tritonserver/.image-packages
fi
# no g++; clang++ stays
{hide_gpp}
# -v $PWD:/work and -v /models:/models
mount --bind {q(STAGE / "models")} /models
# last, as they may hide this checkout, the source of every mount above: /work, and the container's own /tmp
mount --bind {q(STAGE / "clone")} /work
mount -t tmpfs tmpfs /tmp
cd /work
export PATH={IMAGE_PATH} HOME=/root
# the test clients' venv, with the index (its first run needs one), by the Makefile's own rule
make --no-print-directory build/venv-test/.installed
# a network namespace (loopback only) and a PID namespace: every process of the commands ends with the rehearsal
exec unshare --net --pid --fork --kill-child --mount-proc -- /opt/venv-tritonserver/bin/python3 \
    -m tools.container_rehearsal --inside
"""


def rehearse() -> int:
    if os.geteuid() != 0:
        raise SystemExit("the rehearsal needs root (mount and network namespaces); `make test REHEARSAL=0` skips it")
    repo = PROJECT / "build" / "model_repository"
    if not (repo / "ensemble").is_dir():
        raise SystemExit(f"{repo}: build the embedded repository first (`make repo`)")
    if shutil.which("clang++") is None:
        raise SystemExit("the rehearsal needs clang++, as the image has it (`make system-packages` installs clang)")
    image_python = shutil.which("python3", path="/usr/bin")
    if image_python is None:
        raise SystemExit("the rehearsal makes the image's venv from the distribution's /usr/bin/python3: not found")
    from serving.tritonserver import _wheel_root

    wheel_site = _wheel_root().parents[1]  # site-packages: pytriton/ and nvidia_pytriton.libs/
    for folder in ("host-opt", "venv-tritonserver", "models"):
        (STAGE / folder).mkdir(parents=True, exist_ok=True)
    log("staging: the checkout, /opt/tritonserver, the HF config of Llama 3 8B")
    stage_checkout(STAGE / "clone")
    shutil.copytree(repo, STAGE / "clone" / "build" / "model_repository_embedded", symlinks=True)
    python_version = subprocess.run([image_python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                    check=True, capture_output=True, text=True).stdout.strip()
    stage_tritonserver(STAGE / "opt-tritonserver", wheel_site, python_version)
    stage_model(STAGE / "models" / Path(HF_MODEL).name)
    for mount_point in ("/work", "/models"):  # of -v $PWD:/work and -v /models:/models; left in place (empty), since
        Path(mount_point).mkdir(exist_ok=True)  # a concurrent rehearsal may be using it
    return subprocess.call(["unshare", "--mount", "--propagation", "private", "--", "bash", "-c",
                            namespace_script(wheel_site, image_python)])


# ---- inside the image ------------------------------------------------------------------------------------------
def image_environment() -> dict[str, str]:
    """A shell's environment in the container, made from scratch: nothing of the host's (MAKEFLAGS, CXX, PYTHONPATH,
    PIP_*) reaches the README's commands."""
    return dict(HOME="/root", LANG="C.UTF-8", TERM="dumb", PATH=IMAGE_PATH, LD_LIBRARY_PATH=HOST_LD_LIBRARY_PATH,
                PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull)


def wait_ready(process: subprocess.Popen, timeout_s: float = 600) -> None:
    from serving.tritonserver import is_ready  # the image's Python imports this checkout's code, as make does

    deadline = time.monotonic() + timeout_s
    while not is_ready("localhost:8000"):
        if process.poll() is not None:
            raise SystemExit(f"make serve-only exited with status {process.returncode} before the server was ready")
        if time.monotonic() > deadline:
            raise SystemExit(f"the server was not ready on localhost:8000 after {timeout_s:.0f} s")
        time.sleep(1)


def tritonserver_pids() -> list[int]:
    """The tritonserver processes here (this PID namespace holds only the rehearsal's)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "exe")).name == "tritonserver":
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def echo_lines(stream, lines: list[str]) -> None:
    """Pass a process's output on as it comes, keeping its lines."""
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)


def check(condition: bool, what: str, failures: list[str]) -> None:
    log(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


def inside() -> int:
    from serving.tritonserver import STOPPED_CLEANLY

    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    env = image_environment()
    failures: list[str] = []
    check(shutil.which("g++", path=env["PATH"]) is None, "no g++ on PATH", failures)
    check(shutil.which("clang++", path=env["PATH"]) is not None, "clang++ on PATH", failures)
    server = None
    server_lines: list[str] = []
    for command in readme_commands():
        if is_gpu_build(command):
            log(f"not rehearsable (TensorRT-LLM, a GPU): {command}\n    in its place, the embedded repository this "
                "checkout built is copied to build/model_repository")
            shutil.copytree("build/model_repository_embedded", "build/model_repository", symlinks=True)
            continue
        log(f"$ {command}")
        if command.startswith("make serve-only"):
            server = subprocess.Popen(shlex.split(command), env=env, start_new_session=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
            threading.Thread(target=echo_lines, args=(server.stdout, server_lines), daemon=True).start()
            wait_ready(server)
            (pid,) = tritonserver_pids()
            environ = dict(item.split("=", 1) for item in
                           Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in item)
            check(environ.get("LD_LIBRARY_PATH") == HOST_LD_LIBRARY_PATH,
                  f"tritonserver's LD_LIBRARY_PATH is the host's as given ({environ.get('LD_LIBRARY_PATH')})",
                  failures)
            continue
        result = subprocess.run(shlex.split(command), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        sys.stdout.write(result.stdout)
        check(result.returncode == 0, f"`{command}` exits 0 (exit {result.returncode})", failures)
        words = shlex.split(command)
        if "DRY_RUN=1" in words:
            plan = Path(next(w.split("=", 1)[1] for w in words if w.startswith("REPO=")))
            check("compiling the relay: clang++" in result.stdout and
                  (plan / BLS_MODEL / "1" / "libtriton_llama3_relay.so").is_file(),
                  "the dry run compiled the relay with clang++", failures)
    if server is None:
        failures.append("the README's container block has no `make serve-only`")
    else:
        os.killpg(server.pid, signal.SIGINT)  # Ctrl-C in the first shell
        try:
            server.wait(timeout=60)
            stopped = True
        except subprocess.TimeoutExpired:
            stopped = False
            os.killpg(server.pid, signal.SIGKILL)
        # make reports the interrupt whatever its recipe did: serve's own last line says how the stop went.
        check(stopped and not tritonserver_pids(),
              f"Ctrl-C ends make serve-only (make's exit {server.returncode}) and its tritonserver", failures)
        check(any(STOPPED_CLEANLY in line for line in server_lines),
              "after the suite, the stop is clean (tritonserver and the API exit 0)", failures)
    log("PASSED: every README container command did what the README says" if not failures else
        f"FAILED: {len(failures)} step(s): " + "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(inside() if sys.argv[1:] == ["--inside"] else rehearse())

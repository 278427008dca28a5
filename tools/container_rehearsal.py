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

Then the README's LLM API block, in the same container: the image's TensorRT-LLM is a package named `tensorrt_llm`
that is NOT TensorRT-LLM but the project's CPU stand-in of its LLM API (install_tensorrt_llm_stand_in); the block's
GPU build (`make repo ENGINE=llmapi HF_MODEL=...`) is replaced by the repository that build assembles (`llm:
tensorrt_llm`), of the tiny model (assemble_llmapi_gpu_repository); `make serve-only` runs as written, then the
container block's `make test SERVER_URL=...`, its integration step on LLMAPI_TESTS.

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
import sysconfig
import threading
import time
import urllib.request
from dataclasses import dataclass
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
# What stands in for the LLM API block's GPU build (under the checkout's build/): the repository that build assembles.
LLMAPI_REPOSITORY = "model_repository_llmapi"
# The LLM API block is served and tested by the container block's `make test SERVER_URL=...` line, its integration step
# on these files only (the whole suite already ran against the first server; these exercise tensorrt_llm on the LLM
# API through every path: NVIDIA's llmapi names and cancellation, the engine's own contract and metrics, the BLS, the
# ensemble, guided decoding).
LLMAPI_TESTS = ("tests/integration/test_llmapi.py", "tests/integration/test_engine.py",
                "tests/integration/test_metrics.py", "tests/integration/test_bls.py",
                "tests/integration/test_guided.py")
# TensorRT-LLM's LLM API where our code imports it (llmapi_engine/llm_api.py load_llm_api): module (a path under
# tensorrt_llm/, "" for the package) -> the names the stand-in package re-exports there from llmapi_engine.stand_in.
TENSORRT_LLM_API = {
    "": ("LLM", "SamplingParams"),
    "sampling_params": ("GuidedDecodingParams", "SamplingParams"),
    "executor/request": ("LoRARequest",),
    "llmapi/llm_utils": ("update_llm_args_with_extra_dict",),
}
# The stand-in's code, copied privately under tensorrt_llm/_stand_in/ with its imports pointed there: the model's own
# vendored copies of these packages stay the only ones it imports, as in the image.
STAND_IN_PACKAGES = ("bls", "embedded_engine", "llmapi_engine")
STAND_IN_NOTICE = ("THIS IS NOT TensorRT-LLM: `tensorrt_llm` here is the llama3-triton project's CPU stand-in for "
                   "TensorRT-LLM 1.2.1's LLM API (llmapi_engine/stand_in/, the embedded engine), installed by the "
                   "container rehearsal (tools/container_rehearsal.py) into its reproduction of the image's venv")
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
    return _block_commands(readme, "runs the 26.07 image", lambda block: "26.07-trtllm-python-py3" in block,
                           stand_in_prefixes=("docker run ", "    nvcr.io/"), stand_in_lines=("cd /work",))


def readme_llmapi_commands(readme: Path = README) -> list[str]:
    """The `make` lines of the README's LLM API block (the fenced block that builds `make repo ENGINE=llmapi`, run in
    the same container: the README says so), comments stripped."""
    return _block_commands(readme, "builds ENGINE=llmapi", lambda block: re.search(
        r"^make repo ENGINE=llmapi ", block, flags=re.M) is not None)


def _block_commands(readme: Path, what: str, is_block, stand_in_prefixes: tuple[str, ...] = (),
                    stand_in_lines: tuple[str, ...] = ()) -> list[str]:
    blocks = [block for block in re.findall(r"```bash\n(.*?)```", readme.read_text(), flags=re.S) if is_block(block)]
    if len(blocks) != 1:
        raise SystemExit(f"{readme}: expected one bash block that {what}, found {len(blocks)}")
    lines = [line.split("#", 1)[0].rstrip() for line in blocks[0].splitlines()]
    commands = []
    for line in filter(str.strip, lines):
        if line.startswith("make ") and not line.endswith("\\"):
            commands.append(line.strip())
        elif not (line.startswith(stand_in_prefixes) or line in stand_in_lines):
            stands_in = f" or stands in for ({', '.join((*stand_in_prefixes, *stand_in_lines)).strip()})" * bool(
                stand_in_prefixes or stand_in_lines)
            raise SystemExit(f"{readme}: the line {line!r} of the bash block that {what} is none the rehearsal runs (a "
                             f"one-line `make` command){stands_in}: extend the rehearsal first")
    return commands


def is_gpu_build(command: str) -> bool:
    """`make repo` that needs a GPU and TensorRT-LLM: ENGINE=trtllm, or ENGINE=llmapi of an HF_MODEL (without one it
    is the CPU stand-in's build); a dry run needs neither."""
    words = shlex.split(command)
    if words[:2] != ["make", "repo"] or any(word.startswith("DRY_RUN=") for word in words):
        return False
    return "ENGINE=trtllm" in words or ("ENGINE=llmapi" in words and any(w.startswith("HF_MODEL=") for w in words))


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


def assemble_llmapi_gpu_repository(out: Path) -> Path:
    """What `make repo ENGINE=llmapi HF_MODEL=...` assembles after its quantize step (`llm: tensorrt_llm`, model.yaml
    sized for a Hopper GPU of 80 GB: engine_build.llmapi_flow.assemble_gpu_repository), for the tiny default model: its
    quantize command on the tiny model is the one that made build/assets/tiny-target-modelopt-hf (made here when
    missing), linked where that step writes its export."""
    from engine_build.cli import build_parser
    from engine_build.llmapi_flow import TARGET_EXPORT, assemble_gpu_repository, plan, tiny_modelopt_export

    assets = PROJECT / "build" / "assets"
    gpu_assets = STAGE / "llmapi-assets"
    if gpu_assets.exists():
        shutil.rmtree(gpu_assets)
    gpu_assets.mkdir(parents=True)
    (gpu_assets / TARGET_EXPORT).symlink_to(tiny_modelopt_export(assets, log))
    args = build_parser().parse_args([
        "repo", "--engine", "llmapi", "--hf-model", str(assets / "tiny-target-hf"), "--gpu-arch", "hopper",
        "--gpu-mem-gb", "80", "--assets", str(gpu_assets), "--repo", str(out)])
    return assemble_gpu_repository(args, plan(args), log, built=True)


def install_tensorrt_llm_stand_in(site_packages: Path) -> Path:
    """A package named `tensorrt_llm` in the image venv's site-packages, as the image has TensorRT-LLM there: the
    modules of TENSORRT_LLM_API, re-exporting the stand-in's LLM API, and saying at import that they are not
    TensorRT-LLM."""
    package = site_packages / "tensorrt_llm"
    if package.exists():
        shutil.rmtree(package)
    private = package / "_stand_in"
    for name in STAND_IN_PACKAGES:
        shutil.copytree(PROJECT / name, private / name, ignore=shutil.ignore_patterns("__pycache__"))
    (private / "__init__.py").write_text(f'"""{STAND_IN_NOTICE}: the stand-in\'s own code."""\n')
    importing = re.compile(r"^(\s*)(from|import) (" + "|".join(STAND_IN_PACKAGES) + r")\b", flags=re.M)
    for file in private.rglob("*.py"):
        text = file.read_text()
        if any(match.group(2) == "import" for match in importing.finditer(text)):
            raise SystemExit(f"{file}: `import <package>` of the stand-in's packages cannot be redirected; use `from`")
        file.write_text(importing.sub(r"\1\2 tensorrt_llm._stand_in.\3", text))
    for module, names in TENSORRT_LLM_API.items():
        path = package.joinpath(*module.split("/")).with_suffix(".py") if module else package / "__init__.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in path.relative_to(package).parents:  # every package on the way: its __init__.py
            init = package / folder / "__init__.py"
            if not init.exists():
                init.write_text(f'"""{STAND_IN_NOTICE}."""\n')
        notice = [f'"""{STAND_IN_NOTICE}.', "",
                  'It runs on the CPU and proves nothing about TensorRT-LLM itself (docs/container.md)."""', ""]
        if not module:  # the package: said where the server logs it, once per process that imports it
            notice += ["import sys", "", f"sys.stderr.write({STAND_IN_NOTICE + chr(10)!r})", ""]
        path.write_text("\n".join([*notice, f"from tensorrt_llm._stand_in.llmapi_engine.stand_in import "
                                              f"{', '.join(names)}", "", f"__all__ = {list(names)!r}", ""]))
    return package


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
    log("in place of the LLM API block's GPU build: the repository it assembles (llm: tensorrt_llm), of the tiny model")
    assemble_llmapi_gpu_repository(STAGE / "clone" / "build" / LLMAPI_REPOSITORY)
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


@dataclass
class ServeOnly:
    """`make serve-only` running in the background (the first shell), its output passed on and kept."""
    process: subprocess.Popen
    lines: list[str]

    @classmethod
    def start(cls, command: str, env: dict[str, str]) -> ServeOnly:
        process = subprocess.Popen(shlex.split(command), env=env, start_new_session=True, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        served = cls(process, [])
        threading.Thread(target=echo_lines, args=(process.stdout, served.lines), daemon=True).start()
        wait_ready(process)
        return served

    def ctrl_c(self, what: str, failures: list[str]) -> None:
        """Ctrl-C in its shell: every process ends, and the stop is clean. make reports the interrupt whatever its
        recipe did, so serve's own last line (STOPPED_CLEANLY) says how the stop went."""
        from serving.tritonserver import STOPPED_CLEANLY

        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=120)
            stopped = True
        except subprocess.TimeoutExpired:
            stopped = False
            os.killpg(self.process.pid, signal.SIGKILL)
        check(stopped and not tritonserver_pids(),
              f"Ctrl-C ends {what} (make's exit {self.process.returncode}) and its tritonserver", failures)
        check(any(STOPPED_CLEANLY in line for line in self.lines),
              f"{what}: the stop is clean (tritonserver and the API exit 0)", failures)


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
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    env = image_environment()
    failures: list[str] = []
    check(shutil.which("g++", path=env["PATH"]) is None, "no g++ on PATH", failures)
    check(shutil.which("clang++", path=env["PATH"]) is not None, "clang++ on PATH", failures)
    stand_in = install_tensorrt_llm_stand_in(Path(sysconfig.get_paths()["purelib"]))
    log(f"the image's TensorRT-LLM: {stand_in}, NOT TensorRT-LLM but the CPU stand-in of its LLM API")
    server = None
    for command in readme_commands():
        if is_gpu_build(command):
            log(f"not rehearsable (TensorRT-LLM, a GPU): {command}\n    in its place, the embedded repository this "
                "checkout built is copied to build/model_repository")
            shutil.copytree("build/model_repository_embedded", "build/model_repository", symlinks=True)
            continue
        log(f"$ {command}")
        if command.startswith("make serve-only"):
            server = ServeOnly.start(command, env)
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
        server.ctrl_c("make serve-only, after the suite", failures)
    rehearse_llmapi_block(env, failures)
    log("PASSED: every README container command did what the README says" if not failures else
        f"FAILED: {len(failures)} step(s): " + "; ".join(failures))
    return 1 if failures else 0


def rehearse_llmapi_block(env: dict[str, str], failures: list[str]) -> None:
    """The README's LLM API block, in the same container after the first server stopped: its GPU build replaced by
    the repository that build assembles (LLMAPI_REPOSITORY, `llm: tensorrt_llm`), served by TensorRT-LLM's name, the
    stand-in; `make serve-only` as written; then the container block's `make test SERVER_URL=...`, its integration
    step on LLMAPI_TESTS; Ctrl-C."""
    server = None
    for command in readme_llmapi_commands():
        if is_gpu_build(command):
            log(f"not rehearsable (ModelOpt's calibration and TensorRT-LLM's LLM, a GPU): {command}\n    in its place, "
                "the repository that build assembles, of the tiny model (llm: tensorrt_llm), is copied to "
                "build/model_repository")
            shutil.rmtree("build/model_repository")
            shutil.copytree(f"build/{LLMAPI_REPOSITORY}", "build/model_repository", symlinks=True)
            continue
        log(f"$ {command}")
        if command.startswith("make serve-only"):
            server = ServeOnly.start(command, env)
            with urllib.request.urlopen("http://localhost:8000/v2/models/tensorrt_llm/config", timeout=10) as reply:
                llm = json.loads(reply.read()).get("parameters", {}).get("llm", {}).get("string_value")
            check(llm == "tensorrt_llm", f"the served tensorrt_llm runs TensorRT-LLM's LLM API (llm: {llm})", failures)
            continue
        result = subprocess.run(shlex.split(command), env=env)
        check(result.returncode == 0, f"`{command}` exits 0 (exit {result.returncode})", failures)
    if server is None:
        failures.append("the README's LLM API block has no `make serve-only`")
        return
    (test,) = [command for command in readme_commands() if command.startswith("make test ")]
    variables = dict(word.split("=", 1) for word in shlex.split(test)[2:])
    pytest = ["build/venv-test/bin/python", "-m", "pytest", "-q", "-rs", *LLMAPI_TESTS, "--repo", variables["REPO"],
              "--server-url", variables["SERVER_URL"]]
    log(f"$ {test}, its integration step on {len(LLMAPI_TESTS)} files: {shlex.join(pytest)}")
    result = subprocess.run(pytest, env=env)
    check(result.returncode == 0, f"the LLM API repository's tests pass (exit {result.returncode})", failures)
    server.ctrl_c("the LLM API block's make serve-only", failures)

if __name__ == "__main__":
    sys.exit(inside() if sys.argv[1:] == ["--inside"] else rehearse())

"""`make check-repo REPO=...`: what in a built repository would keep a model from loading in the 26.07 container.

A static check, without tritonserver, a GPU or TensorRT-LLM, of every model against what its backend reads:
- the tensorrtllm C++ backend's parameters (engine_build/upstream_parameters.py: every key upstream's template
  declares, how each is read, what a value must look like, the files the paths name);
- the Python backend's parameters, each Python model's files and the imports of every Python file it ships against
  what the container installs (engine_build/container_python.py);
- tensors, dtypes, dims, reshapes against bls/contract.py (held to NVIDIA's 1.2.1 contracts by
  tests/unit/test_contract.py); the decoupled policy; the ensemble's wiring and batch sizes; the models the BLS names;
- every file against repository.json (what each Python model verifies at load);
- the LoRA adapters repository.json records: preprocessing's name table, the engine's prefetch folder and the files in
  it (engine_build/lora.py repository_problems);
- the handoff's token text classes against postprocessing's tokenizer (where its packages are installed).
Exit status 1 when anything would fail; what cannot be checked here is printed as such.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bls.artifact import MANIFEST, ArtifactError, verify_model_files
from bls.contract import CONTRACTS, TOKEN_TEXT_CLASSES_FILE, ModelContract, TensorSpec
from bls.model_parameters import parse_bool
from engine_build.container_python import why_not_importable
from engine_build.pbtxt import PbtxtError, first, parameters, parse_pbtxt
from engine_build.token_text_classes import token_text_classes_for
from engine_build.topology import BLS_MODEL, BLS_PYTHON_MODEL, HANDOFF_MODEL, LLMAPI_TEMPLATE, TOPOLOGIES
from engine_build.upstream_parameters import (
    PARAMETER_READS,
    PYTHON_BACKEND_PARAMETER_READS,
    UPSTREAM_TEMPLATE_PARAMETERS,
    XGRAMMAR_TOKENIZER_INFO_FIELDS,
    ParameterRead,
    is_unset,
)

RELAY_BACKEND = "llama3_relay"
RELAY_LIBRARY = "libtriton_llama3_relay.so"
BACKENDS = ("python", "tensorrtllm", RELAY_BACKEND)
# Which contract each model of ours answers to.
CONTRACT_OF = {
    "tensorrt_llm": "tensorrt_llm", "tensorrt_llm_draft": "tensorrt_llm", "preprocessing": "preprocessing",
    "postprocessing": "postprocessing",
    "ensemble": "ensemble", BLS_MODEL: BLS_MODEL, BLS_PYTHON_MODEL: BLS_MODEL,
    HANDOFF_MODEL: HANDOFF_MODEL,  # the engine's tensors plus its own stream-state output
}
# Engine models: the ones that may import the engine-only modules (engine_build/container_python.py).
ENGINE_CONTRACTS = ("tensorrt_llm", LLMAPI_TEMPLATE)
# Parameters of our Python models that name a path relative to the model's version folder, and the file it must hold.
PYTHON_MODEL_PATHS = {"tokenizer_dir": ("tokenizer.json", "tokenizer.model"), "checkpoint_dir": ("config.json",)}
# Parameters that name another model of the repository (the BLS's, the relays', the handoff's).
MODEL_NAME_PARAMETERS = ("preprocessing_model_name", "postprocessing_model_name", "tensorrt_llm_model_name",
                         "tensorrt_llm_draft_model_name", "python_model_name", "handoff_to")
BOOL_TEXT = ("True", "true", "TRUE", "1", "False", "false", "FALSE", "0")
# Where the container's tritonserver finds its backends (server build.py r26.07 installs python and tensorrtllm there;
# tensorrtllm_postbuild puts trtllmExecutorWorker beside libtriton_tensorrtllm.so). Checked only where it exists.
CONTAINER_BACKENDS = Path("/opt/tritonserver/backends")


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    # Parameters that name a file of this repository by absolute path ("model: key = path"): the repository must be
    # served from that folder, never from an object store's temporary copy.
    fixed_paths: list[str] = field(default_factory=list)
    # Backend libraries a model ships in its own folder (the relay): Triton looks for them under the repository's
    # path as given, not under the local copy it makes of an object store's (core backend_model.cc,
    # GetBackendLibrarySearchPaths(model_path, ...); seen here with Triton 2.51 and moto's S3).
    model_libraries: list[str] = field(default_factory=list)

    def fail(self, model: str, reason: str) -> None:
        self.problems.append(f"{model}: {reason}")

    def cannot_check(self, model: str, what: str) -> None:
        self.unchecked.append(f"{model}: {what}")

    @property
    def ok(self) -> bool:
        return not self.problems

    def text(self, repo: Path) -> str:
        lines = [f"check-repo {repo}: " + ("every model would load" if self.ok else
                                           f"{len(self.problems)} problem(s): these would fail to load or misbehave")]
        lines += [f"  FAIL {problem}" for problem in self.problems]
        lines += [f"  not checked here: {item}" for item in self.unchecked]
        if self.fixed_paths:
            roots = sorted({entry.split(" = ", 1)[1].split(f"/{entry.split(':', 1)[0]}/1", 1)[0]
                            for entry in self.fixed_paths})
            lines.append(f"  served from: {' or '.join(roots)} only (the backend opens {'; '.join(self.fixed_paths)}). "
                         "From an object store, sync it to that folder first: Triton copies an s3:// / gs:// / as:// "
                         "repository to a temporary folder those paths do not name")
        elif self.model_libraries:
            lines.append(f"  served from: any local folder. From an object store, sync it to one first: Triton looks "
                         f"for a model's own backend library ({', '.join(self.model_libraries)}) under the store's "
                         "path, not its local copy")
        else:
            lines.append("  served from: any folder, or an object store as is (s3://, gs://, as://): no config names "
                         "a path of its own and no model ships a backend library")
        return "\n".join(lines)


@dataclass(frozen=True)
class Model:
    name: str
    directory: Path
    config: dict

    @property
    def backend(self) -> str | None:
        return first(self.config, "backend")

    @property
    def parameters(self) -> dict[str, str]:
        return parameters(self.config)

    @property
    def decoupled(self) -> bool:
        return bool(first(first(self.config, "model_transaction_policy", {}), "decoupled", False))

    def tensors(self, kind: str) -> dict[str, dict]:
        return {first(t, "name"): t for t in self.config.get(kind, [])}


def check_repository(repo: Path) -> Report:
    repo = Path(repo).resolve()
    report = Report()
    if not (repo / MANIFEST).is_file():
        report.fail("repository", f"no {MANIFEST}: not built by `make repo`, so what it should hold is unknown")
        return report
    manifest = json.loads((repo / MANIFEST).read_text())
    models: dict[str, Model] = {}
    for directory in sorted(p for p in repo.iterdir() if p.is_dir()):
        config_file = directory / "config.pbtxt"
        if not config_file.is_file():
            report.fail(directory.name, "no config.pbtxt (tritonserver --disable-auto-complete-config needs one)")
            continue
        try:
            models[directory.name] = Model(directory.name, directory, parse_pbtxt(config_file.read_text()))
        except PbtxtError as error:
            report.fail(directory.name, f"config.pbtxt does not parse: {error}")
    for name in manifest.get("models", []):
        if name not in models and not (repo / name).is_dir():
            report.fail(name, f"listed in {MANIFEST} but missing from the repository")
    for model in models.values():
        _check_model(model, models, manifest, report)
        report.fixed_paths += [f"{model.name}: {key} = {value}" for key, value in sorted(model.parameters.items())
                               if value.startswith("/") and f"/{model.name}/1" in value]
        report.model_libraries += [str(library.relative_to(repo)) for library in sorted(model.directory.glob("*/*.so"))]
    _check_lora(models, manifest, report)
    _check_topology(models, manifest, report)
    return report


def _check_topology(models: dict[str, Model], manifest: dict, report: Report) -> None:
    """The repository is wired as its recorded topology says (engine_build/topology.py): its name is the one its
    transaction policy gives, every model of its paths is here, the ensemble's steps are its path, and the BLS's
    transport is the topology's."""
    recorded = manifest.get("topology")
    if not isinstance(recorded, dict) or recorded.get("name") not in TOPOLOGIES:
        report.fail("repository", f"{MANIFEST} names no topology of {sorted(TOPOLOGIES)}: rebuild it with `make repo`")
        return
    topology = TOPOLOGIES[recorded["name"]]
    expected = topology.paths(bool(manifest.get("draft")))
    if topology.name != ("streaming" if manifest.get("decoupled", True) else "unary"):
        report.fail("repository", f"topology {topology.name} does not match decoupled={manifest.get('decoupled')}")
    if recorded.get("paths") != expected:
        report.fail("repository", f"{MANIFEST}'s topology paths {recorded.get('paths')} are not {topology.name}'s "
                                  f"{expected}")
    for name in {model for path in expected.values() for model in path}:
        if name not in models:
            report.fail(name, f"the {topology.name} topology goes through it, but the repository does not have it")
    ensemble = models.get("ensemble")
    if ensemble is not None:
        scheduling = first(ensemble.config, "ensemble_scheduling", {})
        steps = [first(step, "model_name") for step in scheduling.get("step", [])]
        if steps != topology.ensemble_steps:
            report.fail("ensemble", f"its steps {steps} are not the {topology.name} topology's "
                                    f"{topology.ensemble_steps}")
    python_bls = models.get(BLS_PYTHON_MODEL if topology.relayed else BLS_MODEL)
    if python_bls is not None and python_bls.parameters.get("transport") != topology.bls_transport:
        report.fail(python_bls.name, f"transport {python_bls.parameters.get('transport')!r} is not the "
                                     f"{topology.name} topology's {topology.bls_transport!r}")


def _check_lora(models: dict[str, Model], manifest: dict, report: Report) -> None:
    from engine_build.lora import name_table_problems, repository_problems

    engine = models.get("tensorrt_llm")
    if engine is None or engine.backend not in ("python", "tensorrtllm") or "preprocessing" not in models:
        return
    if manifest.get("engine") == "llmapi":  # the adapters' folders: model.yaml's lora_config (_check_llmapi_model)
        for problem in name_table_problems(manifest, models["preprocessing"].parameters.get("lora_adapters")):
            report.fail(engine.name, problem)
        return

    def served_prefetch_dir(value: str) -> Path:
        if engine.backend == "python":
            return engine.directory / "1" / value
        if not Path(value).is_absolute():
            report.cannot_check(engine.name, f"lora_prefetch_dir {value} is relative to tritonserver's working "
                                             "directory")
        return served_path(engine, value, report)

    for problem in repository_problems(manifest, engine.backend, engine.parameters, served_prefetch_dir,
                                       models["preprocessing"].parameters.get("lora_adapters")):
        report.fail(engine.name, problem)


def _check_model(model: Model, models: dict[str, Model], manifest: dict, report: Report) -> None:
    name = model.name
    if first(model.config, "name") != name:
        report.fail(name, f"config name {first(model.config, 'name')!r} differs from its directory {name!r}")
    version_dir = model.directory / "1"
    if not version_dir.is_dir():
        report.fail(name, "no version folder 1/")
        return
    try:
        verify_model_files(version_dir)
    except ArtifactError as error:
        report.fail(name, str(error))
    if first(model.config, "platform") == "ensemble":
        _check_ensemble(model, models, report)
    elif model.backend not in BACKENDS:
        report.fail(name, f"backend {model.backend!r} is none of {BACKENDS}")
        return
    _check_tensors(model, manifest, report)
    _check_decoupled(model, manifest, report)
    if model.backend in ("python", "tensorrtllm"):
        if CONTAINER_BACKENDS.is_dir():
            if not (CONTAINER_BACKENDS / model.backend).is_dir():
                report.fail(name, f"backend {model.backend}: {CONTAINER_BACKENDS / model.backend} is missing here")
        else:
            report.cannot_check(name, f"backend {model.backend} (no {CONTAINER_BACKENDS} here: not the container)")
    if model.backend == "python":
        _check_python_model(model, models, report, engine_model=contract_of(model, manifest) in ENGINE_CONTRACTS)
        if manifest.get("engine") == "llmapi" and name == "tensorrt_llm":
            _check_llmapi_model(model, manifest, report)
    elif model.backend == "tensorrtllm":
        _check_tensorrtllm_model(model, manifest, report)
    elif model.backend == RELAY_BACKEND:
        if not (version_dir / RELAY_LIBRARY).is_file():
            report.fail(name, f"backend {RELAY_BACKEND} needs 1/{RELAY_LIBRARY} (compiled by make repo): missing")
        _check_named_models(model, models, report)
        if "handoff_to" in model.parameters:
            _check_token_text_classes(model, models.get("postprocessing"), report)


# ---- tensors -------------------------------------------------------------------------------------------------------

def contract_of(model: Model, manifest: dict) -> str | None:
    """The contract (bls/contract.py) a model of ours answers to: CONTRACT_OF's, but the LLM API's tensorrt_llm, which
    answers to its template's (ENGINE=llmapi: engine_build/topology.py LLMAPI_TEMPLATE)."""
    if manifest.get("engine") == "llmapi" and model.name == "tensorrt_llm":
        return LLMAPI_TEMPLATE
    return CONTRACT_OF.get(model.name)


def _check_tensors(model: Model, manifest: dict, report: Report) -> None:
    contract_name = contract_of(model, manifest)
    if contract_name is None:
        report.fail(model.name, "a model this repository's contracts (bls/contract.py) do not know")
        return
    contract: ModelContract = CONTRACTS[contract_name]
    # A relay forwards inputs as it receives them: its config declares them without the reshapes.
    reshape = model.backend != RELAY_BACKEND
    for kind, specs in (("input", contract.inputs), ("output", contract.outputs)):
        declared = model.tensors(kind)
        expected = {spec.name: spec for spec in specs}
        for missing in sorted(set(expected) - set(declared)):
            report.fail(model.name, f"{kind} {missing!r} of the {contract_name} contract is not declared")
        for extra in sorted(set(declared) - set(expected)):
            report.fail(model.name, f"{kind} {extra!r} is not in the {contract_name} contract")
        for tensor_name in sorted(set(declared) & set(expected)):
            for problem in _tensor_differences(declared[tensor_name], expected[tensor_name], kind, reshape):
                report.fail(model.name, f"{kind} {tensor_name!r}: {problem}")


def _tensor_differences(tensor: dict, spec: TensorSpec, kind: str, reshape: bool) -> list[str]:
    problems = []
    if first(tensor, "data_type") != spec.data_type:
        problems.append(f"data_type {first(tensor, 'data_type')}, the contract says {spec.data_type}")
    dims = tuple(tensor.get("dims", []))
    if dims != tuple(spec.dims):
        problems.append(f"dims {list(dims)}, the contract says {list(spec.dims)}")
    if kind == "input":
        if bool(first(tensor, "optional", False)) != spec.optional:
            problems.append(f"optional {bool(first(tensor, 'optional', False))}, the contract says {spec.optional}")
        has_reshape = "reshape" in tensor
        if has_reshape != (spec.reshape_scalar and reshape):
            problems.append("reshape to a scalar " + ("declared" if has_reshape else "missing") +
                            ": the backend would read it in another shape")
        if bool(first(tensor, "allow_ragged_batch", False)) != spec.allow_ragged_batch:
            problems.append(f"allow_ragged_batch {not spec.allow_ragged_batch}, the contract says "
                            f"{spec.allow_ragged_batch}")
    return problems


def _check_decoupled(model: Model, manifest: dict, report: Report) -> None:
    if first(model.config, "platform") == "ensemble" or model.name in ("preprocessing", "postprocessing"):
        return
    if model.backend == RELAY_BACKEND:
        if not model.decoupled:
            report.fail(model.name, "the relay sends its responses from a decoupled model: decoupled must be true")
        return
    wanted = bool(manifest.get("decoupled", True))
    if model.decoupled != wanted:
        report.fail(model.name, f"decoupled {model.decoupled}, but the repository was built with decoupled={wanted} "
                                "(the BLS and the engines must agree: a streamed request needs decoupled engines)")


# ---- ensemble ------------------------------------------------------------------------------------------------------

@dataclass
class _EnsembleTensor:
    """An ensemble tensor as Triton's ValidateEnsembleConfig sees it (core src/ensemble_utils.cc): where its dtype and
    shape were inferred from, and the label of the decoupled model whose responses it comes from (0: none)."""

    source: str
    data_type: str
    dims: tuple
    batching: bool
    label: int = 0

    def differs_from(self, other: _EnsembleTensor) -> str | None:
        if self.data_type != other.data_type:
            return f"{self.data_type} from {self.source} but {other.data_type} from {other.source}"
        full = ((-1,) if self.batching else ()) + self.dims, ((-1,) if other.batching else ()) + other.dims
        if not (_dims_match(self.dims, other.dims) or _dims_match(*full)):
            return f"shape {list(full[0])} from {self.source} but {list(full[1])} from {other.source}"
        return None


def _dims_match(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _ensemble_tensor(source: str, tensor: dict, batching: bool) -> _EnsembleTensor:
    reshape = first(tensor, "reshape")
    dims = tuple(reshape.get("shape", [])) if reshape is not None and source.startswith("ensemble") else \
        tuple(tensor.get("dims", []))
    return _EnsembleTensor(source, first(tensor, "data_type"), dims, batching)


def _check_ensemble(model: Model, models: dict[str, Model], report: Report) -> None:
    """What Triton's ValidateEnsembleConfig and ValidateTensorMapping refuse (core src/ensemble_utils.cc), with the
    steps taken in their written order: every step model exists and batches at least as far as the ensemble; each
    input_map key is an input of the step's model, mapped once, every required input mapped; each output_map key an
    output; a tensor's dtype and shape agree wherever it is inferred; no step takes inputs that come from different
    decoupled models; every ensemble output is produced."""
    scheduling = first(model.config, "ensemble_scheduling", {})
    batch = first(model.config, "max_batch_size", 0)
    tensors = {name: _ensemble_tensor("ensemble input", t, batch > 0) for name, t in model.tensors("input").items()}
    label = 0
    for step in scheduling.get("step", []):
        step_name = first(step, "model_name")
        target = models.get(step_name)
        if target is None:
            report.fail(model.name, f"a step calls model {step_name!r}, which the repository does not have")
            continue
        target_batch = first(target.config, "max_batch_size", 0)
        if target_batch != 0 and target_batch < batch:
            report.fail(model.name, f"max_batch_size {batch} exceeds {step_name}'s {target_batch} (Triton refuses "
                                    "the ensemble)")
        inputs, outputs = target.tensors("input"), target.tensors("output")
        mapped: dict[str, list[str]] = {}
        for entry in step.get("input_map", []):
            mapped.setdefault(first(entry, "key"), []).append(first(entry, "value"))
        labels = set()
        for key, values in mapped.items():
            if key not in inputs:
                report.fail(model.name, f"step {step_name}: {key!r} is not an input of {step_name}")
                continue
            if len(values) > 1:
                report.fail(model.name, f"step {step_name}: input {key!r} is mapped to several tensors {values}")
            value = values[0]
            if value not in tensors:
                report.fail(model.name, f"step {step_name}: input {key!r} reads {value!r}, which no ensemble input "
                                        "or earlier step provides")
                continue
            labels.add(tensors[value].label)
            problem = tensors[value].differs_from(_ensemble_tensor(f"{step_name} input {key}", inputs[key],
                                                                   target_batch > 0))
            if problem:
                report.fail(model.name, f"step {step_name}: tensor {value!r} is inconsistent: {problem}")
        for key, tensor in inputs.items():
            if key not in mapped and not first(tensor, "optional", False):
                report.fail(model.name, f"step {step_name}: required input {key!r} is not mapped")
        if len(labels) > 1:
            report.fail(model.name, f"step {step_name} receives inputs originated from different decoupled models "
                                    "(Triton refuses the ensemble)")
        if target.decoupled:
            label += 1
        step_label = label if target.decoupled else max(labels, default=0)
        for entry in step.get("output_map", []):
            key, value = first(entry, "key"), first(entry, "value")
            if key not in outputs:
                report.fail(model.name, f"step {step_name}: {key!r} is not an output of {step_name}")
                continue
            produced = _ensemble_tensor(f"{step_name} output {key}", outputs[key], target_batch > 0)
            produced.label = step_label
            declared = tensors.get(value)
            if declared is not None and declared.source != "ensemble input":
                report.fail(model.name, f"step {step_name}: tensor {value!r} is produced twice")
            elif declared is not None:
                report.fail(model.name, f"step {step_name}: {value!r} is an ensemble input and a step's output")
            tensors[value] = produced
    for name, tensor in model.tensors("output").items():
        if name not in tensors or tensors[name].source == "ensemble input":
            report.fail(model.name, f"output {name!r} is produced by no step")
            continue
        problem = _ensemble_tensor("ensemble output", tensor, batch > 0).differs_from(tensors[name])
        if problem:
            report.fail(model.name, f"output {name!r} is inconsistent: {problem}")


# ---- Python models -------------------------------------------------------------------------------------------------

def _check_python_model(model: Model, models: dict[str, Model], report: Report, engine_model: bool) -> None:
    version_dir = model.directory / "1"
    if not (version_dir / "model.py").is_file():
        report.fail(model.name, "backend python needs 1/model.py: missing")
        return
    params = model.parameters
    for read in PYTHON_BACKEND_PARAMETER_READS:
        if read.name not in params:
            continue
        value = params[read.name]
        if read.accepted is not None and value not in read.accepted:
            report.fail(model.name, f"{read.name} {value!r} is none of {read.accepted}: {read.fatal}")
        if read.name == "EXECUTION_ENV_PATH":
            path = Path(value.replace("$$TRITON_MODEL_DIRECTORY", str(model.directory)))
            if not path.exists():
                report.fail(model.name, f"EXECUTION_ENV_PATH {value} does not exist: {read.fatal}")
    for key, wanted_files in PYTHON_MODEL_PATHS.items():
        if key in params:
            folder = version_dir / params[key]
            if not any((folder / wanted).is_file() for wanted in wanted_files):
                report.fail(model.name, f"{key} {params[key]!r} (relative to 1/) holds none of {wanted_files}")
    info = params.get("xgrammar_tokenizer_info_path")
    if info is not None and not is_unset("xgrammar_tokenizer_info_path", info):  # the embedded engine's, relative
        for problem in xgrammar_file_problems(version_dir / info, f"1/{info}"):
            report.fail(model.name, problem)
    _check_named_models(model, models, report)
    for problem in python_import_problems(version_dir, engine_model):
        report.fail(model.name, problem)


def _check_token_text_classes(handoff: Model, postprocessing: Model | None, report: Report) -> None:
    """The handoff's table (relay/handoff.cc loads it or fails) is the one postprocessing's tokenizer gives: a stale
    one would leave the state out where a character is split, and the ensemble would stream U+FFFD pieces."""
    path = handoff.directory / "1" / TOKEN_TEXT_CLASSES_FILE
    if not path.is_file():
        report.fail(handoff.name, f"1/{TOKEN_TEXT_CLASSES_FILE} (written by make repo) is missing: the handoff "
                                  "cannot load")
        return
    if postprocessing is None or "tokenizer_dir" not in postprocessing.parameters:
        return  # reported as postprocessing's own problem
    params = postprocessing.parameters
    try:
        skip = parse_bool(params.get("skip_special_tokens"), True, "skip_special_tokens")
    except ValueError as error:
        report.fail(postprocessing.name, f"{error}: the model cannot load")
        return
    try:
        expected = token_text_classes_for(postprocessing.directory / "1" / params["tokenizer_dir"], skip)
    except (ImportError, OSError, ValueError) as error:  # no transformers here (check-repo needs no set-up), or no load
        report.cannot_check(handoff.name, f"1/{TOKEN_TEXT_CLASSES_FILE} against postprocessing's tokenizer ({error})")
        return
    if path.read_bytes() != expected:
        report.fail(handoff.name, f"1/{TOKEN_TEXT_CLASSES_FILE} is not the one postprocessing's tokenizer and "
                                  "skip_special_tokens give: rebuild the repository with make repo")


def _check_named_models(model: Model, models: dict[str, Model], report: Report) -> None:
    for key in MODEL_NAME_PARAMETERS:
        named = model.parameters.get(key)
        if named and named not in models:
            report.fail(model.name, f"{key} names {named!r}, which the repository does not have")


def python_import_problems(version_dir: Path, engine_model: bool) -> list[str]:
    """Every import statement of every Python file under `version_dir` (what the model can import, at load or
    later) that the 26.07 container cannot satisfy; modules shipped beside model.py count as present, and an import
    inside `try: ... except ImportError` as optional."""
    local = {p.stem for p in version_dir.glob("*.py")} | {p.name for p in version_dir.iterdir()
                                                         if (p / "__init__.py").is_file()}
    problems = []
    for path in sorted(version_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(), str(path))
        except SyntaxError as error:
            problems.append(f"{path.relative_to(version_dir)} does not parse: {error}")
            continue
        for node, module in _imports(tree):
            top = module.split(".")[0]
            if top in local:
                continue
            reason = why_not_importable(top, engine_model)
            if reason:
                where = path.relative_to(version_dir.parent.parent)
                problems.append(f"{where} line {node.lineno} imports {module}: {reason}")
    return problems


def _imports(tree: ast.AST):
    optional = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            optional.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node, node.module


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = {n.id for n in ast.walk(handler.type) if isinstance(n, ast.Name)} if handler.type else set()
    return bool(names & {"ImportError", "ModuleNotFoundError"})


# ---- the tensorrt_llm model on the LLM API (ENGINE=llmapi) ----------------------------------------------------------

def _check_llmapi_model(model: Model, manifest: dict, report: Report) -> None:
    """model.yaml against TensorRT-LLM 1.2.x's LLM() arguments (engine_build/upstream_llm_args.py), its triton_config
    against config.pbtxt, the `llm` it runs against repository.json, and the folders its paths name: the checkpoint
    (ModelOpt's Hugging Face export: config.json, hf_quant_config.json, weights), the speculative model, the LoRA
    adapters. Paths are relative to tensorrt_llm/1/ (the model resolves them there)."""
    from engine_build.llmapi_yaml import LLM_STAND_IN, LLM_TENSORRT_LLM, QUANT_SUPPORT
    from engine_build.upstream_llm_args import llm_args_problems

    name, version_dir = model.name, model.directory / "1"
    llm = model.parameters.get("llm")
    if llm not in (LLM_TENSORRT_LLM, LLM_STAND_IN):
        report.fail(name, f"parameter llm {llm!r} is neither {LLM_TENSORRT_LLM!r} nor {LLM_STAND_IN!r}")
    elif llm != manifest.get("llm"):
        report.fail(name, f"parameter llm {llm!r}, but {MANIFEST} records llm {manifest.get('llm')!r}")
    try:
        from engine_build.llmapi_yaml import MODEL_YAML, read_model_yaml
    except ImportError as error:  # check-repo needs no set-up; PyYAML is the engine extra's (and the container's)
        report.cannot_check(name, f"1/model.yaml (PyYAML is not importable here: {error})")
        return
    if not (version_dir / MODEL_YAML).is_file():
        report.fail(name, f"1/{MODEL_YAML} is missing: the model has no LLM() arguments to load")
        return
    try:
        document = read_model_yaml(version_dir)
    except Exception as error:  # noqa: BLE001 - yaml.YAMLError or a read error: either fails the load
        report.fail(name, f"1/{MODEL_YAML} does not parse: {error}")
        return
    problems, unverified = llm_args_problems(document)
    for problem in problems:
        report.fail(name, f"1/{MODEL_YAML} {problem}")
    for item in unverified:
        report.cannot_check(name, f"1/{MODEL_YAML} {item}")
    if problems:
        return
    triton = document["triton_config"]
    if "decoupled" in triton and triton["decoupled"] != model.decoupled:
        report.fail(name, f"1/{MODEL_YAML} triton_config.decoupled {triton['decoupled']} differs from config.pbtxt's "
                          f"decoupled {model.decoupled} (Triton applies the config's: auto-complete is off)")
    batch = int(first(model.config, "max_batch_size", 0))
    if "max_batch_size" in triton and triton["max_batch_size"] != batch:
        report.fail(name, f"1/{MODEL_YAML} triton_config.max_batch_size {triton['max_batch_size']} differs from "
                          f"config.pbtxt's max_batch_size {batch}")
    ranks = document.get("tensor_parallel_size", 1) * document.get("pipeline_parallel_size", 1)
    if ranks != int(manifest.get("world_size", 1)):
        report.fail(name, f"1/{MODEL_YAML} tensor_parallel_size x pipeline_parallel_size = {ranks}, but "
                          f"{MANIFEST} records world_size {manifest.get('world_size', 1)} (what the launch starts)")
    adapters = sorted(manifest.get("lora_adapters") or [], key=lambda adapter: adapter["task_id"])
    lora = document.get("lora_config") or {}
    named = [Path(folder).name for folder in lora.get("lora_dir", [])]
    if named != [adapter["name"] for adapter in adapters]:
        report.fail(name, f"1/{MODEL_YAML} lora_config.lora_dir names {named}, but {MANIFEST} records the adapters "
                          f"{[adapter['name'] for adapter in adapters]} (task ids 1, 2, ... in that order)")
    too_big = [adapter["name"] for adapter in adapters if adapter["rank"] > lora.get("max_lora_rank", 64)]
    if too_big:
        report.fail(name, f"1/{MODEL_YAML} lora_config.max_lora_rank {lora.get('max_lora_rank', 64)} is below the "
                          f"rank of {too_big}")
    built = manifest.get("engines_built", True)
    if not built:
        report.cannot_check(name, "the checkpoint and the speculative model (a dry run exports none)")
    for key, folder, wanted in _llmapi_paths(document):
        if not folder:
            report.fail(name, f"1/{MODEL_YAML} {key} is missing: speculative_config's decoding_type "
                              f"{document['speculative_config']['decoding_type']} needs a draft model")
            continue
        if Path(folder).is_absolute():
            report.fail(name, f"1/{MODEL_YAML} {key} {folder!r} is absolute: paths are relative to tensorrt_llm/1/ "
                              "(the model resolves them there; the repository must stay relocatable)")
            continue
        if not built and key in ("model", "speculative_config.speculative_model_dir"):
            continue
        path = version_dir / folder
        missing = [file for file in wanted if not (path / file).is_file()]
        if not path.is_dir():
            report.fail(name, f"1/{MODEL_YAML} {key} {folder!r}: no such folder under 1/")
        elif missing:
            report.fail(name, f"1/{MODEL_YAML} {key} {folder!r} lacks {missing}")
        elif key == "model":
            if not any(path.glob("*.safetensors")):
                report.fail(name, f"1/{MODEL_YAML} model {folder!r} holds no *.safetensors weights")
            _check_quant_config(name, path / "hf_quant_config.json", manifest, report,
                                {algo for algo, *_ in QUANT_SUPPORT.values()})


def _llmapi_paths(document: dict) -> list[tuple[str, str | None, tuple[str, ...]]]:
    """(key, folder (None: not given), files it must hold) of every path model.yaml names."""
    paths = [("model", document["model"], ("config.json", "hf_quant_config.json"))]
    speculative = document.get("speculative_config") or {}
    if speculative.get("decoding_type") in ("Eagle", "Eagle3", "DraftTarget"):
        paths.append(("speculative_config.speculative_model_dir", speculative.get("speculative_model_dir"),
                      ("config.json",)))
    for folder in (document.get("lora_config") or {}).get("lora_dir", []):
        paths.append(("lora_config.lora_dir", folder, ("adapter_config.json",)))
    return paths


def _check_quant_config(name: str, path: Path, manifest: dict, report: Report, loadable: set[str]) -> None:
    """ModelOpt's hf_quant_config.json, as TensorRT-LLM's _torch/model_config.py reads it: quantization.quant_algo."""
    try:
        algo = json.loads(path.read_text())["quantization"]["quant_algo"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        report.fail(name, f"{path.name} has no readable quantization.quant_algo ({error!r})")
        return
    if algo not in loadable:
        report.fail(name, f"{path.name} quant_algo {algo!r} is none this build serves ({sorted(loadable)})")
    planned = (manifest.get("plan") or {}).get("quant_algo")
    if planned and planned != algo:
        report.fail(name, f"{path.name} quant_algo {algo!r}, but the repository was planned for {planned!r} (the GPU "
                          "check of make repo was for that one)")


# ---- the tensorrtllm C++ backend -----------------------------------------------------------------------------------

def _check_tensorrtllm_model(model: Model, manifest: dict, report: Report) -> None:
    params = model.parameters
    template = dict(UPSTREAM_TEMPLATE_PARAMETERS)
    for key, upstream_value in UPSTREAM_TEMPLATE_PARAMETERS:
        if key not in params:
            read = PARAMETER_READS.get(key)
            fatal = read is not None and read.fatal_when_missing
            report.fail(model.name, f"parameter {key!r} is missing" + (
                f": the backend reads it outside any try/catch ({read.source}), 'Cannot find parameter with name: "
                f"{key}' fails the load" if fatal else ": upstream's template declares it (1.2 contract)"))
        elif not upstream_value.startswith("${") and params[key] != upstream_value:
            report.fail(model.name, f"parameter {key!r} is {params[key]!r}; upstream's template has {upstream_value!r}")
    for key in sorted(set(params) - set(template) - set(PARAMETER_READS)):
        report.fail(model.name, f"parameter {key!r} is read by no 1.2.1 backend code (a typo?)")
    for key, value in params.items():
        read = PARAMETER_READS.get(key)
        if read is not None and not is_unset(key, value):
            problem = _value_problem(read, value)
            if problem:
                report.fail(model.name, f"parameter {key}={value!r}: {problem}")
    _check_required_values(model, params, report)
    _check_engine_files(model, params, manifest, report)
    if manifest.get("draft"):  # orchestrator mode: the executor spawns its ranks with this program
        worker = params.get("executor_worker_path", "")
        if not CONTAINER_BACKENDS.is_dir():
            report.cannot_check(model.name, f"executor_worker_path {worker} (not the container)")
        elif not Path(worker).is_file():
            report.fail(model.name, f"executor_worker_path {worker} does not exist: orchestrator mode cannot spawn "
                                    "the engine's ranks")
    _check_guided_decoding(model, params, report)
    groups = params.get("gpu_device_ids", "")
    if not is_unset("gpu_device_ids", groups) and not _value_problem(PARAMETER_READS["gpu_device_ids"], groups):
        world = int(manifest.get("world_size", 1))
        for group in groups.split(";"):
            if len(group.split(",")) != world:
                report.fail(model.name, f"gpu_device_ids group {group!r} names {len(group.split(','))} GPU(s); the "
                                        f"engine has {world} rank(s)")


def _value_problem(read: ParameterRead, value: str) -> str | None:
    """Why the backend would not take `value` as meant (None when it would)."""
    fallback = f"the backend falls back to {read.default}" if read.guarded else "the load fails"
    integer = re.compile(r"-?\d+$")
    kind_ok = {
        "string": True, "path": True,
        "bool": value in BOOL_TEXT,
        "int": bool(integer.match(value)),
        "uint": bool(re.match(r"\d+$", value)),
        "float": _is_float(value),
        "int_list": all(integer.match(v.strip()) for v in value.split(",")),
        "int_list_list": bool(re.match(r"^\s*\{[\d\s,]*\}(\s*,\s*\{[\d\s,]*\})*\s*$", value)),
        "device_groups": all(integer.match(v.strip()) for group in value.split(";") for v in group.split(",")),
    }[read.kind]
    if not kind_ok:
        return f"not a {read.cpp_type}: {fallback}"
    if read.accepted is not None and value not in read.accepted:
        return f"none of {read.accepted}: {fallback}"
    if read.name in ("kv_cache_free_gpu_mem_fraction", "lora_cache_gpu_memory_fraction", "gpu_weights_percent") \
            and not 0 < float(value) <= 1:
        return "a fraction must be in (0, 1]"
    return None


def _is_float(value: str) -> bool:
    try:
        float(value)
        return True
    except ValueError:
        return False


def _check_required_values(model: Model, params: dict[str, str], report: Report) -> None:
    if is_unset("gpt_model_type", params.get("gpt_model_type", "")):
        report.fail(model.name, "gpt_model_type is unset: getBatchingTypeFromParams throws 'Invalid gpt_model_type'")
    if params.get("decoding_mode") == "lookahead":
        for key in ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size"):
            if is_unset(key, params.get(key, "")):
                report.fail(model.name, f"decoding_mode lookahead without {key}: the load fails")


def served_path(model: Model, value: str, report: Report) -> Path:
    """Where an absolute path of the config is for this repository. A path into `<root>/<model>/1` names this
    repository's own file when <root> is where it lies; when <root> is elsewhere (built to be served there,
    `--serve-path` / relocate), this repository's copy is checked and that is said; when <root> is another repository
    that exists here, the backend would read that one's files, which is reported."""
    marker = f"/{model.name}/1"
    if marker not in value:
        return Path(value)
    root, tail = value.split(marker, 1)
    own = model.directory / "1" / tail.lstrip("/")
    if Path(root).resolve() == model.directory.parent:
        return own
    if Path(value).exists():
        report.fail(model.name, f"{value} points into another repository ({root}): served from here, the backend "
                                f"would read that one's files (python -m engine_build relocate --serve-path "
                                f"{model.directory.parent})")
    else:
        report.cannot_check(model.name, f"{value} (to be served from {root}): checked this repository's copy")
    return own


def _check_engine_files(model: Model, params: dict[str, str], manifest: dict, report: Report) -> None:
    value = params.get("gpt_model_path", "")
    if is_unset("gpt_model_path", value):
        report.fail(model.name, "gpt_model_path is unset and there is no encoder: 'Both encoder and decoder model "
                                "paths are empty' fails the load")
        return
    if not Path(value).is_absolute():
        report.cannot_check(model.name, f"gpt_model_path {value} is relative to tritonserver's working directory")
        return
    path = served_path(model, value, report)
    if not manifest.get("engines_built", True):
        report.cannot_check(model.name, "the engine files (a dry run builds none)")
        if not path.is_dir():
            report.fail(model.name, f"gpt_model_path {value}: no such directory")
        return
    world = int(manifest.get("world_size", 1))
    wanted = ["config.json"] + [f"rank{rank}.engine" for rank in range(world)]
    missing = [name for name in wanted if not (path / name).is_file()]
    if missing:
        report.fail(model.name, f"gpt_model_path {value} lacks {missing}: the executor cannot load the engine")


def _check_guided_decoding(model: Model, params: dict[str, str], report: Report) -> None:
    backend = params.get("guided_decoding_backend", "")
    info = params.get("xgrammar_tokenizer_info_path", "")
    tokenizer = params.get("tokenizer_dir", "")
    if not is_unset("tokenizer_dir", tokenizer):
        path = served_path(model, tokenizer, report)
        if not (path / "tokenizer.json").is_file():
            report.fail(model.name, f"tokenizer_dir {tokenizer} holds no tokenizer.json")
    if is_unset("guided_decoding_backend", backend):
        return
    if is_unset("xgrammar_tokenizer_info_path", info):
        report.fail(model.name, "guided_decoding_backend is set but xgrammar_tokenizer_info_path is not: the backend "
                                "silently turns guided decoding off")
        return
    path = served_path(model, info, report)
    for problem in xgrammar_file_problems(path, info):
        report.fail(model.name, problem)


def xgrammar_file_problems(path: Path, shown: str) -> list[str]:
    """What keeps the xgrammar tokenizer info file from loading (model_instance_state.cc
    getGuidedDecodingConfigFromParams reads it with nlohmann::json; the embedded engine reads the same file)."""
    if not path.is_file():
        return [f"xgrammar_tokenizer_info_path {shown} does not exist: the load fails (the C++ backend's "
                "TLLM_CHECK)"]
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        return [f"xgrammar_tokenizer_info_path {shown} is not JSON ({error}): the load fails"]
    checks = {
        "encoded_vocab": lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v),
        "tokenizer_str": lambda v: isinstance(v, str),
        "stop_token_ids": lambda v: isinstance(v, list) and all(isinstance(t, int) for t in v),
    }
    return [f"{shown}: {key} must be a {XGRAMMAR_TOKENIZER_INFO_FIELDS[key]}: nlohmann::json throws at load"
            for key, check in checks.items() if key not in data or not check(data[key])]


def main(repo: Path) -> int:
    report = check_repository(repo)
    print(report.text(Path(repo).resolve()), file=sys.stdout if report.ok else sys.stderr, flush=True)
    return 0 if report.ok else 1

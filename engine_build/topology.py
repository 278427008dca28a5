"""A repository's topology: which models a request goes through, named and recorded in repository.json.

There are two, one per Triton transaction policy (`make repo DECOUPLED=`); the building host scales only instance
and thread counts, never the wiring, so the 2-core CI serves the models and paths a GPU host serves:

- streaming (decoupled, the default): tensorrt_llm_bls is the relay (C++, relay/) in front of the Python BLS
  tensorrt_llm_bls_python, whose engine streams go through the relay; the ensemble's engine step is the handoff
  tensorrt_llm_handoff (C++), which re-sends the engine's responses from threads of its own.
- unary (DECOUPLED=false): one response per request, no relay: tensorrt_llm_bls is the Python BLS itself, calling
  the engines in-process (`exec`); the ensemble calls tensorrt_llm directly, as NVIDIA's does.

docs/design.md draws a streamed token's path through each model.
"""

from __future__ import annotations

from dataclasses import dataclass

# The models' names are bls/contract.py's (the models and the API, which cannot import engine_build, name them too);
# the build imports them from here, with the topologies they make.
from bls.contract import BLS_MODEL, BLS_PYTHON_MODEL, DRAFT_MODEL, HANDOFF_MODEL, TARGET_MODEL

# ENGINE=llmapi: TARGET_MODEL is rendered from this template folder (model_repository/), a Python model on
# TensorRT-LLM's LLM API, and answers to bls/contract.py's contract of this name.
LLMAPI_TEMPLATE = "tensorrt_llm_llmapi"


@dataclass(frozen=True)
class Topology:
    name: str
    bls_transport: str  # tensorrt_llm_bls's `transport` parameter (bls.transports)
    ensemble_engine_step: str  # the model the ensemble's engine step calls

    @property
    def relayed(self) -> bool:
        """Whether the relay (relay/, compiled by `make repo`) serves tensorrt_llm_bls and the handoff."""
        return self.bls_transport == "relay"

    @property
    def ensemble_steps(self) -> list[str]:
        """The ensemble's steps, in order (the handoff reaches tensorrt_llm itself)."""
        return ["preprocessing", self.ensemble_engine_step, "postprocessing"]

    def paths(self, draft: bool) -> dict[str, list[str]]:
        """The models each entry point's request goes through, in order (what docs/design.md draws)."""
        engines = [TARGET_MODEL] + ([DRAFT_MODEL] if draft else [])
        if self.relayed:
            bls = [BLS_MODEL, BLS_PYTHON_MODEL, "preprocessing", *engines, "postprocessing"]
            ensemble = ["ensemble", "preprocessing", HANDOFF_MODEL, TARGET_MODEL, "postprocessing"]
        else:
            bls = [BLS_MODEL, "preprocessing", *engines, "postprocessing"]
            ensemble = ["ensemble", "preprocessing", TARGET_MODEL, "postprocessing"]
        return {"ensemble": ensemble, BLS_MODEL: bls}

    def record(self, settings) -> dict:
        """repository.json's `topology`: the name, the paths, and the counts the building host sized."""
        scaled = {
            "bls_instances": settings.bls_instance_count,
            "preprocessing_instances": settings.preprocessing_instance_count,
            "postprocessing_instances": settings.postprocessing_instance_count,
        }
        if self.relayed:
            scaled["handoff_sender_threads"] = settings.handoff_sender_threads
        return {"name": self.name, "paths": self.paths(settings.draft is not None), "scaled_by_host": scaled}


STREAMING = Topology("streaming", bls_transport="relay", ensemble_engine_step=HANDOFF_MODEL)
UNARY = Topology("unary", bls_transport="in_process", ensemble_engine_step=TARGET_MODEL)
TOPOLOGIES = {topology.name: topology for topology in (STREAMING, UNARY)}


def repository_topology(settings) -> Topology:
    """The topology of a repository built with `settings` (RepositorySettings): by its transaction policy alone."""
    return STREAMING if settings.decoupled else UNARY

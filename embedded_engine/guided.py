"""Guided decoding (structured output) with xgrammar, as TensorRT-LLM 1.2.1's C++ runtime does it.

What 1.2.1 does, read in NVIDIA/TensorRT-LLM:
- `triton_backend/inflight_batcher_llm/src/utils.cc` `getGuidedDecodingParamsFromTensors`: the input
  `guided_decoding_guide_type` is one of `json`, `json_schema`, `regex`, `ebnf_grammar`; `guided_decoding_guide` is
  the guide text. Guided decoding is on when the type is one of the four.
- `cpp/tensorrt_llm/executor/guidedDecodingParams.cpp`: a guide is required unless the type is `json`
  ("The guide string must be provided unless using GuideType::kJSON").
- `cpp/tensorrt_llm/batch_manager/guidedDecoder.cpp`: the tokenizer info file (embedded_engine/xgrammar_info.py) becomes
  `TokenizerInfo::FromHuggingFace(encoded_vocab, tokenizer_str, vocab_size, stop_token_ids)` and one
  `GrammarCompiler` (default options); per request `json` -> `CompileBuiltinJSONGrammar()` (any guide is ignored),
  `json_schema` -> `CompileJSONSchema(guide)` (default options: any whitespace, strict), `regex` ->
  `CompileGrammar(Grammar::FromRegex(guide))`, `ebnf_grammar` -> `CompileGrammar(Grammar::FromEBNF(guide))` (root
  rule `root`). Each step the matcher fills a token bitmask that is applied to the logits before sampling, and
  accepts the token the sequence got.

The library: xgrammar as pinned in pyproject.toml (0.2.8; 1.2.1 ships 0.1.32, whose JSON-schema number bounds are
inexact). Only API both versions have is used here.

Where the embedded engine chooses differently (clients see these):
- an unknown `guided_decoding_guide_type`, or a guide without a type, is refused naming the input (1.2.1 silently
  generates unguided text: a client that asked for a document would get free text); an empty type with an empty
  guide is an unguided row, as in 1.2.1;
- a guide is compiled when the request arrives, before it is queued: a guide that does not compile is an error
  naming `guided_decoding_guide` and no token is generated (1.2.1 compiles inside the executor's step);
- compiled grammars are cached per (type, guide), least recently used first out (GrammarCache);
- `json_schema` is compiled with `any_whitespace=False`: the document's whitespace is xgrammar's fixed `", "` and
  `": "`, where 1.2.1 lets the model put any whitespace between tokens (a model that prefers whitespace, as a
  random-weight one does, fills its whole output with it and never completes the document). Same documents, same
  validity; only the whitespace between them differs;
- the document ends on one of the tokenizer info's stop tokens (its `eos_token_id`, `<|eot_id|>` for Llama 3
  Instruct, preprocessing's default end_id): that token ends the sequence as end_id does (not part of the output,
  finish reason end_id), whatever the request's end_id; xgrammar accepts no token after it.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bls.errors import InvalidRequest

GUIDE_TYPE_INPUT = "guided_decoding_guide_type"
GUIDE_INPUT = "guided_decoding_guide"
# utils.cc's guideTypeMapping.
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
# Distinct guides kept compiled; a service that sends the same few schemas compiles each once.
DEFAULT_CACHE_SIZE = 256

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Guide:
    type: str  # one of GUIDE_TYPES
    text: str | None  # None only for "json"


def parse_guide(guide_type: str | None, guide: str | None) -> Guide | None:
    """The guide of one request row from its two inputs (None: unguided). An empty type is no type: how a row of a
    batch says "unguided" beside guided rows (1.2.1 generates such a row unguided, as it does any type it does not
    know)."""
    if not guide_type:
        if guide:
            raise InvalidRequest(GUIDE_INPUT, f"needs {GUIDE_TYPE_INPUT} (one of {', '.join(GUIDE_TYPES)})")
        return None
    if guide_type not in GUIDE_TYPES:
        raise InvalidRequest(GUIDE_TYPE_INPUT, f"{guide_type!r} is not a guide type; one of {', '.join(GUIDE_TYPES)}")
    if guide_type == "json":
        return Guide("json", None)  # 1.2.1 compiles the built-in JSON grammar and ignores any guide
    if guide is None:
        raise InvalidRequest(GUIDE_INPUT, f"is required with {GUIDE_TYPE_INPUT} {guide_type!r}")
    return Guide(guide_type, guide)


class TokenizerInfoFileError(ValueError):
    pass


def compile_threads() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) // 2))


def guided_decoding_file(backend: str | None, tokenizer_info_path: str | None, base_dir: Path) -> Path | None:
    """The tokenizer info file from the model's two parameters, read as 1.2.1's getGuidedDecodingConfigFromParams
    reads them: either unset (empty, or the template's `${...}`) turns guided decoding off; a backend other than
    xgrammar, or a file that does not exist, fails the load."""
    def unset(value: str | None, name: str) -> bool:
        return not value or value == f"${{{name}}}"

    if unset(backend, "guided_decoding_backend") or unset(tokenizer_info_path, "xgrammar_tokenizer_info_path"):
        return None
    path = Path(tokenizer_info_path)
    path = path if path.is_absolute() else base_dir / path
    if not path.is_file():
        raise TokenizerInfoFileError(f"xgrammar_tokenizer_info_path: {path} does not exist")
    if backend != "xgrammar":
        raise TokenizerInfoFileError(f"guided_decoding_backend: {backend!r}; guided decoding supports 'xgrammar'")
    return path


@dataclass(frozen=True, eq=False)
class CompiledGuide:
    guide: Guide
    grammar: object  # xgrammar.CompiledGrammar
    stop_token_ids: frozenset[int]


class GrammarCache:
    """The engine's grammar compiler, built from the repository's tokenizer info file, and its compiled guides."""

    def __init__(self, tokenizer_info_file: Path, vocab_size: int, cache_size: int = DEFAULT_CACHE_SIZE):
        import xgrammar

        self._xgrammar = xgrammar
        try:
            info = json.loads(Path(tokenizer_info_file).read_text())
            encoded_vocab, tokenizer_str, stop_token_ids = (
                info["encoded_vocab"], info["tokenizer_str"], [int(t) for t in info["stop_token_ids"]])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise TokenizerInfoFileError(f"xgrammar tokenizer info {tokenizer_info_file}: {error!r}") from None
        # TokenizerInfo::FromHuggingFace, as 1.2.1's GuidedDecoder builds it.
        metadata = xgrammar.TokenizerInfo._detect_metadata_from_hf(tokenizer_str)
        self.tokenizer_info = xgrammar.TokenizerInfo(
            encoded_vocab, metadata["vocab_type"], vocab_size=vocab_size, stop_token_ids=stop_token_ids,
            add_prefix_space=metadata["add_prefix_space"])
        # Our cache replaces xgrammar's (unbounded by default): one cache, bounded. Compiling releases the GIL, but its
        # threads share the cores with the engine thread: xgrammar's default 8 starved a running generation on 2
        # cores (a Python thread kept 0.11 of its speed during a cold compile; 0.54 with 1 compile thread, which
        # compiled no slower there). Half the cores, at most xgrammar's 8.
        self._compiler = xgrammar.GrammarCompiler(self.tokenizer_info, max_threads=compile_threads(),
                                                  cache_enabled=False)
        self._stop_token_ids = frozenset(stop_token_ids)
        self._cache: OrderedDict[Guide, CompiledGuide] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.vocab_size = vocab_size
        self.compilations = 0  # guides compiled (cache misses)

    def compile(self, guide: Guide) -> CompiledGuide:
        with self._lock:
            compiled = self._cache.get(guide)
            if compiled is not None:
                self._cache.move_to_end(guide)
                return compiled
        compiled = CompiledGuide(guide, self._compile(guide), self._stop_token_ids)
        with self._lock:
            self.compilations += 1
            self._cache[guide] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, guide: Guide) -> object:
        xgrammar, compiler = self._xgrammar, self._compiler
        try:
            if guide.type == "json":
                return compiler.compile_builtin_json_grammar()
            if guide.type == "json_schema":
                return compiler.compile_json_schema(guide.text, any_whitespace=False)
            if guide.type == "regex":
                return compiler.compile_grammar(xgrammar.Grammar.from_regex(guide.text))
            return compiler.compile_grammar(xgrammar.Grammar.from_ebnf(guide.text))
        # xgrammar raises RuntimeError / ValueError subclasses with its parser's message: whatever compiling a
        # request's guide raises is that request's error.
        except Exception as error:  # noqa: BLE001 - the guide's error, named to its client
            raise InvalidRequest(GUIDE_INPUT, f"does not compile as {guide.type}: {_xgrammar_message(error)}") from None


# xgrammar's C++ messages start with a time and a source location, some with its check's text.
_XGRAMMAR_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: .*? is false: )?")


def _xgrammar_message(error: Exception) -> str:
    return _XGRAMMAR_PREFIX.sub("", " ".join(str(error).split()))


class GuideDeadEnd(InvalidRequest):
    """The request's other constraints (bad words) leave the guide no token to continue with."""


class GrammarConstraint:
    """One sequence's grammar state: masks each step's logits, accepts each token the sequence gets."""

    def __init__(self, compiled: CompiledGuide, vocab_size: int):
        import xgrammar

        self._xgrammar = xgrammar
        self._matcher = xgrammar.GrammarMatcher(compiled.grammar)
        self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
        self.stop_token_ids = compiled.stop_token_ids

    def mask(self, logits: torch.Tensor) -> None:
        """Set every token the grammar does not allow next to -inf, in place ([vocab] float32, owned)."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        self._xgrammar.apply_token_bitmask_inplace(logits.unsqueeze(0), self._bitmask)

    def accept(self, token: int) -> None:
        if not self._matcher.accept_token(token):  # a masked choice is always allowed: a bug if it happens
            raise RuntimeError(f"the grammar refused token {token} that its own mask allowed")

    @property
    def ended(self) -> bool:
        """The document is complete and its stop token was accepted: no further token is allowed."""
        return self._matcher.is_terminated()

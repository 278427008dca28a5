"""The xgrammar tokenizer info file: what TensorRT-LLM 1.2.1's guided decoding compiles grammars against.

Same content as TensorRT-LLM 1.2.1's own generator, read in NVIDIA/TensorRT-LLM:
- `examples/generate_xgrammar_tokenizer_info.py`: `AutoTokenizer.from_pretrained(model_dir)`, then
  `json.dump(_xgrammar_tokenizer_info(tokenizer), f)` (json's default separators and ASCII escaping);
- `tensorrt_llm/llmapi/tokenizer.py` `_xgrammar_tokenizer_info`: `encoded_vocab` = the tokens of `get_vocab()`
  sorted by id, `tokenizer_str` = `backend_tokenizer.to_str()` (fast tokenizers; the tiktoken branch writes no
  `tokenizer_str`, which the C++ backend cannot read), `stop_token_ids` = `[eos_token_id]`.
The file is read by `triton_backend/inflight_batcher_llm/src/model_instance_state.cc`
`getGuidedDecodingConfigFromParams` (`encoded_vocab` as strings, `tokenizer_str`, `stop_token_ids` as ints, all
three required) into `executor::GuidedDecodingConfig`, from which `cpp/tensorrt_llm/batch_manager/guidedDecoder.cpp`
builds `xgrammar::TokenizerInfo::FromHuggingFace(encoded_vocab, tokenizer_str, vocab_size_padded, stop_token_ids)`.
The embedded engine compiles from this same file (embedded_engine/guided.py); the llmapi stand-in builds it at load,
as TensorRT-LLM's LLM does (llmapi_engine/stand_in/llm.py).
Read in the stored copies of those files (the script at 7ed07f0, guidedDecoder.cpp at 2a9abd9, utils.cc at 1929081;
`_xgrammar_tokenizer_info` identical in the two stored versions of tokenizer.py that define it), not at the v1.2.1
tag itself: the repository's snapshot is over the size that can be fetched here.
"""

from __future__ import annotations

import json
from pathlib import Path

# The three keys the C++ backend reads; it needs all of them.
TOKENIZER_INFO_KEYS = ("encoded_vocab", "tokenizer_str", "stop_token_ids")


class TokenizerInfoError(ValueError):
    pass


def xgrammar_tokenizer_info(tokenizer_dir: Path) -> dict:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        # TensorRT-LLM's tiktoken branch omits tokenizer_str, and 1.2.1's backend fails to load without it.
        raise TokenizerInfoError(f"{tokenizer_dir}: {type(tokenizer).__name__} is not a fast (tokenizer.json) "
                                 "tokenizer; TensorRT-LLM's C++ guided decoding needs its tokenizer_str")
    vocab = tokenizer.get_vocab()
    return {
        "encoded_vocab": [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])],
        "tokenizer_str": tokenizer.backend_tokenizer.to_str(),
        "stop_token_ids": [tokenizer.eos_token_id],
    }


def write_xgrammar_tokenizer_info(tokenizer_dir: Path, out_file: Path) -> Path:
    """Write the tokenizer info JSON of the tokenizer in `tokenizer_dir` to `out_file`; returns `out_file`."""
    info = xgrammar_tokenizer_info(Path(tokenizer_dir))
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    with open(out_file, "w") as f:
        json.dump(info, f)
    return out_file

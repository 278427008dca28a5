"""Generate the real Llama 3 Instruct tokenizer as a Hugging Face fast-tokenizer directory.

Meta's BPE ranks ship in the `llama-models` package (Llama 3 Community License), so they are converted
at `make repo` time and never committed. The result matches Meta-Llama-3-8B-Instruct's tokenizer:
same ids, BOS added by `add_special_tokens=True`, the official chat template, eos ids [128001, 128009].
"""

from __future__ import annotations

import json
from pathlib import Path

BEGIN_OF_TEXT = "<|begin_of_text|>"
END_OF_TEXT = "<|end_of_text|>"
EOT = "<|eot_id|>"
BOS_ID = 128000
END_OF_TEXT_ID = 128001
EOT_ID = 128009

# The chat template of meta-llama/Meta-Llama-3-8B-Instruct's tokenizer_config.json: BOS before the
# first message only, content trimmed, `<|start_header_id|>assistant<|end_header_id|>\n\n` as the
# generation prompt.
LLAMA3_INSTRUCT_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

GENERATION_CONFIG = {
    "bos_token_id": BOS_ID,
    "eos_token_id": [END_OF_TEXT_ID, EOT_ID],
    "do_sample": True,
    "temperature": 0.6,
    "top_p": 0.9,
}


def write_llama3_tokenizer(out_dir: Path) -> Path:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json."""
    from llama_models.llama3.tokenizer import Tokenizer as MetaTokenizer
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    meta_dir = Path(__import__("llama_models.llama3", fromlist=["x"]).__file__).parent
    model_file = meta_dir / "tokenizer.model"
    if not model_file.is_file():
        raise FileNotFoundError(f"llama-models does not ship {model_file}; install llama-models==0.3.0")
    meta = MetaTokenizer(model_file)
    specials = sorted(meta.special_tokens, key=meta.special_tokens.get)
    if meta.special_tokens[BEGIN_OF_TEXT] != BOS_ID or meta.special_tokens[EOT] != EOT_ID:
        raise ValueError("unexpected special-token ids in llama-models' tokenizer")

    backend = TikTokenConverter(
        vocab_file=str(model_file), pattern=meta.pat_str, additional_special_tokens=specials
    ).converted()
    # Meta's tokenizer.json prepends <|begin_of_text|> when add_special_tokens=True.
    backend.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BEGIN_OF_TEXT} $A",
                pair=f"{BEGIN_OF_TEXT} $A {BEGIN_OF_TEXT} $B",
                special_tokens=[(BEGIN_OF_TEXT, BOS_ID)],
            ),
        ]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BEGIN_OF_TEXT,
        eos_token=EOT,
        clean_up_tokenization_spaces=True,
        model_input_names=["input_ids", "attention_mask"],
        model_max_length=131072,
        chat_template=LLAMA3_INSTRUCT_CHAT_TEMPLATE,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir))
    (out_dir / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    return out_dir

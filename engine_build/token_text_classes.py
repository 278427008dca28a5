"""The handoff's table of each token's text class (bls/contract.py TokenTextClass, relay/handoff.cc): written by
`make repo` from postprocessing's tokenizer and skip_special_tokens, recomputed by `make check-repo`."""

from __future__ import annotations

import hashlib
from pathlib import Path

# (the tokenizer folder's files' digest, skip_special_tokens) -> the table: a build or a check that meets the same
# tokenizer again (the tests' repositories) does not load it again.
_TABLES: dict[tuple[str, bool], bytes] = {}


def token_text_classes_for(tokenizer_dir: Path, skip_special_tokens: bool) -> bytes:
    """`tokenizer_dir`: a repository's copy of the tokenizer (its files only, all of them read)."""
    from bls.text.detokenizer import token_text_classes
    from bls.text.tokenizer import TokenizerBundle

    digest = hashlib.sha256()
    for path in sorted(p for p in Path(tokenizer_dir).iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    key = (digest.hexdigest(), skip_special_tokens)
    if key not in _TABLES:
        _TABLES[key] = token_text_classes(TokenizerBundle.from_dir(tokenizer_dir), skip_special_tokens)
    return _TABLES[key]


def write_token_text_classes(tokenizer_dir: Path, skip_special_tokens: bool, path: Path) -> None:
    path.write_bytes(token_text_classes_for(tokenizer_dir, skip_special_tokens))

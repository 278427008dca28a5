"""Imported first by the text models' model.py (preprocessing, postprocessing, tensorrt_llm_bls), before anything
imports transformers: they need its tokenizers, not PyTorch, but transformers imports PyTorch whenever it is
installed (it is, for the embedded engine). Without it a text model's stub loads transformers in half the time
(here 2.9 s instead of 5.9 s) and its interpreter exits in 0.3 s instead of 1.5 s, which every instance pays at
every server start and stop. Only these stubs' own processes are affected; the engine's imports torch itself.
"""

import os

os.environ["USE_TORCH"] = "0"
# transformers then advises, at import, that models will not be available: true, and not wanted here.
os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"

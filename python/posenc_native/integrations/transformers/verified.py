"""Model types verified end to end by tests/test_transformers_coverage.py (written by it; do not edit)."""
TRANSFORMERS = "5.23.0"
MODEL_TYPES = ("gpt_neox", "gptj", "llama", "mistral", "phi3", "qwen2", "qwen3")

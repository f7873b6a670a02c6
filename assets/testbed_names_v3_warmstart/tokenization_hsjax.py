"""This directory's tokenizer exactly as tokenizer.json defines it (written by hsjax).

transformers 5 builds a Qwen2Tokenizer for every qwen2 model directory and gives it Qwen2's own
normalizer and pre-tokenizer, which split this vocabulary's text differently (other token ids).
tokenizer_config.json's auto_map names this class, so AutoTokenizer loads tokenizer.json as it is:
without trust_remote_code transformers skips the class and loads tokenizer_config.json's
tokenizer_class (PreTrainedTokenizerFast); with it, it loads this subclass, which adds nothing.
"""
from transformers import PreTrainedTokenizerFast


class TokenizerFromFile(PreTrainedTokenizerFast):
    """PreTrainedTokenizerFast: tokenizer.json as saved."""

"""Tiny random transformers models saved to temp dirs, and left-padded batches to run them on."""
import numpy as np
import pytest
import torch
import transformers

HF_CONFIG_CLASSES = {
    "llama": transformers.LlamaConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
}

# Small but varied: GQA ratios 1/2/4, tied and untied, biases, qk-norm with head_dim != D/N,
# llama3 rope scaling with a non-default theta.
CASES = {
    "llama_gqa2_untied_rope_llama3": dict(
        family="llama", vocab_size=160, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=3, rope_theta=50000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, max_position_embeddings=256,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    ),
    "llama_mha_tied_attention_bias": dict(
        family="llama", vocab_size=120, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, rope_theta=10000.0, tie_word_embeddings=True,
        attention_bias=True,
    ),
    "qwen2_gqa2_tied": dict(
        family="qwen2", vocab_size=200, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rope_theta=1000000.0, tie_word_embeddings=True,
    ),
    "qwen2_mha_untied": dict(
        family="qwen2", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, rope_theta=10000.0, tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    ),
    "qwen3_gqa4_headdim_untied": dict(
        family="qwen3", vocab_size=256, hidden_size=48, intermediate_size=112, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, head_dim=16, rope_theta=1000000.0,
        tie_word_embeddings=False,
    ),
    "qwen3_mha_tied_bias": dict(
        family="qwen3", vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=24, rope_theta=10000.0,
        tie_word_embeddings=True, attention_bias=True,
    ),
}


def _randomize_(model: torch.nn.Module, seed: int) -> None:
    """Perturb every weight (norms and biases included) so layout mistakes cannot hide behind
    the ones/zeros of the default init."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))


def build_hf_model(case: dict, seed: int = 0) -> transformers.PreTrainedModel:
    """A random transformers CausalLM in float32 eval mode from a CASES entry."""
    kwargs = dict(case)
    config_cls = HF_CONFIG_CLASSES[kwargs.pop("family")]
    # No eos: generate() must not stop early, so both sides produce exactly the same length.
    config = config_cls(bos_token_id=None, eos_token_id=None, pad_token_id=0, **kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    _randomize_(model, seed)
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def hf_case(request, tmp_path_factory):
    """(case name, transformers model, dir where it is saved)."""
    name = request.param
    model = build_hf_model(CASES[name], seed=sorted(CASES).index(name))
    out = tmp_path_factory.mktemp(name)
    model.save_pretrained(out)
    return name, model, out


def left_padded_batch(vocab_size: int, lengths: list[int], seed: int = 0):
    """(tokens_BxT, mask_BxT) of random prompts, left-padded with token 0 to max(lengths)."""
    rng = np.random.default_rng(seed)
    t = max(lengths)
    tokens = np.zeros((len(lengths), t), np.int64)
    mask = np.zeros((len(lengths), t), np.int64)
    for row, n in enumerate(lengths):
        tokens[row, t - n:] = rng.integers(1, vocab_size, size=n)
        mask[row, t - n:] = 1
    return tokens, mask


def positions_from_mask(mask_BxT: np.ndarray) -> np.ndarray:
    """HF convention cumsum(mask) - 1 on real tokens; -1 on padding (hsjax's padding marker)."""
    return np.where(mask_BxT > 0, np.cumsum(mask_BxT, axis=1) - 1, -1)

"""HF checkpoint import/export, config mapping, presets and the errors for what is unsupported."""
import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import tokenizers
import torch
import transformers

from hsjax.models import (
    PRESETS, ModelConfig, forward, get_preset, init_params, load_config, load_pretrained,
    param_logical_axes, save_pretrained,
)
from tests.models.conftest import CASES, build_hf_model, left_padded_batch, positions_from_mask

LOGICAL_AXES = {"layers", "embed", "vocab", "heads", "kv_heads", "head_dim", "mlp", None}
TOKENIZER_VOCAB = 300
SAMPLE_TEXT = "SELECT name FROM users WHERE id = 3;"
UMASK = os.umask(0o022)
os.umask(UMASK)

EXPORT_CONFIGS = {
    "qwen2": ModelConfig(
        family="qwen2", vocab_size=TOKENIZER_VOCAB, hidden_size=32, intermediate_size=48, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=1e6, tie_embeddings=True, qkv_bias=True,
        eos_token_ids=(3,),
    ),
    "llama": ModelConfig(
        family="llama", vocab_size=TOKENIZER_VOCAB + 20, hidden_size=32, intermediate_size=48, num_layers=2,
        num_heads=4, num_kv_heads=1, head_dim=8, rope_theta=5e5, rms_norm_eps=1e-5,
        rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 2.0, "original_max_position_embeddings": 32},
        max_position_embeddings=128, qkv_bias=True, o_bias=True, bos_token_id=1,
        eos_token_ids=(2, 3),
    ),
    "qwen3": ModelConfig(
        family="qwen3", vocab_size=TOKENIZER_VOCAB + 8, hidden_size=32, intermediate_size=48, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=12, rope_theta=1e6, qk_norm=True,
        tie_embeddings=False,
    ),
}


def tiny_bpe_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Byte-level BPE (the kind every supported family uses, so AutoTokenizer keeps it intact)."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([SAMPLE_TEXT, "SELECT id FROM orders;"] * 10, trainer=trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|endoftext|>"
    )


def perturbed_params(cfg: ModelConfig, seed: int) -> dict:
    """init_params plus noise on every leaf, so norms and biases are not ones/zeros."""
    params = init_params(cfg, jax.random.PRNGKey(seed))
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    noisy = [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    return jax.tree.unflatten(treedef, noisy)


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("family", sorted(EXPORT_CONFIGS))
def test_export_loads_in_transformers_with_same_logits(family, tmp_path):
    cfg = EXPORT_CONFIGS[family]
    params = perturbed_params(cfg, seed=len(family))
    tok = tiny_bpe_tokenizer()
    save_pretrained(params, cfg, tok, tmp_path)

    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(model).__name__ == {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM",
                                    "qwen3": "Qwen3ForCausalLM"}[family]
    tokens, mask = left_padded_batch(cfg.vocab_size, [9, 4], seed=7)
    positions = positions_from_mask(mask)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                    position_ids=torch.tensor(np.maximum(positions, 0))).logits.numpy()
    got, _ = forward(cfg, params, jnp.asarray(tokens), jnp.asarray(positions))
    diff = np.abs(np.asarray(got) - ref)[mask > 0].max()
    assert diff <= 1e-4, f"{family}: export max |logit diff| {diff:.2e}"

    cfg2, params2, tok2 = load_pretrained(tmp_path)
    # A config without eos ids gets the tokenizer's (its only one here, <|endoftext|>).
    eos = cfg.eos_token_ids or (tok.eos_token_id,)
    assert cfg2 == dataclasses.replace(cfg, eos_token_ids=eos)
    assert_trees_equal(params2, params)
    ids = tok(SAMPLE_TEXT)["input_ids"]
    assert tok2(SAMPLE_TEXT)["input_ids"] == ids and tok2.decode(ids) == SAMPLE_TEXT
    written = list(eos) if len(eos) > 1 else eos[0]
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    hf_config = json.loads((tmp_path / "config.json").read_text())
    special = {"bos_token_id": cfg.bos_token_id, "eos_token_id": written, "pad_token_id": tok.pad_token_id}
    assert gen == special and {k: hf_config[k] for k in special} == special
    assert model.generation_config.eos_token_id == written
    # Every file is readable by others (safetensors alone writes the weights 0600).
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()} == {
        p.name: oct(0o666 & ~UMASK) for p in tmp_path.iterdir()}


def test_export_bfloat16_weights(tmp_path):
    cfg = EXPORT_CONFIGS["qwen2"]
    params = perturbed_params(cfg, seed=11)
    save_pretrained(params, cfg, None, tmp_path, dtype="bfloat16")
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert not (tmp_path / "tokenizer.json").exists()
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert model.dtype == torch.bfloat16
    _, loaded, _ = load_pretrained(tmp_path, tokenizer=False)
    rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params)
    assert_trees_equal(loaded, rounded)


@pytest.fixture(scope="module")
def hf_qwen3(tmp_path_factory):
    model = build_hf_model(CASES["qwen3_gqa4_headdim_untied"], seed=9)
    single = tmp_path_factory.mktemp("single")
    model.save_pretrained(single)
    return model, single


def test_sharded_checkpoint_loads_like_single_file(hf_qwen3, tmp_path):
    model, single = hf_qwen3
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not (tmp_path / "model.safetensors").exists()
    _, params_single, _ = load_pretrained(single, tokenizer=False)
    _, params_sharded, _ = load_pretrained(tmp_path, tokenizer=False)
    assert_trees_equal(params_sharded, params_single)


def test_bfloat16_checkpoint_is_converted_to_param_dtype(hf_qwen3, tmp_path):
    model, _ = hf_qwen3
    model.to(torch.bfloat16).save_pretrained(tmp_path)
    model.to(torch.float32)
    cfg, params, _ = load_pretrained(tmp_path, tokenizer=False)
    embed = params["embed"]
    assert embed.dtype == jnp.float32
    expected = model.model.embed_tokens.weight.detach().to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(np.asarray(embed), expected)
    _, params_bf16, _ = load_pretrained(tmp_path, tokenizer=False, param_dtype="bfloat16")
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params_bf16))


def _edit_config(src, dst, edit):
    shutil.copytree(src, dst)
    d = json.loads((dst / "config.json").read_text())
    edit(d)
    (dst / "config.json").write_text(json.dumps(d))
    return dst


@pytest.mark.parametrize(
    "edit, error, match",
    [
        (lambda d: d.pop("hidden_size"), ValueError, "hidden_size"),
        (lambda d: d.update(architectures=["MistralForCausalLM"]), ValueError, "MistralForCausalLM"),
        (lambda d: d.update(hidden_act="gelu"), ValueError, "hidden_act"),
        (lambda d: d.update(rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                             "rope_theta": 1e4}), ValueError, "yarn"),
        (lambda d: d.update(partial_rotary_factor=0.5), ValueError, "partial_rotary_factor"),
        (lambda d: d.update(use_sliding_window=True, sliding_window=8, max_window_layers=0,
                            layer_types=None), ValueError, "sliding_window"),
        (lambda d: d.update(tie_word_embeddings=True, vocab_size=300), ValueError, "embed_tokens"),
    ],
    ids=["missing_field", "unknown_arch", "act", "rope_type", "partial_rope", "sliding", "shape"],
)
def test_bad_config_gives_named_error(hf_qwen3, tmp_path, edit, error, match):
    _, single = hf_qwen3
    path = _edit_config(single, tmp_path / "ckpt", edit)
    with pytest.raises(error, match=match):
        load_pretrained(path, tokenizer=False)


def test_missing_files_and_tensors_give_named_errors(hf_qwen3, tmp_path):
    _, single = hf_qwen3
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(tmp_path, tokenizer=False)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_pretrained(single)
    no_weights = _edit_config(single, tmp_path / "no_weights", lambda d: None)
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_pretrained(no_weights, tokenizer=False)
    untied = _edit_config(single, tmp_path / "untied", lambda d: None)
    save_pretrained(load_pretrained(single, tokenizer=False)[1],
                    dataclasses.replace(load_config(single), tie_embeddings=True), None, untied)
    d = json.loads((untied / "config.json").read_text())
    d["tie_word_embeddings"] = False
    (untied / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="lm_head.weight"):
        load_pretrained(untied, tokenizer=False)


def test_legacy_and_v5_rope_layouts_agree():
    base = dict(architectures=["LlamaForCausalLM"], vocab_size=10, hidden_size=16,
                intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=64)
    legacy = ModelConfig.from_hf_dict({**base, "rope_theta": 5e5, "rope_scaling": {
        "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}})
    v5 = ModelConfig.from_hf_dict({**base, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}})
    assert legacy == v5 and hash(legacy) == hash(v5)
    assert legacy.head_dim == 8 and legacy.num_kv_heads == 2 and legacy.rope_theta == 5e5
    default = ModelConfig.from_hf_dict({**base, "model_type": "qwen3", "architectures": None})
    assert default.family == "qwen3" and default.head_dim == 128 and default.rope_scaling is None
    assert default.rope_theta == 10000.0 and default.qk_norm and not default.qkv_bias


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_and_axes(name):
    cfg = get_preset(name)
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    axes = param_logical_axes(cfg)
    flat_axes = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
    assert jax.tree.structure(shapes) == jax.tree.structure(
        axes, is_leaf=lambda x: isinstance(x, tuple))
    for shape, ax in zip(jax.tree.leaves(shapes), flat_axes):
        assert len(shape.shape) == len(ax) and set(ax) <= LOGICAL_AXES
    assert sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes)) == cfg.num_params


def test_preset_sizes_and_overrides():
    # Public parameter counts of the checkpoints whose shapes the presets copy.
    assert get_preset("qwen2_0p5b").num_params == 494_032_768
    assert get_preset("qwen3_0p6b").num_params == 596_049_920
    assert get_preset("llama3p2_1b").num_params == 1_235_814_400
    assert 0.8e6 <= get_preset("tiny").num_params <= 2e6
    assert 15e6 <= get_preset("small20m").num_params <= 25e6
    cfg = get_preset("tiny", vocab_size=300, dtype="bfloat16")
    assert cfg.vocab_size == 300 and cfg.dtype == "bfloat16"
    with pytest.raises(ValueError, match="Unknown model preset"):
        get_preset("gpt5")
    with pytest.raises(ValueError, match="rope_type"):
        dataclasses.replace(cfg, rope_scaling={"rope_type": "yarn", "factor": 2.0})


def test_forward_jits_with_config_as_static_argument():
    cfg = get_preset("tiny", rope_scaling=None)
    params = init_params(cfg, jax.random.PRNGKey(0))
    fwd = jax.jit(forward, static_argnums=0)
    tokens = jnp.ones((2, 5), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(5), (2, 5))
    logits, _ = fwd(cfg, params, tokens, positions)
    assert logits.shape == (2, 5, cfg.vocab_size) and logits.dtype == jnp.float32
    assert ml_dtypes.bfloat16 == jnp.bfloat16  # the safetensors numpy path relies on it

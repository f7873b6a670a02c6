"""`ModelConfig`: the shape and runtime options of one decoder, and its mapping to HF `config.json`.

The three families differ only in flags: Llama (optional bias on q/k/v/o), Qwen2/2.5 (bias on
q/k/v, not on o), Qwen3 (q/k RMSNorm per head, explicit `head_dim`, optional bias on q/k/v/o).
"""
from __future__ import annotations

import dataclasses
from typing import Any

FAMILIES = ("llama", "qwen2", "qwen3")
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
FAMILY_ARCHITECTURE = {family: arch for arch, family in ARCHITECTURES.items()}
DTYPES = ("float32", "bfloat16")
ATTENTION_IMPLS = ("xla", "cudnn")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

# Defaults of the HF config classes (transformers 5.x) for fields a config.json may omit.
_HF_DEFAULTS = {
    "llama": dict(max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False),
    "qwen2": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False),
    "qwen3": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False),
}
_REQUIRED_HF_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture (first block) and runtime options (second block) of a decoder.

    Hashable, so it can be a static argument of `jax.jit`.
    """

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # None, or {'rope_type': 'llama3', factor, low/high_freq_factor, ...}
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 32768
    o_bias: bool = False  # Llama/Qwen3 `attention_bias=True` also puts a bias on o_proj.
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    dtype: str = "float32"  # compute dtype of activations and matmuls
    param_dtype: str = "float32"  # dtype of the stored (master) weights
    remat: bool = False  # rematerialize each layer in the backward pass
    attention_impl: str = "xla"  # 'xla' (any backend) or 'cudnn' (GPU, bf16 only)
    # GiB of device memory the block sizes of the head, MLP and attention are planned for; 0: the
    # memory the device reports (the host's on CPU). hsjax/models/memory_plan.py.
    memory_budget: float = 0.0

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"ModelConfig.family={self.family!r}: expected one of {FAMILIES}.")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}: expected one of {DTYPES}.")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"ModelConfig.attention_impl={self.attention_impl!r}: expected one of {ATTENTION_IMPLS}."
            )
        if not (0 <= self.memory_budget < float("inf")):
            raise ValueError(f"ModelConfig.memory_budget={self.memory_budget!r}: expected GiB >= 0 "
                             "(0: the memory the device has).")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}."
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings.")
        if self.rope_scaling is not None:
            scaling = dict(self.rope_scaling)
            if scaling.get("rope_type") != "llama3":
                raise ValueError(
                    f"rope_scaling={self.rope_scaling!r}: only rope_type 'llama3' is supported "
                    "(use None for the default RoPE)."
                )
            missing = [k for k in LLAMA3_ROPE_KEYS if k not in scaling]
            if missing:
                raise ValueError(f"rope_scaling of type 'llama3' lacks {missing}.")
            object.__setattr__(self, "rope_scaling", scaling)
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))

    def __hash__(self):
        values = [getattr(self, f.name) for f in dataclasses.fields(self)]
        scaling = self.rope_scaling and tuple(sorted(self.rope_scaling.items()))
        return hash(tuple(scaling if v is self.rope_scaling else v for v in values))

    @property
    def num_params(self) -> int:
        """Number of weights, counted from the shapes `init_params` creates."""
        d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = 2 * d + 2 * d * q + 2 * d * kv + 3 * d * f
        per_layer += (q + 2 * kv) * self.qkv_bias + d * self.o_bias + 2 * self.head_dim * self.qk_norm
        return v * d * (1 if self.tie_embeddings else 2) + d + self.num_layers * per_layer

    # ------------------------------------------------------------------ HF config.json mapping

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], **runtime) -> "ModelConfig":
        """Builds a config from a HF `config.json` dict; `runtime` sets dtype/param_dtype/remat/...

        Missing optional fields take the defaults of the transformers config class of the family.
        """
        family = _family_of(d)
        missing = [k for k in _REQUIRED_HF_FIELDS if d.get(k) is None]
        if missing:
            raise ValueError(f"config.json lacks required field(s) {missing} for a {family} model.")
        defaults = _HF_DEFAULTS[family]
        get = lambda k: d[k] if d.get(k) is not None else defaults[k]  # noqa: E731

        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"config.json hidden_act={act!r}: only 'silu' is supported.")
        if d.get("mlp_bias"):
            raise ValueError("config.json mlp_bias=true is not supported (no bias on MLP projections).")
        num_heads = d["num_attention_heads"]
        head_dim = d.get("head_dim")
        if head_dim is None:
            # Qwen3Config defaults head_dim to 128; Llama and Qwen2 derive it.
            head_dim = 128 if family == "qwen3" else d["hidden_size"] // num_heads
        max_pos = get("max_position_embeddings")
        theta, scaling = _rope_from_hf(d, max_pos)
        _check_sliding_window(d, family, max_pos)
        attention_bias = bool(d.get("attention_bias", False))
        eos = d.get("eos_token_id")
        eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        return cls(
            family=family,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=d.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rope_theta=float(theta),
            rope_scaling=scaling,
            rms_norm_eps=float(get("rms_norm_eps")),
            tie_embeddings=bool(get("tie_word_embeddings")),
            qkv_bias=True if family == "qwen2" else attention_bias,
            qk_norm=family == "qwen3",
            max_position_embeddings=max_pos,
            o_bias=attention_bias and family != "qwen2",
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos,
            **runtime,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The `config.json` dict transformers (4.x and 5.x) reads back into the same model."""
        if self.family == "qwen2" and (not self.qkv_bias or self.o_bias):
            raise ValueError("A qwen2 config must have qkv_bias=True and o_bias=False to export to HF.")
        if self.family == "qwen3" and not self.qk_norm or self.family != "qwen3" and self.qk_norm:
            raise ValueError(f"qk_norm={self.qk_norm} cannot be exported as a {self.family} model.")
        if self.family != "qwen2" and self.qkv_bias != self.o_bias:
            raise ValueError(
                f"A {self.family} export has one attention_bias flag for q/k/v/o; got "
                f"qkv_bias={self.qkv_bias}, o_bias={self.o_bias}."
            )
        rope_parameters = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope_parameters.update(self.rope_scaling)
        eos = list(self.eos_token_ids)
        d = {
            "architectures": [FAMILY_ARCHITECTURE[self.family]],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "rope_parameters": rope_parameters,
            "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "torch_dtype": self.param_dtype,
            "dtype": self.param_dtype,
            "use_cache": True,
        }
        if self.family == "qwen2":
            d.update(use_sliding_window=False, sliding_window=None)
        else:
            d["attention_bias"] = self.qkv_bias
        if self.family == "qwen3":
            d.update(use_sliding_window=False, sliding_window=None)
        if self.family == "llama":
            d["mlp_bias"] = False
        return d


def _family_of(d: dict[str, Any]) -> str:
    archs = d.get("architectures") or []
    for arch in archs:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    if archs:
        raise ValueError(
            f"config.json architectures={archs}: unsupported; expected one of {sorted(ARCHITECTURES)}."
        )
    model_type = d.get("model_type")
    if model_type in FAMILIES:
        return model_type
    raise ValueError(
        f"config.json model_type={model_type!r} (no 'architectures'): unsupported; "
        f"expected one of {FAMILIES} or architectures {sorted(ARCHITECTURES)}."
    )


def _rope_from_hf(d: dict[str, Any], max_pos: int) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either the legacy (`rope_theta` + `rope_scaling`) or the
    transformers-5 (`rope_parameters`) layout, with transformers' precedence: `rope_scaling` first."""
    params = dict(d.get("rope_scaling") or d.get("rope_parameters") or {})
    if any(isinstance(v, dict) for v in params.values()):
        raise ValueError(f"config.json rope parameters nested per layer type are not supported: {params}.")
    theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if partial is not None and float(partial) != 1.0:
        raise ValueError(f"config.json partial_rotary_factor={partial}: only 1.0 is supported.")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ValueError(
            f"config.json rope type {rope_type!r}: only 'default' and 'llama3' are supported."
        )
    missing = [k for k in LLAMA3_ROPE_KEYS[:3] if k not in params]
    if missing:
        raise ValueError(f"config.json llama3 rope scaling lacks field(s) {missing}.")
    scaling = {"rope_type": "llama3", **{k: float(params[k]) for k in LLAMA3_ROPE_KEYS[:3]}}
    scaling["original_max_position_embeddings"] = int(
        d.get("original_max_position_embeddings")
        or params.get("original_max_position_embeddings")
        or max_pos
    )
    return theta, scaling


def _check_sliding_window(d: dict[str, Any], family: str, max_pos: int) -> None:
    """Qwen sliding-window attention is not implemented; refuse configs in which it would act."""
    if family == "llama" or not d.get("use_sliding_window"):
        return
    window = d.get("sliding_window")
    layer_types = d.get("layer_types")
    num_layers = d["num_hidden_layers"]
    if layer_types is None:
        first_sliding = d.get("max_window_layers", 28)
        any_sliding = window is not None and first_sliding < num_layers
    else:
        any_sliding = "sliding_attention" in layer_types
    if any_sliding and window is not None and window < max_pos:
        raise ValueError(
            f"config.json use_sliding_window=true with sliding_window={window} < "
            f"max_position_embeddings={max_pos}: sliding-window attention is not supported; "
            "set use_sliding_window=false (all published Qwen2.5/Qwen3 checkpoints do)."
        )

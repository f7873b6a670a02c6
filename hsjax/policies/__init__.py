"""Policies: what turns a batch of contexts into a batch of replies, behind one interface.

    base.py          the interface: `Policy` (no-op `update_params`, `reseed`, `end_rollout`,
                     `close`; `tokenizer`, `eos_ids`, `max_context`), `TokenPolicy.generate`,
                     `ChatPolicy.chat`, `SamplingParams`, `Generation`, `FailedReply`,
                     `PolicyError`/`EndpointDown`, `AgentPolicy`/`as_policy` for benchmark agents
    tokens.py        chat-template prompts, end-of-reply ids, stop-string cuts
    jax_policy.py    JaxPolicy: the trainable model sampled in-process (token and chat)
    sampler.py       its batched JAX sampler (prefill + decode, top-k/top-p, stops, logprobs)
    kv_reuse.py      its KV cache kept across the turns of an episode
    vllm_policy.py   VllmPolicy: a token policy sampled by vLLM, weights synced from JAX
    http_chat.py     HttpChatPolicy: chat text from an OpenAI-compatible server
    http_tokens.py   HttpTokenPolicy: token ids and logprobs from a vLLM-compatible /v1/completions
    scripted.py      ScriptedChatPolicy, ScriptedTokenPolicy: replies from a function or a list
    recording.py     RecordingChatPolicy: a chat policy whose replies are kept per episode

Layering: above `hsjax.llm.client` (the HTTP client), `hsjax.rl`, `hsjax.infra` and
`hsjax.models`; below `hsjax.rollout` (the engine that runs episodes with a policy), the server
(`hsjax.llm.server`), `hsjax.harness_s` and the modes (pyproject.toml). Nothing is imported here,
so `import hsjax.policies.base` loads neither JAX nor the openai SDK.
"""

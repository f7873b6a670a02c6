"""Language models over HTTP: the OpenAI-compatible client and what is built on it.

    client.py        ChatClient: the one OpenAI-compatible chat client (openai SDK, our retries,
                     Retry-After, timeouts, key from an env var, redaction, LLMError reasons)
    transport.py     its HTTP transport: a wall-clock deadline per attempt, a bound on reply bytes
    json_extract.py  JSON values out of a model's reply (voters' rankings, evolution proposals)
    http_policy.py   HttpChatPolicy: a ChatPolicy that wraps the client; HttpTokenPolicy: token ids
                     and logprobs from a vLLM-compatible /v1/completions
    server.py        an OpenAI-compatible server in front of a JAX policy
    openai_api.py    its request side: validation, the fields it refuses, errors in OpenAI's shape
    openai_replies.py  its replies: bodies, logprobs, vLLM's token-id fields, stream chunks
    scheduler.py     its worker: batches queued requests, bounds the queue, drops abandoned ones

Layering: `hsjax.llm` may import `hsjax.rollout` and `hsjax.models`, never `hsjax.harness_s`,
`hsjax.modes` or `hsjax.builders`; `hsjax.rollout` never imports `hsjax.llm`
(tests/llm/test_client.py checks both). Nothing is imported here, so `import hsjax.llm.server`
does not pay for the openai SDK.
"""

"""Language models over HTTP: the OpenAI-compatible client and what is built on it.

    client.py        ChatClient: the one OpenAI-compatible chat client (openai SDK, our retries,
                     Retry-After, timeouts, key from an env var, redaction, LLMError reasons)
    transport.py     its HTTP transport: a wall-clock deadline per attempt, a bound on reply bytes
    json_extract.py  JSON values out of a model's reply (voters' rankings, evolution proposals)
    server.py        an OpenAI-compatible server in front of a policy (`hsjax.policies`)
    openai_api.py    its request side: validation, the fields it refuses, errors in OpenAI's shape
    openai_replies.py  its replies: bodies, logprobs, vLLM's token-id fields, stream chunks
    scheduler.py     its worker: batches queued requests, bounds the queue, drops abandoned ones

The HTTP policies built on the client live in `hsjax.policies` (`http_chat`, `http_tokens`).

Layering: the client (client, transport, json_extract) sits below `hsjax.policies`, the server
(server, scheduler, openai_api, openai_replies, request_body) above it; neither imports
`hsjax.harness_s`, `hsjax.modes` or `hsjax.builders`, and `hsjax.rollout` never imports `hsjax.llm`
(pyproject.toml's import contract; tests/llm/test_client.py checks the last two). Nothing is
imported here, so `import hsjax.llm.server` does not pay for the openai SDK.
"""

"""The official `openai` Python SDK against the daemon's OpenAI front door.

Usage: openai_sdk.py BASE_URL MODEL TOKEN

Runs the calls a user of the SDK makes (no retries, so every error is the
daemon's own answer) and prints one JSON object with what each returned, for
tests/openai.rs to assert on. A call that raises unexpectedly fails the
script with the traceback.
"""

import json
import sys

import openai

base_url, model, token = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=60)
out = {}

out["models"] = [m.id for m in client.models.list().data]


def cached(usage):
    """`usage.prompt_tokens_details.cached_tokens` as the SDK parses it."""
    details = usage.prompt_tokens_details if usage else None
    return details.cached_tokens if details else None


# Completions, collected then streamed: greedy, so the same text both ways.
c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
out["completion"] = {
    "object": c.object,
    "text": c.choices[0].text,
    "finish_reason": c.choices[0].finish_reason,
    "prompt_tokens": c.usage.prompt_tokens,
    "completion_tokens": c.usage.completion_tokens,
    "total_tokens": c.usage.total_tokens,
    "cached_tokens": cached(c.usage),
}
pieces, finish, usage, chunks = [], None, None, 0
for chunk in client.completions.create(
    model=model,
    prompt="The capital of France is",
    max_tokens=8,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
):
    chunks += 1
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        pieces.append(choice.text)
        finish = choice.finish_reason or finish
out["completion_stream"] = {
    "text": "".join(pieces),
    "finish_reason": finish,
    "chunks": chunks,
    "prompt_tokens": usage.prompt_tokens if usage else None,
    "completion_tokens": usage.completion_tokens if usage else None,
    "cached_tokens": cached(usage),
}

# Chat, collected then streamed.
messages = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name a colour."},
]
c = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0)
out["chat"] = {
    "object": c.object,
    "role": c.choices[0].message.role,
    "content": c.choices[0].message.content,
    "finish_reason": c.choices[0].finish_reason,
    "prompt_tokens": c.usage.prompt_tokens,
    "completion_tokens": c.usage.completion_tokens,
    "cached_tokens": cached(c.usage),
}
pieces, finish, roles = [], None, []
with client.chat.completions.create(
    model=model, messages=messages, max_tokens=6, temperature=0, stream=True
) as stream:
    for chunk in stream:
        assert chunk.usage is None, "usage without stream_options.include_usage"
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
out["chat_stream"] = {"content": "".join(pieces), "finish_reason": finish, "roles": roles}

# Fixed output lengths (benchmarks): ignore_eos and min_tokens are vLLM's
# extra parameters, sent as the SDK sends extras.
c = client.completions.create(
    model=model, prompt="Hi", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
)
out["ignore_eos_tokens"] = c.usage.completion_tokens

# Logprobs, both endpoints' shapes.
c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=3, temperature=0, logprobs=2)
lp = c.choices[0].logprobs
out["completion_logprobs"] = {
    "tokens": lp.tokens,
    "token_logprobs": lp.token_logprobs,
    "top": [len(t) for t in lp.top_logprobs],
    "text": c.choices[0].text,
}
c = client.chat.completions.create(
    model=model, messages=messages, max_tokens=3, temperature=0, logprobs=True, top_logprobs=3
)
content = c.choices[0].logprobs.content
out["chat_logprobs"] = {
    "n": len(content),
    "logprobs": [t.logprob for t in content],
    "top": [len(t.top_logprobs) for t in content],
    "first_is_top": all(t.top_logprobs[0].token == t.token for t in content),
}

# Headers of a raw response.
raw = client.chat.completions.with_raw_response.create(
    model=model, messages=messages, max_tokens=2, temperature=0
)
out["raw"] = {"status": raw.status_code, "content_type": raw.headers.get("content-type")}


def error(call):
    """The typed exception a call raises, with its status and body."""
    try:
        call()
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {
            "class": type(e).__name__,
            "status": e.status_code,
            "message": body.get("message"),
            "param": body.get("param"),
            "type": body.get("type"),
        }
    return {"class": None}


out["unknown_model"] = error(
    lambda: client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
)
out["refused_param"] = error(
    lambda: client.completions.create(model=model, prompt="x", max_tokens=1, logit_bias={"1": 5})
)
out["bad_type"] = error(
    lambda: client.completions.create(model=model, prompt="x", max_tokens="many")
)
out["unknown_field"] = error(
    lambda: client.completions.create(model=model, prompt="x", extra_body={"frobnicate": 1})
)
out["n_two"] = error(lambda: client.chat.completions.create(model=model, messages=messages, n=2))
wrong = openai.OpenAI(base_url=base_url, api_key="wrong-token", max_retries=0, timeout=60)
out["wrong_token"] = error(lambda: wrong.models.list())

json.dump(out, sys.stdout)

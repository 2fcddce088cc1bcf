"""Every knob of autohet and every environment variable it reads, with its default and what it is for.

The modules that use a knob import it from here (so a test may still set it on that module). Why each
default has its value, with the measurements behind it, is in ``docs/defaults.md``. A user's settings
are the command line and ``conf/default.yaml`` (``tuning.settings``); these are the project's own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = [
    "ACQUIRE_SHARE_CAP", "ACTOR_START_TIMEOUT_S", "AHEAD_GIVE_UP_S", "CHUNK_BYTES", "CHUNK_READ", "CLOSE_TO_BEST",
    "CPU_ENGINE_HEADROOM", "CUT_DRAIN_S", "CUT_FLOOR_S", "ENGINE_HEADROOM", "ENV", "FINAL_MOST_SCALE", "FINAL_SHARE",
    "GPU_BOX_GROUP", "HEAD_LIMIT", "HEAD_TIMEOUT_S", "KEEP_VARIANTS_MIN_AVAILABLE", "LINGER_S", "MANAGER_ANSWER_S",
    "MAX_DISTINCT_BYTES", "MAX_OUTPUT_BYTES", "MIN_ENERGY_SPAN_S", "NEGLIGIBLE_SHARE", "OBJECT_STORE_BYTES",
    "PIECES_AHEAD", "PIPELINE_DEPTH", "PROBE_GAP_BATCHES", "PROBES_MOST", "RAISE_MARGIN", "RELEASE_IDLE_BELOW",
    "RETRIES", "RETRY_DELAY_S", "SATURATED_GAIN", "SPEED_PIECES", "STALE_WINDOWS", "TICK_S", "WINDOWS_AHEAD",
    "WINDOW_BYTES", "EnvVar", "env",
]

# --- measurement ------------------------------------------------------------------------------------------

RAISE_MARGIN = 1.02
"""An executor's speed in a run above its standalone figure by more than this: the standalone figure was
measured low, and the limit takes the run's (efficiency stays a true ratio, at most this)."""

MIN_ENERGY_SPAN_S = 1.0
"""The shortest stretch of a meter's trace whose energy is read as the run's."""

MAX_DISTINCT_BYTES = 128 * 1024 * 1024
"""Synthetic workloads hold at most this many bytes of distinct images; image i is bank[i % rows]."""

# --- the tune ---------------------------------------------------------------------------------------------

ACQUIRE_SHARE_CAP = 0.15
"""Acquiring executors (new actors, models built and compiled) is held to this share of a tune's wall time:
past it, or where one more acquiring would pass it, sampled points keep the best topology and settings."""

CLOSE_TO_BEST = 0.85
"""A CPU variant whose whole-group single came this close to the best runs a split probe."""

NEGLIGIBLE_SHARE = 0.02
"""Beside several GPUs, a CPU group whose first single came under this share of the best GPU single's figure
runs no other variant: it adds under 1% to two GPUs, within their trials' spread (BENCHMARKS.md 39, 42). A trial
whose topology only starts new CPU groups is refused where they could add under this share of the best trial
and the GPUs already reach it (``refuse_negligible_regroup``, BENCHMARKS.md 45)."""

SATURATED_GAIN = 0.03
"""A whole GPU whose figure rose less than this from a batch to twice it (its other settings the same) was full
at the smaller batch: a throughput trial that would start that GPU's partitions (SMs shared among executors) is
refused (``refuse_saturated_partitions``): the two-GPU vgg16 tune's one sampled partitioned trial cost 57 s of
acquiring (its start, then the whole GPUs' again) and ran at 0.96x the whole GPUs (BENCHMARKS.md 46)."""

PROBES_MOST = 2
"""At most this many split probes (each over new groups builds anew)."""

CUT_FLOOR_S = 5.0
"""A trial is never cut before this many seconds: a run's fixed costs are not worth a cut."""

CUT_DRAIN_S = 10.0
"""A cut trial's executors get this long to finish what was sent to them; those that do are kept. About
what replacing one costs: waiting longer costs more than a fresh actor, waiting less replaces one that
was seconds from done (docs/defaults.md)."""

MAX_OUTPUT_BYTES = 1 << 30
"""A throughput trial's outputs (images x classes float32) stay within this."""

ENGINE_HEADROOM = 1.5
"""How far an engine family with a GPU may beat its devices' summed standalone figures before it is
refused as unable to reach the best trial."""

CPU_ENGINE_HEADROOM = 1.1
"""The same for CPU groups alone: their sum is the bound, the margin only the measurement's."""

FINAL_SHARE = 0.1
"""The share of the trial budget kept for the finals (they also get what the search left unused)."""

FINAL_MOST_SCALE = 4.0
"""A final run measures at most this many times its trial's images, in at most half the time left."""

RELEASE_IDLE_BELOW = 0.75
"""A new topology starting with less than this share of memory available first has the idle topologies'
CPU executors drop their programs."""

MANAGER_ANSWER_S = 10.0
"""How long the end of a tune waits for the pool manager before ending it."""

AHEAD_GIVE_UP_S = 300.0
"""Work ahead (a setting compiled on an idle GPU, a CPU group loading) still running this long after it
started is given up when a trial needs it: its executor is ended, and the trial sets up its own."""

# --- pools and executors ----------------------------------------------------------------------------------

GPU_BOX_GROUP = 4
"""Cores per CPU group that ``auto`` makes next to a GPU."""

ACTOR_START_TIMEOUT_S = 600.0
"""An executor actor that has not loaded after this long waits for resources it will not get."""

KEEP_VARIANTS_MIN_AVAILABLE = 0.4
"""A CPU executor keeps the variants it built while at least this share of memory is available."""

OBJECT_STORE_BYTES = 4 * 1024**3
"""The object store of a Ray instance autohet starts."""

CHUNK_BYTES = 8 << 20
"""A host copy's chunk below this is not worth a thread of its own (a few milliseconds of copying). At
32 MB a stream's 300 MB piece made 9 chunks, so a lane's staging used 9 copy threads however many there
were: a float32 stream over two H200s ran at 0.548 of its run, at 8 MB 0.867 (BENCHMARKS.md 33, 34)."""

# --- the runtime (``autohet.load``) ------------------------------------------------------------------------

WINDOW_BYTES = 1 << 30
"""A stream's calls join batches up to the tuned run's images, but hold at most this many bytes of them."""

SPEED_PIECES = 8
"""A stream lane's speed: its images over its busy seconds in its last this many pieces."""

STALE_WINDOWS = 8
"""A stream lane left out of this many windows in a row (nothing queued) is given one batch, whose speed
replaces its measured one; each time again it waits twice as many: a lane priced out by a stall runs
again, a slow one is seldom tried. (Given the call's speed instead, a CPU group beside a GPU took pieces
the call's figure overrated, and the windows they held open starved the GPU: BENCHMARKS.md 37.)"""

PROBE_GAP_BATCHES = 100
"""...and only once this many of its batches' seconds (at its best speed known) have passed since it last
ran, twice as many each time again: a probe costs the stream about one of the lane's batches, so probing
takes about 1% of the stream's time however short its windows (more where the probe runs slower than the
lane's best). Counted in windows alone, a CPU group
beside an H200's 0.04 s windows was probed 0.3, 0.6, 1.3 s... after it last ran, and each probe cost the
GPU 30-42 ms (BENCHMARKS.md 38)."""

PIECES_AHEAD = 2
"""Pieces a stream lane holds staged or running (a GPU stages by turns into two pinned buffers)."""

WINDOWS_AHEAD = 3
"""Windows a multi-executor stream splits and queues before the first of them is handed back."""


# --- the service (``autohet serve``) ----------------------------------------------------------------------

HEAD_LIMIT = 64 * 1024
"""A request's line and headers are at most this many bytes (431 past it)."""

HEAD_TIMEOUT_S = 10.0
"""The longest a request's head may take to come whole (408; slowloris)."""

CHUNK_READ = 256 * 1024
"""The size of a connection's reads of heads, chunked and dropped bodies."""

PIPELINE_DEPTH = 16
"""Requests of one connection let in and not yet answered before its reading pauses."""

TICK_S = 0.5
"""How often a connection checks its timeouts."""

LINGER_S = 2.0
"""How long a closing connection reads and drops what the client still sends (a close with unread bytes
sends a reset, which can discard the answer before the client reads it)."""

RETRIES = 6
"""Attempts at a chunk whose replicas die under it (a dead one is waited on longer each time)."""

RETRY_DELAY_S = 1.0
"""The first wait before a chunk is sent again; each attempt waits this much longer."""

# --- environment variables --------------------------------------------------------------------------------

@dataclass(frozen=True)
class EnvVar:
    """An environment variable autohet reads: its name, its value when unset, what it changes."""

    name: str
    default: str | None
    doc: str

    def get(self) -> str | None:
        return os.environ.get(self.name, self.default)


ENV: dict[str, EnvVar] = {v.name: v for v in (
    EnvVar("AUTOHET_COMPILE_CACHE", None, "where compiled artefacts live (default runs/compile_cache)"),
    EnvVar("AUTOHET_CPU_FLAGS", "", "CPU flags added or removed as autohet sees them (+avx512_bf16,-amx_bf16): "
                                    "another day's machine reproduced"),
    EnvVar("AUTOHET_PLUGINS", "", "comma-separated modules that register strategies on import"),
    EnvVar("AUTOHET_CPU_NICE", "10", "the nice value of CPU groups' compute threads, which give way to the host "
                                     "work feeding the other devices (0: unchanged; an A/B switch)"),
    EnvVar("AUTOHET_COPY_THREADS", None, "threads of the large host copies (staging a stream's window; default: the "
                                         "process's cores, at most 16)"),
    EnvVar("AUTOHET_COPY_ON_FEEDERS", None, "1: the host copy threads also run on the cores GPU executors feed "
                                            "their GPUs from (an A/B switch)"),
    EnvVar("AUTOHET_PIECE_RAMP", "1", "0: a stream lane's pieces are a unit from its first, not a batch doubled up "
                                      "to a unit (an A/B switch)"),
    EnvVar("AUTOHET_BIND_TEAMS", None, "1: bind each thread of a CPU group's OpenMP team to one core (an A/B switch)"),
    EnvVar("AUTOHET_DEBUG", None, "1: a command's error shows its traceback"),
    EnvVar("AUTOHET_STACK_DUMP_S", None, "seconds after which a command still running prints every thread's stack"),
    EnvVar("AUTOHET_TVM_DIR", None, "where TVM's tuning databases and compiled libraries live (default runs/tvm)"),
    EnvVar("AUTOHET_TVM_CUDA_ARCH", None, "the CUDA architecture TVM compiles for (default: the GPU's)"),
    EnvVar("AUTOHET_TVM_CUDA_COMPILER", None, "the compiler TVM's CUDA code goes through (nvcc or nvrtc)"),
    EnvVar("AUTOHET_NVRTC_LIB", None, "the NVRTC library TVM loads where it is not found on its own"),
    EnvVar("AUTOHET_TEST_KILL_AFTER", None, "tests only: a tune is killed after this many trials (a resume test)"),
)}


def env(name: str) -> str | None:
    """The value of a registered environment variable (its default where unset)."""
    return ENV[name].get()

"""Thread settings that must be made before JAX and numpy's OpenBLAS start (import this
module first): ``--threads 1`` (the default) pins the whole process to one CPU (``--cpu``,
default the last one allowed) and makes XLA and OpenBLAS single-threaded, so that every
method runs on one core and other jobs on a shared machine disturb the timings less. It
also keeps jaxlib 0.10.2's batched-LAPACK deadlock (2-thread intra-op pool) out of reach.
No numpy or JAX here."""

import os


def arg(argv, name, default):
    """The value of ``name`` in argv (``name value`` or ``name=value``), read before
    argparse runs."""
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def single_thread(argv):
    """Apply ``--threads`` / ``--cpu`` from argv; returns (threads, pinned CPU or None)."""
    threads = int(arg(argv, "--threads", "1"))
    pinned = None
    if threads == 1:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = "1"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread"
                                   "_eigen=false intra_op_parallelism_threads=1").strip()
        if hasattr(os, "sched_setaffinity"):
            allowed = sorted(os.sched_getaffinity(0))
            pinned = int(arg(argv, "--cpu", str(allowed[-1])))
            os.sched_setaffinity(0, {pinned})
    return threads, pinned

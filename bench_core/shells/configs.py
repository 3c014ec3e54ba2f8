"""The configuration objects a session runs under, built from the options' values (either shell's: the pytest
plugin's, the CLI's): the session's, the gate's, side by side's, the diagnose pass's, the ranks' placement. Each
value is checked here, before anything runs, naming its option."""
from __future__ import annotations

from pathlib import Path

from bench_core.deciding.comparison import GateConfig
from bench_core.shells.options import (ADJUST, AGAINST, AGAINST_PROCESSES, AGAINST_PYTHON, ALLOW_ENV, ALPHA, APPEND,
                                       BASELINES, BUILD, CACHE, COMPARE, FLOPS, GRAPH, HISTORY, INSTRUCTIONS, MALLOC,
                                       MAX_ROUNDS, MAX_RUNS, MD, MIN_RUNS, NNODES, NODE_RANK, NO_GROWTH, NO_OUT,
                                       NPROC, OUT, PAIRS, PB_FIXTURE, PB_JSON, PEAK, PLOTS, PROFILE, PROFILE_FLOPS,
                                       PROFILE_MEMORY, PROFILE_REFUSE, PROFILE_SHAPES, PROFILE_STACK, PROFILE_TB,
                                       QUICK, RDZV, REFS, REF_SAVE, REPEATS, REPLICA, REPLICATE, ROUNDS, RUN_NOISE,
                                       SAVE, SAVE_INCOMPLETE, SERVE, SHARD, SHARD_DURATIONS, SIGNATURE, STRICT,
                                       THREADS, THRESHOLD, TIMEOUT, Values, WARMUP, WIDE, WINDOW, WORKER_PAIRS)


def gate_config(value: Values) -> GateConfig:
    """The gate's settings: each one given on the command line, else the config's own default."""
    given = {k: value(flag) for k, flag in (("threshold", THRESHOLD), ("alpha", ALPHA), ("run_noise", RUN_NOISE),
                                            ("min_runs", MIN_RUNS), ("max_runs", MAX_RUNS), ("window", WINDOW),
                                            ("adjust", ADJUST), ("chase", REPLICATE))}
    return GateConfig(allow_env_mismatch=value(ALLOW_ENV), **{k: v for k, v in given.items() if v is not None})


def threads(value: str | None, device: str) -> int | None:
    """--bench-threads: a count, or 'auto' and unset: torch's own default, as the user's program runs."""
    if value is None or str(value).lower() == "auto":
        return None
    if not str(value).isdigit() or int(value) < 1:
        raise ValueError(f"{THREADS} takes a positive count or 'auto', got {value!r}")
    return int(value)


def topology(value: Values):
    """The command line's placement of distributed ranks, or None: each scenario's own world size, one host."""
    from bench_core.workflows.distributed.launch import Topology

    nproc, nnodes, endpoint, node_rank = value(NPROC), value(NNODES), value(RDZV), value(NODE_RANK)
    if nproc is None:
        if nnodes != 1 or endpoint is not None or node_rank != 0:
            raise ValueError(f"{NNODES}, {NODE_RANK} and {RDZV} place ranks on several hosts: give {NPROC} too "
                             f"(ranks per host, the same on every host)")
        return None
    return Topology(nproc, nnodes, node_rank, endpoint)


def profile_config(value: Values, device: str):
    """The diagnose pass's settings, or None; a folder that is a file is refused now, not after measuring."""
    folder = value(PROFILE)
    if not folder:
        return None
    if Path(folder).exists() and not Path(folder).is_dir():
        raise ValueError(f"{PROFILE} {folder}: is a file; give a folder for the traces")
    from bench_core.workflows.diagnose.profile import ProfileConfig, check_cuda_profiling

    if device == "cuda":
        check_cuda_profiling()
    return ProfileConfig(folder=Path(folder), device=device, record_shapes=value(PROFILE_SHAPES),
                         profile_memory=value(PROFILE_MEMORY), with_stack=value(PROFILE_STACK),
                         with_flops=value(PROFILE_FLOPS), tensorboard=value(PROFILE_TB),
                         refuse_sensitive=value(PROFILE_REFUSE))


def against_config(value: Values):
    if value(AGAINST) is None and value(AGAINST_PYTHON) is None:
        if value(AGAINST_PROCESSES):
            raise ValueError(f"{AGAINST_PROCESSES} needs {AGAINST} REV (or {AGAINST_PYTHON})")
        return None
    from bench_core.workflows.side_by_side.compare import AgainstConfig

    kw = {k: value(flag) for k, flag in (("rounds", ROUNDS), ("pairs", PAIRS),
                                         ("max_rounds", MAX_ROUNDS),
                                         ("processes", WORKER_PAIRS), ("quick_processes", WORKER_PAIRS),
                                         ("threshold", THRESHOLD))}
    python = value(AGAINST_PYTHON)
    if python is not None:
        import shutil

        found = shutil.which(python)
        if found is None:
            raise ValueError(f"{AGAINST_PYTHON} {python}: no such interpreter (give the path of another "
                             f"environment's python, e.g. ../venv-torch212/bin/python)")
        python = str(Path(found).absolute())
    return AgainstConfig(value(AGAINST), **{k: v for k, v in kw.items() if v is not None},
                         processes_only=value(AGAINST_PROCESSES), python=python, build=value(BUILD) or None)


def no_growth(text: str | None) -> tuple[str, ...]:
    from bench_core.core.signature import COUNTERS

    names = tuple(n.strip() for n in (text or "").split(",") if n.strip())
    unknown = [n for n in names if n not in COUNTERS]
    if unknown:
        raise ValueError(f"{NO_GROWTH}: unknown counter(s) {unknown}; choose from {', '.join(COUNTERS)}")
    return names


def shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    from bench_core.workflows.shards import parse

    return parse(text)


def serve_fds(value: Values) -> tuple[int, int] | None:
    text = value(SERVE)
    if text is None:
        return None
    try:
        r, w = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{SERVE} takes two pipe descriptors R,W; it is bench_core's own, not for use by hand") from None
    return r, w


def session_config(value: Values, root: Path, device: str, **extra):
    """The whole session's configuration from the command line; paths are relative to `root`. `extra`: fields
    the shell knows itself (pytest-benchmark's options, pytest-xdist)."""
    from bench_core.files import history_db
    from bench_core.session import SessionConfig

    cfg = SessionConfig(
        device=device, warmup=value(WARMUP), repeats=value(REPEATS), quick=value(QUICK),
        threads=threads(value(THREADS), device),
        results_dir=None if value(NO_OUT) else root / value(OUT), baselines_dir=root / value(BASELINES),
        history=None if value(NO_OUT) or value(HISTORY) in (None, "none") else history_db.target(value(HISTORY), root),
        save=value(SAVE), append=value(APPEND), save_incomplete=value(SAVE_INCOMPLETE), compare=value(COMPARE),
        pb_json=extra.pop("pb_json", None) or (root / value(PB_JSON) if value(PB_JSON) else None),
        gate=gate_config(value), profile=profile_config(value, device),
        references_dir=root / value(REFS), save_references=value(REF_SAVE), against=against_config(value),
        timeout_s=value(TIMEOUT) or None, strict=value(STRICT),
        markdown=Path(value(MD)) if value(MD) else None, wide=value(WIDE),
        plots=root / value(PLOTS) if value(PLOTS) else None, count_flops=value(FLOPS), peak_tflops=value(PEAK),
        signature=value(SIGNATURE) or bool(value(NO_GROWTH)) or value(INSTRUCTIONS),
        instructions=value(INSTRUCTIONS), no_growth=no_growth(value(NO_GROWTH)),
        topology=topology(value), replica=Path(value(REPLICA)) if value(REPLICA) else None,
        serve=serve_fds(value), cache=value(CACHE), graph=bool(value(GRAPH)), malloc=value(MALLOC) or "as-is",
        pb_fixture=value(PB_FIXTURE) or "adopt", shard=shard(value(SHARD)),
        shard_durations=root / value(SHARD_DURATIONS) if value(SHARD_DURATIONS) else None, **extra)
    from bench_core.timing.measuring import MIN_REPEATS

    for what, repeats, warmup in ((REPEATS, cfg.repeats, cfg.warmup),
                                  ("[tool.bench_core] repeats/warmup", cfg.default_repeats, cfg.default_warmup)):
        if repeats is not None and repeats < MIN_REPEATS:   # found now, not after each scenario built its model
            raise ValueError(f"{what} takes at least {MIN_REPEATS} samples (a spread needs two), got {repeats}")
        if warmup is not None and warmup < 0:
            raise ValueError(f"{WARMUP if what == REPEATS else what} takes a count of calls, 0 or more, got {warmup}")
    for flag, folder in ((OUT, cfg.results_dir), (BASELINES, cfg.baselines_dir), (PLOTS, cfg.plots),
                         (REFS, cfg.references_dir)):
        if folder is not None and folder.exists() and not folder.is_dir():   # found now, not after the measuring
            raise ValueError(f"{flag} {folder}: is a file; give a folder")
    if isinstance(cfg.history, Path) and cfg.history.is_dir():
        raise ValueError(f"{HISTORY} {cfg.history}: is a folder; give a file (or 'none')")
    if history_db.is_url(cfg.history) and not history_db.available():   # found now, not after the measuring
        raise ValueError(f"{HISTORY} {history_db.shown(cfg.history)}: {history_db.NEEDS}")
    if cfg.plots is not None:   # found now, not after minutes of measuring
        from bench_core.output.plots import NEEDS, available

        if not available():
            raise ValueError(f"{PLOTS}: {NEEDS}")
    return cfg

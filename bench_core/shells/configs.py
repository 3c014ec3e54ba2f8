"""The configuration objects a session runs under, built from the options' values (either shell's: the pytest
plugin's, the CLI's): the session's, the gate's, side by side's, the diagnose pass's, the ranks' placement. Each
value is checked here, before anything runs, naming its option."""
from __future__ import annotations

from pathlib import Path

from bench_core.deciding.comparison import GateConfig
from bench_core.shells import options as opt


def gate_config(value: opt.Values) -> GateConfig:
    """The gate's settings: each one given on the command line, else the config's own default."""
    given = {k: value(flag) for k, flag in (("threshold", opt.THRESHOLD), ("alpha", opt.ALPHA), ("run_noise", opt.RUN_NOISE),
                                            ("min_runs", opt.MIN_RUNS), ("max_runs", opt.MAX_RUNS), ("window", opt.WINDOW),
                                            ("adjust", opt.ADJUST), ("chase", opt.REPLICATE))}
    return GateConfig(allow_env_mismatch=value(opt.ALLOW_ENV), **{k: v for k, v in given.items() if v is not None})


def threads(value: str | None, device: str) -> int | None:
    """--bench-threads: a count, or 'auto' and unset: torch's own default, as the user's program runs."""
    if value is None or str(value).lower() == "auto":
        return None
    if not str(value).isdigit() or int(value) < 1:
        raise ValueError(f"{opt.THREADS} takes a positive count or 'auto', got {value!r}")
    return int(value)


def topology(value: opt.Values):
    """The command line's placement of distributed ranks, or None: each scenario's own world size, one host."""
    from bench_core.workflows.distributed.launch import Topology

    nproc, nnodes, endpoint, node_rank = value(opt.NPROC), value(opt.NNODES), value(opt.RDZV), value(opt.NODE_RANK)
    if nproc is None:
        if nnodes != 1 or endpoint is not None or node_rank != 0:
            raise ValueError(f"{opt.NNODES}, {opt.NODE_RANK} and {opt.RDZV} place ranks on several hosts: give {opt.NPROC} too "
                             f"(ranks per host, the same on every host)")
        return None
    return Topology(nproc, nnodes, node_rank, endpoint)


def profile_config(value: opt.Values, device: str):
    """The diagnose pass's settings, or None; a folder that is a file is refused now, not after measuring."""
    folder = value(opt.PROFILE)
    if not folder:
        return None
    if Path(folder).exists() and not Path(folder).is_dir():
        raise ValueError(f"{opt.PROFILE} {folder}: is a file; give a folder for the traces")
    from bench_core.workflows.diagnose.profile import ProfileConfig, check_cuda_profiling

    if device == "cuda":
        check_cuda_profiling()
    return ProfileConfig(folder=Path(folder), device=device, record_shapes=value(opt.PROFILE_SHAPES),
                         profile_memory=value(opt.PROFILE_MEMORY), with_stack=value(opt.PROFILE_STACK),
                         with_flops=value(opt.PROFILE_FLOPS), tensorboard=value(opt.PROFILE_TB),
                         refuse_sensitive=value(opt.PROFILE_REFUSE))


def against_config(value: opt.Values):
    if value(opt.AGAINST) is None and value(opt.AGAINST_PYTHON) is None:
        if value(opt.AGAINST_PROCESSES):
            raise ValueError(f"{opt.AGAINST_PROCESSES} needs {opt.AGAINST} REV (or {opt.AGAINST_PYTHON})")
        return None
    from bench_core.workflows.side_by_side.compare import AgainstConfig

    kw = {k: value(flag) for k, flag in (("rounds", opt.ROUNDS), ("pairs", opt.PAIRS),
                                         ("max_rounds", opt.MAX_ROUNDS),
                                         ("processes", opt.WORKER_PAIRS), ("quick_processes", opt.WORKER_PAIRS),
                                         ("threshold", opt.THRESHOLD))}
    python = value(opt.AGAINST_PYTHON)
    if python is not None:
        import shutil

        found = shutil.which(python)
        if found is None:
            raise ValueError(f"{opt.AGAINST_PYTHON} {python}: no such interpreter (give the path of another "
                             f"environment's python, e.g. ../venv-torch212/bin/python)")
        python = str(Path(found).absolute())
    return AgainstConfig(value(opt.AGAINST), **{k: v for k, v in kw.items() if v is not None},
                         processes_only=value(opt.AGAINST_PROCESSES), python=python, build=value(opt.BUILD) or None)


def no_growth(text: str | None) -> tuple[str, ...]:
    from bench_core.core.signature import COUNTERS

    names = tuple(n.strip() for n in (text or "").split(",") if n.strip())
    unknown = [n for n in names if n not in COUNTERS]
    if unknown:
        raise ValueError(f"{opt.NO_GROWTH}: unknown counter(s) {unknown}; choose from {', '.join(COUNTERS)}")
    return names


def shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    from bench_core.workflows.shards import parse

    return parse(text)


def serve_fds(value: opt.Values) -> tuple[int, int] | None:
    text = value(opt.SERVE)
    if text is None:
        return None
    try:
        r, w = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{opt.SERVE} takes two pipe descriptors R,W; it is bench_core's own, not for use by hand") from None
    return r, w


def session_config(value: opt.Values, root: Path, device: str, **extra):
    """The whole session's configuration from the command line; paths are relative to `root`. `extra`: fields
    the shell knows itself (pytest-benchmark's options, pytest-xdist)."""
    from bench_core.files import history_db
    from bench_core.session import SessionConfig

    cfg = SessionConfig(
        device=device, warmup=value(opt.WARMUP), repeats=value(opt.REPEATS), quick=value(opt.QUICK),
        threads=threads(value(opt.THREADS), device),
        results_dir=None if value(opt.NO_OUT) else root / value(opt.OUT), baselines_dir=root / value(opt.BASELINES),
        history=None if value(opt.NO_OUT) or value(opt.HISTORY) in (None, "none") else history_db.target(value(opt.HISTORY), root),
        save=value(opt.SAVE), append=value(opt.APPEND), save_incomplete=value(opt.SAVE_INCOMPLETE), compare=value(opt.COMPARE),
        pb_json=extra.pop("pb_json", None) or (root / value(opt.PB_JSON) if value(opt.PB_JSON) else None),
        gate=gate_config(value), profile=profile_config(value, device),
        references_dir=root / value(opt.REFS), save_references=value(opt.REF_SAVE), against=against_config(value),
        timeout_s=value(opt.TIMEOUT) or None, strict=value(opt.STRICT),
        markdown=Path(value(opt.MD)) if value(opt.MD) else None, wide=value(opt.WIDE),
        plots=root / value(opt.PLOTS) if value(opt.PLOTS) else None, count_flops=value(opt.FLOPS), peak_tflops=value(opt.PEAK),
        signature=value(opt.SIGNATURE) or bool(value(opt.NO_GROWTH)) or value(opt.INSTRUCTIONS),
        instructions=value(opt.INSTRUCTIONS), no_growth=no_growth(value(opt.NO_GROWTH)),
        topology=topology(value), replica=Path(value(opt.REPLICA)) if value(opt.REPLICA) else None,
        serve=serve_fds(value), cache=value(opt.CACHE), graph=bool(value(opt.GRAPH)), malloc=value(opt.MALLOC) or "as-is",
        pb_fixture=value(opt.PB_FIXTURE) or "adopt", shard=shard(value(opt.SHARD)),
        shard_durations=root / value(opt.SHARD_DURATIONS) if value(opt.SHARD_DURATIONS) else None, **extra)
    from bench_core.timing.measuring import MIN_REPEATS

    for what, repeats, warmup in ((opt.REPEATS, cfg.repeats, cfg.warmup),
                                  ("[tool.bench_core] repeats/warmup", cfg.default_repeats, cfg.default_warmup)):
        if repeats is not None and repeats < MIN_REPEATS:   # found now, not after each scenario built its model
            raise ValueError(f"{what} takes at least {MIN_REPEATS} samples (a spread needs two), got {repeats}")
        if warmup is not None and warmup < 0:
            raise ValueError(f"{opt.WARMUP if what == opt.REPEATS else what} takes a count of calls, 0 or more, got {warmup}")
    for flag, folder in ((opt.OUT, cfg.results_dir), (opt.BASELINES, cfg.baselines_dir), (opt.PLOTS, cfg.plots),
                         (opt.REFS, cfg.references_dir)):
        if folder is not None and folder.exists() and not folder.is_dir():   # found now, not after the measuring
            raise ValueError(f"{flag} {folder}: is a file; give a folder")
    if isinstance(cfg.history, Path) and cfg.history.is_dir():
        raise ValueError(f"{opt.HISTORY} {cfg.history}: is a folder; give a file (or 'none')")
    if history_db.is_url(cfg.history) and not history_db.available():   # found now, not after the measuring
        raise ValueError(f"{opt.HISTORY} {history_db.shown(cfg.history)}: {history_db.NEEDS}")
    if cfg.plots is not None:   # found now, not after minutes of measuring
        from bench_core.output.plots import NEEDS, available

        if not available():
            raise ValueError(f"{opt.PLOTS}: {NEEDS}")
    return cfg

"""The `bench` fixture's object: what a benchmark test sees (the device, the size knob, `run` and the other
measurements), and the isolation around every test that measures. Each call reaches the session's workflows;
a gate's verdict fails the test here."""
from __future__ import annotations

from contextlib import contextmanager

import pytest

from bench_core.shells import options as opt, replay


@contextmanager
def isolated(session, request):
    """Around a measuring test, the process-wide state it may change: each scenario starts from the session's
    state, and one that leaves a setting changed or a process behind is named (and it is undone)."""
    from bench_core.workflows import isolation

    before = isolation.capture()
    try:
        yield
    finally:
        kept = set(session.workers.pids()) if session.workers is not None else set()   # the pool's, on purpose
        said = isolation.restore(before, kept)
        if said:
            session.left_changed(request.node.name, said)


class BenchFixture:
    """What a benchmark sees: the device, the size knob, and `run` to measure its scenario."""

    def __init__(self, session, request):
        from bench_core.timing.counts import Sizing

        self._session = session
        self._request = request
        self._node = request.node
        self._sizing = Sizing(session.config.device, session.config.quick)
        self.device, self.quick = self._sizing.device, self._sizing.quick

    @property
    def on_gpu(self) -> bool:
        return self._sizing.on_gpu

    def size(self, cpu, gpu, quick=None):
        """Pick a size: small on the CPU, realistic on the GPU, smallest in --bench-quick."""
        return self._sizing.size(cpu, gpu, quick)

    def run(self, scenario, fn, **kwargs):
        from bench_core.core.errors import ScenarioError

        session = self._session
        if session.config.concurrent is not None:   # refused, never recorded
            pytest.fail(f"scenario {scenario.name!r}: not measured: under pytest-xdist ({session.config.concurrent}) "
                        f"tests run beside each other on the same cores, so each one's time would hold the others' "
                        f"work. Run the benchmarks in one process (without -n, or with -n 0 or -p no:xdist), and "
                        f"the rest of the suite with -n (select with -k or -m)", pytrace=False)
        if session.serving is not None:
            from bench_core.shells import serving

            return serving.serve(session, self._request, self._sizing, scenario, fn, kwargs)
        try:
            if session.revision is not None:
                m, c = replay.run_against(session, self._request, self._sizing, scenario, fn, kwargs)
            else:
                replica = replay.replica(session, self._request, scenario.name) if session.baseline is not None else None
                m, c = session.run(scenario, fn, replica=replica, **kwargs)
        except ScenarioError as exc:
            pytest.fail(self._session.shown(str(exc)), pytrace=False)
        why = session.failed_to_compare(scenario.name) if c is None and session.config.strict else None
        if why is not None:
            self._reported(m, None)
            pytest.fail(f"scenario {scenario.name!r}: not compared with {session.compared_with}: {why} "
                        f"(--bench-strict)", pytrace=False)
        return self._reported(m, c)

    def _reported(self, m, c):
        """The result on this test's report, and its failure when the gate says so."""
        from bench_core.output.tables import session_table

        s = m.summary
        self._node.user_properties.append(("bench_median_ms", s.median))
        self._node.user_properties.append(("bench_n", s.n))
        # per-test section: shown with this test's report (failures, -rA, JUnit system-out)
        self._node.add_report_section("call", "bench_core", self._session.shown(session_table([m], wide=self._session.config.wide)))
        if c is not None:
            from bench_core.output.comparison_tables import comparison_table

            self._node.user_properties.append(("bench_verdict", c.verdict))
            if self._session.fails(c):
                table = comparison_table([c], self._session.config.gate.alpha, wide=self._session.config.wide)
                grew = f"its work grew ({'; '.join(c.grown)}); timing " if c.grown else ""
                pytest.fail(self._session.shown(f"scenario {m.name!r}: {grew}{c.verdict} against "
                                                f"{self._session.compared_with}: {c.reason}\n{table}"), pytrace=False)
        return m

    def run_distributed(self, scenario, build, *, nproc=2, params=None, **kwargs):
        """A scenario of several ranks: `build(ctx) -> bench_core.workflows.distributed.rank_program.RankStep` runs in every rank (a
        module-level function of the benchmark file), launched by torch's elastic launcher; the result is the
        maximum over ranks of each step, with every rank kept. `--bench-nproc` beats `nproc`."""
        from bench_core.core.errors import ScenarioError

        session = self._session
        self._skip_without_gpus(scenario.name, nproc)
        try:
            m, c = session.run_distributed(scenario, build, nproc=nproc, params=params, **kwargs)
        except ScenarioError as exc:
            pytest.fail(session.shown(str(exc)), pytrace=False)
        from bench_core.core.ranks import problems

        wrong = problems(m.ranks)
        if wrong:   # measured and kept, but a step that computes the wrong thing fails its test
            pytest.fail(f"scenario {m.name!r}: " + "; ".join(wrong), pytrace=False)
        return self._reported(m, c)

    def _skip_without_gpus(self, name, nproc):
        """A scenario's own world size on a runner with fewer GPUs is skipped, saying so; a --bench-nproc the
        runner cannot give is an error (raised when the launch is checked)."""
        config = self._session.config
        if config.topology is None and config.device == "cuda":
            from bench_core.workflows.distributed.launch import gpus_short

            short = gpus_short(nproc)
            if short:
                pytest.skip(f"{name}: {short}")

    def ab_distributed(self, name, build, *, baseline, candidate, nproc=2, **kwargs):
        """Two configurations of a distributed scenario (the builder parameters of each side), timed in the same
        ranks and decided; a candidate that does not start and end equal to the baseline fails this test."""
        from bench_core.core.errors import ScenarioError
        from bench_core.deciding.verdicts import REJECTED

        self._skip_without_gpus(name, nproc)
        try:
            res = self._session.ab_distributed(name, build, baseline, candidate, nproc=nproc, **kwargs)
        except ScenarioError as exc:
            pytest.fail(self._session.shown(str(exc)), pytrace=False)
        self._node.user_properties.append(("bench_ab_verdict", res.verdict))
        if res.verdict == REJECTED:
            pytest.fail(f"A/B {name!r}: {res.reason}", pytrace=False)
        return res

    def validate(self, baseline, candidate, state, model, optimizer=None, **kwargs):
        """Correctness from a saved state. Returns the report for the test to assert on; passed to
        `ab` as `validation`, a failed report rejects the candidate there without timing it."""
        from bench_core.workflows.validation.correctness import validate

        rep = validate(baseline, candidate, state, model, optimizer, **kwargs)
        self._node.user_properties.append(("bench_correct", rep.ok))
        return rep

    def reference(self, name, variant, state, model, optimizer=None, *, steps=3, tolerance=None):
        """Across commits: with --bench-ref-save, record `variant`'s outputs from `state` as reference
        NAME; otherwise check `variant` against the saved reference (skip when there is none yet)."""
        from bench_core.core.errors import StorageError

        try:
            rep = self._session.reference(name, variant, state, model, optimizer, steps=steps, tolerance=tolerance)
        except StorageError as exc:
            if exc.problem.startswith("no reference"):
                pytest.skip(f"{exc}: record one with {opt.REF_SAVE}")
            raise
        if rep is None:
            return None
        self._node.user_properties.append(("bench_reference_ok", rep.ok))
        if not rep.ok:
            pytest.fail(f"reference {name!r}: the current code no longer matches\n{rep.table()}", pytrace=False)
        return rep

    def ab(self, name, baseline, candidate, *, validation=None, **kwargs):
        """Interleaved A/B timing after correctness; an incorrect candidate fails this test."""
        from bench_core.deciding.verdicts import REJECTED
        from bench_core.core.errors import ScenarioError

        try:
            res = self._session.ab(name, baseline, candidate, validation=validation, **kwargs)
        except ScenarioError as exc:
            pytest.fail(str(exc), pytrace=False)
        self._node.user_properties.append(("bench_ab_verdict", res.verdict))
        if res.verdict == REJECTED:
            why = validation.table() if validation is not None else res.reason   # its own output check's reason
            pytest.fail(f"A/B {name!r}: candidate rejected as incorrect\n{why}", pytrace=False)
        return res

import json
import subprocess
import sys

from bench_core.files import storage
from bench_core.shells.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_REGRESSED, main
from helpers import ENV, runs


def _save(folder, name, levels_by_scenario, seed):
    path = None
    for i in range(max(len(v) for v in levels_by_scenario.values())):
        results = [runs([levels[i]], name=n, seed=seed + i)[0] for n, levels in levels_by_scenario.items()]
        path, _ = storage.save_baseline(folder, name, results, ENV, append=i > 0)
    return path


def test_compare_exit_codes(tmp_path, capsys):
    base = _save(tmp_path, "base", {"a": [10, 10.1, 9.9, 10], "b": [5, 5.05, 4.95, 5]}, seed=1)
    same = _save(tmp_path, "same", {"a": [10, 10.05], "b": [5, 5.02]}, seed=10)
    _save(tmp_path, "slow", {"a": [14, 14.1, 14.05], "b": [5, 5.02, 4.99]}, seed=20)
    assert main(["compare", str(base), str(same)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "holm" in out and "inconclusive" in out      # the default prior: a noisy shared machine
    assert main(["compare", str(base), str(same), "--run-noise", "0.01"]) == EXIT_OK
    assert "unchanged" in capsys.readouterr().out        # a quiet runner that measured its noise
    assert main(["compare", "base", "slow", "--baselines", str(tmp_path)]) == EXIT_REGRESSED
    out = capsys.readouterr().out
    assert "slower" in out and "a: slower" in out
    # one candidate run (one process) never says slower by default: it says how many runs would
    _save(tmp_path, "one", {"a": [16], "b": [5]}, seed=30)
    assert main(["compare", "base", "one", "--baselines", str(tmp_path)]) == EXIT_OK
    assert "one slow process looks the same: 3 fresh runs decide it" in " ".join(capsys.readouterr().out.split())
    assert main(["compare", "base", "one", "--baselines", str(tmp_path), "--min-runs", "1",
                 "--max-runs", "1"]) == EXIT_REGRESSED


def test_compare_json_output(tmp_path, capsys):
    base = _save(tmp_path, "base", {"a": [10, 10.1, 9.9]}, seed=1)
    assert main(["compare", str(base), str(base), "--json"]) == EXIT_OK
    data = json.loads(capsys.readouterr().out)
    assert data[0]["name"] == "a" and data[0]["ratio"] == 1.0


def test_unusable_input_exits_2_with_the_reason(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["compare", str(bad), str(bad)]) == EXIT_BAD_INPUT
    assert "bad.json" in capsys.readouterr().err
    assert main(["compare", "nope", "nope", "--baselines", str(tmp_path)]) == EXIT_BAD_INPUT
    assert "'nope' does not exist" in capsys.readouterr().err
    assert main(["compare"]) == EXIT_BAD_INPUT


def test_module_entry_point_runs(tmp_path):
    base = _save(tmp_path, "base", {"a": [10, 10.1, 9.9]}, seed=1)
    out = subprocess.run([sys.executable, "-m", "bench_core", "compare", str(base), str(base)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "verdict" in out.stdout


def test_show_prints_every_run_of_a_baseline(tmp_path, capsys):
    base = _save(tmp_path, "base", {"a": [10, 10.1]}, seed=1)
    assert main(["show", str(base)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "run 1 of 2" in out and "run 2 of 2" in out and out.count("\na ") == 2
    assert main(["show", "missing", "--baselines", str(tmp_path)]) == EXIT_BAD_INPUT


def test_a_new_session_whose_scenarios_failed_is_a_failure_not_missing(tmp_path, capsys):
    base = _save(tmp_path, "base", {"a": [10, 10.1, 9.9]}, seed=1)
    new = storage.write_session(tmp_path / "res", [], ENV, [{"scenario": "a", "problem": "RuntimeError: boom"}])
    assert main(["compare", str(base), str(new)]) == EXIT_REGRESSED
    assert "'a' failed in the new session: RuntimeError: boom" in capsys.readouterr().err


def test_input_that_can_never_decide_exits_2(tmp_path, capsys):
    from helpers import meas

    base, _ = storage.save_baseline(tmp_path, "tiny", [meas([1.0, 1.1], name="a")], ENV)
    new = storage.write_session(tmp_path / "res", [meas([5.0, 5.1], name="a")], ENV)
    assert main(["compare", str(base), str(new)]) == EXIT_BAD_INPUT
    assert "unusable input for 'a': too few samples" in capsys.readouterr().err


def test_a_baselines_runs_are_listed_and_a_bad_one_dropped(tmp_path, capsys):
    _save(tmp_path, "main", {"a": [10, 30, 10.1]}, seed=1)             # run 1 was taken on a bad day
    assert main(["baseline", "list", "main", "--baselines", str(tmp_path)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "run_id" in out and "created" in out and len(out.strip().splitlines()) == 2 + 3
    assert main(["baseline", "drop", "main", "1", "--baselines", str(tmp_path)]) == EXIT_OK
    assert "2 run(s) left" in capsys.readouterr().out
    medians = [run[0].summary.median for run in storage.load_baseline(tmp_path, "main")]
    assert all(m < 20 for m in medians) and len(medians) == 2
    assert main(["baseline", "drop", "main", "5", "--baselines", str(tmp_path)]) == EXIT_BAD_INPUT
    assert "there is no run 5" in capsys.readouterr().err
    assert main(["baseline", "list", "nope", "--baselines", str(tmp_path)]) == EXIT_BAD_INPUT


def test_files_with_no_scenario_in_common_compare_nothing_and_fail(tmp_path, capsys):
    from helpers import meas

    a = storage.write_session(tmp_path / "a", [meas([1.0] * 5, name="old")], {"device": "cpu"})
    b = storage.write_session(tmp_path / "b", [meas([1.0] * 5, name="renamed")], {"device": "cpu"})
    assert main(["compare", str(a), str(b)]) == EXIT_REGRESSED
    out = capsys.readouterr()
    assert "new" in out.out and "nothing was compared" in out.err


def test_show_into_a_closed_pipe_ends_quietly_and_help_names_the_command(tmp_path):
    path = storage.save_baseline(tmp_path, "main", runs([1.0, 1.1]), ENV)[0]
    for _ in range(6):
        storage.save_baseline(tmp_path, "main", runs([1.0, 1.1]), ENV, append=True)
    res = subprocess.run(f"{sys.executable} -m bench_core show {path} | head -n 1", shell=True, capture_output=True,
                         text=True)
    assert res.stdout.count("\n") == 1 and "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr
    helped = subprocess.run([sys.executable, "-m", "bench_core", "--help"], capture_output=True, text=True)
    assert helped.stdout.startswith("usage: python -m bench_core")


def test_every_argument_of_every_command_says_what_it_is():
    """#28: half of `compare --help` had no help text (its two arguments among them)."""
    import argparse

    from bench_core.shells.cli import build_parser

    def blank(parser, path):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                yield from (b for name, p in a.choices.items() for b in blank(p, [*path, name]))
            elif a.dest != "help" and not (a.help or "").strip():
                yield " ".join([*path, a.dest])
    assert list(blank(build_parser(), [])) == []


def test_a_results_folder_that_is_a_file_is_refused_before_anything_is_measured(tmp_path):
    import pytest

    from bench_core.shells import configs, options as opt

    (tmp_path / "out").write_text("a file")
    values = {opt.OUT: "out", opt.BASELINES: "baselines", opt.REFS: "references", opt.TIMEOUT: 600.0,
              opt.NNODES: 1, opt.NODE_RANK: 0}
    with pytest.raises(ValueError, match="--bench-out .*out: is a file; give a folder"):
        configs.session_config(lambda flag: values.get(flag, None if opt.BY_FLAG[flag].type else False), tmp_path, "cpu")


def test_the_gpu_workflow_never_runs_a_forks_code_and_runs_one_job_at_a_time():
    """#28: a pull request from a fork ran its code on the self-hosted GPU machine, and two pushes shared it."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / ".github" / "workflows" / "bench-gpu.yml").read_text()
    job = text[text.index("jobs:"):]
    guard = "if: github.event_name == 'push' || github.event.pull_request.head.repo.full_name == github.repository"
    assert guard in job and job.index(guard) < job.index("runs-on: [self-hosted, gpu]")
    head = text[:text.index("jobs:")]
    assert "concurrency:" in head and "cancel-in-progress: false" in head and "contents: read" in head


def test_the_pull_request_comment_never_runs_the_pull_requests_code():
    """#30: the report reaches the pull request through a workflow_run job with write access that checks nothing
    out and runs nothing of the pull request's; the job that runs its code has a read-only token."""
    from pathlib import Path

    flows = Path(__file__).resolve().parents[1] / ".github" / "workflows"
    comment, cpu = (flows / "bench-comment.yml").read_text(), (flows / "bench-cpu.yml").read_text()
    assert 'workflow_run:\n    workflows: ["bench (CPU)"]' in comment and "name: bench (CPU)" in cpu
    assert "pull-requests: write" in comment and "actions/checkout" not in comment and "pip install" not in comment
    assert "\n        run:" not in comment and "    - run:" not in comment   # no shell step: the artifact is data
    assert "^[0-9]{1,9}$" in comment                   # the number must be a number
    grants = cpu[cpu.index("\npermissions:"):cpu.index("\njobs:")]
    assert grants.strip() == "permissions:\n  contents: read"
    assert "name: bench-report" in cpu and "pr-number" in cpu and "report.md" in cpu
    assert "bench-history-${{ github.run_id }}" in cpu and "restore-keys: bench-history-" in cpu


def _comment_script() -> str:
    """The JavaScript of bench-comment.yml's github-script step, as GitHub runs it (the block under `script: |`)."""
    from pathlib import Path

    lines = (Path(__file__).resolve().parents[1] / ".github" / "workflows" / "bench-comment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "script: |") + 1
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for line in lines[start:]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        body.append(line[indent:])
    return "\n".join(body)


# github-script's globals, faked: `github` records the calls the script makes and lists `existing` comments
_COMMENT_HARNESS = """
const calls = [];
const existing = JSON.parse(process.env.EXISTING);
const github = {
  paginate: async (method, args) => { calls.push(['list', args.issue_number]); return existing; },
  rest: { issues: {
    listComments: 'listComments',
    updateComment: async (a) => { calls.push(['update', a.comment_id, a.body]); },
    createComment: async (a) => { calls.push(['create', a.issue_number, a.body]); } } } };
const context = { repo: { owner: 'o', repo: 'r' } };
const core = { setFailed: (m) => { calls.push(['failed', m]); } };
(async () => {
SCRIPT
})().then(() => console.log(JSON.stringify(calls)), (e) => { console.error(e); process.exit(3); });
"""


def _run_comment(tmp_path, number, report, existing=()):
    import os
    import shutil

    import pytest

    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.skip("node is not installed: the comment workflow's script cannot run here (.ci/run installs it)")
    (tmp_path / "report").mkdir(exist_ok=True)
    (tmp_path / "report" / "pr-number").write_text(number)
    if report is not None:
        (tmp_path / "report" / "report.md").write_text(report)
    script = tmp_path / "run.js"
    script.write_text(_COMMENT_HARNESS.replace("SCRIPT", _comment_script()))
    out = subprocess.run([node, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "EXISTING": json.dumps(list(existing))})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_comment_workflows_script_posts_one_comment_and_then_updates_that_one(tmp_path):
    """#30: bench-comment.yml's script, run by node against a fake GitHub API: a first report creates the comment;
    later ones update the bot's own comment, never a person's that quotes the marker."""
    marker = "<!-- bench_core report -->"
    calls = _run_comment(tmp_path, "17\n", "| scenario | verdict |\n")
    assert calls == [["list", 17], ["create", 17, f"{marker}\n| scenario | verdict |\n"]]
    theirs = {"id": 5, "user": {"type": "User"}, "body": f"{marker}\nquoted by a person"}
    mine = {"id": 9, "user": {"type": "Bot"}, "body": f"{marker}\nthe last run's"}
    calls = _run_comment(tmp_path, "17", "new report", existing=[theirs, mine])
    assert calls == [["list", 17], ["update", 9, f"{marker}\nnew report"]]
    calls = _run_comment(tmp_path, "17", "x" * 70_000, existing=[theirs])
    assert calls[-1][:2] == ["create", 17] and len(calls[-1][2]) == len(marker) + 1 + 60_000


def test_the_comment_workflows_script_takes_the_artifact_as_data(tmp_path):
    """The pull request's own run wrote the artifact, so its number must be a number and nothing else is done."""
    calls = _run_comment(tmp_path, "17; curl evil", "report")
    assert [c[0] for c in calls] == ["failed"] and "not a pull request number" in calls[0][1]
    (tmp_path / "none").mkdir()
    calls = _run_comment(tmp_path / "none", "3", None)
    assert calls == [["list", 3], ["create", 3, "<!-- bench_core report -->\nbench_core: the run left no report "
                                                "(see its logs)."]]


def test_the_cli_reads_the_projects_settings_as_the_plugin_does_and_its_own_flags_win(tmp_path, capsys,
                                                                                      monkeypatch):
    """A team's `[tool.bench_core] baselines = "perf/baselines"`: the failing gate's own next step (`bench-core
    baseline list NAME`) must find the baseline there, run from the project or a folder below it."""
    _save(tmp_path / "perf" / "baselines", "main", {"a": [10, 10.1, 9.9]}, seed=1)
    (tmp_path / "pyproject.toml").write_text('[tool.bench_core]\nbaselines = "perf/baselines"\nwide = true\n')
    monkeypatch.chdir(tmp_path)
    assert main(["baseline", "list", "main"]) == EXIT_OK
    assert len(capsys.readouterr().out.splitlines()) == 2 + 3   # its three runs, found where the project keeps them
    assert main(["baseline", "list", "main", "--baselines", str(tmp_path / "elsewhere")]) == EXIT_BAD_INPUT
    (tmp_path / "pyproject.toml").write_text("[tool.bench_core]\nbaseline = 'x'\n")
    assert main(["baseline", "list", "main"]) == EXIT_BAD_INPUT
    assert "[tool.bench_core] baseline: not a setting (did you mean 'baselines'?)" in capsys.readouterr().err

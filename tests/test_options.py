"""One declaration of options for both shells: the CLI's shared options are the plugin's, their defaults are the
config objects', and both shells build the same gate from the same words."""
import argparse

import pytest

from bench_core.deciding.comparison import GateConfig
from bench_core.shells import cli
from bench_core.shells import configs, options as opt


def _cli_actions(*subcommands: str) -> dict:
    parser = cli.build_parser()
    for name in subcommands:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return {a.option_strings[0]: a for a in parser._actions if a.option_strings}


def test_every_cli_option_that_the_plugin_has_is_the_same_option():
    shared = [o for o in opt.OPTIONS if o.cli]
    actions = {**_cli_actions("history", "show"), **_cli_actions("compare"),
               "--build": _cli_actions("bisect")["--build"]}
    assert {o.cli for o in shared} <= set(actions) | {"--baselines"}
    for o in shared:
        a = actions[o.cli]
        # no default of its own in either shell: both fill it the same way (`options.values`, `options.fill`)
        assert a.dest == o.dest and a.help == o.kwargs()["help"] and a.default == o.kwargs(given_only=True)["default"]


def test_defaults_are_the_config_objects_own_and_the_help_says_them():
    plugin = {o.flag: o for o in opt.OPTIONS}
    d = GateConfig()
    assert f"({d.alpha})" in plugin[opt.ALPHA].help and f"({d.min_runs};" in plugin[opt.MIN_RUNS].help
    assert configs.gate_config(lambda flag: None if flag != opt.ALLOW_ENV else False) == d
    assert f"({d.chase})" in plugin[opt.REPLICATE].help and plugin[opt.REPLICATE].choices == ("possible", "confirm")
    given = {opt.REPLICATE: "confirm", opt.ALLOW_ENV: False}
    assert configs.gate_config(given.get).chase == "confirm"


@pytest.mark.parametrize("min_runs, max_runs", [(5, 3)])
def test_both_shells_refuse_a_budget_below_the_minimum(min_runs, max_runs, tmp_path, capsys):
    plugin_values = {opt.MIN_RUNS: min_runs, opt.MAX_RUNS: max_runs, opt.ALLOW_ENV: False}
    with pytest.raises(ValueError, match="min_runs <= max_runs"):
        configs.gate_config(lambda flag: plugin_values.get(flag))
    (tmp_path / "a.json").write_text("{}")
    code = cli.main(["compare", str(tmp_path / "a.json"), str(tmp_path / "a.json"),
                     "--min-runs", str(min_runs), "--max-runs", str(max_runs)])
    assert code == cli.EXIT_BAD_INPUT and "min_runs <= max_runs" in capsys.readouterr().err


def test_the_same_words_give_the_same_gate_in_both_shells():
    ns = cli.build_parser().parse_args(["compare", "a", "b", "--alpha", "0.02", "--window", "4", "--adjust", "bh"])
    from_cli = configs.gate_config(lambda flag: getattr(ns, opt.BY_FLAG[flag].dest, None))
    words = {opt.ALPHA: 0.02, opt.WINDOW: 4, opt.ADJUST: "bh", opt.ALLOW_ENV: False}
    assert from_cli == configs.gate_config(words.get) == GateConfig(alpha=0.02, window=4, adjust="bh")


def test_the_running_guide_names_every_option():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "running.md").read_text()
    assert [o.flag for o in opt.OPTIONS if o.flag not in text] == []


def test_help_shows_what_a_user_meets_in_groups_and_still_accepts_every_tuning_knob(pytester):
    res = pytester.runpytest("--help")
    shown = [line.split()[0].split("=")[0] for line in res.stdout.lines
             if line.startswith("  --bench-") or line.startswith("  --gpu")]
    assert 30 <= len(shown) <= 40 and len(shown) == len(set(shown))
    assert not {opt.SERVE, opt.REPLICA} & set(shown)                     # bench_core's own plumbing
    assert not set(opt.TUNING) & set(shown)                              # named in their group's title instead
    assert {o.flag for o in opt.OPTIONS} - set(shown) == set(opt.TUNING) | {opt.SERVE, opt.REPLICA}
    res.stdout.fnmatch_lines(["bench_core: running the scenarios:", "*bench_core: stored baselines (tuning: "
                              "--bench-alpha, --bench-min-runs*"])
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    assert pytester.runpytest("--bench-alpha", "0.05", "--bench-rounds", "5", "--bench-no-out").ret == 0

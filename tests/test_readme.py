"""The README's examples run as written: a new user copies them first."""
import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def _block(section: str, lang: str = "python") -> str:
    text = README.split(f"# {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(rf"```{lang}\n(.*?)```", text, re.S).group(1)


def test_the_validation_example_runs_as_written(capsys):
    namespace: dict = {}
    with pytest.raises(SystemExit) as ended:   # a refused candidate would end it with 1
        exec(compile(_block("Validate an optimization"), "README.md", "exec"), namespace)
    assert ended.value.code == 0 and namespace["report"].ok
    out = capsys.readouterr().out
    assert "PASS" in out and "group 0: foreach False -> True" in out
    assert namespace["result"].identities["candidate"]["optimizer_settings"]["group 0"]["foreach"] == "True"


def test_the_scenario_example_runs_as_written_in_a_pytest_session(pytester):
    pytester.makepyfile(test_readme_scenario=_block("Writing a scenario"))
    res = pytester.runpytest("-p", "no:cacheprovider", "--bench-quick", "--bench-no-out")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["*bench_core results*", "mlp_forward *"])
